//! The template check of new rows, on a thread of its own. Rendering every
//! new row's prompts was a third of an import's time (perf, 1,000,000 rows)
//! on one core of two: the thread that reads rows and writes the ledger now
//! hands each new row over and goes on, and what the check found joins the
//! report at the end, in file order.

use std::sync::mpsc::{SyncSender, sync_channel};
use std::thread::{Scope, ScopedJoinHandle};

use super::{MAX_BAD_ROW_DETAILS, TemplateCheck, UnrenderableRow};

/// Rows handed over at a time: one channel message per chunk.
const CHUNK: usize = 256;

/// Chunks the reader may be ahead of the check, so memory stays flat
/// whatever the file's size.
const QUEUE: usize = 16;

struct NewRow {
    line: u64,
    item_id: String,
    evidence_json: String,
}

/// The rows whose prompts cannot be rendered, in file order: how many, and
/// the first [`MAX_BAD_ROW_DETAILS`].
#[derive(Debug, Default)]
pub(super) struct Findings {
    pub(super) count: u64,
    pub(super) first: Vec<UnrenderableRow>,
}

/// The check running beside the import.
pub(super) struct Checking<'scope> {
    chunk: Vec<NewRow>,
    to_check: SyncSender<Vec<NewRow>>,
    checker: ScopedJoinHandle<'scope, Findings>,
}

impl<'scope> Checking<'scope> {
    /// Start the checking thread in `scope`; it ends once `finish` (or a
    /// drop, on an import that failed) closes its queue.
    pub(super) fn start<'env>(
        scope: &'scope Scope<'scope, 'env>,
        check: &'env TemplateCheck,
    ) -> Self {
        let (to_check, rows) = sync_channel::<Vec<NewRow>>(QUEUE);
        let checker = scope.spawn(move || {
            let mut found = Findings::default();
            for row in rows.into_iter().flatten() {
                if let Err(why) = check.check(&row.item_id, &row.evidence_json) {
                    found.count += 1;
                    if found.first.len() < MAX_BAD_ROW_DETAILS {
                        found.first.push(UnrenderableRow {
                            line: row.line,
                            item_id: row.item_id,
                            reason: why.reason(),
                        });
                    }
                }
            }
            found
        });
        Checking {
            chunk: Vec::with_capacity(CHUNK),
            to_check,
            checker,
        }
    }

    /// A new row to check.
    pub(super) fn push(&mut self, line: u64, item_id: &str, evidence_json: &str) {
        self.chunk.push(NewRow {
            line,
            item_id: item_id.to_string(),
            evidence_json: evidence_json.to_string(),
        });
        if self.chunk.len() >= CHUNK {
            self.hand_over();
        }
    }

    fn hand_over(&mut self) {
        let chunk = std::mem::replace(&mut self.chunk, Vec::with_capacity(CHUNK));
        // A send fails only if the checker is gone, which is a panic there:
        // `finish` passes it on.
        let _ = self.to_check.send(chunk);
    }

    /// Every row handed over is checked: what was found.
    pub(super) fn finish(mut self) -> Findings {
        if !self.chunk.is_empty() {
            self.hand_over();
        }
        drop(self.to_check);
        match self.checker.join() {
            Ok(found) => found,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}
