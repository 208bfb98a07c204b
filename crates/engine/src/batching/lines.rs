//! A batch's lines read back from the ledger for its upload, a page at a
//! time: the former recorded them (prompts included) before anything was
//! sent, so the upload never needs the whole batch in memory.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::Batcher;
use docket_ledger::Ledger;
use docket_ledger::work::BatchLedger;
use docket_providers::batch::{BatchLine, LinePage, LineReadError, LineSource};

/// The waiting lines of batch `tag`, in `custom_id` order.
pub(super) struct LedgerLines {
    b: Arc<Batcher>,
    tag: String,
    len: usize,
    /// For each position a page has ended at, the last `custom_id` before
    /// it: the next page reads on from there by key, not by offset.
    ends: Mutex<HashMap<usize, String>>,
    /// A read-only connection, opened by the first page and kept for the
    /// rest (a batch of 50,000 is read twice, in 50 pages).
    ledger: Arc<Mutex<Option<Ledger>>>,
}

impl LedgerLines {
    pub(super) fn new(b: Arc<Batcher>, tag: String, len: usize) -> Self {
        LedgerLines {
            b,
            tag,
            len,
            ends: Mutex::new(HashMap::new()),
            ledger: Arc::new(Mutex::new(None)),
        }
    }

    fn after(&self, from: usize) -> Result<String, LineReadError> {
        if from == 0 {
            return Ok(String::new());
        }
        self.ends
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&from)
            .cloned()
            .ok_or_else(|| LineReadError::OutOfOrder {
                batch: self.tag.clone(),
                line: from,
            })
    }
}

impl LineSource for LedgerLines {
    fn len(&self) -> usize {
        self.len
    }

    fn read(&self, from: usize, max: usize) -> LinePage<'_> {
        Box::pin(async move {
            let after = self.after(from)?;
            let (path, tag) = (self.b.p.ledger.clone(), self.tag.clone());
            let ledger = self.ledger.clone();
            let max = max.min(self.len.saturating_sub(from));
            let rows = tokio::task::spawn_blocking(move || {
                let mut ledger = ledger.lock().unwrap_or_else(|p| p.into_inner());
                let ledger = match ledger.as_mut() {
                    Some(l) => l,
                    None => ledger.insert(Ledger::open_read_only(&path).map_err(in_ledger)?),
                };
                ledger
                    .waiting_lines_after(&tag, &after, max)
                    .map_err(in_ledger)
            })
            .await
            .map_err(|e| LineReadError::Store {
                store: "ledger read",
                source: Box::new(e),
            })??;
            if let Some(last) = rows.last() {
                self.ends
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(from + rows.len(), last.custom_id.clone());
            }
            Ok(rows
                .into_iter()
                .map(|w| BatchLine {
                    request: self
                        .b
                        .request_for(&w.custom_id, w.system_prompt, w.user_prompt),
                    custom_id: w.custom_id,
                })
                .collect())
        })
    }
}

/// A ledger error as the reason a page could not be read.
fn in_ledger(e: docket_ledger::LedgerError) -> LineReadError {
    LineReadError::Store {
        store: "ledger",
        source: Box::new(e),
    }
}
