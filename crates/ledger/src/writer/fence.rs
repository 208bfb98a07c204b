//! Fenced writes: an operation applies only while its worker still holds
//! the item (or batch); a refused answer is recorded as orphaned spend.

use super::apply::apply;
use super::counters::Counters;
use super::{Fence, WriteOp};
use crate::db::{Connection, OptionalExtension, params};

/// Apply `op` if its fence holds (true), or record what the refused write
/// had paid for as orphaned spend (false).
pub(super) fn apply_fenced(
    conn: &Connection,
    op: &WriteOp,
    fence: Option<&Fence>,
    counters: &mut Counters,
) -> crate::db::Result<bool> {
    let holds = match fence {
        None => true,
        Some(Fence::Batch { tag, worker_id }) => {
            // Locked until the commit on PostgreSQL (see `queue::current_token`).
            let sql = match conn.dialect() {
                crate::db::Dialect::Sqlite => {
                    "SELECT claimed_by FROM provider_batch WHERE tag = ?1"
                }
                crate::db::Dialect::Postgres => {
                    "SELECT claimed_by FROM provider_batch WHERE tag = ?1 FOR SHARE"
                }
            };
            let holder: Option<Option<String>> = conn
                .prepare_cached(sql)?
                .query_row(params![tag], |r| r.get(0))
                .optional()?;
            holder.flatten().as_deref() == Some(&**worker_id)
        }
        // The item's outcome ends the claim: the lease goes with the check.
        Some(Fence::Item {
            session_id,
            item_id,
            token,
            ..
        }) if matches!(op, WriteOp::Final(..)) => {
            conn.prepare_cached(
                "UPDATE session_item SET lease_until = NULL
                 WHERE session_id = ?1 AND item_id = ?2 AND claim_token = ?3",
            )?
            .execute(params![session_id, item_id, token])?
                == 1
        }
        Some(Fence::Item {
            session_id,
            item_id,
            token,
            ..
        }) => crate::queue::current_token(conn, session_id, item_id)? == Some(*token),
    };
    if holds {
        apply(conn, op, counters)?;
        return Ok(true);
    }
    if let Some(Fence::Item {
        session_id,
        item_id,
        worker_id,
        ..
    }) = fence
    {
        record_orphan(conn, op, session_id, item_id, worker_id, counters)?;
    }
    Ok(false)
}

/// A write refused by its fence. An answer that came back for it was paid
/// for and is never applied: its tokens and cost go on the attempt's row
/// (which the worker that took the item over marked ambiguous) and into the
/// session's orphaned-spend counters.
fn record_orphan(
    conn: &Connection,
    op: &WriteOp,
    session_id: &str,
    item_id: &str,
    worker_id: &str,
    counters: &mut Counters,
) -> crate::db::Result<()> {
    let now = conn.now()?;
    let attempt = match op {
        WriteOp::Attempt(a) => Some(a),
        WriteOp::Final(a, _) | WriteOp::Stage(a, _) => a.as_ref(),
        _ => None,
    };
    // Only an attempt that went out counts: a refused intent sent nothing.
    let Some(a) = attempt.filter(|a| a.state != "failed" || a.http_status.is_some()) else {
        return Ok(());
    };
    conn.prepare_cached(
        "UPDATE llm_messages SET input_tokens = COALESCE(?3, input_tokens), output_tokens = COALESCE(?4, output_tokens),
             cost_usd = ?5, error_message = 'answered after its worker lost the item (lease lost); the result was refused: orphaned spend'
         WHERE request_id = ?1 AND attempt = ?2 AND state != 'answered'",
    )?
    .execute(params![
        a.request_id,
        a.attempt,
        a.input_tokens.map(|v| v as i64),
        a.output_tokens.map(|v| v as i64),
        a.cost_usd
    ])?;
    counters.orphaned(session_id, a.cost_usd);
    conn.prepare_cached("UPDATE session_worker SET orphaned = orphaned + 1 WHERE worker_id = ?1")?
        .execute(params![worker_id])?;
    conn.prepare_cached(
        "INSERT INTO session_event (session_id, at, level, kind, message, actor)
         VALUES (?1, ?2, 'warn', 'lease_lost', ?3, ?4)",
    )?
    .execute(params![
        session_id,
        now,
        format!(
            "item {item_id}: an answer (request {}, attempt {}) came back after this worker lost the item to another; refused and counted as orphaned spend (${:.6})",
            a.request_id, a.attempt, a.cost_usd
        ),
        worker_id
    ])?;
    Ok(())
}
