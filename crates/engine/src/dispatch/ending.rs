//! The end of a worker's run: it lets go of what it holds, and either
//! leaves the session to the other workers still on it or ends the session
//! in the state its stop (or its finished work) calls for.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use crate::ctx::{Ctx, StopCause};
use crate::{EngineError, RunEnd};
use docket_ledger::work::{RunSessions, WorkQueue};
use docket_ledger::writer::WriteOp;
use docket_ledger::{Ledger, LedgerError};

/// Let go of this worker's items, then leave or end the session. Takes the
/// context so that, once it returns, only the caller's writer handle keeps
/// the ledger writer open.
pub(super) async fn end_session(
    ctx: Arc<Ctx>,
    read: &Arc<Mutex<Ledger>>,
    left_at_provider: u64,
) -> Result<RunEnd, EngineError> {
    let session_id = ctx.session_id.clone();
    // Let go of every item this worker still holds: other workers (or a
    // resume) take them at once, with nothing to repair.
    let _ = ctx
        .writer
        .write(WriteOp::Leave {
            session_id: session_id.clone(),
            worker_id: ctx.worker_id.clone(),
        })
        .await;
    let cause = ctx.cause();
    let (remaining, others) = tokio::task::block_in_place(|| {
        let ledger = read.lock().unwrap_or_else(|p| p.into_inner());
        let remaining = ledger.next_work(&session_id, -1, 1).map(|w| w.len())?;
        let others = ledger.live_workers(&session_id)?;
        Ok::<_, LedgerError>((remaining, others))
    })?;
    let (state, reason, end) = outcome(&ctx, cause, remaining);
    // This worker stopped on its own (a signal, its budget, a failure) while
    // others still work the session: it leaves, and the session runs on.
    if remaining > 0 && others > 0 && !ctx.stop_from_ledger.load(Ordering::Relaxed) {
        ctx.event(
            "info",
            "worker_left",
            format!(
                "worker {} left the session ({}); {others} other worker(s) carry on",
                ctx.worker_id,
                reason.as_deref().unwrap_or("its work ran out")
            ),
        );
        tracing::info!(session = %session_id, "worker left; the session runs on");
        return Ok(end);
    }
    announce_end(&ctx, state, reason.as_deref(), left_at_provider);
    let _ = ctx
        .writer
        .write(WriteOp::SessionState {
            session_id: session_id.clone(),
            state,
            stop_reason: reason,
            completed: state == "completed",
            released: true,
        })
        .await;
    tracing::info!(session = %session_id, state, "dispatch ended");
    Ok(end)
}

/// The session's state, the reason on record, and the run's end, from why
/// the run stopped and how many items are left.
fn outcome(
    ctx: &Ctx,
    cause: Option<StopCause>,
    remaining: usize,
) -> (&'static str, Option<String>, RunEnd) {
    match cause {
        // Every item has its outcome: a stop that came after the last one
        // changes nothing.
        _ if remaining == 0 => ("completed", None, RunEnd::Completed),
        None => {
            let why = why_stopped_with_items_left(ctx);
            ("paused", Some(why.clone()), RunEnd::Paused(why))
        }
        Some(StopCause::Cancelled) => (
            "cancelled",
            Some("cancelled".to_string()),
            RunEnd::Cancelled,
        ),
        Some(StopCause::Paused(m)) => ("paused", Some(m.clone()), RunEnd::Paused(m)),
        Some(StopCause::Fatal(m)) => ("error", Some(m.clone()), RunEnd::Stopped(m)),
        Some(StopCause::Budget(m)) => ("paused", Some(m.clone()), RunEnd::Paused(m)),
        Some(StopCause::LedgerFailed(m)) => ("error", Some(m.clone()), RunEnd::LedgerFailed(m)),
    }
}

/// The feed ran out with no stop asked for, yet items are left: a stop
/// after a stage, or requests held on a batch that could not be told apart.
fn why_stopped_with_items_left(ctx: &Ctx) -> String {
    let held: usize = ctx.batchers().map(|b| b.held_count()).sum();
    let stopped_at = *ctx.stop_after.lock().unwrap_or_else(|p| p.into_inner());
    match (held, stopped_at) {
        (0, Some(s)) if s + 1 < ctx.p.stages.len() => format!(
            "stopped after stage {} as asked; resume to run {} and the stages after it",
            ctx.p.stages[s].name,
            ctx.p.stages[s + 1].name
        ),
        (held, _) if held > 0 => format!(
            "{held} request(s) wait on a provider batch that could not be told apart from others (see the session's events); resume once it is sorted out"
        ),
        _ => "stopped with items left".to_string(),
    }
}

/// The session's last event. Posted just before the final state, so both
/// land in one flush.
fn announce_end(ctx: &Ctx, state: &str, reason: Option<&str>, left_at_provider: u64) {
    let s = ctx.stats.snapshot();
    let level = match state {
        "error" => "error",
        "completed" => "info",
        _ => "warn",
    };
    ctx.event(
        level,
        "ended",
        format!(
            "session ended {state}: {} ({} of {} items processed){}",
            reason.unwrap_or("every item has an outcome"),
            s.done,
            s.total,
            if left_at_provider > 0 {
                format!("; {left_at_provider} provider batch(es) still open at the provider")
            } else {
                String::new()
            }
        ),
    );
}
