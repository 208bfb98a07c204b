//! Review decisions in the SQLite ledger: claims (short leases on one
//! item), accept, reject and undo. Every decision runs in one write
//! transaction that first checks the item is still pending and not held by
//! someone else, and logs itself in `review_log` with the decision row it
//! replaced, so the newest one can be undone, even after a restart.

use crate::db::{Connection, OptionalExtension, params};

mod rows;
mod undo;

use rows::{DecisionState, ItemRow, load_decision, load_item};
use undo::undo_last;

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

    /// Accept the operator's own answer for one pending item instead of the
    /// suggestion (another candidate picked, or fields edited): decided by
    /// `review:<user>` like an accept, and logged with the answer and the
    /// fields that differ from the suggestion. Undo takes it back.
    fn correct(
        &self,
        review_id: i64,
        answer: &serde_json::Value,
        op: &Operator,
    ) -> Result<Applied, ReviewError>;

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

    fn correct(
        &self,
        review_id: i64,
        answer: &serde_json::Value,
        op: &Operator,
    ) -> Result<Applied, ReviewError> {
        correct(self.conn(), review_id, answer, op)
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

/// Accept `answer` for one pending item instead of its suggestion, logged
/// as an accept with the answer and the fields it changed.
pub(crate) fn correct(
    conn: &Connection,
    review_id: i64,
    answer: &serde_json::Value,
    op: &Operator,
) -> Result<Applied, ReviewError> {
    let actor = op.actor();
    let answer_json = answer.to_string();
    write_transaction(conn, || {
        let now = decision_time(conn, &actor, now_ts())?;
        let mut applied = Applied::default();
        match decidable(conn, review_id, op, Action::Accept, now)? {
            Ok((item, prev)) => {
                let fields = changed_fields(&item.suggestion, answer);
                let correction = Correction {
                    answer: &answer_json,
                    fields: &fields.join(","),
                };
                write_decision(conn, review_id, &item, &prev, &actor, Some(correction), now)?;
                applied.done.push(review_id);
            }
            Err(why) => applied.skipped.push((review_id, why)),
        }
        Ok(applied)
    })
}

/// The answer's fields whose value differs from the suggestion's (or that
/// the suggestion lacks), in the answer's order, then those it dropped.
pub fn changed_fields(suggestion: &str, answer: &serde_json::Value) -> Vec<String> {
    let old = serde_json::from_str::<serde_json::Value>(suggestion).unwrap_or_default();
    let (Some(old), Some(new)) = (old.as_object(), answer.as_object()) else {
        return vec!["(answer)".to_string()];
    };
    let mut out: Vec<String> = new
        .iter()
        .filter(|(k, v)| old.get(k.as_str()) != Some(v))
        .map(|(k, _)| k.clone())
        .collect();
    out.extend(old.keys().filter(|k| !new.contains_key(*k)).cloned());
    out
}

/// An operator's own answer in place of the suggestion.
#[derive(Clone, Copy)]
struct Correction<'a> {
    answer: &'a str,
    fields: &'a str,
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
        let now = decision_time(conn, &actor, now_ts())?;
        let mut applied = Applied::default();
        for &id in ids {
            if applied.done.contains(&id) || applied.skipped.iter().any(|(s, _)| *s == id) {
                continue;
            }
            let (item, prev) = match decidable(conn, id, op, action, now)? {
                Ok(found) => found,
                Err(why) => {
                    applied.skipped.push((id, why));
                    continue;
                }
            };
            match action {
                Action::Accept => write_decision(conn, id, &item, &prev, &actor, None, now)?,
                Action::Reject => write_reject(conn, id, &item, &prev, &actor, now)?,
            }
            applied.done.push(id);
        }
        Ok(applied)
    })
}

/// The time a decision is written with: `now`, or just after the actor's
/// previous decision when the clock has not moved past it. Every row of one
/// decision shares this time, and no other decision of the actor has it, so
/// undo knows a bulk decision's rows by it (see `undo`).
fn decision_time(conn: &Connection, actor: &str, now: f64) -> Result<f64, ReviewError> {
    let last: Option<f64> = conn
        .prepare_cached(
            "SELECT at FROM review_log WHERE actor = ?1 AND action IN ('accept', 'reject')
                 ORDER BY log_id DESC LIMIT 1",
        )?
        .query_row(params![actor], |r| r.get(0))
        .optional()?;
    Ok(match last {
        // A microsecond is well above an f64's step at today's epoch
        // seconds (about 0.24 µs), so the two stay apart.
        Some(last) if last >= now => last + 1e-6,
        _ => now,
    })
}

