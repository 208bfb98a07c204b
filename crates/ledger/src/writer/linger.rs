//! How long a light write group waits for more writes to join it.
//!
//! Each commit writes every page it touched to the log again: each table's
//! and index's last page, the session's row. Measured on a run of 20,000
//! requests at 50 ms, commits of two or three writes each were about a
//! third of the process's CPU, and waiting 5 ms instead of 2 for a fuller
//! group cut its CPU per request by a tenth. But an intent that waits holds
//! a provider slot idle, and against a local server that answers in a
//! millisecond the same 5 ms cut the requests per second by a seventh. So
//! the wait is a share of how long requests take: it costs a slot at most
//! that share of its time.

use std::time::Duration;

use super::{Queued, WriteOp};

/// The wait before any request has come back.
const FIRST: Duration = Duration::from_millis(2);
/// The longest wait, for requests of 50 ms and more.
const MAX: Duration = Duration::from_millis(5);
/// The wait, as a share of how long requests take.
const SHARE: f64 = 0.1;
/// How much of the moving average one request moves.
const WEIGHT: f64 = 1.0 / 16.0;

#[derive(Default)]
pub(super) struct Linger {
    /// How long requests take (ms), a moving average; None before the first.
    request_ms: Option<f64>,
}

impl Linger {
    /// Learn from the attempts among `ops` how long requests take.
    pub(super) fn observe(&mut self, ops: &[Queued]) {
        for (op, _, _) in ops {
            if let WriteOp::Attempt(a) | WriteOp::Final(Some(a), _) | WriteOp::Stage(Some(a), _) =
                op
            {
                self.learn(a.latency_ms);
            }
        }
    }

    fn learn(&mut self, ms: f64) {
        if !ms.is_finite() || ms < 0.0 {
            return;
        }
        self.request_ms = Some(match self.request_ms {
            None => ms,
            Some(avg) => avg + (ms - avg) * WEIGHT,
        });
    }

    pub(super) fn duration(&self) -> Duration {
        match self.request_ms {
            None => FIRST,
            Some(ms) => Duration::from_secs_f64(ms * SHARE / 1000.0).min(MAX),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_a_share_of_how_long_requests_take_up_to_a_cap() {
        let mut l = Linger::default();
        assert_eq!(l.duration(), FIRST, "nothing known yet");
        l.learn(1.0);
        assert_eq!(l.duration(), Duration::from_micros(100), "a local server");
        let mut slow = Linger::default();
        slow.learn(30_000.0);
        assert_eq!(slow.duration(), MAX, "a real model's seconds: the cap");
    }

    #[test]
    fn follows_a_change_in_latency_and_ignores_nonsense() {
        let mut l = Linger::default();
        l.learn(1.0);
        l.learn(f64::NAN);
        l.learn(-5.0);
        l.learn(f64::INFINITY);
        assert_eq!(l.duration(), Duration::from_micros(100));
        for _ in 0..200 {
            l.learn(40.0);
        }
        let d = l.duration();
        assert!(
            d > Duration::from_micros(3_900) && d <= Duration::from_millis(4),
            "after 200 requests of 40 ms: {d:?}"
        );
    }
}
