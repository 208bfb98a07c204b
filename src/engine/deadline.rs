//! How long a synchronous request may go unanswered before it is cut and
//! sent again: a deadline learned from what the provider takes now, so a
//! request the provider will never answer costs seconds, not the configured
//! `request_timeout_secs` (issue 12, "hung requests never stretch a run").
//!
//! The rule, per provider and model:
//! - `learned = max(FLOOR, FACTOR × p99)` of the latencies of the last
//!   `WINDOW` answers (successful ones: a 429 or a 500 comes back at once
//!   and says nothing about how long an answer takes);
//! - `deadline = min(learned × 2^backoff, request_timeout)`; until
//!   `MIN_SAMPLES` answers came it is the configured timeout;
//! - a cut doubles the deadline (`backoff + 1`), each answer halves it back
//!   toward `learned` (`backoff - 1`): a provider that slows down as a whole
//!   is followed within a few cuts instead of being sent everything twice.
//!
//! A request's wait re-reads the deadline (at least every `RECHECK`), so one
//! sent before anything was learned is held to what is learned meanwhile.
//! Reasoning models with minute-long answers are never cut short: their
//! own answers set the p99.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Answers the p99 is taken over.
const WINDOW: usize = 256;
/// Answers needed before the deadline is learned.
const MIN_SAMPLES: usize = 20;
/// The p99 is recomputed every this many answers (cheap on the hot path).
const REFRESH_EVERY: u64 = 16;
/// The deadline is this multiple of the p99 ...
const FACTOR: f64 = 2.0;
/// ... and never below this: a fast provider's brief stall is not a hang.
const FLOOR: Duration = Duration::from_secs(2);
/// A waiting request looks at the deadline again at least this often.
const RECHECK: Duration = Duration::from_secs(1);
/// Cuts in a row double the deadline at most this many times.
const MAX_BACKOFF: u32 = 10;

pub(super) struct Deadline {
    /// The configured `request_timeout_secs`: the cap, and reqwest's own.
    timeout: Duration,
    latencies: Mutex<VecDeque<f32>>,
    answers: AtomicU64,
    /// p99 in microseconds; 0 until `MIN_SAMPLES` answers came.
    p99_us: AtomicU64,
    backoff: AtomicU32,
    cuts: AtomicU64,
}

/// What the console shows of a deadline.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct DeadlineGauge {
    pub deadline_secs: f64,
    /// None while it is still learning (the configured timeout applies).
    pub p99_secs: Option<f64>,
    pub cuts: u64,
}

impl Deadline {
    pub(super) fn new(timeout: Duration) -> Deadline {
        Deadline {
            timeout,
            latencies: Mutex::new(VecDeque::with_capacity(WINDOW)),
            answers: AtomicU64::new(0),
            p99_us: AtomicU64::new(0),
            backoff: AtomicU32::new(0),
            cuts: AtomicU64::new(0),
        }
    }

    /// The deadline a request is held to now.
    pub(super) fn current(&self) -> Duration {
        let p99 = self.p99_us.load(Relaxed);
        if p99 == 0 {
            return self.timeout;
        }
        let learned = Duration::from_micros(p99).mul_f64(FACTOR).max(FLOOR);
        let backoff = self.backoff.load(Relaxed).min(MAX_BACKOFF);
        learned.saturating_mul(1u32 << backoff).min(self.timeout)
    }

    /// A successful answer after `latency`.
    pub(super) fn answered(&self, latency: Duration) {
        let _ = self
            .backoff
            .fetch_update(Relaxed, Relaxed, |b| b.checked_sub(1));
        let n = self.answers.fetch_add(1, Relaxed) + 1;
        let Ok(mut window) = self.latencies.lock() else {
            return;
        };
        if window.len() == WINDOW {
            window.pop_front();
        }
        window.push_back(latency.as_secs_f32());
        let learning = window.len() < MIN_SAMPLES;
        if learning || (!n.is_multiple_of(REFRESH_EVERY) && self.p99_us.load(Relaxed) != 0) {
            return;
        }
        let mut sorted: Vec<f32> = window.iter().copied().collect();
        drop(window);
        let at = ((sorted.len() as f64 * 0.99).ceil() as usize).clamp(1, sorted.len()) - 1;
        let (_, p99, _) = sorted.select_nth_unstable_by(at, f32::total_cmp);
        let us = (f64::from(*p99) * 1e6).max(1.0) as u64;
        self.p99_us.store(us, Relaxed);
    }

    /// A request was cut at the deadline: the next ones get longer.
    pub(super) fn cut(&self) {
        self.cuts.fetch_add(1, Relaxed);
        let _ = self
            .backoff
            .fetch_update(Relaxed, Relaxed, |b| (b < MAX_BACKOFF).then_some(b + 1));
    }

