//! Human review decisions: who decides, and what a decision did. Several
//! operators may triage the same queue from different SSH logins: a claim
//! is a short lease on one item, and every decision checks, inside one
//! write transaction, that the item is still pending and not held by
//! someone else. Every decision is logged with the decision it replaced, so
//! the last one can be undone, even after a restart.
//!
//! The decisions themselves are written in `decisions`
//! ([`ReviewDecisions`]); this module holds the operator's identity and the
//! types those decisions return.

mod decisions;

use crate::LedgerError;

pub use decisions::ReviewDecisions;

/// The suggestion of a review item whose answers all failed the gate (the
/// JSON `null`): read by the console, refused by an accept.
pub const NO_SUGGESTION: &str = "null";

/// How long a claim holds an item for its operator without a renewal.
pub const CLAIM_LEASE_SECS: f64 = 30.0;

pub use docket_model::operator::Operator;

#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("review item {0} does not exist")]
    NotFound(i64),
    #[error("cannot undo the {action} of item {item_id} (review {review_id}): {why}")]
    UndoConflict {
        review_id: i64,
        item_id: String,
        action: String,
        why: String,
    },
    #[error("cannot undo review log entry {log_id}: {why}")]
    BadLog { log_id: i64, why: String },
    #[error("ledger: {0}")]
    Ledger(#[from] LedgerError),
}

/// What a claim attempt found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Ours now, for [`CLAIM_LEASE_SECS`].
    Held,
    /// Someone else holds an unexpired lease (their claimant string).
    HeldByOther(String),
    /// Already accepted or rejected.
    NotPending,
}

/// What a bulk decision did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    pub done: Vec<i64>,
    /// Review ids left alone, with why (already decided, held by someone).
    pub skipped: Vec<(i64, String)>,
}

/// What `undo_last` reversed: one decision, of one item or of many (a bulk
/// accept or reject is undone whole).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Undone {
    /// The newest item the decision took (the only one, for a single item).
    pub review_id: i64,
    pub item_id: String,
    /// The action undone: `accept` or `reject`.
    pub action: String,
    /// The accept was a correction (the operator's own answer).
    pub corrected: bool,
    /// Every review item the decision took, pending again now.
    pub review_ids: Vec<i64>,
}
