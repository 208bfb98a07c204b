//! Batch mode: requests go to the provider's Batch API instead of one HTTP
//! call each. A worker hands its request to the batcher and is done with
//! the item until the line's result comes: a line waiting at the provider
//! costs ledger rows, not a task or a buffer. When a batch's results come,
//! they are read in chunks and each chunk's items are claimed again and run
//! on from the result (`Deliver`), through the same gate, routing, retries
//! and ledger records as a synchronous answer.
//!
//! The former cuts a batch when a COUNT, SIZE or TIME trigger fires (or the
//! feed is done and nothing new came for a moment), splits it to the
//! provider's limits and hands each file to a runner. A runner records the
//! batch and its lines before the upload (letting go of their items: the
//! batch's lease covers them), its provider id the moment it is known,
//! polls on the provider's cadence with `next_poll_at` in the ledger, and
//! reads the results back from the provider with the waiting lines from the
//! ledger. A resume (or another worker) adopts open batches instead of
//! sending their requests again.

mod adopt;
mod applying;
mod enqueued;
mod former;
mod lines;
mod runner;
mod settings;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::{Notify, Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::Prepared;
use super::budget::Budget;
use super::progress::Reporter;
use super::stats::Stats;
use docket_ledger::writer::{Fence, LedgerWriter, WriteError, WriteOp};
use docket_model::config::BatchMode;
use docket_providers::batch::BatchProvider;
use docket_providers::{ChatAnswer, ChatRequest, ProviderError};

pub(super) use adopt::Adoption;
pub(super) use settings::{Settings, settings_for};

/// What became of one line handed to the batcher.
#[derive(Debug)]
pub(super) enum Reply {
    /// The model answered (the gate decides the rest).
    Answer(ChatAnswer),
    /// The request failed at the provider, or its batch could not be made.
    Error(ProviderError),
    /// Never run (its batch expired or was cancelled first): not billed.
    NotRun(String),
    /// `auto`: too few requests were pending to make a batch: send it now,
    /// synchronously. Nothing was recorded for it.
    GoSync,
    /// The provider would refuse the line (too large, say): it was never
    /// recorded nor sent, and can never go in a batch.
    Refused(String),
}

/// A line's result for its item: which request and attempt it answers.
#[derive(Debug)]
pub(super) struct Delivered {
    pub request_id: i64,
    /// The attempt the line carried (for `GoSync` and `Refused`, the one
    /// that was never recorded).
    pub attempt: i64,
    pub reply: Reply,
}

/// Hands a chunk of results to the engine, which claims their items and
/// runs them on; the future ends once every item of the chunk is done with
/// (its outcome recorded, or it waits again in a new line).
pub(super) type Deliver =
    Box<dyn Fn(usize, Vec<Delivered>) -> BoxFuture<'static, ()> + Send + Sync>;

/// A request waiting to be put in a batch.
pub(super) struct Queued {
    pub request_id: i64,
    pub attempt: i64,
    /// `client_request_id` is the line's `custom_id`.
    pub request: ChatRequest,
    /// The item the worker holds (its id and claim token): let go when the
    /// line is recorded.
    pub item: (String, i64),
    /// The hash of the evidence the line's prompts were rendered from.
    pub evidence_hash: Option<String>,
    /// What the budget holds for the line until its result is applied.
    pub ticket: Ticket,
}

/// A line on its way into a batch. Dropped before its batch is recorded
/// (the run stopped, `auto` sends it synchronously, the provider would
/// refuse it), it gives its budget reservation back; recorded, the
/// reservation moves to the batch until its results are applied.
pub(super) struct Ticket {
    reserved: f64,
    budget: Arc<Budget>,
    buffered: Arc<AtomicUsize>,
}

impl Ticket {
    /// The line is on disk in its batch: its reservation goes with the
    /// batch (the ticket still counts the line as buffered until dropped).
    fn take_reserved(&mut self) -> f64 {
        std::mem::take(&mut self.reserved)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.buffered.fetch_sub(1, Ordering::Relaxed);
        if self.reserved > 0.0 {
            self.budget.settle(self.reserved, 0.0);
        }
    }
}

/// With the feed done, a buffer that got nothing new for this long is cut
/// at once instead of waiting for the TIME trigger.
const SETTLE: Duration = Duration::from_millis(300);

/// What a runner needs of the session and the job.
pub(super) struct Batcher {
    pub(super) settings: Settings,
    pub(super) adapter: Arc<dyn BatchProvider>,
    pub(super) writer: LedgerWriter,
    pub(super) session_id: String,
    pub(super) p: Arc<Prepared>,
    /// The stage whose requests this batcher carries.
    pub(super) stage: usize,
    pub(super) stats: Arc<Stats>,
    pub(super) reporter: Arc<dyn Reporter>,
    budget: Arc<Budget>,
    /// Lines handed in and not yet recorded in a batch (they hold their
    /// items' claims and their rendered prompts).
    buffered: Arc<AtomicUsize>,
    /// One batch's results are read and applied at a time: a whole batch's
    /// replies are the most this holds.
    collecting: Semaphore,
    deliver: Deliver,
    tx: std::sync::Mutex<Option<mpsc::UnboundedSender<Queued>>>,
    /// Bounds the provider batches open at once.
    open_slots: Arc<Semaphore>,
    /// Shared by every stage's batcher of the session: tags are unique.
    next_tag: Arc<AtomicU64>,
    /// Batches submitted (or re-attached) and not yet delivered.
    open: AtomicUsize,
    /// Adoptions under way: counted from before the ledger hands this
    /// worker other workers' batches until their runners count them open,
    /// so the feed never sees them held by nobody and ends the run early.
    adopting: AtomicUsize,
    held: AtomicUsize,
    feed_done: AtomicBool,
    feed_done_notify: Notify,
    /// No new batches: buffered requests are dropped (they stay pending).
    stop_forming: CancellationToken,
    /// Stop waiting: open batches stay open at the provider and in the
    /// ledger, and a resume collects them.
    detached: CancellationToken,
    /// Cancel every open batch at the provider and collect what finished.
    cancel: CancellationToken,
    /// The run cannot go on (the ledger failed): the dispatch's stop.
    on_fatal: Box<dyn Fn(String) + Send + Sync>,
    /// An operator's pause: no batch is created while it holds (open
    /// batches are still polled and collected).
    paused: tokio::sync::watch::Receiver<bool>,
    tasks: std::sync::Mutex<JoinSet<()>>,
    /// This worker: it holds the lease of every batch it submits or adopts.
    pub(super) lease: Lease,
    /// The enqueued-token budget of the stage's provider and model (row B3).
    enqueued: Arc<enqueued::Enqueued>,
}

/// Whose batches these are, and for how long without renewal.
#[derive(Debug, Clone)]
pub(super) struct Lease {
    pub worker_id: Arc<str>,
    pub secs: f64,
}

impl Batcher {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        settings: Settings,
        adapter: Arc<dyn BatchProvider>,
        writer: LedgerWriter,
        session_id: String,
        p: Arc<Prepared>,
        stage: usize,
        stats: Arc<Stats>,
        reporter: Arc<dyn Reporter>,
        budget: Arc<Budget>,
        deliver: Deliver,
        next_tag: Arc<AtomicU64>,
        on_fatal: Box<dyn Fn(String) + Send + Sync>,
        paused: tokio::sync::watch::Receiver<bool>,
        lease: Lease,
    ) -> Arc<Batcher> {
        let (tx, rx) = mpsc::unbounded_channel();
        let b = Arc::new(Batcher {
            open_slots: Arc::new(Semaphore::new(settings.max_open.max(1))),
            settings,
            adapter,
            writer,
            session_id,
            p,
            stage,
            stats,
            reporter,
            budget,
            buffered: Arc::new(AtomicUsize::new(0)),
            collecting: Semaphore::new(1),
            deliver,
            tx: std::sync::Mutex::new(Some(tx)),
            next_tag,
            open: AtomicUsize::new(0),
            adopting: AtomicUsize::new(0),
            held: AtomicUsize::new(0),
            feed_done: AtomicBool::new(false),
            feed_done_notify: Notify::new(),
            stop_forming: CancellationToken::new(),
            detached: CancellationToken::new(),
            cancel: CancellationToken::new(),
            on_fatal,
            paused,
            tasks: std::sync::Mutex::new(JoinSet::new()),
            lease,
            enqueued: enqueued::books(),
        });
        let former = b.clone();
        b.spawn(async move { former::form(former, rx).await });
        b
    }

