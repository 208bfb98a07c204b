//! Workers: each worker's row in `session_worker`, its heartbeat and
//! gauges, and the list the console and `docket sessions` show.

use super::WORKER_LIVE_SECS;
use crate::db::{Connection, params};
use crate::store::hostname;

/// What a worker reports with its heartbeat.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkerBeat {
    pub worker_id: String,
    pub claims: u64,
    pub sent: u64,
    pub requests_per_sec: f64,
    /// Its own gauges (a serialized `watch::LiveGauges`).
    pub live_json: Option<String>,
}

/// Record a worker joining a session (or beating again).
pub(crate) fn beat(conn: &Connection, session_id: &str, b: &WorkerBeat) -> crate::db::Result<()> {
    let now = conn.now()?;
    let op = docket_model::operator::Operator::current();
    conn.prepare_cached(
        "INSERT INTO session_worker (worker_id, session_id, user_name, host, pid, started_at, heartbeat_at,
             claims, sent, requests_per_sec, live_json)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6, ?7, ?8, ?9, ?10)
         ON CONFLICT (worker_id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at, claims = excluded.claims,
             sent = excluded.sent, requests_per_sec = excluded.requests_per_sec,
             live_json = COALESCE(excluded.live_json, session_worker.live_json), ended_at = NULL",
    )?
    .execute(params![
        b.worker_id,
        session_id,
        op.user,
        hostname(),
        std::process::id(),
        now,
        b.claims as i64,
        b.sent as i64,
        b.requests_per_sec,
        b.live_json
    ])?;
    Ok(())
}

/// A worker let go of the session.
pub(crate) fn worker_ended(conn: &Connection, worker: &str) -> crate::db::Result<()> {
    conn.prepare_cached(
        "UPDATE session_worker SET ended_at = ?2, claims = 0 WHERE worker_id = ?1",
    )?
    .execute(params![worker, conn.now()?])?;
    Ok(())
}

/// How many workers run the session now (a fresh heartbeat, not ended),
/// this one included if it beat.
pub(crate) fn live_workers(conn: &Connection, session_id: &str) -> crate::db::Result<u64> {
    conn.prepare_cached(
        "SELECT COUNT(*) FROM session_worker
         WHERE session_id = ?1 AND ended_at IS NULL AND heartbeat_at >= ?2",
    )?
    .query_row(params![session_id, conn.now()? - WORKER_LIVE_SECS], |r| {
        r.get::<_, i64>(0)
    })
    .map(|n| n as u64)
}

/// The gauges the other live workers of the session last wrote.
pub(crate) fn others_gauges(
    conn: &Connection,
    session_id: &str,
    worker: &str,
) -> crate::db::Result<Vec<String>> {
    conn.prepare_cached(
        "SELECT live_json FROM session_worker
         WHERE session_id = ?1 AND worker_id != ?2 AND ended_at IS NULL AND heartbeat_at >= ?3
           AND live_json IS NOT NULL",
    )?
    .query_map(
        params![session_id, worker, conn.now()? - WORKER_LIVE_SECS],
        |r| r.get(0),
    )?
    .collect()
}

/// A worker of a session as the console and `docket sessions` list it.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerRow {
    pub worker_id: String,
    pub host: String,
    pub pid: i64,
    pub claims: u64,
    pub sent: u64,
    pub requests_per_sec: f64,
    pub orphaned: u64,
    pub heartbeat_age_secs: f64,
    pub alive: bool,
}

/// Every worker that worked on the session, newest first.
pub(crate) fn workers(conn: &Connection, session_id: &str) -> crate::db::Result<Vec<WorkerRow>> {
    let now = conn.now()?;
    conn.prepare_cached(
        "SELECT worker_id, host, pid, claims, sent, requests_per_sec, orphaned, heartbeat_at, ended_at
         FROM session_worker WHERE session_id = ?1 ORDER BY started_at DESC",
    )?
    .query_map(params![session_id], |r| {
        let heartbeat: f64 = r.get(7)?;
        let ended: Option<f64> = r.get(8)?;
        Ok(WorkerRow {
            worker_id: r.get(0)?,
            host: r.get(1)?,
            pid: r.get(2)?,
            claims: r.get::<_, i64>(3)? as u64,
            sent: r.get::<_, i64>(4)? as u64,
            requests_per_sec: r.get(5)?,
            orphaned: r.get::<_, i64>(6)? as u64,
            heartbeat_age_secs: (now - heartbeat).max(0.0),
            alive: ended.is_none() && now - heartbeat < WORKER_LIVE_SECS,
        })
    })?
    .collect()
}
