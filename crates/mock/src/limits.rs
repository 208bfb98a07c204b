//! Server-side rate limits shaped like OpenAI's: a per-minute limit enforced as
//! a per-second token bucket.
//!
//! Contract: each limit `L` (requests or tokens per minute) is a bucket of
//! capacity `max(L/60, 1)` that refills continuously at `L/60` per second and
//! starts full, so a client bursting a minute's budget at once is refused after
//! one second's worth. A refused request consumes nothing. The requests bucket
//! is checked before the tokens bucket and a request passes only if both admit
//! it. Time comes from `tokio::time::Instant`, so paused-clock tests work.
//!
//! A request costing more tokens than one bucket holds (but not more than the
//! whole minute) is admitted when the bucket is full and drives the level
//! negative; otherwise such a request could never pass, which OpenAI does not
//! do either. More than the whole minute is "Request too large" and never passes.
//! Durations in headers and messages are Go duration strings ("12ms", "1m30.5s").

use std::time::Duration;

use tokio::time::Instant;

/// One limit as a bucket.
#[derive(Debug, Clone)]
struct Bucket {
    limit: u64,
    capacity: f64,
    per_sec: f64,
    level: f64,
    last: Instant,
}

/// What the `x-ratelimit-*-<kind>` headers say about one bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct BucketView {
    pub limit: u64,
    pub remaining: u64,
    /// time until the bucket is full again
    pub reset: Duration,
}

/// Header values for both buckets (None = that limit is off).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct RateHeaders {
    pub requests: Option<BucketView>,
    pub tokens: Option<BucketView>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LimitKind {
    Requests,
    Tokens,
}

/// Outcome of asking the buckets to admit one request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Decision {
    Allowed(RateHeaders),
    Limited {
        kind: LimitKind,
        limit: u64,
        used: u64,
        requested: u64,
        wait: Duration,
        headers: RateHeaders,
    },
    /// The request alone exceeds the per-minute token limit: retrying never helps.
    TooLarge {
        limit: u64,
        requested: u64,
        headers: RateHeaders,
    },
}

impl Bucket {
    fn new(limit: u64, now: Instant) -> Bucket {
        let capacity = (limit as f64 / 60.0).max(1.0);
        Bucket {
            limit,
            capacity,
            per_sec: limit as f64 / 60.0,
            level: capacity,
            last: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.level = (self.level + dt * self.per_sec).min(self.capacity);
    }

    /// Level needed to admit `cost` (capped at capacity, see the module doc).
    fn need(&self, cost: f64) -> f64 {
        cost.min(self.capacity)
    }

    fn wait_for(&self, cost: f64) -> Duration {
        let missing = (self.need(cost) - self.level).max(0.0);
        secs(missing / self.per_sec)
    }

    fn view(&self) -> BucketView {
        let frac = (self.level / self.capacity).clamp(0.0, 1.0);
        BucketView {
            limit: self.limit,
            remaining: (frac * self.limit as f64).floor() as u64,
            reset: secs((self.capacity - self.level).max(0.0) / self.per_sec),
        }
    }

    /// Same bucket under a new limit, keeping how full it is.
    fn resized(&self, limit: u64, now: Instant) -> Bucket {
        let mut old = self.clone();
        old.refill(now);
        let mut new = Bucket::new(limit, now);
        new.level = (old.level / old.capacity).clamp(0.0, 1.0) * new.capacity;
        new
    }
}

fn secs(s: f64) -> Duration {
    if s.is_finite() && s > 0.0 {
        Duration::from_secs_f64(s.min(86_400.0))
    } else {
        Duration::ZERO
    }
}

/// The requests and tokens buckets of one server.
#[derive(Debug, Default)]
pub(crate) struct Limits {
    requests: Option<Bucket>,
    tokens: Option<Bucket>,
}

impl Limits {
    pub(crate) fn new(rpm: u64, tpm: u64, now: Instant) -> Limits {
        Limits {
            requests: (rpm > 0).then(|| Bucket::new(rpm, now)),
            tokens: (tpm > 0).then(|| Bucket::new(tpm, now)),
        }
    }

    /// Apply new limits live: unchanged limits keep their state, changed ones keep their fill ratio.
    pub(crate) fn reconfigure(&mut self, rpm: u64, tpm: u64, now: Instant) {
        fn one(slot: &mut Option<Bucket>, limit: u64, now: Instant) {
            *slot = match (slot.take(), limit) {
                (_, 0) => None,
                (Some(b), l) if b.limit == l => Some(b),
                (Some(b), l) => Some(b.resized(l, now)),
                (None, l) => Some(Bucket::new(l, now)),
            };
        }
        one(&mut self.requests, rpm, now);
        one(&mut self.tokens, tpm, now);
    }

    fn headers(&self) -> RateHeaders {
        RateHeaders {
            requests: self.requests.as_ref().map(Bucket::view),
            tokens: self.tokens.as_ref().map(Bucket::view),
        }
    }

