//! Claims: a page of a session's items (in order, or taken over from
//! workers that died or stalled), or the items of a provider batch's lines,
//! each under a lease and a new fencing token.

use std::collections::HashMap;

use super::ClaimScope;
use crate::db::{Connection, Dialect, OptionalExtension, TransactionBehavior, params};
use crate::store::WorkItem;

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
    let picked = pick_claimable(&tx, session_id, worker, scope, n, now)?;
    if picked.is_empty() {
        tx.commit()?;
        return Ok(Vec::new());
    }
    let tokens = take_picked(&tx, session_id, worker, &picked, now + lease_secs)?;
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
    mark_taken_over_ambiguous(&tx, session_id, worker, &picked, &tokens, now)?;
    let items = load_claimed(&tx, session_id, &tokens)?;
    tx.commit()?;
    Ok(items)
}

/// An item a claim picked: (row, position, item id, previous holder,
/// whether that holder had it leased); the row is SQLite's rowid, or the
/// position on PostgreSQL.
type Picked = (i64, i64, String, Option<String>, bool);

/// The items `scope` allows, up to `n`, locked on PostgreSQL (rows another
/// claim holds are skipped).
fn pick_claimable(
    tx: &Connection,
    session_id: &str,
    worker: &str,
    scope: ClaimScope,
    n: usize,
    now: f64,
) -> crate::db::Result<Vec<Picked>> {
    let postgres = tx.dialect() == Dialect::Postgres;
    let row_id = if postgres { "si.position" } else { "si.rowid" };
    let picked: Vec<Picked> = {
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
        let mut sql = sql.replace("{ROW}", row_id);
        if has_open_batches(tx, session_id)? {
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
    Ok(picked)
}

/// An item whose request waits as a line in an open provider batch
/// is not taken: sending it again would pay twice, and its result
/// comes to whoever holds the batch (see `batches::adopt` and
/// `claim_requests`), which takes the item then.
fn has_open_batches(tx: &Connection, session_id: &str) -> crate::db::Result<bool> {
    tx.prepare_cached(
        "SELECT EXISTS (SELECT 1 FROM provider_batch WHERE session_id = ?1 AND state != 'ingested')",
    )?
    .query_row(params![session_id], |r| r.get(0))
}

/// Claim the items picked for `worker` until `lease_until`: position -> the
/// new token of each item claimed.
fn take_picked(
    tx: &Connection,
    session_id: &str,
    worker: &str,
    picked: &[Picked],
    lease_until: f64,
) -> crate::db::Result<HashMap<i64, i64>> {
    let postgres = tx.dialect() == Dialect::Postgres;
    let mut tokens = HashMap::with_capacity(picked.len());
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
    for (row, position, _, _, _) in picked {
        let token: Option<i64> = if postgres {
            claim
                .query_row(params![row, worker, lease_until, session_id], |r| r.get(0))
                .optional()?
        } else {
            Some(claim.query_row(params![row, worker, lease_until], |r| r.get(0))?)
        };
        if let Some(token) = token {
            tokens.insert(*position, token);
        }
    }
    Ok(tokens)
}

/// Taken from another worker that held it: what it left in flight may
/// have been billed. (Items let go cleanly have nothing in flight.)
fn mark_taken_over_ambiguous(
    tx: &Connection,
    session_id: &str,
    worker: &str,
    picked: &[Picked],
    tokens: &HashMap<i64, i64>,
    now: f64,
) -> crate::db::Result<()> {
    let mut ambiguous = 0;
    for (_, position, item_id, holder, leased) in picked {
        if *leased && holder.as_deref() != Some(worker) && tokens.contains_key(position) {
            ambiguous += mark_in_flight_ambiguous(tx, session_id, item_id, now)?;
        }
    }
    if ambiguous > 0 {
        tx.prepare_cached(
            "UPDATE llm_batch_session SET ambiguous_count = ambiguous_count + ?2,
                 attempt_count = attempt_count + ?2, updated_at = ?3 WHERE session_id = ?1",
        )?
        .execute(params![session_id, ambiguous as i64, now])?;
    }
    Ok(())
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
        let mut all = crate::store::work_between(conn, session_id, first, last)?;
        all.retain(|w| tokens.contains_key(&w.position));
        all
    } else {
        let mut positions: Vec<i64> = tokens.keys().copied().collect();
        positions.sort_unstable();
        let mut all = Vec::with_capacity(positions.len());
        for p in positions {
            all.extend(crate::store::work_between(conn, session_id, p, p)?);
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
