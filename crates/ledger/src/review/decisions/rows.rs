//! The rows a review decision reads: the review item it checks and copies,
//! and the decision row it changes (kept in the log, as JSON, for undo).

use crate::db::{Connection, OptionalExtension, params};
use crate::review::Operator;

/// `decision.decided_by` of an auto-accept.
pub(super) const AUTO_ACCEPT: &str = "llm_auto_accept";

/// The review item columns a decision checks and copies.
pub(super) struct ItemRow {
    pub(super) item_id: String,
    pub(super) status: String,
    pub(super) suggestion: String,
    pub(super) confidence: Option<f64>,
    pub(super) model_id: Option<String>,
    pub(super) request_id: Option<i64>,
    pub(super) decided_by: Option<String>,
    pub(super) decided_at: Option<f64>,
    pub(super) claimed_by: Option<String>,
    pub(super) claim_expires_at: Option<f64>,
    /// Sent by the audit sample: its item was auto-accepted or rejected.
    pub(super) audit: bool,
}

impl ItemRow {
    /// The claimant holding the item, when it is someone else with a live lease.
    pub(super) fn held_by_other(&self, op: &Operator, now: f64) -> Option<&str> {
        match (&self.claimed_by, self.claim_expires_at) {
            (Some(by), Some(until)) if by != &op.claimant && until > now => Some(by),
            _ => None,
        }
    }
}

pub(super) fn load_item(conn: &Connection, review_id: i64) -> crate::db::Result<Option<ItemRow>> {
    conn.prepare_cached(
        "SELECT item_id, status, llm_suggestion_json, confidence, model_id, request_id, decided_by,
                decided_at, claimed_by, claim_expires_at, audit
         FROM review_item WHERE review_id = ?1",
    )?
    .query_row(params![review_id], |r| {
        Ok(ItemRow {
            item_id: r.get(0)?,
            status: r.get(1)?,
            suggestion: r.get(2)?,
            confidence: r.get(3)?,
            model_id: r.get(4)?,
            request_id: r.get(5)?,
            decided_by: r.get(6)?,
            decided_at: r.get(7)?,
            claimed_by: r.get(8)?,
            claim_expires_at: r.get(9)?,
            audit: r.get::<_, i64>(10)? != 0,
        })
    })
    .optional()
}

/// The decision columns a review action changes (and undo restores).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(super) struct DecisionState {
    pub(super) state: String,
    pub(super) decided_answer_json: Option<String>,
    pub(super) decided_by: Option<String>,
    pub(super) decided_at: Option<f64>,
    pub(super) confidence: Option<f64>,
    pub(super) model_id: Option<String>,
    pub(super) adjudication_id: Option<String>,
}

impl DecisionState {
    /// Decided by the engine's auto-accept (what an audit item confirms or
    /// takes back).
    pub(super) fn auto_accepted(&self) -> bool {
        self.state == "decided" && self.decided_by.as_deref() == Some(AUTO_ACCEPT)
    }

    pub(super) fn to_json(&self) -> String {
        // Plain strings, numbers and nulls: serialization cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    pub(super) fn from_json(text: &str) -> Option<Self> {
        let d: DecisionState = serde_json::from_str(text).ok()?;
        matches!(d.state.as_str(), "indeterminate" | "decided").then_some(d)
    }
}

pub(super) fn load_decision(
    conn: &Connection,
    item_id: &str,
) -> crate::db::Result<Option<DecisionState>> {
    conn.prepare_cached(
        "SELECT state, decided_answer_json, decided_by, decided_at, confidence, model_id, adjudication_id
         FROM decision WHERE item_id = ?1",
    )?
    .query_row(params![item_id], |r| {
        Ok(DecisionState {
            state: r.get(0)?,
            decided_answer_json: r.get(1)?,
            decided_by: r.get(2)?,
            decided_at: r.get(3)?,
            confidence: r.get(4)?,
            model_id: r.get(5)?,
            adjudication_id: r.get(6)?,
        })
    })
    .optional()
}
