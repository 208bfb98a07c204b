//! Adopting open batches: those of the session that no live worker holds
//! (a resume, a worker joining, one whose worker died) are re-attached and
//! collected, never submitted a second time.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{Batcher, runner};
use docket_ledger::batches::BatchOp;
use docket_ledger::work::BatchLedger;
use docket_ledger::writer::WriteOp;
use docket_ledger::{Ledger, LedgerError};

impl Batcher {
    /// Re-attach the session's open batches that no live worker holds (a
    /// resume, a worker joining, or one whose worker died): their lines wait
    /// for results, never for a second submission.
    pub(crate) async fn reattach(self: &Arc<Self>) -> Result<usize, String> {
        let path = self.p.ledger.clone();
        let sid = self.session_id.clone();
        let stage_name = self.stage().name.clone();
        let lease = self.lease.clone();
        let _looking = Adoption::new(self);
        let found = tokio::task::spawn_blocking(move || -> Result<_, LedgerError> {
            let mut ledger = Ledger::open(&path)?;
            // Only the batches nobody holds: each is polled by one worker.
            let mut out = Vec::new();
            for b in ledger.adopt_batches(&sid, &stage_name, &lease.worker_id, lease.secs)? {
                let waiting = ledger.waiting_ids(&b.tag)?.len();
                out.push((b, waiting));
            }
            Ok(out)
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("ledger: {e}"))?;
        let mut n = 0;
        for (batch, waiting) in found {
            if waiting == 0 {
                // Every line has its outcome: only the mark was missing
                // (and, maybe, the deletion of its input file: row B2).
                self.writer.post(WriteOp::Batch(BatchOp::Settle {
                    tag: batch.tag.clone(),
                }));
                if let Some(pid) = batch.provider_batch_id.clone() {
                    let me = self.clone();
                    self.spawn(async move {
                        let input = batch.input_file_id.as_deref();
                        runner::delete_files(&me, &batch.tag, &pid, input, None).await;
                    });
                }
                continue;
            }
            n += 1;
            let me = self.clone();
            let adoption = Adoption::new(self);
            self.spawn(async move { runner::reattach(me, batch, waiting, adoption).await });
        }
        Ok(n)
    }
}

/// One adoption under way, counted in `Batcher::adopting` until dropped.
pub(crate) struct Adoption(Arc<Batcher>);

impl Adoption {
    fn new(b: &Arc<Batcher>) -> Self {
        b.adopting.fetch_add(1, Ordering::AcqRel);
        Self(b.clone())
    }
}

impl Drop for Adoption {
    fn drop(&mut self) {
        self.0.adopting.fetch_sub(1, Ordering::AcqRel);
    }
}
