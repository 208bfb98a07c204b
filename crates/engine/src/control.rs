//! The control loop of a worker: it obeys the run controls in the ledger
//! (pause, resume, cancel, stop after a stage, retune) and the signals,
//! splits the provider's limits with the other live workers, renews this
//! worker's leases, adopts provider batches no live worker holds, and
//! writes the heartbeat with the live gauges.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::Interrupts;
use super::batching::Batcher;
use super::ctx::{
    Ctx, PAUSED_BY_OPERATOR, StopCause, per_minute, share, tuned_settings, worker_beat,
};
use super::progress::Reporter;
use super::reach_probe::ReachProbes;
use docket_ledger::store;
use docket_ledger::watch::{LiveGauges, Tune};
use docket_ledger::work::{RunSessions, WorkQueue};
use docket_ledger::writer::WriteOp;
use docket_ledger::{Ledger, LedgerError};
use docket_providers::limiter::SlowReason;

const CONTROL_POLL: Duration = Duration::from_millis(400);

/// The window of the gauges' requests/min and tokens/min.
const RATE_WINDOW: Duration = Duration::from_secs(60);

/// At most one `rate_limited` event this often.
const RATE_EVENT_SPACING: Duration = Duration::from_secs(10);

/// How often a worker looks for provider batches no live worker holds.
const ADOPT_POLL: Duration = Duration::from_secs(2);

/// What the control loop has applied and reported so far.
#[derive(Default)]
struct Seen {
    /// The retune the limiter runs with (all None: the config's limits).
    tune: Tune,
    stop_after_stage: Option<String>,
    cancel_reported: bool,
    /// An operator asked the ledger to cancel: provider batches go too.
    cancelled_from_ledger: bool,
    rate_limited: bool,
    last_cuts: u64,
    last_rate_event: Option<Instant>,
    /// The number of workers the limits were last split between.
    workers: u64,
}

/// Requests and tokens sent over the last minute, for the gauges.
struct Window {
    started: Instant,
    first_done: u64,
    /// (when, attempts sent, tokens used) at each tick.
    samples: VecDeque<(Instant, u64, u64)>,
}

impl Window {
    fn new(stats: &super::stats::StatsSnapshot) -> Self {
        Window {
            started: Instant::now(),
            first_done: stats.done,
            samples: VecDeque::new(),
        }
    }

    /// Add a sample; per-minute requests and tokens over the last minute (or
    /// since the start, scaled, when that is shorter).
    fn rates(&mut self, now: Instant, sent: u64, tokens: u64) -> (f64, f64) {
        self.samples.push_back((now, sent, tokens));
        // Keep the newest sample at least a minute old as the window's start.
        while self.samples.len() > 2 && now.duration_since(self.samples[1].0) >= RATE_WINDOW {
            self.samples.pop_front();
        }
        let (t0, sent0, tokens0) = self.samples[0];
        let secs = now.duration_since(t0).as_secs_f64();
        if secs < 0.05 {
            return (0.0, 0.0);
        }
        let scale = 60.0 / secs;
        (
            sent.saturating_sub(sent0) as f64 * scale,
            tokens.saturating_sub(tokens0) as f64 * scale,
        )
    }
}

/// The gauges this engine writes with its heartbeat.
fn gauges(ctx: &Ctx, window: &mut Window, paused: bool) -> LiveGauges {
    let now = Instant::now();
    let s = ctx.stats.snapshot();
    let frontier = ctx.frontier();
    let lim = ctx.rt(frontier).limiter.snapshot();
    let (rpm_used, tpm_used) = window.rates(now, s.sent, s.input_tokens + s.output_tokens);
    let elapsed = now.duration_since(window.started).as_secs_f64();
    let done_here = s.done.saturating_sub(window.first_done);
    let eta_secs = (!paused && done_here > 0 && s.total > s.done)
        .then(|| elapsed / done_here as f64 * (s.total - s.done) as f64);
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
        eta_secs,
    }
}

