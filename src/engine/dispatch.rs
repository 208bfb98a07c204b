//! Dispatch: feed a session's unprocessed items to workers under the shared
//! limiter, obey pause / cancel from the ledger and from signals, and end the
//! session in a resumable state whatever stops it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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
use crate::ledger::queue::{self, ClaimScope};
use crate::ledger::store::{self, WorkItem};
use crate::ledger::writer::{Fence, LedgerWriter, WriteError, WriteOp};
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
/// How often a worker looks for provider batches no live worker holds.
const ADOPT_POLL: Duration = Duration::from_secs(2);
/// How often a worker with nothing left to claim looks again while other
/// workers still hold items (to take over any whose lease runs out).
const TAKEOVER_POLL: Duration = Duration::from_secs(1);
/// A lease outlasts the longest request deadline by this much, so a worker
/// that is merely slow is never taken over.
const LEASE_MARGIN_SECS: f64 = 30.0;

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

/// A stage's runtime: its provider's client and limiter (shared by the
/// stages on one provider) and, in batch mode, its batcher.
pub(super) struct StageRt {
    pub(super) provider: Arc<dyn ChatProvider>,
    pub(super) limiter: Arc<Limiter>,
    batcher: std::sync::OnceLock<Arc<Batcher>>,
}

pub(super) struct Ctx {
    pub(super) p: Arc<Prepared>,
    pub(super) session_id: String,
    /// One per stage, in job order.
    stages: Vec<StageRt>,
    /// Every distinct limiter (one per provider), for retunes and gauges.
    limiters: Vec<(String, Arc<Limiter>)>,
    /// Stop after this stage (index): later stages start for no item.
    stop_after: std::sync::Mutex<Option<usize>>,
    /// Requests under way per stage, and the stage last started.
    busy: Vec<AtomicUsize>,
    last_frontier: AtomicUsize,
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
    /// This process as a worker of the session (`user@host:pid#random`).
    pub(super) worker_id: Arc<str>,
    /// How long a claim lasts without renewal.
    lease_secs: f64,
    /// Items this worker holds now (claimed, no outcome yet).
    claims: AtomicU64,
    /// Workers of the session, this one included: the provider's limits
    /// are split between them.
    workers: AtomicU64,
    /// The stop came from the ledger (an operator's cancel), so every
    /// worker of the session stops with it.
    stop_from_ledger: AtomicBool,
    /// Writes refused because another worker took the item over.
    pub(super) orphaned: AtomicU64,
    /// A task ended: the feed may claim more.
    claim_room: tokio::sync::Notify,
}

impl Ctx {
    /// How many items this worker may hold claimed ahead of its work. In
    /// batch mode every line waiting in a batch being formed or at the
    /// provider is a claimed item, so as many as the open batches take;
    /// synchronously a few times what it may have in flight, so the other
    /// workers find the rest of the session free.
    fn claim_ahead(&self) -> usize {
        if self.batchers().any(|b| b.takes_new()) {
            return self.outstanding_cap.load(Ordering::Relaxed);
        }
        let concurrency = self
            .limiters
            .iter()
            .map(|(_, l)| l.snapshot().max_concurrency)
            .max()
            .unwrap_or(1);
        concurrency.saturating_mul(4).clamp(64, PAGE)
    }

    /// Wait until every write posted so far has committed (the writer
    /// applies them in order; a lease renewal is the harmless last one).
    async fn flush(&self) {
        let _ = self
            .writer
            .write(WriteOp::Renew {
                session_id: self.session_id.clone(),
                worker_id: self.worker_id.clone(),
                lease_secs: self.lease_secs,
            })
            .await;
    }

    /// The claim this worker holds `item` under.
    pub(super) fn fence(&self, item: &WorkItem) -> Fence {
        Fence::Item {
            session_id: self.session_id.clone(),
            item_id: item.item_id.clone(),
            token: item.claim_token,
            worker_id: self.worker_id.clone(),
        }
    }

    pub(super) fn rt(&self, stage: usize) -> &StageRt {
        &self.stages[stage]
    }

