//! Run controls in the SQLite ledger: a session's desired state, its
//! stop-after stage and its retuned limits, each written with a
//! `session_event` naming who asked, in the same write transaction. The
//! engine polls these columns; it never needs to be reachable otherwise.

use crate::db::{Connection, OptionalExtension, params};

use crate::control::{ControlError, Desired, describe, validate};
use crate::transaction::write_transaction;
use crate::{Ledger, LedgerError, batches, now_ts, store};
use docket_model::live::Tune;

/// What an operator can ask of a session through the ledger. Every control
/// is refused for an unknown or a completed session.
pub trait RunControls {
    /// Ask the session to run (resume), pause or cancel.
    fn set_desired(
        &self,
        session_id: &str,
        desired: Desired,
        actor: &str,
    ) -> Result<(), ControlError>;

    /// Record a control that reached the engine another way (the console's
    /// quit dialog stops its own process's run directly), or that was
    /// carried out with no engine running (`docket cancel` cancelling an
    /// idle session's provider batches), so the session's events still say
    /// who asked: `"<message> by <actor>"`.
    fn note(&self, session_id: &str, message: &str, actor: &str) -> Result<(), ControlError>;

    /// Ask the engine to finish the stage it is in and then stop; returns
    /// that stage.
    fn stop_after_stage(&self, session_id: &str, actor: &str) -> Result<String, ControlError>;

    /// Override the live run's limits; `None` leaves a limit as it is.
    fn retune(&self, session_id: &str, tune: Tune, actor: &str) -> Result<(), ControlError>;

    /// Whether a live process (a fresh heartbeat) runs the session now: a
    /// control then takes effect within a second, else at the next resume.
    fn run_by_live_process(&self, session_id: &str) -> Result<bool, LedgerError>;

    /// How many of the session's provider batches are still open at the
    /// provider (submitted and not yet collected).
    fn open_provider_batches(&self, session_id: &str) -> Result<u64, LedgerError>;
}

impl RunControls for Ledger {
    fn set_desired(
        &self,
        session_id: &str,
        desired: Desired,
        actor: &str,
    ) -> Result<(), ControlError> {
        set_desired(self.conn(), session_id, desired, actor)
    }

    fn note(&self, session_id: &str, message: &str, actor: &str) -> Result<(), ControlError> {
        note(self.conn(), session_id, message, actor)
    }

    fn stop_after_stage(&self, session_id: &str, actor: &str) -> Result<String, ControlError> {
        stop_after_stage(self.conn(), session_id, actor)
    }

    fn retune(&self, session_id: &str, tune: Tune, actor: &str) -> Result<(), ControlError> {
        retune(self.conn(), session_id, tune, actor)
    }

    fn run_by_live_process(&self, session_id: &str) -> Result<bool, LedgerError> {
        Ok(store::run_by_live_process(self.conn(), session_id)?)
    }

    fn open_provider_batches(&self, session_id: &str) -> Result<u64, LedgerError> {
        Ok(batches::open_batch_count(self.conn(), session_id)?)
    }
}

impl From<crate::db::Error> for ControlError {
    fn from(e: crate::db::Error) -> Self {
        ControlError::Ledger(LedgerError::Db(e))
    }
}

// The functions below are the SQLite implementation behind the trait.

/// Ask the session to run, pause or cancel. Refused for an unknown or a
/// completed session.
pub(crate) fn set_desired(
    conn: &Connection,
    session_id: &str,
    desired: Desired,
    actor: &str,
) -> Result<(), ControlError> {
    write_transaction(conn, || {
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
fn note(
    conn: &Connection,
    session_id: &str,
    message: &str,
    actor: &str,
) -> Result<(), ControlError> {
    write_transaction(conn, || {
        controllable(conn, session_id)?;
        event(conn, session_id, &format!("{message} by {actor}"), actor)
    })
}

/// Ask the engine to finish the stage it is in and then stop. Returns the
/// stage: the one the engine reports in its gauges, else the configured
/// first stage.
pub(crate) fn stop_after_stage(
    conn: &Connection,
    session_id: &str,
    actor: &str,
) -> Result<String, ControlError> {
    write_transaction(conn, || {
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
pub(crate) fn retune(
    conn: &Connection,
    session_id: &str,
    tune: Tune,
    actor: &str,
) -> Result<(), ControlError> {
    let (rpm, tpm, concurrency) = validate(tune)?;
    write_transaction(conn, || {
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
    // Every control writes this event: on PostgreSQL the session's workers
    // hear of it when this transaction commits, not at their next poll.
    conn.notify(crate::postgres::CONTROL_CHANNEL, session_id)?;
    Ok(())
}
