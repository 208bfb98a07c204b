//! The work queue: every worker process claims a session's items from the
//! ledger, page by page, with a lease and a fencing token.
//!
//! - A claim sets `claimed_by`, `lease_until` and a `claim_token` one higher
//!   than any before it, in one write transaction, so two workers never hold
//!   the same item.
//! - The worker renews its leases while it works. Everything it writes for
//!   an item carries the token it claimed with, and the writer commits it
//!   only while the row still has that token (`writer::Fence`): a worker that
//!   stalled past its lease and was taken over has its late writes refused,
//!   counted as orphaned spend, never doubled.
//! - A claim that takes over an item another worker held marks that
//!   worker's attempts still marked 'sent' ambiguous (they may have been
//!   billed) before the item is sent again.
//! - Workers on this host whose process is gone lose their leases at once;
//!   elsewhere a lease runs out on its own.

use crate::db::{Connection, Dialect, OptionalExtension, TransactionBehavior, params};

use super::store::{WorkItem, hostname, process_alive};

/// Seconds a worker's heartbeat may be old and the worker still count as
/// alive (it beats every 400 ms).
pub const WORKER_LIVE_SECS: f64 = 5.0;

/// `user@host:pid#random`: unique per process start, so a recycled pid never
/// inherits a dead worker's claims.
pub fn new_worker_id() -> String {
    format!(
        "{}#{}",
        docket_model::operator::Operator::current()
            .claimant
            .replace(' ', "_"),
        docket_model::ids::random_suffix(6)
    )
}

/// Which items a claim may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimScope {
    /// After a position, in order: items nobody holds (never claimed, let
    /// go, or a lease that ran out).
    After(i64),
    /// Anywhere in the session: items let go by a worker that left, and
    /// items whose holder's lease ran out (it died or stalled). Items this
    /// worker let go itself (a stop-after-stage held them) are not taken
    /// again.
    Takeover,
}

