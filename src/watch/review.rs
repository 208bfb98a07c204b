//! The review queue: pending items by confidence, and one item in detail.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use rusqlite::{Connection, OptionalExtension, params};

use super::sessions::{has_table, text};
use super::{
    DEFAULT_PAGE, ReviewDetail, ReviewPage, ReviewQuery, ReviewRow, StageOutput, StageVerdict,
};
use crate::ledger::now_ts;

/// The columns of one queue row. A claim shows while its lease is unexpired.
const ROW_COLUMNS: &str =
    "r.review_id, r.item_id, r.session_id, r.confidence, r.llm_suggestion_json,
     r.rationale, r.model_id, CASE WHEN r.claim_expires_at > :now THEN r.claimed_by END";

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

/// The filter clause for `filter`: the index when it can answer.
fn text_match(filter: &str) -> &'static str {
    if filter.chars().count() >= 3 {
        SEARCHED
    } else {
        MATCHES
    }
}

/// Reading a whole filtered queue starts from the index's matches (a few
/// rowids) rather than walking the queue index and probing each row.
const SEARCH_FROM: &str =
    "review_search CROSS JOIN review_item r ON r.review_id = review_search.rowid";
const SEARCH_JOINED: &str = " AND review_search MATCH :phrase";
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
pub fn review_page(conn: &Connection, q: &ReviewQuery) -> rusqlite::Result<ReviewPage> {
    let filter = q.filter.as_deref().filter(|f| !f.is_empty());
    let session = q.session.as_deref();
    let limit = if q.limit == 0 { DEFAULT_PAGE } else { q.limit };
    let mut cond = String::from(PENDING);
    if session.is_some() {
        cond.push_str(IN_SESSION);
    }
    let mut from = PLAIN_FROM;
    if let Some(f) = filter {
        if text_match(f) == SEARCHED {
            from = SEARCH_FROM;
            cond.push_str(SEARCH_JOINED);
        } else {
            cond.push_str(MATCHES);
        }
    }
    let binds = Binds {
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
) -> rusqlite::Result<ReviewPage> {
    let total = pending_count(conn, from, cond, binds)?;
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {ROW_COLUMNS} FROM {from} WHERE {cond}
         ORDER BY r.status, r.confidence DESC, r.review_id LIMIT :limit OFFSET :offset"
    ))?;
    binds.bind(&mut stmt)?;
    let mut rows = stmt.raw_query();
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
        });
    }
    Ok(ReviewPage {
        total: u64::try_from(total).unwrap_or(0),
        offset: q.offset,
        rows: out,
    })
}

