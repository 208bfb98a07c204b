//! Provider batches in the ledger (migration 0004): what the batch engine
//! writes (through the ledger writer, in order with every other write) and
//! what a resume reads back to re-attach open batches.
//!
//! A batch is keyed by its `tag` (docket's own id, unique): the writer's
//! answers carry no values, so the engine names its batches itself.

use crate::db::{Connection, OptionalExtension, params};

use docket_model::batch::Quarantined;

/// One line of a new batch: an attempt of a request, with its prompt (the
/// attempt's `llm_messages` row is written with the batch, state 'sent').
#[derive(Debug, Clone)]
pub struct NewBatchLine {
    pub custom_id: String,
    pub request_id: i64,
    pub attempt: i64,
    pub system_prompt: Option<std::sync::Arc<str>>,
    pub user_prompt: String,
    /// The item the line's worker held (its id and claim token): let go as
    /// the line is recorded, since the batch's lease covers it from then on
    /// and its result comes to whoever holds the batch.
    pub release: Option<(String, i64)>,
}

#[derive(Debug, Clone)]
pub struct NewBatch {
    pub tag: String,
    pub session_id: String,
    pub stage: String,
    pub provider: String,
    pub provider_kind: String,
    pub model: String,
    pub input_bytes: u64,
    /// Every line the batch will carry (`lines` may be the first of them:
    /// the rest follow in `AddLines`, before anything is uploaded).
    pub request_count: u64,
    pub lines: Vec<NewBatchLine>,
    /// The worker that submits it and holds its lease (see `adopt`).
    pub claimed_by: String,
    pub lease_until: f64,
}

/// A change to a provider batch.
#[derive(Debug, Clone)]
pub enum BatchOp {
    /// The batch, its lines and their attempts, before anything is uploaded.
    Create(NewBatch),
    /// More lines of a batch being recorded (recorded in pieces as they
    /// come, so no batch's prompts are ever held whole), and the batch's
    /// totals with them.
    AddLines {
        tag: String,
        session_id: String,
        lines: Vec<NewBatchLine>,
        request_count: u64,
        input_bytes: u64,
    },
    /// The create answered: the provider's id, stored at once.
    Submitted {
        tag: String,
        provider_batch_id: String,
        input_file_id: Option<String>,
    },
    /// A poll's answer (or a state docket decided: 'unknown', 'failed' at
    /// submit). `ended` marks the provider's terminal state.
    Status {
        tag: String,
        state: String,
        completed: u64,
        failed: u64,
        output_ref: Option<String>,
        error_ref: Option<String>,
        error_message: Option<String>,
        next_poll_at: Option<f64>,
        polled: bool,
        ended: bool,
    },
    /// A poll failed: only when the next one is due changes.
    NextPoll {
        tag: String,
        next_poll_at: f64,
    },
    CancelRequested {
        tag: String,
    },
    /// Result lines handed to their requests, and the lines put aside.
    Ingested {
        tag: String,
        delivered: u64,
        quarantined: Vec<Quarantined>,
        quarantined_more: u64,
    },
    /// Finished with, once no line's attempt is still waiting ('sent').
    Settle {
        tag: String,
    },
}

impl BatchOp {
    /// The batch an existing batch's change is about (None: a new batch).
    pub fn tag(&self) -> Option<&str> {
        match self {
            BatchOp::Create(_) => None,
            BatchOp::AddLines { tag, .. }
            | BatchOp::Submitted { tag, .. }
            | BatchOp::Status { tag, .. }
            | BatchOp::NextPoll { tag, .. }
            | BatchOp::CancelRequested { tag }
            | BatchOp::Ingested { tag, .. }
            | BatchOp::Settle { tag } => Some(tag),
        }
    }
}