/// Claim up to `n` items of `session_id` for `worker` and load their work.
/// Items taken over from another worker have that worker's unanswered
/// attempts marked ambiguous first.
pub(crate) fn claim_page(
    conn: &mut Connection,
    session_id: &str,
    worker: &str,
    scope: ClaimScope,
    n: usize,
    lease_secs: f64,
) -> crate::db::Result<Vec<WorkItem>> {
    let now = conn.now()?;
    let postgres = conn.dialect() == Dialect::Postgres;
    // SQLite: the write lock first, so two claims never pick the same rows.
    // PostgreSQL: no ledger-wide lock; the rows picked are locked and rows
    // another claim holds are skipped (`FOR UPDATE SKIP LOCKED`), so
    // workers claim side by side.
    let tx = conn.transaction_with_behavior(if postgres {
        TransactionBehavior::Deferred
    } else {
        TransactionBehavior::Immediate
    })?;
    claim_settings(&tx)?;
    // (row, position, previous holder, whether that holder had it leased);
    // the row is SQLite's rowid, or the position on PostgreSQL.
    let row_id = if postgres { "si.position" } else { "si.rowid" };
    let picked: Vec<(i64, i64, String, Option<String>, bool)> = {
        let sql = match scope {
            ClaimScope::After(_) => {
                "SELECT {ROW}, si.position, si.item_id, si.claimed_by, si.lease_until IS NOT NULL
                 FROM session_item si
                 WHERE si.session_id = ?1 AND si.position > ?2
                   AND (si.lease_until IS NULL OR si.lease_until < ?3)
                   AND NOT EXISTS (SELECT 1 FROM llm_batch_result b
                                   WHERE b.session_id = si.session_id AND b.item_id = si.item_id)
                 ORDER BY si.position LIMIT ?4"
            }
            ClaimScope::Takeover => {
                "SELECT {ROW}, si.position, si.item_id, si.claimed_by, si.lease_until IS NOT NULL
                 FROM session_item si
                 WHERE si.session_id = ?1 AND si.position > ?2
                   AND ((si.lease_until IS NULL AND si.claimed_by IS NULL)
                        OR (si.lease_until < ?3 AND si.claimed_by != ?5))
                   AND NOT EXISTS (SELECT 1 FROM llm_batch_result b
                                   WHERE b.session_id = si.session_id AND b.item_id = si.item_id)
                 ORDER BY si.position LIMIT ?4"
            }
        };
        let after = match scope {
            ClaimScope::After(a) => a,
            ClaimScope::Takeover => -1,
        };
        // An item whose request waits as a line in an open provider batch
        // is not taken: sending it again would pay twice, and its result
        // comes to whoever holds the batch (see `batches::adopt` and
        // `claim_requests`), which takes the item then.
        let open_batches: bool = tx
            .prepare_cached(
                "SELECT EXISTS (SELECT 1 FROM provider_batch WHERE session_id = ?1 AND state != 'ingested')",
            )?
            .query_row(params![session_id], |r| r.get(0))?;
        let mut sql = sql.replace("{ROW}", row_id);
        if open_batches {
            sql = sql.replace(
                "ORDER BY si.position",
                &format!("{IN_OPEN_BATCH} ORDER BY si.position"),
            );
        }
        if postgres {
            sql.push_str(" FOR UPDATE OF si SKIP LOCKED");
            // The pick walks the (session_id, position) index in order and
            // stops at the LIMIT: statistics that lag a session just
            // created make the planner expect a handful of rows and sort
            // the whole rest of the session instead, on every claim.
            tx.execute_batch("SET LOCAL enable_sort = off")?;
        }
        let mut stmt = tx.prepare_cached(&sql)?;
        let pick =
            |r: &crate::db::Row<'_>| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?));
        let rows = match scope {
            ClaimScope::After(_) => {
                stmt.query_map(params![session_id, after, now, n as i64], pick)?
            }
            ClaimScope::Takeover => {
                stmt.query_map(params![session_id, after, now, n as i64, worker], pick)?
            }
        };
        rows.collect::<crate::db::Result<_>>()?
    };
    if postgres {
        tx.execute_batch("SET LOCAL enable_sort = on")?;
    }
    if picked.is_empty() {
        tx.commit()?;
        return Ok(Vec::new());
    }
    let mut tokens = std::collections::HashMap::with_capacity(picked.len());
    {
        // PostgreSQL: the pick above saw the results of its own snapshot;
        // a row whose holder committed its result meanwhile was locked in
        // its newest version, lease already cleared. This statement sees
        // that commit, and leaves such an item alone.
        let mut claim = tx.prepare_cached(if postgres {
            "UPDATE session_item SET claimed_by = ?2, lease_until = ?3, claim_token = claim_token + 1
             WHERE session_id = ?4 AND position = ?1
               AND NOT EXISTS (SELECT 1 FROM llm_batch_result b
                               WHERE b.session_id = session_item.session_id AND b.item_id = session_item.item_id)
             RETURNING claim_token"
        } else {
            "UPDATE session_item SET claimed_by = ?2, lease_until = ?3, claim_token = claim_token + 1
             WHERE rowid = ?1 RETURNING claim_token"
        })?;
        for (row, position, _, _, _) in &picked {
            let token: Option<i64> = if postgres {
                claim
                    .query_row(params![row, worker, now + lease_secs, session_id], |r| {
                        r.get(0)
                    })
                    .optional()?
            } else {
                Some(claim.query_row(params![row, worker, now + lease_secs], |r| r.get(0))?)
            };
            if let Some(token) = token {
                tokens.insert(*position, token);
            }
        }
    }
    if tokens.is_empty() {
        // Every item picked was finished meanwhile (PostgreSQL, above): an
        // empty page would end the first pass early; pick the next ones.
        tx.commit()?;
        let scope = match scope {
            ClaimScope::After(_) => {
                ClaimScope::After(picked.iter().map(|p| p.1).max().unwrap_or(-1))
            }
            ClaimScope::Takeover => ClaimScope::Takeover,
        };
        return claim_page(conn, session_id, worker, scope, n, lease_secs);
    }
    // Taken from another worker that held it: what it left in flight may
    // have been billed. (Items let go cleanly have nothing in flight.)
    let mut ambiguous = 0;
    for (_, position, item_id, holder, leased) in &picked {
        if *leased && holder.as_deref() != Some(worker) && tokens.contains_key(position) {
            ambiguous += mark_in_flight_ambiguous(&tx, session_id, item_id, now)?;
        }
    }
    if ambiguous > 0 {
        tx.prepare_cached(
            "UPDATE llm_batch_session SET ambiguous_count = ambiguous_count + ?2,
                 attempt_count = attempt_count + ?2, updated_at = ?3 WHERE session_id = ?1",
        )?
        .execute(params![session_id, ambiguous as i64, now])?;
    }
    let items = load_claimed(&tx, session_id, &tokens)?;
    tx.commit()?;
    Ok(items)
}

