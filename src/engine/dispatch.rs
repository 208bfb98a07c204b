//! Dispatch: feed a session's unprocessed items to workers under the shared
//! limiter, obey pause / cancel from the ledger and from signals, and end the
//! session in a resumable state whatever stops it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::batching::{self, Batcher};
use super::budget::Budget;
use super::progress::{Reporter, spawn_progress};
use super::stats::Stats;
use super::{EngineError, Interrupts, Prepared, RunEnd};
use crate::ledger::store;
use crate::ledger::writer::{LedgerWriter, WriteOp};
use crate::limiter::{Limiter, LimiterSettings, SlowReason};
use crate::provider::ChatProvider;
use crate::retry::Backoff;
use crate::watch::{LiveGauges, Tune};

const PAGE: usize = 512;
const CONTROL_POLL: Duration = Duration::from_millis(400);
/// The window of the gauges' requests/min and tokens/min.
const RATE_WINDOW: Duration = Duration::from_secs(60);
/// At most one `rate_limited` event this often.
const RATE_EVENT_SPACING: Duration = Duration::from_secs(10);
const PAUSED_BY_OPERATOR: &str = "paused by operator";

/// Why a run stopped before every item had an outcome.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum StopCause {
    Cancelled,
    /// The operator paused the run and the process lets go of it.
    Paused(String),
    Fatal(String),
    Budget(String),
    LedgerFailed(String),
}

pub(super) struct Ctx {
    pub(super) p: Arc<Prepared>,
    pub(super) session_id: String,
    pub(super) provider: Box<dyn ChatProvider>,
    pub(super) limiter: Arc<Limiter>,
    pub(super) writer: LedgerWriter,
    pub(super) stats: Arc<Stats>,
    pub(super) budget: Budget,
    pub(super) backoff: Backoff,
    /// No new attempts (stop, cancel, budget, fatal error).
    pub(super) soft_stop: CancellationToken,
    /// Abandon requests in flight.
    pub(super) hard_stop: CancellationToken,
    pub(super) paused: watch::Receiver<bool>,
    pub(super) cause: std::sync::Mutex<Option<StopCause>>,
    /// Bounds the worker tasks alive at once; grows when concurrency is
    /// retuned upward.
    outstanding: Arc<Semaphore>,
    outstanding_cap: AtomicUsize,
    /// Batch mode (or open batches of an earlier run to collect).
    batcher: std::sync::OnceLock<Arc<Batcher>>,
}

impl Ctx {
    pub(super) fn batcher(&self) -> Option<&Arc<Batcher>> {
        self.batcher.get()
    }

    pub(super) fn stop(&self, cause: StopCause) {
        let mut c = self.cause.lock().unwrap_or_else(|p| p.into_inner());
        // The first cause wins: a cancel after a fatal error is still fatal.
        if c.is_none() {
            *c = Some(cause);
        }
        drop(c);
        self.soft_stop.cancel();
    }

