//! Live counters of a run, shared by the workers and the progress line. The
//! ledger stays authoritative; these only make the display cheap.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use docket_model::routing::Outcome;

#[derive(Debug, Default)]
pub struct Stats {
    pub total: AtomicU64,
    pub done: AtomicU64,
    pub accepted: AtomicU64,
    pub review: AtomicU64,
    pub rejected: AtomicU64,
    pub errors: AtomicU64,
    pub retries: AtomicU64,
    pub rate_limited: AtomicU64,
    pub ambiguous: AtomicU64,
    pub in_flight: AtomicU64,
    /// Of those in flight, lines waiting in provider batches.
    pub batched: AtomicU64,
    /// Requests waiting out `retry_wait_secs` after their rate-limit
    /// retries ran out (row S2).
    pub retry_waiting: AtomicU64,
    pub sent: AtomicU64,
    pub input_tokens: AtomicU64,
    pub output_tokens: AtomicU64,
    /// Cost in micro-dollars (atomics hold integers).
    pub cost_micros: AtomicU64,
    /// Why the run's sends are held right now, when a breaker holds them
    /// (an unreachable or failing provider, row S5): for the progress line.
    held: std::sync::Mutex<Option<String>>,
    /// The session's ETA in seconds as the control loop last worked it out
    /// (`control::eta`), as f64 bits; 0 (the default): none. One ETA for
    /// the console's gauges and the progress line.
    eta_bits: AtomicU64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StatsSnapshot {
    pub total: u64,
    pub done: u64,
    pub accepted: u64,
    pub review: u64,
    pub rejected: u64,
    pub errors: u64,
    pub retries: u64,
    pub rate_limited: u64,
    pub ambiguous: u64,
    pub in_flight: u64,
    pub batched: u64,
    pub retry_waiting: u64,
    pub sent: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_usd: f64,
}

impl Stats {
    pub fn record_outcome(&self, o: Outcome) {
        self.done.fetch_add(1, Relaxed);
        match o {
            Outcome::Accepted => &self.accepted,
            Outcome::Review => &self.review,
            Outcome::Rejected => &self.rejected,
            Outcome::Error => &self.errors,
        }
        .fetch_add(1, Relaxed);
    }

    pub fn add_usage(&self, input: u64, output: u64, cost_usd: f64) {
        self.input_tokens.fetch_add(input, Relaxed);
        self.output_tokens.fetch_add(output, Relaxed);
        self.cost_micros
            .fetch_add((cost_usd * 1e6).round() as u64, Relaxed);
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            total: self.total.load(Relaxed),
            done: self.done.load(Relaxed),
            accepted: self.accepted.load(Relaxed),
            review: self.review.load(Relaxed),
            rejected: self.rejected.load(Relaxed),
            errors: self.errors.load(Relaxed),
            retries: self.retries.load(Relaxed),
            rate_limited: self.rate_limited.load(Relaxed),
            ambiguous: self.ambiguous.load(Relaxed),
            retry_waiting: self.retry_waiting.load(Relaxed),
            in_flight: self.in_flight.load(Relaxed),
            batched: self.batched.load(Relaxed),
            sent: self.sent.load(Relaxed),
            input_tokens: self.input_tokens.load(Relaxed),
            output_tokens: self.output_tokens.load(Relaxed),
            cost_usd: self.cost_micros.load(Relaxed) as f64 / 1e6,
        }
    }

    /// Say why sends are held now (None: they are not).
    pub fn set_held(&self, why: Option<String>) {
        *self.held.lock().unwrap_or_else(|p| p.into_inner()) = why;
    }

    /// Publish the session's ETA (None: unknown, or nothing left).
    pub fn set_eta(&self, secs: Option<f64>) {
        let bits = secs
            .filter(|s| s.is_finite() && *s > 0.0)
            .map_or(0, f64::to_bits);
        self.eta_bits.store(bits, Relaxed);
    }

    /// The session's ETA in seconds, when known.
    pub fn eta(&self) -> Option<f64> {
        let bits = self.eta_bits.load(Relaxed);
        (bits != 0).then(|| f64::from_bits(bits))
    }

    /// Why sends are held now, if they are.
    pub fn held(&self) -> Option<String> {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Start from what the ledger already holds (a resumed session).
    pub fn seed(&self, s: &docket_ledger::store::SessionRow) {
        self.total.store(s.total_count, Relaxed);
        self.done.store(s.processed_count, Relaxed);
        self.accepted.store(s.accepted_count, Relaxed);
        self.review.store(s.reviewed_count, Relaxed);
        self.rejected.store(s.rejected_count, Relaxed);
        self.errors.store(s.error_count, Relaxed);
        self.retries.store(s.retry_count, Relaxed);
        self.rate_limited.store(s.rate_limited_count, Relaxed);
        self.ambiguous.store(s.ambiguous_count, Relaxed);
        self.input_tokens.store(s.input_tokens, Relaxed);
        self.output_tokens.store(s.output_tokens, Relaxed);
        self.cost_micros
            .store((s.cost_usd * 1e6).round() as u64, Relaxed);
    }
}