/// PostgreSQL, first in a claim's transaction:
///
/// - its statements are planned for the tables as they are now, not once
///   for the life of the connection. A session's results grow from none to
///   all of its items while its workers claim; a plan cached while they
///   were few (the check that an item has no result read every result of
///   the session, for each item looked at) made each claim slower with
///   every result, a third of a second by a few thousand: the workers spent
///   their time claiming. Planning costs a fraction of a millisecond a
///   statement.
/// - a claim whose worker stalls in it lets go of the rows it locked
///   (`postgres::END_STALLED_TRANSACTION`) instead of keeping them from
///   everyone until its process dies.
fn claim_settings(tx: &Connection) -> crate::db::Result<()> {
    if tx.dialect() == Dialect::Postgres {
        tx.execute_batch(&format!(
            "SET LOCAL plan_cache_mode = force_custom_plan; {}",
            crate::postgres::END_STALLED_TRANSACTION
        ))?;
    }
    Ok(())
}

/// The work of the items at the positions of `tokens` (position -> the
/// token each was claimed with), in position order.
fn load_claimed(
    conn: &Connection,
    session_id: &str,
    tokens: &std::collections::HashMap<i64, i64>,
) -> crate::db::Result<Vec<WorkItem>> {
    let first = tokens.keys().copied().min().unwrap_or(0);
    let last = tokens.keys().copied().max().unwrap_or(0);
    // A page off the first pass (or a batch's lines, cut in order) is one
    // stretch of positions: one read. Items taken over lie anywhere in the
    // session: read one by one.
    let mut items = if (last - first) as usize <= tokens.len() * 2 {
        let mut all = super::store::work_between(conn, session_id, first, last)?;
        all.retain(|w| tokens.contains_key(&w.position));
        all
    } else {
        let mut positions: Vec<i64> = tokens.keys().copied().collect();
        positions.sort_unstable();
        let mut all = Vec::with_capacity(positions.len());
        for p in positions {
            all.extend(super::store::work_between(conn, session_id, p, p)?);
        }
        all
    };
    for w in &mut items {
        w.claim_token = tokens.get(&w.position).copied().unwrap_or(0);
    }
    Ok(items)
}

/// Claim for `worker` the items whose requests are `request_ids` (lines of
/// a provider batch it holds, whose results came) and load their work. An
/// item another worker holds under a live lease, or that has its outcome,
/// is left out.
pub(crate) fn claim_requests(
    conn: &mut Connection,
    session_id: &str,
    worker: &str,
    request_ids: &[i64],
    lease_secs: f64,
) -> crate::db::Result<Vec<WorkItem>> {
    let now = conn.now()?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    claim_settings(&tx)?;
    let mut tokens = std::collections::HashMap::with_capacity(request_ids.len());
    {
        let mut claim = tx.prepare_cached(
            "UPDATE session_item SET claimed_by = ?3, lease_until = ?4, claim_token = claim_token + 1
             WHERE session_id = ?1
               AND item_id = (SELECT item_id FROM session_request WHERE session_id = ?1 AND request_id = ?2)
               AND (claimed_by IS NULL OR claimed_by = ?3 OR lease_until IS NULL OR lease_until < ?5)
               AND NOT EXISTS (SELECT 1 FROM llm_batch_result b
                               WHERE b.session_id = session_item.session_id AND b.item_id = session_item.item_id)
             RETURNING position, claim_token",
        )?;
        for id in request_ids {
            let got: Option<(i64, i64)> = claim
                .query_row(
                    params![session_id, id, worker, now + lease_secs, now],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            if let Some((position, token)) = got {
                tokens.insert(position, token);
            }
        }
    }
    let items = if tokens.is_empty() {
        Vec::new()
    } else {
        load_claimed(&tx, session_id, &tokens)?
    };
    tx.commit()?;
    Ok(items)
}

/// Appended to a claim's WHERE clause while the session has open provider
/// batches: an item with a line waiting in one is the batch holder's.
const IN_OPEN_BATCH: &str = "AND NOT EXISTS (SELECT 1 FROM session_request sr
        JOIN provider_batch_item bi ON bi.request_id = sr.request_id
        JOIN provider_batch b ON b.batch_id = bi.batch_id
        JOIN llm_messages m ON m.request_id = bi.request_id AND m.attempt = bi.attempt
        WHERE sr.session_id = si.session_id AND sr.item_id = si.item_id
          AND b.state != 'ingested' AND m.state = 'sent')";