pub(crate) fn apply(conn: &Connection, op: &BatchOp, now: f64) -> crate::db::Result<()> {
    match op {
        BatchOp::Create(b) => {
            let batch_id = conn.prepare_cached(
                "INSERT INTO provider_batch (tag, session_id, stage, provider, provider_kind, model, state,
                     request_count, input_bytes, created_at, updated_at, claimed_by, lease_until)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'submitting', ?7, ?8, ?9, ?9, ?10, ?11)
                 RETURNING batch_id",
            )?
            .query_row(params![
                b.tag,
                b.session_id,
                b.stage,
                b.provider,
                b.provider_kind,
                b.model,
                b.request_count as i64,
                b.input_bytes as i64,
                now,
                b.claimed_by,
                b.lease_until
            ], |r| r.get::<_, i64>(0))?;
            // The stage's checkpoint names its last batch.
            conn.prepare_cached(
                "UPDATE run_stages SET last_batch_id = ?3, updated_at = ?4 WHERE session_id = ?1 AND stage = ?2",
            )?
            .execute(params![b.session_id, b.stage, batch_id, now])?;
            insert_lines(conn, batch_id, &b.session_id, &b.lines, now)
        }
        BatchOp::AddLines {
            tag,
            session_id,
            lines,
            request_count,
            input_bytes,
        } => {
            let batch_id: i64 = conn
                .prepare_cached("SELECT batch_id FROM provider_batch WHERE tag = ?1")?
                .query_row(params![tag], |r| r.get(0))?;
            insert_lines(conn, batch_id, session_id, lines, now)?;
            conn.prepare_cached(
                "UPDATE provider_batch SET request_count = ?2, input_bytes = ?3, updated_at = ?4
                 WHERE batch_id = ?1",
            )?
            .execute(params![
                batch_id,
                *request_count as i64,
                *input_bytes as i64,
                now
            ])?;
            Ok(())
        }
        BatchOp::Submitted {
            tag,
            provider_batch_id,
            input_file_id,
        } => {
            conn.prepare_cached(
                "UPDATE provider_batch SET provider_batch_id = ?2, input_file_id = COALESCE(?3, input_file_id),
                     state = CASE WHEN state IN ('submitting', 'unknown') THEN 'validating' ELSE state END,
                     error_message = NULL, submitted_at = COALESCE(submitted_at, ?4), updated_at = ?4
                 WHERE tag = ?1",
            )?
            .execute(params![tag, provider_batch_id, input_file_id, now])?;
            Ok(())
        }
        BatchOp::Status {
            tag,
            state,
            completed,
            failed,
            output_ref,
            error_ref,
            error_message,
            next_poll_at,
            polled,
            ended,
        } => {
            conn.prepare_cached(
                "UPDATE provider_batch SET state = ?2, completed_count = ?3, failed_count = ?4,
                     output_ref = COALESCE(?5, output_ref), error_ref = COALESCE(?6, error_ref),
                     error_message = COALESCE(?7, error_message), next_poll_at = ?8,
                     last_polled_at = CASE WHEN ?9 THEN ?11 ELSE last_polled_at END,
                     poll_count = poll_count + CASE WHEN ?9 THEN 1 ELSE 0 END,
                     ended_at = CASE WHEN ?10 THEN COALESCE(ended_at, ?11) ELSE ended_at END,
                     updated_at = ?11
                 WHERE tag = ?1 AND state != 'ingested'",
            )?
            .execute(params![
                tag,
                state,
                *completed as i64,
                *failed as i64,
                output_ref,
                error_ref,
                error_message,
                next_poll_at,
                *polled as i64,
                ended,
                now
            ])?;
            Ok(())
        }
        BatchOp::NextPoll { tag, next_poll_at } => {
            conn.prepare_cached(
                "UPDATE provider_batch SET next_poll_at = ?2, updated_at = ?3 WHERE tag = ?1 AND state != 'ingested'",
            )?
            .execute(params![tag, next_poll_at, now])?;
            Ok(())
        }
        BatchOp::CancelRequested { tag } => {
            conn.prepare_cached(
                "UPDATE provider_batch SET cancel_requested_at = COALESCE(cancel_requested_at, ?2), updated_at = ?2
                 WHERE tag = ?1",
            )?
            .execute(params![tag, now])?;
            Ok(())
        }
        BatchOp::Ingested {
            tag,
            delivered,
            quarantined,
            quarantined_more,
        } => {
            let batch_id: Option<i64> = conn
                .prepare_cached("SELECT batch_id FROM provider_batch WHERE tag = ?1")?
                .query_row(params![tag], |r| r.get(0))
                .optional()?;
            let Some(batch_id) = batch_id else {
                return Ok(());
            };
            let mut q = conn.prepare_cached(
                "INSERT INTO provider_batch_quarantine (batch_id, line, custom_id, reason, at) VALUES (?1, ?2, ?3, ?4, ?5)",
            )?;
            for x in quarantined {
                q.execute(params![batch_id, x.line as i64, x.custom_id, x.reason, now])?;
            }
            conn.prepare_cached(
                "UPDATE provider_batch SET ingested_count = ingested_count + ?2,
                     quarantined_count = quarantined_count + ?3, updated_at = ?4
                 WHERE batch_id = ?1",
            )?
            .execute(params![
                batch_id,
                *delivered as i64,
                (quarantined.len() as u64 + quarantined_more) as i64,
                now
            ])?;
            Ok(())
        }
        BatchOp::Settle { tag } => {
            conn.prepare_cached(
                "UPDATE provider_batch SET state = 'ingested', next_poll_at = NULL, updated_at = ?2
                 WHERE tag = ?1 AND state != 'ingested'
                   AND NOT EXISTS (
                       SELECT 1 FROM provider_batch_item bi
                       JOIN llm_messages m ON m.request_id = bi.request_id AND m.attempt = bi.attempt
                       WHERE bi.batch_id = provider_batch.batch_id AND m.state = 'sent')",
            )?
            .execute(params![tag, now])?;
            Ok(())
        }
    }
}

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

/// Record lines of batch `batch_id`: each line, its attempt ('sent'), and
/// its item let go (the batch's lease covers it from now on).
fn insert_lines(
    conn: &Connection,
    batch_id: i64,
    session_id: &str,
    lines: &[NewBatchLine],
    now: f64,
) -> crate::db::Result<()> {
    let mut item = conn.prepare_cached(
        "INSERT INTO provider_batch_item (batch_id, custom_id, request_id, attempt) VALUES (?1, ?2, ?3, ?4)",
    )?;
    let mut message = conn.prepare_cached(
        "INSERT INTO llm_messages (request_id, attempt, session_id, client_request_id, state, system_prompt, user_prompt, sent_at)
         VALUES (?1, ?2, ?3, ?4, 'sent', ?5, ?6, ?7)",
    )?;
    let mut release = conn.prepare_cached(
        "UPDATE session_item SET claimed_by = NULL, lease_until = NULL
         WHERE session_id = ?1 AND item_id = ?2 AND claim_token = ?3",
    )?;
    for l in lines {
        item.execute(params![batch_id, l.custom_id, l.request_id, l.attempt])?;
        if let Some((item_id, token)) = &l.release {
            release.execute(params![session_id, item_id, token])?;
        }
        message.execute(params![
            l.request_id,
            l.attempt,
            session_id,
            l.custom_id,
            l.system_prompt.as_deref(),
            l.user_prompt,
            now
        ])?;
    }
    Ok(())
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
