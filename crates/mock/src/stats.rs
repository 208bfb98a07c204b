//! Counters and the bounded request log behind `/_mock/stats` and `/_mock/log`.
//!
//! Contract: counters are lock-free atomics (they sit on the hot path); the log
//! is a `Mutex<VecDeque>` capped at `log_capacity` entries, oldest dropped.
//! `requests` counts every chat POST (any route) on arrival; exactly one outcome
//! counter and one log entry follow per request (a hang is recorded when it is
//! decided, since it never finishes). `seq` keeps growing across resets so log
//! entries stay unique for the life of the server.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use tokio::time::Instant;

use crate::wire::Route;
use crate::{MockLogEntry, MockStats};

/// How one chat-completion request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Ok,
    RateLimited,
    Unauthorized,
    Quota,
    ServerError,
    Overloaded,
    Hang,
    Malformed,
    ResetMidBody,
    Truncated,
    WrongSchema,
    BadRequest,
    Refused,
    Empty,
}

impl Outcome {
    const ALL: [Outcome; 14] = [
        Outcome::Ok,
        Outcome::RateLimited,
        Outcome::Unauthorized,
        Outcome::Quota,
        Outcome::ServerError,
        Outcome::Overloaded,
        Outcome::Hang,
        Outcome::Malformed,
        Outcome::ResetMidBody,
        Outcome::Truncated,
        Outcome::WrongSchema,
        Outcome::BadRequest,
        Outcome::Refused,
        Outcome::Empty,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::RateLimited => "rate_limited",
            Outcome::Unauthorized => "unauthorized",
            Outcome::Quota => "quota",
            Outcome::ServerError => "server_error",
            Outcome::Overloaded => "overloaded",
            Outcome::Hang => "hang",
            Outcome::Malformed => "malformed",
            Outcome::ResetMidBody => "reset_mid_body",
            Outcome::Truncated => "truncated",
            Outcome::WrongSchema => "wrong_schema",
            Outcome::BadRequest => "bad_request",
            Outcome::Refused => "refused",
            Outcome::Empty => "empty",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Counters of the Files and Batches APIs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BatchCount {
    FileUploaded,
    FileDeleted,
    Created,
    Completed,
    Failed,
    Expired,
    Cancelled,
    LineOk,
    LineFailed,
    Poll,
    RateLimited,
}

const BATCH_COUNTS: usize = 11;

/// A Files/Batches event for the log (an upload, a create, a lifecycle transition).
pub(crate) struct BatchEvent<'a> {
    pub provider: &'a str,
    pub route: &'a str,
    pub batch_id: &'a str,
    pub client_request_id: Option<&'a str>,
    pub model: &'a str,
    /// HTTP status sent; 0 for a transition (no HTTP exchange)
    pub status: u16,
    pub outcome: &'a str,
}

/// What the log records about a request besides its outcome.
pub(crate) struct RequestFacts<'a> {
    pub route: Route,
    pub client_request_id: Option<&'a str>,
    pub prompt_sha256: &'a str,
    pub model: &'a str,
}

pub(crate) struct Recorder {
    started: Instant,
    seq: AtomicU64,
    requests: AtomicU64,
    outcomes: [AtomicU64; Outcome::ALL.len()],
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    models_requests: AtomicU64,
    partial_answers: AtomicU64,
    batch: [AtomicU64; BATCH_COUNTS],
    log: Mutex<VecDeque<MockLogEntry>>,
}

impl Recorder {
    pub(crate) fn new(started: Instant) -> Recorder {
        Recorder {
            started,
            seq: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            outcomes: std::array::from_fn(|_| AtomicU64::new(0)),
            prompt_tokens: AtomicU64::new(0),
            completion_tokens: AtomicU64::new(0),
            models_requests: AtomicU64::new(0),
            partial_answers: AtomicU64::new(0),
            batch: std::array::from_fn(|_| AtomicU64::new(0)),
            log: Mutex::new(VecDeque::new()),
        }
    }

    pub(crate) fn request_received(&self) {
        self.requests.fetch_add(1, Relaxed);
    }

    pub(crate) fn models_request(&self) {
        self.models_requests.fetch_add(1, Relaxed);
    }

    /// An answer was generated with optional properties left out.
    pub(crate) fn partial_answer(&self) {
        self.partial_answers.fetch_add(1, Relaxed);
    }

    /// Count the outcome (plus usage of a 200 with usage) and append to the log.
    pub(crate) fn record(
        &self,
        outcome: Outcome,
        status: u16,
        usage: Option<(u64, u64)>,
        facts: &RequestFacts<'_>,
        log_capacity: usize,
    ) {
        self.outcomes[outcome.index()].fetch_add(1, Relaxed);
        if let Some((prompt, completion)) = usage {
            self.prompt_tokens.fetch_add(prompt, Relaxed);
            self.completion_tokens.fetch_add(completion, Relaxed);
        }
        if log_capacity == 0 {
            return;
        }
        let entry = MockLogEntry {
            seq: self.seq.fetch_add(1, Relaxed),
            at_ms: self.started.elapsed().as_millis() as u64,
            provider: facts.route.provider().to_string(),
            route: facts.route.path().to_string(),
            client_request_id: facts.client_request_id.map(str::to_string),
            prompt_sha256: facts.prompt_sha256.to_string(),
            model: facts.model.to_string(),
            status,
            outcome: outcome.as_str().to_string(),
            batch_id: None,
            usage,
        };
        self.push(entry, log_capacity);
    }

