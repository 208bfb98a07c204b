//! The review queue: one page of pending items, highest confidence first,
//! filtered by a substring, with its total. SQLite's own features do the
//! work here: the trigram FTS5 index (`review_search`) answers filters, and
//! the page and its count are read in one read transaction.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use crate::db::{Connection, Dialect, OptionalExtension, ToDb, params};

use crate::watch::{DEFAULT_PAGE, ReviewPage, ReviewQuery, ReviewRow};
use crate::{now_ts, search_index};

/// The columns of one queue row. A claim shows while its lease is unexpired.
const ROW_COLUMNS: &str =
    "r.review_id, r.item_id, r.session_id, r.confidence, r.llm_suggestion_json,
     r.rationale, r.model_id, CASE WHEN r.claim_expires_at > :now THEN r.claimed_by END, r.audit,
     (SELECT d.evidence_json FROM decision d WHERE d.item_id = r.item_id), r.stale";

/// The queue's conditions. Each query is assembled from these fixed pieces
/// (never from input: the session and filter are bound), so that an
/// unfiltered count reads only the covering queue index and never the rows.
const PENDING: &str = "r.status = 'pending'";
const IN_SESSION: &str = " AND r.session_id = :session";
/// SQLite's LIKE folds ASCII case itself, with no copy of each text as
/// `lower()` makes: about three times faster over a full queue.
const MATCHES: &str = " AND (r.item_id LIKE :pattern ESCAPE '\\'
     OR r.llm_suggestion_json LIKE :pattern ESCAPE '\\'
     OR r.rationale LIKE :pattern ESCAPE '\\')";
/// A filter of three characters or more is looked up in the trigram index
/// (migration 0003): the matching ids come from the index, not from reading
/// every pending suggestion. Shorter ones have no trigram and use LIKE.
const SEARCHED: &str =
    " AND r.review_id IN (SELECT rowid FROM review_search WHERE review_search MATCH :phrase)";
/// Since migration 0007 the newest review items wait in
/// `review_search_pending` until the writer indexes them in a batch: those
/// few are read directly.
const SEARCHED_OR_WAITING: &str =
    " AND (r.review_id IN (SELECT rowid FROM review_search WHERE review_search MATCH :phrase)
     OR (r.review_id IN (SELECT review_id FROM review_search_pending)
         AND (r.item_id LIKE :pattern ESCAPE '\\'
              OR r.llm_suggestion_json LIKE :pattern ESCAPE '\\'
              OR r.rationale LIKE :pattern ESCAPE '\\')))";

/// How a filter is answered.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Lookup {
    /// LIKE over the queue (no trigram in the filter).
    Scan,
    /// The trigram index holds every review item (a ledger before 0007).
    Index,
    /// The index, plus the review items still waiting to be indexed.
    IndexAndWaiting,
}

fn lookup(filter: &str, batched_index: bool, postgres: bool) -> Lookup {
    // PostgreSQL has no FTS5 table: its trigram index (pg_trgm, migration
    // 0003) serves the LIKE (ILIKE there) directly.
    if filter.chars().count() < 3 || postgres {
        Lookup::Scan
    } else if batched_index {
        Lookup::IndexAndWaiting
    } else {
        Lookup::Index
    }
}

/// The filter clause for `filter` on the rows of `review_item r`.
fn text_match(filter: &str, batched_index: bool, postgres: bool) -> &'static str {
    match lookup(filter, batched_index, postgres) {
        Lookup::Scan => MATCHES,
        Lookup::Index => SEARCHED,
        Lookup::IndexAndWaiting => SEARCHED_OR_WAITING,
    }
}

/// Reading a whole filtered queue starts from the index's matches (a few
/// rowids) rather than walking the queue index and probing each row.
const SEARCH_FROM: &str =
    "review_search CROSS JOIN review_item r ON r.review_id = review_search.rowid";