/// How many pending items match. Counting walks every matching index entry
/// (a few ms at 100,000 pending; far more with a filter), and the console
/// asks twice a second, so the count is kept per (ledger, session, filter)
/// with a fingerprint of what can change it: review items are only ever
/// appended (the highest review id grows) and leave or re-enter the queue
/// only by a decision or an undo, each of which appends to `review_log`.
/// New items are counted incrementally by their id range; any decision
/// recounts in full.
fn pending_count(
    conn: &Connection,
    from: &str,
    cond: &str,
    binds: &Binds<'_>,
) -> rusqlite::Result<i64> {
    let full = |conn: &Connection| -> rusqlite::Result<i64> {
        let mut stmt = conn.prepare_cached(&format!("SELECT COUNT(*) FROM {from} WHERE {cond}"))?;
        binds.bind(&mut stmt)?;
        count_row(&mut stmt)
    };
    let Some(path) = conn.path().filter(|p| !p.is_empty()) else {
        return full(conn);
    };
    let max_review_id: i64 = conn
        .prepare_cached("SELECT COALESCE(MAX(review_id), 0) FROM review_item")?
        .query_row([], |r| r.get(0))?;
    // Tells a ledger recreated at the same path from the one counted.
    let first_created_at: Option<f64> = conn
        .prepare_cached("SELECT created_at FROM review_item ORDER BY review_id LIMIT 1")?
        .query_row([], |r| r.get(0))
        .optional()?;
    let first_created_bits = first_created_at.map(f64::to_bits);
    let max_log_id: i64 = conn
        .prepare_cached("SELECT COALESCE(MAX(log_id), 0) FROM review_log")?
        .query_row([], |r| r.get(0))?;
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
            c.max_log_id == max_log_id
                && c.first_created_bits == first_created_bits
                && c.max_review_id <= max_review_id
        });
    let count = match cached {
        Some(c) if c.max_review_id == max_review_id => c.count,
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
                sql.push_str(text_match(f));
            }
            let mut stmt = conn.prepare_cached(&sql)?;
            binds.bind(&mut stmt)?;
            if let Some(i) = stmt.parameter_index(":lo")? {
                stmt.raw_bind_parameter(i, c.max_review_id)?;
            }
            if let Some(i) = stmt.parameter_index(":hi")? {
                stmt.raw_bind_parameter(i, max_review_id)?;
            }
            c.count + count_row(&mut stmt)?
        }
        None => full(conn)?,
    };
    if let Ok(mut counts) = COUNTS.lock() {
        // Each filter typed is a key: keep the cache small.
        if counts.len() >= MAX_CACHED_COUNTS && !counts.contains_key(&key) {
            counts.clear();
        }
        counts.insert(
            key,
            CachedCount {
                max_review_id,
                max_log_id,
                first_created_bits,
                count,
            },
        );
    }
    Ok(count)
}

fn count_row(stmt: &mut rusqlite::Statement<'_>) -> rusqlite::Result<i64> {
    let mut rows = stmt.raw_query();
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
struct CachedCount {
    max_review_id: i64,
    max_log_id: i64,
    first_created_bits: Option<u64>,
    count: i64,
}

static COUNTS: LazyLock<Mutex<HashMap<CountKey, CachedCount>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// The queue's parameters, bound by name to whichever the statement uses.
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

struct Binds<'a> {
    now: f64,
    session: Option<&'a str>,
    filter: Option<&'a str>,
    pattern: Option<String>,
    phrase: Option<String>,
    limit: i64,
    offset: i64,
}

impl Binds<'_> {
    fn bind(&self, stmt: &mut rusqlite::Statement<'_>) -> rusqlite::Result<()> {
        if let Some(i) = stmt.parameter_index(":now")? {
            stmt.raw_bind_parameter(i, self.now)?;
        }
        if let Some(i) = stmt.parameter_index(":session")? {
            stmt.raw_bind_parameter(i, self.session)?;
        }
        if let Some(i) = stmt.parameter_index(":filter")? {
            stmt.raw_bind_parameter(i, self.filter)?;
        }
        if let Some(i) = stmt.parameter_index(":pattern")? {
            stmt.raw_bind_parameter(i, self.pattern.as_deref())?;
        }
        if let Some(i) = stmt.parameter_index(":phrase")? {
            stmt.raw_bind_parameter(i, self.phrase.as_deref())?;
        }
        if let Some(i) = stmt.parameter_index(":limit")? {
            stmt.raw_bind_parameter(i, self.limit)?;
        }
        if let Some(i) = stmt.parameter_index(":offset")? {
            stmt.raw_bind_parameter(i, self.offset)?;
        }
        Ok(())
    }
}

