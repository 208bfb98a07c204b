//! Removing items (`docket items rm`). An item no session has taken is
//! removed with its `decision` row. An item sessions took is taken out of
//! them only when nothing was ever sent for it (its prompt could not be
//! rendered, so it ended in `error` at no cost): its session rows and
//! requests go and the counters that counted it drop by one, in the same
//! transaction (`history`). An item anything was sent for, or that was
//! reviewed or decided, is that history: it is kept, and the answer says
//! which sessions hold it. Nothing is ever left pointing at a removed item.

mod history;

use crate::db::{Connection, OptionalExtension, params};
use crate::transaction::write_transaction;
use crate::{Ledger, LedgerError};
use history::{History, drop_requests, history_of, take_out};

/// What `remove_items` did with each id asked for.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Removal {
    /// Removed, in the order asked, each with the sessions it was taken
    /// out of (nothing was ever sent for it there).
    pub removed: Vec<(String, Vec<String>)>,
    /// Not in the ledger.
    pub unknown: Vec<String>,
    /// Kept, and why.
    pub kept: Vec<(String, KeptBecause)>,
}

/// Why an item was not removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeptBecause {
    /// Something was sent for it, or it was reviewed or decided, in these
    /// sessions (their history names it).
    InSessions(Vec<String>),
    /// It was sent, reviewed or decided outside any session still listed.
    HasHistory,
    /// A live process runs this session, which has the item.
    Running(String),
}

impl std::fmt::Display for KeptBecause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeptBecause::InSessions(s) => write!(
                f,
                "session {} ran it (requests were sent, or it was reviewed or decided): it stays as part of that history",
                s.join(", ")
            ),
            KeptBecause::HasHistory => f.write_str(
                "it has requests, reviews or a decision on record: it stays as part of that history",
            ),
            KeptBecause::Running(s) => write!(
                f,
                "session {s} is running now; remove it once the session has stopped"
            ),
        }
    }
}

/// Removing items.
pub trait ItemRemoval {
    /// Remove each item of `ids` that can go (see the module), in one write
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

/// What becomes of each id; `delete`: the ones that can go are removed.
fn sort_out(conn: &Connection, ids: &[String], delete: bool) -> Result<Removal, LedgerError> {
    let mut out = Removal::default();
    let mut seen = std::collections::HashSet::new();
    for id in ids {
        if !seen.insert(id.as_str()) {
            continue;
        }
        let known: Option<i64> = conn
            .query_row(
                "SELECT 1 FROM decision WHERE item_id = ?1",
                params![id],
                |r| r.get(0),
            )
            .optional()?;
        if known.is_none() {
            out.unknown.push(id.clone());
            continue;
        }
        let sessions = match history_of(conn, id)? {
            History::Kept(s) if s.is_empty() => {
                out.kept.push((id.clone(), KeptBecause::HasHistory));
                continue;
            }
            History::Kept(s) => {
                out.kept.push((id.clone(), KeptBecause::InSessions(s)));
                continue;
            }
            History::Running(s) => {
                out.kept.push((id.clone(), KeptBecause::Running(s)));
                continue;
            }
            History::None => Vec::new(),
            History::Unsent(s) => s,
        };
        if delete {
            for s in &sessions {
                take_out(conn, s, id)?;
            }
            drop_requests(conn, id)?;
            conn.execute("DELETE FROM decision WHERE item_id = ?1", params![id])?;
        }
        out.removed.push((id.clone(), sessions));
    }
    Ok(out)
}
