//! Run controls through the ledger: pause, resume, cancel, stop after the
//! current stage, and retune a live run's limits. The console writes them
//! here; an engine running the session, in this process or any other,
//! polls these columns and obeys within a second. Each control also leaves
//! a `session_event` naming who asked, in the same transaction.

use rusqlite::{Connection, OptionalExtension, params};

use crate::ledger::now_ts;
use crate::review::immediate;
use crate::watch::Tune;

/// The highest concurrency a retune may ask for.
pub const MAX_CONCURRENCY: u64 = 10_000;

/// What an operator wants a session to do (`desired_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Desired {
    Running,
    Paused,
    Cancelled,
}

impl Desired {
    pub fn as_str(self) -> &'static str {
        match self {
            Desired::Running => "running",
            Desired::Paused => "paused",
            Desired::Cancelled => "cancelled",
        }
    }

    /// The verb of the event line: "pause requested by ...".
    fn verb(self) -> &'static str {
        match self {
            Desired::Running => "resume",
            Desired::Paused => "pause",
            Desired::Cancelled => "cancel",
        }
    }
}

impl std::fmt::Display for Desired {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("no session {0} in this ledger")]
    NoSession(String),
    #[error("session {0} is completed; there is nothing left to control")]
    Completed(String),
    #[error("retune refused: {0}")]
    InvalidTune(String),
    #[error("ledger: {0}")]
    Sql(#[from] rusqlite::Error),
}

/// Ask the session to run, pause or cancel. Refused for an unknown or a
/// completed session.
pub fn set_desired(
    conn: &Connection,
    session_id: &str,
    desired: Desired,
    actor: &str,
) -> Result<(), ControlError> {
    immediate(conn, || {
        controllable(conn, session_id)?;
        conn.prepare_cached(
            "UPDATE llm_batch_session SET desired_state = ?2, updated_at = ?3 WHERE session_id = ?1",
        )?
        .execute(params![session_id, desired.as_str(), now_ts()])?;
        event(
            conn,
            session_id,
            &format!("{} requested by {actor}", desired.verb()),
            actor,
        )
    })
}

/// Record an operator's control that reaches the engine another way (the
/// console's quit dialog stops its own process's run directly), so the
/// session's events still say who asked.
pub fn note(
    conn: &Connection,
    session_id: &str,
    message: &str,
    actor: &str,
) -> Result<(), ControlError> {
    immediate(conn, || {
        controllable(conn, session_id)?;
        event(conn, session_id, &format!("{message} by {actor}"), actor)
    })
}

/// Ask the engine to finish the stage it is in and then stop. Returns the
/// stage: the one the engine reports in its gauges, else the configured
/// first stage.
pub fn stop_after_stage(
    conn: &Connection,
    session_id: &str,
    actor: &str,
) -> Result<String, ControlError> {
    immediate(conn, || {
        let s = controllable(conn, session_id)?;
        let stage = crate::watch::current_stage(&s.config_snapshot_json, s.live_json.as_deref());
        conn.prepare_cached(
            "UPDATE llm_batch_session SET stop_after_stage = ?2, updated_at = ?3 WHERE session_id = ?1",
        )?
        .execute(params![session_id, stage, now_ts()])?;
        event(
            conn,
            session_id,
            &format!("stop after stage {stage} requested by {actor}"),
            actor,
        )?;
        Ok(stage)
    })
}

/// Override the live run's limits. `None` leaves a limit as it is; rpm and
/// tpm 0 mean no client-side limit; concurrency must be 1..=10000.
pub fn retune(
    conn: &Connection,
    session_id: &str,
    tune: Tune,
    actor: &str,
) -> Result<(), ControlError> {
    let (rpm, tpm, concurrency) = validate(tune)?;
    immediate(conn, || {
        controllable(conn, session_id)?;
        conn.prepare_cached(
            "UPDATE llm_batch_session SET tune_rpm = COALESCE(?2, tune_rpm), tune_tpm = COALESCE(?3, tune_tpm),
                 tune_concurrency = COALESCE(?4, tune_concurrency), updated_at = ?5
             WHERE session_id = ?1",
        )?
        .execute(params![session_id, rpm, tpm, concurrency, now_ts()])?;
        event(
            conn,
            session_id,
            &format!("retune requested: {} (by {actor})", describe(tune)),
            actor,
        )
    })
}

