//! Removing items (`docket items rm`). Only an item no session has used is
//! removed: its `decision` row is all there is of it. An item a session
//! took is that session's history (its requests, attempts, outcome, review
//! and the session's counts all name it): it is kept, and the answer says
//! which sessions hold it. Nothing is ever left pointing at a removed item.

use crate::db::{Connection, OptionalExtension, params};
use crate::transaction::write_transaction;
use crate::{Ledger, LedgerError};

/// What `remove_items` did with each id asked for.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Removal {
    /// Removed, in the order asked.
    pub removed: Vec<String>,
    /// Not in the ledger.
    pub unknown: Vec<String>,
    /// Kept: used by these sessions (or decided, or reviewed).
    pub kept: Vec<(String, KeptBecause)>,
}

/// Why an item was not removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeptBecause {
    /// These sessions took it (their history names it).
    InSessions(Vec<String>),
    /// It has requests, reviews or decisions of its own outside any
    /// session's item list (an older ledger's rows).
    HasHistory,
}

impl std::fmt::Display for KeptBecause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeptBecause::InSessions(s) => write!(
                f,
                "session {} ran it: it stays as part of that history",
                s.join(", ")
            ),
            KeptBecause::HasHistory => f.write_str(
                "it has requests, reviews or a decision on record: it stays as part of that history",
            ),
        }
    }
}

/// Removing items that no session has used.
pub trait ItemRemoval {
    /// Remove each item of `ids` that no session has used, in one write
    /// transaction; say what became of every id. `dry_run`: say it only.
    fn remove_items(&self, ids: &[String], dry_run: bool) -> Result<Removal, LedgerError>;
}

impl ItemRemoval for Ledger {
    fn remove_items(&self, ids: &[String], dry_run: bool) -> Result<Removal, LedgerError> {
        let conn = self.conn();
        if dry_run {
            return sort_out(conn, ids, false);
        }
        write_transaction(conn, || sort_out(conn, ids, true))
    }
}

/// What becomes of each id; `delete`: the free ones are deleted.
fn sort_out(conn: &Connection, ids: &[String], delete: bool) -> Result<Removal, LedgerError> {
    let mut out = Removal::default();
    let mut seen = std::collections::HashSet::new();
    for id in ids {
        if !seen.insert(id.as_str()) {
            continue;
        }
        match kept_because(conn, id)? {
            None => out.unknown.push(id.clone()),
            Some(Some(why)) => out.kept.push((id.clone(), why)),
            Some(None) => {
                if delete {
                    conn.execute("DELETE FROM decision WHERE item_id = ?1", params![id])?;
                }
                out.removed.push(id.clone());
            }
        }
    }
    Ok(out)
}

/// None: no such item. Some(None): free to remove. Some(Some(why)): kept.
fn kept_because(conn: &Connection, id: &str) -> Result<Option<Option<KeptBecause>>, LedgerError> {
    let state: Option<String> = conn
        .query_row(
            "SELECT state FROM decision WHERE item_id = ?1",
            params![id],
            |r| r.get(0),
        )
        .optional()?;
    let Some(state) = state else {
        return Ok(None);
    };
    let mut stmt = conn.prepare_cached(
        "SELECT session_id FROM session_item WHERE item_id = ?1
         UNION SELECT session_id FROM session_request WHERE item_id = ?1
         UNION SELECT session_id FROM llm_batch_result WHERE item_id = ?1
         UNION SELECT session_id FROM review_item WHERE item_id = ?1 AND session_id IS NOT NULL
         ORDER BY 1",
    )?;
    let sessions = stmt
        .query_map(params![id], |r| r.get::<_, String>(0))?
        .collect::<Result<Vec<String>, _>>()?;
    if !sessions.is_empty() {
        return Ok(Some(Some(KeptBecause::InSessions(sessions))));
    }
    let other: i64 = conn.query_row(
        "SELECT (SELECT COUNT(*) FROM llm_requests WHERE item_id = ?1)
              + (SELECT COUNT(*) FROM review_item WHERE item_id = ?1)
              + (SELECT COUNT(*) FROM review_log WHERE item_id = ?1)
              + (SELECT COUNT(*) FROM llm_batch_result_history WHERE item_id = ?1)",
        params![id],
        |r| r.get(0),
    )?;
    if other > 0 || state != "indeterminate" {
        return Ok(Some(Some(KeptBecause::HasHistory)));
    }
    Ok(Some(None))
}
