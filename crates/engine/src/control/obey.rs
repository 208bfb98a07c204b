//! The run controls in the ledger, obeyed: pause, resume, cancel, stop
//! after a stage, and a retune (or a change in the number of workers)
//! applied to the limiters.

use std::sync::atomic::Ordering;

use tokio::sync::watch;

use super::{Seen, cancel};
use crate::ctx::{Ctx, PAUSED_BY_OPERATOR, per_minute, share, tuned_settings};
use crate::progress::Reporter;
use docket_ledger::store;
use docket_ledger::writer::WriteOp;
use docket_model::routing::Thresholds;
use docket_providers::limiter::LimiterSettings;

/// Apply what the ledger asks: pause, resume, cancel, stop after a stage,
/// retune.
pub(super) fn obey(
    ctx: &Ctx,
    pause_tx: &watch::Sender<bool>,
    seen: &mut Seen,
    controls: &store::Controls,
    reporter: &dyn Reporter,
) {
    obey_desired_state(ctx, pause_tx, seen, controls, reporter);
    obey_stop_after(ctx, seen, controls, reporter);
    obey_tune(ctx, seen, controls, reporter);
    obey_routing(ctx, controls, reporter);
}

/// Pause, resume or cancel, as the ledger's desired state says.
fn obey_desired_state(
    ctx: &Ctx,
    pause_tx: &watch::Sender<bool>,
    seen: &mut Seen,
    controls: &store::Controls,
    reporter: &dyn Reporter,
) {
    let paused = *pause_tx.borrow();
    match controls.desired_state.as_str() {
        "paused" if !paused && !ctx.soft_stop.is_cancelled() => {
            pause_tx.send_replace(true);
            reporter.line("Paused from the ledger: no new requests; in-flight ones finish. Resume with `docket resume SESSION`.");
            ctx.writer.post(WriteOp::SessionState {
                session_id: ctx.session_id.clone(),
                state: "paused",
                stop_reason: Some(PAUSED_BY_OPERATOR.into()),
                completed: false,
                released: false,
            });
            ctx.event(
                "warn",
                "paused",
                "paused by operator: no new requests; in-flight ones finish".into(),
            );
        }
        "running" if paused => {
            pause_tx.send_replace(false);
            reporter.line("Resumed.");
            ctx.writer.post(WriteOp::SessionState {
                session_id: ctx.session_id.clone(),
                state: "running",
                stop_reason: None,
                completed: false,
                released: false,
            });
            ctx.event("info", "resumed", "resumed by operator".into());
        }
        "cancelled" if !ctx.soft_stop.is_cancelled() => {
            seen.cancelled_from_ledger = true;
            ctx.stop_from_ledger.store(true, Ordering::Relaxed);
            reporter.line("Cancelled from the ledger: stopping.");
            cancel(
                ctx,
                seen,
                "cancelled by operator: in-flight requests may finish within the grace",
            );
        }
        _ => {}
    }
}

