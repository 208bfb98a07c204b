//! The ledger writer: one thread owns the write connection and applies
//! operations in order. Operations that arrive together share one immediate
//! transaction (group commit); each still commits whole with the counters it
//! changes, and its sender hears back only after the commit, so "recorded
//! before the HTTP call" means on disk, not in a queue.
//!
//! Intents (`WriteOp::Send`) go first, in a transaction of their own, and
//! never wait for more writes to join: a request waits for its intent while
//! it holds one of the provider's concurrency slots, so every millisecond an
//! intent waits is a slot standing idle. Everything else (results,
//! heartbeats, events) holds no slot, and waits for the intents and for a
//! fuller group.

use std::sync::Arc;
use std::thread::JoinHandle;

use crate::db::{Connection, OptionalExtension, params};
use tokio::sync::{mpsc, oneshot};

mod counters;

use crate::search_index;
use counters::Counters;
use docket_model::routing::Outcome;

pub use crate::review::NO_SUGGESTION;

/// The most operations one transaction takes.
const GROUP_MAX: usize = 1024;
/// A group smaller than this waits `LINGER` for more writes before it
/// commits (see `run`).
const LINGER_BELOW: usize = 32;
const LINGER: std::time::Duration = std::time::Duration::from_millis(2);

/// An attempt is about to be sent.
#[derive(Debug, Clone)]
pub struct SendIntent {
    pub session_id: String,
    pub request_id: i64,
    pub attempt: i64,
    pub client_request_id: String,
    pub system_prompt: Option<std::sync::Arc<str>>,
    pub user_prompt: String,
}

/// What came back for one attempt.
#[derive(Debug, Clone, Default)]
pub struct AttemptRecord {
    pub session_id: String,
    pub request_id: i64,
    pub attempt: i64,
    /// 'answered', 'failed' or 'ambiguous'
    pub state: &'static str,
    pub output: Option<String>,
    pub finish_reason: Option<String>,
    pub http_status: Option<u16>,
    pub error_kind: Option<String>,
    pub error_message: Option<String>,
    pub provider_request_id: Option<String>,
    pub model_reported: Option<String>,
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    pub cached_input_tokens: Option<u64>,
    pub reasoning_tokens: Option<u64>,
    pub cost_usd: f64,
    pub latency_ms: f64,
    /// Counts toward `retry_count` (transport retries and gate retries).
    pub will_retry: bool,
    pub rate_limited: bool,
    pub gate_failure: bool,
    pub transport_failure: bool,
}

/// A stage of an item is over: its answer passed the gate, or its budgets
/// are spent (and the later stages will never run).
#[derive(Debug, Clone)]
pub struct StageDone {
    pub session_id: String,
    pub item_id: String,
    pub stage: String,
    pub request_id: i64,
    pub passed: bool,
    /// The request's own parsed answer (passed), kept on the request.
    pub parsed_json: Option<String>,
    /// The stage's output for the item: the parsed answer with criteria
    /// asked again merged in (passed).
    pub output_json: Option<String>,
    pub error_message: Option<String>,
    /// Later stages that will not run for this item (failed).
    pub skipped: Vec<String>,
    /// The item's stage row (and checkpoint) moves too; false for a
    /// request whose stage goes on (criteria still to ask one by one).
    pub settle_item: bool,
    /// The request's own status follows `passed`; false when the stage
    /// failed for another request's sake (a criterion asked on its own)
    /// and this one's answer passed and stays reusable.
    pub update_request: bool,
}

/// A request made while a session runs (a criterion asked on its own),
/// with the item's row for it. Answers the request's id, and its parsed
/// answer when an identical one was answered before (reused, not sent).
#[derive(Debug)]
pub struct NewRequest {
    pub session_id: String,
    pub item_id: String,
    pub stage: String,
    pub position: i64,
    pub provider: String,
    pub model: String,
    pub template_hash: String,
    pub params_hash: String,
    pub reply: std::sync::Mutex<Option<RequestReply>>,
    /// What applying it made, held until its transaction commits: a group
    /// rolled back and applied again (a lost connection, a deadlock broken)
    /// makes it again, and only the committed id may reach the caller.
    pub made: std::sync::Mutex<Option<MadeRequest>>,
}

impl NewRequest {
    /// Tell the caller what was made, once it is committed.
    fn answer(&self) {
        let made = self.made.lock().ok().and_then(|mut m| m.take());
        let reply = self.reply.lock().ok().and_then(|mut r| r.take());
        if let (Some(made), Some(reply)) = (made, reply) {
            let _ = reply.send(made);
        }
    }
}

/// Where `NewRequest` answers: the id, and an earlier identical answer.
pub type RequestReply = oneshot::Sender<MadeRequest>;

/// What `NewRequest` made or found: the id, an earlier identical answer,
/// and the attempts already numbered (a new attempt goes after them).
#[derive(Debug, Clone)]
pub struct MadeRequest {
    pub request_id: i64,
    pub answered: Option<String>,
    pub attempts: i64,
}

/// An item's final outcome in a session.
#[derive(Debug, Clone)]
pub struct FinalResult {
    pub session_id: String,
    pub item_id: String,
    /// The answer stage's request (the adjudication id).
    pub request_id: i64,
    /// The answer stage.
    pub stage: String,
    pub outcome: Outcome,
    pub answer_json: Option<String>,
    pub confidence: Option<f64>,
    pub rationale: Option<String>,
    pub model_id: String,
    pub error_message: Option<String>,
    pub critic_json: Option<String>,
    pub critic_verdict: Option<String>,
    /// Why the outcome is what it is when a rule changed it.
    pub routing_note: Option<String>,
    /// The last stage's end, recorded in the same transaction.
    pub stage_done: Option<StageDone>,
    /// The item has one request in the session (a one-stage job, no
    /// criteria asked on their own): its totals are that request's.
    pub only_request: bool,
}

/// The claim a write is made under (see `ledger::queue`). A worker that
/// lost it (it stalled past its lease and another worker took over) has the
/// write refused.
#[derive(Debug, Clone)]
pub enum Fence {
    /// A write for an item: it commits only while the item still has this
    /// token. A refused answer was paid for: it is counted as orphaned spend.
    Item {
        session_id: String,
        item_id: String,
        token: i64,
        worker_id: std::sync::Arc<str>,
    },
    /// A change to a provider batch: only while this worker holds the
    /// batch's lease, so exactly one worker polls and ingests it.
    Batch {
        tag: String,
        worker_id: std::sync::Arc<str>,
    },
}

/// Why a write did not commit.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WriteError {
    /// The fence did not hold: another worker holds the item now.
    #[error("the item's lease was lost (another worker holds it now); this write was refused")]
    LeaseLost,
    #[error("{0}")]
    Failed(String),
}

