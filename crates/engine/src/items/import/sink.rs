//! Where good rows go: the ledger's open import, counted in the report,
//! each new row handed to the template check when there is one.

use docket_ledger::LedgerError;
use docket_ledger::import::{Added, ItemBatch};
use docket_model::evidence::Evidence;

use super::checking::Checking;
use super::{ImportReport, MAX_DIFFERING_DETAILS};

pub(super) struct Sink<'a, 'b, 'c> {
    pub(super) batch: &'a mut (dyn ItemBatch + 'b),
    /// The check of the job's templates, when the workspace has a docket.toml.
    pub(super) checking: Option<&'a mut Checking<'c>>,
    /// `--update`: changed evidence replaces the ledger's.
    pub(super) update: bool,
}

impl Sink<'_, '_, '_> {
    pub(super) fn insert(
        &mut self,
        item_id: &str,
        evidence: &Evidence,
        line: u64,
        report: &mut ImportReport,
    ) -> Result<(), LedgerError> {
        match self.batch.add(item_id, evidence, line)? {
            Added::New => {
                report.imported += 1;
                self.check_new(item_id, &evidence.json, line);
            }
            Added::AlreadyPresent {
                same_evidence: true,
            } => report.already_present += 1,
            // An edited row of an item the ledger has: the ledger keeps
            // what it has (a session works on its items as imported), and
            // the report says so; `--update` replaces it, marking what was
            // made on the old evidence stale.
            Added::AlreadyPresent {
                same_evidence: false,
            } => {
                report.already_present += 1;
                report.differing += 1;
                if self.update {
                    let marked = self.batch.replace(item_id, evidence, line)?;
                    report.stale.outcomes += marked.outcomes;
                    report.stale.pending_reviews += marked.pending_reviews;
                    report.stale.decided_reviews += marked.decided_reviews;
                    report.stale.auto_accepts_undone += marked.auto_accepts_undone;
                    self.check_new(item_id, &evidence.json, line);
                }
                if report.differing_rows.len() < MAX_DIFFERING_DETAILS {
                    report.differing_rows.push((line, item_id.to_string()));
                }
            }
            // The first line's item stands; this one is a mistake in the
            // file unless it says exactly the same.
            Added::EarlierLine {
                line: first,
                same_evidence: true,
            } => {
                report.already_present += 1;
                tracing::debug!(item_id, line, first, "a repeated line of the same item");
            }
            Added::EarlierLine {
                line: first,
                same_evidence: false,
            } => report.bad(
                line,
                format!(
                    "duplicate id {:?}: line {first} has the same id with other evidence (line {first} was imported; this line was not)",
                    docket_model::sanitize::for_terminal(item_id)
                ),
            ),
        }
        Ok(())
    }
}

impl Sink<'_, '_, '_> {
    /// A new row for the template check (see `checking`).
    fn check_new(&mut self, item_id: &str, evidence_json: &str, line: u64) {
        if let Some(checking) = self.checking.as_mut() {
            checking.push(line, item_id, evidence_json);
        }
    }
}
