//! One group in one transaction: straight when every operation succeeds,
//! with a savepoint per operation when one fails, and what a failed write
//! says.

use super::counters::Counters;
use super::fence::apply_fenced;
use super::{Fence, Queued, WriteError, WriteOp};
use crate::db::{Connection, params};
use crate::search_index;

/// What applying a group came to.
pub(super) enum Applied {
    /// Each operation's result.
    Results(Vec<Result<(), WriteError>>),
    /// PostgreSQL ended the transaction to break a deadlock between
    /// writers (`Error::is_conflict`): nothing of the group was applied.
    Conflict(String),
}

/// Apply a group in one transaction. Usually every operation succeeds, so
/// they are applied straight, with no savepoint each (a fifth of the
/// writer's statements); if one fails, the transaction is rolled back and
/// the group applied again with a savepoint per operation, so that one bad
/// operation never takes the others' writes down with it. A new request
/// answers its caller as it is applied, so a group with one takes the
/// careful path from the start.
pub(super) fn apply_group(
    conn: &mut Connection,
    group: &[Queued],
    search: &mut search_index::Pacer,
) -> Applied {
    let straight = group.len() > 1
        && !group
            .iter()
            .any(|(op, _, _)| matches!(op, WriteOp::Request(_)));
    if straight && let Some(results) = apply_all_or_none(conn, group, search) {
        return Applied::Results(results);
    }
    apply_each_isolated(conn, group, search)
}

/// Every operation of `group` straight in one transaction; None (and
/// nothing written) if one of them failed.
fn apply_all_or_none(
    conn: &mut Connection,
    group: &[Queued],
    search: &mut search_index::Pacer,
) -> Option<Vec<Result<(), WriteError>>> {
    let tx = conn
        .transaction_with_behavior(crate::db::TransactionBehavior::Concurrent)
        .ok()?;
    let mut results = Vec::with_capacity(group.len());
    let mut counters = Counters::default();
    for (op, fence, _) in group {
        results.push(match apply_fenced(&tx, op, fence.as_ref(), &mut counters) {
            Ok(true) => Ok(()),
            // Refused, with the orphaned spend recorded: that commits.
            Ok(false) => Err(WriteError::LeaseLost),
            Err(_) => return None, // dropping `tx` rolls it back
        });
    }
    counters.write(&tx).ok()?;
    index_new_reviews(&tx, search);
    notify_readers(&tx);
    Some(match tx.commit() {
        Ok(()) => results,
        // Nothing committed: the careful path applies it again.
        Err(e) if e.is_conflict() => return None,
        Err(e) => commit_failed(conn, group, &e),
    })
}

/// What a failed write says: the ledger, the step, the error, and for a
/// disk error what is most likely behind it. The session stops with it,
/// resumable: nothing of a failed transaction was kept.
pub(super) fn failure(conn: &Connection, step: &str, e: &dyn std::fmt::Display) -> String {
    let text = e.to_string();
    let hint = if text.contains("disk") {
        " (is the disk full, or the file at a size limit? Free space, then resume)"
    } else {
        ""
    };
    match conn.location() {
        Some(at) => format!("ledger {at}: {step}: {text}{hint}"),
        None => format!("ledger: {step}: {text}{hint}"),
    }
}

fn commit_failed(
    conn: &Connection,
    group: &[Queued],
    e: &crate::db::Error,
) -> Vec<Result<(), WriteError>> {
    let msg = failure(conn, "commit failed", e);
    group
        .iter()
        .map(|_| Err(WriteError::Failed(msg.clone())))
        .collect()
}