    /// Admit (and charge) one request costing `token_cost` tokens, or say why not.
    pub(crate) fn check(&mut self, token_cost: u64, now: Instant) -> Decision {
        if let Some(b) = self.requests.as_mut() {
            b.refill(now);
        }
        if let Some(b) = self.tokens.as_mut() {
            b.refill(now);
        }
        let cost = token_cost as f64;
        if let Some(b) = &self.requests
            && b.level < b.need(1.0)
        {
            let view = b.view();
            return Decision::Limited {
                kind: LimitKind::Requests,
                limit: b.limit,
                used: b.limit.saturating_sub(view.remaining),
                requested: 1,
                wait: b.wait_for(1.0),
                headers: self.headers(),
            };
        }
        if let Some(b) = &self.tokens {
            if token_cost > b.limit {
                return Decision::TooLarge {
                    limit: b.limit,
                    requested: token_cost,
                    headers: self.headers(),
                };
            }
            if b.level < b.need(cost) {
                let view = b.view();
                return Decision::Limited {
                    kind: LimitKind::Tokens,
                    limit: b.limit,
                    used: b.limit.saturating_sub(view.remaining),
                    requested: token_cost,
                    wait: b.wait_for(cost),
                    headers: self.headers(),
                };
            }
        }
        if let Some(b) = self.requests.as_mut() {
            b.level -= 1.0;
        }
        if let Some(b) = self.tokens.as_mut() {
            b.level -= cost;
        }
        Decision::Allowed(self.headers())
    }
}

/// Whole milliseconds, rounded up so a wait is never reported as zero.
pub(crate) fn ceil_ms(d: Duration) -> u64 {
    let ms = d.as_millis() as u64;
    if Duration::from_millis(ms) < d {
        ms + 1
    } else {
        ms
    }
}

/// Go's `time.Duration.String()` at millisecond precision: "0s", "12ms",
/// "1s", "8.64s", "1m30.5s", "6m0s", "1h0m0s". Rounds up to the next millisecond.
pub(crate) fn go_duration(d: Duration) -> String {
    let ms = ceil_ms(d);
    if ms == 0 {
        return "0s".to_string();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let h = ms / 3_600_000;
    let m = (ms / 60_000) % 60;
    let s_ms = ms % 60_000;
    let whole = s_ms / 1000;
    let frac = s_ms % 1000;
    let secs = if frac == 0 {
        format!("{whole}s")
    } else {
        let digits = format!("{frac:03}");
        format!("{whole}.{}s", digits.trim_end_matches('0'))
    };
    if h > 0 {
        format!("{h}h{m}m{secs}")
    } else if m > 0 {
        format!("{m}m{secs}")
    } else {
        secs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_look_like_go() {
        let ms = Duration::from_millis;
        assert_eq!(go_duration(Duration::ZERO), "0s");
        assert_eq!(go_duration(ms(12)), "12ms");
        assert_eq!(go_duration(Duration::from_micros(300)), "1ms");
        assert_eq!(go_duration(ms(1000)), "1s");
        assert_eq!(go_duration(ms(8640)), "8.64s");
        assert_eq!(go_duration(ms(90_500)), "1m30.5s");
        assert_eq!(go_duration(ms(360_000)), "6m0s");
        assert_eq!(go_duration(ms(3_600_000)), "1h0m0s");
    }

    #[test]
    fn burst_is_cut_at_one_seconds_worth_and_refills() {
        let t0 = Instant::now();
        let mut l = Limits::new(600, 0, t0);
        let ok = (0..30)
            .filter(|_| matches!(l.check(5, t0), Decision::Allowed(_)))
            .count();
        assert_eq!(ok, 10);
        match l.check(5, t0) {
            Decision::Limited {
                kind, wait, used, ..
            } => {
                assert_eq!(kind, LimitKind::Requests);
                assert_eq!(used, 600);
                assert_eq!(ceil_ms(wait), 100);
            }
            other => panic!("expected limited, got {other:?}"),
        }
        // 0.5 s later five requests' worth has come back.
        let t1 = t0 + Duration::from_millis(500);
        let ok = (0..10)
            .filter(|_| matches!(l.check(5, t1), Decision::Allowed(_)))
            .count();
        assert_eq!(ok, 5);
    }

    #[test]
    fn tokens_bucket_refuses_without_charging_requests() {
        let t0 = Instant::now();
        let mut l = Limits::new(6000, 6000, t0); // 100 req and 100 tokens per second
        assert!(matches!(l.check(80, t0), Decision::Allowed(_)));
        assert!(matches!(
            l.check(80, t0),
            Decision::Limited {
                kind: LimitKind::Tokens,
                ..
            }
        ));
        match l.check(10, t0) {
            Decision::Allowed(h) => {
                let r = h.requests.expect("requests view");
                assert_eq!(r.remaining, 6000 - 2 * 60); // two charged, the refused one not
                assert_eq!(h.tokens.expect("tokens view").remaining, 600);
            }
            other => panic!("expected allowed, got {other:?}"),
        }
        assert!(matches!(l.check(7000, t0), Decision::TooLarge { .. }));
    }

    #[test]
    fn oversized_request_passes_on_a_full_bucket() {
        let t0 = Instant::now();
        let mut l = Limits::new(0, 6000, t0); // 100 tokens per second bucket
        assert!(matches!(l.check(500, t0), Decision::Allowed(_)));
        // now 400 in debt: 5 s to get back to full
        match l.check(500, t0) {
            Decision::Limited { wait, .. } => assert_eq!(ceil_ms(wait), 5000),
            other => panic!("expected limited, got {other:?}"),
        }
    }

    #[test]
    fn reconfigure_keeps_fill_ratio() {
        let t0 = Instant::now();
        let mut l = Limits::new(600, 0, t0);
        for _ in 0..5 {
            l.check(1, t0);
        }
        l.reconfigure(1200, 0, t0);
        let h = l.headers().requests.expect("view");
        assert_eq!((h.limit, h.remaining), (1200, 600));
        l.reconfigure(0, 0, t0);
        assert_eq!(l.headers(), RateHeaders::default());
    }
}
