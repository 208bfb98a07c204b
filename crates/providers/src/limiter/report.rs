//! What the limiter tells the operator: why sends are slow now, how long
//! a hold has left, and a snapshot of its gauges.

use std::time::Duration;

/// Why sends are not going out faster right now (shown to the operator).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SlowReason {
    #[default]
    None,
    /// All concurrency slots busy.
    Concurrency,
    /// Waiting for the requests/min bucket.
    Requests,
    /// Waiting for the tokens/min bucket.
    Tokens,
    /// Holding all sends after a 429/503 or an exhausted rate-limit header.
    Cooldown,
}

impl SlowReason {
    pub fn describe(self) -> &'static str {
        match self {
            SlowReason::None => "",
            SlowReason::Concurrency => "all concurrency slots busy",
            SlowReason::Requests => "waiting for requests/min",
            SlowReason::Tokens => "waiting for tokens/min",
            SlowReason::Cooldown => "backing off after rate limiting",
        }
    }
}

/// What slows the sends now, with the time left of a rate-limit hold: the
/// operator sees "rate limited (waiting 12s)" (row S1), not only that the
/// run is backing off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Slowdown {
    pub reason: SlowReason,
    /// While a hold (`retry-after`, an exhausted `x-ratelimit-remaining-*`)
    /// lasts: how long it has left.
    pub wait: Option<Duration>,
}

impl Slowdown {
    /// A short text for the progress line and the console's gauges.
    pub fn describe(&self) -> String {
        match (self.reason, self.wait) {
            (SlowReason::Cooldown, Some(wait)) => {
                // Whole seconds, rounded up: a hold of 0.3 s still reads 1s.
                let secs = wait.as_secs_f64().ceil().max(1.0) as u64;
                format!("rate limited (waiting {secs}s)")
            }
            (reason, _) => reason.describe().to_string(),
        }
    }
}

impl PartialEq<SlowReason> for Slowdown {
    fn eq(&self, other: &SlowReason) -> bool {
        self.reason == *other
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimiterSnapshot {
    pub concurrency_limit: usize,
    pub max_concurrency: usize,
    pub in_flight: usize,
    pub requests_per_minute: u64,
    pub tokens_per_minute: u64,
    pub slow_reason: Slowdown,
    pub cuts: u64,
    /// Sends let go over the last 60 seconds, counted when let go: never
    /// more than `requests_per_minute` (unless it was just lowered).
    pub requests_last_minute: u64,
    /// Their tokens (reserved, then corrected by the usage reported).
    pub tokens_last_minute: u64,
}
