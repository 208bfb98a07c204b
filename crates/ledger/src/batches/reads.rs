//! What a resume and the console read back: open batches, their leases,
//! their lines and what is still waiting.

use crate::db::{Connection, OptionalExtension, params};

/// A batch a session has not finished with.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenBatch {
    pub batch_id: i64,
    pub tag: String,
    pub state: String,
    pub stage: String,
    pub provider: String,
    pub model: String,
    pub provider_batch_id: Option<String>,
    pub input_file_id: Option<String>,
    pub request_count: u64,
    pub created_at: f64,
    pub submitted_at: Option<f64>,
    pub cancel_requested: bool,
    /// The worker holding its lease (None: nobody; a batch from before
    /// leases, or let go by a worker that left).
    pub claimed_by: Option<String>,
}

/// The session's batches that are not `ingested`, oldest first.
pub(crate) fn open_batches(
    conn: &Connection,
    session_id: &str,
) -> crate::db::Result<Vec<OpenBatch>> {
    let mut stmt = conn.prepare_cached(
        "SELECT batch_id, tag, state, provider, model, provider_batch_id, input_file_id, request_count,
                created_at, submitted_at, cancel_requested_at IS NOT NULL, stage, claimed_by
         FROM provider_batch WHERE session_id = ?1 AND state != 'ingested' ORDER BY batch_id",
    )?;
    let rows = stmt.query_map(params![session_id], open_batch)?;
    rows.collect()
}

/// Take the lease on the session's open batches of `stage` that nobody
/// holds (from before leases, let go by a worker that left, or whose
/// worker's lease ran out) for `worker`, and return them: exactly one
/// worker polls and ingests each batch.
pub(crate) fn adopt(
    conn: &mut Connection,
    session_id: &str,
    stage: &str,
    worker: &str,
    lease_secs: f64,
) -> crate::db::Result<Vec<OpenBatch>> {
    let now = conn.now()?;
    let tx = conn.transaction_with_behavior(crate::db::TransactionBehavior::Immediate)?;
    let ids: Vec<i64> = tx
        .prepare_cached(
            "UPDATE provider_batch SET claimed_by = ?3, lease_until = ?4
             WHERE session_id = ?1 AND stage = ?2 AND state != 'ingested'
               AND (lease_until IS NULL OR lease_until < ?5)
               AND (claimed_by IS NULL OR claimed_by != ?3)
             RETURNING batch_id",
        )?
        .query_map(
            params![session_id, stage, worker, now + lease_secs, now],
            |r| r.get(0),
        )?
        .collect::<crate::db::Result<_>>()?;
    let mut out = Vec::with_capacity(ids.len());
    {
        let mut one = tx.prepare_cached(
            "SELECT batch_id, tag, state, provider, model, provider_batch_id, input_file_id, request_count,
                    created_at, submitted_at, cancel_requested_at IS NOT NULL, stage, claimed_by
             FROM provider_batch WHERE batch_id = ?1",
        )?;
        for id in ids {
            out.push(one.query_row(params![id], open_batch)?);
        }
    }
    tx.commit()?;
    out.sort_by_key(|b| b.batch_id);
    Ok(out)
}

fn open_batch(r: &crate::db::Row<'_>) -> crate::db::Result<OpenBatch> {
    {
        Ok(OpenBatch {
            batch_id: r.get(0)?,
            tag: r.get(1)?,
            state: r.get(2)?,
            provider: r.get(3)?,
            model: r.get(4)?,
            provider_batch_id: r.get(5)?,
            input_file_id: r.get(6)?,
            request_count: r.get::<_, i64>(7)?.max(0) as u64,
            created_at: r.get(8)?,
            submitted_at: r.get(9)?,
            cancel_requested: r.get(10)?,
            stage: r.get(11)?,
            claimed_by: r.get(12)?,
        })
    }
}

/// How many of a session's batches are not finished with (for the message
/// at a stop: the provider keeps running them).
pub(crate) fn open_batch_count(conn: &Connection, session_id: &str) -> crate::db::Result<u64> {
    let n: i64 = conn
        .prepare_cached(
            "SELECT COUNT(*) FROM provider_batch WHERE session_id = ?1 AND state != 'ingested'",
        )?
        .query_row(params![session_id], |r| r.get(0))?;
    Ok(n.max(0) as u64)
}

/// Every provider batch id docket knows (any session): `find` must never
/// take one of them for the batch it looks for.
pub(crate) fn known_provider_ids(conn: &Connection) -> crate::db::Result<Vec<String>> {
    let mut stmt = conn.prepare_cached(
        "SELECT provider_batch_id FROM provider_batch WHERE provider_batch_id IS NOT NULL",
    )?;
    let rows = stmt.query_map(params![], |r| r.get(0))?;
    rows.collect()
}

