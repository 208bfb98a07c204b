//! Review decisions in the SQLite ledger: claims (short leases on one
//! item), accept, reject and undo. Every decision runs in one write
//! transaction that first checks the item is still pending and not held by
//! someone else, and logs itself in `review_log` with the decision row it
//! replaced, so the newest one can be undone, even after a restart.

use crate::db::{Connection, OptionalExtension, params};

use crate::review::{Applied, CLAIM_LEASE_SECS, Claim, Operator, ReviewError, Undone};
use crate::transaction::write_transaction;
use crate::{Ledger, LedgerError, now_ts};

/// What an operator decides about the review queue. Each call is one
/// consistent step: checked and written in one write transaction, so two
/// operators deciding the same item at once cannot both succeed.
pub trait ReviewDecisions {
    /// Take, or renew, the lease on a pending item: when it is unclaimed,
    /// its lease expired, or it is already ours.
    fn claim(&self, review_id: i64, op: &Operator) -> Result<Claim, ReviewError>;

    /// Let go of our claim on one item. Returns whether we held it.
    fn release(&self, review_id: i64, op: &Operator) -> Result<bool, ReviewError>;

    /// Let go of every claim of ours (a console closing). Returns how many.
    fn release_all(&self, op: &Operator) -> Result<usize, ReviewError>;

    /// Accept the suggestions of these review items, decided by
    /// `review:<user>`; items no longer pending, held by someone else, or
    /// already decided are skipped, with the reason.
    fn accept(&self, ids: &[i64], op: &Operator) -> Result<Applied, ReviewError>;

    /// Reject the suggestions: the review items close and each item stays
    /// undecided (a later run may take it again).
    fn reject(&self, ids: &[i64], op: &Operator) -> Result<Applied, ReviewError>;

    /// Undo this operator's newest decision not yet undone; `None` when
    /// there is none. Refused, with nothing changed, when someone else
    /// decided the item since.
    fn undo_last(&self, op: &Operator) -> Result<Option<Undone>, ReviewError>;
}

impl ReviewDecisions for Ledger {
    fn claim(&self, review_id: i64, op: &Operator) -> Result<Claim, ReviewError> {
        claim(self.conn(), review_id, op)
    }

    fn release(&self, review_id: i64, op: &Operator) -> Result<bool, ReviewError> {
        release(self.conn(), review_id, op)
    }

    fn release_all(&self, op: &Operator) -> Result<usize, ReviewError> {
        release_all(self.conn(), op)
    }

    fn accept(&self, ids: &[i64], op: &Operator) -> Result<Applied, ReviewError> {
        accept(self.conn(), ids, op)
    }

    fn reject(&self, ids: &[i64], op: &Operator) -> Result<Applied, ReviewError> {
        reject(self.conn(), ids, op)
    }

    fn undo_last(&self, op: &Operator) -> Result<Option<Undone>, ReviewError> {
        undo_last(self.conn(), op)
    }
}

impl From<crate::db::Error> for ReviewError {
    fn from(e: crate::db::Error) -> Self {
        ReviewError::Ledger(LedgerError::Db(e))
    }
}

// The functions below are the SQLite implementation behind the trait.

/// Take, or renew, the lease on a pending item: when it is unclaimed, its
/// lease expired, or it is already ours.
pub(crate) fn claim(
    conn: &Connection,
    review_id: i64,
    op: &Operator,
) -> Result<Claim, ReviewError> {
    write_transaction(conn, || {
        let now = now_ts();
        let Some(item) = load_item(conn, review_id)? else {
            return Err(ReviewError::NotFound(review_id));
        };
        if item.status != "pending" {
            return Ok(Claim::NotPending);
        }
        if let Some(other) = item.held_by_other(op, now) {
            return Ok(Claim::HeldByOther(other.to_string()));
        }
        conn.prepare_cached(
            "UPDATE review_item SET claimed_by = ?2, claim_expires_at = ?3 WHERE review_id = ?1",
        )?
        .execute(params![review_id, op.claimant, now + CLAIM_LEASE_SECS])?;
        Ok(Claim::Held)
    })
}

