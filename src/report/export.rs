//! `docket export [--session ID] [--what decisions|results|requests|items]
//! [--format csv|jsonl|parquet] [--output FILE]`.
//!
//! Stable snake_case columns in a fixed order (the `*_COLUMNS` constants; for
//! `items`, derived from the job's stages and gates), one row per record,
//! streamed. CSV has one header row and no index column; JSONL has one
//! object per line with the same keys in the same order; Parquet has the
//! same columns with the same types. Nothing that could hold a key (config
//! snapshots) is ever exported.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use rusqlite::{Connection, OptionalExtension};

use super::ReportError;
use super::columns::{Cell, Kind, RecordWriter, stream_rows};
use super::items::ItemTable;
use super::parquet::ParquetWriter;
use super::results::{RESULT_COLUMNS, RESULT_KINDS, RESULT_SELECT};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExportWhat {
    #[default]
    Decisions,
    Results,
    Requests,
    /// One row per item of a session, every stage's output flattened.
    Items,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExportFormat {
    #[default]
    Csv,
    Jsonl,
    /// Needs a file ([`export_file`]); never a terminal or a pipe.
    Parquet,
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

/// `export --what requests`, in order. `session_id`, `position` (the
/// stage's place in the job) and `state` (pending|passed|failed|skipped) are
/// the request's row in the session's pipeline: the exported session's, or
/// without `--session` the newest session that ran it.
pub const REQUEST_COLUMNS: &[&str] = &[
    "request_id",
    "session_id",
    "item_id",
    "stage",
    "position",
    "state",
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
    "last_client_request_id",
    "last_provider_request_id",
];

const REQUEST_KINDS: &[Kind] = &[
    Kind::Int,
    Kind::Text,
    Kind::Text,
    Kind::Text,
    Kind::Int,
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
    Kind::Text,
    Kind::Text,
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

// Per-request sums over its attempts, through llm_messages' (request_id,
// attempt) index; `sr` is the request's row in a session's pipeline.
const REQUEST_FIELDS: &str = "q.request_id, {session}, q.item_id, q.stage, sr.position, \
     sr.state, q.provider, q.model, q.request_version, q.status, q.attempt, q.transport_retries, \
     q.gate_failures, q.last_error, q.template_hash, q.params_hash, \
     (SELECT COALESCE(SUM(m.input_tokens), 0) FROM llm_messages m WHERE m.request_id = q.request_id), \
     (SELECT COALESCE(SUM(m.output_tokens), 0) FROM llm_messages m WHERE m.request_id = q.request_id), \
     (SELECT TOTAL(m.cost_usd) FROM llm_messages m WHERE m.request_id = q.request_id), \
     (SELECT COUNT(*) FROM llm_messages m WHERE m.request_id = q.request_id AND m.state = 'ambiguous'), \
     (SELECT m.client_request_id FROM llm_messages m WHERE m.request_id = q.request_id \
      ORDER BY m.attempt DESC LIMIT 1), \
     (SELECT m.provider_request_id FROM llm_messages m WHERE m.request_id = q.request_id \
      ORDER BY m.attempt DESC LIMIT 1)";

// Every request of every session, each with the newest session that ran it.
const REQUESTS_ALL_FROM: &str = " FROM llm_requests q \
     LEFT JOIN session_request sr ON sr.rowid = \
       (SELECT x.rowid FROM session_request x WHERE x.request_id = q.request_id \
        ORDER BY x.updated_at DESC LIMIT 1) \
     ORDER BY q.request_id";

// A session's requests: every (item, stage) of its pipeline, plus any request
// it sent or answered that predates session_request; in dispatch order, then
// stage order.
const REQUESTS_SESSION_FROM: &str = " FROM (SELECT request_id FROM session_request WHERE session_id = ?1 \
       UNION SELECT request_id FROM session_item WHERE session_id = ?1 \
       UNION SELECT request_id FROM llm_messages WHERE session_id = ?1 \
       UNION SELECT request_id FROM llm_batch_result \
             WHERE session_id = ?1 AND request_id IS NOT NULL) ids \
     JOIN llm_requests q ON q.request_id = ids.request_id \
     LEFT JOIN session_request sr ON sr.session_id = ?1 AND sr.request_id = q.request_id \
     LEFT JOIN session_item si ON si.session_id = ?1 AND si.item_id = q.item_id \
     ORDER BY si.position IS NULL, si.position, q.item_id, sr.position, q.request_id";

/// What to export, as columns and where the rows come from.
struct Plan {
    columns: Vec<String>,
    kinds: Vec<Kind>,
    source: Source,
}

enum Source {
    Sql(String),
    Items(ItemTable),
}

fn plan(conn: &Connection, opts: &ExportOptions, workspace: &Path) -> Result<Plan, ReportError> {
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
    let fixed = |columns: &[&str], kinds: &[Kind], sql: String| Plan {
        columns: columns.iter().map(|c| c.to_string()).collect(),
        kinds: kinds.to_vec(),
        source: Source::Sql(sql),
    };
    Ok(match opts.what {
        ExportWhat::Decisions => {
            let filter = if opts.session.is_some() {
                DECISIONS_SESSION_FILTER
            } else {
                ""
            };
            fixed(
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
            fixed(
                RESULT_COLUMNS,
                RESULT_KINDS,
                format!("{RESULT_SELECT}{filter} ORDER BY r.session_id, r.processed_at, r.item_id"),
            )
        }
        ExportWhat::Requests => {
            let (session, from) = if opts.session.is_some() {
                ("?1", REQUESTS_SESSION_FROM)
            } else {
                ("sr.session_id", REQUESTS_ALL_FROM)
            };
            let fields = REQUEST_FIELDS.replace("{session}", session);
            fixed(
                REQUEST_COLUMNS,
                REQUEST_KINDS,
                format!("SELECT {fields}{from}"),
            )
        }
        ExportWhat::Items => {
            let Some(session) = &opts.session else {
                return Err(ReportError::ItemsNeedSession);
            };
            let table = ItemTable::load(conn, session, workspace)?;
            Plan {
                columns: table.columns.clone(),
                kinds: table.kinds.clone(),
                source: Source::Items(table),
            }
        }
    })
}

impl Plan {
    fn stream(
        &self,
        conn: &Connection,
        session: Option<&str>,
        each: impl FnMut(&[Cell]) -> Result<(), ReportError>,
    ) -> Result<u64, ReportError> {
        match (&self.source, session) {
            (Source::Sql(sql), Some(s)) => stream_rows(conn, sql, [s], &self.kinds, each),
            (Source::Sql(sql), None) => stream_rows(conn, sql, [], &self.kinds, each),
            (Source::Items(t), Some(s)) => t.stream(conn, s, each),
            (Source::Items(_), None) => Err(ReportError::ItemsNeedSession),
        }
    }
}

/// The folder schema files are read from when none is given: the ledger's.
fn ledger_folder(conn: &Connection) -> PathBuf {
    conn.path()
        .filter(|p| !p.is_empty())
        .and_then(|p| Path::new(p).parent().map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Stream the chosen records to `out` as CSV or JSONL; returns how many were
/// written. `--what items` reads gate schema files relative to the ledger's
/// folder (the workspace); see [`export_in`] to name another. Parquet needs
/// a file: [`export_file`] or [`export_parquet`].
pub fn export(
    conn: &Connection,
    opts: &ExportOptions,
    out: &mut dyn Write,
) -> Result<u64, ReportError> {
    export_in(conn, opts, &ledger_folder(conn), out)
}

/// [`export`], with gate schema files read relative to `workspace`.
pub fn export_in(
    conn: &Connection,
    opts: &ExportOptions,
    workspace: &Path,
    out: &mut dyn Write,
) -> Result<u64, ReportError> {
    if opts.format == ExportFormat::Parquet {
        return Err(ReportError::ParquetNeedsFile);
    }
    let plan = plan(conn, opts, workspace)?;
    let keys: Vec<&str> = plan.columns.iter().map(String::as_str).collect();
    let mut w = match opts.format {
        ExportFormat::Jsonl => RecordWriter::jsonl(out, &keys),
        _ => RecordWriter::csv(out, &keys)?,
    };
    let rows = plan.stream(conn, opts.session.as_deref(), |c| w.write(c))?;
    w.finish()?;
    Ok(rows)
}

/// The chosen records as Parquet, written to `out` (a file, usually).
pub fn export_parquet<W: Write + Send>(
    conn: &Connection,
    opts: &ExportOptions,
    workspace: &Path,
    out: W,
) -> Result<u64, ReportError> {
    let plan = plan(conn, opts, workspace)?;
    let keys: Vec<&str> = plan.columns.iter().map(String::as_str).collect();
    let mut w = ParquetWriter::new(out, &keys, &plan.kinds)?;
    let rows = plan.stream(conn, opts.session.as_deref(), |c| w.write(c))?;
    w.finish()?;
    Ok(rows)
}

/// Write the chosen records to the file `path` in `opts.format` (any of the
/// three); returns how many rows were written.
pub fn export_file(
    conn: &Connection,
    opts: &ExportOptions,
    workspace: &Path,
    path: &Path,
) -> Result<u64, ReportError> {
    // Plan first, so an unknown session leaves no empty file behind.
    plan(conn, opts, workspace)?;
    let file = std::fs::File::create(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    if opts.format == ExportFormat::Parquet {
        return export_parquet(conn, opts, workspace, file);
    }
    let mut w = io::BufWriter::new(file);
    let n = export_in(conn, opts, workspace, &mut w)?;
    w.flush()?;
    Ok(n)
}
