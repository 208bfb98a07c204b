//! The gate every Files/Batches route passes first, and how those routes answer.
//!
//! Contract, in order: Azure's `api-key` header (401 in Azure's shape) and
//! `api-version` query (400); `mode = "unauthorized"` (401); the shared rpm/tpm
//! buckets at a cost of 0 tokens (429 with `retry-after` and `x-ratelimit-*`,
//! exactly as the chat routes; counted as `batch_rate_limited`). Every answer
//! carries `x-request-id` and the `openai-*` headers.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tokio::time::Instant;

use crate::chat::openai as chat;
use crate::chat::pipeline::{Event, Limited, Rendered};
use crate::limits::{Decision, RateHeaders};
use crate::state::openai::Api;
use crate::state::{Live, Mode, Shared, lock};
use crate::stats::BatchCount;
use crate::wire::id_hex;

/// A request that passed the gate: what its answer needs.
pub(crate) struct Gate {
    pub api: Api,
    pub live: Arc<Live>,
    request_id: String,
    started: Instant,
    rate: Option<RateHeaders>,
}

/// Auth, api-version, mode and rate limits, for every Files/Batches route.
pub(crate) fn gate(
    shared: &Shared,
    uri: &Uri,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
) -> Result<Gate, Box<Response>> {
    let api = Api::of_path(uri.path());
    let mut g = Gate {
        api,
        live: shared.live(),
        request_id: id_hex(shared.ids.fetch_add(1, Relaxed), !shared.salt),
        started: Instant::now(),
        rate: None,
    };
    if api == Api::Azure {
        if !chat::has_value(headers, "api-key") {
            let ev = Event::NoAuth(chat::MSG_AZURE_401.to_string());
            return Err(Box::new(g.event(&ev)));
        }
        if query.get("api-version").is_none_or(|v| v.is_empty()) {
            let msg = "Missing required query parameter: 'api-version'. Set it to a supported version such as 2024-10-21.";
            return Err(Box::new(g.event(&Event::BadRequest(msg.to_string()))));
        }
    }
    if g.live.mode == Mode::Unauthorized {
        return Err(Box::new(g.event(&Event::Unauthorized)));
    }
    if g.live.limits_on {
        let decision = lock(&shared.limits).check(0, Instant::now());
        let limited = match decision {
            Decision::Allowed(h) => {
                g.rate = Some(h);
                None
            }
            Decision::Limited {
                kind,
                limit,
                used,
                requested,
                wait,
                headers,
            } => {
                g.rate = Some(headers);
                Some(Limited {
                    kind,
                    limit,
                    used,
                    requested,
                    wait,
                })
            }
            // A cost of 0 tokens is never too large.
            Decision::TooLarge { headers, .. } => {
                g.rate = Some(headers);
                None
            }
        };
        if let Some(l) = limited {
            shared.stats.count(BatchCount::RateLimited);
            return Err(Box::new(g.event(&Event::RateLimited(l))));
        }
    }
    Ok(g)
}

impl Gate {
    /// An error in the route's usual shape (OpenAI's, or Azure's 401/429).
    pub(crate) fn event(&self, ev: &Event) -> Response {
        self.render(chat::render_error(self.api.route(), ev, "batch"))
    }

    /// `{"error":{"message","type","param","code"}}` with a status.
    pub(crate) fn error(
        &self,
        status: StatusCode,
        msg: &str,
        param: Option<&str>,
        code: Option<&str>,
    ) -> Response {
        let kind = if status.is_server_error() {
            "server_error"
        } else {
            "invalid_request_error"
        };
        let body = json!({"error": {"message": msg, "type": kind, "param": param, "code": code}});
        let body = serde_json::to_vec(&body).unwrap_or_default();
        self.render(Rendered::json(status, body))
    }

    pub(crate) fn not_found(&self, what: &str, id: &str) -> Response {
        let msg = format!("No such {what} object: {id}");
        self.error(StatusCode::NOT_FOUND, &msg, Some("id"), None)
    }

    /// 200 with a serialized object.
    pub(crate) fn ok<T: serde::Serialize>(&self, value: &T) -> Response {
        match serde_json::to_vec(value) {
            Ok(body) => self.render(Rendered::json(StatusCode::OK, body)),
            Err(e) => self.error(
                StatusCode::INTERNAL_SERVER_ERROR,
                &e.to_string(),
                None,
                None,
            ),
        }
    }

    pub(crate) fn render(&self, r: Rendered) -> Response {
        let mut resp = (r.status, [(header::CONTENT_TYPE, r.content_type)], r.body).into_response();
        self.headers(resp.headers_mut());
        for (name, value) in r.headers {
            crate::chat::pipeline::put(resp.headers_mut(), name, value);
        }
        resp
    }

    pub(crate) fn headers(&self, h: &mut HeaderMap) {
        let ms = self.started.elapsed().as_millis() as u64;
        chat::common_headers(h, &self.request_id, ms, self.rate.as_ref());
    }
}