/// Let go of our claim on one item. Returns whether we held it.
pub(crate) fn release(
    conn: &Connection,
    review_id: i64,
    op: &Operator,
) -> Result<bool, ReviewError> {
    write_transaction(conn, || {
        let n = conn
            .prepare_cached(
                "UPDATE review_item SET claimed_by = NULL, claim_expires_at = NULL
                 WHERE review_id = ?1 AND claimed_by = ?2",
            )?
            .execute(params![review_id, op.claimant])?;
        Ok(n > 0)
    })
}

/// Let go of every claim of ours (a console closing). Returns how many.
pub(crate) fn release_all(conn: &Connection, op: &Operator) -> Result<usize, ReviewError> {
    write_transaction(conn, || {
        let n = conn
            .prepare_cached(
                "UPDATE review_item SET claimed_by = NULL, claim_expires_at = NULL WHERE claimed_by = ?1",
            )?
            .execute(params![op.claimant])?;
        Ok(n)
    })
}

/// Accept the suggestions of these review items: each item's decision is
/// recorded exactly as an auto-accept records it, decided by
/// `review:<user>`. Items no longer pending, held by someone else, or whose
/// decision was already made are skipped, with the reason.
pub(crate) fn accept(
    conn: &Connection,
    ids: &[i64],
    op: &Operator,
) -> Result<Applied, ReviewError> {
    decide(conn, ids, op, Action::Accept)
}

/// Reject the suggestions: the review items are closed and each decision
/// stays indeterminate (a later run may take the item again).
pub(crate) fn reject(
    conn: &Connection,
    ids: &[i64],
    op: &Operator,
) -> Result<Applied, ReviewError> {
    decide(conn, ids, op, Action::Reject)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Accept,
    Reject,
}

impl Action {
    fn log_name(self) -> &'static str {
        match self {
            Action::Accept => "accept",
            Action::Reject => "reject",
        }
    }
    fn status(self) -> &'static str {
        match self {
            Action::Accept => "accepted",
            Action::Reject => "rejected",
        }
    }
}

