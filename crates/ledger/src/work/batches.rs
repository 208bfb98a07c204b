//! Provider batches as the engine keeps them: the open ones of a session,
//! adopting those no live worker holds, and their lines (what is still
//! waiting, what a re-read of results must recognise). Changes a running
//! worker makes go through the writer; `record_batch` is for the one change
//! made with no engine running (`docket cancel` on an idle session).

use crate::batches::{self, BatchOp, LineId, OpenBatch, WaitingLine};
use crate::{Ledger, LedgerError, now_ts};

/// A session's provider batches in the ledger.
pub trait BatchLedger {
    /// The session's batches that are not finished with, oldest first.
    fn open_batches(&self, session_id: &str) -> Result<Vec<OpenBatch>, LedgerError>;

    /// How many batches the session has had (the next tag's number).
    fn batch_count(&self, session_id: &str) -> Result<u64, LedgerError>;

    /// Take the lease on the session's open batches of `stage` that nobody
    /// holds for `worker`, and return them: exactly one worker polls and
    /// ingests each batch.
    fn adopt_batches(
        &mut self,
        session_id: &str,
        stage: &str,
        worker: &str,
        lease_secs: f64,
    ) -> Result<Vec<OpenBatch>, LedgerError>;

    /// The lines of batch `tag` still waiting for their result, without
    /// their prompts.
    fn waiting_ids(&self, tag: &str) -> Result<Vec<LineId>, LedgerError>;

    /// Up to `max` lines of batch `tag` still waiting for their result,
    /// with their prompts, in `custom_id` order after `after` ("" for the
    /// first page): a batch is uploaded from the ledger a page at a time,
    /// and a batch whose create never reached the provider is submitted
    /// again, line for line.
    fn waiting_lines_after(
        &self,
        tag: &str,
        after: &str,
        max: usize,
    ) -> Result<Vec<WaitingLine>, LedgerError>;

    /// Every line (custom id) of batch `tag`.
    fn line_ids(&self, tag: &str) -> Result<Vec<String>, LedgerError>;

    /// Whether batch `tag` is finished with.
    fn is_settled(&self, tag: &str) -> Result<bool, LedgerError>;

    /// Every provider batch id docket knows, of any session.
    fn known_provider_ids(&self) -> Result<Vec<String>, LedgerError>;

    /// Record a change to a batch now, outside any run (no writer exists).
    fn record_batch(&self, op: &BatchOp) -> Result<(), LedgerError>;
}

impl BatchLedger for Ledger {
    fn open_batches(&self, session_id: &str) -> Result<Vec<OpenBatch>, LedgerError> {
        Ok(batches::open_batches(self.conn(), session_id)?)
    }

    fn batch_count(&self, session_id: &str) -> Result<u64, LedgerError> {
        Ok(batches::batch_count(self.conn(), session_id)?)
    }

    fn adopt_batches(
        &mut self,
        session_id: &str,
        stage: &str,
        worker: &str,
        lease_secs: f64,
    ) -> Result<Vec<OpenBatch>, LedgerError> {
        Ok(batches::adopt(
            self.conn_mut(),
            session_id,
            stage,
            worker,
            lease_secs,
        )?)
    }

    fn waiting_ids(&self, tag: &str) -> Result<Vec<LineId>, LedgerError> {
        Ok(batches::waiting_ids(self.conn(), tag)?)
    }

    fn waiting_lines_after(
        &self,
        tag: &str,
        after: &str,
        max: usize,
    ) -> Result<Vec<WaitingLine>, LedgerError> {
        Ok(batches::waiting_lines_after(self.conn(), tag, after, max)?)
    }

    fn line_ids(&self, tag: &str) -> Result<Vec<String>, LedgerError> {
        Ok(batches::line_ids(self.conn(), tag)?)
    }

    fn is_settled(&self, tag: &str) -> Result<bool, LedgerError> {
        Ok(batches::is_settled(self.conn(), tag)?)
    }

    fn known_provider_ids(&self) -> Result<Vec<String>, LedgerError> {
        Ok(batches::known_provider_ids(self.conn())?)
    }

    fn record_batch(&self, op: &BatchOp) -> Result<(), LedgerError> {
        Ok(batches::apply(self.conn(), op, now_ts())?)
    }
}