    pub(super) fn stage(&self) -> &super::stages::Stage {
        &self.p.stages[self.stage]
    }

    /// Whose enqueued-token budget this stage's batches count against.
    fn enqueued_key(&self) -> enqueued::Key {
        let s = self.stage();
        // The provider's address (and the key's variable), not only its
        // name in docket.toml: engines in one process pointed at different
        // servers under one name (tests, a console running jobs) keep
        // apart books.
        let at = self
            .p
            .config
            .config
            .providers
            .get(&s.provider_name)
            .map(|c| {
                format!(
                    "{} {} {}",
                    s.provider_name,
                    c.base_url.as_deref().unwrap_or(""),
                    c.api_key_env.as_deref().unwrap_or("")
                )
            })
            .unwrap_or_else(|| s.provider_name.clone());
        (at, s.model.clone())
    }

    /// Whether new requests go to batches (else only re-attached batches are
    /// collected and new requests go synchronously).
    pub(super) fn takes_new(&self) -> bool {
        self.settings.mode != BatchMode::Sync
    }

    /// Hand a request to the batcher; `reserved` of the budget stays held
    /// for it until its result is applied. Its result comes to the engine
    /// through `Deliver`, in a new task: the caller is done with the item.
    pub(super) fn enqueue(
        &self,
        request_id: i64,
        attempt: i64,
        request: ChatRequest,
        item: (String, i64),
        evidence_hash: Option<String>,
        reserved: f64,
    ) {
        self.buffered.fetch_add(1, Ordering::Relaxed);
        let q = Queued {
            request_id,
            attempt,
            request,
            item,
            evidence_hash,
            ticket: Ticket {
                reserved,
                budget: self.budget.clone(),
                buffered: self.buffered.clone(),
            },
        };
        if let Some(tx) = self.tx.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            let _ = tx.send(q);
        }
    }

    /// How many lines this batcher's feed may hold claimed and not yet
    /// recorded: a piece being recorded while the next one fills (in
    /// `auto`, at least `min_batch_size`, since nothing is recorded before
    /// a batch is sure), never more than a batch.
    pub(super) fn claim_ahead(&self) -> usize {
        let s = &self.settings;
        let first = match s.mode {
            BatchMode::Auto => s.min_batch_size.max(former::RECORD_PIECE),
            _ => former::RECORD_PIECE,
        };
        first
            .saturating_add(former::RECORD_PIECE)
            .min(s.max_requests.max(1))
    }

    /// Lines handed in and not yet recorded in a batch.
    pub(super) fn buffered(&self) -> usize {
        self.buffered.load(Ordering::Relaxed)
    }

    /// Hand results to their items and wait until every one is done with.
    async fn deliver(&self, lines: Vec<Delivered>) {
        if !lines.is_empty() {
            (self.deliver)(self.stage, lines).await;
        }
    }

    /// The feed has handed out every item: cut what waits without waiting
    /// for the TIME trigger.
    pub(super) fn feed_done(&self) {
        self.feed_done.store(true, Ordering::Relaxed);
        self.feed_done_notify.notify_one();
    }

    /// No new batches from now on (a stop of any kind).
    pub(super) fn stop_forming(&self) {
        self.stop_forming.cancel();
        // Close the queue: requests still handed in are dropped at once.
        self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    /// Leave open batches to the provider; a resume collects them.
    pub(super) fn detach(&self) {
        self.stop_forming();
        self.detached.cancel();
    }

    /// Cancel every open batch and collect what it finished.
    pub(super) fn cancel_all(&self) {
        // Cancelling first: a batch that wakes on the stop of forming must
        // already see that the stop is a cancel, or it is left recorded
        // and unsent instead of ended as never run (a race seen in CI when
        // the two were the other way round, on another thread).
        self.cancel.cancel();
        self.stop_forming();
    }

    pub(super) fn is_cancelling(&self) -> bool {
        self.cancel.is_cancelled()
    }

    pub(super) fn detached(&self) -> &CancellationToken {
        &self.detached
    }

    /// Provider batches open now (submitted or re-attached, not delivered).
    pub(super) fn open_count(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Whether batches taken over from other workers are on their way to
    /// being polled (claimed in the ledger, not yet counted open).
    pub(super) fn adopting(&self) -> bool {
        self.adopting.load(Ordering::Acquire) > 0
    }

    /// Requests held because their batch could not be told apart.
    pub(super) fn held_count(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// The batch price against the synchronous one (0.5: half price).
    pub(super) fn price_factor(&self) -> f64 {
        self.adapter.price_factor()
    }

    fn spawn(&self, f: impl std::future::Future<Output = ()> + Send + 'static) {
        let mut tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        while tasks.try_join_next().is_some() {}
        tasks.spawn(f);
    }

    /// Stop every task (the run is over).
    pub(super) fn shutdown(&self) {
        self.detach();
        self.tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .abort_all();
    }

    /// Wait while the operator has the run paused; false when the run
    /// stops creating batches meanwhile.
    async fn wait_unpaused(&self) -> bool {
        let mut rx = self.paused.clone();
        loop {
            if self.stop_forming.is_cancelled() {
                return false;
            }
            if !*rx.borrow_and_update() {
                return true;
            }
            tokio::select! {
                r = rx.changed() => if r.is_err() { return !self.stop_forming.is_cancelled() },
                _ = self.stop_forming.cancelled() => return false,
            }
        }
    }

    /// Unique across the workers of the session: each counts its own
    /// batches, and its id's random part tells them apart.
    fn new_tag(&self) -> String {
        let n = self.next_tag.fetch_add(1, Ordering::Relaxed);
        let worker = self.lease.worker_id.rsplit('#').next().unwrap_or_default();
        format!("{}-b{n}-{worker}", self.session_id)
    }

    /// A line's request as it goes to the provider.
    fn request_for(&self, custom_id: &str, system: Option<String>, user: String) -> ChatRequest {
        let p = self.stage();
        let prompt = crate::template::Prompt {
            system: system.map(Arc::from),
            user,
        };
        // A body that does not parse failed its first send already.
        let body = crate::as_written::request_body(p, &prompt).ok().flatten();
        ChatRequest {
            model: crate::as_written::body_model(p, body.as_deref()),
            system: prompt.system,
            user: prompt.user,
            max_tokens: p.max_tokens,
            temperature: p.temperature,
            response_schema: p.response_schema.clone(),
            structured_output: p.structured_output,
            thinking_budget: p.thinking_budget,
            client_request_id: custom_id.to_string(),
            timeout: p.request_timeout,
            body,
        }
    }

    fn event(&self, level: &'static str, kind: &'static str, message: String) {
        self.writer.post(WriteOp::Event {
            session_id: self.session_id.clone(),
            level,
            kind,
            message,
        });
    }

    /// Record; a failed write stops the run (resumable). A change to a batch
    /// commits only while this worker holds the batch's lease: false when
    /// another worker took it over (this one stalled past its lease), and
    /// the caller lets the batch go.
    async fn write(&self, op: WriteOp) -> bool {
        let fence = match &op {
            WriteOp::Batch(b) => b.tag().map(|tag| Fence::Batch {
                tag: tag.to_string(),
                worker_id: self.lease.worker_id.clone(),
            }),
            _ => None,
        };
        let result = match fence {
            Some(f) => self.writer.write_fenced(op, f).await,
            None => self.writer.write(op).await,
        };
        match result {
            Ok(()) => true,
            Err(WriteError::LeaseLost) => {
                tracing::warn!(session = %self.session_id, "a provider batch's lease was lost: another worker collects it");
                false
            }
            Err(WriteError::Failed(e)) => {
                (self.on_fatal)(e);
                false
            }
        }
    }
}
