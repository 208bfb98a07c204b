//! The gate every Anthropic Message Batches route passes first, its error
//! and answer shapes, and the batch event log entry.
//!
//! The gate, in order: `x-api-key` (401 `authentication_error`),
//! `anthropic-version` (400), `mode = "unauthorized"` (401), the shared rpm
//! bucket at a cost of 0 tokens (429 `rate_limit_error` with `retry-after`,
//! counted as `batch_rate_limited`). Errors are Anthropic's
//! `{"type":"error","error":{"type","message"},"request_id"}`, and every answer
//! carries `request-id` and the `anthropic-ratelimit-*` headers.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::json;
use tokio::time::Instant;

use crate::chat::anthropic;
use crate::chat::openai::has_value;
use crate::chat::pipeline::{Event, Limited, Rendered, put};
use crate::limits::{Decision, RateHeaders};
use crate::state::{Live, Mode, Shared, lock};
use crate::stats::{BatchCount, BatchEvent};
use crate::wire::id_hex;

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
