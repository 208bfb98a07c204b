//! `docket batch-results SESSION [--format table|csv|json]`.

use std::io::{self, Write};

use super::columns::{Cell, Kind, RecordWriter};
use super::{OutputFormat, ReportError, clip, group_thousands, strip_controls, table_time};
use crate::report::reads::Reports;

/// Columns of `batch-results --format csv` and `export --what results`, in order.
pub const RESULT_COLUMNS: &[&str] = &[
    "session_id",
    "item_id",
    "outcome",
    "confidence",
    "answer_json",
    "rationale",
    "error_message",
    "model_id",
    "stage",
    "request_id",
    "attempts",
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "processed_at",
    "adjudication_id",
    "audit",
    "stale",
];

/// Keys of `batch-results --format json`: `RESULT_COLUMNS` with the answer
/// as a nested object under `answer` instead of a string under `answer_json`.
pub const RESULT_JSON_KEYS: &[&str] = &[
    "session_id",
    "item_id",
    "outcome",
    "confidence",
    "answer",
    "rationale",
    "error_message",
    "model_id",
    "stage",
    "request_id",
    "attempts",
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "processed_at",
    "adjudication_id",
    "audit",
    "stale",
];

pub(crate) const RESULT_KINDS: &[Kind] = &[
    Kind::Text,
    Kind::Text,
    Kind::Text,
    Kind::Float,
    Kind::Json,
    Kind::Text,
    Kind::Text,
    Kind::Text,
    Kind::Text,
    Kind::Int,
    Kind::Int,
    Kind::Int,
    Kind::Int,
    Kind::Float,
    Kind::Ts,
    Kind::Text,
    // The audit sample sent the (accepted or rejected) item to review too.
    Kind::Bool,
    // Made on evidence `docket import --update` replaced since.
    Kind::Bool,
];

const _: () = assert!(RESULT_COLUMNS.len() == RESULT_KINDS.len());
const _: () = assert!(RESULT_JSON_KEYS.len() == RESULT_KINDS.len());

// Indexes into a result row.
const C_ITEM: usize = 1;
const C_OUTCOME: usize = 2;
const C_CONFIDENCE: usize = 3;
const C_RATIONALE: usize = 5;
const C_ERROR: usize = 6;
const C_MODEL: usize = 7;
const C_ATTEMPTS: usize = 10;

/// The table is laid out for this many columns.
const TABLE_WIDTH: usize = 120;

/// One session's header numbers, as `batch-results` shows them.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionHead {
    pub session_id: String,
    pub state: String,
    pub desired_state: String,
    pub started_at: f64,
    pub completed_at: Option<f64>,
    pub total: i64,
    pub processed: i64,
    pub accepted: i64,
    pub review: i64,
    pub rejected: i64,
    pub errors: i64,
    pub retries: i64,
    pub rate_limited: i64,
    pub ambiguous: i64,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub cost_usd: f64,
    pub estimated_cost_usd: f64,
    pub max_cost_usd: Option<f64>,
    pub stop_reason: Option<String>,
    /// The session's completion mode (`exact`, `best_effort`, `throughput`);
    /// None for a session from before it was recorded.
    pub completion_mode: Option<String>,
    /// The rate-limit profile the session ran with, as `name@version`.
    pub profile: Option<String>,
    /// The state every view shows (`store::shown_state_of`).
    pub shown: crate::watch::ShownState,
}

/// Rounded percentage of `part` in `whole`; never claims 100% for less than all.
fn percent(part: i64, whole: i64) -> i64 {
    if whole <= 0 || part <= 0 {
        return 0;
    }
    let p = ((part as f64) * 100.0 / (whole as f64)).round() as i64;
    if p >= 100 && part < whole { 99 } else { p }
}

/// Write the results of `session_id` in `format`.
pub fn write_results(
    ledger: &dyn Reports,
    session_id: &str,
    format: OutputFormat,
    out: &mut dyn Write,
) -> Result<(), ReportError> {
    let head = ledger
        .session_head(session_id)?
        .ok_or_else(|| ReportError::UnknownSession(session_id.to_string()))?;
    let session = Some(session_id);
    match format {
        OutputFormat::Table => write_table(ledger, &head, out),
        OutputFormat::Csv => {
            let mut w = RecordWriter::csv(out, RESULT_COLUMNS)?;
            ledger.for_each_result(session, RESULT_KINDS, &mut |cells| w.write(cells))?;
            w.finish()
        }
        OutputFormat::Json => {
            let mut w = RecordWriter::json_array(out, RESULT_JSON_KEYS)?;
            ledger.for_each_result(session, RESULT_KINDS, &mut |cells| w.write(cells))?;
            w.finish()
        }
    }
}

