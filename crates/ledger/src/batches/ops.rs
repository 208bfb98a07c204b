//! The changes to a provider batch the engine hands the writer.

use docket_model::batch::Quarantined;

/// One line of a new batch: an attempt of a request, with its prompt (the
/// attempt's `llm_messages` row is written with the batch, state 'sent').
#[derive(Debug, Clone)]
pub struct NewBatchLine {
    pub custom_id: String,
    pub request_id: i64,
    pub attempt: i64,
    pub system_prompt: Option<std::sync::Arc<str>>,
    pub user_prompt: String,
    /// The hash of the evidence the prompts were rendered from
    /// (`WorkItem::evidence_hash`).
    pub evidence_hash: Option<String>,
    /// The item the line's worker held (its id and claim token): let go as
    /// the line is recorded, since the batch's lease covers it from then on
    /// and its result comes to whoever holds the batch.
    pub release: Option<(String, i64)>,
}

#[derive(Debug, Clone)]
pub struct NewBatch {
    pub tag: String,
    pub session_id: String,
    pub stage: String,
    pub provider: String,
    pub provider_kind: String,
    pub model: String,
    pub input_bytes: u64,
    /// Every line the batch will carry (`lines` may be the first of them:
    /// the rest follow in `AddLines`, before anything is uploaded).
    pub request_count: u64,
    pub lines: Vec<NewBatchLine>,
    /// The worker that submits it and holds its lease (see `adopt`).
    pub claimed_by: String,
    pub lease_until: f64,
}

/// A change to a provider batch.
#[derive(Debug, Clone)]
pub enum BatchOp {
    /// The batch, its lines and their attempts, before anything is uploaded.
    Create(NewBatch),
    /// More lines of a batch being recorded (recorded in pieces as they
    /// come, so no batch's prompts are ever held whole), and the batch's
    /// totals with them.
    AddLines {
        tag: String,
        session_id: String,
        lines: Vec<NewBatchLine>,
        request_count: u64,
        input_bytes: u64,
    },
    /// The create answered: the provider's id, stored at once.
    Submitted {
        tag: String,
        provider_batch_id: String,
        input_file_id: Option<String>,
    },
    /// A poll's answer (or a state docket decided: 'unknown', 'failed' at
    /// submit). `ended` marks the provider's terminal state.
    Status {
        tag: String,
        state: String,
        completed: u64,
        failed: u64,
        output_ref: Option<String>,
        error_ref: Option<String>,
        error_message: Option<String>,
        next_poll_at: Option<f64>,
        polled: bool,
        ended: bool,
    },
    /// A poll failed: only when the next one is due changes.
    NextPoll {
        tag: String,
        next_poll_at: f64,
    },
    CancelRequested {
        tag: String,
    },
    /// Result lines handed to their requests, and the lines put aside.
    Ingested {
        tag: String,
        delivered: u64,
        quarantined: Vec<Quarantined>,
        quarantined_more: u64,
    },
    /// Finished with, once no line's attempt is still waiting ('sent').
    Settle {
        tag: String,
    },
}

impl BatchOp {
    /// The batch an existing batch's change is about (None: a new batch).
    pub fn tag(&self) -> Option<&str> {
        match self {
            BatchOp::Create(_) => None,
            BatchOp::AddLines { tag, .. }
            | BatchOp::Submitted { tag, .. }
            | BatchOp::Status { tag, .. }
            | BatchOp::NextPoll { tag, .. }
            | BatchOp::CancelRequested { tag }
            | BatchOp::Ingested { tag, .. }
            | BatchOp::Settle { tag } => Some(tag),
        }
    }
}
