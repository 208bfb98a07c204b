//! The one shared limiter of a process: concurrency (AIMD), requests/min and
//! tokens/min buckets (governor), and the server's own signals.
//!
//! - Concurrency is additive-increase / multiplicative-decrease: halved on a
//!   429 or 503 (at most once per second, so one burst of refusals is one cut),
//!   raised by 1/limit per success (about +1 per window of `limit` answers).
//! - Buckets hold half a second (requests) or one second (tokens) of the
//!   per-minute limit, never a minute's burst: providers enforce per-minute
//!   limits over short windows and refuse a client that bursts.
//! - Tokens are reserved before a send (prompt estimate + max_tokens) and
//!   corrected from the reported usage after: overspend is charged at once,
//!   underspend is credited to the next reservations.
//! - `x-ratelimit-limit-*` lower our limits to the server's when smaller;
//!   `x-ratelimit-remaining-* = 0` and `retry-after` hold every send until the
//!   reset time (a cooldown), not just the request that was refused.
//!
//! Time comes from tokio's clock so tests run on a paused clock.
//!
//! `buckets` owns the governor buckets and their clock, `report` what the
//! limiter tells the operator; this module holds the limiter itself.

mod buckets;
mod report;
#[cfg(test)]
mod tests;
mod window;

use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::Duration;

use governor::clock::Clock;
use tokio::sync::Notify;
use tokio::time::Instant;

pub use buckets::TokioClock;
use buckets::{Bucket, effective, rebuild_buckets};
pub use report::{LimiterSnapshot, SlowReason, Slowdown};
use window::SentWindow;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimiterSettings {
    /// 0 = no client-side limit.
    pub requests_per_minute: u64,
    /// 0 = no client-side limit.
    pub tokens_per_minute: u64,
    pub max_concurrency: usize,
}

/// Rate-limit facts a provider answer carried.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RateHeaders {
    pub limit_requests: Option<u64>,
    pub limit_tokens: Option<u64>,
    pub remaining_requests: Option<u64>,
    pub remaining_tokens: Option<u64>,
    pub reset_requests: Option<Duration>,
    pub reset_tokens: Option<Duration>,
    pub retry_after: Option<Duration>,
}

struct Inner {
    settings: LimiterSettings,
    /// Server-advertised limits, when lower than ours.
    server_rpm: Option<u64>,
    server_tpm: Option<u64>,
    limit: f64,
    in_flight: usize,
    requests: Option<Bucket>,
    tokens: Option<Bucket>,
    token_burst: u32,
    /// Tokens reserved or overspent but not yet paid into the bucket.
    token_debt: u64,
    /// Tokens reserved but not used, to be taken off the next reservations.
    token_credit: u64,
    cooldown_until: Option<Instant>,
    /// Over how long the sends a cooldown held are let go again (full
    /// jitter after its end), so they do not all leave at once: a herd
    /// that would only meet the next 429 (row S2).
    cooldown_spread: Duration,
    last_cut: Option<Instant>,
    cuts: u64,
    /// When each kind of wait last happened; the snapshot reports the most
    /// upstream one seen in the last second (a slot held while waiting for
    /// the requests bucket is a requests wait, not a concurrency one).
    last_rate_wait: Option<(Instant, SlowReason)>,
    last_slot_wait: Option<Instant>,
    /// The sends let go over the last minute: no 60-second window holds
    /// more than the per-minute limits, and the gauges read this count.
    sent: SentWindow,
}

pub struct Limiter {
    inner: Mutex<Inner>,
    slot_freed: Notify,
    clock: TokioClock,
}

/// A concurrency slot; dropping it frees the slot.
pub struct Slot {
    limiter: std::sync::Arc<Limiter>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        {
            let mut g = self.limiter.lock();
            g.in_flight = g.in_flight.saturating_sub(1);
        }
        self.limiter.slot_freed.notify_waiters();
    }
}

/// Tokens held for one send until its usage is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    pub tokens: u64,
    /// When the limiter let the send go (to correct its count in the
    /// last minute's window); None for a reservation made elsewhere.
    pub sent_at: Option<Instant>,
}

const CUT_SPACING: Duration = Duration::from_secs(1);