    pub(super) fn cause(&self) -> Option<StopCause> {
        self.cause.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Wait while paused; false if a stop came meanwhile.
    pub(super) async fn wait_unpaused(&self) -> bool {
        let mut rx = self.paused.clone();
        loop {
            if self.soft_stop.is_cancelled() {
                return false;
            }
            if !*rx.borrow_and_update() {
                return true;
            }
            tokio::select! {
                r = rx.changed() => if r.is_err() { return !self.soft_stop.is_cancelled() },
                _ = self.soft_stop.cancelled() => return false,
            }
        }
    }

    /// Record a session event without waiting for it.
    pub(super) fn event(&self, level: &'static str, kind: &'static str, message: String) {
        self.writer.post(WriteOp::Event {
            session_id: self.session_id.clone(),
            level,
            kind,
            message,
        });
    }

    /// Let enough worker tasks be alive for `concurrency` requests in flight
    /// (in flight plus waiting to retry). Never shrinks: it is only a bound
    /// on memory, and a lower concurrency is enforced by the limiter.
    fn make_room_for(&self, concurrency: usize) {
        let want = outstanding_for(concurrency);
        let had = self.outstanding_cap.fetch_max(want, Ordering::Relaxed);
        if want > had {
            self.outstanding.add_permits(want - had);
        }
    }

    pub(super) async fn write(&self, op: WriteOp) -> bool {
        match self.writer.write(op).await {
            Ok(()) => true,
            Err(e) => {
                self.stop(StopCause::LedgerFailed(e));
                false
            }
        }
    }
}

/// Worker tasks alive at once for a concurrency: a long 429 storm must not
/// pile the whole session up in memory.
fn outstanding_for(concurrency: usize) -> usize {
    (concurrency.saturating_mul(4)).max(256)
}

/// The limiter's settings under an operator's retune (None: the config's).
fn tuned_settings(p: &Prepared, tune: &Tune) -> LimiterSettings {
    LimiterSettings {
        requests_per_minute: tune.rpm.unwrap_or(p.rpm),
        tokens_per_minute: tune.tpm.unwrap_or(p.tpm),
        max_concurrency: tune
            .concurrency
            .map(|c| c.min(usize::MAX as u64) as usize)
            .unwrap_or(p.max_concurrency)
            .clamp(1, 10_000),
    }
}

fn per_minute(n: u64) -> String {
    if n == 0 {
        "unlimited".into()
    } else {
        n.to_string()
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn dispatch(
    p: Arc<Prepared>,
    session_id: String,
    provider: Box<dyn ChatProvider>,
    reporter: Arc<dyn Reporter>,
    interrupts: Interrupts,
    grace: Duration,
    resumed: bool,
    batch_adapter: Option<Arc<dyn crate::provider::batch::BatchProvider>>,
) -> Result<RunEnd, EngineError> {
    let (writer, writer_handle) = LedgerWriter::start(&p.ledger_path)?;
    let read = crate::ledger::open(&p.ledger_path)?;
    let row = store::load_session(&read, &session_id)?.ok_or_else(|| {
        EngineError::Ledger(format!("session {session_id} vanished from the ledger"))
    })?;
    let stats = Arc::new(Stats::default());
    stats.seed(&row);
    let limiter = Arc::new(Limiter::new(tuned_settings(&p, &Tune::default())));
    let (pause_tx, pause_rx) = watch::channel(false);
    let ctx = Arc::new(Ctx {
        budget: Budget::new(row.max_cost_usd, row.cost_usd),
        p: p.clone(),
        session_id: session_id.clone(),
        provider,
        limiter: limiter.clone(),
        writer: writer.clone(),
        stats: stats.clone(),
        backoff: Backoff::default(),
        soft_stop: CancellationToken::new(),
        hard_stop: CancellationToken::new(),
        paused: pause_rx,
        cause: std::sync::Mutex::new(None),
        outstanding: Arc::new(Semaphore::new(outstanding_for(p.max_concurrency))),
        outstanding_cap: AtomicUsize::new(outstanding_for(p.max_concurrency)),
        batcher: std::sync::OnceLock::new(),
    });
    let batches_before = (
        crate::ledger::batches::open_batch_count(&read, &session_id)?,
        crate::ledger::batches::batch_count(&read, &session_id)?,
    );
    start_batching(&ctx, batches_before, batch_adapter, &reporter).await?;
    ctx.event(
        "info",
        "started",
        format!(
            "{} with {} ({}): requests/min {}, tokens/min {}, concurrency {}",
            if resumed { "resumed" } else { "started" },
            p.model,
            p.provider_name,
            per_minute(p.rpm),
            per_minute(p.tpm),
            p.max_concurrency
        ),
    );
    let progress = spawn_progress(
        stats.clone(),
        limiter.clone(),
        reporter.clone(),
        ctx.paused.clone(),
        row.estimated_cost_usd,
    );
    let control = tokio::spawn(control_loop(
        ctx.clone(),
        pause_tx,
        interrupts,
        grace,
        reporter.clone(),
    ));

    tracing::info!(session = %session_id, model = %p.model, "dispatch started");
    let read = Arc::new(std::sync::Mutex::new(read));
    let feed_result = feed(&ctx, &read).await;
    if let Err(e) = &feed_result {
        ctx.stop(StopCause::LedgerFailed(e.to_string()));
    }
    control.abort();
    let left_at_provider = end_batching(&ctx, &read, &*reporter).await;
    progress.abort();
    let _ = progress.await;

    let cause = ctx.cause();
    let remaining = tokio::task::block_in_place(|| {
        let conn = read.lock().unwrap_or_else(|p| p.into_inner());
        store::next_work(&conn, &session_id, -1, 1).map(|w| w.len())
    })?;
    let (state, reason, end) = match cause {
        // Every item has its outcome: a stop that came after the last one
        // changes nothing.
        _ if remaining == 0 => ("completed", None, RunEnd::Completed),
        None => {
            let why = match ctx.batcher().map(|b| b.held_count()) {
                Some(held) if held > 0 => format!(
                    "{held} request(s) wait on a provider batch that could not be told apart from others (see the session's events); resume once it is sorted out"
                ),
                _ => "stopped with items left".to_string(),
            };
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
        Some(StopCause::LedgerFailed(m)) => ("error", Some(m.clone()), RunEnd::Stopped(m)),
    };
    let s = stats.snapshot();
    let level = match state {
        "error" => "error",
        "completed" => "info",
        _ => "warn",
    };
    // Posted just before the final state, so both land in one flush.
    ctx.event(
        level,
        "ended",
        format!(
            "session ended {state}: {} ({} of {} items processed){}",
            reason.as_deref().unwrap_or("every item has an outcome"),
            s.done,
            s.total,
            if left_at_provider > 0 {
                format!("; {left_at_provider} provider batch(es) still open at the provider")
            } else {
                String::new()
            }
        ),
    );
    let _ = writer
        .write(WriteOp::SessionState {
            session_id: session_id.clone(),
            state,
            stop_reason: reason,
            completed: state == "completed",
            released: true,
        })
        .await;
    tracing::info!(session = %session_id, state, "dispatch ended");
    drop(ctx);
    drop(writer);
    tokio::task::block_in_place(|| writer_handle.join());
    Ok(end)
}

/// Page through unprocessed items and hand each to a worker.
async fn feed(
    ctx: &Arc<Ctx>,
    read: &Arc<std::sync::Mutex<rusqlite::Connection>>,
) -> Result<(), EngineError> {
    // Bound the tasks alive at once (in flight plus waiting to retry) so a
    // long 429 storm cannot pile up the whole session in memory.
    let outstanding = ctx.outstanding.clone();
    let mut workers = JoinSet::new();
    let mut after = -1i64;
    'pages: loop {
        if ctx.soft_stop.is_cancelled() {
            break;
        }
        let page = {
            let read = read.clone();
            let sid = ctx.session_id.clone();
            tokio::task::spawn_blocking(move || {
                let conn = read.lock().unwrap_or_else(|p| p.into_inner());
                store::next_work(&conn, &sid, after, PAGE)
            })
            .await
            .map_err(|e| EngineError::Ledger(e.to_string()))??
        };
        if page.is_empty() {
            break;
        }
        for item in page {
            after = item.position;
            if !ctx.wait_unpaused().await {
                break 'pages;
            }
            let permit = tokio::select! {
                p = outstanding.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break 'pages },
                _ = ctx.soft_stop.cancelled() => break 'pages,
            };
            let ctx2 = ctx.clone();
            if item.status == "completed" {
                workers.spawn(async move {
                    super::worker::reuse_answer(&ctx2, item).await;
                    drop(permit);
                });
                continue;
            }
            // A request that goes to a batch (or waits on one of an earlier
            // run) takes no synchronous slot.
            let batched = ctx.batcher().is_some_and(|b| {
                b.takes_new()
                    || b.is_reattached(&format!(
                        "{}-{}-{}",
                        ctx.session_id, item.request_id, item.attempt
                    ))
            });
            let slot = if batched {
                None
            } else {
                tokio::select! {
                    s = ctx.limiter.acquire_slot() => Some(s),
                    _ = ctx.soft_stop.cancelled() => break 'pages,
                }
            };
            workers.spawn(async move {
                super::worker::process(&ctx2, item, slot).await;
                drop(permit);
            });
            while let Some(done) = workers.try_join_next() {
                note_crash(ctx, done);
            }
        }
    }
    if let Some(b) = ctx.batcher() {
        b.feed_done();
    }
    while let Some(done) = workers.join_next().await {
        note_crash(ctx, done);
    }
    Ok(())
}

/// Set up batch mode: the batcher, with the open batches of an earlier run
/// re-attached. Without a Batch API (Ollama, OpenRouter) `batch`/`auto`
/// send synchronously (simulated batching), and the run says so.
async fn start_batching(
    ctx: &Arc<Ctx>,
    (open, so_far): (u64, u64),
    adapter: Option<Arc<dyn crate::provider::batch::BatchProvider>>,
    reporter: &Arc<dyn Reporter>,
) -> Result<(), EngineError> {
    let p = &ctx.p;
    let mode = p.batch.mode;
    let Some(adapter) = adapter else {
        if mode != crate::config::BatchMode::Sync {
            let note = format!(
                "{} (kind {}) has no Batch API here: mode = \"{}\" sends each request synchronously under the rate limits (simulated batching), at the synchronous price",
                p.provider_name,
                p.provider_kind.as_str(),
                mode.as_str()
            );
            reporter.line(&format!("Note: {note}."));
            ctx.event("info", "simulated_batching", note);
        }
        return Ok(());
    };
    if mode == crate::config::BatchMode::Sync && open == 0 {
        return Ok(());
    }
    let settings = batching::settings_for(p, &*adapter);
    let weak = Arc::downgrade(ctx);
    let b = Batcher::new(
        settings,
        adapter,
        ctx.writer.clone(),
        ctx.session_id.clone(),
        p.clone(),
        ctx.stats.clone(),
        reporter.clone(),
        so_far,
        Box::new(move |e| {
            if let Some(ctx) = weak.upgrade() {
                ctx.stop(StopCause::LedgerFailed(e));
            }
        }),
        ctx.paused.clone(),
    );
    let _ = ctx.batcher.set(b.clone());
    if b.takes_new() {
        // Tasks wait on whole batches: let enough of them be alive to fill
        // the open batches (each holds its rendered prompt only).
        let want = (settings.max_requests.saturating_mul(settings.max_open))
            .saturating_add(1024)
            .min(2_000_000);
        let had = ctx.outstanding_cap.fetch_max(want, Ordering::Relaxed);
        if want > had {
            ctx.outstanding.add_permits(want - had);
        }
        ctx.event(
            "info",
            "batch_mode",
            format!(
                "{} mode: requests go to the {} Batch API at {:.0}% of the synchronous price; a batch is cut at {} requests, {} bytes or {:.0} s{}",
                mode.as_str(),
                b.adapter.name(),
                b.price_factor() * 100.0,
                settings.max_requests,
                settings.max_bytes,
                settings.max_wait.as_secs_f64(),
                if mode == crate::config::BatchMode::Auto {
                    format!(" (fewer than {} go synchronously)", settings.min_batch_size)
                } else {
                    String::new()
                }
            ),
        );
    }
    if open > 0 {
        let n = b.reattach().await.map_err(EngineError::Ledger)?;
        if n > 0 {
            reporter.line(&format!(
                "{n} provider batch(es) of this session are still open: collecting their results (nothing is sent twice)."
            ));
        }
    }
    Ok(())
}

/// After the feed: mark delivered batches finished with, stop the batcher,
/// and say what is still open at the provider. Returns that count.
async fn end_batching(
    ctx: &Arc<Ctx>,
    read: &Arc<std::sync::Mutex<rusqlite::Connection>>,
    reporter: &dyn Reporter,
) -> u64 {
    let Some(b) = ctx.batcher() else {
        return 0;
    };
    b.shutdown();
    let open = {
        let conn = read.lock().unwrap_or_else(|p| p.into_inner());
        crate::ledger::batches::open_batches(&conn, &ctx.session_id).unwrap_or_default()
    };
    for o in &open {
        let _ = ctx
            .writer
            .write(WriteOp::Batch(crate::ledger::batches::BatchOp::Settle {
                tag: o.tag.clone(),
            }))
            .await;
    }
    let left = {
        let conn = read.lock().unwrap_or_else(|p| p.into_inner());
        crate::ledger::batches::open_batches(&conn, &ctx.session_id).unwrap_or_default()
    };
    let at_provider = left
        .iter()
        .filter(|o| {
            !matches!(
                o.state.as_str(),
                "completed" | "failed" | "expired" | "cancelled"
            )
        })
        .count() as u64;
    if !left.is_empty() {
        let message = format!(
            "{} provider batch(es) of this session are not finished with{}. The provider keeps working on {} (and bills for {}). \
             Resume with `docket batch-adjudicate --resume {}` to collect the results; to stop them, resume and cancel (`c` in the console, or `docket cancel {}` while it runs)",
            left.len(),
            if at_provider > 0 {
                format!(" ({at_provider} still running at the provider)")
            } else {
                String::new()
            },
            if left.len() == 1 { "it" } else { "them" },
            if left.len() == 1 { "it" } else { "them" },
            ctx.session_id,
            ctx.session_id
        );
        reporter.line(&format!("{message}."));
        ctx.event("warn", "batches_left_open", message);
    }
    left.len() as u64
}

/// A worker that panicked left its item without an outcome: stop the session
/// (resumable) rather than report it complete or lose the item silently.
fn note_crash(ctx: &Ctx, done: Result<(), tokio::task::JoinError>) {
    if let Err(e) = done
        && e.is_panic()
    {
        tracing::error!("a worker crashed: {e}");
        ctx.stop(StopCause::LedgerFailed(format!(
            "internal error: a worker crashed ({e}); the session is resumable"
        )));
    }
}

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
    let lim = ctx.limiter.snapshot();
    let (rpm_used, tpm_used) = window.rates(now, s.sent, s.input_tokens + s.output_tokens);
    let elapsed = now.duration_since(window.started).as_secs_f64();
    let done_here = s.done.saturating_sub(window.first_done);
    let eta_secs = (!paused && done_here > 0 && s.total > s.done)
        .then(|| elapsed / done_here as f64 * (s.total - s.done) as f64);
    let slow_reason = if paused {
        PAUSED_BY_OPERATOR.to_string()
    } else if let Some(b) = ctx
        .batcher()
        .filter(|b| b.is_cancelling() && b.open_count() > 0)
    {
        format!(
            "cancelling {} provider batch(es): collecting what they finished",
            b.open_count()
        )
    } else if ctx.soft_stop.is_cancelled() {
        "stopping: requests in flight are finishing".to_string()
    } else if let Some(b) = ctx.batcher().filter(|b| b.open_count() > 0) {
        format!(
            "waiting on {} provider batch(es): results come when the provider finishes them",
            b.open_count()
        )
    } else {
        lim.slow_reason.describe().to_string()
    };
    LiveGauges {
        in_flight: lim.in_flight as u64,
        concurrency_limit: lim.concurrency_limit as u64,
        max_concurrency: lim.max_concurrency as u64,
        rpm_limit: lim.requests_per_minute,
        tpm_limit: lim.tokens_per_minute,
        rpm_used,
        tpm_used,
        slow_reason,
        paused,
        stage: ctx.p.stage.clone(),
        elapsed_secs: elapsed,
        eta_secs,
    }
}

/// Watch the run controls in the ledger (desired_state, stop after a stage,
/// retune), the signals and the heartbeat with the live gauges.
async fn control_loop(
    ctx: Arc<Ctx>,
    pause_tx: watch::Sender<bool>,
    interrupts: Interrupts,
    grace: Duration,
    reporter: Arc<dyn Reporter>,
) {
    let conn = match crate::ledger::open_read_only(&ctx.p.ledger_path) {
        Ok(c) => Arc::new(std::sync::Mutex::new(c)),
        Err(_) => return,
    };
    let mut tick = tokio::time::interval(CONTROL_POLL);
    let mut hard_deadline: Option<Instant> = None;
    let mut seen = Seen::default();
    let mut window = Window::new(&ctx.stats.snapshot());
    loop {
        tokio::select! {
            _ = tick.tick() => {}
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
                if let Some(b) = ctx.batcher() {
                    b.detach();
                }
            }
        }
        if let Some(b) = ctx.batcher()
            && ctx.soft_stop.is_cancelled()
        {
            steer_batches(&ctx, b, &seen, &interrupts, &*reporter);
        }
        if ctx.soft_stop.is_cancelled() && hard_deadline.is_none() {
            hard_deadline = Some(Instant::now() + grace);
        }
        if let Some(d) = hard_deadline
            && Instant::now() >= d
        {
            ctx.hard_stop.cancel();
        }
        let controls = {
            let conn = conn.clone();
            let sid = ctx.session_id.clone();
            tokio::task::spawn_blocking(move || {
                let c = conn.lock().unwrap_or_else(|p| p.into_inner());
                store::session_controls(&c, &sid)
            })
            .await
        };
        if let Ok(Ok(Some(controls))) = controls {
            obey(&ctx, &pause_tx, &mut seen, &controls, &*reporter);
        }
        let paused = *pause_tx.borrow();
        let live = gauges(&ctx, &mut window, paused);
        ctx.writer.post(WriteOp::Heartbeat {
            session_id: ctx.session_id.clone(),
            live_json: serde_json::to_string(&live).ok(),
        });
        note_rate_limiting(&ctx, &mut seen);
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
            // One stage per job for now: whichever is named, the session
            // ends when this one finishes, which it does anyway.
            let message = if *stage == ctx.p.stage {
                format!("stage {stage} is the last stage; the session ends when it finishes")
            } else {
                format!(
                    "stop after stage {stage}: this job has one stage, {}, so it is the last stage; the session ends when it finishes",
                    ctx.p.stage
                )
            };
            reporter.line(&format!("Stop after stage requested: {message}."));
            ctx.event("info", "stop_at_stage", message);
        }
        None => seen.stop_after_stage = None,
        Some(_) => {}
    }
    if controls.tune != seen.tune {
        let before = tuned_settings(&ctx.p, &seen.tune);
        let after = tuned_settings(&ctx.p, &controls.tune);
        seen.tune = controls.tune;
        if before != after {
            ctx.limiter.retune(after);
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
    let lim = ctx.limiter.snapshot();
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
                crate::limiter::Reservation { tokens: 0 },
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
                crate::limiter::Reservation { tokens: 0 },
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
