//! Reading results out of the ledger: `workers`, `batch-results`,
//! `sessions`, `export` and `report`.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use docket::ledger::console::ConsoleReads;
use docket::ledger::work::RunSessions;
use docket::report;

use super::data_out;
use super::ledger::with_ledger_reading;
use crate::cli::{ExportFormat, ExportWhat, FormatArg};

/// `docket workers SESSION`: the workers that claimed its items.
pub(super) fn workers(ws: &Path, session: &str, format: FormatArg) -> i32 {
    with_ledger_reading(ws, |l| {
        let rows = l.workers(session).map_err(|e| e.to_string())?;
        if rows.is_empty()
            && l.load_session(session)
                .map_err(|e| e.to_string())?
                .is_none()
        {
            return Err(docket::ids::unknown_session(session));
        }
        let out = match format {
            FormatArg::Json => workers_json(&rows),
            FormatArg::Table | FormatArg::Csv => workers_table(session, &rows),
        };
        quiet_when_unread(data_out().write_all(out.as_bytes()).map_err(Into::into))
    })
}

/// `docket batch-results SESSION`.
pub(super) fn batch_results(ws: &Path, session: &str, format: FormatArg) -> i32 {
    with_ledger_reading(ws, |l| {
        let f = match format {
            FormatArg::Table => report::OutputFormat::Table,
            FormatArg::Csv => report::OutputFormat::Csv,
            FormatArg::Json => report::OutputFormat::Json,
        };
        quiet_when_unread(report::write_results(l, session, f, &mut data_out()))
    })
}

/// `docket sessions`.
pub(super) fn sessions(ws: &Path, format: FormatArg) -> i32 {
    with_ledger_reading(ws, |l| {
        let f = match format {
            FormatArg::Table | FormatArg::Csv => report::OutputFormat::Table,
            FormatArg::Json => report::OutputFormat::Json,
        };
        quiet_when_unread(report::write_sessions(l, f, &mut data_out()))
    })
}

pub(super) fn export(
    ws: &Path,
    session: Option<String>,
    what: ExportWhat,
    format: ExportFormat,
    output: Option<PathBuf>,
) -> i32 {
    let opts = report::ExportOptions {
        session,
        what: match what {
            ExportWhat::Decisions => report::ExportWhat::Decisions,
            ExportWhat::Results => report::ExportWhat::Results,
            ExportWhat::Requests => report::ExportWhat::Requests,
            ExportWhat::Items => report::ExportWhat::Items,
            ExportWhat::Attempts => report::ExportWhat::Attempts,
        },
        format: match format {
            ExportFormat::Csv => report::ExportFormat::Csv,
            ExportFormat::Jsonl => report::ExportFormat::Jsonl,
            ExportFormat::Parquet => report::ExportFormat::Parquet,
        },
    };
    // Refused before the ledger is touched: Parquet is binary, never for a
    // terminal or a pipe, and items are one session's.
    if opts.format == report::ExportFormat::Parquet && output.is_none() {
        return super::fail(report::ReportError::ParquetNeedsFile);
    }
    if opts.what == report::ExportWhat::Items && opts.session.is_none() {
        return super::fail(report::ReportError::ItemsNeedSession);
    }
    with_ledger_reading(ws, |l| match &output {
        Some(p) => {
            let n = report::export_file(l, &opts, ws, p).map_err(|e| e.to_string())?;
            println!("Exported {n} rows to {}", p.display());
            Ok(())
        }
        None => quiet_when_unread(report::export_in(l, &opts, ws, &mut data_out()).map(drop)),
    })
}

/// `docket report SESSION [-o FILE]`: the run report as one HTML file;
/// `-o -` writes it to standard output (exact: HTML is not for a terminal
/// to interpret, and every text in it is escaped).
pub(super) fn run_report(ws: &Path, session: &str, output: Option<PathBuf>) -> i32 {
    let path = output.unwrap_or_else(|| PathBuf::from(default_report_name(session)));
    with_ledger_reading(ws, |l| {
        if path.as_os_str() == "-" {
            let mut out = std::io::stdout().lock();
            return quiet_when_unread(report::write_html(l, session, &mut out));
        }
        report::write_html_file(l, session, ws, &path).map_err(|e| e.to_string())?;
        let safe = docket::sanitize::for_terminal;
        println!(
            "Wrote the report of {} to {}",
            safe(session),
            safe(&path.display().to_string())
        );
        Ok(())
    })
}

/// `report-<session>.html`, the id's characters that do not belong in a
/// file name replaced (an unknown id is refused before anything is written).
fn default_report_name(session: &str) -> String {
    let safe: String = session
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("report-{safe}.html")
}

/// A report's outcome, where a reader that went away (`docket sessions |
/// head`) is no error: the output it wanted was written.
pub(super) fn quiet_when_unread(r: Result<(), report::ReportError>) -> Result<(), String> {
    match r {
        Err(e) if e.is_broken_pipe() => Ok(()),
        r => r.map_err(|e| e.to_string()),
    }
}

/// `docket workers SESSION` as a table; ids and hosts made safe for a
/// terminal.
fn workers_table(session: &str, rows: &[docket::ledger::queue::WorkerRow]) -> String {
    use std::fmt::Write as _;
    let safe = docket::sanitize::for_terminal;
    if rows.is_empty() {
        return format!("no worker has worked on session {} yet\n", safe(session));
    }
    let mut out = format!(
        "{:<40} {:<16} {:>7} {:>7} {:>8} {:>7} {:>8} {:>11}  state\n",
        "worker", "host", "pid", "claims", "sent", "req/s", "orphaned", "heartbeat"
    );
    for w in rows {
        let _ = writeln!(
            out,
            "{:<40} {:<16} {:>7} {:>7} {:>8} {:>7.1} {:>8} {:>9.1} s  {}",
            safe(&w.worker_id),
            safe(&w.host),
            w.pid,
            w.claims,
            w.sent,
            w.requests_per_sec,
            w.orphaned,
            w.heartbeat_age_secs,
            if w.alive { "alive" } else { "gone" }
        );
    }
    out
}

fn workers_json(rows: &[docket::ledger::queue::WorkerRow]) -> String {
    let list: Vec<serde_json::Value> = rows
        .iter()
        .map(|w| {
            serde_json::json!({
                "worker_id": w.worker_id, "host": w.host, "pid": w.pid, "claims": w.claims,
                "sent": w.sent, "requests_per_sec": w.requests_per_sec, "orphaned": w.orphaned,
                "heartbeat_age_secs": w.heartbeat_age_secs, "alive": w.alive,
            })
        })
        .collect();
    format!("{}\n", serde_json::Value::Array(list))
}
