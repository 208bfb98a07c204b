//! `docket batch-results` and `export --what results`: a session's header
//! numbers and its results.

use crate::db::{Connection, OptionalExtension, params};

use super::EachRow;
use super::rows::stream_rows;
use crate::now_ts;
use crate::report::{Kind, ReportError, SessionHead};
use crate::store::shown_state_of;

/// The select list matching `report::RESULT_COLUMNS` (table alias `r`).
const RESULT_SELECT: &str = "SELECT r.session_id, r.item_id, r.outcome, r.confidence, \
     r.answer_json, r.rationale, r.error_message, r.model_id, r.stage, r.request_id, r.attempts, \
     r.input_tokens, r.output_tokens, r.cost_usd, r.processed_at, r.adjudication_id, \
     (SELECT COUNT(*) FROM review_item rv WHERE rv.session_id = r.session_id \
        AND rv.item_id = r.item_id AND rv.audit = 1), r.stale \
     FROM llm_batch_result r";

pub(super) fn session_head(
    conn: &Connection,
    session_id: &str,
) -> crate::db::Result<Option<SessionHead>> {
    let now = now_ts();
    conn.query_row(
        "SELECT session_id, state, desired_state, started_at, completed_at, total_count, \
         processed_count, accepted_count, reviewed_count, rejected_count, error_count, \
         retry_count, rate_limited_count, ambiguous_count, input_tokens, output_tokens, \
         cost_usd, estimated_cost_usd, max_cost_usd, stop_reason, stop_after_stage, heartbeat_at, \
         config_snapshot_json, profile_name, profile_version \
         FROM llm_batch_session WHERE session_id = ?1",
        params![session_id],
        |r| {
            let state: String = r.get(1)?;
            let desired_state: String = r.get(2)?;
            let stop_after_stage = r.get::<_, Option<String>>(20)?.is_some();
            let heartbeat_at: Option<f64> = r.get(21)?;
            let snapshot: Option<String> = r.get(22)?;
            let profile_name: Option<String> = r.get(23)?;
            let profile_version: Option<i64> = r.get(24)?;
            Ok(SessionHead {
                session_id: r.get(0)?,
                shown: shown_state_of(&state, &desired_state, stop_after_stage, heartbeat_at, now),
                state,
                desired_state,
                started_at: r.get(3)?,
                completed_at: r.get(4)?,
                total: r.get(5)?,
                processed: r.get(6)?,
                accepted: r.get(7)?,
                review: r.get(8)?,
                rejected: r.get(9)?,
                errors: r.get(10)?,
                retries: r.get(11)?,
                rate_limited: r.get(12)?,
                ambiguous: r.get(13)?,
                input_tokens: r.get(14)?,
                output_tokens: r.get(15)?,
                cost_usd: r.get(16)?,
                estimated_cost_usd: r.get(17)?,
                max_cost_usd: r.get(18)?,
                stop_reason: r.get(19)?,
                completion_mode: snapshot.as_deref().and_then(completion_mode_of),
                profile: profile_name
                    .zip(profile_version)
                    .map(|(n, v)| crate::profiles::label(&n, v)),
            })
        },
    )
    .optional()
}

/// The completion mode a session's snapshot records (`flags.completion_mode`);
/// None for a session from before it was recorded.
pub(crate) fn completion_mode_of(snapshot_json: &str) -> Option<String> {
    let snap: serde_json::Value = serde_json::from_str(snapshot_json).ok()?;
    snap.pointer("/flags/completion_mode")?
        .as_str()
        .map(str::to_string)
}

/// The longest item id and model id among the session's results, in
/// characters; `None` when it has no results (or no model ids).
pub(super) fn result_id_widths(
    conn: &Connection,
    session_id: &str,
) -> crate::db::Result<(Option<i64>, Option<i64>)> {
    conn.query_row(
        "SELECT MAX(LENGTH(item_id)), MAX(LENGTH(model_id)) FROM llm_batch_result WHERE session_id = ?1",
        params![session_id],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
}

pub(super) fn for_each_result(
    conn: &Connection,
    session_id: Option<&str>,
    kinds: &[Kind],
    each: EachRow<'_>,
) -> Result<u64, ReportError> {
    match session_id {
        Some(s) => stream_rows(
            conn,
            &format!("{RESULT_SELECT} WHERE r.session_id = ?1 ORDER BY r.processed_at, r.item_id"),
            params![s],
            kinds,
            each,
        ),
        None => stream_rows(
            conn,
            &format!("{RESULT_SELECT} ORDER BY r.session_id, r.processed_at, r.item_id"),
            params![],
            kinds,
            each,
        ),
    }
}
