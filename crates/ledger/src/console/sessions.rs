//! The sessions pane and one session in full. Both run every second
//! against a ledger that may hold a million items, so every query here reads
//! one row by primary key or a partial index, never a whole table.

use crate::db::{Connection, OptionalExtension, params};

use super::columns::{clamp, count, text};
use super::schema::has_table;
use crate::now_ts;
use crate::store::{LIVE_HEARTBEAT_SECS, load_session};
use crate::watch::{
    LiveGauges, SessionSummary, SessionView, StageProgress, Tune, configured_stage,
};

/// Every session, newest first.
pub(super) fn sessions(conn: &Connection) -> crate::db::Result<Vec<SessionSummary>> {
    let now = now_ts();
    let mut stmt = conn.prepare_cached(
        "SELECT session_id, state, desired_state, started_at, completed_at, total_count, processed_count,
                accepted_count, reviewed_count, rejected_count, error_count, cost_usd, estimated_cost_usd,
                stop_reason, heartbeat_at
         FROM llm_batch_session ORDER BY started_at DESC, session_id DESC",
    )?;
    let rows = stmt.query_map(params![], |r| {
        Ok(SessionSummary {
            session_id: r.get(0)?,
            state: r.get(1)?,
            desired_state: r.get(2)?,
            started_at: r.get(3)?,
            completed_at: r.get(4)?,
            total: clamp(r.get(5)?),
            processed: clamp(r.get(6)?),
            accepted: clamp(r.get(7)?),
            review: clamp(r.get(8)?),
            rejected: clamp(r.get(9)?),
            errors: clamp(r.get(10)?),
            cost_usd: r.get(11)?,
            estimated_cost_usd: r.get(12)?,
            stop_reason: r.get(13)?,
            live: is_live(r.get(14)?, now),
        })
    })?;
    rows.collect()
}

/// One session in full: counters, controls, the engine's gauges, stages and
/// what is in flight. None when there is no such session.
pub(super) fn session_view(
    conn: &Connection,
    session_id: &str,
) -> crate::db::Result<Option<SessionView>> {
    let Some(row) = load_session(conn, session_id)? else {
        return Ok(None);
    };
    let now = now_ts();
    let extra = conn
        .prepare_cached(
            "SELECT stop_after_stage, tune_rpm, tune_tpm, tune_concurrency, live_json, heartbeat_at
             FROM llm_batch_session WHERE session_id = ?1",
        )?
        .query_row(params![session_id], |r| {
            Ok((
                r.get::<_, Option<String>>(0)?,
                r.get::<_, Option<i64>>(1)?,
                r.get::<_, Option<i64>>(2)?,
                r.get::<_, Option<i64>>(3)?,
                r.get::<_, Option<String>>(4)?,
                r.get::<_, Option<f64>>(5)?,
            ))
        })
        .optional()?;
    // Deleted between the two reads (never in practice): report it as gone.
    let Some((stop_after_stage, rpm, tpm, concurrency, live_json, heartbeat_at)) = extra else {
        return Ok(None);
    };
    let in_flight = in_flight(conn, session_id)?;
    let gauges = live_json.as_deref().and_then(LiveGauges::from_json);
    let live = is_live(heartbeat_at, now);
    let mut stages = run_stages(conn, session_id)?;
    if stages.is_empty() {
        // No checkpoint (a ledger from before stages, read read-only): the
        // one stage, counted from the session.
        stages.push(StageProgress {
            name: configured_stage(&row.config_snapshot_json),
            total: row.total_count,
            done: row.processed_count,
            failed: row.error_count,
            in_flight,
            ..StageProgress::default()
        });
    } else {
        let per_stage = in_flight_by_stage(conn, session_id)?;
        for s in &mut stages {
            s.in_flight = per_stage
                .iter()
                .filter(|(name, _)| name == &s.name)
                .map(|(_, n)| n)
                .sum();
            // The engine's own count for the stage it dispatches now.
            if let Some(g) = gauges.as_ref().filter(|g| live && g.stage == s.name) {
                s.in_flight = s.in_flight.max(g.in_flight);
            }
        }
    }
    let pending = row
        .total_count
        .saturating_sub(row.processed_count)
        .saturating_sub(in_flight);
    Ok(Some(SessionView {
        stop_after_stage,
        tune: Tune {
            rpm: rpm.map(clamp),
            tpm: tpm.map(clamp),
            concurrency: concurrency.map(clamp),
        },
        gauges,
        stages,
        live,
        heartbeat_age_secs: heartbeat_at.map(|h| (now - h).max(0.0)),
        in_flight,
        pending,
        row,
    }))
}

/// Every stage of the session from its `run_stages` checkpoint, in job
/// order. Empty when it has none (or the ledger predates the table). Odd
/// values (NULLs, text where a count belongs) read as 0 or None.
pub(super) fn run_stages(
    conn: &Connection,
    session_id: &str,
) -> crate::db::Result<Vec<StageProgress>> {
    if !has_table(conn, "run_stages")? {
        return Ok(Vec::new());
    }
    let mut stmt = conn.prepare_cached(
        "SELECT stage, position, role, critic_of, total, completed, failed, skipped, state
         FROM run_stages WHERE session_id = ?1 ORDER BY position, stage",
    )?;
    let rows = stmt.query_map(params![session_id], |r| {
        let completed = count(r, 5)?;
        let failed = count(r, 6)?;
        let skipped = count(r, 7)?;
        Ok(StageProgress {
            name: text(r, 0)?.unwrap_or_default(),
            position: count(r, 1)?,
            role: text(r, 2)?.unwrap_or_default(),
            critic_of: text(r, 3)?.filter(|s| !s.is_empty()),
            total: count(r, 4)?,
            done: completed.saturating_add(failed).saturating_add(skipped),
            failed,
            skipped,
            in_flight: 0,
            state: Some(text(r, 8)?.unwrap_or_else(|| "pending".into())),
        })
    })?;
    rows.collect()
}

/// Open attempts by stage. A criterion asked on its own is a request of
/// stage `STAGE:CRITERION`: it counts for STAGE.
fn in_flight_by_stage(
    conn: &Connection,
    session_id: &str,
) -> crate::db::Result<Vec<(String, u64)>> {
    let mut stmt = conn.prepare_cached(
        "SELECT q.stage, COUNT(*) FROM llm_messages m JOIN llm_requests q ON q.request_id = m.request_id
         WHERE m.session_id = ?1 AND m.state = 'sent' GROUP BY q.stage",
    )?;
    let rows = stmt.query_map(params![session_id], |r| {
        let stage = text(r, 0)?.unwrap_or_default();
        let stage = match stage.split_once(':') {
            Some((base, _)) => base.to_string(),
            None => stage,
        };
        Ok((stage, count(r, 1)?))
    })?;
    rows.collect()
}

/// Attempts of the session sent and not answered yet. The partial index
/// `idx_llm_messages_open` holds only open attempts, so this is cheap
/// however many messages the session has.
fn in_flight(conn: &Connection, session_id: &str) -> crate::db::Result<u64> {
    let n: i64 = conn
        .prepare_cached(
            "SELECT COUNT(*) FROM llm_messages WHERE session_id = ?1 AND state = 'sent'",
        )?
        .query_row(params![session_id], |r| r.get(0))?;
    Ok(clamp(n))
}

fn is_live(heartbeat_at: Option<f64>, now: f64) -> bool {
    heartbeat_at.is_some_and(|h| h >= now - LIVE_HEARTBEAT_SECS)
}
