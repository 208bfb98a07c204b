//! The review search index (the trigram FTS5 table `review_search`) is kept
//! up to date in batches. The ledger writer inserts review items one by one
//! inside small group transactions; indexing each as it came cost about a
//! third of the writer's time, because every transaction wrote (and later
//! merged) its own index segment. Now an insert only notes the new id in
//! `review_search_pending` (migration 0007); the writer calls
//! `Pacer::maybe_catch_up` in its transactions and indexes the noted rows
//! once enough have gathered or enough time has passed. Searches read the
//! noted rows directly (the console's review queue), so nothing is ever
//! missing from a search.

use std::time::{Duration, Instant};

use crate::db::{Connection, params};

/// Index as soon as this many review items wait: big enough that a segment
/// is worth writing, small enough that a search's direct read of them stays
/// a millisecond or two.
const CATCH_UP_ROWS: i64 = 4_096;

/// A smaller backlog is indexed once this much time has passed, so that a
/// quiet queue ends up fully indexed.
const CATCH_UP_AFTER: Duration = Duration::from_secs(2);

/// Paces the writer's catch-ups.
pub(crate) struct Pacer {
    last: Instant,
    /// None until known; false on a ledger from before migration 0007,
    /// whose triggers index every row as it is inserted.
    batched: Option<bool>,
}

impl Pacer {
    pub(crate) fn new() -> Pacer {
        Pacer {
            last: Instant::now(),
            batched: None,
        }
    }

    /// Inside a write transaction: index the waiting review items if there
    /// are enough of them or the last catch-up is old enough. Returns the
    /// rows indexed.
    pub(crate) fn maybe_catch_up(&mut self, conn: &Connection) -> crate::db::Result<u64> {
        let batched = match self.batched {
            Some(b) => b,
            None => *self.batched.insert(is_batched(conn)?),
        };
        if !batched {
            return Ok(0);
        }
        let waiting = backlog(conn)?;
        let due =
            waiting >= CATCH_UP_ROWS || (waiting > 0 && self.last.elapsed() >= CATCH_UP_AFTER);
        if !due {
            return Ok(0);
        }
        self.last = Instant::now();
        catch_up(conn)
    }
}

/// Whether this ledger indexes in batches (it has migration 0007's table).
pub(crate) fn is_batched(conn: &Connection) -> crate::db::Result<bool> {
    conn.has_table("review_search_pending")
}

/// How many review items wait to be indexed.
fn backlog(conn: &Connection) -> crate::db::Result<i64> {
    conn.prepare_cached("SELECT COUNT(*) FROM review_search_pending")?
        .query_row(params![], |r| r.get(0))
}

/// Index every waiting review item, in the caller's write transaction (so a
/// search never sees a row twice or not at all). Returns the rows indexed;
/// 0 on a ledger that indexes by trigger.
pub fn catch_up(conn: &Connection) -> crate::db::Result<u64> {
    if !is_batched(conn)? {
        return Ok(0);
    }
    let added = conn
        .prepare_cached(
            "INSERT INTO review_search (rowid, item_id, llm_suggestion_json, rationale)
             SELECT r.review_id, r.item_id, r.llm_suggestion_json, r.rationale
             FROM review_search_pending p JOIN review_item r ON r.review_id = p.review_id
             ORDER BY p.review_id",
        )?
        .execute(params![])?;
    conn.prepare_cached("DELETE FROM review_search_pending")?
        .execute(params![])?;
    Ok(added as u64)
}