    pub(crate) fn count(&self, c: BatchCount) {
        self.add(c, 1);
    }

    pub(crate) fn add(&self, c: BatchCount, n: u64) {
        self.batch[c as usize].fetch_add(n, Relaxed);
    }

    /// Append a Files/Batches event to the log (counters are the caller's business).
    pub(crate) fn event(&self, e: &BatchEvent<'_>, log_capacity: usize) {
        if log_capacity == 0 {
            return;
        }
        let entry = MockLogEntry {
            seq: self.seq.fetch_add(1, Relaxed),
            at_ms: self.started.elapsed().as_millis() as u64,
            provider: e.provider.to_string(),
            route: e.route.to_string(),
            client_request_id: e.client_request_id.map(str::to_string),
            prompt_sha256: String::new(),
            model: e.model.to_string(),
            status: e.status,
            outcome: e.outcome.to_string(),
            batch_id: Some(e.batch_id.to_string()),
            usage: None,
        };
        self.push(entry, log_capacity);
    }

    fn push(&self, entry: MockLogEntry, log_capacity: usize) {
        // A poisoned lock only means another request panicked mid-push; the deque is still sound.
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        while log.len() >= log_capacity {
            log.pop_front();
        }
        log.push_back(entry);
    }

    pub(crate) fn snapshot(&self) -> MockStats {
        let n = |o: Outcome| self.outcomes[o.index()].load(Relaxed);
        let b = |c: BatchCount| self.batch[c as usize].load(Relaxed);
        MockStats {
            requests: self.requests.load(Relaxed),
            ok: n(Outcome::Ok),
            rate_limited: n(Outcome::RateLimited),
            unauthorized: n(Outcome::Unauthorized),
            quota: n(Outcome::Quota),
            server_errors: n(Outcome::ServerError),
            overloaded: n(Outcome::Overloaded),
            hangs: n(Outcome::Hang),
            malformed: n(Outcome::Malformed),
            resets: n(Outcome::ResetMidBody),
            truncated: n(Outcome::Truncated),
            wrong_schema: n(Outcome::WrongSchema),
            refused: n(Outcome::Refused),
            empty: n(Outcome::Empty),
            bad_requests: n(Outcome::BadRequest),
            prompt_tokens: self.prompt_tokens.load(Relaxed),
            completion_tokens: self.completion_tokens.load(Relaxed),
            models_requests: self.models_requests.load(Relaxed),
            files_uploaded: b(BatchCount::FileUploaded),
            files_deleted: b(BatchCount::FileDeleted),
            batches_created: b(BatchCount::Created),
            batches_completed: b(BatchCount::Completed),
            batches_failed: b(BatchCount::Failed),
            batches_expired: b(BatchCount::Expired),
            batches_cancelled: b(BatchCount::Cancelled),
            batch_lines_ok: b(BatchCount::LineOk),
            batch_lines_failed: b(BatchCount::LineFailed),
            batch_polls: b(BatchCount::Poll),
            batch_rate_limited: b(BatchCount::RateLimited),
            partial_answers: self.partial_answers.load(Relaxed),
        }
    }

    pub(crate) fn log(&self) -> Vec<MockLogEntry> {
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        log.iter().cloned().collect()
    }

    /// Shrink the log at once when the capacity is lowered live.
    pub(crate) fn trim_log(&self, log_capacity: usize) {
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        while log.len() > log_capacity {
            log.pop_front();
        }
    }

    pub(crate) fn reset(&self) {
        for counter in self
            .outcomes
            .iter()
            .chain([&self.requests, &self.prompt_tokens, &self.completion_tokens])
            .chain([&self.models_requests, &self.partial_answers])
            .chain(self.batch.iter())
        {
            counter.store(0, Relaxed);
        }
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_logs_and_caps() {
        let r = Recorder::new(Instant::now());
        let facts = RequestFacts {
            route: Route::Anthropic,
            client_request_id: Some("c-1"),
            prompt_sha256: "ab",
            model: "m",
        };
        for _ in 0..5 {
            r.request_received();
            r.record(Outcome::Ok, 200, Some((10, 3)), &facts, 3);
        }
        r.record(Outcome::Hang, 0, None, &facts, 3);
        let s = r.snapshot();
        assert_eq!((s.requests, s.ok, s.hangs), (5, 5, 1));
        assert_eq!((s.prompt_tokens, s.completion_tokens), (50, 15));
        let log = r.log();
        assert_eq!(log.len(), 3);
        assert_eq!(log[0].seq, 3);
        assert_eq!(log[2].outcome, "hang");
        assert_eq!(
            (log[2].provider.as_str(), log[2].route.as_str()),
            ("anthropic", "/v1/messages")
        );
        r.reset();
        assert_eq!(r.snapshot(), MockStats::default());
        assert!(r.log().is_empty());
    }
}
