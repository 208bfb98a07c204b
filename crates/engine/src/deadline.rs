//! How long a synchronous request may go unanswered before it is cut and
//! sent again: a deadline learned from what the provider takes now, so a
//! request the provider will never answer costs seconds, not the configured
//! `request_timeout_secs` (issue 12, "hung requests never stretch a run").
//!
//! The rule, per stage (its prompts and answers set its latency):
//! - the p99 is taken over the latencies of the stage's last `WINDOW`
//!   successful answers (a 429 or a 500 comes back at once and says nothing
//!   about how long an answer takes). Until that many came, it also counts
//!   how long each request still in flight has waited so far: lower bounds
//!   of their latencies, which keep a first wave of slow answers (a
//!   reasoning model) from being judged by its fastest few. Once the window
//!   is full they no longer count: requests that hang would otherwise hold
//!   the p99 up by their own waits when many hang at once;
//! - `deadline = min(max(FLOOR, FACTOR × p99), request_timeout)`; until
//!   `MIN_SAMPLES` answers came it is the configured timeout;
//! - a request past the deadline is checked against a p99 taken afresh, and
//!   cut only if it is still past;
//! - each cut of an item makes its next deadline `RECUT` times longer: an
//!   item that is always slow (a long document) is cut once or twice, not
//!   at every send, and one that hangs again is still cut in seconds.
//!
//! A request's wait re-reads the deadline (at least every `RECHECK`), so one
//! sent before anything was learned is held to what is learned meanwhile.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
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
/// Each cut of an item makes its next deadline this many times longer.
const RECUT: u32 = 4;
/// A waiting request looks at the deadline again at least this often.
const RECHECK: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Samples {
    /// Latencies of the last answers, seconds.
    answered: VecDeque<f32>,
    /// When each request in flight was sent; None: a free slot.
    in_flight: Vec<Option<Instant>>,
    free: Vec<usize>,
}

pub(super) struct Deadline {
    /// The configured `request_timeout_secs`: the cap, and reqwest's own.
    timeout: Duration,
    samples: Mutex<Samples>,
    answers: AtomicU64,
    /// p99 in microseconds; 0 until `MIN_SAMPLES` answers came.
    p99_us: AtomicU64,
    cuts: AtomicU64,
}