const SEARCH_JOINED: &str = " AND review_search MATCH :phrase";
/// The same with the waiting review items' matches added (they are never in
/// the index, so no id comes twice).
const SEARCH_AND_WAITING_FROM: &str = "(SELECT rowid AS rid FROM review_search WHERE review_search MATCH :phrase
       UNION ALL
       SELECT w.review_id FROM review_search_pending p JOIN review_item w ON w.review_id = p.review_id
       WHERE w.item_id LIKE :pattern ESCAPE '\\'
          OR w.llm_suggestion_json LIKE :pattern ESCAPE '\\'
          OR w.rationale LIKE :pattern ESCAPE '\\') m
     CROSS JOIN review_item r ON r.review_id = m.rid";
const PLAIN_FROM: &str = "review_item r";

/// `filter` as one FTS5 phrase: a substring, every character literal.
fn fts_phrase(filter: &str) -> String {
    format!("\"{}\"", filter.replace('"', "\"\""))
}

/// One page of pending review items, highest confidence first (items with no
/// confidence last), then oldest first. `limit` 0 means [`DEFAULT_PAGE`].
/// The filter is a case-insensitive substring (ASCII case folding, as
/// SQLite's LIKE) of the item id, the suggestion JSON or the rationale.
///
/// `r.status = 'pending'` and the order walk `idx_review_item_queue`
/// (status, confidence DESC, review_id) in order, so an unfiltered page reads
/// only its own rows. SQLite puts NULLs last in a DESC order, as the queue
/// wants; spelling out `NULLS LAST` would stop it using the index.
pub(super) fn review_page(conn: &Connection, q: &ReviewQuery) -> crate::db::Result<ReviewPage> {
    let filter = q.filter.as_deref().filter(|f| !f.is_empty());
    let session = q.session.as_deref();
    let limit = if q.limit == 0 { DEFAULT_PAGE } else { q.limit };
    let mut cond = String::from(PENDING);
    if session.is_some() {
        cond.push_str(IN_SESSION);
    }
    let batched_index = search_index::is_batched(conn)?;
    let postgres = conn.dialect() == Dialect::Postgres;
    let mut from = PLAIN_FROM;
    if let Some(f) = filter {
        match lookup(f, batched_index, postgres) {
            Lookup::Scan => cond.push_str(MATCHES),
            Lookup::Index => {
                from = SEARCH_FROM;
                cond.push_str(SEARCH_JOINED);
            }
            Lookup::IndexAndWaiting => from = SEARCH_AND_WAITING_FROM,
        }
    }
    let binds = Binds {
        batched_index,
        postgres,
        now: now_ts(),
        session,
        filter,
        pattern: filter.map(like_pattern),
        phrase: filter.map(fts_phrase),
        limit: to_i64(limit),
        offset: to_i64(q.offset),
    };

    // One read snapshot: the total and the rows agree, and the count cache
    // below sees a consistent fingerprint.
    let own_tx = conn.is_autocommit();
    if own_tx {
        conn.execute_batch("BEGIN")?;
    }
    let page = read_page(conn, q, from, &cond, &binds);
    if own_tx {
        // A read transaction: ending it cannot lose anything.
        let _ = conn.execute_batch(if page.is_ok() { "COMMIT" } else { "ROLLBACK" });
    }
    page
}