/// The columns' values, or why the tune is refused.
#[allow(clippy::type_complexity)]
fn validate(tune: Tune) -> Result<(Option<i64>, Option<i64>, Option<i64>), ControlError> {
    if tune.rpm.is_none() && tune.tpm.is_none() && tune.concurrency.is_none() {
        return Err(ControlError::InvalidTune(
            "nothing to change (give rpm, tpm or concurrency)".into(),
        ));
    }
    let column = |name: &str, v: Option<u64>| -> Result<Option<i64>, ControlError> {
        v.map(|v| {
            i64::try_from(v)
                .map_err(|_| ControlError::InvalidTune(format!("{name} {v} is too large")))
        })
        .transpose()
    };
    if let Some(c) = tune.concurrency
        && !(1..=MAX_CONCURRENCY).contains(&c)
    {
        return Err(ControlError::InvalidTune(format!(
            "concurrency must be 1 to {MAX_CONCURRENCY}, not {c}"
        )));
    }
    Ok((
        column("rpm", tune.rpm)?,
        column("tpm", tune.tpm)?,
        column("concurrency", tune.concurrency)?,
    ))
}

/// "rpm 120, concurrency 4"; a 0 limit reads "rpm 0 (no limit)".
fn describe(tune: Tune) -> String {
    let limit = |name: &str, v: u64| {
        if v == 0 {
            format!("{name} 0 (no limit)")
        } else {
            format!("{name} {v}")
        }
    };
    let mut parts = Vec::new();
    if let Some(v) = tune.rpm {
        parts.push(limit("rpm", v));
    }
    if let Some(v) = tune.tpm {
        parts.push(limit("tpm", v));
    }
    if let Some(v) = tune.concurrency {
        parts.push(format!("concurrency {v}"));
    }
    parts.join(", ")
}

struct Controllable {
    config_snapshot_json: String,
    live_json: Option<String>,
}

/// The session, if it exists and is not completed.
fn controllable(conn: &Connection, session_id: &str) -> Result<Controllable, ControlError> {
    let row = conn
        .prepare_cached(
            "SELECT state, config_snapshot_json, live_json FROM llm_batch_session WHERE session_id = ?1",
        )?
        .query_row(params![session_id], |r| {
            Ok((
                r.get::<_, String>(0)?,
                Controllable {
                    config_snapshot_json: r.get(1)?,
                    live_json: r.get(2)?,
                },
            ))
        })
        .optional()?;
    match row {
        None => Err(ControlError::NoSession(session_id.to_string())),
        Some((state, _)) if state == "completed" => {
            Err(ControlError::Completed(session_id.to_string()))
        }
        Some((_, s)) => Ok(s),
    }
}

fn event(
    conn: &Connection,
    session_id: &str,
    message: &str,
    actor: &str,
) -> Result<(), ControlError> {
    conn.prepare_cached(
        "INSERT INTO session_event (session_id, at, level, kind, message, actor)
         VALUES (?1, ?2, 'info', 'control', ?3, ?4)",
    )?
    .execute(params![session_id, now_ts(), message, actor])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tune_validation_and_wording() {
        let t = Tune {
            rpm: Some(120),
            tpm: None,
            concurrency: Some(4),
        };
        assert_eq!(validate(t).ok(), Some((Some(120), None, Some(4))));
        assert_eq!(describe(t), "rpm 120, concurrency 4");
        let zero = Tune {
            rpm: Some(0),
            tpm: Some(0),
            concurrency: None,
        };
        assert!(validate(zero).is_ok());
        assert_eq!(describe(zero), "rpm 0 (no limit), tpm 0 (no limit)");
        for c in [0, MAX_CONCURRENCY + 1] {
            let bad = Tune {
                concurrency: Some(c),
                ..Tune::default()
            };
            assert!(matches!(validate(bad), Err(ControlError::InvalidTune(_))));
        }
        assert!(validate(Tune::default()).is_err());
        let huge = Tune {
            rpm: Some(u64::MAX),
            ..Tune::default()
        };
        assert!(validate(huge).is_err());
    }

    #[test]
    fn desired_names() {
        assert_eq!(Desired::Running.as_str(), "running");
        assert_eq!(Desired::Paused.as_str(), "paused");
        assert_eq!(Desired::Cancelled.as_str(), "cancelled");
    }
}
