//! The control loop of a worker: it obeys the run controls in the ledger
//! (pause, resume, cancel, stop after a stage, retune) and the signals,
//! splits the provider's limits with the other live workers, renews this
//! worker's leases, adopts provider batches no live worker holds, and
//! writes the heartbeat with the live gauges.

mod eta;
mod gauges;
mod obey;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::Interrupts;
use super::batching::Batcher;
use super::ctx::{Ctx, PAUSED_BY_OPERATOR, StopCause, worker_beat};
use super::progress::Reporter;
use super::reach_probe::ReachProbes;
use docket_ledger::console::ConsoleReads;
use docket_ledger::watch::{LiveGauges, Tune};
use docket_ledger::work::{RunSessions, WorkQueue};
use docket_ledger::writer::WriteOp;
use docket_ledger::{Ledger, LedgerError};
use docket_providers::limiter::SlowReason;
use gauges::{Window, combine, gauges};
use obey::obey;

const CONTROL_POLL: Duration = Duration::from_millis(400);

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

/// Watch the run controls in the ledger (desired_state, stop after a stage,
/// retune), the signals and the heartbeat with the live gauges.
pub(super) async fn control_loop(
    ctx: Arc<Ctx>,
    pause_tx: watch::Sender<bool>,
    interrupts: Interrupts,
    grace: Duration,
    reporter: Arc<dyn Reporter>,
) {
    let Some(ledger) = open_controls(&ctx) else {
        return;
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
    let mut c = Controller {
        seen: Seen {
            workers: ctx.workers.load(Ordering::Relaxed),
            ..Seen::default()
        },
        window: Window::new(),
        pace: eta::Pace::default(),
        remaining: None,
        hard_deadline: None,
        last_renewal: Instant::now(),
        last_adoption: Instant::now(),
        probes: ReachProbes::new(ctx.p.stages.len()),
        disk: super::disk_guard::DiskGuard::new(&ctx.p.ledger),
        ctx,
        ledger,
        pause_tx,
        reporter,
    };
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = woken.notified() => {}
            _ = interrupts.stop.cancelled(), if !c.ctx.soft_stop.is_cancelled() => c.on_stop_signal(),
            _ = interrupts.pause.cancelled(), if !c.ctx.soft_stop.is_cancelled() => c.on_pause_signal(),
            _ = interrupts.abort.cancelled(), if !c.ctx.hard_stop.is_cancelled() => c.on_abort_signal(),
        }
        c.enforce_stop(&interrupts, grace);
        let others = c.read_controls().await;
        c.keep_up().await;
        c.beat(&others).await;
        note_rate_limiting(&c.ctx, &mut c.seen);
        c.ctx.retry_waits.flush(&c.ctx);
    }
}

/// A read-only ledger to watch the run controls through. Without it nothing
/// obeys the ledger or writes a heartbeat: the run stops (resumably)
/// rather than run blind.
fn open_controls(ctx: &Ctx) -> Option<Arc<std::sync::Mutex<Ledger>>> {
    match Ledger::open_read_only(&ctx.p.ledger) {
        Ok(l) => Some(Arc::new(std::sync::Mutex::new(l))),
        Err(e) => {
            ctx.stop(StopCause::LedgerFailed(format!(
                "cannot watch the ledger's run controls: {e}"
            )));
            for b in ctx.batchers() {
                b.detach();
            }
            None
        }
    }
}

/// The control loop's state between ticks.
struct Controller {
    ctx: Arc<Ctx>,
    ledger: Arc<std::sync::Mutex<Ledger>>,
    pause_tx: watch::Sender<bool>,
    reporter: Arc<dyn Reporter>,
    seen: Seen,
    window: Window,
    /// The session's stage answers over time, for the ETA.
    pace: eta::Pace,
    /// Requests every stage still has to answer, as last read.
    remaining: Option<u64>,
    /// When in-flight requests are abandoned, once a stop came.
    hard_deadline: Option<Instant>,
    last_renewal: Instant,
    last_adoption: Instant,
    probes: ReachProbes,
    disk: super::disk_guard::DiskGuard,
}

impl Controller {
    fn on_stop_signal(&mut self) {
        self.reporter.line(
            "Stopping gracefully... (in-flight requests may finish; Ctrl-C again to abandon them)",
        );
        cancel(
            &self.ctx,
            &mut self.seen,
            "cancelled by a signal: in-flight requests may finish within the grace",
        );
    }

    fn on_pause_signal(&mut self) {
        let ctx = &self.ctx;
        self.reporter.line(
            "Pausing: no new requests; in-flight ones finish, then the session is saved paused.",
        );
        ctx.stop(StopCause::Paused(PAUSED_BY_OPERATOR.into()));
        ctx.event(
            "warn",
            "paused",
            "paused by operator: in-flight requests finish, then this process lets go of the session (resume with --resume)".into(),
        );
    }

