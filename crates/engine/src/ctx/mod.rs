//! The shared context of one worker's run of a session: the job, its
//! stages' clients and limiters, the claim this worker holds items under,
//! the ledger writer, and the stop and pause signals. The feed, the control
//! loop, the item workers and the attempts all reach the run through it.

mod retry_wait;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;

use crate::Prepared;
use crate::batching::Batcher;
use crate::budget::Budget;
use crate::stats::Stats;
use docket_ledger::queue;
use docket_ledger::store::WorkItem;
use docket_ledger::writer::{Fence, LedgerWriter, WriteError, WriteOp};
use docket_model::live::Tune;
use docket_providers::ChatProvider;
use docket_providers::limiter::{Limiter, LimiterSettings};
use docket_providers::retry::Backoff;

pub(super) const PAGE: usize = 512;

pub(super) const PAUSED_BY_OPERATOR: &str = "paused by operator";

/// A lease outlasts the longest request deadline by this much, so a worker
/// that is merely slow is never taken over.
pub(super) const LEASE_MARGIN_SECS: f64 = 30.0;

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
    /// How long a synchronous request of the stage may go unanswered.
    pub(super) deadline: Arc<crate::deadline::Deadline>,
    pub(super) batcher: std::sync::OnceLock<Arc<Batcher>>,
}

pub(super) struct Ctx {
    pub(super) p: Arc<Prepared>,
    pub(super) session_id: String,
    /// One per stage, in job order.
    pub(super) stages: Vec<StageRt>,
    /// Every distinct limiter (one per provider), for retunes and gauges.
    pub(super) limiters: Vec<(String, Arc<Limiter>)>,
    /// Stop after this stage (index): later stages start for no item.
    pub(super) stop_after: std::sync::Mutex<Option<usize>>,
    /// Each stage's first answers, watched for a gate that never passes.
    pub(super) gate_watch: crate::gate_watch::GateWatch,
    /// Each stage's first refused requests, watched for a job the
    /// provider will never take (a model it does not know).
    pub(super) refusal_watch: crate::gate_watch::GateWatch,
    /// Requests waiting out their rate limits (row S2), for the events.
    pub(super) retry_waits: retry_wait::RetryWaits,
    /// Each stage's sends that did not reach its provider, in a row.
    pub(super) reach_watch: crate::reach_watch::ReachWatch,
    /// Requests under way per stage, and the stage last started.
    pub(super) busy: Vec<AtomicUsize>,
    pub(super) last_frontier: AtomicUsize,
    pub(super) writer: LedgerWriter,
    pub(super) stats: Arc<Stats>,
    pub(super) budget: Arc<Budget>,
    pub(super) backoff: Backoff,
    /// No new attempts (stop, cancel, budget, fatal error).
    pub(super) soft_stop: CancellationToken,
    /// Abandon requests in flight.
    pub(super) hard_stop: CancellationToken,
    pub(super) paused: watch::Receiver<bool>,
    /// Nothing new is sent: the ledger's disk is almost full
    /// (`disk_guard`).
    pub(super) disk_hold: watch::Sender<bool>,
    pub(super) cause: std::sync::Mutex<Option<StopCause>>,
    /// Bounds the worker tasks alive at once; grows when concurrency is
    /// retuned upward.
    pub(super) outstanding: Arc<Semaphore>,
    pub(super) outstanding_cap: AtomicUsize,
    /// This process as a worker of the session (`user@host:pid#random`).
    pub(super) worker_id: Arc<str>,
    /// How long a claim lasts without renewal.
    pub(super) lease_secs: f64,
    /// Items this worker holds now (claimed, no outcome yet).
    pub(super) claims: AtomicU64,
    /// Workers of the session, this one included: the provider's limits
    /// are split between them.
    pub(super) workers: AtomicU64,
    /// The stop came from the ledger (an operator's cancel), so every
    /// worker of the session stops with it.
    pub(super) stop_from_ledger: AtomicBool,
    /// Writes refused because another worker took the item over.
    pub(super) orphaned: AtomicU64,
    /// A task ended: the feed may claim more.
    pub(super) claim_room: tokio::sync::Notify,
    /// The ledger handle batch results claim their items on (opened at the
    /// first delivery).
    pub(super) delivery_ledger: std::sync::Mutex<Option<docket_ledger::Ledger>>,
    /// The routing thresholds answers are routed with: the run's, then the
    /// ones the session records once a resume or a joining worker records
    /// others (`control::obey`), so every worker routes alike.
    pub(super) routing: std::sync::Mutex<docket_model::routing::Thresholds>,
}