fn read_page(
    conn: &Connection,
    q: &ReviewQuery,
    from: &str,
    cond: &str,
    binds: &Binds<'_>,
) -> crate::db::Result<ReviewPage> {
    let total = pending_count(conn, from, cond, binds)?;
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {ROW_COLUMNS} FROM {from} WHERE {cond}
         ORDER BY r.status, r.confidence DESC, r.review_id LIMIT :limit OFFSET :offset"
    ))?;
    let mut rows = stmt.query_named(&binds.named())?;
    let mut out = Vec::new();
    while let Some(r) = rows.next()? {
        let suggestion: String = r.get(4)?;
        out.push(ReviewRow {
            review_id: r.get(0)?,
            item_id: r.get(1)?,
            session_id: r.get(2)?,
            confidence: r.get(3)?,
            suggestion: compact_json(&suggestion),
            rationale: r.get(5)?,
            model_id: r.get(6)?,
            claimed_by: r.get(7)?,
            audit: r.get::<_, i64>(8)? != 0,
            evidence: r.get::<_, Option<String>>(9)?.unwrap_or_default(),
            stale: r.get::<_, i64>(10)? != 0,
        });
    }
    Ok(ReviewPage {
        total: u64::try_from(total).unwrap_or(0),
        offset: q.offset,
        rows: out,
        several_sessions: several_sessions(conn)?,
    })
}

