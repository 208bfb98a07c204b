//! Leases: renewing and letting go of the items a worker holds, the work
//! other workers hold, the leases of local workers whose process is gone,
//! and the token an item is claimed under now.

use crate::db::{Connection, Dialect, OptionalExtension, params};
use crate::store::{hostname, process_alive};

/// Extend every lease `worker` holds in the session. Returns how many it
/// holds (0 after a takeover of all of them).
pub(crate) fn renew(
    conn: &Connection,
    session_id: &str,
    worker: &str,
    lease_secs: f64,
) -> crate::db::Result<usize> {
    let until = conn.now()? + lease_secs;
    conn.prepare_cached(
        "UPDATE provider_batch SET lease_until = ?3
         WHERE session_id = ?1 AND claimed_by = ?2 AND state != 'ingested'",
    )?
    .execute(params![session_id, worker, until])?;
    conn.prepare_cached(
        "UPDATE session_item SET lease_until = ?3
         WHERE session_id = ?1 AND lease_until IS NOT NULL AND claimed_by = ?2",
    )?
    .execute(params![session_id, worker, until])
}

/// Let go of every item `worker` holds (it leaves the session): other
/// workers take them at once, with nothing to repair.
pub(crate) fn release_all(
    conn: &Connection,
    session_id: &str,
    worker: &str,
) -> crate::db::Result<usize> {
    // Its open provider batches too: another worker (or a resume) adopts
    // them and collects their results.
    conn.prepare_cached(
        "UPDATE provider_batch SET claimed_by = NULL, lease_until = NULL
         WHERE session_id = ?1 AND claimed_by = ?2 AND state != 'ingested'",
    )?
    .execute(params![session_id, worker])?;
    conn.prepare_cached(
        "UPDATE session_item SET lease_until = NULL, claimed_by = NULL
         WHERE session_id = ?1 AND lease_until IS NOT NULL AND claimed_by = ?2",
    )?
    .execute(params![session_id, worker])
}

/// Work of the session still under way elsewhere: items another worker
/// holds under a lease that has not run out, plus open provider batches
/// this worker does not hold (another worker's, or one waiting to be
/// adopted: its items become claimable once it is).
pub(crate) fn held_by_others(
    conn: &Connection,
    session_id: &str,
    worker: &str,
) -> crate::db::Result<u64> {
    let items: i64 = conn
        .prepare_cached(
            "SELECT COUNT(*) FROM session_item
             WHERE session_id = ?1 AND lease_until IS NOT NULL AND lease_until >= ?2 AND claimed_by != ?3",
        )?
        .query_row(params![session_id, conn.now()?, worker], |r| r.get(0))?;
    let batches: i64 = conn
        .prepare_cached(
            "SELECT COUNT(*) FROM provider_batch
             WHERE session_id = ?1 AND state != 'ingested' AND (claimed_by IS NULL OR claimed_by != ?2)",
        )?
        .query_row(params![session_id, worker], |r| r.get(0))?;
    // PostgreSQL: another worker's claim may be under way, its rows locked
    // and not yet leased as far as this reader sees; `FOR UPDATE SKIP
    // LOCKED` passed them over. Such an item has no holder and no result
    // yet: it is someone's until it has one, so this worker waits rather
    // than leave the session with the others' work counted as left.
    let claiming: i64 = if conn.dialect() == Dialect::Postgres {
        conn.prepare_cached(
            "SELECT COUNT(*) FROM session_item si
             WHERE si.session_id = ?1 AND si.lease_until IS NULL AND si.claimed_by IS NULL
               AND NOT EXISTS (SELECT 1 FROM llm_batch_result b
                               WHERE b.session_id = si.session_id AND b.item_id = si.item_id)",
        )?
        .query_row(params![session_id], |r| r.get(0))?
    } else {
        0
    };
    Ok((items + batches + claiming).max(0) as u64)
}

/// Workers of this host that hold claims in the session but whose process
/// is gone (kill -9): their leases end now instead of running out. Returns
/// the worker ids let go.
pub(crate) fn expire_dead_local_workers(
    conn: &Connection,
    session_id: &str,
) -> crate::db::Result<Vec<String>> {
    let host = hostname();
    let workers: Vec<(String, i64)> = conn
        .prepare_cached(
            "SELECT worker_id, pid FROM session_worker
             WHERE session_id = ?1 AND host = ?2 AND ended_at IS NULL",
        )?
        .query_map(params![session_id, host], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<crate::db::Result<_>>()?;
    let mut gone = Vec::new();
    for (id, pid) in workers {
        if pid == i64::from(std::process::id()) || process_alive(pid) {
            continue;
        }
        let now = conn.now()?;
        conn.prepare_cached(
            "UPDATE session_item SET lease_until = 0
             WHERE session_id = ?1 AND lease_until IS NOT NULL AND claimed_by = ?2",
        )?
        .execute(params![session_id, id])?;
        conn.prepare_cached(
            "UPDATE provider_batch SET lease_until = 0
             WHERE session_id = ?1 AND claimed_by = ?2 AND state != 'ingested'",
        )?
        .execute(params![session_id, id])?;
        conn.prepare_cached("UPDATE session_worker SET ended_at = ?2 WHERE worker_id = ?1")?
            .execute(params![id, now])?;
        gone.push(id);
    }
    Ok(gone)
}

/// The token an item is claimed under now (None: no such item).
///
/// On PostgreSQL the row stays locked (`FOR SHARE`) until the transaction
/// ends: writers commit side by side there, so a claim taking the item over
/// must wait for (or skip) the write its token allowed.
pub(crate) fn current_token(
    conn: &Connection,
    session_id: &str,
    item_id: &str,
) -> crate::db::Result<Option<i64>> {
    let sql = match conn.dialect() {
        Dialect::Sqlite => {
            "SELECT claim_token FROM session_item WHERE session_id = ?1 AND item_id = ?2"
        }
        Dialect::Postgres => {
            "SELECT claim_token FROM session_item WHERE session_id = ?1 AND item_id = ?2 FOR SHARE"
        }
    };
    conn.prepare_cached(sql)?
        .query_row(params![session_id, item_id], |r| r.get(0))
        .optional()
}
