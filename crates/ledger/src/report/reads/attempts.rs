//! `docket export --what attempts`: every attempt with its request's item,
//! stage, provider and model, in the order they were sent.

use crate::db::{Connection, params};

use super::EachRow;
use super::rows::stream_rows;
use crate::Ledger;
use crate::report::{Kind, ReportError};

/// The ledger's read for `export --what attempts` (a part of
/// [`super::Reports`]).
pub trait AttemptReports {
    /// Attempts (`report::ATTEMPT_COLUMNS`): a session's or every one, in
    /// the order they were sent.
    fn for_each_attempt(
        &self,
        session_id: Option<&str>,
        kinds: &[Kind],
        each: EachRow<'_>,
    ) -> Result<u64, ReportError>;
}

impl AttemptReports for Ledger {
    fn for_each_attempt(
        &self,
        session_id: Option<&str>,
        kinds: &[Kind],
        each: EachRow<'_>,
    ) -> Result<u64, ReportError> {
        for_each_attempt(self.conn(), session_id, kinds, each)
    }
}

// The same SQL for SQLite and PostgreSQL: a plain join, no bare columns, and
// REAL/double precision timestamps subtract alike.
const ATTEMPTS_SELECT: &str = "SELECT m.session_id, q.item_id, q.stage, m.request_id, \
     m.attempt, m.state, m.http_status, m.finish_reason, m.assistant_output, \
     m.input_tokens, m.output_tokens, m.cost_usd, \
     CASE WHEN m.finished_at IS NULL THEN NULL ELSE m.finished_at - m.sent_at END, \
     m.error_kind, m.error_message, m.sent_at, m.finished_at, q.provider, q.model, \
     m.model_reported, m.client_request_id, m.provider_request_id \
     FROM llm_messages m JOIN llm_requests q ON q.request_id = m.request_id";

/// The columns of `report::ATTEMPT_COLUMNS`: one session's attempts or
/// every attempt, by send order.
fn for_each_attempt(
    conn: &Connection,
    session_id: Option<&str>,
    kinds: &[Kind],
    each: EachRow<'_>,
) -> Result<u64, ReportError> {
    match session_id {
        Some(s) => {
            let sql = format!("{ATTEMPTS_SELECT} WHERE m.session_id = ?1 ORDER BY m.message_id");
            stream_rows(conn, &sql, params![s], kinds, each)
        }
        None => {
            let sql = format!("{ATTEMPTS_SELECT} ORDER BY m.message_id");
            stream_rows(conn, &sql, params![], kinds, each)
        }
    }
}