/// How many batches the session has had (the next tag's number).
pub(crate) fn batch_count(conn: &Connection, session_id: &str) -> crate::db::Result<u64> {
    let n: i64 = conn
        .prepare_cached("SELECT COUNT(*) FROM provider_batch WHERE session_id = ?1")?
        .query_row(params![session_id], |r| r.get(0))?;
    Ok(n.max(0) as u64)
}

/// A line of an open batch whose attempt has no answer recorded yet.
#[derive(Debug, Clone, PartialEq)]
pub struct WaitingLine {
    pub custom_id: String,
    pub request_id: i64,
    pub attempt: i64,
    pub system_prompt: Option<String>,
    pub user_prompt: String,
}

/// Up to `max` of batch `tag`'s lines whose attempts wait ('sent'), with
/// their prompts, in `custom_id` order after `after` ("" for the first).
pub(crate) fn waiting_lines_after(
    conn: &Connection,
    tag: &str,
    after: &str,
    max: usize,
) -> crate::db::Result<Vec<WaitingLine>> {
    let mut stmt = conn.prepare_cached(
        "SELECT bi.custom_id, bi.request_id, bi.attempt, m.system_prompt, m.user_prompt
         FROM provider_batch pb
         JOIN provider_batch_item bi ON bi.batch_id = pb.batch_id
         JOIN llm_messages m ON m.request_id = bi.request_id AND m.attempt = bi.attempt
         WHERE pb.tag = ?1 AND bi.custom_id > ?2 AND m.state = 'sent'
         ORDER BY bi.custom_id
         LIMIT ?3",
    )?;
    let rows = stmt.query_map(params![tag, after, max as i64], |r| {
        Ok(WaitingLine {
            custom_id: r.get(0)?,
            request_id: r.get(1)?,
            attempt: r.get(2)?,
            system_prompt: r.get(3)?,
            user_prompt: r.get(4)?,
        })
    })?;
    rows.collect()
}

/// A line of a batch still waiting for its result: its id and attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct LineId {
    pub custom_id: String,
    pub request_id: i64,
    pub attempt: i64,
}

/// The lines of batch `tag` still waiting for their result, without their
/// prompts (what collecting its results needs).
pub(crate) fn waiting_ids(conn: &Connection, tag: &str) -> crate::db::Result<Vec<LineId>> {
    let mut stmt = conn.prepare_cached(
        "SELECT bi.custom_id, bi.request_id, bi.attempt
         FROM provider_batch b
         JOIN provider_batch_item bi ON bi.batch_id = b.batch_id
         JOIN llm_messages m ON m.request_id = bi.request_id AND m.attempt = bi.attempt
         WHERE b.tag = ?1 AND m.state = 'sent'
         ORDER BY bi.request_id",
    )?;
    let rows = stmt.query_map(params![tag], |r| {
        Ok(LineId {
            custom_id: r.get(0)?,
            request_id: r.get(1)?,
            attempt: r.get(2)?,
        })
    })?;
    rows.collect()
}

/// Every line of batch `tag` (a re-fetch of its results must know the lines
/// already applied from the ones that are not its own).
pub(crate) fn line_ids(conn: &Connection, tag: &str) -> crate::db::Result<Vec<String>> {
    let mut stmt = conn.prepare_cached(
        "SELECT bi.custom_id FROM provider_batch b
         JOIN provider_batch_item bi ON bi.batch_id = b.batch_id WHERE b.tag = ?1",
    )?;
    let rows = stmt.query_map(params![tag], |r| r.get(0))?;
    rows.collect()
}

/// Whether batch `tag` is finished with (`ingested`).
pub(crate) fn is_settled(conn: &Connection, tag: &str) -> crate::db::Result<bool> {
    let state: Option<String> = conn
        .prepare_cached("SELECT state FROM provider_batch WHERE tag = ?1")?
        .query_row(params![tag], |r| r.get(0))
        .optional()?;
    Ok(state.as_deref() == Some("ingested"))
}

/// Every line of batch `batch_id` (a re-fetch of its results must know the
/// lines already applied from the ones that are not its own).
pub fn batch_custom_ids(conn: &Connection, batch_id: i64) -> crate::db::Result<Vec<String>> {
    let mut stmt =
        conn.prepare_cached("SELECT custom_id FROM provider_batch_item WHERE batch_id = ?1")?;
    let rows = stmt.query_map(params![batch_id], |r| r.get(0))?;
    rows.collect()
}
