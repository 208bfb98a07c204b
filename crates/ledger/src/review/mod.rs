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

/// How long a claim holds an item for its operator without a renewal.
pub const CLAIM_LEASE_SECS: f64 = 30.0;

/// Who is deciding: `user` is recorded in the ledger (`review:<user>`);
/// `claimant` tells two consoles of the same user apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator {
    pub user: String,
    pub claimant: String,
}

impl Operator {
    /// The operator of this process: `$USER` and `user@host:pid`.
    pub fn current() -> Self {
        // $USER, else $LOGNAME, else the uid: two operators must never
        // merge into one "unknown" (they would share an undo history).
        let user = ["USER", "LOGNAME"]
            .iter()
            .filter_map(|v| std::env::var(v).ok())
            .map(|u| docket_model::sanitize::for_terminal(u.trim()))
            .find(|u| !u.is_empty())
            .or_else(uid)
            .unwrap_or_else(|| "unknown".to_string());
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".to_string());
        let claimant = format!("{user}@{host}:{}", std::process::id());
        Operator { user, claimant }
    }

    pub fn new(user: impl Into<String>, claimant: impl Into<String>) -> Self {
        Operator {
            user: user.into(),
            claimant: claimant.into(),
        }
    }

    /// What the ledger records as the decider: `review:<user>`.
    pub fn actor(&self) -> String {
        format!("review:{}", self.user)
    }
}

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

/// What `undo_last` reversed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Undone {
    pub review_id: i64,
    pub item_id: String,
    /// The action undone: `accept` or `reject`.
    pub action: String,
}

/// `uid:N` from /proc, for a process with no user name in its environment.
fn uid() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    let id = line.split_whitespace().nth(1)?;
    Some(format!("uid:{id}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operator_names() {
        let op = Operator::new("alice", "alice@box:1");
        assert_eq!(op.actor(), "review:alice");
        let me = Operator::current();
        assert!(!me.user.is_empty());
        assert!(me.claimant.starts_with(&format!("{}@", me.user)));
        assert!(me.claimant.ends_with(&format!(":{}", std::process::id())));
    }
}