/// One review item in full: its evidence, the suggestion and what every
/// stage of every request for the item answered. Texts are returned as
/// stored (the renderer makes them safe for the terminal).
pub fn review_detail(conn: &Connection, review_id: i64) -> rusqlite::Result<Option<ReviewDetail>> {
    let now = now_ts();
    let detail = conn
        .prepare_cached(
            "SELECT r.review_id, r.item_id, r.session_id, r.status, d.evidence_json, r.llm_suggestion_json,
                    r.confidence, r.rationale, r.model_id, r.decided_by, r.decided_at,
                    CASE WHEN r.claim_expires_at > ?2 THEN r.claimed_by END
             FROM review_item r LEFT JOIN decision d ON d.item_id = r.item_id
             WHERE r.review_id = ?1",
        )?
        .query_row(params![review_id, now], |r| {
            let evidence: Option<String> = r.get(4)?;
            let suggestion: String = r.get(5)?;
            Ok(ReviewDetail {
                review_id: r.get(0)?,
                item_id: r.get(1)?,
                session_id: r.get(2)?,
                status: r.get(3)?,
                evidence_json: pretty_json(evidence.as_deref().unwrap_or("")),
                suggestion_json: pretty_json(&suggestion),
                confidence: r.get(6)?,
                rationale: r.get(7)?,
                model_id: r.get(8)?,
                stages: Vec::new(),
                decided_by: r.get(9)?,
                decided_at: r.get(10)?,
                claimed_by: r.get(11)?,
                ..ReviewDetail::default()
            })
        })
        .optional()?;
    let Some(mut detail) = detail else {
        return Ok(None);
    };
    // The item's requests come off the (item_id, stage, ...) unique index.
    let mut stmt = conn.prepare_cached(
        "SELECT q.stage, q.provider, q.model, q.status,
                MAX(q.attempt, (SELECT COALESCE(MAX(a.attempt), 0) FROM llm_messages a WHERE a.request_id = q.request_id)),
                q.parsed_output_json, m.assistant_output, m.finish_reason,
                COALESCE(m.input_tokens, 0), COALESCE(m.output_tokens, 0), COALESCE(m.cost_usd, 0)
         FROM llm_requests q LEFT JOIN llm_messages m ON m.message_id = q.result_message_id
         WHERE q.item_id = ?1
         ORDER BY q.created_at, q.request_id",
    )?;
    let stages = stmt.query_map(params![detail.item_id], |r| {
        Ok(StageOutput {
            stage: r.get(0)?,
            provider: r.get(1)?,
            model: r.get(2)?,
            status: r.get(3)?,
            attempts: u64::try_from(r.get::<_, i64>(4)?).unwrap_or(0),
            parsed_output_json: r.get(5)?,
            raw_output: r.get(6)?,
            finish_reason: r.get(7)?,
            input_tokens: u64::try_from(r.get::<_, i64>(8)?).unwrap_or(0),
            output_tokens: u64::try_from(r.get::<_, i64>(9)?).unwrap_or(0),
            cost_usd: r.get(10)?,
        })
    })?;
    detail.stages = stages.collect::<rusqlite::Result<_>>()?;
    if let Some(session) = detail.session_id.clone() {
        routed(conn, &session, &mut detail)?;
    }
    Ok(Some(detail))
}

/// The fields of a critic's answer read for its verdict, confidence and
/// rationale (the defaults of `[routing.critic]` and the gate).
const VERDICT_FIELDS: [&str; 2] = ["verdict", "agree"];
const CONFIDENCE_FIELDS: [&str; 1] = ["confidence"];
const RATIONALE_FIELDS: [&str; 4] = ["rationale", "reason", "reasoning", "explanation"];

