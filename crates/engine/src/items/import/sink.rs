//! Where good rows go: the ledger's open import, counted in the report,
//! each new row checked against the job's templates when there is a check.

use docket_ledger::LedgerError;
use docket_ledger::import::{Added, ItemBatch};
use docket_model::evidence::Evidence;

use super::{
    ImportReport, MAX_BAD_ROW_DETAILS, MAX_DIFFERING_DETAILS, TemplateCheck, UnrenderableRow,
};

pub(super) struct Sink<'a, 'b> {
    pub(super) batch: &'a mut (dyn ItemBatch + 'b),
    /// The job's templates, when the workspace has a docket.toml.
    pub(super) check: Option<&'a TemplateCheck>,
    /// A row that cannot be rendered is a bad row (nothing is imported).
    pub(super) strict: bool,
    /// `--update`: changed evidence replaces the ledger's.
    pub(super) update: bool,
}

impl Sink<'_, '_> {
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
                self.check_new(item_id, &evidence.json, line, report);
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
                    self.check_new(item_id, &evidence.json, line, report);
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

impl Sink<'_, '_> {
    /// A new row checked against the job's templates.
    fn check_new(&self, item_id: &str, evidence_json: &str, line: u64, report: &mut ImportReport) {
        let Some(Err(why)) = self.check.map(|c| c.check(item_id, evidence_json)) else {
            return;
        };
        if self.strict {
            report.bad(
                line,
                format!(
                    "item {:?}: its prompt cannot be rendered: {}",
                    docket_model::sanitize::for_terminal(item_id),
                    why.reason()
                ),
            );
            return;
        }
        report.unrenderable_count += 1;
        if report.unrenderable.len() < MAX_BAD_ROW_DETAILS {
            report.unrenderable.push(UnrenderableRow {
                line,
                item_id: item_id.to_string(),
                reason: why.reason(),
            });
        }
    }
}
