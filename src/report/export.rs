//! `docket export [--session ID] [--what decisions|results|requests] [--format csv|jsonl]`.
//!
//! Stable snake_case columns in a fixed order (the `*_COLUMNS` constants), one
//! row per record, streamed. CSV has one header row and no index column;
//! JSONL has one object per line with the same keys in the same order. Nothing
//! that could hold a key (config snapshots) is ever exported.

use std::io::Write;

use rusqlite::{Connection, OptionalExtension};

use super::ReportError;
use super::columns::{Kind, RecordWriter, stream_rows};
use super::results::{RESULT_COLUMNS, RESULT_KINDS, RESULT_SELECT};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExportWhat {
    #[default]
    Decisions,
    Results,
    Requests,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExportFormat {
    #[default]
    Csv,
    Jsonl,
}

#[derive(Debug, Clone, Default)]
pub struct ExportOptions {
    /// Only the records of this session: for decisions, the session's items;
    /// for results, its results; for requests, the requests it sent or set out to send.
    pub session: Option<String>,
    pub what: ExportWhat,
    pub format: ExportFormat,
}

/// `export --what decisions`, in order.
pub const DECISION_COLUMNS: &[&str] = &[
    "item_id",
    "state",
    "evidence_json",
    "decided_answer_json",
    "decided_by",
    "decided_at",
    "confidence",
    "model_id",
    "adjudication_id",
    "last_outcome",
    "last_session_id",
    "review_status",
];

const DECISION_KINDS: &[Kind] = &[
    Kind::Text,
    Kind::Text,
    Kind::Json,
    Kind::Json,
    Kind::Text,
    Kind::Ts,
    Kind::Float,
    Kind::Text,
    Kind::Text,
    Kind::Text,
    Kind::Text,
    Kind::Text,
];

/// `export --what requests`, in order.
pub const REQUEST_COLUMNS: &[&str] = &[
    "request_id",
    "item_id",
    "stage",
    "provider",
    "model",
    "request_version",
    "status",
    "attempt",
    "transport_retries",
    "gate_failures",
    "last_error",
    "template_hash",
    "params_hash",
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "ambiguous_attempts",
];

const REQUEST_KINDS: &[Kind] = &[
    Kind::Int,
    Kind::Text,
    Kind::Text,
    Kind::Text,
    Kind::Text,
    Kind::Int,
    Kind::Text,
    Kind::Int,
    Kind::Int,
    Kind::Int,
    Kind::Text,
    Kind::Text,
    Kind::Text,
    Kind::Int,
    Kind::Int,
    Kind::Float,
    Kind::Int,
];

const _: () = assert!(DECISION_COLUMNS.len() == DECISION_KINDS.len());
const _: () = assert!(REQUEST_COLUMNS.len() == REQUEST_KINDS.len());

// The newest result per item comes from a grouped subquery (SQLite's bare
// columns take the values of the MAX row); it is materialised once and joined
// through an automatic index, since llm_batch_result has no index on item_id.
const DECISIONS_SQL: &str = "SELECT d.item_id, d.state, d.evidence_json, d.decided_answer_json, \
     d.decided_by, d.decided_at, d.confidence, d.model_id, d.adjudication_id, \
     lr.outcome, lr.session_id, \
     (SELECT rv.status FROM review_item rv WHERE rv.item_id = d.item_id \
      ORDER BY rv.created_at DESC, rv.review_id DESC LIMIT 1) \
     FROM decision d \
     LEFT JOIN (SELECT item_id, outcome, session_id, MAX(processed_at) AS newest \
                FROM llm_batch_result GROUP BY item_id) lr ON lr.item_id = d.item_id";

const DECISIONS_SESSION_FILTER: &str = " WHERE d.item_id IN \
     (SELECT item_id FROM session_item WHERE session_id = ?1 \
      UNION SELECT item_id FROM llm_batch_result WHERE session_id = ?1)";

const REQUESTS_SQL: &str = "SELECT q.request_id, q.item_id, q.stage, q.provider, q.model, \
     q.request_version, q.status, q.attempt, q.transport_retries, q.gate_failures, q.last_error, \
     q.template_hash, q.params_hash, \
     COALESCE(SUM(m.input_tokens), 0), COALESCE(SUM(m.output_tokens), 0), TOTAL(m.cost_usd), \
     COALESCE(SUM(m.state = 'ambiguous'), 0) \
     FROM llm_requests q LEFT JOIN llm_messages m ON m.request_id = q.request_id";

const REQUESTS_SESSION_FILTER: &str = " WHERE q.request_id IN \
     (SELECT request_id FROM session_item WHERE session_id = ?1 \
      UNION SELECT request_id FROM llm_messages WHERE session_id = ?1 \
      UNION SELECT request_id FROM llm_batch_result \
            WHERE session_id = ?1 AND request_id IS NOT NULL)";

/// Stream the chosen records to `out`; returns how many were written.
pub fn export(
    conn: &Connection,
    opts: &ExportOptions,
    out: &mut dyn Write,
) -> Result<u64, ReportError> {
    if let Some(session) = &opts.session {
        let known: Option<i64> = conn
            .query_row(
                "SELECT 1 FROM llm_batch_session WHERE session_id = ?1",
                [session],
                |r| r.get(0),
            )
            .optional()?;
        if known.is_none() {
            return Err(ReportError::UnknownSession(session.clone()));
        }
    }
    let (columns, kinds, sql) = match opts.what {
        ExportWhat::Decisions => {
            let filter = if opts.session.is_some() {
                DECISIONS_SESSION_FILTER
            } else {
                ""
            };
            (
                DECISION_COLUMNS,
                DECISION_KINDS,
                format!("{DECISIONS_SQL}{filter} ORDER BY d.item_id"),
            )
        }
        ExportWhat::Results => {
            let filter = if opts.session.is_some() {
                " WHERE r.session_id = ?1"
            } else {
                ""
            };
            (
                RESULT_COLUMNS,
                RESULT_KINDS,
                format!("{RESULT_SELECT}{filter} ORDER BY r.session_id, r.processed_at, r.item_id"),
            )
        }
        ExportWhat::Requests => {
            let filter = if opts.session.is_some() {
                REQUESTS_SESSION_FILTER
            } else {
                ""
            };
            (
                REQUEST_COLUMNS,
                REQUEST_KINDS,
                format!("{REQUESTS_SQL}{filter} GROUP BY q.request_id ORDER BY q.request_id"),
            )
        }
    };
    let mut w = match opts.format {
        ExportFormat::Csv => RecordWriter::csv(out, columns)?,
        ExportFormat::Jsonl => RecordWriter::jsonl(out, columns),
    };
    let rows = match &opts.session {
        Some(s) => stream_rows(conn, &sql, [s], kinds, |c| w.write(c))?,
        None => stream_rows(conn, &sql, [], kinds, |c| w.write(c))?,
    };
    w.finish()?;
    Ok(rows)
}