/// The answer stage's output and its critic's verdict, from the session's
/// result for the item (with the critic's own request when the result has
/// none), and the routing note. Leaves the detail as it is on a ledger
/// without staged columns, or an item with no result yet.
fn routed(conn: &Connection, session: &str, d: &mut ReviewDetail) -> rusqlite::Result<()> {
    let staged =
        has_table(conn, "run_stages")? && has_column(conn, "llm_batch_result", "critic_json")?;
    if !staged {
        return Ok(());
    }
    let result = conn
        .prepare_cached(
            "SELECT stage, answer_json, confidence, rationale, critic_json, critic_verdict, routing_note
             FROM llm_batch_result WHERE session_id = ?1 AND item_id = ?2",
        )?
        .query_row(params![session, d.item_id], |r| {
            Ok((
                text(r, 0)?,
                text(r, 1)?,
                real(r, 2)?,
                text(r, 3)?,
                text(r, 4)?,
                text(r, 5)?,
                text(r, 6)?,
            ))
        })
        .optional()?;
    let (answer_stage, answer, confidence, rationale, critic_json, verdict, note) =
        result.unwrap_or_default();
    d.routing_note = note.filter(|n| !n.trim().is_empty());
    // The critic of the answer stage (any critic when it is not named).
    let critic_stage: Option<String> = conn
        .prepare_cached(
            "SELECT stage FROM run_stages
             WHERE session_id = ?1 AND (role = 'critic' OR critic_of IS NOT NULL)
             ORDER BY (critic_of IS ?2) DESC, position LIMIT 1",
        )?
        .query_row(params![session, answer_stage], |r| text(r, 0))
        .optional()?
        .flatten();
    if answer.is_some() || answer_stage.is_some() {
        d.generator = Some(StageVerdict {
            stage: answer_stage.clone().unwrap_or_default(),
            output_json: answer.or_else(|| Some(d.suggestion_json.clone())),
            confidence: confidence.or(d.confidence),
            rationale: rationale.or_else(|| d.rationale.clone()),
            verdict: None,
        });
    }
    let critic_output = match (&critic_json, &critic_stage) {
        (Some(j), _) => Some(j.clone()),
        (None, Some(stage)) => stage_output(conn, session, &d.item_id, stage)?,
        (None, None) => None,
    };
    if critic_output.is_none() && verdict.is_none() {
        return Ok(());
    }
    let fields = critic_output
        .as_deref()
        .and_then(|j| serde_json::from_str::<serde_json::Value>(j).ok());
    let field = |names: &[&str]| {
        let obj = fields.as_ref()?.as_object()?;
        names.iter().find_map(|n| obj.get(*n))
    };
    let as_text = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    d.critic = Some(StageVerdict {
        stage: critic_stage.unwrap_or_else(|| "critic".into()),
        verdict: verdict
            .filter(|v| !v.trim().is_empty())
            .or_else(|| field(&VERDICT_FIELDS).map(as_text)),
        confidence: field(&CONFIDENCE_FIELDS).and_then(serde_json::Value::as_f64),
        rationale: field(&RATIONALE_FIELDS).map(as_text),
        output_json: critic_output,
    });
    Ok(())
}

/// A stage's output for the item: what the session recorded when it
/// passed, else its request's parsed answer.
fn stage_output(
    conn: &Connection,
    session: &str,
    item_id: &str,
    stage: &str,
) -> rusqlite::Result<Option<String>> {
    Ok(conn
        .prepare_cached(
            "SELECT COALESCE(sr.output_json, q.parsed_output_json)
             FROM session_request sr LEFT JOIN llm_requests q ON q.request_id = sr.request_id
             WHERE sr.session_id = ?1 AND sr.item_id = ?2 AND sr.stage = ?3",
        )?
        .query_row(params![session, item_id, stage], |r| text(r, 0))
        .optional()?
        .flatten())
}

fn has_column(conn: &Connection, table: &str, column: &str) -> rusqlite::Result<bool> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2")?
        .query_row(params![table, column], |_| Ok(()))
        .optional()?
        .is_some())
}

/// A REAL column: NULL, text or a non-finite number read as None.
fn real(r: &rusqlite::Row, i: usize) -> rusqlite::Result<Option<f64>> {
    use rusqlite::types::ValueRef;
    Ok(match r.get_ref(i)? {
        ValueRef::Real(f) if f.is_finite() => Some(f),
        ValueRef::Integer(n) => Some(n as f64),
        _ => None,
    })
}

/// Pretty-printed JSON, or the text as it is when it is not JSON.
fn pretty_json(text: &str) -> String {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or_else(|| text.to_string())
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