/// The review item `id` and its decision row when `action` may be taken on
/// it now, else why not (the item is skipped, with that reason).
fn decidable(
    conn: &Connection,
    id: i64,
    op: &Operator,
    action: Action,
    now: f64,
) -> Result<Result<(ItemRow, DecisionState), String>, ReviewError> {
    let Some(item) = load_item(conn, id)? else {
        return Ok(Err("no such review item".to_string()));
    };
    if item.status == "superseded" {
        return Ok(Err(format!(
            "item {}: this suggestion was superseded by a newer one (decide that one)",
            item.item_id
        )));
    }
    if item.status != "pending" {
        let by = item
            .decided_by
            .as_deref()
            .map(|b| format!(" by {b}"))
            .unwrap_or_default();
        return Ok(Err(format!("already decided ({}{by})", item.status)));
    }
    if let Some(other) = item.held_by_other(op, now) {
        return Ok(Err(format!("held by {other}")));
    }
    let Some(prev) = load_decision(conn, &item.item_id)? else {
        return Ok(Err(format!("item {} is not in the ledger", item.item_id)));
    };
    if action == Action::Accept {
        if item.suggestion.trim() == crate::review::NO_SUGGESTION {
            // Row S7: every answer failed the gate; accepting would
            // decide the item with no answer at all.
            return Ok(Err(format!(
                "item {}: no answer passed the gate, so there is nothing to accept (reject it: a later run asks again)",
                item.item_id
            )));
        }
        // An audit item's auto-accept is confirmed by an accept.
        if prev.state != "indeterminate" && !(item.audit && prev.auto_accepted()) {
            // Never overwrite a decision someone made meanwhile (as the
            // engine's auto-accept never does).
            let by = prev.decided_by.as_deref().unwrap_or("someone");
            return Ok(Err(format!(
                "item {} was already decided by {by}",
                item.item_id
            )));
        }
    }
    Ok(Ok((item, prev)))
}

/// Write an accept on the review item and the decision (the suggestion, or
/// the operator's correction), and log it with the decision row it replaced.
fn write_decision(
    conn: &Connection,
    id: i64,
    item: &ItemRow,
    prev: &DecisionState,
    actor: &str,
    correction: Option<Correction<'_>>,
    now: f64,
) -> Result<(), ReviewError> {
    // Exactly what the engine writes for an auto-accept, with the operator
    // as the decider (and their answer, when they corrected it). An audit
    // item's auto-accept, confirmed, is the operator's decision now.
    let answer = correction.map_or(item.suggestion.as_str(), |c| c.answer);
    conn.prepare_cached(
        "UPDATE decision SET state = 'decided', decided_answer_json = ?2, decided_by = ?3,
             decided_at = ?4, confidence = ?5, model_id = ?6, adjudication_id = ?7, updated_at = ?4
         WHERE item_id = ?1 AND (state = 'indeterminate' OR (?8 = 1 AND decided_by = ?9))",
    )?
    .execute(params![
        item.item_id,
        answer,
        actor,
        now,
        item.confidence,
        item.model_id,
        item.request_id.map(|r| r.to_string()),
        i64::from(item.audit),
        rows::AUTO_ACCEPT
    ])?;
    close_and_log(conn, id, item, prev, actor, Action::Accept, correction, now)
}

/// Write a reject on the review item, and log it.
fn write_reject(
    conn: &Connection,
    id: i64,
    item: &ItemRow,
    prev: &DecisionState,
    actor: &str,
    now: f64,
) -> Result<(), ReviewError> {
    if item.audit && prev.auto_accepted() {
        // An audit item's auto-accept rejected: the item is undecided
        // again, as if it had gone to review (a later run asks again).
        conn.prepare_cached(
            "UPDATE decision SET state = 'indeterminate', decided_answer_json = NULL, decided_by = NULL,
                 decided_at = NULL, confidence = NULL, model_id = NULL, adjudication_id = NULL,
                 updated_at = ?2
             WHERE item_id = ?1 AND state = 'decided' AND decided_by = ?3",
        )?
        .execute(params![item.item_id, now, rows::AUTO_ACCEPT])?;
    }
    close_and_log(conn, id, item, prev, actor, Action::Reject, None, now)
}

/// The review item closed as `action` left it, and the log row (with the
/// decision row it replaced, and a correction's answer and fields).
#[allow(clippy::too_many_arguments)]
fn close_and_log(
    conn: &Connection,
    id: i64,
    item: &ItemRow,
    prev: &DecisionState,
    actor: &str,
    action: Action,
    correction: Option<Correction<'_>>,
    now: f64,
) -> Result<(), ReviewError> {
    conn.prepare_cached(
        "UPDATE review_item SET status = ?2, decided_by = ?3, decided_at = ?4,
                     claimed_by = NULL, claim_expires_at = NULL
                 WHERE review_id = ?1 AND status = 'pending'",
    )?
    .execute(params![id, action.status(), actor, now])?;
    conn.prepare_cached(
        "INSERT INTO review_log (review_id, item_id, action, actor, at, prev_decision_json,
                 corrected_answer_json, corrected_fields)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?
    .execute(params![
        id,
        item.item_id,
        action.log_name(),
        actor,
        now,
        prev.to_json(),
        correction.map(|c| c.answer),
        correction.map(|c| c.fields)
    ])?;
    Ok(())
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
