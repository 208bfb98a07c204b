//! The work queue: every worker process claims a session's items from the
//! ledger, page by page, with a lease and a fencing token.
//!
//! - A claim sets `claimed_by`, `lease_until` and a `claim_token` one higher
//!   than any before it, in one write transaction, so two workers never hold
//!   the same item.
//! - The worker renews its leases while it works. Everything it writes for
//!   an item carries the token it claimed with, and the writer commits it
//!   only while the row still has that token (`writer::Fence`): a worker that
//!   stalled past its lease and was taken over has its late writes refused,
//!   counted as orphaned spend, never doubled.
//! - A claim that takes over an item another worker held marks that
//!   worker's attempts still marked 'sent' ambiguous (they may have been
//!   billed) before the item is sent again.
//! - Workers on this host whose process is gone lose their leases at once;
//!   elsewhere a lease runs out on its own.

mod claims;
mod leases;
mod repair;
mod workers;

pub(crate) use claims::{claim_page, claim_requests};
pub(crate) use leases::{
    current_token, expire_dead_local_workers, held_by_others, release_all, renew,
};
pub use repair::Repair;
pub(crate) use repair::repair_interrupted;
pub use workers::{WorkerBeat, WorkerRow};
pub(crate) use workers::{beat, live_workers, others_gauges, worker_ended, workers};

/// Seconds a worker's heartbeat may be old and the worker still count as
/// alive (it beats every 400 ms).
pub const WORKER_LIVE_SECS: f64 = 5.0;

/// `user@host:pid#random`: unique per process start, so a recycled pid never
/// inherits a dead worker's claims.
pub fn new_worker_id() -> String {
    format!(
        "{}#{}",
        docket_model::operator::Operator::current()
            .claimant
            .replace(' ', "_"),
        docket_model::ids::random_suffix(6)
    )
}

/// Which items a claim may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimScope {
    /// After a position, in order: items nobody holds (never claimed, let
    /// go, or a lease that ran out).
    After(i64),
    /// Anywhere in the session: items let go by a worker that left, and
    /// items whose holder's lease ran out (it died or stalled). Items this
    /// worker let go itself (a stop-after-stage held them) are not taken
    /// again.
    Takeover,
}

#[cfg(test)]
mod tests;