    /// Stage `stage`'s batcher: batch mode, or open batches of an earlier
    /// run to collect.
    pub(super) fn batcher(&self, stage: usize) -> Option<&Arc<Batcher>> {
        self.stages.get(stage).and_then(|s| s.batcher.get())
    }

    fn batchers(&self) -> impl Iterator<Item = &Arc<Batcher>> {
        self.stages.iter().filter_map(|s| s.batcher.get())
    }

    /// The earliest stage with requests under way (the one the console and
    /// a stop-after-stage mean by "the current stage").
    pub(super) fn frontier(&self) -> usize {
        self.busy
            .iter()
            .position(|n| n.load(Ordering::Relaxed) > 0)
            .unwrap_or_else(|| self.last_frontier.load(Ordering::Relaxed))
            .min(self.stages.len().saturating_sub(1))
    }

    /// A request of `stage` starts (+1) or ends (-1).
    pub(super) fn busy(&self, stage: usize, delta: i64) {
        if let Some(n) = self.busy.get(stage) {
            if delta > 0 {
                n.fetch_add(1, Ordering::Relaxed);
                self.last_frontier.store(stage, Ordering::Relaxed);
            } else {
                let _ = n.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1));
            }
        }
    }

    /// Whether an operator's stop-after-stage holds stage `stage` back.
    pub(super) fn stops_before(&self, stage: usize) -> bool {
        self.stop_after
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|s| stage > s)
    }

    /// A request made while running (a criterion asked on its own): its id,
    /// and its earlier answer when an identical one was answered before.
    pub(super) async fn follow_up(
        &self,
        item: &crate::ledger::store::WorkItem,
        stage: &super::stages::Stage,
        name: &str,
    ) -> Option<crate::ledger::writer::MadeRequest> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let op = WriteOp::Request(crate::ledger::writer::NewRequest {
            session_id: self.session_id.clone(),
            item_id: item.item_id.clone(),
            stage: name.to_string(),
            position: stage.index as i64,
            provider: stage.provider_name.clone(),
            model: stage.model.clone(),
            template_hash: stage.template.hash.clone(),
            params_hash: stage.params_hash.clone(),
            reply: std::sync::Mutex::new(Some(tx)),
        });
        if !self.write(item, op).await {
            return None;
        }
        rx.await.ok()
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

    /// Write `op` for `item` under the claim this worker holds on it. False
    /// when it did not commit: the ledger failed (the session stops), or the
    /// item was taken over by another worker (this worker's lease ran out
    /// while it stalled): then the write is refused, counted as orphaned
    /// spend, and this worker lets the item go.
    pub(super) async fn write(&self, item: &WorkItem, op: WriteOp) -> bool {
        match self.writer.write_fenced(op, self.fence(item)).await {
            Ok(()) => true,
            Err(WriteError::LeaseLost) => {
                self.orphaned.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(item = %item.item_id, worker = %self.worker_id, "lease lost: the write was refused");
                false
            }
            Err(WriteError::Failed(e)) => {
                self.stop(StopCause::LedgerFailed(e));
                false
            }
        }
    }
}

/// How long a claim lasts without renewal: longer than the longest request
/// deadline of the job (a worker renews every third of it).
/// `DOCKET_LEASE_SECS` overrides it (tests, and operators who want a dead
/// host's items back sooner).
fn lease_secs(p: &Prepared) -> f64 {
    if let Some(secs) = std::env::var("DOCKET_LEASE_SECS")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v >= 1.0)
    {
        return secs;
    }
    p.stages
        .iter()
        .map(|s| s.request_timeout.as_secs_f64())
        .fold(0.0, f64::max)
        + LEASE_MARGIN_SECS
}

/// This worker's row for the heartbeat.
fn worker_beat(ctx: &Ctx, requests_per_sec: f64) -> queue::WorkerBeat {
    queue::WorkerBeat {
        worker_id: ctx.worker_id.to_string(),
        claims: ctx.claims.load(Ordering::Relaxed),
        sent: ctx.stats.sent.load(Ordering::Relaxed),
        requests_per_sec,
    }
}

