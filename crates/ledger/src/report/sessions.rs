//! `docket sessions [--format table|json]`: every session, newest first.

use std::io::{self, Write};

use super::columns::{Cell, Kind, RecordWriter};
use super::{OutputFormat, ReportError, strip_controls, table_time};
use crate::now_ts;
use crate::report::reads::Reports;

/// A session can be resumed for this long after it started.
pub const RESUMABLE_FOR_SECS: f64 = 7.0 * 24.0 * 3600.0;

/// Keys of `sessions --format json` (and csv), in order.
pub const SESSION_COLUMNS: &[&str] = &[
    "session_id",
    "state",
    "desired_state",
    "started_at",
    "completed_at",
    "total",
    "processed",
    "accepted",
    "review",
    "rejected",
    "errors",
    "retries",
    "rate_limited",
    "ambiguous",
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "estimated_cost_usd",
    "stop_reason",
    "resumable",
    "profile",
    "completion_mode",
];

const SESSION_KINDS: &[Kind] = &[
    Kind::Text,
    Kind::Text,
    Kind::Text,
    Kind::Ts,
    Kind::Ts,
    Kind::Int,
    Kind::Int,
    Kind::Int,
    Kind::Int,
    Kind::Int,
    Kind::Int,
    Kind::Int,
    Kind::Int,
    Kind::Int,
    Kind::Int,
    Kind::Int,
    Kind::Float,
    Kind::Float,
    Kind::Text,
    Kind::Bool,
    Kind::Text,
    Kind::Text,
];

const _: () = assert!(SESSION_COLUMNS.len() == SESSION_KINDS.len());

const TABLE_HEADER: &[&str] = &[
    "session_id",
    "state",
    "started (UTC)",
    "total",
    "processed",
    "accepted",
    "review",
    "rejected",
    "errors",
    "retries",
    "429s",
    "ambiguous",
    "cost_usd",
    "completion",
    "profile",
    "resumable",
];

/// Write all sessions, newest first.
pub fn write_sessions(
    ledger: &dyn Reports,
    format: OutputFormat,
    out: &mut dyn Write,
) -> Result<(), ReportError> {
    let cutoff = now_ts() - RESUMABLE_FOR_SECS;
    let mut w = match format {
        OutputFormat::Table => return write_table(ledger, cutoff, out),
        OutputFormat::Csv => RecordWriter::csv(out, SESSION_COLUMNS)?,
        OutputFormat::Json => RecordWriter::json_array(out, SESSION_COLUMNS)?,
    };
    ledger.for_each_session(cutoff, now_ts(), SESSION_KINDS, &mut |c| w.write(c))?;
    w.finish()
}

fn write_table(ledger: &dyn Reports, cutoff: f64, out: &mut dyn Write) -> Result<(), ReportError> {
    // Sessions are few (one per run): collect them to size the columns.
    let mut rows: Vec<Vec<String>> = Vec::new();
    ledger.for_each_session(cutoff, now_ts(), SESSION_KINDS, &mut |c| {
        rows.push(table_row(c));
        Ok(())
    })?;
    let mut out = io::BufWriter::new(out);
    if rows.is_empty() {
        writeln!(
            out,
            "No sessions yet. Start one with: docket batch-adjudicate"
        )?;
        out.flush()?;
        return Ok(());
    }
    let mut widths: Vec<usize> = TABLE_HEADER.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let header: Vec<String> = TABLE_HEADER.iter().map(|h| h.to_string()).collect();
    write_line(&mut out, &header, &widths)?;
    for row in &rows {
        write_line(&mut out, row, &widths)?;
    }
    out.flush()?;
    Ok(())
}

/// Text columns (session, state, started, completion, profile, resumable)
/// align left, numbers right.
fn write_line(out: &mut dyn Write, cells: &[String], widths: &[usize]) -> io::Result<()> {
    let last = cells.len().saturating_sub(1);
    for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
        if i > 0 {
            out.write_all(b"  ")?;
        }
        // The last three (completion, profile, resumable) are words too.
        let left = matches!(i, 0..=2) || i + 2 >= last;
        if left && i == last {
            write!(out, "{cell}")?;
        } else if left {
            write!(out, "{cell:<w$}")?;
        } else {
            write!(out, "{cell:>w$}")?;
        }
    }
    writeln!(out)
}

fn table_row(c: &[Cell]) -> Vec<String> {
    let text = |i: usize| strip_controls(c[i].as_str().unwrap_or(""));
    // A word that may be missing (an older session): `-`.
    let word = |i: usize| {
        c.get(i)
            .and_then(Cell::as_str)
            .map_or_else(|| "-".to_string(), strip_controls)
    };
    let int = |i: usize| {
        c[i].as_i64()
            .map(super::group_thousands)
            .unwrap_or_default()
    };
    // started_at was read as ISO text; show it as the table's UTC format.
    let started = c[3]
        .as_str()
        .map(|s| s.trim_end_matches('Z').replacen('T', " ", 1))
        .unwrap_or_else(|| table_time(f64::NAN));
    let cost = c[16]
        .as_f64()
        .map(|f| format!("{f:.4}"))
        .unwrap_or_default();
    let resumable = if matches!(c[19], Cell::Bool(true)) {
        "yes"
    } else {
        "no"
    };
    vec![
        text(0),
        text(1),
        started,
        int(5),
        int(6),
        int(7),
        int(8),
        int(9),
        int(10),
        int(11),
        int(12),
        int(13),
        cost,
        word(21),
        word(20),
        resumable.to_string(),
    ]
}