/// Watch the run controls in the ledger (desired_state, stop after a stage,
/// retune), the signals and the heartbeat with the live gauges.
pub(super) async fn control_loop(
    ctx: Arc<Ctx>,
    pause_tx: watch::Sender<bool>,
    interrupts: Interrupts,
    grace: Duration,
    reporter: Arc<dyn Reporter>,
) {
    let ledger = match Ledger::open_read_only(&ctx.p.ledger) {
        Ok(l) => Arc::new(std::sync::Mutex::new(l)),
        Err(e) => {
            // Without it nothing obeys the ledger or writes a heartbeat:
            // stop (resumably) rather than run blind.
            ctx.stop(StopCause::LedgerFailed(format!(
                "cannot watch the ledger's run controls: {e}"
            )));
            for b in ctx.batchers() {
                b.detach();
            }
            return;
        }
    };
    let mut tick = tokio::time::interval(CONTROL_POLL);
    // On PostgreSQL a control reaches this loop when it commits (LISTEN);
    // the poll above stays as the fallback.
    let woken = Arc::new(tokio::sync::Notify::new());
    let _listening = {
        let woken = woken.clone();
        let sid = ctx.session_id.clone();
        let l = ledger.lock().unwrap_or_else(|p| p.into_inner());
        l.listen(move |n| {
            if n.channel == docket_ledger::postgres::CONTROL_CHANNEL && n.payload == sid {
                woken.notify_one();
            }
        })
    };
    let mut hard_deadline: Option<Instant> = None;
    let mut seen = Seen {
        workers: ctx.workers.load(Ordering::Relaxed),
        ..Seen::default()
    };
    let mut window = Window::new(&ctx.stats.snapshot());
    let mut last_renewal = Instant::now();
    let mut last_adoption = Instant::now();
    let mut probes = ReachProbes::new(ctx.p.stages.len());
    let mut disk = super::disk_guard::DiskGuard::new(&ctx.p.ledger);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = woken.notified() => {}
            _ = interrupts.stop.cancelled(), if !ctx.soft_stop.is_cancelled() => {
                reporter.line("Stopping gracefully... (in-flight requests may finish; Ctrl-C again to abandon them)");
                cancel(&ctx, &mut seen, "cancelled by a signal: in-flight requests may finish within the grace");
            }
            _ = interrupts.pause.cancelled(), if !ctx.soft_stop.is_cancelled() => {
                reporter.line("Pausing: no new requests; in-flight ones finish, then the session is saved paused.");
                ctx.stop(StopCause::Paused(PAUSED_BY_OPERATOR.into()));
                ctx.event(
                    "warn",
                    "paused",
                    "paused by operator: in-flight requests finish, then this process lets go of the session (resume with --resume)".into(),
                );
            }
            _ = interrupts.abort.cancelled(), if !ctx.hard_stop.is_cancelled() => {
                cancel(&ctx, &mut seen, "cancelled: requests in flight abandoned");
                ctx.hard_stop.cancel();
                ctx.writer.health().give_up();
                for b in ctx.batchers() {
                    b.detach();
                }
            }
        }
        if ctx.soft_stop.is_cancelled() {
            for b in ctx.batchers() {
                steer_batches(&ctx, b, &seen, &interrupts, &*reporter);
            }
        }
        if ctx.soft_stop.is_cancelled() && hard_deadline.is_none() {
            hard_deadline = Some(Instant::now() + grace);
        }
        if let Some(d) = hard_deadline
            && Instant::now() >= d
        {
            ctx.hard_stop.cancel();
            // Writes held for a full disk fail now: the run is abandoned.
            ctx.writer.health().give_up();
        }
        let controls = {
            let ledger = ledger.clone();
            let sid = ctx.session_id.clone();
            let me = ctx.worker_id.clone();
            tokio::task::spawn_blocking(move || {
                let l = ledger.lock().unwrap_or_else(|p| p.into_inner());
                let controls = l.session_controls(&sid)?;
                let workers = l.live_workers(&sid)?;
                // With others on the session, its counters and spend are
                // theirs too: read them back for the progress and budget.
                let (row, others) = if workers > 1 {
                    (l.load_session(&sid)?, l.others_gauges(&sid, &me)?)
                } else {
                    (None, Vec::new())
                };
                Ok::<_, LedgerError>((controls, workers, row, others))
            })
            .await
        };
        let mut others: Vec<LiveGauges> = Vec::new();
        if let Ok(Ok((Some(controls), workers, row, other_json))) = controls {
            others = other_json
                .iter()
                .filter_map(|j| serde_json::from_str(j).ok())
                .collect();
            // This worker counts itself even before its first beat lands.
            ctx.workers.store(workers.max(1), Ordering::Relaxed);
            ctx.budget
                .observe(row.as_ref().map_or(0.0, |r| r.cost_usd), workers.max(1));
            if let Some(r) = &row {
                ctx.stats.seed(r);
            }
            obey(&ctx, &pause_tx, &mut seen, &controls, &*reporter);
        }
        if last_adoption.elapsed() >= ADOPT_POLL && !ctx.soft_stop.is_cancelled() {
            last_adoption = Instant::now();
            adopt_orphaned_batches(&ctx, &*reporter).await;
        }
        if last_renewal.elapsed().as_secs_f64() >= ctx.lease_secs / 3.0 {
            last_renewal = Instant::now();
            ctx.writer.post(WriteOp::Renew {
                session_id: ctx.session_id.clone(),
                worker_id: ctx.worker_id.clone(),
                lease_secs: ctx.lease_secs,
            });
        }
        let paused = *pause_tx.borrow();
        probes.tick(&ctx, paused).await;
        disk.tick(&ctx, &*reporter, paused);
        let mut live = gauges(&ctx, &mut window, paused);
        if let Some(why) = disk
            .slow_reason(&ctx)
            .or_else(|| probes.slow_reason(&ctx))
            .filter(|_| !paused)
        {
            live.slow_reason = why;
        }
        let mine = serde_json::to_string(&live).ok();
        // The session's gauges are every live worker's together, so a
        // console shows the session, whichever worker wrote last.
        let session = if others.is_empty() {
            mine.clone()
        } else {
            serde_json::to_string(&combine(&live, &others)).ok()
        };
        ctx.writer.post(WriteOp::Heartbeat {
            session_id: ctx.session_id.clone(),
            live_json: session,
            worker: Some(worker_beat(&ctx, live.rpm_used / 60.0, mine)),
        });
        note_rate_limiting(&ctx, &mut seen);
        ctx.retry_waits.flush(&ctx);
    }
}