/// Worker tasks alive at once for a concurrency: a long 429 storm must not
/// pile the whole session up in memory.
fn outstanding_for(concurrency: usize) -> usize {
    (concurrency.saturating_mul(4)).max(256)
}

/// The limiter's settings under an operator's retune (None: the config's).
fn tuned_settings(p: &super::stages::Stage, tune: &Tune) -> LimiterSettings {
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

/// This worker's share of the session's limits when `workers` work it: an
/// equal part of each (rounded down, at least 1), so the workers together
/// stay under what is configured. Rebalanced whenever one joins or leaves.
fn share(s: LimiterSettings, workers: u64) -> LimiterSettings {
    let n = workers.max(1);
    let part = |v: u64| if v == 0 { 0 } else { (v / n).max(1) };
    LimiterSettings {
        requests_per_minute: part(s.requests_per_minute),
        tokens_per_minute: part(s.tokens_per_minute),
        max_concurrency: ((s.max_concurrency as u64 / n).max(1)) as usize,
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
    chat: std::collections::HashMap<String, Arc<dyn ChatProvider>>,
    batch_adapters: std::collections::HashMap<
        String,
        Arc<dyn crate::provider::batch::BatchProvider>,
    >,
    reporter: Arc<dyn Reporter>,
    interrupts: Interrupts,
    grace: Duration,
    resumed: bool,
) -> Result<RunEnd, EngineError> {
    let (writer, writer_handle) = LedgerWriter::start(&p.ledger_path)?;
    let read = crate::ledger::open(&p.ledger_path)?;
    let row = store::load_session(&read, &session_id)?.ok_or_else(|| {
        EngineError::Ledger(format!("session {session_id} vanished from the ledger"))
    })?;
    let stats = Arc::new(Stats::default());
    stats.seed(&row);
    // The workers already on the session, and this one: the limits are
    // split between them from the first request on.
    let workers_now = queue::live_workers(&read, &session_id)? + 1;
    // One limiter per provider: stages on the same provider share its limits.
    let mut limiters: Vec<(String, Arc<Limiter>)> = Vec::new();
    let mut stages = Vec::with_capacity(p.stages.len());
    for st in &p.stages {
        let limiter = match limiters.iter().find(|(n, _)| *n == st.provider_name) {
            Some((_, l)) => l.clone(),
            None => {
                let l = Arc::new(Limiter::new(share(
                    tuned_settings(st, &Tune::default()),
                    workers_now,
                )));
                limiters.push((st.provider_name.clone(), l.clone()));
                l
            }
        };
        // Stages on one provider share its client.
        let Some(provider) = chat.get(&st.provider_name).cloned() else {
            return Err(EngineError::Ledger(format!(
                "internal error: no client for provider {}",
                st.provider_name
            )));
        };
        stages.push(StageRt {
            provider,
            limiter,
            batcher: std::sync::OnceLock::new(),
        });
    }
    let limiter = stages[0].limiter.clone();
    let max_concurrency = p
        .stages
        .iter()
        .map(|s| s.max_concurrency)
        .max()
        .unwrap_or(1);
    let stop_after = store::session_controls(&read, &session_id)?
        .and_then(|c| c.stop_after_stage)
        .and_then(|n| p.stages.iter().position(|s| s.name == n));
    let (pause_tx, pause_rx) = watch::channel(false);
    let ctx = Arc::new(Ctx {
        budget: Budget::new(row.max_cost_usd, row.cost_usd),
        p: p.clone(),
        session_id: session_id.clone(),
        stages,
        limiters,
        stop_after: std::sync::Mutex::new(stop_after),
        busy: (0..p.stages.len()).map(|_| AtomicUsize::new(0)).collect(),
        last_frontier: AtomicUsize::new(0),
        writer: writer.clone(),
        stats: stats.clone(),
        backoff: Backoff::default(),
        soft_stop: CancellationToken::new(),
        hard_stop: CancellationToken::new(),
        paused: pause_rx,
        cause: std::sync::Mutex::new(None),
        outstanding: Arc::new(Semaphore::new(outstanding_for(max_concurrency))),
        outstanding_cap: AtomicUsize::new(outstanding_for(max_concurrency)),
        worker_id: Arc::from(queue::new_worker_id()),
        lease_secs: lease_secs(&p),
        claims: AtomicU64::new(0),
        workers: AtomicU64::new(workers_now),
        stop_from_ledger: AtomicBool::new(false),
        orphaned: AtomicU64::new(0),
        claim_room: tokio::sync::Notify::new(),
    });
    // On record as a worker before the first claim, so the others split
    // the limits with it from the start.
    let _ = writer
        .write(WriteOp::Heartbeat {
            session_id: session_id.clone(),
            live_json: None,
            worker: Some(worker_beat(&ctx, 0.0)),
        })
        .await;
    let open_batches = crate::ledger::batches::open_batches(&read, &session_id)?;
    let tags = Arc::new(std::sync::atomic::AtomicU64::new(
        crate::ledger::batches::batch_count(&read, &session_id)? + 1,
    ));
    for (k, st) in p.stages.iter().enumerate() {
        let open = open_batches.iter().filter(|b| b.stage == st.name).count() as u64;
        start_batching(
            &ctx,
            k,
            open,
            tags.clone(),
            batch_adapters.get(&st.provider_name).cloned(),
            &reporter,
        )
        .await?;
    }
    let one = p.stages.len() == 1;
    let shown: Vec<String> = p
        .stages
        .iter()
        .map(|st| {
            format!(
                "{}with {} ({}): requests/min {}, tokens/min {}, concurrency {}",
                if one {
                    String::new()
                } else {
                    format!("stage {} ", st.name)
                },
                st.model,
                st.provider_name,
                per_minute(st.rpm),
                per_minute(st.tpm),
                st.max_concurrency
            )
        })
        .collect();
    ctx.event(
        "info",
        "started",
        format!(
            "{}{} {}",
            if resumed { "resumed" } else { "started" },
            if one { "" } else { ":" },
            shown.join("; ")
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

    tracing::info!(session = %session_id, stages = p.stages.len(), "dispatch started");
    let read = Arc::new(std::sync::Mutex::new(read));
    let feed_result = feed(&ctx, &read).await;
    if let Err(e) = &feed_result {
        ctx.stop(StopCause::LedgerFailed(e.to_string()));
    }
    control.abort();
    let left_at_provider = end_batching(&ctx, &read, &*reporter).await;
    progress.abort();
    let _ = progress.await;

    // Let go of every item this worker still holds: other workers (or a
    // resume) take them at once, with nothing to repair.
    let _ = writer
        .write(WriteOp::Leave {
            session_id: session_id.clone(),
            worker_id: ctx.worker_id.clone(),
        })
        .await;
    let cause = ctx.cause();
    let (remaining, others) = tokio::task::block_in_place(|| {
        let conn = read.lock().unwrap_or_else(|p| p.into_inner());
        let remaining = store::next_work(&conn, &session_id, -1, 1).map(|w| w.len())?;
        let others = queue::live_workers(&conn, &session_id)?;
        Ok::<_, rusqlite::Error>((remaining, others))
    })?;
    let (state, reason, end) = match cause {
        // Every item has its outcome: a stop that came after the last one
        // changes nothing.
        _ if remaining == 0 => ("completed", None, RunEnd::Completed),
        None => {
            let held: usize = ctx.batchers().map(|b| b.held_count()).sum();
            let stopped_at = *ctx.stop_after.lock().unwrap_or_else(|p| p.into_inner());
            let why = match (held, stopped_at) {
                (0, Some(s)) if s + 1 < ctx.p.stages.len() => format!(
                    "stopped after stage {} as asked; resume to run {} and the stages after it",
                    ctx.p.stages[s].name,
                    ctx.p.stages[s + 1].name
                ),
                (held, _) if held > 0 => format!(
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
        drop(ctx);
        drop(writer);
        tokio::task::block_in_place(|| writer_handle.join());
        return Ok(end);
    }
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

/// The job's stages in groups: a stage that waits for the whole previous
/// stage starts a new group. Items move through a group's stages one by
/// one; a group starts once the one before it is over for every item.
fn stage_groups(p: &Prepared) -> Vec<std::ops::Range<usize>> {
    let mut groups = Vec::new();
    let mut start = 0;
    for (k, st) in p.stages.iter().enumerate().skip(1) {
        if st.wait_for_previous {
            groups.push(start..k);
            start = k;
        }
    }
    groups.push(start..p.stages.len());
    groups
}

/// Run every group in turn over the items that have no outcome yet.
async fn feed(
    ctx: &Arc<Ctx>,
    read: &Arc<std::sync::Mutex<rusqlite::Connection>>,
) -> Result<(), EngineError> {
    for group in stage_groups(&ctx.p) {
        if ctx.soft_stop.is_cancelled() || (group.start > 0 && ctx.stops_before(group.start)) {
            break;
        }
        feed_group(ctx, read, group).await?;
    }
    for b in ctx.batchers() {
        b.feed_done();
    }
    Ok(())
}

/// Claim the items without an outcome page by page and hand each to a
/// task for the stages of `group`. First a pass in order over the items
/// nobody holds; then, until no other worker holds any, the items other
/// workers let go or lost (their lease ran out): the group is over for this
/// worker only when nobody has any of its work left.
async fn feed_group(
    ctx: &Arc<Ctx>,
    read: &Arc<std::sync::Mutex<rusqlite::Connection>>,
    group: std::ops::Range<usize>,
) -> Result<(), EngineError> {
    // Bound the tasks alive at once (in flight plus waiting to retry) so a
    // long 429 storm cannot pile up the whole session in memory.
    let outstanding = ctx.outstanding.clone();
    let mut workers = JoinSet::new();
    let mut scope = ClaimScope::After(-1);
    'pages: loop {
        if ctx.soft_stop.is_cancelled() {
            break;
        }
        if !ctx.wait_unpaused().await {
            break;
        }
        // Claim only what can start soon (a claimed item waiting here is
        // one another worker cannot take): top the claims up once half of
        // what this worker may hold ahead has been worked off.
        let ahead = ctx.claim_ahead();
        while ctx.claims.load(Ordering::Relaxed) as usize > ahead / 2 {
            tokio::select! {
                _ = ctx.claim_room.notified() => {}
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                _ = ctx.soft_stop.cancelled() => break 'pages,
            }
        }
        let n = ahead
            .saturating_sub(ctx.claims.load(Ordering::Relaxed) as usize)
            .clamp(1, PAGE);
        let page = claim(ctx, read, scope, n).await?;
        if page.is_empty() {
            match scope {
                ClaimScope::After(_) => {
                    // The first pass is over: cut what waits for a batch
                    // without waiting for the TIME trigger, and once this
                    // worker's own items are done, look for what others let
                    // go or lost.
                    for b in ctx.batchers() {
                        b.feed_done();
                    }
                    while let Some(done) = workers.join_next().await {
                        note_crash(ctx, done);
                    }
                    ctx.flush().await;
                    scope = ClaimScope::Takeover;
                    continue;
                }
                ClaimScope::Takeover => {
                    if !others_hold_work(ctx, read).await? {
                        break;
                    }
                    // Another worker still works on items: wait for it to
                    // finish them, or for its lease to run out.
                    tokio::select! {
                        _ = tokio::time::sleep(TAKEOVER_POLL) => {}
                        _ = ctx.soft_stop.cancelled() => break,
                    }
                    continue;
                }
            }
        }
        ctx.claims.fetch_add(page.len() as u64, Ordering::Relaxed);
        let mut page = page.into_iter();
        while let Some(item) = page.next() {
            if let ClaimScope::After(after) = &mut scope {
                *after = item.position;
            }
            if !ctx.wait_unpaused().await {
                release_unstarted(ctx, std::iter::once(item).chain(page));
                break 'pages;
            }
            let permit = tokio::select! {
                p = outstanding.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break 'pages },
                _ = ctx.soft_stop.cancelled() => {
                    release_unstarted(ctx, std::iter::once(item).chain(page));
                    break 'pages;
                }
            };
            // The stage this item runs first: when it goes synchronously,
            // its slot is taken here, in order, so waiting tasks do not pile
            // up on the limiter (one waiter, not hundreds, on every release).
            let next = item
                .stages
                .iter()
                .filter_map(|sw| {
                    ctx.p
                        .stages
                        .iter()
                        .position(|s| s.name == sw.stage)
                        .map(|k| (k, sw))
                })
                .find(|(_, sw)| sw.state != "passed")
                .map(|(k, sw)| (k, sw.status == "completed"));
            let slot = match next {
                Some((k, false))
                    if group.contains(&k)
                        && !ctx.batcher(k).is_some_and(|b| b.takes_new())
                        && !(k > 0 && ctx.stops_before(k)) =>
                {
                    tokio::select! {
                        s = ctx.rt(k).limiter.acquire_slot() => Some(s),
                        _ = ctx.soft_stop.cancelled() => {
                            release_unstarted(ctx, std::iter::once(item).chain(page));
                            break 'pages;
                        }
                    }
                }
                _ => None,
            };
            let ctx2 = ctx.clone();
            let group = group.clone();
            workers.spawn(async move {
                let fence = ctx2.fence(&item);
                super::worker::process(&ctx2, item, group, slot).await;
                // Without an outcome (a stop, a stop-after-stage, a later
                // group's stage) the item is let go, not left to lapse; with
                // one, its lease already ended with the outcome.
                ctx2.writer.post(WriteOp::ReleaseItem(fence));
                ctx2.claims.fetch_sub(1, Ordering::Relaxed);
                ctx2.claim_room.notify_one();
                drop(permit);
            });
            while let Some(done) = workers.try_join_next() {
                note_crash(ctx, done);
            }
        }
    }
    // Every item of the group is handed out: cut what waits without
    // waiting for the TIME trigger.
    for b in ctx.batchers() {
        b.feed_done();
    }
    while let Some(done) = workers.join_next().await {
        note_crash(ctx, done);
    }
    // The items let go above are free before the next group claims them.
    ctx.flush().await;
    Ok(())
}

/// Claimed items that never started (the run stopped first): let go now.
fn release_unstarted(ctx: &Ctx, items: impl Iterator<Item = WorkItem>) {
    for item in items {
        ctx.writer.post(WriteOp::ReleaseItem(ctx.fence(&item)));
        ctx.claims.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Claim the next page of `scope` for this worker.
async fn claim(
    ctx: &Arc<Ctx>,
    read: &Arc<std::sync::Mutex<rusqlite::Connection>>,
    scope: ClaimScope,
    n: usize,
) -> Result<Vec<WorkItem>, EngineError> {
    let read = read.clone();
    let sid = ctx.session_id.clone();
    let worker = ctx.worker_id.clone();
    let lease = ctx.lease_secs;
    tokio::task::spawn_blocking(move || {
        let mut conn = read.lock().unwrap_or_else(|p| p.into_inner());
        if scope == ClaimScope::Takeover {
            // A dead worker of this host is let go at once.
            for gone in queue::expire_dead_local_workers(&conn, &sid)? {
                tracing::warn!(worker = %gone, "a worker of this host is gone: its items are free");
            }
        }
        queue::claim_page(&mut conn, &sid, &worker, scope, n, lease)
    })
    .await
    .map_err(|e| EngineError::Ledger(e.to_string()))?
    .map_err(EngineError::from)
}

/// Whether another worker still holds items of the session under a live
/// lease.
async fn others_hold_work(
    ctx: &Arc<Ctx>,
    read: &Arc<std::sync::Mutex<rusqlite::Connection>>,
) -> Result<bool, EngineError> {
    let read = read.clone();
    let sid = ctx.session_id.clone();
    let worker = ctx.worker_id.clone();
    tokio::task::spawn_blocking(move || {
        let conn = read.lock().unwrap_or_else(|p| p.into_inner());
        queue::held_by_others(&conn, &sid, &worker)
    })
    .await
    .map_err(|e| EngineError::Ledger(e.to_string()))?
    .map(|n| n > 0)
    .map_err(EngineError::from)
}

/// Set up batch mode: the batcher, with the open batches of an earlier run
/// re-attached. Without a Batch API (Ollama, OpenRouter) `batch`/`auto`
/// send synchronously (simulated batching), and the run says so.
async fn start_batching(
    ctx: &Arc<Ctx>,
    stage: usize,
    open: u64,
    tags: Arc<std::sync::atomic::AtomicU64>,
    adapter: Option<Arc<dyn crate::provider::batch::BatchProvider>>,
    reporter: &Arc<dyn Reporter>,
) -> Result<(), EngineError> {
    let p = &ctx.p.stages[stage];
    let mode = p.batch.mode;
    let Some(adapter) = adapter else {
        if mode != crate::config::BatchMode::Sync {
            let note = format!(
                "stage {}: {} (kind {}) has no Batch API here: mode = \"{}\" sends each request synchronously under the rate limits (simulated batching), at the synchronous price",
                p.name,
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
        ctx.p.clone(),
        stage,
        ctx.stats.clone(),
        reporter.clone(),
        tags,
        Box::new(move |e| {
            if let Some(ctx) = weak.upgrade() {
                ctx.stop(StopCause::LedgerFailed(e));
            }
        }),
        ctx.paused.clone(),
        batching::Lease {
            worker_id: ctx.worker_id.clone(),
            secs: ctx.lease_secs,
        },
    );
    let _ = ctx.stages[stage].batcher.set(b.clone());
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
                "stage {}: {} mode: requests go to the {} Batch API at {:.0}% of the synchronous price; a batch is cut at {} requests, {} bytes or {:.0} s{}",
                p.name,
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
    if ctx.batchers().next().is_none() {
        return 0;
    }
    for b in ctx.batchers() {
        b.shutdown();
    }
    // This worker's batches only: another worker's are its own to collect.
    let mine = |conn: &rusqlite::Connection| {
        crate::ledger::batches::open_batches(conn, &ctx.session_id)
            .unwrap_or_default()
            .into_iter()
            .filter(|o| o.claimed_by.as_deref() == Some(&*ctx.worker_id))
            .collect::<Vec<_>>()
    };
    let open = {
        let conn = read.lock().unwrap_or_else(|p| p.into_inner());
        mine(&conn)
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
        mine(&conn)
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
        stage: ctx.p.stages[frontier].name.clone(),
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
    let mut hard_deadline: Option<Instant> = None;
    let mut seen = Seen {
        workers: ctx.workers.load(Ordering::Relaxed),
        ..Seen::default()
    };
    let mut window = Window::new(&ctx.stats.snapshot());
    let mut last_renewal = Instant::now();
    let mut last_adoption = Instant::now();
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
        }
        let controls = {
            let conn = conn.clone();
            let sid = ctx.session_id.clone();
            tokio::task::spawn_blocking(move || {
                let c = conn.lock().unwrap_or_else(|p| p.into_inner());
                let controls = store::session_controls(&c, &sid)?;
                let workers = queue::live_workers(&c, &sid)?;
                Ok::<_, rusqlite::Error>((controls, workers))
            })
            .await
        };
        if let Ok(Ok((Some(controls), workers))) = controls {
            // This worker counts itself even before its first beat lands.
            ctx.workers.store(workers.max(1), Ordering::Relaxed);
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
        let live = gauges(&ctx, &mut window, paused);
        ctx.writer.post(WriteOp::Heartbeat {
            session_id: ctx.session_id.clone(),
            live_json: serde_json::to_string(&live).ok(),
            worker: Some(worker_beat(&ctx, live.rpm_used / 60.0)),
        });
        note_rate_limiting(&ctx, &mut seen);
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
