//! Read-only views of the ledger: `docket batch-results`, `docket sessions`
//! and `docket export` (CSV, JSONL or Parquet).
//!
//! Everything here streams rows from the ledger ([`crate::report::reads`])
//! straight to the writer (no collecting a whole table in memory), and every
//! text that came from an item or a model is stripped of control characters
//! before it reaches a terminal.

mod attempts;
mod columns;
mod export;
mod html;
mod items;
mod parquet;
pub mod reads;
mod results;
mod sessions;

use std::fmt;
use std::io;

use crate::LedgerError;

pub use attempts::{ATTEMPT_COLUMNS, ATTEMPT_KINDS};
pub use columns::{Cell, Kind};
pub use export::{
    DECISION_COLUMNS, ExportFormat, ExportOptions, ExportWhat, REQUEST_COLUMNS, export,
    export_file, export_in, export_parquet,
};
pub use html::{write_html, write_html_file};
pub use items::{ITEM_COLUMNS, STAGE_COLUMNS};
pub use results::{RESULT_COLUMNS, RESULT_JSON_KEYS, SessionHead, write_results};
pub use sessions::{RESUMABLE_FOR_SECS, SESSION_COLUMNS, write_sessions};

/// Output format of `batch-results` and `sessions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutputFormat {
    #[default]
    Table,
    Csv,
    Json,
}

impl fmt::Display for OutputFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OutputFormat::Table => "table",
            OutputFormat::Csv => "csv",
            OutputFormat::Json => "json",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{}", docket_model::ids::unknown_session(.0))]
    UnknownSession(String),
    #[error("reading the ledger failed: {0}")]
    Ledger(#[from] LedgerError),
    #[error("writing the output failed: {0}")]
    Io(#[from] io::Error),
    #[error("writing CSV failed: {0}")]
    Csv(#[from] csv::Error),
    #[error("writing JSON failed: {0}")]
    Json(#[from] serde_json::Error),
    #[error("writing Parquet failed: {0}")]
    Parquet(#[from] ::parquet::errors::ParquetError),
    #[error(
        "Parquet is a binary file format: write it to a file with --output FILE \
         (not to a terminal or standard output)"
    )]
    ParquetNeedsFile,
    #[error("--what items is one session's items: name it with --session ID")]
    ItemsNeedSession,
    #[error(
        "{0} is the ledger (or one of its -wal, -shm files): an export never writes over it; choose another --output"
    )]
    OutputIsTheLedger(String),
}

impl ReportError {
    /// True when the reader went away (`docket export | head`): not worth an error message.
    pub fn is_broken_pipe(&self) -> bool {
        let kind = match self {
            ReportError::Io(e) => Some(e.kind()),
            ReportError::Csv(e) => match e.kind() {
                csv::ErrorKind::Io(e) => Some(e.kind()),
                _ => None,
            },
            ReportError::Json(e) => e.io_error_kind(),
            _ => None,
        };
        kind == Some(io::ErrorKind::BrokenPipe)
    }
}

// One sanitizer for the whole crate: reports use the same rules as the
// engine's output.
pub use docket_model::sanitize::{for_terminal as strip_controls, truncate as clip};

/// Unix seconds as `YYYY-MM-DD HH:MM:SS` (UTC), for tables.
pub fn table_time(ts: f64) -> String {
    columns::datetime(ts)
        .map(|d| d.format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_else(|| "?".to_string())
}

/// Unix seconds as ISO-8601 UTC (`2026-05-01T12:34:56Z`), for CSV and JSON.
pub fn iso_time(ts: f64) -> Option<String> {
    columns::datetime(ts).map(|d| d.format("%Y-%m-%dT%H:%M:%SZ").to_string())
}

/// 1234567 -> "1,234,567".
pub(crate) fn group_thousands(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3 + 1);
    if n < 0 {
        out.push('-');
    }
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_controls() {
        let s = strip_controls("ok\u{1b}[2J\u{7}\u{9b}31m\nnext\t\u{0}\u{202E}x");
        assert_eq!(s, "ok next x");
    }

    #[test]
    fn clips_by_chars() {
        assert_eq!(clip("abcdef", 4), "abc…");
        assert_eq!(clip("ab", 4), "ab");
        assert_eq!(clip("ééééé", 3), "éé…");
    }

    #[test]
    fn times() {
        assert_eq!(table_time(0.0), "1970-01-01 00:00:00");
        assert_eq!(
            iso_time(1_700_000_000.7).as_deref(),
            Some("2023-11-14T22:13:20Z")
        );
        assert_eq!(iso_time(f64::NAN), None);
    }

    #[test]
    fn thousands() {
        assert_eq!(group_thousands(0), "0");
        assert_eq!(group_thousands(1000), "1,000");
        assert_eq!(group_thousands(-1234567), "-1,234,567");
    }
}
