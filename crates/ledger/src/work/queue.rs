//! The work queue as the engine's workers use it: claiming a session's items
//! under a lease, page by page or by the requests of batch results, and
//! seeing the other workers of the session. Renewals, releases and
//! heartbeats are writes of a running worker: they go through the writer.

use crate::queue::{self, ClaimScope};
use crate::store::WorkItem;
use crate::{Ledger, LedgerError};

/// A worker's claims on a session's items and its view of the others. The
/// claims run on the worker's hot path: one round trip each.
pub trait WorkQueue {
    /// Claim up to `n` items of `scope` for `worker` under a lease of
    /// `lease_secs`, and load their work (every stage's request), each with
    /// the fencing token it was claimed with, in position order. Items
    /// taken over from another worker have its unanswered attempts marked
    /// ambiguous first.
    fn claim_page(
        &mut self,
        session_id: &str,
        worker: &str,
        scope: ClaimScope,
        n: usize,
        lease_secs: f64,
    ) -> Result<Vec<WorkItem>, LedgerError>;

    /// Claim for `worker` the items whose requests are `request_ids` (lines
    /// of a provider batch it holds, whose results came) and load their
    /// work. An item another worker holds under a live lease, or that has
    /// its outcome, is left out.
    fn claim_requests(
        &mut self,
        session_id: &str,
        worker: &str,
        request_ids: &[i64],
        lease_secs: f64,
    ) -> Result<Vec<WorkItem>, LedgerError>;

    /// Workers of this host that hold claims in the session but whose
    /// process is gone lose their leases now instead of when they run out.
    /// Returns the worker ids let go.
    fn expire_dead_local_workers(&self, session_id: &str) -> Result<Vec<String>, LedgerError>;

    /// Work of the session still under way elsewhere: items other workers
    /// hold under a live lease, and open provider batches `worker` does not
    /// hold.
    fn held_by_others(&self, session_id: &str, worker: &str) -> Result<u64, LedgerError>;

    /// How many workers run the session now (a fresh heartbeat, not ended).
    fn live_workers(&self, session_id: &str) -> Result<u64, LedgerError>;

    /// The gauges (serialized `watch::LiveGauges`) the other live workers
    /// of the session last wrote.
    fn others_gauges(&self, session_id: &str, worker: &str) -> Result<Vec<String>, LedgerError>;
}

/// A claim is one transaction: lost with its connection (PostgreSQL
/// restarted), or ended by the server to break a deadlock with a writer
/// (`Error::is_conflict`), it claimed nothing, and is made again.
fn again_if_lost<T>(
    ledger: &mut Ledger,
    mut claim: impl FnMut(&mut crate::db::Connection) -> crate::db::Result<T>,
) -> Result<T, LedgerError> {
    const TRIES: usize = 5;
    const CONFLICT_TRIES: usize = 20;
    let mut tries = 1;
    let mut conflicts = 0;
    loop {
        match claim(ledger.conn_mut()) {
            Err(crate::db::Error::ConnectionLost(_)) if tries < TRIES => tries += 1,
            Err(e) if e.is_conflict() && conflicts < CONFLICT_TRIES => {
                tracing::debug!("claim ended by the server: {e}; claiming again");
                conflicts += 1;
            }
            Err(e) if ledger.conn().take_lost() && tries < TRIES => {
                tracing::debug!("claim lost with its connection: {e}");
                tries += 1;
            }
            r => return Ok(r?),
        }
    }
}

impl WorkQueue for Ledger {
    fn claim_page(
        &mut self,
        session_id: &str,
        worker: &str,
        scope: ClaimScope,
        n: usize,
        lease_secs: f64,
    ) -> Result<Vec<WorkItem>, LedgerError> {
        again_if_lost(self, |conn| {
            queue::claim_page(conn, session_id, worker, scope, n, lease_secs)
        })
    }

    fn claim_requests(
        &mut self,
        session_id: &str,
        worker: &str,
        request_ids: &[i64],
        lease_secs: f64,
    ) -> Result<Vec<WorkItem>, LedgerError> {
        again_if_lost(self, |conn| {
            queue::claim_requests(conn, session_id, worker, request_ids, lease_secs)
        })
    }

    fn expire_dead_local_workers(&self, session_id: &str) -> Result<Vec<String>, LedgerError> {
        Ok(queue::expire_dead_local_workers(self.conn(), session_id)?)
    }

    fn held_by_others(&self, session_id: &str, worker: &str) -> Result<u64, LedgerError> {
        Ok(queue::held_by_others(self.conn(), session_id, worker)?)
    }

    fn live_workers(&self, session_id: &str) -> Result<u64, LedgerError> {
        Ok(queue::live_workers(self.conn(), session_id)?)
    }

    fn others_gauges(&self, session_id: &str, worker: &str) -> Result<Vec<String>, LedgerError> {
        Ok(queue::others_gauges(self.conn(), session_id, worker)?)
    }
}
