//! Repair before work: leases that ran out are let go and the attempts
//! left 'sent' by a stop are marked ambiguous.

use super::leases::expire_dead_local_workers;
use super::workers::live_workers;
use crate::db::{Connection, TransactionBehavior, params};
use crate::store::hostname;

/// Before a process works on a session (a resume, or a worker joining):
/// items whose lease ran out (their worker died or stalled) are let go, with
/// a new fencing token so whatever their old worker still writes is
/// refused; then every attempt of an item nobody holds that is still marked
/// 'sent' left the machine and never got an answer recorded: it is marked
/// ambiguous (it may have been billed), counted, and its request is sent
/// again. Items a live worker holds are left alone: the session may be
/// joined while it runs. Returns how many attempts were found.
///
/// `resume`: the operator resumes the session (`--resume`): it runs again,
/// and a pause or stop-after-stage asked of it is cleared. Without it (a
/// `docket worker` joining) the session's controls stay as they are.
pub(crate) fn repair_interrupted(
    conn: &mut Connection,
    session_id: &str,
    max_cost_usd: Option<f64>,
    resume: bool,
) -> crate::db::Result<Repair> {
    let now = conn.now()?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    // A worker of this host killed since its last beat does not count as
    // live (nor keep its leases): the resume works alone, as it says.
    expire_dead_local_workers(&tx, session_id)?;
    let live_workers = live_workers(&tx, session_id)?;
    tx.execute(
        "UPDATE session_item SET claim_token = claim_token + 1, lease_until = NULL, claimed_by = NULL
         WHERE session_id = ?1 AND lease_until IS NOT NULL AND lease_until < ?2",
        params![session_id, now],
    )?;
    let n = tx.execute(
        "UPDATE llm_messages SET state = 'ambiguous', error_kind = 'ambiguous',
             error_message = 'no answer was recorded before the process stopped; it may have been billed', finished_at = ?2
         WHERE state = 'sent' AND +session_id = ?1
           AND request_id IN (SELECT sr.request_id FROM session_request sr
                              JOIN session_item si ON si.session_id = sr.session_id AND si.item_id = sr.item_id
                              WHERE sr.session_id = ?1 AND si.lease_until IS NULL)
           -- a line of a provider batch still open is not lost: the resume
           -- polls its batch and ingests the result
           AND NOT EXISTS (SELECT 1 FROM provider_batch_item bi
                           JOIN provider_batch b ON b.batch_id = bi.batch_id
                           WHERE bi.request_id = llm_messages.request_id
                             AND bi.attempt = llm_messages.attempt AND b.state != 'ingested')",
        params![session_id, now],
    )? as u64;
    tx.execute(
        "UPDATE llm_batch_session SET ambiguous_count = ambiguous_count + ?2, attempt_count = attempt_count + ?2,
             state = CASE WHEN ?7 OR desired_state != 'paused' THEN 'running' ELSE 'paused' END,
             desired_state = CASE WHEN ?7 THEN 'running' ELSE desired_state END,
             stop_after_stage = CASE WHEN ?7 THEN NULL ELSE stop_after_stage END,
             stop_reason = CASE WHEN ?7 OR desired_state != 'paused' THEN NULL ELSE stop_reason END,
             completed_at = NULL, max_cost_usd = COALESCE(?3, max_cost_usd),
             owner_pid = ?4, owner_host = ?5, heartbeat_at = ?6, updated_at = ?6
         WHERE session_id = ?1",
        params![session_id, n as i64, max_cost_usd, std::process::id(), hostname(), now, resume],
    )?;
    tx.commit()?;
    Ok(Repair {
        ambiguous: n,
        live_workers,
    })
}

/// What `repair_interrupted` found.
#[derive(Debug, Clone, PartialEq)]
pub struct Repair {
    /// Attempts that were in flight at a stop and are now ambiguous.
    pub ambiguous: u64,
    /// Workers running the session already (this process joins them).
    pub live_workers: u64,
}
