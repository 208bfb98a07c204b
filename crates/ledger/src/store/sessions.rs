//! A session's row and its controls: loading it, whether a live process
//! runs it, its desired state, and the newest session.

use crate::db::{Connection, OptionalExtension, params};
use docket_model::session_state::{Engine, ShownState, StateFacts, shown_state};

/// The maximum age of a resumable session.
pub const RESUME_WINDOW_SECS: f64 = 7.0 * 24.0 * 3600.0;

/// A session whose heartbeat is younger than this is being run by a live
/// process (the engine beats every 400 ms).
pub const LIVE_HEARTBEAT_SECS: f64 = 5.0;

/// The state every view shows (the console's header, stage rows and
/// sessions pane, `docket sessions`), from the session's columns: the
/// stored state, the operator's wishes, and whether an engine beats
/// (`LIVE_HEARTBEAT_SECS`).
pub fn shown_state_of(
    state: &str,
    desired: &str,
    stop_after_stage: bool,
    heartbeat_at: Option<f64>,
    now: f64,
) -> ShownState {
    shown_state(StateFacts {
        stored: state,
        desired,
        stop_after_stage,
        engine: Engine::from_heartbeat(heartbeat_at, now, LIVE_HEARTBEAT_SECS),
    })
}

#[derive(Debug, Clone, PartialEq)]
pub struct SessionRow {
    pub session_id: String,
    pub started_at: f64,
    pub completed_at: Option<f64>,
    pub total_count: u64,
    pub processed_count: u64,
    pub accepted_count: u64,
    pub reviewed_count: u64,
    pub rejected_count: u64,
    pub error_count: u64,
    pub state: String,
    pub desired_state: String,
    pub stop_reason: Option<String>,
    pub retry_count: u64,
    pub rate_limited_count: u64,
    pub ambiguous_count: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_usd: f64,
    pub estimated_tokens: u64,
    pub estimated_cost_usd: f64,
    pub max_cost_usd: Option<f64>,
    pub config_snapshot_json: String,
}

pub fn load_session(conn: &Connection, session_id: &str) -> crate::db::Result<Option<SessionRow>> {
    conn.query_row(
        "SELECT session_id, started_at, completed_at, total_count, processed_count, accepted_count, reviewed_count,
                rejected_count, error_count, state, desired_state, stop_reason, retry_count, rate_limited_count,
                ambiguous_count, input_tokens, output_tokens, cost_usd, estimated_tokens, estimated_cost_usd,
                max_cost_usd, config_snapshot_json
         FROM llm_batch_session WHERE session_id = ?1",
        params![session_id],
        |r| {
            Ok(SessionRow {
                session_id: r.get(0)?,
                started_at: r.get(1)?,
                completed_at: r.get(2)?,
                total_count: r.get::<_, i64>(3)? as u64,
                processed_count: r.get::<_, i64>(4)? as u64,
                accepted_count: r.get::<_, i64>(5)? as u64,
                reviewed_count: r.get::<_, i64>(6)? as u64,
                rejected_count: r.get::<_, i64>(7)? as u64,
                error_count: r.get::<_, i64>(8)? as u64,
                state: r.get(9)?,
                desired_state: r.get(10)?,
                stop_reason: r.get(11)?,
                retry_count: r.get::<_, i64>(12)? as u64,
                rate_limited_count: r.get::<_, i64>(13)? as u64,
                ambiguous_count: r.get::<_, i64>(14)? as u64,
                input_tokens: r.get::<_, i64>(15)? as u64,
                output_tokens: r.get::<_, i64>(16)? as u64,
                cost_usd: r.get(17)?,
                estimated_tokens: r.get::<_, i64>(18)? as u64,
                estimated_cost_usd: r.get(19)?,
                max_cost_usd: r.get(20)?,
                config_snapshot_json: r.get(21)?,
            })
        },
    )
    .optional()
}

/// Answers paid for but refused because their worker had lost the item
/// (see `ledger::queue`): (count, USD).
pub(crate) fn orphaned_spend(conn: &Connection, session_id: &str) -> crate::db::Result<(u64, f64)> {
    conn.query_row(
        "SELECT orphaned_count, orphaned_cost_usd FROM llm_batch_session WHERE session_id = ?1",
        params![session_id],
        |r| Ok((r.get::<_, i64>(0)?.max(0) as u64, r.get(1)?)),
    )
    .optional()
    .map(Option::unwrap_or_default)
}

