//! State of Anthropic's Message Batches API in the mock, the exact
//! `message_batch` object (reference section 4), and the gate every batch
//! route passes first.
//!
//! Contract: one `Store` behind a mutex in `Shared`, apart from the OpenAI
//! store (Anthropic batches never show on OpenAI's routes). A batch is
//! `in_progress` from its create, `canceling` after a cancel, `ended` at the
//! end; `request_counts` stay in `processing` until it ends, then move to
//! `succeeded` / `errored` / `canceled` / `expired` at once. `results_url`
//! is set only once the batch has ended and its results exist (with
//! `batch_output_late_ms` a batch is `ended` with a null `results_url` for
//! that long). Times are RFC 3339 strings with microseconds.
//!
//! The gate, in order: `x-api-key` (401 `authentication_error`),
//! `anthropic-version` (400), `mode = "unauthorized"` (401), the shared rpm
//! bucket at a cost of 0 tokens (429 `rate_limit_error` with `retry-after`,
//! counted as `batch_rate_limited`). Errors are Anthropic's
//! `{"type":"error","error":{"type","message"},"request_id"}`, and every answer
//! carries `request-id` and the `anthropic-ratelimit-*` headers.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use serde_json::json;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::anthropic;
use super::chat::has_value;
use super::limits::{Decision, RateHeaders};
use super::pipeline::{Event, Limited, Rendered, put};
use super::server::{Live, Mode, Shared, lock};
use super::stats::{BatchCount, BatchEvent};
use super::wire::id_hex;

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

/// The Host a request was sent to.
pub(crate) fn host(headers: &HeaderMap) -> String {
    headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("127.0.0.1")
        .to_string()
}

/// Log a batch event under the Anthropic provider.
pub(crate) fn event(shared: &Shared, route: &str, id: &str, model: &str, status: u16, what: &str) {
    let e = BatchEvent {
        provider: "anthropic",
        route,
        batch_id: id,
        client_request_id: None,
        model,
        status,
        outcome: what,
    };
    let cap = shared.live().config.log_capacity;
    shared.stats.event(&e, cap);
}

/// A request that passed the gate: what its answer needs.
pub(crate) struct Gate {
    pub live: Arc<Live>,
    pub request_id: String,
    rate: Option<RateHeaders>,
}

pub(crate) fn gate(shared: &Shared, headers: &HeaderMap) -> Result<Gate, Box<Response>> {
    let mut g = Gate {
        live: shared.live(),
        request_id: id_hex(shared.ids.fetch_add(1, Relaxed), !shared.salt),
        rate: None,
    };
    if !has_value(headers, "x-api-key") {
        let ev = Event::NoAuth("x-api-key header is required".to_string());
        return Err(Box::new(g.event(&ev)));
    }
    if !has_value(headers, "anthropic-version") {
        let ev = Event::BadRequest("anthropic-version: header is required".to_string());
        return Err(Box::new(g.event(&ev)));
    }
    if g.live.mode == Mode::Unauthorized {
        return Err(Box::new(g.event(&Event::Unauthorized)));
    }
    if g.live.limits_on {
        match lock(&shared.limits).check(0, Instant::now()) {
            Decision::Allowed(h) | Decision::TooLarge { headers: h, .. } => g.rate = Some(h),
            Decision::Limited {
                kind,
                limit,
                used,
                requested,
                wait,
                headers,
            } => {
                g.rate = Some(headers);
                shared.stats.count(BatchCount::RateLimited);
                let l = Limited {
                    kind,
                    limit,
                    used,
                    requested,
                    wait,
                };
                return Err(Box::new(g.event(&Event::RateLimited(l))));
            }
        }
    }
    Ok(g)
}

impl Gate {
    /// An error event in Anthropic's shape (as the sync route renders it).
    pub(crate) fn event(&self, ev: &Event) -> Response {
        self.render(anthropic::render_error(ev, "", &self.request_id))
    }

    /// `{"type":"error","error":{"type":kind,"message"},"request_id"}`.
    pub(crate) fn error(&self, status: StatusCode, kind: &str, msg: &str) -> Response {
        let body = json!({
            "type": "error",
            "error": {"type": kind, "message": msg},
            "request_id": format!("req_{}", self.request_id),
        });
        let body = serde_json::to_vec(&body).unwrap_or_default();
        self.render(Rendered::json(status, body))
    }

    pub(crate) fn bad(&self, msg: &str) -> Response {
        self.error(StatusCode::BAD_REQUEST, "invalid_request_error", msg)
    }

    pub(crate) fn not_found(&self, id: &str) -> Response {
        let msg = format!("No message batch found with id {id}.");
        self.error(StatusCode::NOT_FOUND, "not_found_error", &msg)
    }

    pub(crate) fn ok<T: Serialize>(&self, value: &T) -> Response {
        match serde_json::to_vec(value) {
            Ok(body) => self.render(Rendered::json(StatusCode::OK, body)),
            Err(e) => self.error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "api_error",
                &e.to_string(),
            ),
        }
    }

    pub(crate) fn render(&self, r: Rendered) -> Response {
        let mut resp = (r.status, [(header::CONTENT_TYPE, r.content_type)], r.body).into_response();
        self.headers(resp.headers_mut());
        for (name, value) in r.headers {
            put(resp.headers_mut(), name, value);
        }
        resp
    }

    pub(crate) fn headers(&self, h: &mut HeaderMap) {
        anthropic::common_headers(h, &self.request_id, self.rate.as_ref());
    }
}
