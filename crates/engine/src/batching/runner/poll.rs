//! Driving a submitted batch: polled on the provider's cadence, cancelled
//! when asked, said to be stalled past its window, and collected once over.

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;

use super::collect::collect;
use super::{Tracked, hold_base};
use crate::batching::Batcher;
use docket_ledger::batches::BatchOp;
use docket_ledger::now_ts;
use docket_ledger::writer::WriteOp;
use docket_providers::ProviderError;
use docket_providers::batch::{BatchState, BatchStatus};

const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// Poll until the batch is over (cancelling it when asked), then collect.
pub(super) async fn drive(b: &Arc<Batcher>, mut t: Tracked) {
    let mut next = first_poll(b);
    let mut poll_errors = 0u32;
    let status = loop {
        if (b.cancel.is_cancelled() || t.cancel_wanted) && !t.cancel_sent {
            t.cancel_sent = true;
            cancel(b, &t).await;
            next = Duration::ZERO;
        }
        tokio::select! {
            _ = tokio::time::sleep(next) => {}
            _ = b.detached.cancelled() => return,
            _ = b.cancel.cancelled(), if !t.cancel_sent => continue,
        }
        let polled = tokio::select! {
            r = b.adapter.poll(&t.provider_batch_id) => r,
            _ = b.detached.cancelled() => return,
        };
        match polled {
            Ok(s) => {
                poll_errors = 0;
                t.state = s.state.as_str().to_string();
                tell_if_stalled(b, &mut t, None);
                let done = s.state.is_terminal() && !s.results_pending;
                next = cadence(b, &s.state, t.created_at);
                let next_at = (!done).then(|| now_ts() + next.as_secs_f64());
                if !b
                    .write(WriteOp::Batch(status_op(&t.tag, &s, next_at, true)))
                    .await
                {
                    // Taken over (or the ledger failed): not ours to collect.
                    return;
                }
                if done {
                    on_over(b, &mut t, &s);
                    break s;
                }
            }
            Err(e) => {
                poll_errors += 1;
                next = after_poll_error(b, &mut t, &e, poll_errors);
            }
        }
    };
    collect(b, &mut t, &status).await;
}

/// The batch is over at the provider: a cancel docket did not ask for is
/// told (row B5), and its tokens leave the model's queue.
fn on_over(b: &Batcher, t: &mut Tracked, s: &BatchStatus) {
    if s.state == BatchState::Cancelled && !t.cancel_sent {
        // Row B5: cancelled at the provider, not by docket.
        b.event(
            "warn",
            "batch_cancelled_by_provider",
            format!(
                "batch {}: cancelled at the provider (docket did not ask): what it finished is kept, the rest goes again",
                t.tag
            ),
        );
    }
    // Its tokens leave the model's queue; a failure for the
    // enqueued-token limit teaches the budget.
    if let Some(open) = t.open.take() {
        match &s.state {
            BatchState::Failed(why) if crate::batching::enqueued::is_token_limit(why) => {
                t.hold = Some(open.refused(hold_base(b)));
            }
            _ => drop(open),
        }
    }
}

/// A poll failed: when to poll again (as the provider asks, or backing
/// off, never faster than the cadence), told now and then, and on record.
fn after_poll_error(b: &Batcher, t: &mut Tracked, e: &ProviderError, poll_errors: u32) -> Duration {
    let next = e
        .headers
        .retry_after
        .unwrap_or_else(|| backoff(poll_errors))
        .max(cadence(b, &BatchState::InProgress, t.created_at));
    tell_if_stalled(b, t, Some(e));
    if poll_errors == 1 || poll_errors.is_multiple_of(10) {
        b.event(
            "warn",
            "batch_poll_failed",
            format!(
                "batch {}: poll failed ({e}); trying again in {:.0} s (the batch goes on at the provider)",
                t.tag,
                next.as_secs_f64()
            ),
        );
    }
    b.writer.post(WriteOp::Batch(BatchOp::NextPoll {
        tag: t.tag.clone(),
        next_poll_at: now_ts() + next.as_secs_f64(),
    }));
    next
}

