//! What a provider says about a batch: where it is in its life, its
//! counts, each result line's outcome, the summary of a read, and what
//! `find` learned about a lost create.

use crate::{ChatAnswer, ProviderError};

/// Where a batch is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchState {
    Validating,
    InProgress,
    /// Done running; results are being prepared. Not 100% yet.
    Finalizing,
    Completed,
    /// Rejected as a whole (its input failed validation, a limit at create).
    Failed(String),
    /// The window ran out: finished requests have results, the rest do not.
    Expired,
    Cancelling,
    Cancelled,
}

impl BatchState {
    /// No further change will come; results (if any) can be fetched.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            BatchState::Completed
                | BatchState::Failed(_)
                | BatchState::Expired
                | BatchState::Cancelled
        )
    }

    pub fn as_str(&self) -> &str {
        match self {
            BatchState::Validating => "validating",
            BatchState::InProgress => "in_progress",
            BatchState::Finalizing => "finalizing",
            BatchState::Completed => "completed",
            BatchState::Failed(_) => "failed",
            BatchState::Expired => "expired",
            BatchState::Cancelling => "cancelling",
            BatchState::Cancelled => "cancelled",
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchCounts {
    pub total: u64,
    pub completed: u64,
    pub failed: u64,
}

/// One poll's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchStatus {
    pub provider_batch_id: String,
    pub state: BatchState,
    pub counts: BatchCounts,
    /// Where the results are, once they exist (OpenAI output/error file
    /// ids, an Anthropic results URL, a Gemini file name).
    pub output_ref: Option<String>,
    pub error_ref: Option<String>,
    /// Terminal, but the results are not there yet (an output file that
    /// arrives after `completed`): poll again, do not ingest.
    pub results_pending: bool,
}

/// What one result line says about its request.
#[derive(Debug, Clone)]
pub enum LineOutcome {
    /// The model answered (the gate decides the rest).
    Answer(ChatAnswer),
    /// The request failed at the provider (classified as a sync error would be).
    Error(ProviderError),
    /// Never run (expired or cancelled before its turn): not billed; it
    /// goes back to pending for a new batch or the sync path.
    NotRun(String),
}

#[derive(Debug, Clone)]
pub struct ResultLine {
    pub custom_id: String,
    pub outcome: LineOutcome,
}

pub use docket_model::batch::Quarantined;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResultsSummary {
    pub lines: u64,
    pub delivered: u64,
    pub quarantined: Vec<Quarantined>,
    /// Quarantined lines past the first `results::MAX_QUARANTINE_KEPT`:
    /// counted, their reasons not kept.
    pub quarantined_more: u64,
    /// The stream ended mid-line or early: what was delivered stands; the
    /// rest must be fetched again (and `missing` is not worked out).
    pub cut: bool,
    /// Expected ids with no result line at all after a whole read of a
    /// Completed or Failed batch, sorted. The provider said nothing about
    /// them: the caller decides (run them again, or ask). For an Expired or
    /// Cancelled batch such ids are listed here only by a provider that
    /// writes a line for every request (Anthropic); others deliver each as
    /// `LineOutcome::NotRun` (and count it in `delivered`).
    pub missing: Vec<String>,
}

/// What `find` learned about a submission whose outcome is unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// Exactly one batch is ours: record it, never resubmit.
    One(String),
    /// None of the provider's batches is ours: safe to submit.
    None,
    /// Several could be ours and cannot be told apart: wait and tell the
    /// operator rather than pay twice.
    Ambiguous(Vec<String>),
}

/// One exact match is ours; none at all is safe to submit; anything else
/// (several, or our tag with another count) cannot be told apart. `unknown`
/// are batches with nothing to check them by (an Azure api-version that
/// drops metadata): any of them could be ours, so with no match they are
/// Ambiguous, never None (beside one exact match, metadata is evidently
/// kept, and they are someone else's).
pub(crate) fn verdict(
    mut exact: Vec<String>,
    tag_only: Vec<String>,
    unknown: Vec<String>,
) -> Found {
    match (exact.len(), tag_only.len(), unknown.len()) {
        (0, 0, 0) => Found::None,
        (1, 0, _) => Found::One(exact.remove(0)),
        (0, 0, _) => Found::Ambiguous(unknown),
        _ => Found::Ambiguous(exact.into_iter().chain(tag_only).collect()),
    }
}
