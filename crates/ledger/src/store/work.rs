//! The work of a session's items: each item's evidence and the stages it
//! still has to run, page by page or for a stretch of positions.

use crate::db::{Connection, OptionalExtension, params};

/// One stage of an item still to process.
#[derive(Debug, Clone)]
pub struct StageWork {
    pub stage: String,
    pub position: i64,
    pub request_id: i64,
    /// 'pending', 'passed', 'failed' or 'skipped' (this session's view).
    pub state: String,
    /// The request's own status: 'completed' when an answer passed before
    /// (this session, or an earlier one whose answer is reused).
    pub status: String,
    pub attempt: i64,
    pub gate_failures: i64,
    pub transport_retries: i64,
    pub parsed_output_json: Option<String>,
    /// The stage's output for the item (passed).
    pub output_json: Option<String>,
}

/// One item still to process in a session, with every stage.
#[derive(Debug, Clone)]
pub struct WorkItem {
    pub position: i64,
    pub item_id: String,
    pub evidence_json: String,
    /// The hash of `evidence_json` (None for an item imported before the
    /// ledger kept hashes): what each request records when it is sent with
    /// this evidence.
    pub evidence_hash: Option<String>,
    /// In job order.
    pub stages: Vec<StageWork>,
    /// The fencing token this worker claimed the item with (0: not claimed,
    /// a read for a report).
    pub claim_token: i64,
}

/// The next `n` items after `after_position` that have no outcome yet, in
/// order, with every stage's request.
pub(crate) fn next_work(
    conn: &Connection,
    session_id: &str,
    after_position: i64,
    n: usize,
) -> crate::db::Result<Vec<WorkItem>> {
    let mut stmt = conn.prepare_cached(
        "SELECT si.position, si.item_id, d.evidence_json, d.evidence_hash
         FROM session_item si
         JOIN decision d ON d.item_id = si.item_id
         WHERE si.session_id = ?1 AND si.position > ?2
           AND NOT EXISTS (SELECT 1 FROM llm_batch_result b WHERE b.session_id = si.session_id AND b.item_id = si.item_id)
         ORDER BY si.position LIMIT ?3",
    )?;
    let items = stmt
        .query_map(params![session_id, after_position, n as i64], work_item)?
        .collect::<crate::db::Result<Vec<_>>>()?;
    with_stages(conn, session_id, items)
}

/// The items between two positions (inclusive) that have no outcome yet,
/// with every stage's request.
pub(crate) fn work_between(
    conn: &Connection,
    session_id: &str,
    first: i64,
    last: i64,
) -> crate::db::Result<Vec<WorkItem>> {
    let mut stmt = conn.prepare_cached(
        "SELECT si.position, si.item_id, d.evidence_json, d.evidence_hash
         FROM session_item si
         JOIN decision d ON d.item_id = si.item_id
         WHERE si.session_id = ?1 AND si.position BETWEEN ?2 AND ?3
           AND NOT EXISTS (SELECT 1 FROM llm_batch_result b WHERE b.session_id = si.session_id AND b.item_id = si.item_id)
         ORDER BY si.position",
    )?;
    let items = stmt
        .query_map(params![session_id, first, last], work_item)?
        .collect::<crate::db::Result<Vec<_>>>()?;
    with_stages(conn, session_id, items)
}

fn work_item(r: &crate::db::Row<'_>) -> crate::db::Result<WorkItem> {
    Ok(WorkItem {
        position: r.get(0)?,
        item_id: r.get(1)?,
        evidence_json: r.get(2)?,
        evidence_hash: r.get(3)?,
        stages: Vec::new(),
        claim_token: 0,
    })
}

/// Fill in every stage's request of a page of items (in position order).
fn with_stages(
    conn: &Connection,
    session_id: &str,
    mut items: Vec<WorkItem>,
) -> crate::db::Result<Vec<WorkItem>> {
    let (Some(first), Some(last)) = (items.first(), items.last()) else {
        return Ok(items);
    };
    // Every stage of the page's items in one pass over the page's positions.
    let mut stages = conn.prepare_cached(
        "SELECT si.position, sr.stage, sr.position, sr.request_id, sr.state, r.status,
                -- attempts are numbered from the messages: one sent just before a
                -- crash is on disk there even though the request never heard of it
                MAX(r.attempt, (SELECT COALESCE(MAX(m.attempt), 0) FROM llm_messages m WHERE m.request_id = r.request_id)),
                r.gate_failures, r.transport_retries, r.parsed_output_json, sr.output_json
         -- CROSS JOIN keeps the page's positions the outer loop: left to
         -- itself the planner walks every session_request row of the
         -- session for each page (0.5 s a page at 1,000,000 items)
         FROM session_item si
         CROSS JOIN session_request sr ON sr.session_id = si.session_id AND sr.item_id = si.item_id
         JOIN llm_requests r ON r.request_id = sr.request_id
         WHERE si.session_id = ?1 AND si.position BETWEEN ?2 AND ?3
         ORDER BY si.position, sr.position, sr.stage",
    )?;
    let mut rows = stages.query(params![session_id, first.position, last.position])?;
    let mut at = 0usize;
    while let Some(r) = rows.next()? {
        let pos: i64 = r.get(0)?;
        while at < items.len() && items[at].position < pos {
            at += 1;
        }
        if at >= items.len() {
            break;
        }
        if items[at].position != pos {
            // An item with an outcome already (not in the page).
            continue;
        }
        items[at].stages.push(StageWork {
            stage: r.get(1)?,
            position: r.get(2)?,
            request_id: r.get(3)?,
            state: r.get(4)?,
            status: r.get(5)?,
            attempt: r.get(6)?,
            gate_failures: r.get(7)?,
            transport_retries: r.get(8)?,
            parsed_output_json: r.get(9)?,
            output_json: r.get(10)?,
        });
    }
    drop(rows);
    Ok(items)
}

/// A request sent with the evidence its item had when it was claimed
/// records that evidence's hash: `docket import --update` may have replaced
/// the evidence since the request was made (while its session waited), and
/// an answer must say which evidence it judged, or the next run would ask
/// again for an answer it already has. Nothing is written when the request
/// records it already, nor for an item without a hash.
pub(crate) fn record_sent_evidence(
    conn: &Connection,
    request_id: i64,
    hash: Option<&str>,
) -> crate::db::Result<()> {
    let Some(hash) = hash else {
        return Ok(());
    };
    conn.prepare_cached(
        "UPDATE llm_requests SET evidence_hash = ?2
         WHERE request_id = ?1 AND evidence_hash IS DISTINCT FROM ?2",
    )?
    .execute(params![request_id, hash])?;
    Ok(())
}

/// An item's evidence as stored (JSON text); None for an unknown item.
pub(crate) fn evidence_of(conn: &Connection, item_id: &str) -> crate::db::Result<Option<String>> {
    conn.prepare_cached("SELECT evidence_json FROM decision WHERE item_id = ?1")?
        .query_row(params![item_id], |r| r.get(0))
        .optional()
}
