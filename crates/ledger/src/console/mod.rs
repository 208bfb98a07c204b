//! The console's reads: everything the operations console shows, behind one
//! trait. The console holds a ledger handle and calls `ConsoleReads`; it
//! never sees SQL or a connection, so another backend (PostgreSQL) can
//! implement the trait without touching the console.
//!
//! The SQLite implementation is split by what it reads: `sessions` (the
//! sessions pane, one session in full, its stages), `events`, `batches`
//! (provider batches), `review_queue` (a page of the queue and its count)
//! and `review_detail` (one item in full). `columns` and `schema` are what
//! they share: reading odd stored values, and telling which tables an older
//! ledger has.

mod batches;
mod charts;
mod columns;
mod events;
mod review_detail;
mod review_queue;
mod schema;
mod sessions;

use super::{Ledger, LedgerError, queue};
use crate::watch::{
    ChartData, Event, ProviderBatchRow, ProviderBatchSummary, ReviewDetail, ReviewPage,
    ReviewQuery, SessionSummary, SessionView, StageProgress,
};

/// A worker of a session: id, host, claims held, requests/s, heartbeat age
/// and whether it is alive.
pub use super::queue::WorkerRow;

/// What the console reads. Every read is a consistent view of one moment
/// and returns texts as the types document (provider texts already safe for
/// a terminal; item and model texts as stored, made safe when drawn).
pub trait ConsoleReads {
    /// Whether anything was committed since the last call (true on the
    /// first). Cheap: the console asks every 200 ms and reads only then or
    /// on its one-second timer.
    fn has_changed(&mut self) -> Result<bool, LedgerError>;

    /// Every session, newest first.
    fn sessions(&self) -> Result<Vec<SessionSummary>, LedgerError>;

    /// One session in full (counters, controls, gauges, stages, in flight);
    /// None when there is no such session.
    fn session_view(&self, session_id: &str) -> Result<Option<SessionView>, LedgerError>;

    /// The session's stages as its engine checkpoints them, in job order;
    /// empty when it has no checkpoint.
    fn run_stages(&self, session_id: &str) -> Result<Vec<StageProgress>, LedgerError>;

    /// The session's newest `limit` events, newest first.
    fn events(&self, session_id: &str, limit: usize) -> Result<Vec<Event>, LedgerError>;

    /// The session's provider batches, open ones first then newest first;
    /// at most `limit`.
    fn provider_batches(
        &self,
        session_id: &str,
        limit: usize,
    ) -> Result<Vec<ProviderBatchRow>, LedgerError>;

    /// Every provider batch of the session, counted by state.
    fn provider_batch_summary(&self, session_id: &str)
    -> Result<ProviderBatchSummary, LedgerError>;

    /// Every worker that worked on the session, newest first.
    fn workers(&self, session_id: &str) -> Result<Vec<WorkerRow>, LedgerError>;

    /// One page of pending review items (highest confidence first) and how
    /// many match in all. Cheap to repeat: the total is not recounted while
    /// nothing that changes it happened.
    fn review_page(&self, query: &ReviewQuery) -> Result<ReviewPage, LedgerError>;

    /// One review item in full; None when there is no such item.
    fn review_detail(&self, review_id: i64) -> Result<Option<ReviewDetail>, LedgerError>;

    /// The charts of a session: its confidences by stage and its attempts,
    /// 429s, errors and spend over time. Reads every attempt of the
    /// session: the console asks only while the charts are shown.
    fn charts(&self, session_id: &str) -> Result<ChartData, LedgerError>;
}

impl ConsoleReads for Ledger {
    fn has_changed(&mut self) -> Result<bool, LedgerError> {
        Ledger::has_changed(self)
    }

    fn sessions(&self) -> Result<Vec<SessionSummary>, LedgerError> {
        Ok(sessions::sessions(self.conn())?)
    }

    fn session_view(&self, session_id: &str) -> Result<Option<SessionView>, LedgerError> {
        Ok(sessions::session_view(self.conn(), session_id)?)
    }

    fn run_stages(&self, session_id: &str) -> Result<Vec<StageProgress>, LedgerError> {
        Ok(sessions::run_stages(self.conn(), session_id)?)
    }

    fn events(&self, session_id: &str, limit: usize) -> Result<Vec<Event>, LedgerError> {
        Ok(events::events(self.conn(), session_id, limit)?)
    }

    fn provider_batches(
        &self,
        session_id: &str,
        limit: usize,
    ) -> Result<Vec<ProviderBatchRow>, LedgerError> {
        Ok(batches::provider_batches(self.conn(), session_id, limit)?)
    }

    fn provider_batch_summary(
        &self,
        session_id: &str,
    ) -> Result<ProviderBatchSummary, LedgerError> {
        Ok(batches::provider_batch_summary(self.conn(), session_id)?)
    }

    fn workers(&self, session_id: &str) -> Result<Vec<WorkerRow>, LedgerError> {
        // A ledger from before the work queue (migration 0006), opened
        // read-only and so never migrated, has no workers: not an error.
        if !schema::has_table(self.conn(), "session_worker")? {
            return Ok(Vec::new());
        }
        Ok(queue::workers(self.conn(), session_id)?)
    }

    fn review_page(&self, query: &ReviewQuery) -> Result<ReviewPage, LedgerError> {
        Ok(review_queue::review_page(self.conn(), query)?)
    }

    fn review_detail(&self, review_id: i64) -> Result<Option<ReviewDetail>, LedgerError> {
        Ok(review_detail::review_detail(self.conn(), review_id)?)
    }

    fn charts(&self, session_id: &str) -> Result<ChartData, LedgerError> {
        Ok(charts::charts(self.conn(), session_id)?)
    }
}