/// Whether a live process runs the session now (its heartbeat is fresh and,
/// on this machine, its process is alive): the rule `repair_interrupted`
/// uses to refuse a second runner.
pub fn run_by_live_process(conn: &Connection, session_id: &str) -> crate::db::Result<bool> {
    type Owner = (String, Option<f64>, Option<i64>, Option<String>);
    let row: Option<Owner> = conn
        .query_row(
            "SELECT state, heartbeat_at, owner_pid, owner_host FROM llm_batch_session WHERE session_id = ?1",
            params![session_id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .optional()?;
    let Some((state, heartbeat, pid, host)) = row else {
        return Ok(false);
    };
    let now = conn.now()?;
    let fresh = heartbeat.is_some_and(|h| now - h < LIVE_HEARTBEAT_SECS);
    let gone =
        host.as_deref() == Some(hostname().as_str()) && pid.is_some_and(|p| !process_alive(p));
    Ok(matches!(state.as_str(), "running" | "paused") && fresh && !gone)
}

/// Whether a process of this machine is alive (Linux: /proc). Elsewhere a
/// fresh heartbeat is trusted and the caller waits for it to go stale.
pub(crate) fn process_alive(pid: i64) -> bool {
    if pid == i64::from(std::process::id()) {
        return false;
    }
    if cfg!(target_os = "linux") {
        // A zombie (killed, not yet reaped) is as good as gone.
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(stat) => !stat
                .rsplit(')')
                .next()
                .is_some_and(|rest| rest.trim_start().starts_with('Z')),
            Err(_) => false,
        }
    } else {
        true
    }
}

/// What an operator asked of the session (the ledger is the bus).
pub fn desired_state(conn: &Connection, session_id: &str) -> crate::db::Result<Option<String>> {
    conn.query_row(
        "SELECT desired_state FROM llm_batch_session WHERE session_id = ?1",
        params![session_id],
        |r| r.get(0),
    )
    .optional()
}

/// Everything an operator may have asked of a running session: its desired
/// state, a stop after a stage, a retune of its limits, and the routing
/// thresholds it records.
#[derive(Debug, Clone, PartialEq)]
pub struct Controls {
    pub desired_state: String,
    pub stop_after_stage: Option<String>,
    pub tune: docket_model::live::Tune,
    /// `(review, auto-accept)` as the session records them (its flags, else
    /// its config; the auto-accept raised to its confidence floor): a resume
    /// or a worker joining with other thresholds records them, and every
    /// worker routes with them from then on. None where it records none.
    pub routing: (Option<f64>, Option<f64>),
}

/// The run controls of a session (None when there is no such session). A
/// negative tune value is not a limit anyone meant: it reads as unset.
pub(crate) fn session_controls(
    conn: &Connection,
    session_id: &str,
) -> crate::db::Result<Option<Controls>> {
    let tune = |v: Option<i64>| v.and_then(|v| u64::try_from(v).ok());
    conn.prepare_cached(
        "SELECT desired_state, stop_after_stage, tune_rpm, tune_tpm, tune_concurrency, config_snapshot_json
         FROM llm_batch_session WHERE session_id = ?1",
    )?
    .query_row(params![session_id], |r| {
        // Read at each control tick (400 ms): one small JSON document.
        let snapshot: String = r.get(5)?;
        let routing = serde_json::from_str::<serde_json::Value>(&snapshot)
            .map_or((None, None), |s| docket_model::routing::session_thresholds(&s));
        Ok(Controls {
            desired_state: r.get(0)?,
            stop_after_stage: r.get(1)?,
            tune: docket_model::live::Tune {
                rpm: tune(r.get(2)?),
                tpm: tune(r.get(3)?),
                concurrency: tune(r.get(4)?),
            },
            routing,
        })
    })
    .optional()
}

/// Ask a session to pause, resume or cancel; any engine running it obeys.
pub fn set_desired_state(
    conn: &Connection,
    session_id: &str,
    desired: &str,
) -> crate::db::Result<usize> {
    conn.execute(
        "UPDATE llm_batch_session SET desired_state = ?2, updated_at = ?3 WHERE session_id = ?1",
        params![session_id, desired, conn.now()?],
    )
}

/// The newest session id, for messages that suggest one.
pub fn latest_session(conn: &Connection) -> crate::db::Result<Option<String>> {
    conn.query_row(
        "SELECT session_id FROM llm_batch_session ORDER BY started_at DESC LIMIT 1",
        params![],
        |r| r.get(0),
    )
    .optional()
}

pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_default()
}
