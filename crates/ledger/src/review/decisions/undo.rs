//! Undo: this operator's newest decision not yet undone is taken back, when
//! nobody changed the item since. A bulk decision (many marked items
//! accepted or rejected at once) is one decision: its log rows share the
//! actor, the action and the time of the transaction that wrote them
//! (`decide` keeps that time unique per actor), and one undo takes them all
//! back. Ledgers from before keep working: their bulk rows also share one
//! time, and a single decision is a group of one.

use super::rows::{DecisionState, load_decision, load_item};
use crate::db::{Connection, OptionalExtension, params};
use crate::now_ts;
use crate::review::{Operator, ReviewError, Undone};
use crate::transaction::write_transaction;

/// Undo this operator's newest decision not yet undone (every item of a
/// bulk decision): each decision row is restored as it was, the review
/// items are pending again, and the log says so. Each call walks one
/// decision further back. Refused, with nothing changed, when any of its
/// items was decided again since by someone else.
pub(crate) fn undo_last(conn: &Connection, op: &Operator) -> Result<Option<Undone>, ReviewError> {
    let actor = op.actor();
    write_transaction(conn, || {
        let now = now_ts();
        let Some(newest) = newest_undoable(conn, &actor)? else {
            return Ok(None);
        };
        let group = same_decision(conn, &newest, &actor)?;
        let mut review_ids = Vec::with_capacity(group.len());
        for entry in &group {
            let current = check_unchanged_since(conn, entry, &actor)?;
            let took_back = took_back_an_auto_accept(entry);
            if took_back && current.as_ref().is_some_and(|d| d.state != "indeterminate") {
                return Err(conflict(
                    entry,
                    "the item was decided again since; it was not changed".to_string(),
                ));
            }
            if entry.action == "accept" || took_back {
                restore_decision(conn, entry, now)?;
            }
            reopen_and_log(conn, entry, &actor, current, now)?;
            review_ids.push(entry.review_id);
        }
        Ok(Some(Undone {
            review_id: newest.review_id,
            item_id: newest.item_id,
            action: newest.action,
            corrected: newest.corrected,
            review_ids,
        }))
    })
}

/// A reject that undid an auto-accept (an audit item's): its undo restores
/// the auto-accept.
fn took_back_an_auto_accept(entry: &LogEntry) -> bool {
    entry.action == "reject"
        && entry
            .prev_decision_json
            .as_deref()
            .and_then(DecisionState::from_json)
            .is_some_and(|d| d.auto_accepted())
}

struct LogEntry {
    log_id: i64,
    review_id: i64,
    item_id: String,
    action: String,
    at: f64,
    prev_decision_json: Option<String>,
    /// An accept with the operator's own answer (a correction).
    corrected: bool,
}

const LOG_COLUMNS: &str = "log_id, review_id, item_id, action, at, prev_decision_json, \
     CASE WHEN corrected_answer_json IS NULL THEN 0 ELSE 1 END";

fn log_entry(r: &crate::db::Row<'_>) -> crate::db::Result<LogEntry> {
    Ok(LogEntry {
        log_id: r.get(0)?,
        review_id: r.get(1)?,
        item_id: r.get(2)?,
        action: r.get(3)?,
        at: r.get(4)?,
        prev_decision_json: r.get(5)?,
        corrected: r.get::<_, i64>(6)? != 0,
    })
}

/// The newest accept or reject of `actor` not undone yet.
fn newest_undoable(conn: &Connection, actor: &str) -> Result<Option<LogEntry>, ReviewError> {
    Ok(conn
        .prepare_cached(&format!(
            "SELECT {LOG_COLUMNS} FROM review_log
                 WHERE actor = ?1 AND action IN ('accept', 'reject') AND undone_by_log_id IS NULL
                 ORDER BY log_id DESC LIMIT 1"
        ))?
        .query_row(params![actor], log_entry)
        .optional()?)
}

