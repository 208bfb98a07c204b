//! The writer thread's loop: it gathers queued operations into groups,
//! commits the intents first, lingers for a fuller group under light load,
//! and answers each sender once its group committed (or holds the group
//! while the disk is full).

use tokio::sync::mpsc;

use super::health::{FULL_GIVE_UP, FULL_RETRY, Health};
use super::linger::Linger;
use super::transaction::{Applied, apply_group, failure};
use super::{Fence, Queued, WriteError, WriteOp};
use crate::db::Connection;
use crate::search_index;

/// The most operations one transaction takes.
const GROUP_MAX: usize = 1024;
/// A group smaller than this waits a moment for more writes before it
/// commits (how long: `Linger`).
const LINGER_BELOW: usize = 128;

pub(super) fn run(mut conn: Connection, mut rx: mpsc::UnboundedReceiver<Queued>, health: &Health) {
    let mut group: Vec<Queued> = Vec::with_capacity(GROUP_MAX);
    let mut search = search_index::Pacer::new();
    let mut intents: Vec<Queued> = Vec::new();
    // The session the writes are for (for the "ledger was busy" event).
    let mut session: Option<String> = None;
    let mut linger = Linger::default();
    while let Some(first) = rx.blocking_recv() {
        group.push(first);
        collect(&mut rx, &mut group);
        linger.observe(&group);
        if session.is_none() {
            session = group
                .iter()
                .find_map(|(op, _, _)| session_of(op))
                .map(str::to_string);
        }
        commit_intents(&mut conn, &mut group, &mut intents, &mut search, health);
        if group.is_empty() {
            continue;
        }
        if group.len() < LINGER_BELOW {
            // Light load: a commit per two or three writes costs more than
            // the writes. Wait a moment for the next ones to join.
            std::thread::sleep(linger.duration());
            let seen = group.len();
            collect(&mut rx, &mut group);
            linger.observe(&group[seen..]);
            commit_intents(&mut conn, &mut group, &mut intents, &mut search, health);
        }
        if !group.is_empty() {
            commit_and_answer(&mut conn, &mut group, &mut search, health);
        }
        note_busy(&mut conn, session.as_deref(), &mut search, health);
    }
    // Leave the review search index whole for whoever reads next. If this
    // fails the rows stay noted and the next writer indexes them.
    // Only inside a transaction: indexing the rows and clearing their note
    // must commit together, or a row could be indexed twice.
    if conn.execute_batch("BEGIN IMMEDIATE").is_ok() {
        let indexed = search_index::catch_up(&conn);
        let _ = conn.execute_batch(if indexed.is_ok() {
            "COMMIT"
        } else {
            "ROLLBACK"
        });
    }
    if let Some(c) = conn.sqlite() {
        let _ = c.execute_batch("PRAGMA wal_checkpoint(PASSIVE)");
    }
}

/// Once the writer had to wait for another process's write lock past the
/// busy timeout and got it (row D1), the session's events say so: the
/// log said it while it lasted, the events keep it for the console.
fn note_busy(
    conn: &mut Connection,
    session: Option<&str>,
    search: &mut search_index::Pacer,
    health: &Health,
) {
    let Some(waited) = health.busy.take_ended() else {
        return;
    };
    let Some(session_id) = session else {
        return;
    };
    let event = WriteOp::Event {
        session_id: session_id.to_string(),
        level: "warn",
        kind: "ledger_busy",
        message: format!(
            "ledger busy for {:.1} s: another process held its write lock past the busy timeout; \
             the writes waited in memory and are now written (nothing was sent that the ledger could not record first)",
            waited.as_secs_f64()
        ),
    };
    let _ = apply_group(conn, &[(event, None, None)], search);
}

/// The session an operation writes to, when it names one.
fn session_of(op: &WriteOp) -> Option<&str> {
    match op {
        WriteOp::Send(s) => Some(&s.session_id),
        WriteOp::Attempt(r) | WriteOp::Final(Some(r), _) | WriteOp::Stage(Some(r), _) => {
            Some(&r.session_id)
        }
        WriteOp::Final(None, f) => Some(&f.session_id),
        WriteOp::Stage(None, d) => Some(&d.session_id),
        WriteOp::Request(r) => Some(&r.session_id),
        WriteOp::Abandon { session_id, .. }
        | WriteOp::Heartbeat { session_id, .. }
        | WriteOp::Renew { session_id, .. }
        | WriteOp::Leave { session_id, .. }
        | WriteOp::Event { session_id, .. }
        | WriteOp::SessionState { session_id, .. } => Some(session_id),
        WriteOp::ReleaseItem(Fence::Item { session_id, .. }) => Some(session_id),
        WriteOp::ReleaseItem(Fence::Batch { .. }) | WriteOp::Batch(_) => None,
    }
}