    /// Resolves when a request sent at `started` is past its deadline
    /// (with the deadline it missed). Never while the deadline is the
    /// configured timeout: reqwest's own timeout ends that request, with
    /// its own message.
    pub(super) async fn passed(&self, started: Instant) -> Duration {
        // On tokio's clock from here (a paused clock in tests).
        let started = tokio::time::Instant::now() - started.elapsed();
        loop {
            let deadline = self.current();
            let elapsed = started.elapsed();
            if deadline < self.timeout && elapsed >= deadline {
                return deadline;
            }
            let wait = deadline.saturating_sub(elapsed);
            tokio::time::sleep(if wait.is_zero() {
                RECHECK
            } else {
                wait.min(RECHECK)
            })
            .await;
        }
    }

    pub(super) fn gauge(&self) -> DeadlineGauge {
        let p99 = self.p99_us.load(Relaxed);
        DeadlineGauge {
            deadline_secs: self.current().as_secs_f64(),
            p99_secs: (p99 != 0).then(|| p99 as f64 / 1e6),
            cuts: self.cuts.load(Relaxed),
        }
    }

    /// The message of a cut attempt.
    pub(super) fn cut_message(&self, missed: Duration) -> String {
        let p99 = self.p99_us.load(Relaxed) as f64 / 1e6;
        format!(
            "no answer within {:.1} s, the deadline learned from the provider's latency now ({FACTOR}× its p99 of {p99:.2} s, at least {} s); cut and sent again: it may have been billed",
            missed.as_secs_f64(),
            FLOOR.as_secs()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_configured_timeout_holds_until_enough_answers_came() {
        let d = Deadline::new(Duration::from_secs(120));
        for _ in 0..MIN_SAMPLES - 1 {
            d.answered(ms(300));
        }
        assert_eq!(d.current(), Duration::from_secs(120));
        assert_eq!(d.gauge().p99_secs, None);
        d.answered(ms(300));
        assert_eq!(d.current(), FLOOR, "2 × 0.3 s is under the floor");
    }

    #[test]
    fn the_deadline_follows_the_p99_of_recent_answers() {
        let d = Deadline::new(Duration::from_secs(120));
        // 1% of answers take 1.5 s, the rest 0.3 s: p99 = 1.5 s.
        for i in 0..WINDOW {
            d.answered(if i % 100 == 0 { ms(1500) } else { ms(300) });
        }
        let p99 = d.gauge().p99_secs.unwrap();
        assert!((0.29..=1.51).contains(&p99), "{p99}");
        // A reasoning model: minute-long answers move the deadline up.
        for _ in 0..WINDOW {
            d.answered(Duration::from_secs(60));
        }
        assert_eq!(
            d.current(),
            Duration::from_secs(120),
            "capped by the timeout"
        );
        let d = Deadline::new(Duration::from_secs(600));
        for _ in 0..WINDOW {
            d.answered(Duration::from_secs(60));
        }
        assert_eq!(d.current(), Duration::from_secs(120), "2 × 60 s");
    }

    #[test]
    fn cuts_double_the_deadline_and_answers_bring_it_back() {
        let d = Deadline::new(Duration::from_secs(120));
        for _ in 0..MIN_SAMPLES {
            d.answered(ms(1500));
        }
        assert_eq!(d.current(), ms(3000));
        d.cut();
        assert_eq!(d.current(), ms(6000));
        d.cut();
        assert_eq!(d.current(), ms(12000));
        for _ in 0..20 {
            d.cut();
        }
        assert_eq!(
            d.current(),
            Duration::from_secs(120),
            "never past the timeout"
        );
        for _ in 0..MAX_BACKOFF {
            d.answered(ms(1500));
        }
        assert_eq!(d.current(), ms(3000));
        assert_eq!(d.gauge().cuts, 22);
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_ends_at_the_learned_deadline_and_never_at_the_timeout() {
        let d = Deadline::new(Duration::from_secs(120));
        let started = Instant::now();
        // Nothing learned: no cut, however long (reqwest's timeout rules).
        let waited = tokio::time::timeout(Duration::from_secs(300), d.passed(started)).await;
        assert!(waited.is_err());
        // Learned while the request waits: held to the new deadline at once.
        for _ in 0..MIN_SAMPLES {
            d.answered(ms(100));
        }
        let clock = tokio::time::Instant::now();
        let missed = d.passed(Instant::now()).await;
        assert_eq!(missed, FLOOR);
        assert!(clock.elapsed() >= FLOOR);
        assert!(
            d.cut_message(missed).contains("2.0 s"),
            "{}",
            d.cut_message(missed)
        );
    }
}