/// A request in flight, counted in the p99 until it is dropped.
pub(super) struct InFlight<'d> {
    deadline: &'d Deadline,
    slot: usize,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut s = self.deadline.lock();
        if let Some(entry) = s.in_flight.get_mut(self.slot) {
            *entry = None;
            s.free.push(self.slot);
        }
    }
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
            samples: Mutex::new(Samples::default()),
            answers: AtomicU64::new(0),
            p99_us: AtomicU64::new(0),
            cuts: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Samples> {
        self.samples.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A request leaves now: it counts as waiting until the guard drops.
    pub(super) fn begin(&self) -> InFlight<'_> {
        let mut s = self.lock();
        let now = Instant::now();
        let slot = match s.free.pop() {
            Some(i) => {
                s.in_flight[i] = Some(now);
                i
            }
            None => {
                s.in_flight.push(Some(now));
                s.in_flight.len() - 1
            }
        };
        InFlight {
            deadline: self,
            slot,
        }
    }

    /// The deadline a request is held to now.
    pub(super) fn current(&self) -> Duration {
        self.for_item(0)
    }

    /// The deadline of a send of an item cut `cuts` times before.
    fn for_item(&self, cuts: u32) -> Duration {
        let p99 = self.p99_us.load(Relaxed);
        if p99 == 0 {
            return self.timeout;
        }
        Duration::from_micros(p99)
            .mul_f64(FACTOR)
            .max(FLOOR)
            .saturating_mul(RECUT.saturating_pow(cuts.min(8)))
            .min(self.timeout)
    }

    /// A successful answer after `latency`.
    pub(super) fn answered(&self, latency: Duration) {
        let n = self.answers.fetch_add(1, Relaxed) + 1;
        let refresh = {
            let mut s = self.lock();
            if s.answered.len() == WINDOW {
                s.answered.pop_front();
            }
            s.answered.push_back(latency.as_secs_f32());
            s.answered.len() >= MIN_SAMPLES
                && (self.p99_us.load(Relaxed) == 0 || n.is_multiple_of(REFRESH_EVERY))
        };
        if refresh {
            self.refresh();
        }
    }

    /// The p99 afresh, over the answers and the waits of the requests in
    /// flight.
    fn refresh(&self) {
        let mut all: Vec<f32> = {
            let s = self.lock();
            if s.answered.len() < MIN_SAMPLES {
                return;
            }
            let now = Instant::now();
            let waits = (s.answered.len() < WINDOW).then_some(&s.in_flight);
            s.answered
                .iter()
                .copied()
                .chain(
                    waits
                        .into_iter()
                        .flatten()
                        .flatten()
                        .map(|t| now.duration_since(*t).as_secs_f32()),
                )
                .collect()
        };
        let at = ((all.len() as f64 * 0.99).ceil() as usize).clamp(1, all.len()) - 1;
        let (_, p99, _) = all.select_nth_unstable_by(at, f32::total_cmp);
        let us = (f64::from(*p99) * 1e6).max(1.0) as u64;
        self.p99_us.store(us, Relaxed);
    }

    /// A request was cut at the deadline.
    pub(super) fn cut(&self) {
        self.cuts.fetch_add(1, Relaxed);
    }

    /// Resolves when a request sent at `started` is past its deadline
    /// (with the deadline it missed). Never while the deadline is the
    /// configured timeout: reqwest's own timeout ends that request, with
    /// its own message.
    pub(super) async fn passed(&self, started: Instant, item_cuts: u32) -> Duration {
        // On tokio's clock from here (a paused clock in tests).
        let started = tokio::time::Instant::now() - started.elapsed();
        loop {
            let deadline = self.for_item(item_cuts);
            let elapsed = started.elapsed();
            if deadline < self.timeout && elapsed >= deadline {
                // Judged by the p99 as it is now, slow requests in flight
                // included, before anything is cut.
                self.refresh();
                let now = self.for_item(item_cuts);
                if now < self.timeout && elapsed >= now {
                    return now;
                }
                continue;
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
            "no answer within {:.1} s, the deadline learned from the provider's latency now ({FACTOR}× its p99 of {p99:.2} s, at least {} s, {RECUT}× longer for each earlier cut of this item); cut and sent again: it may have been billed",
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

    #[tokio::test(start_paused = true)]
    async fn a_wait_ends_at_the_learned_deadline_and_never_at_the_timeout() {
        let d = Deadline::new(Duration::from_secs(120));
        let started = Instant::now();
        // Nothing learned: no cut, however long (reqwest's timeout rules).
        let waited = tokio::time::timeout(Duration::from_secs(300), d.passed(started, 0)).await;
        assert!(waited.is_err());
        // Learned while the request waits: held to the new deadline at once.
        for _ in 0..MIN_SAMPLES {
            d.answered(ms(100));
        }
        let clock = tokio::time::Instant::now();
        let missed = d.passed(Instant::now(), 0).await;
        assert_eq!(missed, FLOOR);
        assert!(clock.elapsed() >= FLOOR);
        // An item cut once before: four times longer.
        let clock = tokio::time::Instant::now();
        assert_eq!(d.passed(Instant::now(), 1).await, FLOOR * 4);
        assert!(clock.elapsed() >= FLOOR * 4);
        assert!(
            d.cut_message(missed).contains("2.0 s"),
            "{}",
            d.cut_message(missed)
        );
    }

    /// A first wave of slow answers is not judged by its fastest few: the
    /// requests still waiting count, so none of them is past the p99.
    #[test]
    fn requests_in_flight_count_so_a_slow_first_wave_is_not_cut() {
        let d = Deadline::new(Duration::from_secs(600));
        let waiting: Vec<InFlight<'_>> = (0..180).map(|_| d.begin()).collect();
        std::thread::sleep(ms(300));
        // The fastest 20 of 200 answered at about 100 ms.
        for _ in 0..MIN_SAMPLES {
            d.answered(ms(100));
        }
        d.refresh();
        let p99 = d.gauge().p99_secs.unwrap();
        assert!(p99 >= 0.29, "the waits of the 180 in flight count: {p99}");
        // With a full window of answers they count no more: many requests
        // hanging at once do not hold the p99 up by their own waits.
        for _ in 0..WINDOW {
            d.answered(ms(100));
        }
        d.refresh();
        assert!(d.gauge().p99_secs.unwrap() < 0.2);
        drop(waiting);
    }
}