fn decide(
    conn: &Connection,
    ids: &[i64],
    op: &Operator,
    action: Action,
) -> Result<Applied, ReviewError> {
    let actor = op.actor();
    write_transaction(conn, || {
        let now = now_ts();
        let mut applied = Applied::default();
        for &id in ids {
            if applied.done.contains(&id) || applied.skipped.iter().any(|(s, _)| *s == id) {
                continue;
            }
            let Some(item) = load_item(conn, id)? else {
                applied
                    .skipped
                    .push((id, "no such review item".to_string()));
                continue;
            };
            if item.status != "pending" {
                let by = item
                    .decided_by
                    .as_deref()
                    .map(|b| format!(" by {b}"))
                    .unwrap_or_default();
                applied
                    .skipped
                    .push((id, format!("already decided ({}{by})", item.status)));
                continue;
            }
            if let Some(other) = item.held_by_other(op, now) {
                applied.skipped.push((id, format!("held by {other}")));
                continue;
            }
            let Some(prev) = load_decision(conn, &item.item_id)? else {
                applied
                    .skipped
                    .push((id, format!("item {} is not in the ledger", item.item_id)));
                continue;
            };
            if action == Action::Accept {
                if item.suggestion.trim() == crate::review::NO_SUGGESTION {
                    // Row S7: every answer failed the gate; accepting would
                    // decide the item with no answer at all.
                    applied.skipped.push((
                        id,
                        format!(
                            "item {}: no answer passed the gate, so there is nothing to accept (reject it: a later run asks again)",
                            item.item_id
                        ),
                    ));
                    continue;
                }
                if prev.state != "indeterminate" {
                    // Never overwrite a decision someone made meanwhile (as the
                    // engine's auto-accept never does).
                    let by = prev.decided_by.as_deref().unwrap_or("someone");
                    applied.skipped.push((
                        id,
                        format!("item {} was already decided by {by}", item.item_id),
                    ));
                    continue;
                }
                // Exactly what the engine writes for an auto-accept, with the
                // operator as the decider.
                conn.prepare_cached(
                    "UPDATE decision SET state = 'decided', decided_answer_json = ?2, decided_by = ?3,
                         decided_at = ?4, confidence = ?5, model_id = ?6, adjudication_id = ?7, updated_at = ?4
                     WHERE item_id = ?1 AND state = 'indeterminate'",
                )?
                .execute(params![
                    item.item_id,
                    item.suggestion,
                    actor,
                    now,
                    item.confidence,
                    item.model_id,
                    item.request_id.map(|r| r.to_string())
                ])?;
            }
            conn.prepare_cached(
                "UPDATE review_item SET status = ?2, decided_by = ?3, decided_at = ?4,
                     claimed_by = NULL, claim_expires_at = NULL
                 WHERE review_id = ?1 AND status = 'pending'",
            )?
            .execute(params![id, action.status(), actor, now])?;
            conn.prepare_cached(
                "INSERT INTO review_log (review_id, item_id, action, actor, at, prev_decision_json)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?
            .execute(params![
                id,
                item.item_id,
                action.log_name(),
                actor,
                now,
                prev.to_json()
            ])?;
            applied.done.push(id);
        }
        Ok(applied)
    })
}

/// Undo this operator's newest decision not yet undone: the decision row is
/// restored as it was, the review item is pending again, and the log says
/// so. Each call walks one decision further back. Refused, with nothing
/// changed, when the item was decided again since by someone else.
pub(crate) fn undo_last(conn: &Connection, op: &Operator) -> Result<Option<Undone>, ReviewError> {
    let actor = op.actor();
    write_transaction(conn, || {
        let now = now_ts();
        let entry = conn
            .prepare_cached(
                "SELECT log_id, review_id, item_id, action, at, prev_decision_json FROM review_log
                 WHERE actor = ?1 AND action IN ('accept', 'reject') AND undone_by_log_id IS NULL
                 ORDER BY log_id DESC LIMIT 1",
            )?
            .query_row(params![actor], |r| {
                Ok(LogEntry {
                    log_id: r.get(0)?,
                    review_id: r.get(1)?,
                    item_id: r.get(2)?,
                    action: r.get(3)?,
                    at: r.get(4)?,
                    prev_decision_json: r.get(5)?,
                })
            })
            .optional()?;
        let Some(entry) = entry else {
            return Ok(None);
        };
        let conflict = |why: String| ReviewError::UndoConflict {
            review_id: entry.review_id,
            item_id: entry.item_id.clone(),
            action: entry.action.clone(),
            why,
        };
        let Some(item) = load_item(conn, entry.review_id)? else {
            return Err(conflict("the review item is gone".to_string()));
        };
        let left_status = if entry.action == "accept" {
            "accepted"
        } else {
            "rejected"
        };
        // The review item must still be as our decision left it.
        if item.status != left_status
            || item.decided_by.as_deref() != Some(actor.as_str())
            || item.decided_at != Some(entry.at)
        {
            let now_state = match &item.decided_by {
                Some(by) => format!("it is now {} by {by}", item.status),
                None => format!("it is now {}", item.status),
            };
            return Err(conflict(format!("{now_state}; it was not changed")));
        }
        let current = load_decision(conn, &entry.item_id)?;
        if entry.action == "accept" {
            // ...and so must the decision our accept wrote.
            let ours = current.as_ref().is_some_and(|d| {
                d.state == "decided"
                    && d.decided_by.as_deref() == Some(actor.as_str())
                    && d.decided_at == Some(entry.at)
            });
            if !ours {
                let by = current
                    .as_ref()
                    .and_then(|d| d.decided_by.clone())
                    .unwrap_or_else(|| "someone else".to_string());
                return Err(conflict(format!(
                    "the item's decision was changed since by {by}; it was not changed"
                )));
            }
            let prev = entry
                .prev_decision_json
                .as_deref()
                .and_then(DecisionState::from_json)
                .ok_or_else(|| ReviewError::BadLog {
                    log_id: entry.log_id,
                    why: "it has no readable previous decision".to_string(),
                })?;
            conn.prepare_cached(
                "UPDATE decision SET state = ?2, decided_answer_json = ?3, decided_by = ?4, decided_at = ?5,
                     confidence = ?6, model_id = ?7, adjudication_id = ?8, updated_at = ?9
                 WHERE item_id = ?1",
            )?
            .execute(params![
                entry.item_id,
                prev.state,
                prev.decided_answer_json,
                prev.decided_by,
                prev.decided_at,
                prev.confidence,
                prev.model_id,
                prev.adjudication_id,
                now
            ])?;
        }
        conn.prepare_cached(
            "UPDATE review_item SET status = 'pending', decided_by = NULL, decided_at = NULL,
                 claimed_by = NULL, claim_expires_at = NULL
             WHERE review_id = ?1",
        )?
        .execute(params![entry.review_id])?;
        let undo_id: i64 = conn
            .prepare_cached(
                "INSERT INTO review_log (review_id, item_id, action, actor, at, prev_decision_json, undoes_log_id)
                 VALUES (?1, ?2, 'undo', ?3, ?4, ?5, ?6) RETURNING log_id",
            )?
            .query_row(
                params![
                    entry.review_id,
                    entry.item_id,
                    actor,
                    now,
                    current.map(|d| d.to_json()),
                    entry.log_id
                ],
                |r| r.get(0),
            )?;
        conn.prepare_cached("UPDATE review_log SET undone_by_log_id = ?2 WHERE log_id = ?1")?
            .execute(params![entry.log_id, undo_id])?;
        Ok(Some(Undone {
            review_id: entry.review_id,
            item_id: entry.item_id,
            action: entry.action,
        }))
    })
}

struct LogEntry {
    log_id: i64,
    review_id: i64,
    item_id: String,
    action: String,
    at: f64,
    prev_decision_json: Option<String>,
}

/// The review item columns a decision checks and copies.
struct ItemRow {
    item_id: String,
    status: String,
    suggestion: String,
    confidence: Option<f64>,
    model_id: Option<String>,
    request_id: Option<i64>,
    decided_by: Option<String>,
    decided_at: Option<f64>,
    claimed_by: Option<String>,
    claim_expires_at: Option<f64>,
}

impl ItemRow {
    /// The claimant holding the item, when it is someone else with a live lease.
    fn held_by_other(&self, op: &Operator, now: f64) -> Option<&str> {
        match (&self.claimed_by, self.claim_expires_at) {
            (Some(by), Some(until)) if by != &op.claimant && until > now => Some(by),
            _ => None,
        }
    }
}

fn load_item(conn: &Connection, review_id: i64) -> crate::db::Result<Option<ItemRow>> {
    conn.prepare_cached(
        "SELECT item_id, status, llm_suggestion_json, confidence, model_id, request_id, decided_by,
                decided_at, claimed_by, claim_expires_at
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
        })
    })
    .optional()
}

