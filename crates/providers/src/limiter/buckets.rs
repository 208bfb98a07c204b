//! The requests/min and tokens/min buckets: governor on tokio's (pausable)
//! clock, sized from our limits and the server's, rebuilt empty mid-run.

use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};
use tokio::time::Instant;

use super::Inner;

/// governor clock on top of tokio's (pausable) clock.
#[derive(Clone, Copy, Debug)]
pub struct TokioClock {
    pub(super) start: Instant,
}

impl Clock for TokioClock {
    type Instant = Duration;
    fn now(&self) -> Duration {
        self.start.elapsed()
    }
}

pub(super) type Bucket = RateLimiter<NotKeyed, InMemoryState, TokioClock, NoOpMiddleware<Duration>>;

/// 0 means unlimited on our side; a server limit always applies.
pub(super) fn effective(ours: u64, server: Option<u64>) -> u64 {
    match (ours, server) {
        (0, Some(s)) => s,
        (o, Some(s)) => o.min(s),
        (o, None) => o,
    }
}

pub(super) fn rebuild_buckets(g: &mut Inner, clock: TokioClock) {
    let rpm = effective(g.settings.requests_per_minute, g.server_rpm);
    let tpm = effective(g.settings.tokens_per_minute, g.server_tpm);
    // A fresh governor bucket starts full. Mid-run that would be a burst on
    // top of what was just sent (right when the server said we are too
    // fast), so a rebuilt bucket starts empty; only the first one is full.
    let first = g.requests.is_none() && g.tokens.is_none();
    g.requests = per_minute_bucket(rpm, 120, clock, !first);
    g.token_burst = (tpm / 60).clamp(1, u64::from(u32::MAX)) as u32;
    g.tokens = per_minute_bucket(tpm, 60, clock, !first);
    g.token_credit = g.token_credit.min(u64::from(g.token_burst));
}

/// A bucket refilling `per_minute` cells a minute, holding 1/`burst_div` of a
/// minute's worth (at least one cell).
fn per_minute_bucket(
    per_minute: u64,
    burst_div: u64,
    clock: TokioClock,
    empty: bool,
) -> Option<Bucket> {
    if per_minute == 0 {
        return None;
    }
    let period = Duration::from_secs_f64(60.0 / per_minute as f64);
    let burst = NonZeroU32::new((per_minute / burst_div).clamp(1, u64::from(u32::MAX)) as u32)?;
    let quota = Quota::with_period(period)?.allow_burst(burst);
    let bucket = RateLimiter::direct_with_clock(quota, clock);
    if empty {
        let _ = bucket.check_n(burst);
    }
    Some(bucket)
}
