//! The provider batches of a session (Batch API jobs, `provider_batch`):
//! the overlay's rows and the one-line summary. A session has a handful of
//! batches, and both reads go through `idx_provider_batch_session`.
//!
//! Provider ids and errors come from the provider: every text is made safe
//! for a terminal here, and non-finite times read as None.

use crate::db::{Connection, Row, params};

use super::columns::{count, real, signed, text};
use super::schema::{has_column, has_table};
use crate::watch::{ProviderBatchRow, ProviderBatchSummary, state_rank};
use docket_model::sanitize::for_terminal;

/// A ledger from before migration 0004 (opened read-only, so never
/// migrated) has no batches rather than an error.
const TABLE: &str = "provider_batch";

/// The session's provider batches: open ones (not `ingested`) first, then
/// newest first; at most `limit` (0: none).
pub(super) fn provider_batches(
    conn: &Connection,
    session_id: &str,
    limit: usize,
) -> crate::db::Result<Vec<ProviderBatchRow>> {
    if limit == 0 || !has_table(conn, TABLE)? {
        return Ok(Vec::new());
    }
    let lim = i64::try_from(limit).unwrap_or(i64::MAX);
    // A ledger opened read-only may predate the column (migration 9).
    let changed = if has_column(conn, TABLE, "counts_changed_at")? {
        "counts_changed_at"
    } else {
        "NULL"
    };
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT batch_id, tag, stage, provider, provider_kind, model, state, provider_batch_id,
                request_count, completed_count, failed_count, ingested_count, quarantined_count,
                poll_count, error_message, cancel_requested_at, created_at, submitted_at, ended_at,
                last_polled_at, next_poll_at, {changed}
         FROM provider_batch WHERE session_id = ?1
         ORDER BY state = 'ingested', created_at DESC, batch_id DESC LIMIT ?2"
    ))?;
    let rows = stmt.query_map(params![session_id, lim], |r| {
        Ok(ProviderBatchRow {
            batch_id: signed(r, 0)?,
            tag: safe(r, 1)?.unwrap_or_default(),
            stage: safe(r, 2)?.unwrap_or_default(),
            provider: safe(r, 3)?.unwrap_or_default(),
            provider_kind: safe(r, 4)?.unwrap_or_default(),
            model: safe(r, 5)?.unwrap_or_default(),
            state: safe(r, 6)?.unwrap_or_default(),
            provider_batch_id: safe(r, 7)?.filter(|s| !s.is_empty()),
            request_count: count(r, 8)?,
            completed_count: count(r, 9)?,
            failed_count: count(r, 10)?,
            ingested_count: count(r, 11)?,
            quarantined_count: count(r, 12)?,
            poll_count: count(r, 13)?,
            error_message: safe(r, 14)?.filter(|s| !s.trim().is_empty()),
            cancel_requested_at: real(r, 15)?,
            created_at: real(r, 16)?,
            submitted_at: real(r, 17)?,
            ended_at: real(r, 18)?,
            last_polled_at: real(r, 19)?,
            next_poll_at: real(r, 20)?,
            counts_changed_at: real(r, 21)?,
        })
    })?;
    rows.collect()
}

/// Every batch of the session counted: open ones by state (lifecycle order,
/// then any state this version does not know), ingested ones, and the lines
/// of open batches with no outcome yet.
pub(super) fn provider_batch_summary(
    conn: &Connection,
    session_id: &str,
) -> crate::db::Result<ProviderBatchSummary> {
    let mut summary = ProviderBatchSummary::default();
    if !has_table(conn, TABLE)? {
        return Ok(summary);
    }
    // TOTAL, not SUM: a float that cannot overflow whatever is stored.
    let mut stmt = conn.prepare_cached(
        "SELECT state, COUNT(*), TOTAL(MAX(request_count - ingested_count, 0))
         FROM provider_batch WHERE session_id = ?1 GROUP BY state",
    )?;
    let rows = stmt.query_map(params![session_id], |r| {
        Ok((safe(r, 0)?.unwrap_or_default(), count(r, 1)?, count(r, 2)?))
    })?;
    let mut open = Vec::new();
    for row in rows {
        let (state, n, waiting) = row?;
        summary.total += n;
        if state == "ingested" {
            summary.ingested += n;
        } else {
            summary.lines_waiting = summary.lines_waiting.saturating_add(waiting);
            open.push((state, n));
        }
    }
    open.sort_by(|a, b| state_rank(&a.0).cmp(&state_rank(&b.0)).then(a.0.cmp(&b.0)));
    summary.open = open;
    Ok(summary)
}

/// A text column made safe for a terminal.
fn safe(r: &Row, i: usize) -> crate::db::Result<Option<String>> {
    Ok(text(r, i)?.map(|t| for_terminal(&t)))
}
