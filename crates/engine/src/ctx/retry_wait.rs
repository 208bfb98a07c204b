//! Row S2's `retry_wait`: a request refused for rate limits
//! `max_rate_limit_retries` times in a row is never failed for it. It waits
//! `retry_wait_secs` (jittered ±25%, so the requests waiting together do
//! not come back together) until its `run_at`, then its rate-limit retries
//! start over. The waits are said in `retry_wait` warning events, one per
//! `SPACING` at most however many requests wait (a long storm sends
//! hundreds there), each with how many and until when.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::Ctx;

/// At most one `retry_wait` event this often.
const SPACING: Duration = Duration::from_secs(10);

/// Requests sent to wait since the last event.
#[derive(Default)]
struct Pending {
    requests: u64,
    /// The `run_at`s of those requests: the earliest and the latest.
    earliest: f64,
    latest: f64,
    /// Refusals in a row that sent them there, and the last one's words.
    refused: u32,
    last_error: String,
}

#[derive(Default)]
pub(crate) struct RetryWaits {
    pending: Mutex<(Pending, Option<Instant>)>,
}

impl RetryWaits {
    /// How long the request waits (jittered), and its `run_at`; noted for
    /// the next event, which goes now unless one went within `SPACING`.
    pub(crate) fn enter(&self, ctx: &Ctx, base: Duration, refused: u32, error: &str) -> Duration {
        let wait = base.mul_f64(rand::Rng::random_range(&mut rand::rng(), 0.75..1.25));
        let run_at = docket_ledger::now_ts() + wait.as_secs_f64();
        {
            let mut g = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            let p = &mut g.0;
            p.earliest = if p.requests == 0 {
                run_at
            } else {
                p.earliest.min(run_at)
            };
            p.latest = p.latest.max(run_at);
            p.requests += 1;
            p.refused = refused;
            p.last_error = docket_model::sanitize::truncate(error, 120);
        }
        self.flush(ctx);
        wait
    }

    /// Say what waits, if anything does and no event went within
    /// `SPACING` (the control loop calls it every tick, so the last ones
    /// are said too).
    pub(crate) fn flush(&self, ctx: &Ctx) {
        self.say(ctx, false);
    }

    /// Say what waits, spacing or not (the run is ending).
    pub(crate) fn flush_now(&self, ctx: &Ctx) {
        self.say(ctx, true);
    }

    fn say(&self, ctx: &Ctx, now: bool) {
        let mut g = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let (p, last) = &mut *g;
        if p.requests == 0 || (!now && last.is_some_and(|t| t.elapsed() < SPACING)) {
            return;
        }
        *last = Some(Instant::now());
        let p = std::mem::take(p);
        let until = if p.requests == 1 {
            format!("until {} (run_at)", clock(p.latest))
        } else {
            format!(
                "until between {} and {} (run_at)",
                clock(p.earliest),
                clock(p.latest)
            )
        };
        ctx.event(
            "warn",
            "retry_wait",
            format!(
                "{} request(s) refused for rate limits {} times in a row ({}) wait {until}, then go again. No item is failed for rate limits",
                p.requests,
                p.refused,
                docket_model::sanitize::for_terminal(&p.last_error),
            ),
        );
    }
}

fn clock(ts: f64) -> String {
    chrono::DateTime::from_timestamp(ts as i64, 0).map_or_else(
        || format!("{ts:.0}"),
        |t| t.format("%H:%M:%S UTC").to_string(),
    )
}
