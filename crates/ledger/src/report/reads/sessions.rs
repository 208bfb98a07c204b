//! `docket sessions`: every session's numbers, newest first.

use crate::db::{Connection, params};

use super::EachRow;
use super::rows::read_cells;
use crate::report::{Cell, Kind, ReportError};
use crate::store::shown_state_of;

/// The columns of `report::SESSION_COLUMNS` read as they are, in order,
/// then what the state shown is derived from (`stop_after_stage`,
/// `heartbeat_at`) and the snapshot the last report column
/// (`completion_mode`) is read from. `?1` is the
/// oldest start time that is still resumable.
const SESSIONS_SQL: &str = "SELECT session_id, state, \
     desired_state, started_at, completed_at, \
     total_count, processed_count, accepted_count, reviewed_count, rejected_count, error_count, \
     retry_count, rate_limited_count, ambiguous_count, input_tokens, output_tokens, cost_usd, \
     estimated_cost_usd, stop_reason, \
     (state IN ('running', 'paused', 'cancelled', 'error') AND started_at >= ?1), \
     CASE WHEN profile_version IS NULL THEN NULL ELSE profile_name || '@' || profile_version END, \
     stop_after_stage, heartbeat_at, config_snapshot_json \
     FROM llm_batch_session ORDER BY started_at DESC, session_id DESC";

/// Where the state and the wish sit among the report's columns.
const STATE: usize = 1;
const DESIRED: usize = 2;
/// Where the facts after the report's columns sit.
const STOP_AFTER_STAGE: usize = 21;
const HEARTBEAT_AT: usize = 22;
const SNAPSHOT: usize = 23;

/// Every session as `kinds` (the report's columns), its `state` the word
/// every view shows (`store::shown_state_of` at `now`: a session whose
/// engine died reads `interrupted` within seconds, as in the console).
pub(super) fn for_each_session(
    conn: &Connection,
    resumable_since: f64,
    now: f64,
    kinds: &[Kind],
    each: EachRow<'_>,
) -> Result<u64, ReportError> {
    let mut stmt = conn.prepare(SESSIONS_SQL)?;
    let mut rows = stmt.query_large(params![resumable_since])?;
    let wants_mode = kinds.len() > STOP_AFTER_STAGE;
    let kinds = &kinds[..kinds.len().min(STOP_AFTER_STAGE)];
    let mut cells: Vec<Cell> = Vec::with_capacity(kinds.len());
    let mut count = 0u64;
    while let Some(row) = rows.next()? {
        read_cells(&row, kinds, &mut cells)?;
        let stop_after_stage = row.get::<_, Option<String>>(STOP_AFTER_STAGE)?.is_some();
        let heartbeat_at = row.get::<_, Option<f64>>(HEARTBEAT_AT)?;
        if kinds.len() > DESIRED {
            let stored = cells[STATE].as_str().unwrap_or("").to_string();
            let desired = cells[DESIRED].as_str().unwrap_or("");
            let shown = shown_state_of(&stored, desired, stop_after_stage, heartbeat_at, now);
            cells[STATE] = Cell::Text(shown.word().to_string());
        }
        if wants_mode {
            let snapshot = row.get::<_, Option<String>>(SNAPSHOT)?;
            cells.push(
                snapshot
                    .as_deref()
                    .and_then(super::results::completion_mode_of)
                    .map_or(Cell::Null, Cell::Text),
            );
        }
        each(&cells)?;
        count += 1;
    }
    Ok(count)
}
