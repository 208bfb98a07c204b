//! Applying a `BatchOp` inside the writer's transaction.

use crate::db::{Connection, OptionalExtension, params};

use super::ops::{BatchOp, NewBatch, NewBatchLine};
use docket_model::batch::Quarantined;

/// Apply a change to a provider batch (inside the writer's transaction).
pub(crate) fn apply(conn: &Connection, op: &BatchOp, now: f64) -> crate::db::Result<()> {
    match op {
        BatchOp::Create(b) => create(conn, b, now),
        BatchOp::AddLines {
            tag,
            session_id,
            lines,
            request_count,
            input_bytes,
        } => add_lines(
            conn,
            tag,
            session_id,
            lines,
            *request_count,
            *input_bytes,
            now,
        ),
        BatchOp::Submitted {
            tag,
            provider_batch_id,
            input_file_id,
        } => submitted(conn, tag, provider_batch_id, input_file_id.as_deref(), now),
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
                     counts_changed_at = CASE
                         WHEN completed_count != ?3 OR failed_count != ?4 THEN ?11
                         ELSE counts_changed_at END,
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
        BatchOp::NextPoll { tag, next_poll_at } => next_poll(conn, tag, *next_poll_at, now),
        BatchOp::CancelRequested { tag } => cancel_requested(conn, tag, now),
        BatchOp::Ingested {
            tag,
            delivered,
            quarantined,
            quarantined_more,
        } => ingested(conn, tag, *delivered, quarantined, *quarantined_more, now),
        BatchOp::Settle { tag } => settle(conn, tag, now),
    }
}

/// The batch, its lines and their attempts, before anything is uploaded.
fn create(conn: &Connection, b: &NewBatch, now: f64) -> crate::db::Result<()> {
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

/// More lines of a batch being recorded, and the batch's totals with them.
fn add_lines(
    conn: &Connection,
    tag: &str,
    session_id: &str,
    lines: &[NewBatchLine],
    request_count: u64,
    input_bytes: u64,
    now: f64,
) -> crate::db::Result<()> {
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
        request_count as i64,
        input_bytes as i64,
        now
    ])?;
    Ok(())
}

/// The create answered: the provider's id, stored at once.
fn submitted(
    conn: &Connection,
    tag: &str,
    provider_batch_id: &str,
    input_file_id: Option<&str>,
    now: f64,
) -> crate::db::Result<()> {
    conn.prepare_cached(
        "UPDATE provider_batch SET provider_batch_id = ?2, input_file_id = COALESCE(?3, input_file_id),
                     state = CASE WHEN state IN ('submitting', 'unknown') THEN 'validating' ELSE state END,
                     error_message = NULL, submitted_at = COALESCE(submitted_at, ?4), updated_at = ?4
                 WHERE tag = ?1",
    )?
    .execute(params![tag, provider_batch_id, input_file_id, now])?;
    Ok(())
}

/// A poll failed: only when the next one is due changes.
fn next_poll(conn: &Connection, tag: &str, next_poll_at: f64, now: f64) -> crate::db::Result<()> {
    conn.prepare_cached(
        "UPDATE provider_batch SET next_poll_at = ?2, updated_at = ?3 WHERE tag = ?1 AND state != 'ingested'",
    )?
    .execute(params![tag, next_poll_at, now])?;
    Ok(())
}

fn cancel_requested(conn: &Connection, tag: &str, now: f64) -> crate::db::Result<()> {
    conn.prepare_cached(
        "UPDATE provider_batch SET cancel_requested_at = COALESCE(cancel_requested_at, ?2), updated_at = ?2
                 WHERE tag = ?1",
    )?
    .execute(params![tag, now])?;
    Ok(())
}

/// Result lines handed to their requests, and the lines put aside.
fn ingested(
    conn: &Connection,
    tag: &str,
    delivered: u64,
    quarantined: &[Quarantined],
    quarantined_more: u64,
    now: f64,
) -> crate::db::Result<()> {
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
        delivered as i64,
        (quarantined.len() as u64 + quarantined_more) as i64,
        now
    ])?;
    Ok(())
}

/// Finished with, once no line's attempt is still waiting ('sent').
fn settle(conn: &Connection, tag: &str, now: f64) -> crate::db::Result<()> {
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
        crate::store::record_sent_evidence(conn, l.request_id, l.evidence_hash.as_deref())?;
    }
    Ok(())
}