/// Commit the intents (`is_intent`) waiting in `group` first, in a
/// transaction of their own that is durable: an intent is what tells a
/// resume that a request may have been paid for, so it must survive a power
/// loss, not only a process crash (fault-matrix row P7). SQLite's
/// `synchronous = NORMAL` (the ledger's setting, kept for every other
/// commit) can lose the last commits to an OS crash; for this one commit
/// the WAL is synced (`FULL`). PostgreSQL commits are durable as they are.
fn commit_intents(
    conn: &mut Connection,
    group: &mut Vec<Queued>,
    intents: &mut Vec<Queued>,
    search: &mut search_index::Pacer,
    health: &Health,
) {
    intents.extend(group.extract_if(.., |(op, _, _)| is_intent(op)));
    if intents.is_empty() {
        return;
    }
    let sqlite = conn.sqlite().is_some();
    if sqlite {
        let _ = conn.execute_batch("PRAGMA synchronous = FULL");
    }
    commit_and_answer(conn, intents, search, health);
    if sqlite {
        let _ = conn.execute_batch("PRAGMA synchronous = NORMAL");
    }
}

/// A write that must be on disk before a paid or irreversible side
/// effect: a request's intent, a provider batch's record with its lines
/// (written before the upload and the create; a batch whose record a power
/// loss took would be created again on resume, its lines paid twice), and
/// a batch's settle (its results files are deleted at the provider once it
/// is settled: a power loss that took the applied results back would leave
/// them paid for and gone). Syncing the settle's commit syncs every write
/// before it, the results applied included. Every other write of a batch
/// can be lost safely: the batch is found again by its tag and its results
/// read again.
fn is_intent(op: &WriteOp) -> bool {
    matches!(
        op,
        WriteOp::Send(_)
            | WriteOp::Batch(crate::batches::BatchOp::Create(_))
            | WriteOp::Batch(crate::batches::BatchOp::AddLines { .. })
            | WriteOp::Batch(crate::batches::BatchOp::Settle { .. })
    )
}

/// How often a group whose transaction lost its connection is applied
/// again (each try first reconnects, for up to two minutes).
const LOST_GROUP_TRIES: usize = 5;
/// How often a group PostgreSQL rolled back to end a deadlock is applied
/// again before its writes fail.
const CONFLICT_TRIES: usize = 20;

/// Apply `group` in one transaction and answer each sender; `group` is
/// left empty. A transaction lost with its connection (PostgreSQL
/// restarted) applied nothing: the group is applied again on the new one.
fn commit_and_answer(
    conn: &mut Connection,
    group: &mut Vec<Queued>,
    search: &mut search_index::Pacer,
    health: &Health,
) {
    let mut tries = 1;
    let mut conflicts = 0;
    let mut full_since: Option<std::time::Instant> = None;
    let mut given_up = false;
    let results = loop {
        let results = match apply_group(conn, group, search) {
            Applied::Results(results) => results,
            Applied::Conflict(why) if conflicts < CONFLICT_TRIES => {
                tracing::debug!("ledger: {why}; applying the write group again");
                conflicts += 1;
                continue;
            }
            Applied::Conflict(why) => {
                let msg = failure(conn, "write failed", &why);
                group
                    .iter()
                    .map(|_| Err(WriteError::Failed(msg.clone())))
                    .collect()
            }
        };
        if conn.take_lost() && tries < LOST_GROUP_TRIES {
            tracing::warn!("ledger: a write group lost its connection; applying it again");
            tries += 1;
            continue;
        }
        // A full disk: nothing of the group was kept. Held in memory and
        // tried again until there is room (row D2).
        let full = results.iter().find_map(|r| match r {
            Err(WriteError::Failed(m)) if disk_full(m) => Some(m.clone()),
            _ => None,
        });
        let Some(why) = full else {
            break results;
        };
        let since = *full_since.get_or_insert_with(std::time::Instant::now);
        if health.giving_up() || since.elapsed() >= FULL_GIVE_UP {
            given_up = true;
            break results;
        }
        if health.full().is_none() {
            tracing::warn!("ledger: {why}; holding {} write(s) in memory", group.len());
        }
        health.set_full(Some(why), group.len());
        std::thread::sleep(FULL_RETRY);
    };
    if full_since.is_some() {
        if given_up {
            health
                .dropped
                .fetch_add(group.len(), std::sync::atomic::Ordering::Relaxed);
        }
        health.set_full(None, 0);
    }
    for ((op, _, reply), result) in group.drain(..).zip(results) {
        if let (WriteOp::Request(r), Ok(())) = (&op, &result) {
            r.answer();
        }
        match reply {
            Some(reply) => {
                let _ = reply.send(result);
            }
            // Nobody waits on a posted write (a heartbeat): its failure is
            // logged, not lost.
            None => {
                if let Err(e) = result {
                    tracing::warn!("ledger: a posted write failed: {e}");
                }
            }
        }
    }
}

/// A write that failed for want of room: the disk (or the file's size
/// limit) is full. SQLite says "database or disk is full" (SQLITE_FULL).
fn disk_full(message: &str) -> bool {
    message.contains("database or disk is full")
}

/// Take what is queued, up to a full group.
pub(super) fn collect(rx: &mut mpsc::UnboundedReceiver<Queued>, group: &mut Vec<Queued>) {
    while group.len() < GROUP_MAX {
        match rx.try_recv() {
            Ok(op) => group.push(op),
            Err(_) => break,
        }
    }
}