/// An item's attempts of this session still marked 'sent' (never answered
/// on record) become ambiguous; lines of a provider batch still open are
/// not lost (their batch is collected) and stay as they are.
fn mark_in_flight_ambiguous(
    conn: &Connection,
    session_id: &str,
    item_id: &str,
    now: f64,
) -> crate::db::Result<usize> {
    conn.prepare_cached(
        "UPDATE llm_messages SET state = 'ambiguous', error_kind = 'ambiguous',
             error_message = 'in flight when its worker lost the item (it stopped or stalled past its lease); it may have been billed',
             finished_at = ?3
         WHERE state = 'sent' AND +session_id = ?1
           AND request_id IN (SELECT request_id FROM session_request WHERE session_id = ?1 AND item_id = ?2)
           AND NOT EXISTS (SELECT 1 FROM provider_batch_item bi
                           JOIN provider_batch b ON b.batch_id = bi.batch_id
                           WHERE bi.request_id = llm_messages.request_id
                             AND bi.attempt = llm_messages.attempt AND b.state != 'ingested')",
    )?
    .execute(params![session_id, item_id, now])
}

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

/// What a worker reports with its heartbeat.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkerBeat {
    pub worker_id: String,
    pub claims: u64,
    pub sent: u64,
    pub requests_per_sec: f64,
    /// Its own gauges (a serialized `watch::LiveGauges`).
    pub live_json: Option<String>,
}

/// Record a worker joining a session (or beating again).
pub(crate) fn beat(conn: &Connection, session_id: &str, b: &WorkerBeat) -> crate::db::Result<()> {
    let now = conn.now()?;
    let op = docket_model::operator::Operator::current();
    conn.prepare_cached(
        "INSERT INTO session_worker (worker_id, session_id, user_name, host, pid, started_at, heartbeat_at,
             claims, sent, requests_per_sec, live_json)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6, ?7, ?8, ?9, ?10)
         ON CONFLICT (worker_id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at, claims = excluded.claims,
             sent = excluded.sent, requests_per_sec = excluded.requests_per_sec,
             live_json = COALESCE(excluded.live_json, session_worker.live_json), ended_at = NULL",
    )?
    .execute(params![
        b.worker_id,
        session_id,
        op.user,
        hostname(),
        std::process::id(),
        now,
        b.claims as i64,
        b.sent as i64,
        b.requests_per_sec,
        b.live_json
    ])?;
    Ok(())
}

/// A worker let go of the session.
pub(crate) fn worker_ended(conn: &Connection, worker: &str) -> crate::db::Result<()> {
    conn.prepare_cached(
        "UPDATE session_worker SET ended_at = ?2, claims = 0 WHERE worker_id = ?1",
    )?
    .execute(params![worker, conn.now()?])?;
    Ok(())
}

/// How many workers run the session now (a fresh heartbeat, not ended),
/// this one included if it beat.
pub(crate) fn live_workers(conn: &Connection, session_id: &str) -> crate::db::Result<u64> {
    conn.prepare_cached(
        "SELECT COUNT(*) FROM session_worker
         WHERE session_id = ?1 AND ended_at IS NULL AND heartbeat_at >= ?2",
    )?
    .query_row(params![session_id, conn.now()? - WORKER_LIVE_SECS], |r| {
        r.get::<_, i64>(0)
    })
    .map(|n| n as u64)
}

/// The gauges the other live workers of the session last wrote.
pub(crate) fn others_gauges(
    conn: &Connection,
    session_id: &str,
    worker: &str,
) -> crate::db::Result<Vec<String>> {
    conn.prepare_cached(
        "SELECT live_json FROM session_worker
         WHERE session_id = ?1 AND worker_id != ?2 AND ended_at IS NULL AND heartbeat_at >= ?3
           AND live_json IS NOT NULL",
    )?
    .query_map(
        params![session_id, worker, conn.now()? - WORKER_LIVE_SECS],
        |r| r.get(0),
    )?
    .collect()
}

