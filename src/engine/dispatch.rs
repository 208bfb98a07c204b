//! Dispatch: feed a session's unprocessed items to workers under the shared
//! limiter, obey pause / cancel from the ledger and from signals, and end the
//! session in a resumable state whatever stops it.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::budget::Budget;
use super::progress::{Reporter, spawn_progress};
use super::stats::Stats;
use super::{EngineError, Interrupts, Prepared, RunEnd};
use crate::ledger::store;
use crate::ledger::writer::{LedgerWriter, WriteOp};
use crate::limiter::{Limiter, LimiterSettings};
use crate::provider::ChatProvider;
use crate::retry::Backoff;

const PAGE: usize = 512;
const CONTROL_POLL: Duration = Duration::from_millis(400);

/// Why a run stopped before every item had an outcome.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum StopCause {
    Cancelled,
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
}

impl Ctx {
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

pub(super) async fn dispatch(
    p: Arc<Prepared>,
    session_id: String,
    provider: Box<dyn ChatProvider>,
    reporter: Arc<dyn Reporter>,
    interrupts: Interrupts,
    grace: Duration,
) -> Result<RunEnd, EngineError> {
    let (writer, writer_handle) = LedgerWriter::start(&p.ledger_path)?;
    let read = crate::ledger::open(&p.ledger_path)?;
    let row = store::load_session(&read, &session_id)?.ok_or_else(|| {
        EngineError::Ledger(format!("session {session_id} vanished from the ledger"))
    })?;
    let stats = Arc::new(Stats::default());
    stats.seed(&row);
    let limiter = Arc::new(Limiter::new(LimiterSettings {
        requests_per_minute: p.rpm,
        tokens_per_minute: p.tpm,
        max_concurrency: p.max_concurrency,
    }));
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
    });
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
        None => (
            "paused",
            Some("stopped with items left".to_string()),
            RunEnd::Paused("items left".into()),
        ),
        Some(StopCause::Cancelled) => (
            "cancelled",
            Some("cancelled".to_string()),
            RunEnd::Cancelled,
        ),
        Some(StopCause::Fatal(m)) => ("error", Some(m.clone()), RunEnd::Stopped(m)),
        Some(StopCause::Budget(m)) => ("paused", Some(m.clone()), RunEnd::Paused(m)),
        Some(StopCause::LedgerFailed(m)) => ("error", Some(m.clone()), RunEnd::Stopped(m)),
    };
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
    let outstanding = Arc::new(Semaphore::new((ctx.p.max_concurrency * 4).max(256)));
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
            let slot = tokio::select! {
                s = ctx.limiter.acquire_slot() => s,
                _ = ctx.soft_stop.cancelled() => break 'pages,
            };
            workers.spawn(async move {
                super::worker::process(&ctx2, item, Some(slot)).await;
                drop(permit);
            });
            while let Some(done) = workers.try_join_next() {
                note_crash(ctx, done);
            }
        }
    }
    while let Some(done) = workers.join_next().await {
        note_crash(ctx, done);
    }
    Ok(())
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

/// Watch the ledger's desired_state, the signals and the heartbeat.
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
    let mut hard_deadline: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = interrupts.stop.cancelled(), if !ctx.soft_stop.is_cancelled() => {
                reporter.line("^C Stopping gracefully... (in-flight requests may finish; Ctrl-C again to abandon them)");
                ctx.stop(StopCause::Cancelled);
            }
            _ = interrupts.abort.cancelled(), if !ctx.hard_stop.is_cancelled() => {
                ctx.stop(StopCause::Cancelled);
                ctx.hard_stop.cancel();
            }
        }
        if ctx.soft_stop.is_cancelled() && hard_deadline.is_none() {
            hard_deadline = Some(tokio::time::Instant::now() + grace);
        }
        if let Some(d) = hard_deadline
            && tokio::time::Instant::now() >= d
        {
            ctx.hard_stop.cancel();
        }
        ctx.writer.post(WriteOp::Heartbeat {
            session_id: ctx.session_id.clone(),
        });
        let desired = {
            let conn = conn.clone();
            let sid = ctx.session_id.clone();
            tokio::task::spawn_blocking(move || {
                let c = conn.lock().unwrap_or_else(|p| p.into_inner());
                store::desired_state(&c, &sid)
            })
            .await
        };
        let Ok(Ok(Some(desired))) = desired else {
            continue;
        };
        let paused = *pause_tx.borrow();
        match desired.as_str() {
            "paused" if !paused => {
                pause_tx.send_replace(true);
                reporter.line("Paused from the ledger: no new requests; in-flight ones finish. Resume with `docket resume SESSION`.");
                ctx.writer.post(WriteOp::SessionState {
                    session_id: ctx.session_id.clone(),
                    state: "paused",
                    stop_reason: Some("paused by operator".into()),
                    completed: false,
                    released: false,
                });
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
            }
            "cancelled" if !ctx.soft_stop.is_cancelled() => {
                reporter.line("Cancelled from the ledger: stopping.");
                ctx.stop(StopCause::Cancelled);
            }
            _ => {}
        }
    }
}
