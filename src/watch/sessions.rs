//! The sessions pane and one session in full. Both run every half second
//! against a ledger that may hold a million items, so every query here reads
//! one row by primary key or a partial index, never a whole table.

use rusqlite::types::ValueRef;
use rusqlite::{Connection, OptionalExtension, Row, params};

use super::{LiveGauges, SessionSummary, SessionView, StageProgress, Tune};
use crate::ledger::now_ts;
use crate::ledger::store::{LIVE_HEARTBEAT_SECS, load_session};

/// The stage name when a session's config snapshot does not name one.
pub const DEFAULT_STAGE: &str = "adjudicate";

/// Every session, newest first.
pub fn sessions(conn: &Connection) -> rusqlite::Result<Vec<SessionSummary>> {
    let now = now_ts();
    let mut stmt = conn.prepare_cached(
        "SELECT session_id, state, desired_state, started_at, completed_at, total_count, processed_count,
                accepted_count, reviewed_count, rejected_count, error_count, cost_usd, estimated_cost_usd,
                stop_reason, heartbeat_at
         FROM llm_batch_session ORDER BY started_at DESC, session_id DESC",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok(SessionSummary {
            session_id: r.get(0)?,
            state: r.get(1)?,
            desired_state: r.get(2)?,
            started_at: r.get(3)?,
            completed_at: r.get(4)?,
            total: count(r.get(5)?),
            processed: count(r.get(6)?),
            accepted: count(r.get(7)?),
            review: count(r.get(8)?),
            rejected: count(r.get(9)?),
            errors: count(r.get(10)?),
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
pub fn session_view(conn: &Connection, session_id: &str) -> rusqlite::Result<Option<SessionView>> {
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
    let gauges = live_json.as_deref().and_then(parse_gauges);
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
            rpm: rpm.map(count),
            tpm: tpm.map(count),
            concurrency: concurrency.map(count),
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
pub fn run_stages(conn: &Connection, session_id: &str) -> rusqlite::Result<Vec<StageProgress>> {
    if !has_table(conn, "run_stages")? {
        return Ok(Vec::new());
    }
    let mut stmt = conn.prepare_cached(
        "SELECT stage, position, role, critic_of, total, completed, failed, skipped, state
         FROM run_stages WHERE session_id = ?1 ORDER BY position, stage",
    )?;
    let rows = stmt.query_map(params![session_id], |r| {
        let completed = int(r, 5)?;
        let failed = int(r, 6)?;
        let skipped = int(r, 7)?;
        Ok(StageProgress {
            name: text(r, 0)?.unwrap_or_default(),
            position: int(r, 1)?,
            role: text(r, 2)?.unwrap_or_default(),
            critic_of: text(r, 3)?.filter(|s| !s.is_empty()),
            total: int(r, 4)?,
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
fn in_flight_by_stage(conn: &Connection, session_id: &str) -> rusqlite::Result<Vec<(String, u64)>> {
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
        Ok((stage, int(r, 1)?))
    })?;
    rows.collect()
}

pub(crate) fn has_table(conn: &Connection, name: &str) -> rusqlite::Result<bool> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1")?
        .query_row(params![name], |_| Ok(()))
        .optional()?
        .is_some())
}

/// A count column: NULL, negative, text or a blob read as 0.
pub(crate) fn int(r: &Row, i: usize) -> rusqlite::Result<u64> {
    Ok(match r.get_ref(i)? {
        ValueRef::Integer(n) => count(n),
        ValueRef::Real(f) if f.is_finite() && f > 0.0 => f as u64,
        _ => 0,
    })
}

/// A text column: NULL is None, numbers are their text, bytes are read
/// lossily.
pub(crate) fn text(r: &Row, i: usize) -> rusqlite::Result<Option<String>> {
    Ok(match r.get_ref(i)? {
        ValueRef::Null => None,
        ValueRef::Integer(n) => Some(n.to_string()),
        ValueRef::Real(f) => Some(f.to_string()),
        ValueRef::Text(t) | ValueRef::Blob(t) => Some(String::from_utf8_lossy(t).into_owned()),
    })
}

/// Attempts of the session sent and not answered yet. The partial index
/// `idx_llm_messages_open` holds only open attempts, so this is cheap
/// however many messages the session has.
fn in_flight(conn: &Connection, session_id: &str) -> rusqlite::Result<u64> {
    let n: i64 = conn
        .prepare_cached(
            "SELECT COUNT(*) FROM llm_messages WHERE session_id = ?1 AND state = 'sent'",
        )?
        .query_row(params![session_id], |r| r.get(0))?;
    Ok(count(n))
}

/// The engine's gauges; None for anything that does not parse (an engine of
/// another version, a torn write): the console shows "no gauges", not an error.
fn parse_gauges(json: &str) -> Option<LiveGauges> {
    // Only an object: serde would also read a struct from an array.
    match serde_json::from_str::<serde_json::Value>(json).ok()? {
        v @ serde_json::Value::Object(_) => serde_json::from_value(v).ok(),
        _ => None,
    }
}

/// The first stage named in a session's config snapshot.
pub(crate) fn configured_stage(config_snapshot_json: &str) -> String {
    serde_json::from_str::<serde_json::Value>(config_snapshot_json)
        .ok()
        .and_then(|v| {
            v.pointer("/config/stages/0/name")
                .and_then(serde_json::Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        })
        .unwrap_or_else(|| DEFAULT_STAGE.to_string())
}

/// The stage a session is in now: the engine's own word (`live_json`'s
/// `stage`) when it has written one, else the configured first stage.
pub(crate) fn current_stage(config_snapshot_json: &str, live_json: Option<&str>) -> String {
    live_json
        .and_then(|j| serde_json::from_str::<serde_json::Value>(j).ok())
        .and_then(|v| {
            v.get("stage")
                .and_then(serde_json::Value::as_str)
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        })
        .unwrap_or_else(|| configured_stage(config_snapshot_json))
}

fn is_live(heartbeat_at: Option<f64>, now: f64) -> bool {
    heartbeat_at.is_some_and(|h| h >= now - LIVE_HEARTBEAT_SECS)
}

/// Counters are never negative in the ledger; clamp rather than wrap if one is.
fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_names() {
        let snap = r#"{"config":{"stages":[{"name":"triage"},{"name":"critic"}]}}"#;
        assert_eq!(configured_stage(snap), "triage");
        assert_eq!(configured_stage("{}"), DEFAULT_STAGE);
        assert_eq!(configured_stage("not json"), DEFAULT_STAGE);
        assert_eq!(current_stage(snap, Some(r#"{"stage":"critic"}"#)), "critic");
        assert_eq!(current_stage(snap, Some(r#"{"stage":""}"#)), "triage");
        assert_eq!(current_stage(snap, Some("garbage")), "triage");
        assert_eq!(current_stage(snap, None), "triage");
    }

    #[test]
    fn gauges_parse_partially_and_reject_garbage() {
        let g = parse_gauges(r#"{"in_flight":3,"stage":"adjudicate","eta_secs":12.5}"#);
        let g = g.expect("parses");
        assert_eq!(g.in_flight, 3);
        assert_eq!(g.eta_secs, Some(12.5));
        assert_eq!(g.rpm_limit, 0);
        assert!(parse_gauges("{not json").is_none());
        assert!(parse_gauges("42").is_none());
        assert!(parse_gauges("[1,2]").is_none());
        assert!(parse_gauges(r#"{"in_flight":"many"}"#).is_none());
    }
}