impl Limiter {
    pub fn new(settings: LimiterSettings) -> Self {
        let clock = TokioClock {
            start: Instant::now(),
        };
        let mut inner = Inner {
            settings,
            server_rpm: None,
            server_tpm: None,
            limit: settings.max_concurrency.max(1) as f64,
            in_flight: 0,
            requests: None,
            tokens: None,
            token_burst: 1,
            token_debt: 0,
            token_credit: 0,
            cooldown_until: None,
            cooldown_spread: Duration::ZERO,
            last_cut: None,
            cuts: 0,
            last_rate_wait: None,
            last_slot_wait: None,
            sent: SentWindow::default(),
        };
        rebuild_buckets(&mut inner, clock);
        Self {
            inner: Mutex::new(inner),
            slot_freed: Notify::new(),
            clock,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A poisoned lock only means another thread panicked mid-update of
        // plain counters; the numbers are still usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wait for a concurrency slot.
    pub async fn acquire_slot(self: &std::sync::Arc<Self>) -> Slot {
        loop {
            // Register interest before looking, so a slot freed between the
            // look and the wait still wakes us.
            let notified = self.slot_freed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut g = self.lock();
                if (g.in_flight as f64) < g.limit.floor().max(1.0) {
                    g.in_flight += 1;
                    return Slot {
                        limiter: self.clone(),
                    };
                }
                g.last_slot_wait = Some(Instant::now());
            }
            notified.await;
        }
    }

    /// Wait until a send of about `tokens` tokens fits every bucket and no
    /// cooldown holds sends, then reserve it.
    pub async fn reserve(&self, tokens: u64) -> Reservation {
        // The tokens join the shared debt once; then this send waits until
        // every token owed (its own and any sent earlier) has been paid into
        // the bucket, one burst at a time. Sends of any size are paced at
        // exactly the tokens/min limit.
        self.lock().owe(tokens);
        loop {
            let wait = {
                let mut g = self.lock();
                self.try_reserve(&mut g, tokens)
            };
            match wait {
                Ok(sent_at) => {
                    return Reservation {
                        tokens,
                        sent_at: Some(sent_at),
                    };
                }
                Err(d) => tokio::time::sleep(d.max(Duration::from_millis(1))).await,
            }
        }
    }

    /// Let a send of `tokens` go now (returns when), or say how long to
    /// wait.
    fn try_reserve(&self, g: &mut Inner, tokens: u64) -> Result<Instant, Duration> {
        let now = Instant::now();
        if let Some(until) = g.cooldown_until {
            if until > now {
                g.last_rate_wait = Some((now, SlowReason::Cooldown));
                // Each held send wakes at its own moment after the end.
                let spread = g.cooldown_spread.as_secs_f64();
                let jitter = Duration::from_secs_f64(rand::random::<f64>() * spread);
                return Err(until - now + jitter);
            }
            g.cooldown_until = None;
            g.cooldown_spread = Duration::ZERO;
        }
        // The last minute's window first: a send it holds back must not
        // have spent bucket cells it then does not use.
        g.sent.prune(now);
        let rpm = effective(g.settings.requests_per_minute, g.server_rpm);
        let tpm = effective(g.settings.tokens_per_minute, g.server_tpm);
        if let Some(wait) = g.sent.wait_for(now, rpm, tpm, tokens) {
            let why = if rpm > 0 && g.sent.requests() >= rpm {
                SlowReason::Requests
            } else {
                SlowReason::Tokens
            };
            g.last_rate_wait = Some((now, why));
            return Err(wait);
        }
        while g.token_debt > 0 {
            let Some(bucket) = &g.tokens else {
                g.token_debt = 0;
                break;
            };
            let chunk = g.token_debt.min(u64::from(g.token_burst)) as u32;
            let Some(n) = NonZeroU32::new(chunk) else {
                break;
            };
            match bucket.check_n(n) {
                Ok(Ok(())) => g.token_debt -= u64::from(chunk),
                Ok(Err(not_until)) => {
                    g.last_rate_wait = Some((now, SlowReason::Tokens));
                    return Err(not_until.wait_time_from(self.clock.now()));
                }
                // `chunk` never exceeds the burst, so the bucket can hold it.
                Err(_) => g.token_debt -= u64::from(chunk),
            }
        }
        if let Some(bucket) = &g.requests
            && let Err(not_until) = bucket.check()
        {
            g.last_rate_wait = Some((now, SlowReason::Requests));
            return Err(not_until.wait_time_from(self.clock.now()));
        }
        g.sent.admit(now, tokens);
        Ok(now)
    }

    /// A successful answer: raise concurrency a little and settle the tokens.
    pub fn on_success(
        &self,
        reservation: Reservation,
        used_tokens: Option<u64>,
        headers: &RateHeaders,
    ) {
        let mut g = self.lock();
        let max = g.settings.max_concurrency.max(1) as f64;
        g.limit = (g.limit + 1.0 / g.limit.max(1.0)).min(max);
        if let Some(used) = used_tokens {
            settle_tokens(&mut g, reservation.tokens, used);
            if let Some(at) = reservation.sent_at {
                g.sent.correct(at, reservation.tokens, used);
            }
        }
        self.observe(&mut g, headers);
        drop(g);
        self.slot_freed.notify_waiters();
    }

    /// A 429 rate limit or a 503: cut concurrency and hold sends as told.
    pub fn on_throttled(&self, headers: &RateHeaders) {
        let mut g = self.lock();
        let now = Instant::now();
        if g.last_cut
            .is_none_or(|t| now.duration_since(t) >= CUT_SPACING)
        {
            g.limit = (g.limit / 2.0).max(1.0);
            g.last_cut = Some(now);
            g.cuts += 1;
        }
        let hold = headers
            .retry_after
            .unwrap_or(Duration::from_millis(500))
            .min(Duration::from_secs(60));
        extend_cooldown(&mut g, now + hold);
        // The held sends go again spread over the hold's length after it;
        // with no hint the hold is a guess, and a storm with no hint meets
        // everything that waits at once (row S2): spread wider.
        g.cooldown_spread = match headers.retry_after {
            Some(_) => hold,
            None => UNHINTED_SPREAD,
        };
        self.observe(&mut g, headers);
    }

    /// Any other answer (a 500, a failed parse): headers still count.
    pub fn on_other(&self, headers: &RateHeaders) {
        let mut g = self.lock();
        self.observe(&mut g, headers);
    }

    fn observe(&self, g: &mut Inner, h: &RateHeaders) {
        let mut rebuild = false;
        if let Some(limit) = h.limit_requests.filter(|l| *l > 0)
            && g.server_rpm != Some(limit)
        {
            g.server_rpm = Some(limit);
            rebuild = true;
        }
        if let Some(limit) = h.limit_tokens.filter(|l| *l > 0)
            && g.server_tpm != Some(limit)
        {
            g.server_tpm = Some(limit);
            rebuild = true;
        }
        if rebuild {
            rebuild_buckets(g, self.clock);
        }
        let now = Instant::now();
        if h.remaining_requests == Some(0)
            && let Some(reset) = h.reset_requests
        {
            extend_cooldown(g, now + reset.min(Duration::from_secs(60)));
        }
        if h.remaining_tokens == Some(0)
            && let Some(reset) = h.reset_tokens
        {
            extend_cooldown(g, now + reset.min(Duration::from_secs(60)));
        }
    }

    /// Change the limits of a live run (console retune, `--rate-limit`).
    pub fn retune(&self, settings: LimiterSettings) {
        let mut g = self.lock();
        g.settings = settings;
        g.limit = g.limit.min(settings.max_concurrency.max(1) as f64);
        if g.limit < 1.0 {
            g.limit = 1.0;
        }
        rebuild_buckets(&mut g, self.clock);
        drop(g);
        self.slot_freed.notify_waiters();
    }

    pub fn snapshot(&self) -> LimiterSnapshot {
        let mut g = self.lock();
        let now = Instant::now();
        g.sent.prune(now);
        let recent = |t: Instant| now.duration_since(t) <= Duration::from_secs(1);
        let reason = |reason| Slowdown { reason, wait: None };
        let slow_reason = match (g.cooldown_until, g.last_rate_wait, g.last_slot_wait) {
            (Some(until), _, _) if until > now => Slowdown {
                reason: SlowReason::Cooldown,
                wait: Some(until - now),
            },
            (_, Some((t, why)), _) if recent(t) => reason(why),
            (_, _, Some(t)) if recent(t) => reason(SlowReason::Concurrency),
            _ => reason(SlowReason::None),
        };
        LimiterSnapshot {
            concurrency_limit: g.limit.floor().max(1.0) as usize,
            max_concurrency: g.settings.max_concurrency,
            in_flight: g.in_flight,
            requests_per_minute: effective(g.settings.requests_per_minute, g.server_rpm),
            tokens_per_minute: effective(g.settings.tokens_per_minute, g.server_tpm),
            slow_reason,
            cuts: g.cuts,
            requests_last_minute: g.sent.requests(),
            tokens_last_minute: g.sent.tokens(),
        }
    }
}

impl Inner {
    /// Add tokens to the debt, paying with credit first.
    fn owe(&mut self, tokens: u64) {
        if self.tokens.is_none() {
            return;
        }
        let from_credit = self.token_credit.min(tokens);
        self.token_credit -= from_credit;
        self.token_debt = self.token_debt.saturating_add(tokens - from_credit);
    }
}

/// How long the sends held by a 429 with no retry hint are spread over
/// after its cooldown.
const UNHINTED_SPREAD: Duration = Duration::from_secs(2);

fn extend_cooldown(g: &mut Inner, until: Instant) {
    if g.cooldown_until.is_none_or(|t| t < until) {
        g.cooldown_until = Some(until);
    }
}

fn settle_tokens(g: &mut Inner, reserved: u64, used: u64) {
    if used > reserved {
        // Overspend is owed: the next sends wait for it.
        g.owe(used - reserved);
    } else {
        // Underspend first cancels debt not yet paid, then becomes credit
        // (at most one burst, so a quiet spell cannot bank a burst).
        let mut back = reserved - used;
        let cancel = back.min(g.token_debt);
        g.token_debt -= cancel;
        back -= cancel;
        g.token_credit = (g.token_credit + back).min(u64::from(g.token_burst));
    }
}
