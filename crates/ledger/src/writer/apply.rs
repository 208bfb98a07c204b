//! Applying one operation: which statements each kind of `WriteOp` runs.

use super::counters::Counters;
use super::outcomes::{apply_final, apply_new_request, apply_stage_done, close_attempt};
use super::{AttemptRecord, Fence, NewRequest, SendIntent, StageDone, WriteOp};
use crate::db::{Connection, params};

pub(super) fn apply(
    conn: &Connection,
    op: &WriteOp,
    counters: &mut Counters,
) -> crate::db::Result<()> {
    let now = conn.now()?;
    match op {
        WriteOp::Send(s) => record_intent(conn, s, now),
        WriteOp::Abandon {
            session_id,
            request_id,
            attempt,
            message,
        } => abandon_attempt(
            conn,
            session_id,
            *request_id,
            *attempt,
            message,
            now,
            counters,
        ),
        WriteOp::Attempt(a) => record_attempt(conn, a, now, counters),
        WriteOp::Final(attempt, f) => apply_final(conn, attempt.as_ref(), f, now, counters),
        WriteOp::Stage(attempt, d) => end_stage(conn, attempt.as_ref(), d, now, counters),
        WriteOp::Request(r) => make_request(conn, r, now),
        WriteOp::Batch(b) => crate::batches::apply(conn, b, now),
        WriteOp::Heartbeat {
            session_id,
            live_json,
            worker,
        } => {
            // The session's row at the end of the transaction, with the
            // counters (see `counters`); the worker's own row now.
            counters.beat(session_id, live_json.as_deref());
            if let Some(w) = worker {
                crate::queue::beat(conn, session_id, w)?;
            }
            Ok(())
        }
        WriteOp::Renew {
            session_id,
            worker_id,
            lease_secs,
        } => crate::queue::renew(conn, session_id, worker_id, *lease_secs).map(|_| ()),
        WriteOp::ReleaseItem(fence) => release_item(conn, fence),
        WriteOp::Leave {
            session_id,
            worker_id,
        } => {
            crate::queue::release_all(conn, session_id, worker_id)?;
            crate::queue::worker_ended(conn, worker_id)
        }
        WriteOp::Event {
            session_id,
            level,
            kind,
            message,
        } => record_event(conn, session_id, level, kind, message, now),
        WriteOp::SessionState {
            session_id,
            state,
            stop_reason,
            completed,
            released,
        } => set_session_state(
            conn,
            session_id,
            state,
            stop_reason.as_deref(),
            *completed,
            *released,
            now,
        ),
    }
}

/// One insert: the attempt exists on disk before its request leaves.
/// The request's `attempt` and the session's counters are settled when
/// the attempt closes (a crash leaves it 'sent': see repair_interrupted).
fn record_intent(conn: &Connection, s: &SendIntent, now: f64) -> crate::db::Result<()> {
    conn.prepare_cached(
        "INSERT INTO llm_messages (request_id, attempt, session_id, client_request_id, state, system_prompt, user_prompt, sent_at)
                 VALUES (?1, ?2, ?3, ?4, 'sent', ?5, ?6, ?7)",
    )?
    .execute(params![s.request_id, s.attempt, s.session_id, s.client_request_id, s.system_prompt.as_deref(), s.user_prompt, now])?;
    crate::store::record_sent_evidence(conn, s.request_id, s.evidence_hash.as_deref())
}

/// An attempt whose handling panicked becomes ambiguous if it is still
/// 'sent' (see `WriteOp::Abandon`).
fn abandon_attempt(
    conn: &Connection,
    session_id: &str,
    request_id: i64,
    attempt: i64,
    message: &str,
    now: f64,
    counters: &mut Counters,
) -> crate::db::Result<()> {
    let n = conn
        .prepare_cached(
            "UPDATE llm_messages SET state = 'ambiguous', error_kind = 'ambiguous', error_message = ?3,
                         finished_at = ?4
                     WHERE request_id = ?1 AND attempt = ?2 AND state = 'sent'",
        )?
        .execute(params![request_id, attempt, message, now])?;
    if n == 0 {
        return Ok(());
    }
    conn.prepare_cached(
        "UPDATE llm_requests SET attempt = MAX(attempt, ?2), last_error = ?3, updated_at = ?4
                 WHERE request_id = ?1",
    )?
    .execute(params![request_id, attempt, message, now])?;
    counters.abandoned(session_id);
    Ok(())
}