/// A worker of a session as the console and `docket sessions` list it.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerRow {
    pub worker_id: String,
    pub host: String,
    pub pid: i64,
    pub claims: u64,
    pub sent: u64,
    pub requests_per_sec: f64,
    pub orphaned: u64,
    pub heartbeat_age_secs: f64,
    pub alive: bool,
}

/// Every worker that worked on the session, newest first.
pub(crate) fn workers(conn: &Connection, session_id: &str) -> crate::db::Result<Vec<WorkerRow>> {
    let now = conn.now()?;
    conn.prepare_cached(
        "SELECT worker_id, host, pid, claims, sent, requests_per_sec, orphaned, heartbeat_at, ended_at
         FROM session_worker WHERE session_id = ?1 ORDER BY started_at DESC",
    )?
    .query_map(params![session_id], |r| {
        let heartbeat: f64 = r.get(7)?;
        let ended: Option<f64> = r.get(8)?;
        Ok(WorkerRow {
            worker_id: r.get(0)?,
            host: r.get(1)?,
            pid: r.get(2)?,
            claims: r.get::<_, i64>(3)? as u64,
            sent: r.get::<_, i64>(4)? as u64,
            requests_per_sec: r.get(5)?,
            orphaned: r.get::<_, i64>(6)? as u64,
            heartbeat_age_secs: (now - heartbeat).max(0.0),
            alive: ended.is_none() && now - heartbeat < WORKER_LIVE_SECS,
        })
    })?
    .collect()
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

/// Before a process works on a session (a resume, or a worker joining):
/// items whose lease ran out (their worker died or stalled) are let go, with
/// a new fencing token so whatever their old worker still writes is
/// refused; then every attempt of an item nobody holds that is still marked
/// 'sent' left the machine and never got an answer recorded: it is marked
/// ambiguous (it may have been billed), counted, and its request is sent
/// again. Items a live worker holds are left alone: the session may be
/// joined while it runs. Returns how many attempts were found.
///
/// `resume`: the operator resumes the session (`--resume`): it runs again,
/// and a pause or stop-after-stage asked of it is cleared. Without it (a
/// `docket worker` joining) the session's controls stay as they are.
pub(crate) fn repair_interrupted(
    conn: &mut Connection,
    session_id: &str,
    max_cost_usd: Option<f64>,
    resume: bool,
) -> crate::db::Result<Repair> {
    let now = conn.now()?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    // A worker of this host killed since its last beat does not count as
    // live (nor keep its leases): the resume works alone, as it says.
    expire_dead_local_workers(&tx, session_id)?;
    let live_workers = live_workers(&tx, session_id)?;
    tx.execute(
        "UPDATE session_item SET claim_token = claim_token + 1, lease_until = NULL, claimed_by = NULL
         WHERE session_id = ?1 AND lease_until IS NOT NULL AND lease_until < ?2",
        params![session_id, now],
    )?;
    let n = tx.execute(
        "UPDATE llm_messages SET state = 'ambiguous', error_kind = 'ambiguous',
             error_message = 'no answer was recorded before the process stopped; it may have been billed', finished_at = ?2
         WHERE state = 'sent' AND +session_id = ?1
           AND request_id IN (SELECT sr.request_id FROM session_request sr
                              JOIN session_item si ON si.session_id = sr.session_id AND si.item_id = sr.item_id
                              WHERE sr.session_id = ?1 AND si.lease_until IS NULL)
           -- a line of a provider batch still open is not lost: the resume
           -- polls its batch and ingests the result
           AND NOT EXISTS (SELECT 1 FROM provider_batch_item bi
                           JOIN provider_batch b ON b.batch_id = bi.batch_id
                           WHERE bi.request_id = llm_messages.request_id
                             AND bi.attempt = llm_messages.attempt AND b.state != 'ingested')",
        params![session_id, now],
    )? as u64;
    tx.execute(
        "UPDATE llm_batch_session SET ambiguous_count = ambiguous_count + ?2, attempt_count = attempt_count + ?2,
             state = CASE WHEN ?7 OR desired_state != 'paused' THEN 'running' ELSE 'paused' END,
             desired_state = CASE WHEN ?7 THEN 'running' ELSE desired_state END,
             stop_after_stage = CASE WHEN ?7 THEN NULL ELSE stop_after_stage END,
             stop_reason = CASE WHEN ?7 OR desired_state != 'paused' THEN NULL ELSE stop_reason END,
             completed_at = NULL, max_cost_usd = COALESCE(?3, max_cost_usd),
             owner_pid = ?4, owner_host = ?5, heartbeat_at = ?6, updated_at = ?6
         WHERE session_id = ?1",
        params![session_id, n as i64, max_cost_usd, std::process::id(), hostname(), now, resume],
    )?;
    tx.commit()?;
    Ok(Repair {
        ambiguous: n,
        live_workers,
    })
}

/// What `repair_interrupted` found.
#[derive(Debug, Clone, PartialEq)]
pub struct Repair {
    /// Attempts that were in flight at a stop and are now ambiguous.
    pub ambiguous: u64,
    /// Workers running the session already (this process joins them).
    pub live_workers: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store;
    use crate::writer::{AttemptRecord, Fence, LedgerWriter, SendIntent, WriteError, WriteOp};

    /// A ledger with one session of `n` items, one stage.
    fn ledger(n: usize) -> (tempfile::TempDir, std::path::PathBuf, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("docket.sqlite");
        let mut conn = Connection::Sqlite(crate::open(&path).unwrap());
        let ids: Vec<String> = (0..n).map(|i| format!("item-{i:03}")).collect();
        for id in &ids {
            conn.execute(
                "INSERT INTO decision (item_id, evidence_json, imported_at, updated_at) VALUES (?1, '{}', 0, 0)",
                params![id],
            )
            .unwrap();
        }
        let taken = store::create_session(
            &mut conn,
            &store::NewSession {
                session_id: "s1",
                config_snapshot_json: "{}",
                stages: &[store::NewStage {
                    name: "adjudicate",
                    provider: "main",
                    model: "m",
                    template_hash: "t",
                    params_hash: "p",
                    critic_of: None,
                    rerun: false,
                }],
                estimated_tokens: 0,
                estimated_cost_usd: 0.0,
                max_cost_usd: None,
                item_ids: &ids,
            },
        )
        .unwrap();
        assert_eq!(taken, n);
        (dir, path, conn)
    }

    fn positions(items: &[WorkItem]) -> Vec<i64> {
        items.iter().map(|w| w.position).collect()
    }

    #[test]
    fn two_workers_claim_disjoint_pages_and_tokens_grow() {
        let (_d, _p, mut conn) = ledger(10);
        let a = claim_page(&mut conn, "s1", "a", ClaimScope::After(-1), 4, 30.0).unwrap();
        let b = claim_page(&mut conn, "s1", "b", ClaimScope::After(-1), 4, 30.0).unwrap();
        assert_eq!(positions(&a), vec![0, 1, 2, 3]);
        assert_eq!(positions(&b), vec![4, 5, 6, 7], "a's items are not b's");
        assert!(a.iter().chain(&b).all(|w| w.claim_token == 1));
        assert_eq!(a[0].stages.len(), 1, "the work comes with the claim");
        // Nothing of the others' is taken over while their leases hold.
        let c = claim_page(&mut conn, "s1", "c", ClaimScope::Takeover, 100, 30.0).unwrap();
        assert_eq!(positions(&c), vec![8, 9]);
        assert!(
            claim_page(&mut conn, "s1", "c", ClaimScope::Takeover, 100, 30.0)
                .unwrap()
                .is_empty()
        );
        assert_eq!(held_by_others(&conn, "s1", "c").unwrap(), 8);
        // a's lease runs out: c takes its items over, each with a new token.
        conn.execute(
            "UPDATE session_item SET lease_until = 1 WHERE claimed_by = 'a'",
            params![],
        )
        .unwrap();
        let taken = claim_page(&mut conn, "s1", "c", ClaimScope::Takeover, 100, 30.0).unwrap();
        assert_eq!(positions(&taken), vec![0, 1, 2, 3]);
        assert!(taken.iter().all(|w| w.claim_token == 2));
        // Renewal extends only what a worker still holds.
        assert_eq!(renew(&conn, "s1", "a", 30.0).unwrap(), 0);
        assert_eq!(renew(&conn, "s1", "b", 30.0).unwrap(), 4);
        // Leaving lets go of everything at once.
        assert_eq!(release_all(&conn, "s1", "b").unwrap(), 4);
        let again = claim_page(&mut conn, "s1", "a", ClaimScope::Takeover, 100, 30.0).unwrap();
        assert_eq!(positions(&again), vec![4, 5, 6, 7]);
    }

    #[test]
    fn a_takeover_marks_the_old_workers_attempts_ambiguous() {
        let (_d, _p, mut conn) = ledger(2);
        let a = claim_page(&mut conn, "s1", "a", ClaimScope::After(-1), 1, 30.0).unwrap();
        let request = a[0].stages[0].request_id;
        conn.execute(
            "INSERT INTO llm_messages (request_id, attempt, session_id, client_request_id, state, user_prompt, sent_at)
             VALUES (?1, 1, 's1', 'x', 'sent', 'p', 0)",
            params![request],
        )
        .unwrap();
        conn.execute(
            "UPDATE session_item SET lease_until = 1 WHERE claimed_by = 'a'",
            params![],
        )
        .unwrap();
        let b = claim_page(&mut conn, "s1", "b", ClaimScope::After(-1), 1, 30.0).unwrap();
        assert_eq!(positions(&b), vec![0]);
        assert_eq!(b[0].stages[0].attempt, 1, "the next send is attempt 2");
        let (state, ambiguous): (String, i64) = conn
            .query_row(
                "SELECT m.state, s.ambiguous_count FROM llm_messages m, llm_batch_session s WHERE s.session_id = 's1'",
                params![],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!((state.as_str(), ambiguous), ("ambiguous", 1));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_under_a_lost_claim_is_refused_and_counted_as_orphaned() {
        let (_d, path, mut conn) = ledger(1);
        let a = claim_page(&mut conn, "s1", "a", ClaimScope::After(-1), 1, 30.0).unwrap();
        let (item, request) = (a[0].item_id.clone(), a[0].stages[0].request_id);
        let (writer, handle) = LedgerWriter::start(&path).unwrap();
        let fence = |token| Fence::Item {
            session_id: "s1".into(),
            item_id: item.clone(),
            token,
            worker_id: "a".into(),
        };
        let send = WriteOp::Send(SendIntent {
            session_id: "s1".into(),
            request_id: request,
            attempt: 1,
            client_request_id: "s1-1-1".into(),
            system_prompt: None,
            user_prompt: "p".into(),
        });
        writer.write_fenced(send, fence(1)).await.unwrap();
        // a stalls; b takes the item over.
        conn.execute("UPDATE session_item SET lease_until = 1", params![])
            .unwrap();
        let b = claim_page(&mut conn, "s1", "b", ClaimScope::Takeover, 1, 30.0).unwrap();
        assert_eq!(b[0].claim_token, 2);
        let late = WriteOp::Attempt(AttemptRecord {
            session_id: "s1".into(),
            request_id: request,
            attempt: 1,
            state: "answered",
            http_status: Some(200),
            output_tokens: Some(7),
            cost_usd: 0.25,
            ..Default::default()
        });
        assert_eq!(
            writer.write_fenced(late, fence(1)).await,
            Err(WriteError::LeaseLost)
        );
        // A send under the old token is refused too: nothing leaves.
        let resend = WriteOp::Send(SendIntent {
            session_id: "s1".into(),
            request_id: request,
            attempt: 2,
            client_request_id: "s1-1-2".into(),
            system_prompt: None,
            user_prompt: "p".into(),
        });
        assert_eq!(
            writer.write_fenced(resend, fence(1)).await,
            Err(WriteError::LeaseLost)
        );
        drop(writer);
        tokio::task::block_in_place(|| handle.join());
        let (state, cost): (String, f64) = conn
            .query_row(
                "SELECT state, cost_usd FROM llm_messages WHERE request_id = ?1 AND attempt = 1",
                params![request],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(state, "ambiguous", "marked by the takeover, not answered");
        assert!((cost - 0.25).abs() < 1e-9, "what it paid is on record");
        assert_eq!(store::orphaned_spend(&conn, "s1").unwrap(), (1, 0.25));
        let attempts: i64 = conn
            .query_row("SELECT COUNT(*) FROM llm_messages", params![], |r| r.get(0))
            .unwrap();
        assert_eq!(attempts, 1, "the refused send wrote nothing");
        let events: i64 = conn
            .query_row(
                "SELECT COUNT(*) FROM session_event WHERE kind = 'lease_lost'",
                params![],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(events, 1);
    }
}