/// Row B8: a batch still not done past its window (the provider's usual
/// 24 h, or `stall_after_secs`) is said to be stalled, once: an event and
/// a line. Polling goes on (backing off while polls fail); nothing is
/// cancelled or sent again: its lines wait for its results.
fn tell_if_stalled(b: &Batcher, t: &mut Tracked, poll_error: Option<&ProviderError>) {
    if t.stall_told {
        return;
    }
    let window = b.settings.stall_after;
    let Some(late) =
        docket_providers::batch::stalled_for(&t.state, Some(t.since), now_ts(), window)
    else {
        return;
    };
    t.stall_told = true;
    let human = docket_providers::batch::human_duration;
    let at = Duration::from_secs_f64((now_ts() - t.since).max(0.0));
    let polls = match poll_error {
        Some(e) => format!("its polls fail ({e}) and back off"),
        None => "polling goes on".to_string(),
    };
    let why = format!(
        "batch {} is stalled for {}: still {} at {} {} after its submission (expected within {}); {polls}, nothing is cancelled or sent again",
        t.tag,
        human(late),
        t.state,
        b.stage().provider_name,
        human(at),
        human(window.unwrap_or(docket_providers::batch::USUAL_WINDOW)),
    );
    b.event("warn", "batch_stalled", why.clone());
    b.reporter.line(&format!("Batch {why}."));
}

/// The first poll: soon after a submit (validation is quick), at the
/// cadence otherwise.
fn first_poll(b: &Batcher) -> Duration {
    b.settings.poll_interval.unwrap_or_else(|| {
        b.adapter
            .poll_after(&BatchState::Validating, Duration::ZERO)
    })
}

/// The provider's cadence for `state` (or the configured interval), with
/// jitter so many batches do not poll in step.
pub(super) fn cadence(b: &Batcher, state: &BatchState, created_at: f64) -> Duration {
    let age = Duration::from_secs_f64((now_ts() - created_at).max(0.0));
    let base = b
        .settings
        .poll_interval
        .unwrap_or_else(|| b.adapter.poll_after(state, age));
    let jitter = rand::rng().random_range(0.9..1.1);
    base.mul_f64(jitter)
}

pub(super) fn backoff(tries: u32) -> Duration {
    let secs = 2f64
        .powi(tries.min(16) as i32)
        .min(MAX_BACKOFF.as_secs_f64());
    Duration::from_secs_f64(secs)
}

/// Sleep unless the run lets go of its batches meanwhile.
pub(super) async fn pause(b: &Batcher, d: Duration) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => true,
        _ = b.detached.cancelled() => false,
    }
}

fn status_op(tag: &str, s: &BatchStatus, next_poll_at: Option<f64>, polled: bool) -> BatchOp {
    BatchOp::Status {
        tag: tag.to_string(),
        state: s.state.as_str().to_string(),
        completed: s.counts.completed,
        failed: s.counts.failed,
        output_ref: s.output_ref.clone(),
        error_ref: s.error_ref.clone(),
        error_message: match &s.state {
            BatchState::Failed(why) => Some(why.clone()),
            _ => None,
        },
        next_poll_at,
        polled,
        ended: s.state.is_terminal(),
    }
}

pub(super) async fn cancel(b: &Arc<Batcher>, t: &Tracked) {
    b.write(WriteOp::Batch(BatchOp::CancelRequested {
        tag: t.tag.clone(),
    }))
    .await;
    match b.adapter.cancel(&t.provider_batch_id).await {
        Ok(s) => {
            b.event(
                "warn",
                "batch_cancelled",
                format!(
                    "batch {}: cancel asked of the provider (now {}); what it finished is collected",
                    t.tag,
                    s.state.as_str()
                ),
            );
            b.write(WriteOp::Batch(status_op(&t.tag, &s, None, false)))
                .await;
        }
        Err(e) => b.event(
            "warn",
            "batch_cancel_failed",
            format!(
                "batch {}: the provider did not take the cancel ({e}); it is polled until it ends",
                t.tag
            ),
        ),
    }
}