    fn on_abort_signal(&mut self) {
        let ctx = &self.ctx;
        cancel(
            ctx,
            &mut self.seen,
            "cancelled: requests in flight abandoned",
        );
        ctx.hard_stop.cancel();
        ctx.writer.health().give_up();
        for b in ctx.batchers() {
            b.detach();
        }
    }

    /// Once stopping: steer the provider batches, and past the grace
    /// abandon what is still in flight.
    fn enforce_stop(&mut self, interrupts: &Interrupts, grace: Duration) {
        let ctx = &self.ctx;
        if ctx.soft_stop.is_cancelled() {
            for b in ctx.batchers() {
                steer_batches(ctx, b, &self.seen, interrupts, &*self.reporter);
            }
        }
        if ctx.soft_stop.is_cancelled() && self.hard_deadline.is_none() {
            self.hard_deadline = Some(Instant::now() + grace);
        }
        if let Some(d) = self.hard_deadline
            && Instant::now() >= d
        {
            ctx.hard_stop.cancel();
            // Writes held for a full disk fail now: the run is abandoned.
            ctx.writer.health().give_up();
        }
    }

    /// Read the run controls and the other live workers, and obey. The
    /// other workers' gauges, for the session's.
    async fn read_controls(&mut self) -> Vec<LiveGauges> {
        let ctx = &self.ctx;
        let controls = {
            let ledger = self.ledger.clone();
            let sid = ctx.session_id.clone();
            let me = ctx.worker_id.clone();
            tokio::task::spawn_blocking(move || {
                let l = ledger.lock().unwrap_or_else(|p| p.into_inner());
                let controls = l.session_controls(&sid)?;
                let workers = l.live_workers(&sid)?;
                let stages = l.run_stages(&sid)?;
                // With others on the session, its counters and spend are
                // theirs too: read them back for the progress and budget.
                let (row, others) = if workers > 1 {
                    (l.load_session(&sid)?, l.others_gauges(&sid, &me)?)
                } else {
                    (None, Vec::new())
                };
                Ok::<_, LedgerError>((controls, workers, row, others, stages))
            })
            .await
        };
        let mut others: Vec<LiveGauges> = Vec::new();
        if let Ok(Ok((Some(controls), workers, row, other_json, stages))) = controls {
            self.pace.observe(Instant::now(), eta::answered(&stages));
            self.remaining = Some(eta::remaining_requests(&stages));
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
            obey(
                ctx,
                &self.pause_tx,
                &mut self.seen,
                &controls,
                &*self.reporter,
            );
        }
        others
    }

    /// The session's ETA now: none while paused or stopping.
    fn eta(&self, paused: bool) -> Option<f64> {
        let ctx = &self.ctx;
        if paused || ctx.soft_stop.is_cancelled() {
            return None;
        }
        let frontier = ctx.frontier();
        let rt = ctx.rt(frontier);
        // Batch lines pass no requests/min limit.
        let limit = rt.batcher.get().is_none().then(|| {
            let lim = rt.limiter.snapshot();
            // This worker's share, times the workers sharing the limit.
            lim.requests_per_minute as f64 * ctx.workers.load(Ordering::Relaxed).max(1) as f64
                / 60.0
        });
        eta::eta_secs(self.remaining?, self.pace.per_sec(), limit)
    }

    /// Adopt the batches no live worker holds, and renew this worker's
    /// leases, each at its own pace.
    async fn keep_up(&mut self) {
        let ctx = &self.ctx;
        if self.last_adoption.elapsed() >= ADOPT_POLL && !ctx.soft_stop.is_cancelled() {
            self.last_adoption = Instant::now();
            adopt_orphaned_batches(ctx, &*self.reporter).await;
        }
        if self.last_renewal.elapsed().as_secs_f64() >= ctx.lease_secs / 3.0 {
            self.last_renewal = Instant::now();
            ctx.writer.post(WriteOp::Renew {
                session_id: ctx.session_id.clone(),
                worker_id: ctx.worker_id.clone(),
                lease_secs: ctx.lease_secs,
            });
        }
    }

    /// The probes and the disk guard ticked, then the heartbeat with this
    /// worker's gauges and the session's.
    async fn beat(&mut self, others: &[LiveGauges]) {
        let ctx = &self.ctx;
        let paused = *self.pause_tx.borrow();
        self.probes.tick(ctx, paused).await;
        self.disk.tick(ctx, &*self.reporter, paused);
        let mut live = gauges(ctx, &self.window, paused);
        live.eta_secs = self.eta(paused);
        ctx.stats.set_eta(live.eta_secs);
        if let Some(why) = self
            .disk
            .slow_reason(ctx)
            .or_else(|| self.probes.slow_reason(ctx))
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
            serde_json::to_string(&combine(&live, others)).ok()
        };
        ctx.writer.post(WriteOp::Heartbeat {
            session_id: ctx.session_id.clone(),
            live_json: session,
            worker: Some(worker_beat(ctx, live.rpm_used / 60.0, mine)),
        });
    }
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
mod tests;