/// Every row of the decision `newest` belongs to (one bulk accept or
/// reject), newest first; just `newest` for a single decision.
fn same_decision(
    conn: &Connection,
    newest: &LogEntry,
    actor: &str,
) -> Result<Vec<LogEntry>, ReviewError> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {LOG_COLUMNS} FROM review_log
             WHERE actor = ?1 AND action = ?2 AND at = ?3 AND undone_by_log_id IS NULL
                 AND log_id <= ?4
             ORDER BY log_id DESC"
    ))?;
    let rows = stmt.query_map(
        params![actor, newest.action, newest.at, newest.log_id],
        log_entry,
    )?;
    let group = rows.collect::<crate::db::Result<Vec<LogEntry>>>()?;
    if group.is_empty() {
        // Cannot happen (newest matches itself), but an empty undo must
        // not report success.
        return Err(ReviewError::BadLog {
            log_id: newest.log_id,
            why: "its own decision was not found again".to_string(),
        });
    }
    Ok(group)
}

/// Why `entry` cannot be undone.
fn conflict(entry: &LogEntry, why: String) -> ReviewError {
    ReviewError::UndoConflict {
        review_id: entry.review_id,
        item_id: entry.item_id.clone(),
        action: entry.action.clone(),
        why,
    }
}

/// The review item (and, for an accept, the decision) must still be as
/// `entry` left them; the item's decision as it is now.
fn check_unchanged_since(
    conn: &Connection,
    entry: &LogEntry,
    actor: &str,
) -> Result<Option<DecisionState>, ReviewError> {
    let Some(item) = load_item(conn, entry.review_id)? else {
        return Err(conflict(entry, "the review item is gone".to_string()));
    };
    let left_status = if entry.action == "accept" {
        "accepted"
    } else {
        "rejected"
    };
    // The review item must still be as our decision left it.
    if item.status != left_status
        || item.decided_by.as_deref() != Some(actor)
        || item.decided_at != Some(entry.at)
    {
        let now_state = match &item.decided_by {
            Some(by) => format!("it is now {} by {by}", item.status),
            None => format!("it is now {}", item.status),
        };
        return Err(conflict(entry, format!("{now_state}; it was not changed")));
    }
    let current = load_decision(conn, &entry.item_id)?;
    if entry.action == "accept" {
        // ...and so must the decision our accept wrote.
        let ours = current.as_ref().is_some_and(|d| {
            d.state == "decided"
                && d.decided_by.as_deref() == Some(actor)
                && d.decided_at == Some(entry.at)
        });
        if !ours {
            let by = current
                .as_ref()
                .and_then(|d| d.decided_by.clone())
                .unwrap_or_else(|| "someone else".to_string());
            return Err(conflict(
                entry,
                format!("the item's decision was changed since by {by}; it was not changed"),
            ));
        }
    }
    Ok(current)
}

/// The decision row as it was before the accept, from the log.
fn restore_decision(conn: &Connection, entry: &LogEntry, now: f64) -> Result<(), ReviewError> {
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
    Ok(())
}

/// The review item pending again, and the undo in the log (with the
/// decision it replaced), linked from the entry it undoes. When the item
/// got a newer suggestion meanwhile (a later session's, after a reject),
/// the undone one is superseded by it instead: an item never has two
/// pending review items.
fn reopen_and_log(
    conn: &Connection,
    entry: &LogEntry,
    actor: &str,
    current: Option<DecisionState>,
    now: f64,
) -> Result<(), ReviewError> {
    let newer: Option<i64> = conn
        .prepare_cached(
            "SELECT review_id FROM review_item WHERE item_id = ?1 AND status = 'pending' AND review_id != ?2",
        )?
        .query_row(params![entry.item_id, entry.review_id], |r| r.get(0))
        .optional()?;
    match newer {
        None => conn.prepare_cached(
            "UPDATE review_item SET status = 'pending', decided_by = NULL, decided_at = NULL,
                     claimed_by = NULL, claim_expires_at = NULL
                 WHERE review_id = ?1",
        )?
        .execute(params![entry.review_id])?,
        Some(newer) => conn.prepare_cached(
            "UPDATE review_item SET status = 'superseded', superseded_by = ?2, superseded_at = ?3,
                     decided_by = NULL, decided_at = NULL, claimed_by = NULL, claim_expires_at = NULL
                 WHERE review_id = ?1",
        )?
        .execute(params![entry.review_id, newer, now])?,
    };
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
    Ok(())
}
