//! The operations the writer applies, and the fences a write is made
//! under: what the engine hands it and what it answers.

use tokio::sync::oneshot;

use docket_model::routing::Outcome;

/// An attempt is about to be sent.
#[derive(Debug, Clone)]
pub struct SendIntent {
    pub session_id: String,
    pub request_id: i64,
    pub attempt: i64,
    pub client_request_id: String,
    pub system_prompt: Option<std::sync::Arc<str>>,
    pub user_prompt: String,
    /// The hash of the evidence the prompts were rendered from
    /// (`WorkItem::evidence_hash`).
    pub evidence_hash: Option<String>,
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
    pub(super) fn answer(&self) {
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
    /// Picked by the audit sample: an accepted or rejected item goes to
    /// review as well (marked `audit`), its outcome unchanged.
    pub audit: bool,
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