impl Ctx {
    /// The thresholds to route an answer with now.
    pub(super) fn thresholds(&self) -> docket_model::routing::Thresholds {
        *self.routing.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many items this worker may hold claimed ahead of its work
    /// (lines not yet recorded in a batch included: they hold their rendered
    /// prompts). In batch mode what a batcher records at a time, twice, and
    /// a page: lines are recorded as they come, and a line recorded in a
    /// batch is the batch's, not a claim. Synchronously a few times what it
    /// may have in flight, so the other workers find the rest of the session
    /// free.
    pub(super) fn claim_ahead(&self) -> usize {
        if let Some(ahead) = self
            .batchers()
            .filter(|b| b.takes_new())
            .map(|b| b.claim_ahead())
            .max()
        {
            return ahead.saturating_add(PAGE);
        }
        let concurrency = self
            .limiters
            .iter()
            .map(|(_, l)| l.snapshot().max_concurrency)
            .max()
            .unwrap_or(1);
        concurrency.saturating_mul(4).clamp(64, PAGE)
    }

    /// Items claimed and lines not yet recorded in a batch: what counts
    /// against `claim_ahead`.
    pub(super) fn held_ahead(&self) -> usize {
        self.claims.load(Ordering::Relaxed) as usize
            + self.batchers().map(|b| b.buffered()).sum::<usize>()
    }

    /// Wait until every write posted so far has committed (the writer
    /// applies them in order; a lease renewal is the harmless last one).
    pub(super) async fn flush(&self) {
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

    pub(super) fn batchers(&self) -> impl Iterator<Item = &Arc<Batcher>> {
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
        item: &docket_ledger::store::WorkItem,
        stage: &crate::stages::Stage,
        name: &str,
    ) -> Option<docket_ledger::writer::MadeRequest> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let op = WriteOp::Request(docket_ledger::writer::NewRequest {
            session_id: self.session_id.clone(),
            item_id: item.item_id.clone(),
            stage: name.to_string(),
            position: stage.index as i64,
            provider: stage.provider_name.clone(),
            model: stage.model.clone(),
            template_hash: stage.template.hash.clone(),
            params_hash: stage.params_hash.clone(),
            reply: std::sync::Mutex::new(Some(tx)),
            made: std::sync::Mutex::new(None),
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

    /// Whether the disk guard holds sending.
    pub(super) fn disk_held(&self) -> bool {
        *self.disk_hold.borrow()
    }

    /// Wait while the disk guard holds sending; false if a stop came.
    pub(super) async fn wait_disk_room(&self) -> bool {
        self.wait_cleared(self.disk_hold.subscribe()).await
    }

    /// Wait while paused; false if a stop came meanwhile.
    pub(super) async fn wait_unpaused(&self) -> bool {
        self.wait_cleared(self.paused.clone()).await
    }

    /// Wait until `rx` says false; false if a stop came first.
    async fn wait_cleared(&self, mut rx: watch::Receiver<bool>) -> bool {
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
    pub(super) fn make_room_for(&self, concurrency: usize) {
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
pub(super) fn lease_secs(p: &Prepared) -> f64 {
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
pub(super) fn worker_beat(
    ctx: &Ctx,
    requests_per_sec: f64,
    live_json: Option<String>,
) -> queue::WorkerBeat {
    queue::WorkerBeat {
        worker_id: ctx.worker_id.to_string(),
        claims: ctx.claims.load(Ordering::Relaxed),
        sent: ctx.stats.sent.load(Ordering::Relaxed),
        requests_per_sec,
        live_json,
    }
}

/// Worker tasks alive at once for a concurrency: a long 429 storm must not
/// pile the whole session up in memory.
pub(super) fn outstanding_for(concurrency: usize) -> usize {
    (concurrency.saturating_mul(4)).max(256)
}

/// The limiter's settings under an operator's retune (None: the config's).
pub(super) fn tuned_settings(p: &crate::stages::Stage, tune: &Tune) -> LimiterSettings {
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
pub(super) fn share(s: LimiterSettings, workers: u64) -> LimiterSettings {
    let n = workers.max(1);
    let part = |v: u64| if v == 0 { 0 } else { (v / n).max(1) };
    LimiterSettings {
        requests_per_minute: part(s.requests_per_minute),
        tokens_per_minute: part(s.tokens_per_minute),
        max_concurrency: ((s.max_concurrency as u64 / n).max(1)) as usize,
    }
}

pub(super) fn per_minute(n: u64) -> String {
    if n == 0 {
        "unlimited".into()
    } else {
        n.to_string()
    }
}
