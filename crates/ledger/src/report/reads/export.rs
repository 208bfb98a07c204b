//! `docket export --what decisions|requests`: every decision with its
//! newest result and review, and every request with its per-attempt sums.

use crate::db::{Connection, Dialect, OptionalExtension, params};

use super::EachRow;
use super::rows::stream_rows;
use crate::report::{Kind, ReportError};

// The newest result per item comes from a grouped subquery (SQLite's bare
// columns take the values of the MAX row); it is materialised once and joined
// through an automatic index, since llm_batch_result has no index on item_id.
/// Each item's columns, newest review status and, when its decision is an
/// operator's correction (migration 0011), the fields they changed and the
/// suggestion they replaced; the newest result is joined after it, in each
/// engine's way.
macro_rules! decisions_select {
    () => {
        "SELECT d.item_id, d.state, d.evidence_json, d.decided_answer_json, \
         d.decided_by, d.decided_at, d.confidence, d.model_id, d.adjudication_id, \
         lr.outcome, lr.session_id, \
         (SELECT rv.status FROM review_item rv WHERE rv.item_id = d.item_id \
          ORDER BY rv.created_at DESC, rv.review_id DESC LIMIT 1), \
         (SELECT rv.audit FROM review_item rv WHERE rv.item_id = d.item_id \
          ORDER BY rv.created_at DESC, rv.review_id DESC LIMIT 1), \
         (SELECT l.corrected_fields FROM review_log l WHERE l.item_id = d.item_id \
          AND l.corrected_answer_json IS NOT NULL AND l.undone_by_log_id IS NULL \
          AND l.actor = d.decided_by AND l.at = d.decided_at ORDER BY l.log_id DESC LIMIT 1), \
         (SELECT rv.llm_suggestion_json FROM review_log l \
          JOIN review_item rv ON rv.review_id = l.review_id WHERE l.item_id = d.item_id \
          AND l.corrected_answer_json IS NOT NULL AND l.undone_by_log_id IS NULL \
          AND l.actor = d.decided_by AND l.at = d.decided_at ORDER BY l.log_id DESC LIMIT 1), \
         d.evidence_hash, lr.stale \
         FROM decision d "
    };
}

const DECISIONS_SQL: &str = concat!(
    decisions_select!(),
    "LEFT JOIN (SELECT item_id, outcome, session_id, stale, MAX(processed_at) AS newest \
     FROM llm_batch_result GROUP BY item_id) lr ON lr.item_id = d.item_id"
);

/// PostgreSQL has no bare columns beside an aggregate: the newest result
/// per item is its `DISTINCT ON` row.
const DECISIONS_SQL_POSTGRES: &str = concat!(
    decisions_select!(),
    "LEFT JOIN (SELECT DISTINCT ON (item_id) item_id, outcome, session_id, stale \
     FROM llm_batch_result ORDER BY item_id, processed_at DESC) lr ON lr.item_id = d.item_id"
);

fn decisions_sql(conn: &Connection) -> &'static str {
    match conn.dialect() {
        Dialect::Sqlite => DECISIONS_SQL,
        Dialect::Postgres => DECISIONS_SQL_POSTGRES,
    }
}

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
      ORDER BY m.attempt DESC LIMIT 1), q.evidence_hash";

// Every request of every session, each with the newest session that ran it
// (PostgreSQL has no rowid: the newest row comes from a lateral subquery).
const REQUESTS_ALL_FROM_POSTGRES: &str = " FROM llm_requests q \
     LEFT JOIN LATERAL (SELECT x.* FROM session_request x WHERE x.request_id = q.request_id \
        ORDER BY x.updated_at DESC LIMIT 1) sr ON TRUE \
     ORDER BY q.request_id";
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

pub(super) fn session_exists(conn: &Connection, session_id: &str) -> crate::db::Result<bool> {
    let known: Option<i64> = conn
        .query_row(
            "SELECT 1 FROM llm_batch_session WHERE session_id = ?1",
            params![session_id],
            |r| r.get(0),
        )
        .optional()?;
    Ok(known.is_some())
}

/// The columns of `report::DECISION_COLUMNS`, by item id.
pub(super) fn for_each_decision(
    conn: &Connection,
    session_id: Option<&str>,
    kinds: &[Kind],
    each: EachRow<'_>,
) -> Result<u64, ReportError> {
    match session_id {
        Some(s) => stream_rows(
            conn,
            &format!(
                "{}{DECISIONS_SESSION_FILTER} ORDER BY d.item_id",
                decisions_sql(conn)
            ),
            params![s],
            kinds,
            each,
        ),
        None => stream_rows(
            conn,
            &format!("{} ORDER BY d.item_id", decisions_sql(conn)),
            params![],
            kinds,
            each,
        ),
    }
}

/// The columns of `report::REQUEST_COLUMNS`.
pub(super) fn for_each_request(
    conn: &Connection,
    session_id: Option<&str>,
    kinds: &[Kind],
    each: EachRow<'_>,
) -> Result<u64, ReportError> {
    match session_id {
        Some(s) => {
            let fields = REQUEST_FIELDS.replace("{session}", "?1");
            let sql = format!("SELECT {fields}{REQUESTS_SESSION_FROM}");
            stream_rows(conn, &sql, params![s], kinds, each)
        }
        None => {
            let fields = REQUEST_FIELDS.replace("{session}", "sr.session_id");
            let from = match conn.dialect() {
                Dialect::Sqlite => REQUESTS_ALL_FROM,
                Dialect::Postgres => REQUESTS_ALL_FROM_POSTGRES,
            };
            let sql = format!("SELECT {fields}{from}");
            stream_rows(conn, &sql, params![], kinds, each)
        }
    }
}
