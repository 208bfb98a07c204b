//! The provider batches of a session (Batch API jobs, `provider_batch`):
//! the overlay's rows and the one-line summary. A session has a handful of
//! batches, and both reads go through `idx_provider_batch_session`.
//!
//! The ledger is a shared file and provider ids and errors come from the
//! provider: every column is read whatever its stored type (a wrong type
//! reads as NULL or 0, never as an error), non-finite times read as None,
//! and every text is made safe for a terminal.

use rusqlite::types::ValueRef;
use rusqlite::{Connection, OptionalExtension, Row, params};

use super::{ProviderBatchRow, ProviderBatchSummary};
use crate::sanitize::for_terminal;

/// The states in lifecycle order: how the summary lists them.
pub const BATCH_STATES: &[&str] = &[
    "submitting",
    "validating",
    "in_progress",
    "finalizing",
    "completed",
    "failed",
    "expired",
    "cancelling",
    "cancelled",
    "unknown",
    "ingested",
];

/// A batch in this state is finished at the provider: nothing to poll.
pub fn is_terminal_state(state: &str) -> bool {
    matches!(
        state,
        "completed" | "failed" | "expired" | "cancelled" | "ingested"
    )
}

/// The session's provider batches: open ones (not `ingested`) first, then
/// newest first; at most `limit` (0: none).
pub fn provider_batches(
    conn: &Connection,
    session_id: &str,
    limit: usize,
) -> rusqlite::Result<Vec<ProviderBatchRow>> {
    if limit == 0 || !has_table(conn)? {
        return Ok(Vec::new());
    }
    let lim = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut stmt = conn.prepare_cached(
        "SELECT batch_id, tag, stage, provider, provider_kind, model, state, provider_batch_id,
                request_count, completed_count, failed_count, ingested_count, quarantined_count,
                poll_count, error_message, cancel_requested_at, created_at, submitted_at, ended_at,
                last_polled_at, next_poll_at
         FROM provider_batch WHERE session_id = ?1
         ORDER BY state = 'ingested', created_at DESC, batch_id DESC LIMIT ?2",
    )?;
    let rows = stmt.query_map(params![session_id, lim], |r| {
        Ok(ProviderBatchRow {
            batch_id: int(r, 0)?,
            tag: text(r, 1)?.unwrap_or_default(),
            stage: text(r, 2)?.unwrap_or_default(),
            provider: text(r, 3)?.unwrap_or_default(),
            provider_kind: text(r, 4)?.unwrap_or_default(),
            model: text(r, 5)?.unwrap_or_default(),
            state: text(r, 6)?.unwrap_or_default(),
            provider_batch_id: text(r, 7)?.filter(|s| !s.is_empty()),
            request_count: count(r, 8)?,
            completed_count: count(r, 9)?,
            failed_count: count(r, 10)?,
            ingested_count: count(r, 11)?,
            quarantined_count: count(r, 12)?,
            poll_count: count(r, 13)?,
            error_message: text(r, 14)?.filter(|s| !s.trim().is_empty()),
            cancel_requested_at: time(r, 15)?,
            created_at: time(r, 16)?,
            submitted_at: time(r, 17)?,
            ended_at: time(r, 18)?,
            last_polled_at: time(r, 19)?,
            next_poll_at: time(r, 20)?,
        })
    })?;
    rows.collect()
}

/// Every batch of the session counted: open ones by state (lifecycle order,
/// then any state this version does not know), ingested ones, and the lines
/// of open batches with no outcome yet.
pub fn provider_batch_summary(
    conn: &Connection,
    session_id: &str,
) -> rusqlite::Result<ProviderBatchSummary> {
    let mut summary = ProviderBatchSummary::default();
    if !has_table(conn)? {
        return Ok(summary);
    }
    // TOTAL, not SUM: a float that cannot overflow whatever is stored.
    let mut stmt = conn.prepare_cached(
        "SELECT state, COUNT(*), TOTAL(MAX(request_count - ingested_count, 0))
         FROM provider_batch WHERE session_id = ?1 GROUP BY state",
    )?;
    let rows = stmt.query_map(params![session_id], |r| {
        Ok((text(r, 0)?.unwrap_or_default(), count(r, 1)?, count(r, 2)?))
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
    let rank = |s: &str| {
        BATCH_STATES
            .iter()
            .position(|k| *k == s)
            .unwrap_or(BATCH_STATES.len())
    };
    open.sort_by(|a, b| rank(&a.0).cmp(&rank(&b.0)).then(a.0.cmp(&b.0)));
    summary.open = open;
    Ok(summary)
}

/// A ledger from before migration 0004 (opened read-only, so never
/// migrated) has no batches rather than an error.
fn has_table(conn: &Connection) -> rusqlite::Result<bool> {
    Ok(conn
        .prepare_cached(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'provider_batch'",
        )?
        .query_row([], |_| Ok(()))
        .optional()?
        .is_some())
}

fn text(r: &Row, i: usize) -> rusqlite::Result<Option<String>> {
    Ok(match r.get_ref(i)? {
        ValueRef::Null => None,
        ValueRef::Integer(n) => Some(n.to_string()),
        ValueRef::Real(f) => Some(f.to_string()),
        ValueRef::Text(t) | ValueRef::Blob(t) => Some(for_terminal(&String::from_utf8_lossy(t))),
    })
}

fn int(r: &Row, i: usize) -> rusqlite::Result<i64> {
    Ok(match r.get_ref(i)? {
        ValueRef::Integer(n) => n,
        ValueRef::Real(f) if f.is_finite() => f as i64,
        _ => 0,
    })
}

/// Counters are never negative in the ledger; clamp rather than wrap if one is.
fn count(r: &Row, i: usize) -> rusqlite::Result<u64> {
    Ok(match r.get_ref(i)? {
        ValueRef::Integer(n) => u64::try_from(n).unwrap_or(0),
        // `as` saturates, and NaN becomes 0.
        ValueRef::Real(f) if f > 0.0 => f as u64,
        _ => 0,
    })
}

fn time(r: &Row, i: usize) -> rusqlite::Result<Option<f64>> {
    Ok(match r.get_ref(i)? {
        ValueRef::Integer(n) => Some(n as f64),
        ValueRef::Real(f) if f.is_finite() => Some(f),
        _ => None,
    })
}
