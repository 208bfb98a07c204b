//! State of Anthropic's Message Batches API in the mock and the exact
//! `message_batch` object (reference section 4).
//!
//! Contract: one `Store` behind a mutex in `Shared`, apart from the OpenAI
//! store (Anthropic batches never show on OpenAI's routes). A batch is
//! `in_progress` from its create, `canceling` after a cancel, `ended` at the
//! end; `request_counts` stay in `processing` until it ends, then move to
//! `succeeded` / `errored` / `canceled` / `expired` at once. `results_url`
//! is set only once the batch has ended and its results exist (with
//! `batch_output_late_ms` a batch is `ended` with a null `results_url` for
//! that long). Times are RFC 3339 strings with microseconds.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use tokio::sync::Notify;

/// Batches expire 24 h after creation.
pub(crate) const WINDOW_HOURS: i64 = 24;
pub(crate) const ROUTE: &str = "/v1/messages/batches";
pub(crate) const ROUTE_ONE: &str = "/v1/messages/batches/{message_batch_id}";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    InProgress,
    Canceling,
    Ended,
}

impl Phase {
    fn as_str(self) -> &'static str {
        match self {
            Phase::InProgress => "in_progress",
            Phase::Canceling => "canceling",
            Phase::Ended => "ended",
        }
    }
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub(crate) struct Counts {
    pub processing: u64,
    pub succeeded: u64,
    pub errored: u64,
    pub canceled: u64,
    pub expired: u64,
}

pub(crate) struct Batch {
    pub id: String,
    pub model: String,
    pub phase: Phase,
    /// set at create; the buckets other than `processing` only at the end
    pub counts: Counts,
    pub created_at: DateTime<Utc>,
    pub ended_at: Option<DateTime<Utc>>,
    pub cancel_initiated_at: Option<DateTime<Utc>>,
    /// the results JSONL, once it exists
    pub results: Option<Bytes>,
    /// results downloads so far (the cut-results fault cuts the first N)
    pub downloads: u32,
    /// the results download answers 404 until then (`batch_results_404_ms`)
    pub results_hidden_until: Option<std::time::Instant>,
    /// estimated prompt tokens, counted against the enqueued limit while open
    pub queued_tokens: u64,
    /// wakes the lifecycle task on cancel
    pub cancel: Arc<Notify>,
}

#[derive(Default)]
pub(crate) struct Store {
    pub batches: HashMap<String, Batch>,
    /// ids in creation order
    pub order: Vec<String>,
    pub next_seq: u64,
}

impl Store {
    /// Prompt tokens queued in the open (in_progress, canceling) batches.
    pub(crate) fn enqueued_tokens(&self) -> u64 {
        self.batches
            .values()
            .filter(|b| b.phase != Phase::Ended)
            .map(|b| b.queued_tokens)
            .sum()
    }
}

fn time(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// The `MessageBatch` object.
#[derive(Serialize)]
pub(crate) struct BatchObject<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    processing_status: &'static str,
    request_counts: Counts,
    created_at: String,
    expires_at: String,
    ended_at: Option<String>,
    cancel_initiated_at: Option<String>,
    archived_at: Option<String>,
    results_url: Option<String>,
}

impl Batch {
    /// `host` is the request's Host header, for an absolute `results_url`.
    pub(crate) fn object(&self, host: &str) -> BatchObject<'_> {
        BatchObject {
            id: &self.id,
            kind: "message_batch",
            processing_status: self.phase.as_str(),
            request_counts: self.counts,
            created_at: time(&self.created_at),
            expires_at: time(&(self.created_at + chrono::TimeDelta::hours(WINDOW_HOURS))),
            ended_at: self.ended_at.as_ref().map(time),
            cancel_initiated_at: self.cancel_initiated_at.as_ref().map(time),
            archived_at: None,
            results_url: (self.phase == Phase::Ended && self.results.is_some())
                .then(|| format!("http://{host}{ROUTE}/{}/results", self.id)),
        }
    }
}
