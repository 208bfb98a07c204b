//! `docket report`: the one thing the run report reads that neither
//! `batch-results` nor the exports do: what each provider batch of a
//! session billed, summed from the attempts its lines carried.

use crate::db::{Connection, params};

use crate::{Ledger, LedgerError};

/// One provider batch's lines and the cost its answered lines billed.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchCost {
    pub batch_id: i64,
    /// Lines the batch was sent with (`provider_batch_item` rows).
    pub lines: i64,
    /// The cost of the attempts those lines carried (unanswered lines: 0).
    pub cost_usd: f64,
}

/// The ledger's read of batch costs (a part of the run report's reads).
pub trait BatchCosts {
    /// Every provider batch of the session that has lines, by batch id.
    fn batch_costs(&self, session_id: &str) -> Result<Vec<BatchCost>, LedgerError>;
}

impl BatchCosts for Ledger {
    fn batch_costs(&self, session_id: &str) -> Result<Vec<BatchCost>, LedgerError> {
        Ok(batch_costs(self.conn(), session_id)?)
    }
}

// One text for both engines: TOTAL is COALESCE(SUM(..), 0) on PostgreSQL
// (db::translate), a double either way; COUNT is an integer on both.
const BATCH_COSTS_SQL: &str = "SELECT i.batch_id, COUNT(*), TOTAL(m.cost_usd) \
     FROM provider_batch_item i \
     JOIN provider_batch b ON b.batch_id = i.batch_id \
     LEFT JOIN llm_messages m ON m.request_id = i.request_id AND m.attempt = i.attempt \
     WHERE b.session_id = ?1 GROUP BY i.batch_id ORDER BY i.batch_id";

fn batch_costs(conn: &Connection, session_id: &str) -> crate::db::Result<Vec<BatchCost>> {
    // A ledger from before migration 0004, opened read-only (so never
    // migrated), has no batches rather than an error.
    if !conn.has_table("provider_batch_item")? {
        return Ok(Vec::new());
    }
    let mut stmt = conn.prepare(BATCH_COSTS_SQL)?;
    let rows = stmt.query_map(params![session_id], |r| {
        Ok(BatchCost {
            batch_id: r.get(0)?,
            lines: r.get(1)?,
            cost_usd: r.get(2)?,
        })
    })?;
    rows.collect()
}