/// Whether more than one session has items in the queue: its smallest and
/// largest session ids differ (each one lookup in the (status, session_id)
/// index of migration 0008; a separate MIN and MAX, as SQLite answers only
/// a lone one from an index).
fn several_sessions(conn: &Connection) -> crate::db::Result<bool> {
    let (first, last): (Option<String>, Option<String>) = conn
        .prepare_cached(
            "SELECT (SELECT MIN(session_id) FROM review_item WHERE status = 'pending'),
                    (SELECT MAX(session_id) FROM review_item WHERE status = 'pending')",
        )?
        .query_row(params![], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok(first.is_some() && first != last)
}

/// How many pending items match. Counting walks every matching index entry
/// (a few ms at 100,000 pending; far more with a filter), and the console
/// asks twice a second, so the count is kept per (ledger, session, filter)
/// with a fingerprint of what can change it: review items are only ever
/// appended (the highest review id grows) and leave or re-enter the queue
/// only by a decision or an undo, each of which appends to `review_log`, or
/// by being superseded (migration 0008), which the number of superseded
/// rows tells. New items are counted incrementally by their id range; any
/// decision or supersession recounts in full.
fn pending_count(
    conn: &Connection,
    from: &str,
    cond: &str,
    binds: &Binds<'_>,
) -> crate::db::Result<i64> {
    let full = |conn: &Connection| -> crate::db::Result<i64> {
        let mut stmt = conn.prepare_cached(&format!("SELECT COUNT(*) FROM {from} WHERE {cond}"))?;
        count_row(stmt.query_named(&binds.named())?)
    };
    let Some(path) = conn.location() else {
        return full(conn);
    };
    let seen = fingerprint(conn)?;
    let key = CountKey {
        path: path.to_string(),
        session: binds.session.map(str::to_string),
        filter: binds.filter.map(str::to_string),
    };
    let cached = COUNTS
        .lock()
        .ok()
        .and_then(|c| c.get(&key).copied())
        .filter(|c| {
            c.seen.max_log_id == seen.max_log_id
                && c.seen.superseded == seen.superseded
                && c.seen.first_created_bits == seen.first_created_bits
                && c.seen.max_review_id <= seen.max_review_id
        });
    let count = match cached {
        Some(c) if c.seen.max_review_id == seen.max_review_id => c.count,
        Some(c) => {
            // Only new items since: count those by id (`+` keeps SQLite on
            // the id range rather than the status or session index).
            let mut sql = String::from(
                "SELECT COUNT(*) FROM review_item r
                 WHERE r.review_id > :lo AND r.review_id <= :hi AND +r.status = 'pending'",
            );
            if binds.session.is_some() {
                sql.push_str(" AND +r.session_id = :session");
            }
            if let Some(f) = binds.filter {
                sql.push_str(text_match(f, binds.batched_index, binds.postgres));
            }
            let mut stmt = conn.prepare_cached(&sql)?;
            let mut named = binds.named().to_vec();
            named.push((":lo", &c.seen.max_review_id));
            named.push((":hi", &seen.max_review_id));
            c.count + count_row(stmt.query_named(&named)?)?
        }
        None => full(conn)?,
    };
    if let Ok(mut counts) = COUNTS.lock() {
        // Each filter typed is a key: keep the cache small.
        if counts.len() >= MAX_CACHED_COUNTS && !counts.contains_key(&key) {
            counts.clear();
        }
        counts.insert(key, CachedCount { seen, count });
    }
    Ok(count)
}

/// What can change the queue's count, read cheaply.
fn fingerprint(conn: &Connection) -> crate::db::Result<Fingerprint> {
    let max_review_id: i64 = conn
        .prepare_cached("SELECT COALESCE(MAX(review_id), 0) FROM review_item")?
        .query_row(params![], |r| r.get(0))?;
    // Tells a ledger recreated at the same path from the one counted.
    let first_created_at: Option<f64> = conn
        .prepare_cached("SELECT created_at FROM review_item ORDER BY review_id LIMIT 1")?
        .query_row(params![], |r| r.get(0))
        .optional()?;
    let max_log_id: i64 = conn
        .prepare_cached("SELECT COALESCE(MAX(log_id), 0) FROM review_log")?
        .query_row(params![], |r| r.get(0))?;
    // Rows leave the queue without a log entry when a newer suggestion
    // supersedes them (a range of the status index: cheap).
    let superseded: i64 = conn
        .prepare_cached("SELECT COUNT(*) FROM review_item WHERE status = 'superseded'")?
        .query_row(params![], |r| r.get(0))?;
    Ok(Fingerprint {
        max_review_id,
        max_log_id,
        superseded,
        first_created_bits: first_created_at.map(f64::to_bits),
    })
}

fn count_row(mut rows: crate::db::Rows<'_>) -> crate::db::Result<i64> {
    match rows.next()? {
        Some(r) => r.get(0),
        None => Ok(0),
    }
}

const MAX_CACHED_COUNTS: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct CountKey {
    path: String,
    session: Option<String>,
    filter: Option<String>,
}

#[derive(Debug, Clone, Copy)]
struct Fingerprint {
    max_review_id: i64,
    max_log_id: i64,
    superseded: i64,
    first_created_bits: Option<u64>,
}

#[derive(Debug, Clone, Copy)]
struct CachedCount {
    seen: Fingerprint,
    count: i64,
}

static COUNTS: LazyLock<Mutex<HashMap<CountKey, CachedCount>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// `%text%` with LIKE's own wildcards in `text` taken literally.
fn like_pattern(text: &str) -> String {
    let mut p = String::with_capacity(text.len() + 2);
    p.push('%');
    for c in text.chars() {
        if matches!(c, '%' | '_' | '\\') {
            p.push('\\');
        }
        p.push(c);
    }
    p.push('%');
    p
}

/// The queue's parameters, bound by name to whichever the statement uses.
struct Binds<'a> {
    /// Not a parameter: whether the ledger indexes review items in batches
    /// (see `search_index`), which decides the filter's SQL.
    batched_index: bool,
    /// Not a parameter: a PostgreSQL ledger (no FTS5 table).
    postgres: bool,
    now: f64,
    session: Option<&'a str>,
    filter: Option<&'a str>,
    pattern: Option<String>,
    phrase: Option<String>,
    limit: i64,
    offset: i64,
}

impl Binds<'_> {
    /// Every parameter by name; a statement takes the ones it uses.
    fn named(&self) -> [(&'static str, &dyn ToDb); 7] {
        [
            (":now", &self.now),
            (":session", &self.session),
            (":filter", &self.filter),
            (":pattern", &self.pattern),
            (":phrase", &self.phrase),
            (":limit", &self.limit),
            (":offset", &self.offset),
        ]
    }
}

/// Compact JSON, or the text as it is when it is not JSON.
fn compact_json(text: &str) -> String {
    // The engine stores compact JSON: keep it (and its key order) as it is.
    if !text.contains('\n') {
        return text.to_string();
    }
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| serde_json::to_string(&v).ok())
        .unwrap_or_else(|| text.to_string())
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
