//! The sessions pane and one session in full. Both run every second
//! against a ledger that may hold a million items, so every query here reads
//! one row by primary key or a partial index, never a whole table.

use crate::db::{Connection, OptionalExtension, params};

use super::columns::{clamp, count, text};
use super::schema::has_table;
use crate::now_ts;
use crate::store::shown_state_of as shown;
use crate::store::{LIVE_HEARTBEAT_SECS, SessionRow, load_session};
use crate::watch::{
    LiveGauges, SessionSummary, SessionView, StageProgress, Tune, configured_stage,
};

/// Every session, newest first.
pub(super) fn sessions(conn: &Connection) -> crate::db::Result<Vec<SessionSummary>> {
    let now = now_ts();
    let mut stmt = conn.prepare_cached(
        "SELECT session_id, state, desired_state, started_at, completed_at, total_count, processed_count,
                accepted_count, reviewed_count, rejected_count, error_count, cost_usd, estimated_cost_usd,
                stop_reason, heartbeat_at, stop_after_stage
         FROM llm_batch_session ORDER BY started_at DESC, session_id DESC",
    )?;
    let rows = stmt.query_map(params![], |r| {
        let state: String = r.get(1)?;
        let desired_state: String = r.get(2)?;
        let heartbeat_at: Option<f64> = r.get(14)?;
        let stop_after_stage: Option<String> = r.get(15)?;
        let shown = shown(
            &state,
            &desired_state,
            stop_after_stage.is_some(),
            heartbeat_at,
            now,
        );
        Ok(SessionSummary {
            session_id: r.get(0)?,
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
            live: is_live(heartbeat_at, now),
            shown,
            state,
            desired_state,
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
    let open = open_attempts(conn, session_id)?;
    let (in_flight, at_provider) = open
        .iter()
        .fold((0, 0), |(s, b), o| (s + o.in_flight, b + o.at_provider));
    let gauges = live_json.as_deref().and_then(LiveGauges::from_json);
    let live = is_live(heartbeat_at, now);
    let shown = shown(
        &row.state,
        &row.desired_state,
        stop_after_stage.is_some(),
        heartbeat_at,
        now,
    );
    let stages = stages_with_open(conn, &row, &open, (in_flight, at_provider))?;
    // A ledger from before profiles (read-only, never migrated) has none.
    let profile = if super::schema::has_column(conn, "llm_batch_session", "profile_version")? {
        crate::profiles::session_profile(conn, session_id)?
    } else {
        None
    };
    let pending = row
        .total_count
        .saturating_sub(row.processed_count)
        .saturating_sub(in_flight)
        .saturating_sub(at_provider);
    Ok(Some(SessionView {
        stop_after_stage,
        profile,
        tune: Tune {
            rpm: rpm.map(clamp),
            tpm: tpm.map(clamp),
            concurrency: concurrency.map(clamp),
        },
        gauges,
        stages,
        live,
        shown,
        heartbeat_age_secs: heartbeat_at.map(|h| (now - h).max(0.0)),
        in_flight,
        at_provider,
        pending,
        row,
    }))
}

/// The session's stages with what each has open. From the same rows as the
/// session's totals (`totals`: in flight, at the provider), so a stage row
/// and the gauges never disagree about what is in flight.
fn stages_with_open(
    conn: &Connection,
    row: &SessionRow,
    open: &[OpenAttempts],
    (in_flight, at_provider): (u64, u64),
) -> crate::db::Result<Vec<StageProgress>> {
    let mut stages = run_stages(conn, &row.session_id)?;
    if stages.is_empty() {
        // No checkpoint (a ledger from before stages, read read-only): the
        // one stage, counted from the session.
        stages.push(StageProgress {
            name: configured_stage(&row.config_snapshot_json),
            total: row.total_count,
            done: row.processed_count,
            failed: row.error_count,
            in_flight,
            at_provider,
            ..StageProgress::default()
        });
        return Ok(stages);
    }
    for s in &mut stages {
        for o in open.iter().filter(|o| o.stage == s.name) {
            s.in_flight += o.in_flight;
            s.at_provider += o.at_provider;
        }
    }
    Ok(stages)
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
            at_provider: 0,
            state: Some(text(r, 8)?.unwrap_or_else(|| "pending".into())),
        })
    })?;
    rows.collect()
}

/// A stage's open attempts: synchronous requests in flight, and batch
/// lines waiting at the provider.
struct OpenAttempts {
    stage: String,
    in_flight: u64,
    at_provider: u64,
}

/// The session's attempts sent and not answered yet ('sent'), by stage and
/// by how they went: a line of a provider batch waits at the provider, any
/// other attempt is in flight. A criterion asked on its own is a request of
/// stage `STAGE:CRITERION`: it counts for STAGE. The partial index
/// `idx_llm_messages_open` holds only open attempts, so this is cheap
/// however many messages the session has.
fn open_attempts(conn: &Connection, session_id: &str) -> crate::db::Result<Vec<OpenAttempts>> {
    // A ledger from before provider batches (read read-only) has no lines.
    let batched = if has_table(conn, "provider_batch_item")? {
        "CASE WHEN EXISTS (SELECT 1 FROM provider_batch_item bi
                           WHERE bi.request_id = m.request_id AND bi.attempt = m.attempt)
              THEN 1 ELSE 0 END"
    } else {
        "0"
    };
    let sql = format!(
        "SELECT q.stage, {batched}, COUNT(*) FROM llm_messages m
         JOIN llm_requests q ON q.request_id = m.request_id
         WHERE m.session_id = ?1 AND m.state = 'sent' GROUP BY 1, 2"
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let rows = stmt.query_map(params![session_id], |r| {
        let stage = text(r, 0)?.unwrap_or_default();
        let stage = match stage.split_once(':') {
            Some((base, _)) => base.to_string(),
            None => stage,
        };
        let n = count(r, 2)?;
        let at_provider = count(r, 1)? > 0;
        Ok(OpenAttempts {
            stage,
            in_flight: if at_provider { 0 } else { n },
            at_provider: if at_provider { n } else { 0 },
        })
    })?;
    rows.collect()
}

fn is_live(heartbeat_at: Option<f64>, now: f64) -> bool {
    heartbeat_at.is_some_and(|h| h >= now - LIVE_HEARTBEAT_SECS)
}