/// Stop after a stage (or no longer), when the ledger asks it anew.
fn obey_stop_after(
    ctx: &Ctx,
    seen: &mut Seen,
    controls: &store::Controls,
    reporter: &dyn Reporter,
) {
    match &controls.stop_after_stage {
        Some(stage) if seen.stop_after_stage.as_ref() != Some(stage) => {
            seen.stop_after_stage = Some(stage.clone());
            let p = &ctx.p;
            let message = match p.stages.iter().position(|s| &s.name == stage) {
                Some(k) if k + 1 == p.stages.len() => {
                    format!("stage {stage} is the last stage; the session ends when it finishes")
                }
                Some(k) => {
                    *ctx.stop_after.lock().unwrap_or_else(|p| p.into_inner()) = Some(k);
                    format!(
                        "stop after stage {stage}: items finish it; {} and the stages after it start for no item until the session is resumed",
                        p.stages[k + 1].name
                    )
                }
                None => format!(
                    "stop after stage {stage}: this job has no such stage ({}); nothing changes",
                    p.stages
                        .iter()
                        .map(|s| s.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            reporter.line(&format!("Stop after stage requested: {message}."));
            ctx.event("info", "stop_at_stage", message);
        }
        None => {
            if seen.stop_after_stage.take().is_some() {
                *ctx.stop_after.lock().unwrap_or_else(|p| p.into_inner()) = None;
            }
        }
        Some(_) => {}
    }
}

/// Route with the thresholds the session records once a resume or a
/// worker joining it recorded others: the workers already on it switch
/// within a control tick, so the session's items are routed one way.
fn obey_routing(ctx: &Ctx, controls: &store::Controls, reporter: &dyn Reporter) {
    let (Some(review), Some(accept)) = controls.routing else {
        return;
    };
    let was = ctx.thresholds();
    if was.review == review && was.effective_accept() == accept {
        return;
    }
    // Recorded from checked flags; a snapshot edited by hand into
    // something unroutable is not followed.
    let Ok(now) = Thresholds::new(accept, review, None) else {
        return;
    };
    *ctx.routing.lock().unwrap_or_else(|p| p.into_inner()) = now;
    let message = format!(
        "routing thresholds recorded with the session: auto-accept at {accept} (was {}), review at {review} (was {}); answers are routed with them from now on",
        was.effective_accept(),
        was.review
    );
    reporter.line(&format!("Routing changed: {message}."));
    ctx.event("info", "routing", message);
}

/// Split the limits anew when the retune or the number of workers changed.
fn obey_tune(ctx: &Ctx, seen: &mut Seen, controls: &store::Controls, reporter: &dyn Reporter) {
    let workers = ctx.workers.load(Ordering::Relaxed).max(1);
    if controls.tune != seen.tune || workers != seen.workers {
        // A retune applies to every provider's limiter; the message shows
        // the first stage's.
        let first = ctx.p.first();
        let before = tuned_settings(first, &seen.tune);
        let after = tuned_settings(first, &controls.tune);
        let (old_tune, old_workers) = (seen.tune, seen.workers);
        seen.tune = controls.tune;
        seen.workers = workers;
        for (name, limiter) in &ctx.limiters {
            if let Some(st) = ctx.p.stages.iter().find(|s| &s.provider_name == name) {
                let was = share(tuned_settings(st, &old_tune), old_workers);
                let now = share(tuned_settings(st, &controls.tune), workers);
                if was != now {
                    limiter.retune(now);
                }
            }
        }
        if workers != old_workers {
            let mine = share(after, workers);
            ctx.event(
                "info",
                "workers",
                format!(
                    "{workers} worker(s) share the session's limits: worker {} runs at requests/min {}, tokens/min {}, concurrency {}",
                    ctx.worker_id,
                    per_minute(mine.requests_per_minute),
                    per_minute(mine.tokens_per_minute),
                    mine.max_concurrency
                ),
            );
        }
        if before != after {
            ctx.make_room_for(after.max_concurrency);
            let changes = retune_changes(&before, &after);
            let message = format!("retuned: {}", changes.join(", "));
            reporter.line(&format!("Retuned from the ledger: {}.", changes.join(", ")));
            ctx.event("info", "retuned", message);
        }
    }
}

/// What a retune changed, as the operator reads it.
fn retune_changes(before: &LimiterSettings, after: &LimiterSettings) -> Vec<String> {
    let mut changes = Vec::new();
    if before.max_concurrency != after.max_concurrency {
        changes.push(format!(
            "concurrency {} -> {}",
            before.max_concurrency, after.max_concurrency
        ));
    }
    if before.requests_per_minute != after.requests_per_minute {
        changes.push(format!(
            "requests/min {} -> {}",
            per_minute(before.requests_per_minute),
            per_minute(after.requests_per_minute)
        ));
    }
    if before.tokens_per_minute != after.tokens_per_minute {
        changes.push(format!(
            "tokens/min {} -> {}",
            per_minute(before.tokens_per_minute),
            per_minute(after.tokens_per_minute)
        ));
    }
    changes
}