fn write_table(
    ledger: &dyn Reports,
    head: &SessionHead,
    out: &mut dyn Write,
) -> Result<(), ReportError> {
    let mut out = io::BufWriter::new(out);
    write_head(head, &mut out)?;

    // Column widths from the data, within bounds, so ids are not cut needlessly.
    let (max_item, max_model) = ledger.result_id_widths(&head.session_id)?;
    let Some(max_item) = max_item else {
        writeln!(out)?;
        writeln!(out, "No results yet.")?;
        out.flush()?;
        return Ok(());
    };
    let item_w = (max_item.max(0) as usize).clamp(7, 36);
    let model_w = (max_model.unwrap_or(0).max(0) as usize).clamp(5, 24);
    // item outcome conf att model detail, one space between columns.
    let fixed = item_w + 1 + 8 + 1 + 4 + 1 + 3 + 1 + model_w + 1;
    let detail_w = TABLE_WIDTH.saturating_sub(fixed).max(20);

    writeln!(out)?;
    writeln!(
        out,
        "{:<item_w$} {:<8} {:>4} {:>3} {:<model_w$} RATIONALE / ERROR",
        "ITEM", "OUTCOME", "CONF", "ATT", "MODEL"
    )?;
    ledger.for_each_result(Some(&head.session_id), RESULT_KINDS, &mut |c| {
        let item = clip(c[C_ITEM].as_str().unwrap_or(""), item_w);
        let outcome = clip(c[C_OUTCOME].as_str().unwrap_or(""), 8);
        let conf = c[C_CONFIDENCE]
            .as_f64()
            .map(|f| format!("{f:.2}"))
            .unwrap_or_else(|| "-".into());
        let attempts = c[C_ATTEMPTS]
            .as_i64()
            .map(|a| a.to_string())
            .unwrap_or_else(|| "-".into());
        let model = clip(c[C_MODEL].as_str().unwrap_or("-"), model_w);
        let rationale = c[C_RATIONALE].as_str().filter(|s| !s.trim().is_empty());
        let error = c[C_ERROR].as_str().filter(|s| !s.trim().is_empty());
        let detail = if c[C_OUTCOME] == Cell::Text("error".into()) {
            error.or(rationale)
        } else {
            rationale.or(error)
        };
        let detail = clip(detail.unwrap_or(""), detail_w);
        writeln!(
            out,
            "{item:<item_w$} {outcome:<8} {conf:>4} {attempts:>3} {model:<model_w$} {detail}"
        )?;
        Ok(())
    })?;
    out.flush()?;
    Ok(())
}

fn write_head(h: &SessionHead, out: &mut dyn Write) -> io::Result<()> {
    let n = group_thousands;
    writeln!(
        out,
        "Session {}  [{}]",
        strip_controls(&h.session_id),
        h.shown.word()
    )?;
    writeln!(out, "  Started:    {} UTC", table_time(h.started_at))?;
    match h.completed_at {
        Some(t) => writeln!(out, "  Completed:  {} UTC", table_time(t))?,
        None => writeln!(out, "  Completed:  - (not finished)")?,
    }
    // Progress: floor, so it never reads 100% while anything is left.
    let progress = if h.total > 0 {
        (h.processed.max(0) * 100 / h.total).min(100)
    } else {
        0
    };
    writeln!(
        out,
        "  Processed:  {} / {} ({progress}%)",
        n(h.processed),
        n(h.total)
    )?;
    let base = h.processed;
    writeln!(
        out,
        "  ✓ Auto-accepted: {} ({}%)",
        n(h.accepted),
        percent(h.accepted, base)
    )?;
    writeln!(
        out,
        "  ⚠ Needs review:  {} ({}%)",
        n(h.review),
        percent(h.review, base)
    )?;
    writeln!(
        out,
        "  ✗ Rejected:      {} ({}%)",
        n(h.rejected),
        percent(h.rejected, base)
    )?;
    writeln!(
        out,
        "  ⨯ Errors:        {} ({}%)",
        n(h.errors),
        percent(h.errors, base)
    )?;
    writeln!(
        out,
        "  Retries: {}   429s: {}   Ambiguous attempts: {}",
        n(h.retries),
        n(h.rate_limited),
        n(h.ambiguous)
    )?;
    writeln!(
        out,
        "  Tokens:     {} in / {} out",
        n(h.input_tokens),
        n(h.output_tokens)
    )?;
    let cap = h
        .max_cost_usd
        .map(|c| format!("; cap ${c:.2}"))
        .unwrap_or_default();
    writeln!(
        out,
        "  Cost:       ${:.4} (estimate ${:.4}{cap})",
        h.cost_usd, h.estimated_cost_usd
    )?;
    write_tail(h, out)
}

/// The head's optional lines: the completion mode, the rate-limit profile,
/// why it stopped.
fn write_tail(h: &SessionHead, out: &mut dyn Write) -> io::Result<()> {
    if let Some(mode) = &h.completion_mode {
        writeln!(out, "  Completion: {}", clip(mode, 20))?;
    }
    if let Some(profile) = &h.profile {
        let profile = strip_controls(profile);
        writeln!(out, "  Profile:    {profile} (rate limits)")?;
    }
    if let Some(reason) = h.stop_reason.as_deref().filter(|r| !r.trim().is_empty()) {
        writeln!(out, "  Stopped:    {}", clip(reason, 100))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentages() {
        assert_eq!(percent(87, 150), 58);
        assert_eq!(percent(0, 0), 0);
        assert_eq!(percent(999, 1000), 99);
        assert_eq!(percent(1000, 1000), 100);
    }
}
