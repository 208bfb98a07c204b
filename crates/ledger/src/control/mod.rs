//! Run controls: pause, resume, cancel, stop after the current stage, and
//! retune a live run's limits. The console and the CLI ask through the
//! ledger ([`RunControls`]); an engine running the
//! session, in this process or any other, polls the ledger and obeys within
//! a second. Each control also leaves a session event naming who asked.
//!
//! This module holds what a control means (the desired states, the limits a
//! retune may ask for and how it reads in the events) and its errors.

use crate::LedgerError;
use docket_model::live::Tune;

mod runs;

pub use runs::RunControls;

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
    pub(crate) fn verb(self) -> &'static str {
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
    #[error("{}", docket_model::ids::unknown_session(.0))]
    NoSession(String),
    #[error("session {0} is completed; there is nothing left to control")]
    Completed(String),
    #[error("retune refused: {0}")]
    InvalidTune(String),
    #[error("ledger: {0}")]
    Ledger(#[from] LedgerError),
}

/// The columns' values, or why the tune is refused.
#[allow(clippy::type_complexity)]
pub(crate) fn validate(
    tune: Tune,
) -> Result<(Option<i64>, Option<i64>, Option<i64>), ControlError> {
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
pub(crate) fn describe(tune: Tune) -> String {
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
