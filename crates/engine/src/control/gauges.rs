//! The live gauges a worker writes with its heartbeat: its own (in flight,
//! limits, rates over the last minute, stage, reason it is slow), and the
//! session's, added up over every live worker.

use tokio::time::Instant;

use crate::ctx::{Ctx, PAUSED_BY_OPERATOR};
use docket_ledger::watch::LiveGauges;

/// Since when this engine dispatches, for the elapsed time.
pub(super) struct Window {
    started: Instant,
}

impl Window {
    pub(super) fn new() -> Self {
        Window {
            started: Instant::now(),
        }
    }
}

/// The gauges this engine writes with its heartbeat.
pub(super) fn gauges(ctx: &Ctx, window: &Window, paused: bool) -> LiveGauges {
    let now = Instant::now();
    let frontier = ctx.frontier();
    let lim = ctx.rt(frontier).limiter.snapshot();
    // The limiter's own count of the last 60 seconds' sends, taken when it
    // let them go: it never holds more than the limit, so the gauge never
    // reads above it (a rate scaled from a short span, or counted at the
    // answer, would). Batch lines never pass the limiter: they are not
    // requests against the synchronous limits.
    let (rpm_used, tpm_used) = (
        lim.requests_last_minute as f64,
        lim.tokens_last_minute as f64,
    );
    let elapsed = now.duration_since(window.started).as_secs_f64();
    let slow_reason = if paused {
        PAUSED_BY_OPERATOR.to_string()
    } else if ctx
        .batchers()
        .any(|b| b.is_cancelling() && b.open_count() > 0)
    {
        format!(
            "cancelling {} provider batch(es): collecting what they finished",
            ctx.batchers().map(|b| b.open_count()).sum::<usize>()
        )
    } else if ctx.soft_stop.is_cancelled() {
        "stopping: requests in flight are finishing".to_string()
    } else if ctx.batchers().any(|b| b.open_count() > 0) {
        format!(
            "waiting on {} provider batch(es): results come when the provider finishes them",
            ctx.batchers().map(|b| b.open_count()).sum::<usize>()
        )
    } else {
        lim.slow_reason.describe().to_string()
    };
    let deadline = ctx.rt(frontier).deadline.gauge();
    LiveGauges {
        deadline_secs: deadline.deadline_secs,
        latency_p99_secs: deadline.p99_secs,
        deadline_cuts: deadline.cuts,
        in_flight: lim.in_flight as u64,
        concurrency_limit: lim.concurrency_limit as u64,
        max_concurrency: lim.max_concurrency as u64,
        rpm_limit: lim.requests_per_minute,
        tpm_limit: lim.tokens_per_minute,
        rpm_used,
        tpm_used,
        slow_reason,
        paused,
        stage: ctx.p.stages[frontier].name.clone(),
        elapsed_secs: elapsed,
        // The controller sets it from the stages (`eta.rs`).
        eta_secs: None,
    }
}

/// The session's gauges from this worker's and the other live workers':
/// what is in flight, the limits (their shares add up to the session's)
/// and the rates add up; the stage, the reason it is slow and the elapsed
/// time are this worker's view.
pub(super) fn combine(mine: &LiveGauges, others: &[LiveGauges]) -> LiveGauges {
    let mut all = mine.clone();
    for g in others {
        all.in_flight += g.in_flight;
        all.concurrency_limit += g.concurrency_limit;
        all.max_concurrency += g.max_concurrency;
        all.rpm_limit += g.rpm_limit;
        all.tpm_limit += g.tpm_limit;
        all.rpm_used += g.rpm_used;
        all.tpm_used += g.tpm_used;
        all.paused |= g.paused;
        all.elapsed_secs = all.elapsed_secs.max(g.elapsed_secs);
        // The longest deadline of any worker: none of them cuts sooner.
        all.deadline_secs = all.deadline_secs.max(g.deadline_secs);
        all.latency_p99_secs = match (all.latency_p99_secs, g.latency_p99_secs) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        all.deadline_cuts += g.deadline_cuts;
    }
    // The ETA is the session's already (every stage's remaining requests
    // at the session's pace, `eta.rs`): the same from every worker.
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sessions_gauges_add_up_its_workers() {
        let mine = LiveGauges {
            in_flight: 3,
            concurrency_limit: 8,
            max_concurrency: 8,
            rpm_limit: 600,
            rpm_used: 500.0,
            stage: "adjudicate".into(),
            elapsed_secs: 10.0,
            eta_secs: Some(30.0),
            deadline_secs: 2.0,
            latency_p99_secs: None,
            deadline_cuts: 1,
            ..LiveGauges::default()
        };
        let other = LiveGauges {
            in_flight: 5,
            concurrency_limit: 8,
            max_concurrency: 8,
            rpm_limit: 600,
            rpm_used: 550.0,
            stage: "critic".into(),
            elapsed_secs: 40.0,
            deadline_secs: 3.0,
            latency_p99_secs: Some(1.5),
            deadline_cuts: 2,
            ..LiveGauges::default()
        };
        let all = combine(&mine, &[other]);
        assert_eq!(
            (all.deadline_secs, all.latency_p99_secs, all.deadline_cuts),
            (3.0, Some(1.5), 3),
            "the longest deadline, the p99 it came from, every cut"
        );
        assert_eq!(
            (all.in_flight, all.max_concurrency, all.rpm_limit),
            (8, 16, 1_200)
        );
        assert!((all.rpm_used - 1_050.0).abs() < 1e-9);
        assert_eq!(all.stage, "adjudicate");
        assert_eq!(all.elapsed_secs, 40.0);
        assert_eq!(
            all.eta_secs,
            Some(30.0),
            "the session's, as this worker has it"
        );
        assert!(all.rpm_used <= all.rpm_limit as f64);
    }
}