/// The session's gauges from this worker's and the other live workers':
/// what is in flight, the limits (their shares add up to the session's)
/// and the rates add up; the stage, the reason it is slow and the elapsed
/// time are this worker's view.
fn combine(mine: &LiveGauges, others: &[LiveGauges]) -> LiveGauges {
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
    // Each worker's ETA is for the whole session at its own pace; together
    // they go faster than any one of them.
    all.eta_secs = None;
    all
}

/// Take over the provider batches that no live worker holds any more (their
/// worker died, stalled past its lease, or left): this worker polls and
/// ingests them, and the items waiting on their lines become claimable.
async fn adopt_orphaned_batches(ctx: &Ctx, reporter: &dyn Reporter) {
    for b in ctx.batchers() {
        match b.reattach().await {
            Ok(0) => {}
            Ok(n) => {
                reporter.line(&format!(
                    "Took over {n} provider batch(es) another worker had left: collecting their results."
                ));
                ctx.event(
                    "info",
                    "batches_adopted",
                    format!(
                        "worker {} took over {n} provider batch(es) of stage {} that no live worker held",
                        ctx.worker_id,
                        b.stage().name
                    ),
                );
            }
            Err(e) => tracing::warn!("adopting provider batches: {e}"),
        }
    }
}

/// A stop with provider batches open: a cancel (from the ledger, the
/// console or a confirmed Ctrl-C) cancels them and collects what they
/// finished; any other stop leaves them to the provider for a resume.
fn steer_batches(
    ctx: &Ctx,
    b: &Batcher,
    seen: &Seen,
    interrupts: &Interrupts,
    reporter: &dyn Reporter,
) {
    if b.is_cancelling() || b.detached().is_cancelled() {
        return;
    }
    let cancel_wanted = seen.cancelled_from_ledger || interrupts.cancel_batches.is_cancelled();
    if ctx.cause() == Some(StopCause::Cancelled) && cancel_wanted {
        if b.open_count() > 0 {
            reporter.line(&format!(
                "Cancelling {} provider batch(es): waiting for the provider to stop them, to collect what they finished (Ctrl-C again to leave them; a resume collects them).",
                b.open_count()
            ));
        }
        b.cancel_all();
    } else {
        b.detach();
    }
}

fn cancel(ctx: &Ctx, seen: &mut Seen, message: &str) {
    ctx.stop(StopCause::Cancelled);
    if !seen.cancel_reported {
        seen.cancel_reported = true;
        ctx.event("warn", "cancelled", message.to_string());
    }
}

/// Apply what the ledger asks: pause, resume, cancel, stop after a stage,
/// retune.
fn obey(
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
            let message = format!("retuned: {}", changes.join(", "));
            reporter.line(&format!("Retuned from the ledger: {}.", changes.join(", ")));
            ctx.event("info", "retuned", message);
        }
    }
}

