//! `docket sessions`: every session's numbers, newest first.

use crate::db::{Connection, params};

use super::EachRow;
use super::rows::stream_rows;
use crate::report::{Kind, ReportError};

/// The columns of `report::SESSION_COLUMNS`, in order. `?1` is the oldest
/// start time that is still resumable. `?2` is the oldest heartbeat of a
/// live engine: a session still owned by a process whose heartbeat is older
/// is shown as `interrupted` (killed, or the machine went down); it can be
/// resumed.
const SESSIONS_SQL: &str = "SELECT session_id, \
     CASE WHEN state IN ('running', 'paused') AND owner_pid IS NOT NULL AND COALESCE(heartbeat_at, 0) < ?2 THEN 'interrupted' ELSE state END, \
     desired_state, started_at, completed_at, \
     total_count, processed_count, accepted_count, reviewed_count, rejected_count, error_count, \
     retry_count, rate_limited_count, ambiguous_count, input_tokens, output_tokens, cost_usd, \
     estimated_cost_usd, stop_reason, \
     (state IN ('running', 'paused', 'cancelled', 'error') AND started_at >= ?1) \
     FROM llm_batch_session ORDER BY started_at DESC, session_id DESC";

pub(super) fn for_each_session(
    conn: &Connection,
    resumable_since: f64,
    live_since: f64,
    kinds: &[Kind],
    each: EachRow<'_>,
) -> Result<u64, ReportError> {
    stream_rows(
        conn,
        SESSIONS_SQL,
        params![resumable_since, live_since],
        kinds,
        each,
    )
}