// Ops move once through a channel to the writer thread; boxing the large
// variants would add an allocation per op for no gain.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum WriteOp {
    Send(SendIntent),
    Attempt(AttemptRecord),
    /// An attempt whose handling panicked (fault-matrix row P6): if it
    /// is still 'sent' (its request may have left and been billed), it
    /// becomes ambiguous with `message`; an attempt already closed stays
    /// as it is.
    Abandon {
        session_id: String,
        request_id: i64,
        attempt: i64,
        message: String,
    },
    /// The attempt record (if any) and the final result, in one transaction.
    Final(Option<AttemptRecord>, FinalResult),
    /// The attempt record (if any) and a stage's end for an item.
    Stage(Option<AttemptRecord>, StageDone),
    Request(NewRequest),
    /// The engine is alive; `live_json` is its gauges (a serialized
    /// `watch::LiveGauges`), kept as they were when None.
    Heartbeat {
        session_id: String,
        live_json: Option<String>,
        /// This worker's row in `session_worker`.
        worker: Option<crate::queue::WorkerBeat>,
    },
    /// Extend every lease this worker holds in the session.
    Renew {
        session_id: String,
        worker_id: std::sync::Arc<str>,
        lease_secs: f64,
    },
    /// Let go of an item this worker claimed but leaves without an outcome
    /// (a stop-after-stage holds it, the run stops): no lease runs out.
    ReleaseItem(Fence),
    /// The worker leaves the session: every item it holds is let go.
    Leave {
        session_id: String,
        worker_id: std::sync::Arc<str>,
    },
    /// Something notable happened to the session (state changes, controls
    /// obeyed, rate limiting); the engine's events have no actor.
    Event {
        session_id: String,
        /// 'info', 'warn' or 'error'
        level: &'static str,
        kind: &'static str,
        message: String,
    },
    /// A provider batch was recorded, submitted, polled, ingested.
    Batch(crate::batches::BatchOp),
    SessionState {
        session_id: String,
        state: &'static str,
        stop_reason: Option<String>,
        completed: bool,
        /// The engine is letting go of the session (its run ended): no owner,
        /// no heartbeat, so another process may resume it at once.
        released: bool,
    },
}

type Reply = oneshot::Sender<Result<(), WriteError>>;
type Queued = (WriteOp, Option<Fence>, Option<Reply>);

#[derive(Clone)]
pub struct LedgerWriter {
    tx: mpsc::UnboundedSender<Queued>,
    health: Arc<Health>,
}

/// A ledger whose disk is full (fault-matrix row D2): the writer keeps the
/// group that could not commit in memory and tries it again every
/// `FULL_RETRY`, so paid answers are not lost to a full disk; every write
/// queued behind it waits, so nothing new is sent. The engine shows it and
/// gives up (`give_up`) when the run is abandoned.
#[derive(Default)]
pub struct Health {
    full: std::sync::Mutex<Option<(std::time::Instant, String)>>,
    held: std::sync::atomic::AtomicUsize,
    give_up: std::sync::atomic::AtomicBool,
    /// Writes held for a full disk and then given up, in all.
    dropped: std::sync::atomic::AtomicUsize,
    /// The writer thread's wait for a write lock another process holds
    /// past the busy timeout (row D1; `db::busy`).
    busy: Arc<crate::db::busy::BusyWatch>,
}

impl Health {
    /// Since when the ledger's disk has been full, why, and how many
    /// writes are held in memory for it.
    pub fn full(&self) -> Option<(std::time::Duration, String, usize)> {
        let full = self.full.lock().unwrap_or_else(|p| p.into_inner());
        full.as_ref().map(|(since, why)| {
            (
                since.elapsed(),
                why.clone(),
                self.held.load(std::sync::atomic::Ordering::Relaxed),
            )
        })
    }

    /// How long the writer has waited for the ledger's write lock, which
    /// another process has held past the busy timeout (row D1): every
    /// write queued meanwhile waits in memory, so nothing new is sent.
    pub fn busy(&self) -> Option<std::time::Duration> {
        self.busy.busy_for()
    }