/// The decision columns a review action changes (and undo restores).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct DecisionState {
    state: String,
    decided_answer_json: Option<String>,
    decided_by: Option<String>,
    decided_at: Option<f64>,
    confidence: Option<f64>,
    model_id: Option<String>,
    adjudication_id: Option<String>,
}

impl DecisionState {
    fn to_json(&self) -> String {
        // Plain strings, numbers and nulls: serialization cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    fn from_json(text: &str) -> Option<Self> {
        let d: DecisionState = serde_json::from_str(text).ok()?;
        matches!(d.state.as_str(), "indeterminate" | "decided").then_some(d)
    }
}

fn load_decision(conn: &Connection, item_id: &str) -> crate::db::Result<Option<DecisionState>> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decision_state_round_trips() {
        let d = DecisionState {
            state: "decided".into(),
            decided_answer_json: Some(r#"{"a":1}"#.into()),
            decided_by: Some("llm_auto_accept".into()),
            decided_at: Some(1_700_000_000.123_456),
            confidence: Some(0.9),
            model_id: None,
            adjudication_id: Some("7".into()),
        };
        assert_eq!(DecisionState::from_json(&d.to_json()), Some(d));
        assert_eq!(DecisionState::from_json("{}"), None);
        assert_eq!(DecisionState::from_json(r#"{"state":"weird"}"#), None);
    }
}