/// Index the review items this and earlier groups added, when due. In its
/// own savepoint: a failure leaves them noted for a later try and costs the
/// group's writes nothing.
fn index_new_reviews(tx: &Connection, search: &mut search_index::Pacer) {
    let _ = (|| -> crate::db::Result<()> {
        tx.prepare_cached("SAVEPOINT search")?.execute(params![])?;
        let indexed = search.maybe_catch_up(tx);
        if indexed.is_err() {
            tx.prepare_cached("ROLLBACK TO search")?
                .execute(params![])?;
        }
        tx.prepare_cached("RELEASE search")?.execute(params![])?;
        indexed.map(|_| ())
    })();
}

/// Consoles on a PostgreSQL ledger re-read when the group commits (a
/// notification; nothing on SQLite, whose readers poll a counter).
fn notify_readers(tx: &Connection) {
    let _ = tx.notify(crate::postgres::CHANGE_CHANNEL, "");
}

/// `group` with a savepoint per operation (none for a group of one: the
/// transaction is its savepoint).
fn apply_each_isolated(
    conn: &mut Connection,
    group: &[Queued],
    search: &mut search_index::Pacer,
) -> Applied {
    let all_failed = |msg: String| {
        Applied::Results(
            group
                .iter()
                .map(|_| Err(WriteError::Failed(msg.clone())))
                .collect(),
        )
    };
    let tx = match conn.transaction_with_behavior(crate::db::TransactionBehavior::Concurrent) {
        Ok(tx) => tx,
        Err(e) => return all_failed(failure(conn, "cannot begin", &e)),
    };
    let mut results = Vec::with_capacity(group.len());
    // With one operation the transaction itself is its savepoint.
    let isolate = group.len() > 1;
    let mut counters = Counters::default();
    for (op, fence, _) in group {
        let mut mine = Counters::default();
        let r = if isolate {
            apply_in_savepoint(&tx, op, fence.as_ref(), &mut mine)
        } else {
            apply_fenced(&tx, op, fence.as_ref(), &mut mine)
        };
        match &r {
            Ok(_) => counters.merge(mine),
            Err(e) if e.is_conflict() => {
                let _ = tx.rollback();
                return Applied::Conflict(e.to_string());
            }
            Err(_) => {}
        }
        results.push(match r {
            Ok(true) => Ok(()),
            // Refused, with the orphaned spend recorded: that commits.
            Ok(false) => Err(WriteError::LeaseLost),
            Err(e) => Err(WriteError::Failed(failure(conn, "write failed", &e))),
        });
    }
    let failed = |r: &Result<(), WriteError>| matches!(r, Err(WriteError::Failed(_)));
    if !isolate && results.iter().any(failed) {
        // The only operation failed: nothing of it may stay.
        let _ = tx.rollback();
        return Applied::Results(results);
    }
    if let Err(e) = counters.write(&tx) {
        // Without its counters nothing of the group may stay.
        let _ = tx.rollback();
        if e.is_conflict() {
            return Applied::Conflict(e.to_string());
        }
        return all_failed(failure(conn, "write failed", &e));
    }
    index_new_reviews(&tx, search);
    notify_readers(&tx);
    if let Err(e) = tx.commit() {
        if e.is_conflict() {
            return Applied::Conflict(e.to_string());
        }
        return Applied::Results(commit_failed(conn, group, &e));
    }
    Applied::Results(results)
}

/// A savepoint per operation: one bad operation never takes the others'
/// writes down with it. (Cached statements: execute_batch would parse the
/// SQL every time, thousands of times a second.)
fn apply_in_savepoint(
    tx: &Connection,
    op: &WriteOp,
    fence: Option<&Fence>,
    counters: &mut Counters,
) -> crate::db::Result<bool> {
    tx.prepare_cached("SAVEPOINT op")?.execute(params![])?;
    match apply_fenced(tx, op, fence, counters) {
        Ok(applied) => tx
            .prepare_cached("RELEASE op")?
            .execute(params![])
            .map(|_| applied),
        Err(e) => {
            tx.prepare_cached("ROLLBACK TO op")?.execute(params![])?;
            tx.prepare_cached("RELEASE op")?.execute(params![])?;
            Err(e)
        }
    }
}