    /// Writes held for a full disk and then given up (they failed), in all.
    pub fn dropped(&self) -> usize {
        self.dropped.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stop holding: the writes that cannot commit fail (the run is being
    /// abandoned; what they held is counted ambiguous on resume).
    pub fn give_up(&self) {
        self.give_up
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.busy.give_up();
    }

    fn set_full(&self, why: Option<String>, held: usize) {
        let mut full = self.full.lock().unwrap_or_else(|p| p.into_inner());
        match why {
            Some(why) => {
                if full.is_none() {
                    *full = Some((std::time::Instant::now(), why));
                }
                self.held.store(held, std::sync::atomic::Ordering::Relaxed);
            }
            None => {
                *full = None;
                self.held.store(0, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }

    fn giving_up(&self) -> bool {
        self.give_up.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// How often a group that met a full disk is tried again.
const FULL_RETRY: std::time::Duration = std::time::Duration::from_secs(2);
/// How long a full disk is waited for before the writes fail (the run then
/// stops, resumable, exit 6).
const FULL_GIVE_UP: std::time::Duration = std::time::Duration::from_secs(30 * 60);

pub struct WriterHandle {
    thread: Option<JoinHandle<()>>,
}

impl WriterHandle {
    /// Wait for every queued write to commit (all senders must be dropped).
    pub fn join(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl LedgerWriter {
    pub fn start(
        at: impl Into<crate::LedgerLocation>,
    ) -> Result<(LedgerWriter, WriterHandle), crate::LedgerError> {
        let location = at.into();
        let conn = location.connect(false)?;
        if let Some(c) = conn.sqlite() {
            // The writer touches the same hot pages (session row, indexes)
            // in every transaction: a larger cache keeps them out of the
            // read path.
            c.pragma_update(None, "cache_size", -16_384)
                .map_err(crate::LedgerError::Sql)?;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let health = Arc::new(Health::default());
        let writer_health = health.clone();
        let thread = std::thread::Builder::new()
            .name("ledger-writer".into())
            .spawn(move || {
                crate::db::busy::watch_this_thread(writer_health.busy.clone());
                run(conn, rx, &writer_health)
            })
            .map_err(|e| crate::LedgerError::Corrupt {
                path: location.to_string(),
                detail: format!("cannot start writer thread: {e}"),
            })?;
        Ok((
            LedgerWriter { tx, health },
            WriterHandle {
                thread: Some(thread),
            },
        ))
    }

    /// Apply `op` and wait for its commit.
    pub async fn write(&self, op: WriteOp) -> Result<(), String> {
        self.send(op, None).await.map_err(|e| e.to_string())
    }

    /// Apply `op` only while `fence` holds, and wait for its commit.
    pub async fn write_fenced(&self, op: WriteOp, fence: Fence) -> Result<(), WriteError> {
        self.send(op, Some(fence)).await
    }

    async fn send(&self, op: WriteOp, fence: Option<Fence>) -> Result<(), WriteError> {
        let stopped = || WriteError::Failed("ledger writer has stopped".to_string());
        let (reply, rx) = oneshot::channel();
        self.tx
            .send((op, fence, Some(reply)))
            .map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }

    /// Queue `op` without waiting (heartbeats).
    pub fn post(&self, op: WriteOp) {
        let _ = self.tx.send((op, None, None));
    }

    /// Whether the ledger's disk is full (`Health`).
    pub fn health(&self) -> &Health {
        &self.health
    }
}

fn run(mut conn: Connection, mut rx: mpsc::UnboundedReceiver<Queued>, health: &Health) {
    let mut group: Vec<Queued> = Vec::with_capacity(GROUP_MAX);
    let mut search = search_index::Pacer::new();
    let mut intents: Vec<Queued> = Vec::new();
    // The session the writes are for (for the "ledger was busy" event).
    let mut session: Option<String> = None;
    while let Some(first) = rx.blocking_recv() {
        group.push(first);
        collect(&mut rx, &mut group);
        if session.is_none() {
            session = group
                .iter()
                .find_map(|(op, _, _)| session_of(op))
                .map(str::to_string);
        }
        commit_intents(&mut conn, &mut group, &mut intents, &mut search, health);
        if group.is_empty() {
            continue;
        }
        if group.len() < LINGER_BELOW {
            // Light load: a commit per two or three writes costs more than
            // the writes. Wait a moment for the next ones to join.
            std::thread::sleep(LINGER);
            collect(&mut rx, &mut group);
            commit_intents(&mut conn, &mut group, &mut intents, &mut search, health);
        }
        if !group.is_empty() {
            commit_and_answer(&mut conn, &mut group, &mut search, health);
        }
        note_busy(&mut conn, session.as_deref(), &mut search, health);
    }
    // Leave the review search index whole for whoever reads next. If this
    // fails the rows stay noted and the next writer indexes them.
    // Only inside a transaction: indexing the rows and clearing their note
    // must commit together, or a row could be indexed twice.
    if conn.execute_batch("BEGIN IMMEDIATE").is_ok() {
        let indexed = search_index::catch_up(&conn);
        let _ = conn.execute_batch(if indexed.is_ok() {
            "COMMIT"
        } else {
            "ROLLBACK"
        });
    }
    if let Some(c) = conn.sqlite() {
        let _ = c.execute_batch("PRAGMA wal_checkpoint(PASSIVE)");
    }
}

/// Once the writer had to wait for another process's write lock past the
/// busy timeout and got it (row D1), the session's events say so: the
/// log said it while it lasted, the events keep it for the console.
fn note_busy(
    conn: &mut Connection,
    session: Option<&str>,
    search: &mut search_index::Pacer,
    health: &Health,
) {
    let Some(waited) = health.busy.take_ended() else {
        return;
    };
    let Some(session_id) = session else {
        return;
    };
    let event = WriteOp::Event {
        session_id: session_id.to_string(),
        level: "warn",
        kind: "ledger_busy",
        message: format!(
            "ledger busy for {:.1} s: another process held its write lock past the busy timeout; \
             the writes waited in memory and are now written (nothing was sent that the ledger could not record first)",
            waited.as_secs_f64()
        ),
    };
    let _ = apply_group(conn, &[(event, None, None)], search);
}

/// The session an operation writes to, when it names one.
fn session_of(op: &WriteOp) -> Option<&str> {
    match op {
        WriteOp::Send(s) => Some(&s.session_id),
        WriteOp::Attempt(r) | WriteOp::Final(Some(r), _) | WriteOp::Stage(Some(r), _) => {
            Some(&r.session_id)
        }
        WriteOp::Final(None, f) => Some(&f.session_id),
        WriteOp::Stage(None, d) => Some(&d.session_id),
        WriteOp::Request(r) => Some(&r.session_id),
        WriteOp::Abandon { session_id, .. }
        | WriteOp::Heartbeat { session_id, .. }
        | WriteOp::Renew { session_id, .. }
        | WriteOp::Leave { session_id, .. }
        | WriteOp::Event { session_id, .. }
        | WriteOp::SessionState { session_id, .. } => Some(session_id),
        WriteOp::ReleaseItem(Fence::Item { session_id, .. }) => Some(session_id),
        WriteOp::ReleaseItem(Fence::Batch { .. }) | WriteOp::Batch(_) => None,
    }
}

/// Commit the intents (`is_intent`) waiting in `group` first, in a
/// transaction of their own that is durable: an intent is what tells a
/// resume that a request may have been paid for, so it must survive a power
/// loss, not only a process crash (fault-matrix row P7). SQLite's
/// `synchronous = NORMAL` (the ledger's setting, kept for every other
/// commit) can lose the last commits to an OS crash; for this one commit
/// the WAL is synced (`FULL`). PostgreSQL commits are durable as they are.
fn commit_intents(
    conn: &mut Connection,
    group: &mut Vec<Queued>,
    intents: &mut Vec<Queued>,
    search: &mut search_index::Pacer,
    health: &Health,
) {
    intents.extend(group.extract_if(.., |(op, _, _)| is_intent(op)));
    if intents.is_empty() {
        return;
    }
    let sqlite = conn.sqlite().is_some();
    if sqlite {
        let _ = conn.execute_batch("PRAGMA synchronous = FULL");
    }
    commit_and_answer(conn, intents, search, health);
    if sqlite {
        let _ = conn.execute_batch("PRAGMA synchronous = NORMAL");
    }
}

/// A write that must be on disk before a paid side effect: a request's
/// intent, and a provider batch's record with its lines (written before
/// the upload and the create; a batch whose record a power loss took would
/// be created again on resume, its lines paid twice). Every later write of
/// a batch can be lost safely: the batch is found again by its tag.
fn is_intent(op: &WriteOp) -> bool {
    matches!(
        op,
        WriteOp::Send(_)
            | WriteOp::Batch(crate::batches::BatchOp::Create(_))
            | WriteOp::Batch(crate::batches::BatchOp::AddLines { .. })
    )
}

/// How often a group whose transaction lost its connection is applied
/// again (each try first reconnects, for up to two minutes).
const LOST_GROUP_TRIES: usize = 5;
/// How often a group PostgreSQL rolled back to end a deadlock is applied
/// again before its writes fail.
const CONFLICT_TRIES: usize = 20;

/// What applying a group came to.
enum Applied {
    /// Each operation's result.
    Results(Vec<Result<(), WriteError>>),
    /// PostgreSQL ended the transaction to break a deadlock between
    /// writers (`Error::is_conflict`): nothing of the group was applied.
    Conflict(String),
}

/// Apply `group` in one transaction and answer each sender; `group` is
/// left empty. A transaction lost with its connection (PostgreSQL
/// restarted) applied nothing: the group is applied again on the new one.
fn commit_and_answer(
    conn: &mut Connection,
    group: &mut Vec<Queued>,
    search: &mut search_index::Pacer,
    health: &Health,
) {
    let mut tries = 1;
    let mut conflicts = 0;
    let mut full_since: Option<std::time::Instant> = None;
    let mut given_up = false;
    let results = loop {
        let results = match apply_group(conn, group, search) {
            Applied::Results(results) => results,
            Applied::Conflict(why) if conflicts < CONFLICT_TRIES => {
                tracing::debug!("ledger: {why}; applying the write group again");
                conflicts += 1;
                continue;
            }
            Applied::Conflict(why) => {
                let msg = failure(conn, "write failed", &why);
                group
                    .iter()
                    .map(|_| Err(WriteError::Failed(msg.clone())))
                    .collect()
            }
        };
        if conn.take_lost() && tries < LOST_GROUP_TRIES {
            tracing::warn!("ledger: a write group lost its connection; applying it again");
            tries += 1;
            continue;
        }
        // A full disk: nothing of the group was kept. Held in memory and
        // tried again until there is room (row D2).
        let full = results.iter().find_map(|r| match r {
            Err(WriteError::Failed(m)) if disk_full(m) => Some(m.clone()),
            _ => None,
        });
        let Some(why) = full else {
            break results;
        };
        let since = *full_since.get_or_insert_with(std::time::Instant::now);
        if health.giving_up() || since.elapsed() >= FULL_GIVE_UP {
            given_up = true;
            break results;
        }
        if health.full().is_none() {
            tracing::warn!("ledger: {why}; holding {} write(s) in memory", group.len());
        }
        health.set_full(Some(why), group.len());
        std::thread::sleep(FULL_RETRY);
    };
    if full_since.is_some() {
        if given_up {
            health
                .dropped
                .fetch_add(group.len(), std::sync::atomic::Ordering::Relaxed);
        }
        health.set_full(None, 0);
    }
    for ((op, _, reply), result) in group.drain(..).zip(results) {
        if let (WriteOp::Request(r), Ok(())) = (&op, &result) {
            r.answer();
        }
        match reply {
            Some(reply) => {
                let _ = reply.send(result);
            }
            // Nobody waits on a posted write (a heartbeat): its failure is
            // logged, not lost.
            None => {
                if let Err(e) = result {
                    tracing::warn!("ledger: a posted write failed: {e}");
                }
            }
        }
    }
}

/// A write that failed for want of room: the disk (or the file's size
/// limit) is full. SQLite says "database or disk is full" (SQLITE_FULL).
fn disk_full(message: &str) -> bool {
    message.contains("database or disk is full")
}

/// Take what is queued, up to a full group.
fn collect(rx: &mut mpsc::UnboundedReceiver<Queued>, group: &mut Vec<Queued>) {
    while group.len() < GROUP_MAX {
        match rx.try_recv() {
            Ok(op) => group.push(op),
            Err(_) => break,
        }
    }
}

/// Apply a group in one transaction. Usually every operation succeeds, so
/// they are applied straight, with no savepoint each (a fifth of the
/// writer's statements); if one fails, the transaction is rolled back and
/// the group applied again with a savepoint per operation, so that one bad
/// operation never takes the others' writes down with it. A new request
/// answers its caller as it is applied, so a group with one takes the
/// careful path from the start.
fn apply_group(
    conn: &mut Connection,
    group: &[Queued],
    search: &mut search_index::Pacer,
) -> Applied {
    let straight = group.len() > 1
        && !group
            .iter()
            .any(|(op, _, _)| matches!(op, WriteOp::Request(_)));
    if straight && let Some(results) = apply_all_or_none(conn, group, search) {
        return Applied::Results(results);
    }
    apply_each_isolated(conn, group, search)
}

/// Every operation of `group` straight in one transaction; None (and
/// nothing written) if one of them failed.
fn apply_all_or_none(
    conn: &mut Connection,
    group: &[Queued],
    search: &mut search_index::Pacer,
) -> Option<Vec<Result<(), WriteError>>> {
    let tx = conn
        .transaction_with_behavior(crate::db::TransactionBehavior::Concurrent)
        .ok()?;
    let mut results = Vec::with_capacity(group.len());
    let mut counters = Counters::default();
    for (op, fence, _) in group {
        results.push(match apply_fenced(&tx, op, fence.as_ref(), &mut counters) {
            Ok(true) => Ok(()),
            // Refused, with the orphaned spend recorded: that commits.
            Ok(false) => Err(WriteError::LeaseLost),
            Err(_) => return None, // dropping `tx` rolls it back
        });
    }
    counters.write(&tx).ok()?;
    index_new_reviews(&tx, search);
    notify_readers(&tx);
    Some(match tx.commit() {
        Ok(()) => results,
        // Nothing committed: the careful path applies it again.
        Err(e) if e.is_conflict() => return None,
        Err(e) => commit_failed(conn, group, &e),
    })
}

/// What a failed write says: the ledger, the step, the error, and for a
/// disk error what is most likely behind it. The session stops with it,
/// resumable: nothing of a failed transaction was kept.
fn failure(conn: &Connection, step: &str, e: &dyn std::fmt::Display) -> String {
    let text = e.to_string();
    let hint = if text.contains("disk") {
        " (is the disk full, or the file at a size limit? Free space, then resume)"
    } else {
        ""
    };
    match conn.location() {
        Some(at) => format!("ledger {at}: {step}: {text}{hint}"),
        None => format!("ledger: {step}: {text}{hint}"),
    }
}

fn commit_failed(
    conn: &Connection,
    group: &[Queued],
    e: &crate::db::Error,
) -> Vec<Result<(), WriteError>> {
    let msg = failure(conn, "commit failed", e);
    group
        .iter()
        .map(|_| Err(WriteError::Failed(msg.clone())))
        .collect()
}

/// Index the review items this and earlier groups added, when due. In its
/// own savepoint: a failure leaves them noted for a later try and costs the
/// group's writes nothing.
fn index_new_reviews(tx: &Connection, search: &mut search_index::Pacer) {
    let _ = (|| -> crate::db::Result<()> {
        tx.prepare_cached("SAVEPOINT search")?.execute(params![])?;
        let indexed = search.maybe_catch_up(tx);
        if indexed.is_err() {
            tx.prepare_cached("ROLLBACK TO search")?
                .execute(params![])?;
        }
        tx.prepare_cached("RELEASE search")?.execute(params![])?;
        indexed.map(|_| ())
    })();
}

/// Consoles on a PostgreSQL ledger re-read when the group commits (a
/// notification; nothing on SQLite, whose readers poll a counter).
fn notify_readers(tx: &Connection) {
    let _ = tx.notify(crate::postgres::CHANGE_CHANNEL, "");
}

/// `group` with a savepoint per operation (none for a group of one: the
/// transaction is its savepoint).
fn apply_each_isolated(
    conn: &mut Connection,
    group: &[Queued],
    search: &mut search_index::Pacer,
) -> Applied {
    let all_failed = |msg: String| {
        Applied::Results(
            group
                .iter()
                .map(|_| Err(WriteError::Failed(msg.clone())))
                .collect(),
        )
    };
    let tx = match conn.transaction_with_behavior(crate::db::TransactionBehavior::Concurrent) {
        Ok(tx) => tx,
        Err(e) => return all_failed(failure(conn, "cannot begin", &e)),
    };
    let mut results = Vec::with_capacity(group.len());
    // With one operation the transaction itself is its savepoint.
    let isolate = group.len() > 1;
    let mut counters = Counters::default();
    for (op, fence, _) in group {
        // A savepoint per operation: one bad operation never takes the
        // others' writes down with it. (Cached statements: execute_batch
        // would parse the SQL every time, thousands of times a second.)
        let mut mine = Counters::default();
        let r = (|| -> crate::db::Result<bool> {
            if !isolate {
                return apply_fenced(&tx, op, fence.as_ref(), &mut mine);
            }
            tx.prepare_cached("SAVEPOINT op")?.execute(params![])?;
            match apply_fenced(&tx, op, fence.as_ref(), &mut mine) {
                Ok(applied) => tx
                    .prepare_cached("RELEASE op")?
                    .execute(params![])
                    .map(|_| applied),
                Err(e) => {
                    tx.prepare_cached("ROLLBACK TO op")?.execute(params![])?;
                    tx.prepare_cached("RELEASE op")?.execute(params![])?;
                    Err(e)
                }
            }
        })();
        match &r {
            Ok(_) => counters.merge(mine),
            Err(e) if e.is_conflict() => {
                let _ = tx.rollback();
                return Applied::Conflict(e.to_string());
            }
            Err(_) => {}
        }
        results.push(match r {
            Ok(true) => Ok(()),
            // Refused, with the orphaned spend recorded: that commits.
            Ok(false) => Err(WriteError::LeaseLost),
            Err(e) => Err(WriteError::Failed(failure(conn, "write failed", &e))),
        });
    }
    let failed = |r: &Result<(), WriteError>| matches!(r, Err(WriteError::Failed(_)));
    if !isolate && results.iter().any(failed) {
        // The only operation failed: nothing of it may stay.
        let _ = tx.rollback();
        return Applied::Results(results);
    }
    if let Err(e) = counters.write(&tx) {
        // Without its counters nothing of the group may stay.
        let _ = tx.rollback();
        if e.is_conflict() {
            return Applied::Conflict(e.to_string());
        }
        return all_failed(failure(conn, "write failed", &e));
    }
    index_new_reviews(&tx, search);
    notify_readers(&tx);
    if let Err(e) = tx.commit() {
        if e.is_conflict() {
            return Applied::Conflict(e.to_string());
        }
        return Applied::Results(commit_failed(conn, group, &e));
    }
    Applied::Results(results)
}

/// Apply `op` if its fence holds (true), or record what the refused write
/// had paid for as orphaned spend (false).
fn apply_fenced(
    conn: &Connection,
    op: &WriteOp,
    fence: Option<&Fence>,
    counters: &mut Counters,
) -> crate::db::Result<bool> {
    let holds = match fence {
        None => true,
        Some(Fence::Batch { tag, worker_id }) => {
            // Locked until the commit on PostgreSQL (see `queue::current_token`).
            let sql = match conn.dialect() {
                crate::db::Dialect::Sqlite => {
                    "SELECT claimed_by FROM provider_batch WHERE tag = ?1"
                }
                crate::db::Dialect::Postgres => {
                    "SELECT claimed_by FROM provider_batch WHERE tag = ?1 FOR SHARE"
                }
            };
            let holder: Option<Option<String>> = conn
                .prepare_cached(sql)?
                .query_row(params![tag], |r| r.get(0))
                .optional()?;
            holder.flatten().as_deref() == Some(&**worker_id)
        }
        // The item's outcome ends the claim: the lease goes with the check.
        Some(Fence::Item {
            session_id,
            item_id,
            token,
            ..
        }) if matches!(op, WriteOp::Final(..)) => {
            conn.prepare_cached(
                "UPDATE session_item SET lease_until = NULL
                 WHERE session_id = ?1 AND item_id = ?2 AND claim_token = ?3",
            )?
            .execute(params![session_id, item_id, token])?
                == 1
        }
        Some(Fence::Item {
            session_id,
            item_id,
            token,
            ..
        }) => crate::queue::current_token(conn, session_id, item_id)? == Some(*token),
    };
    if holds {
        apply(conn, op, counters)?;
        return Ok(true);
    }
    if let Some(Fence::Item {
        session_id,
        item_id,
        worker_id,
        ..
    }) = fence
    {
        record_orphan(conn, op, session_id, item_id, worker_id, counters)?;
    }
    Ok(false)
}

/// A write refused by its fence. An answer that came back for it was paid
/// for and is never applied: its tokens and cost go on the attempt's row
/// (which the worker that took the item over marked ambiguous) and into the
/// session's orphaned-spend counters.
fn record_orphan(
    conn: &Connection,
    op: &WriteOp,
    session_id: &str,
    item_id: &str,
    worker_id: &str,
    counters: &mut Counters,
) -> crate::db::Result<()> {
    let now = conn.now()?;
    let attempt = match op {
        WriteOp::Attempt(a) => Some(a),
        WriteOp::Final(a, _) | WriteOp::Stage(a, _) => a.as_ref(),
        _ => None,
    };
    // Only an attempt that went out counts: a refused intent sent nothing.
    let Some(a) = attempt.filter(|a| a.state != "failed" || a.http_status.is_some()) else {
        return Ok(());
    };
    conn.prepare_cached(
        "UPDATE llm_messages SET input_tokens = COALESCE(?3, input_tokens), output_tokens = COALESCE(?4, output_tokens),
             cost_usd = ?5, error_message = 'answered after its worker lost the item (lease lost); the result was refused: orphaned spend'
         WHERE request_id = ?1 AND attempt = ?2 AND state != 'answered'",
    )?
    .execute(params![
        a.request_id,
        a.attempt,
        a.input_tokens.map(|v| v as i64),
        a.output_tokens.map(|v| v as i64),
        a.cost_usd
    ])?;
    counters.orphaned(session_id, a.cost_usd);
    conn.prepare_cached("UPDATE session_worker SET orphaned = orphaned + 1 WHERE worker_id = ?1")?
        .execute(params![worker_id])?;
    conn.prepare_cached(
        "INSERT INTO session_event (session_id, at, level, kind, message, actor)
         VALUES (?1, ?2, 'warn', 'lease_lost', ?3, ?4)",
    )?
    .execute(params![
        session_id,
        now,
        format!(
            "item {item_id}: an answer (request {}, attempt {}) came back after this worker lost the item to another; refused and counted as orphaned spend (${:.6})",
            a.request_id, a.attempt, a.cost_usd
        ),
        worker_id
    ])?;
    Ok(())
}

fn apply(conn: &Connection, op: &WriteOp, counters: &mut Counters) -> crate::db::Result<()> {
    let now = conn.now()?;
    match op {
        // One insert: the attempt exists on disk before its request leaves.
        // The request's `attempt` and the session's counters are settled when
        // the attempt closes (a crash leaves it 'sent': see repair_interrupted).
        WriteOp::Send(s) => {
            conn.prepare_cached(
                "INSERT INTO llm_messages (request_id, attempt, session_id, client_request_id, state, system_prompt, user_prompt, sent_at)
                 VALUES (?1, ?2, ?3, ?4, 'sent', ?5, ?6, ?7)",
            )?
            .execute(params![s.request_id, s.attempt, s.session_id, s.client_request_id, s.system_prompt.as_deref(), s.user_prompt, now])?;
            Ok(())
        }
        WriteOp::Abandon {
            session_id,
            request_id,
            attempt,
            message,
        } => {
            let n = conn
                .prepare_cached(
                    "UPDATE llm_messages SET state = 'ambiguous', error_kind = 'ambiguous', error_message = ?3,
                         finished_at = ?4
                     WHERE request_id = ?1 AND attempt = ?2 AND state = 'sent'",
                )?
                .execute(params![request_id, attempt, message, now])?;
            if n == 0 {
                return Ok(());
            }
            conn.prepare_cached(
                "UPDATE llm_requests SET attempt = MAX(attempt, ?2), last_error = ?3, updated_at = ?4
                 WHERE request_id = ?1",
            )?
            .execute(params![request_id, attempt, message, now])?;
            counters.abandoned(session_id);
            Ok(())
        }
        WriteOp::Attempt(a) => {
            close_attempt(conn, a, now)?;
            conn.prepare_cached(
                "UPDATE llm_requests SET attempt = MAX(attempt, ?2), transport_retries = transport_retries + ?3,
                     gate_failures = gate_failures + ?4, last_error = COALESCE(?5, last_error), updated_at = ?6
                 WHERE request_id = ?1",
            )?
            .execute(params![a.request_id, a.attempt, a.transport_failure as i64, a.gate_failure as i64, a.error_message, now])?;
            counters.attempt(&a.session_id, Some(a), None);
            Ok(())
        }
        WriteOp::Final(attempt, f) => apply_final(conn, attempt.as_ref(), f, now, counters),
        WriteOp::Stage(attempt, d) => {
            if let Some(a) = attempt {
                close_attempt(conn, a, now)?;
            }
            apply_stage_done(conn, attempt.as_ref(), d, now, counters)?;
            counters.attempt(&d.session_id, attempt.as_ref(), None);
            Ok(())
        }
        WriteOp::Request(r) => {
            let made = apply_new_request(conn, r, now)?;
            if let Ok(mut m) = r.made.lock() {
                *m = Some(made);
            }
            Ok(())
        }
        WriteOp::Batch(b) => crate::batches::apply(conn, b, now),
        WriteOp::Heartbeat {
            session_id,
            live_json,
            worker,
        } => {
            // The session's row at the end of the transaction, with the
            // counters (see `counters`); the worker's own row now.
            counters.beat(session_id, live_json.as_deref());
            if let Some(w) = worker {
                crate::queue::beat(conn, session_id, w)?;
            }
            Ok(())
        }
        WriteOp::Renew {
            session_id,
            worker_id,
            lease_secs,
        } => crate::queue::renew(conn, session_id, worker_id, *lease_secs).map(|_| ()),
        WriteOp::ReleaseItem(Fence::Item {
            session_id,
            item_id,
            token,
            ..
        }) => {
            conn.prepare_cached(
                "UPDATE session_item SET lease_until = NULL
                 WHERE session_id = ?1 AND item_id = ?2 AND claim_token = ?3",
            )?
            .execute(params![session_id, item_id, token])?;
            Ok(())
        }
        WriteOp::ReleaseItem(Fence::Batch { .. }) => Ok(()),
        WriteOp::Leave {
            session_id,
            worker_id,
        } => {
            crate::queue::release_all(conn, session_id, worker_id)?;
            crate::queue::worker_ended(conn, worker_id)
        }
        WriteOp::Event {
            session_id,
            level,
            kind,
            message,
        } => {
            conn.prepare_cached(
                "INSERT INTO session_event (session_id, at, level, kind, message, actor)
                 VALUES (?1, ?2, ?3, ?4, ?5, NULL)",
            )?
            .execute(params![session_id, now, level, kind, message])?;
            Ok(())
        }
        WriteOp::SessionState {
            session_id,
            state,
            stop_reason,
            completed,
            released,
        } => {
            conn.prepare_cached(
                "UPDATE llm_batch_session SET state = ?2, stop_reason = ?3,
                     completed_at = CASE WHEN ?4 THEN ?5 ELSE completed_at END,
                     desired_state = CASE WHEN ?2 IN ('completed', 'cancelled', 'error') AND desired_state = 'paused' THEN 'running' ELSE desired_state END,
                     owner_pid = CASE WHEN ?6 THEN NULL ELSE owner_pid END,
                     heartbeat_at = CASE WHEN ?6 THEN NULL ELSE heartbeat_at END,
                     updated_at = ?5
                 WHERE session_id = ?1",
            )?
            .execute(params![session_id, state, stop_reason, completed, now, released])?;
            Ok(())
        }
    }
}

/// Record what came back for one attempt on its message row.
fn close_attempt(conn: &Connection, a: &AttemptRecord, now: f64) -> crate::db::Result<()> {
    let total = match (a.input_tokens, a.output_tokens) {
        (None, None) => None,
        (i, o) => Some(i.unwrap_or(0) + o.unwrap_or(0)),
    };
    conn.prepare_cached(
        "UPDATE llm_messages SET state = ?3, assistant_output = ?4, finish_reason = ?5, http_status = ?6,
             error_kind = ?7, error_message = ?8, provider_request_id = ?9, model_reported = ?10,
             input_tokens = ?11, output_tokens = ?12, total_tokens = ?13, cached_input_tokens = ?14,
             reasoning_tokens = ?15, cost_usd = ?16, latency_ms = ?17, finished_at = ?18
         WHERE request_id = ?1 AND attempt = ?2",
    )?
    .execute(params![
        a.request_id,
        a.attempt,
        a.state,
        a.output,
        a.finish_reason,
        a.http_status,
        a.error_kind,
        a.error_message,
        a.provider_request_id,
        a.model_reported,
        a.input_tokens.map(|v| v as i64),
        a.output_tokens.map(|v| v as i64),
        total.map(|v| v as i64),
        a.cached_input_tokens.map(|v| v as i64),
        a.reasoning_tokens.map(|v| v as i64),
        a.cost_usd,
        a.latency_ms,
        now
    ])?;
    Ok(())
}

/// A stage's end: its request, the item's stage row, the stage checkpoint,
/// and the later stages that will not run.
fn apply_stage_done(
    conn: &Connection,
    attempt: Option<&AttemptRecord>,
    d: &StageDone,
    now: f64,
    counters: &mut Counters,
) -> crate::db::Result<()> {
    // The answer that passed is the attempt just closed (or, for a reused
    // answer, the one already linked).
    let passed_attempt = attempt.filter(|_| d.passed).map(|a| a.attempt);
    if d.update_request {
        conn.prepare_cached(
        "UPDATE llm_requests SET status = ?2, parsed_output_json = COALESCE(?3, parsed_output_json),
             result_message_id = COALESCE((SELECT message_id FROM llm_messages WHERE request_id = ?1 AND attempt = ?4), result_message_id),
             attempt = MAX(attempt, COALESCE(?5, 0)),
             transport_retries = transport_retries + ?6, gate_failures = gate_failures + ?7,
             last_error = COALESCE(?8, last_error), updated_at = ?9
         WHERE request_id = ?1",
    )?
    .execute(params![
        d.request_id,
        if d.passed { "completed" } else { "error" },
        d.parsed_json,
        passed_attempt,
        attempt.map(|a| a.attempt),
        attempt.is_some_and(|a| a.transport_failure) as i64,
        attempt.is_some_and(|a| a.gate_failure) as i64,
        d.error_message.as_ref().or(attempt.and_then(|a| a.error_message.as_ref())),
        now
    ])?;
    }
    if !d.settle_item {
        return Ok(());
    }
    let state = if d.passed { "passed" } else { "failed" };
    let changed = conn
        .prepare_cached(
            "UPDATE session_request SET state = ?4, output_json = ?5, updated_at = ?6
             WHERE session_id = ?1 AND item_id = ?2 AND stage = ?3 AND state = 'pending'",
        )?
        .execute(params![
            d.session_id,
            d.item_id,
            d.stage,
            state,
            d.output_json,
            now
        ])?;
    if changed > 0 {
        counters.stage(
            &d.session_id,
            &d.stage,
            d.passed as i64,
            (!d.passed) as i64,
            0,
        );
    }
    for later in &d.skipped {
        let n = conn
            .prepare_cached(
                "UPDATE session_request SET state = 'skipped', updated_at = ?4
                 WHERE session_id = ?1 AND item_id = ?2 AND stage = ?3 AND state = 'pending'",
            )?
            .execute(params![d.session_id, d.item_id, later, now])?;
        if n > 0 {
            counters.stage(&d.session_id, later, 0, 0, 1);
        }
    }
    Ok(())
}

fn apply_new_request(
    conn: &Connection,
    r: &NewRequest,
    now: f64,
) -> crate::db::Result<MadeRequest> {
    let newest: Option<(i64, i64, String, String, String, Option<String>)> = conn
        .prepare_cached(
            "SELECT request_id, request_version, status, template_hash, params_hash, parsed_output_json
             FROM llm_requests WHERE item_id = ?1 AND stage = ?2 AND provider = ?3 AND model = ?4
             ORDER BY request_version DESC LIMIT 1",
        )?
        .query_row(params![r.item_id, r.stage, r.provider, r.model], |x| {
            Ok((x.get(0)?, x.get(1)?, x.get(2)?, x.get(3)?, x.get(4)?, x.get(5)?))
        })
        .optional()?;
    let (id, answered) = match newest {
        Some((id, _, status, th, ph, parsed))
            if status == "completed" && th == r.template_hash && ph == r.params_hash =>
        {
            (id, parsed)
        }
        Some((id, _, status, _, _, _)) if status != "completed" => {
            conn.prepare_cached(
                "UPDATE llm_requests SET status = 'pending', gate_failures = 0, transport_retries = 0,
                     template_hash = ?2, params_hash = ?3, updated_at = ?4 WHERE request_id = ?1",
            )?
            .execute(params![id, r.template_hash, r.params_hash, now])?;
            (id, None)
        }
        newest => {
            let version = newest.map_or(1, |n| n.1 + 1);
            let id = conn
                .prepare_cached(
                    "INSERT INTO llm_requests (item_id, stage, provider, model, request_version, status, template_hash, params_hash, created_at, updated_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, 'pending', ?6, ?7, ?8, ?8) RETURNING request_id",
                )?
                .query_row(
                    params![r.item_id, r.stage, r.provider, r.model, version, r.template_hash, r.params_hash, now],
                    |x| x.get(0),
                )?;
            (id, None)
        }
    };
    conn.prepare_cached(
        "INSERT INTO session_request (session_id, item_id, stage, position, request_id, state, output_json, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, 'pending', NULL, ?6)
         ON CONFLICT (session_id, item_id, stage) DO UPDATE SET request_id = excluded.request_id, updated_at = excluded.updated_at",
    )?
    .execute(params![r.session_id, r.item_id, r.stage, r.position, id, now])?;
    let attempts: i64 = conn
        .prepare_cached(
            "SELECT MAX(r.attempt, (SELECT COALESCE(MAX(m.attempt), 0) FROM llm_messages m WHERE m.request_id = r.request_id))
             FROM llm_requests r WHERE r.request_id = ?1",
        )?
        .query_row(params![id], |x| x.get(0))?;
    Ok(MadeRequest {
        request_id: id,
        answered,
        attempts,
    })
}

fn apply_final(
    conn: &Connection,
    attempt: Option<&AttemptRecord>,
    f: &FinalResult,
    now: f64,
    counters: &mut Counters,
) -> crate::db::Result<()> {
    if let Some(a) = attempt {
        close_attempt(conn, a, now)?;
    }
    if let Some(d) = &f.stage_done {
        apply_stage_done(conn, attempt, d, now, counters)?;
    }
    // Every attempt of every stage of the item in this session. `+session_id`
    // keeps the planner on the request_id index: the session index would
    // scan every message of the session for each result.
    let (attempts, input, output, cost): (i64, i64, i64, f64) = if f.only_request {
        // One request for the item (a one-stage job): straight off its index.
        conn.prepare_cached(
            "SELECT COUNT(*), COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0), COALESCE(SUM(cost_usd), 0)
             FROM llm_messages WHERE request_id = ?1 AND +session_id = ?2",
        )?
        .query_row(params![f.request_id, f.session_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
    } else {
        conn.prepare_cached(
            "SELECT COUNT(m.message_id), COALESCE(SUM(m.input_tokens), 0), COALESCE(SUM(m.output_tokens), 0),
                    COALESCE(SUM(m.cost_usd), 0)
             FROM session_request sr JOIN llm_messages m ON m.request_id = sr.request_id AND +m.session_id = sr.session_id
             WHERE sr.session_id = ?2 AND sr.item_id = ?1",
        )?
        .query_row(params![f.item_id, f.session_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
    };
    let adjudication_id = f.request_id.to_string();
    // The primary key (session_id, item_id) makes a second result for the
    // same item a hard error: at most one recorded result, ever.
    conn.prepare_cached(
        "INSERT INTO llm_batch_result (session_id, item_id, processed_at, outcome, answer_json, confidence, rationale,
             model_id, error_message, adjudication_id, stage, request_id, attempts, input_tokens, output_tokens, cost_usd,
             critic_json, critic_verdict, routing_note)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19)",
    )?
    .execute(params![
        f.session_id,
        f.item_id,
        now,
        f.outcome.as_str(),
        f.answer_json,
        f.confidence,
        f.rationale,
        f.model_id,
        f.error_message,
        adjudication_id,
        f.stage,
        f.request_id,
        attempts,
        input,
        output,
        cost,
        f.critic_json,
        f.critic_verdict,
        f.routing_note
    ])?;
    counters.attempt(&f.session_id, attempt, Some(f.outcome));
    match f.outcome {
        Outcome::Accepted => {
            // Never overwrite a decision someone made meanwhile.
            conn.prepare_cached(
                "UPDATE decision SET state = 'decided', decided_answer_json = ?2, decided_by = 'llm_auto_accept',
                     decided_at = ?3, confidence = ?4, model_id = ?5, adjudication_id = ?6, updated_at = ?3
                 WHERE item_id = ?1 AND state = 'indeterminate'",
            )?
            .execute(params![f.item_id, f.answer_json, now, f.confidence, f.model_id, adjudication_id])?;
        }
        Outcome::Review => {
            conn.prepare_cached(
                "INSERT INTO review_item (item_id, session_id, source, status, llm_suggestion_json, confidence, rationale,
                     model_id, request_id, created_at)
                 VALUES (?1, ?2, 'LLM_REVIEW', 'pending', ?3, ?4, ?5, ?6, ?7, ?8)
                 ON CONFLICT (session_id, item_id) DO NOTHING",
            )?
            .execute(params![
                f.item_id,
                f.session_id,
                // No answer passed the gate (row S7): nothing to accept.
                f.answer_json.as_deref().unwrap_or(NO_SUGGESTION),
                f.confidence,
                f.rationale,
                f.model_id,
                f.request_id,
                now
            ])?;
        }
        Outcome::Rejected | Outcome::Error => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::store;

    /// A new ledger at `path` with session "s1" (one stage, no items).
    fn ledger_with_session(path: &Path) -> Connection {
        let mut conn = Connection::Sqlite(crate::open(path).unwrap());
        store::create_session(
            &mut conn,
            &store::NewSession {
                session_id: "s1",
                config_snapshot_json: "{}",
                stages: &[store::NewStage {
                    name: "adjudicate",
                    provider: "main",
                    model: "m",
                    template_hash: "t",
                    params_hash: "p",
                    critic_of: None,
                    rerun: false,
                }],
                estimated_tokens: 0,
                estimated_cost_usd: 0.0,
                max_cost_usd: None,
                item_ids: &[],
            },
        )
        .unwrap();
        conn
    }

    fn event(message: &str) -> Queued {
        let op = WriteOp::Event {
            session_id: "s1".into(),
            level: "info",
            kind: "note",
            message: message.into(),
        };
        (op, None, None)
    }

    /// A group is applied straight when every operation succeeds, and again
    /// with a savepoint each when one fails: the others still commit, and
    /// nothing of the failed one stays.
    #[test]
    fn one_failing_operation_never_takes_its_group_down() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("docket.sqlite");
        let mut conn = ledger_with_session(&path);
        let mut search = search_index::Pacer::new();
        let events = |conn: &Connection| -> Vec<String> {
            let mut stmt = conn
                .prepare("SELECT message FROM session_event ORDER BY event_id")
                .unwrap();
            stmt.query_map(params![], |r| r.get(0))
                .unwrap()
                .map(Result::unwrap)
                .collect()
        };

        let all_good = [event("a"), event("b")];
        let Applied::Results(results) = apply_group(&mut conn, &all_good, &mut search) else {
            panic!("no conflict on SQLite")
        };
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        assert_eq!(events(&conn), ["a", "b"]);

        // An attempt of a request that does not exist breaks a foreign key.
        let orphan = WriteOp::Send(SendIntent {
            session_id: "s1".into(),
            request_id: 404,
            attempt: 1,
            client_request_id: "s1-404-1".into(),
            system_prompt: None,
            user_prompt: "hello".into(),
        });
        let mixed = [event("c"), (orphan, None, None), event("d")];
        let Applied::Results(results) = apply_group(&mut conn, &mixed, &mut search) else {
            panic!("no conflict on SQLite")
        };
        assert!(results[0].is_ok() && results[2].is_ok(), "{results:?}");
        assert!(
            matches!(&results[1], Err(WriteError::Failed(m)) if m.contains("FOREIGN KEY")),
            "{results:?}"
        );
        assert_eq!(events(&conn), ["a", "b", "c", "d"]);
        let messages: i64 = conn
            .query_row("SELECT COUNT(*) FROM llm_messages", params![], |r| r.get(0))
            .unwrap();
        assert_eq!(messages, 0);
    }

    /// A request holds a provider slot while its intent waits, so intents
    /// queued behind other writes commit first, in a transaction of their
    /// own, and every sender still hears back.
    #[test]
    fn intents_commit_before_the_other_writes_of_their_group() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("docket.sqlite");
        let conn = ledger_with_session(&path);
        conn.execute_batch(
            "INSERT INTO decision (item_id, evidence_json, imported_at, updated_at)
                 VALUES ('i1', '{}', 0, 0);
             INSERT INTO llm_requests (request_id, item_id, stage, provider, model, request_version,
                 status, template_hash, params_hash, created_at, updated_at)
                 VALUES (7, 'i1', 'adjudicate', 'main', 'm', 1, 'pending', 't', 'p', 0, 0);",
        )
        .unwrap();
        // Triggers log each insert in the order the writer makes them.
        conn.execute_batch(
            "CREATE TABLE write_order (seq INTEGER PRIMARY KEY, what TEXT);
             CREATE TRIGGER intent_written AFTER INSERT ON llm_messages
                 BEGIN INSERT INTO write_order (what) VALUES ('intent ' || NEW.attempt); END;
             CREATE TRIGGER event_written AFTER INSERT ON session_event
                 BEGIN INSERT INTO write_order (what) VALUES ('event ' || NEW.message); END;",
        )
        .unwrap();
        let intent = |attempt: i64| {
            WriteOp::Send(SendIntent {
                session_id: "s1".into(),
                request_id: 7,
                attempt,
                client_request_id: format!("s1-7-{attempt}"),
                system_prompt: None,
                user_prompt: "hello".into(),
            })
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let mut answers = Vec::new();
        for op in [event("a").0, intent(1), event("b").0, intent(2)] {
            let (reply, answer) = oneshot::channel();
            tx.send((op, None, Some(reply))).unwrap();
            answers.push(answer);
        }
        drop(tx);
        // All four are queued before the writer starts, so they form one
        // group; the writer returns once the channel is empty and closed.
        run(
            Connection::Sqlite(crate::open(&path).unwrap()),
            rx,
            &Health::default(),
        );
        for mut answer in answers {
            assert!(matches!(answer.try_recv(), Ok(Ok(()))));
        }
        let mut stmt = conn
            .prepare("SELECT what FROM write_order ORDER BY seq")
            .unwrap();
        let order: Vec<String> = stmt
            .query_map(params![], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(order, ["intent 1", "intent 2", "event a", "event b"]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn heartbeat_gauges_events_and_controls_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("docket.sqlite");
        let conn = ledger_with_session(&path);
        let (writer, handle) = LedgerWriter::start(&path).unwrap();
        let hb = |live: Option<&str>| WriteOp::Heartbeat {
            session_id: "s1".into(),
            live_json: live.map(str::to_string),
            worker: None,
        };
        writer.write(hb(Some("{\"in_flight\":3}"))).await.unwrap();
        // A heartbeat without gauges keeps the last ones.
        writer.write(hb(None)).await.unwrap();
        writer
            .write(WriteOp::Event {
                session_id: "s1".into(),
                level: "warn",
                kind: "paused",
                message: "paused by operator".into(),
            })
            .await
            .unwrap();
        drop(writer);
        tokio::task::block_in_place(|| handle.join());
        let (live, hb_at): (Option<String>, Option<f64>) = conn
            .query_row(
                "SELECT live_json, heartbeat_at FROM llm_batch_session WHERE session_id = 's1'",
                params![],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(live.as_deref(), Some("{\"in_flight\":3}"));
        assert!(crate::now_ts() - hb_at.unwrap() < 5.0);
        let ev: (String, String, String, Option<String>) = conn
            .query_row(
                "SELECT level, kind, message, actor FROM session_event WHERE session_id = 's1'",
                params![],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .unwrap();
        assert_eq!(
            ev,
            (
                "warn".into(),
                "paused".into(),
                "paused by operator".into(),
                None
            )
        );

        // Controls: NULL tune columns are None; a negative one reads as unset.
        let c = store::session_controls(&conn, "s1").unwrap().unwrap();
        assert_eq!(c.desired_state, "running");
        assert_eq!(c.stop_after_stage, None);
        assert_eq!(c.tune, docket_model::live::Tune::default());
        conn.execute(
            "UPDATE llm_batch_session SET desired_state = 'paused', stop_after_stage = 'adjudicate',
                 tune_rpm = 1200, tune_tpm = -5, tune_concurrency = 3 WHERE session_id = 's1'",
            params![],
        )
        .unwrap();
        let c = store::session_controls(&conn, "s1").unwrap().unwrap();
        assert_eq!(c.desired_state, "paused");
        assert_eq!(c.stop_after_stage.as_deref(), Some("adjudicate"));
        assert_eq!(
            c.tune,
            docket_model::live::Tune {
                rpm: Some(1200),
                tpm: None,
                concurrency: Some(3)
            }
        );
        assert_eq!(store::session_controls(&conn, "nope").unwrap(), None);
    }
}