/// One `rate_limited` event when the limiter starts backing off (a cut or a
/// cooldown), at most one per `RATE_EVENT_SPACING`.
fn note_rate_limiting(ctx: &Ctx, seen: &mut Seen) {
    let lim = ctx.rt(ctx.frontier()).limiter.snapshot();
    let limited = lim.slow_reason == SlowReason::Cooldown || lim.cuts > seen.last_cuts;
    seen.last_cuts = lim.cuts;
    let onset = limited && !seen.rate_limited;
    seen.rate_limited = limited;
    if onset
        && seen
            .last_rate_event
            .is_none_or(|t| t.elapsed() >= RATE_EVENT_SPACING)
    {
        seen.last_rate_event = Some(Instant::now());
        let s = ctx.stats.snapshot();
        ctx.event(
            "warn",
            "rate_limited",
            format!(
                "rate limited by the provider: backing off (concurrency limit {} of {}, {} refusals so far)",
                lim.concurrency_limit, lim.max_concurrency, s.rate_limited
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use docket_providers::limiter::{Limiter, LimiterSettings};

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
        assert_eq!(all.eta_secs, None);
        assert!(all.rpm_used <= all.rpm_limit as f64);
    }

    #[test]
    fn workers_split_every_limit_and_stay_under_it_together() {
        let s = LimiterSettings {
            requests_per_minute: 1_000,
            tokens_per_minute: 0,
            max_concurrency: 16,
        };
        assert_eq!(share(s, 1), s);
        let two = share(s, 2);
        assert_eq!(
            (
                two.requests_per_minute,
                two.tokens_per_minute,
                two.max_concurrency
            ),
            (500, 0, 8),
            "0 stays unlimited"
        );
        let three = share(s, 3);
        assert!(three.requests_per_minute * 3 <= 1_000 && three.max_concurrency * 3 <= 16);
        let many = share(s, 40);
        assert_eq!(
            (many.requests_per_minute, many.max_concurrency),
            (25, 1),
            "never below one"
        );
    }

    fn settings(conc: usize) -> LimiterSettings {
        LimiterSettings {
            requests_per_minute: 0,
            tokens_per_minute: 0,
            max_concurrency: conc,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn raising_concurrency_after_a_lower_retune_lets_it_climb_again() {
        let l = Arc::new(Limiter::new(settings(8)));
        l.retune(settings(2));
        assert_eq!(l.snapshot().concurrency_limit, 2);
        let a = l.acquire_slot().await;
        let _b = l.acquire_slot().await;
        let l2 = l.clone();
        let third = tokio::spawn(async move { l2.acquire_slot().await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!third.is_finished(), "held at the lowered limit");
        l.retune(settings(16));
        assert_eq!(l.snapshot().max_concurrency, 16);
        // Additive increase from where the lower retune left it.
        for _ in 0..3 {
            l.on_success(
                docket_providers::limiter::Reservation { tokens: 0 },
                None,
                &Default::default(),
            );
        }
        assert!(l.snapshot().concurrency_limit >= 3);
        let _c = tokio::time::timeout(Duration::from_secs(1), third)
            .await
            .expect("a third slot once the limit grew")
            .unwrap();
        for _ in 0..500 {
            l.on_success(
                docket_providers::limiter::Reservation { tokens: 0 },
                None,
                &Default::default(),
            );
        }
        assert_eq!(l.snapshot().concurrency_limit, 16, "climbs to the new max");
        drop(a);
    }

    #[test]
    fn rates_scale_a_short_window_and_keep_a_minute() {
        let t = Instant::now();
        let mut w = Window {
            started: t,
            first_done: 0,
            samples: VecDeque::new(),
        };
        assert_eq!(w.rates(t, 0, 0), (0.0, 0.0));
        // 10 requests and 1,000 tokens in 10 s: 60/min and 6,000/min.
        let (r, k) = w.rates(t + Duration::from_secs(10), 10, 1_000);
        assert!(
            (r - 60.0).abs() < 1e-9 && (k - 6_000.0).abs() < 1e-6,
            "{r} {k}"
        );
        // Past a minute, the oldest samples leave the window.
        for i in 1..=200u64 {
            w.rates(t + Duration::from_secs(10 + i), 10 + i, 1_000);
        }
        let (r, _) = w.rates(t + Duration::from_secs(211), 211, 1_000);
        assert!((r - 60.0).abs() < 1.5, "{r}");
        assert!(w.samples.len() <= 63, "{}", w.samples.len());
    }
}