/// An attempt that closed without ending its stage (it will be retried).
fn record_attempt(
    conn: &Connection,
    a: &AttemptRecord,
    now: f64,
    counters: &mut Counters,
) -> crate::db::Result<()> {
    close_attempt(conn, a, now)?;
    conn.prepare_cached(
        "UPDATE llm_requests SET attempt = MAX(attempt, ?2), transport_retries = transport_retries + ?3,
                     gate_failures = gate_failures + ?4, last_error = COALESCE(?5, last_error), updated_at = ?6
                 WHERE request_id = ?1",
    )?
    .execute(params![a.request_id, a.attempt, a.transport_failure as i64, a.gate_failure as i64, a.error_message, now])?;
    counters.attempt(&a.session_id, Some(a), None);
    Ok(())
}

/// The attempt record (if any) and a stage's end for an item.
fn end_stage(
    conn: &Connection,
    attempt: Option<&AttemptRecord>,
    d: &StageDone,
    now: f64,
    counters: &mut Counters,
) -> crate::db::Result<()> {
    if let Some(a) = attempt {
        close_attempt(conn, a, now)?;
    }
    apply_stage_done(conn, attempt, d, now, counters)?;
    counters.attempt(&d.session_id, attempt, None);
    Ok(())
}

/// Make (or find) the request; its caller hears of it once the group
/// commits (`NewRequest::answer`).
fn make_request(conn: &Connection, r: &NewRequest, now: f64) -> crate::db::Result<()> {
    let made = apply_new_request(conn, r, now)?;
    if let Ok(mut m) = r.made.lock() {
        *m = Some(made);
    }
    Ok(())
}

/// Let go of an item without an outcome: its lease ends now.
fn release_item(conn: &Connection, fence: &Fence) -> crate::db::Result<()> {
    let Fence::Item {
        session_id,
        item_id,
        token,
        ..
    } = fence
    else {
        return Ok(());
    };
    conn.prepare_cached(
        "UPDATE session_item SET lease_until = NULL
                 WHERE session_id = ?1 AND item_id = ?2 AND claim_token = ?3",
    )?
    .execute(params![session_id, item_id, token])?;
    Ok(())
}

/// A session event; the engine's events have no actor.
fn record_event(
    conn: &Connection,
    session_id: &str,
    level: &str,
    kind: &str,
    message: &str,
    now: f64,
) -> crate::db::Result<()> {
    conn.prepare_cached(
        "INSERT INTO session_event (session_id, at, level, kind, message, actor)
                 VALUES (?1, ?2, ?3, ?4, ?5, NULL)",
    )?
    .execute(params![session_id, now, level, kind, message])?;
    Ok(())
}

/// The session's state, and its owner let go when `released`.
fn set_session_state(
    conn: &Connection,
    session_id: &str,
    state: &str,
    stop_reason: Option<&str>,
    completed: bool,
    released: bool,
    now: f64,
) -> crate::db::Result<()> {
    conn.prepare_cached(
        "UPDATE llm_batch_session SET state = ?2, stop_reason = ?3,
                     completed_at = CASE WHEN ?4 THEN ?5 ELSE completed_at END,
                     desired_state = CASE WHEN ?2 IN ('completed', 'cancelled', 'error') AND desired_state = 'paused' THEN 'running' ELSE desired_state END,
                     owner_pid = CASE WHEN ?6 THEN NULL ELSE owner_pid END,
                     heartbeat_at = CASE WHEN ?6 THEN NULL ELSE heartbeat_at END,
                     updated_at = ?5
                 WHERE session_id = ?1",
    )?
    .execute(params![session_id, state, stop_reason, completed, now, released])?;
    Ok(())
}
