//! `POST /v1/chat/completions`: the request pipeline.
//!
//! Contract, in order: count the request; mode (`unauthorized` → 401,
//! `quota` → 429 insufficient_quota with `x-should-retry: false`); body
//! validation (400); rate buckets, requests then tokens (429
//! rate_limit_exceeded with retry-after, answered at once without latency);
//! early faults 500 / 503 / hang; the latency sleep; late faults malformed /
//! truncated / wrong_schema; the answer. Every response gets `x-request-id`,
//! `openai-processing-ms`, and, once the buckets were consulted and a limit is
//! set, the six `x-ratelimit-*` headers. Each request ends in exactly one
//! stats outcome and one log entry.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use tokio::time::Instant;

use super::answer::{self, Damage};
use super::faults::{Draw, EarlyFault, LateFault};
use super::limits::{BucketView, Decision, LimitKind, RateHeaders, ceil_ms, go_duration};
use super::server::{Live, Mode, Shared, json_response, lock};
use super::stats::{Outcome, RequestFacts};
use super::wire::{self, ChatRequest, Completion, Prompt, error_body, id_hex};

/// A hung request is held this long (the client's timeout ends it first).
const HANG: Duration = Duration::from_secs(3600);

/// Per-request context for building and recording responses.
struct Reply<'a> {
    shared: &'a Shared,
    live: &'a Live,
    facts: RequestFacts<'a>,
    started: Instant,
    rate: Option<RateHeaders>,
}

pub(crate) async fn handle(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    shared.stats.request_received();
    let live = shared.live();
    let parsed: Result<ChatRequest, serde_json::Error> = serde_json::from_slice(&body);
    let prompt = match &parsed {
        Ok(req) => Prompt::from_request(req),
        Err(e) if e.is_data() => Err(format!("Invalid request body: {e}")),
        Err(_) => Err(wire::MSG_NOT_JSON.to_string()),
    };
    let (prompt_sha256, seed) = match &prompt {
        Ok(p) => p.hashes(),
        Err(_) => (String::new(), [0; 32]),
    };
    let model = match (&prompt, &parsed) {
        (Ok(p), _) => p.model,
        (Err(_), Ok(req)) => req.model.as_deref().unwrap_or(""),
        _ => "",
    };
    let mut reply = Reply {
        shared: &shared,
        live: &live,
        facts: RequestFacts {
            client_request_id: headers
                .get("x-client-request-id")
                .and_then(|v| v.to_str().ok()),
            prompt_sha256: &prompt_sha256,
            model,
        },
        started,
        rate: None,
    };

    match live.mode {
        Mode::Normal => {}
        Mode::Unauthorized => {
            let body = error_body(
                wire::MSG_BAD_KEY,
                Some("invalid_request_error"),
                Some("invalid_api_key"),
            );
            return reply.send(StatusCode::UNAUTHORIZED, Outcome::Unauthorized, body, &[]);
        }
        Mode::Quota => {
            let body = error_body(
                wire::MSG_QUOTA,
                Some("insufficient_quota"),
                Some("insufficient_quota"),
            );
            let extra = [("x-should-retry", "false".to_string())];
            return reply.send(StatusCode::TOO_MANY_REQUESTS, Outcome::Quota, body, &extra);
        }
    }

    let prompt = match prompt {
        Ok(p) => p,
        Err(msg) => {
            let body = error_body(&msg, Some("invalid_request_error"), None);
            return reply.send(StatusCode::BAD_REQUEST, Outcome::BadRequest, body, &[]);
        }
    };
    let prompt_tokens = prompt.prompt_tokens();

    if live.limits_on {
        let cost = prompt_tokens.saturating_add(prompt.max_tokens.unwrap_or(256));
        let decision = lock(&shared.limits).check(cost, Instant::now());
        match decision {
            Decision::Allowed(h) => reply.rate = Some(h),
            Decision::Limited {
                kind,
                limit,
                used,
                requested,
                wait,
                headers,
            } => {
                reply.rate = Some(headers);
                let (what, unit) = match kind {
                    LimitKind::Requests => ("requests", "RPM"),
                    LimitKind::Tokens => ("tokens", "TPM"),
                };
                let msg = format!(
                    "Rate limit reached for {model} in organization org-mock on {what} per min ({unit}): Limit {limit}, Used {used}, Requested {requested}. Please try again in {}.",
                    go_duration(wait)
                );
                let wait_ms = ceil_ms(wait).max(1);
                let extra = [
                    ("retry-after", wait_ms.div_ceil(1000).max(1).to_string()),
                    ("retry-after-ms", wait_ms.to_string()),
                ];
                let body = error_body(&msg, Some(what), Some("rate_limit_exceeded"));
                return reply.send(
                    StatusCode::TOO_MANY_REQUESTS,
                    Outcome::RateLimited,
                    body,
                    &extra,
                );
            }
            Decision::TooLarge {
                limit,
                requested,
                headers,
            } => {
                reply.rate = Some(headers);
                let msg = format!(
                    "Request too large for {model} in organization org-mock on tokens per min (TPM): Limit {limit}, Requested {requested}. The input or output tokens must be reduced in order to run successfully."
                );
                let body = error_body(&msg, Some("tokens"), Some("rate_limit_exceeded"));
                let extra = [("x-should-retry", "false".to_string())];
                return reply.send(
                    StatusCode::TOO_MANY_REQUESTS,
                    Outcome::RateLimited,
                    body,
                    &extra,
                );
            }
        }
    }

    let draw = if live.quiet {
        Draw {
            early: None,
            late: None,
            latency: Duration::ZERO,
        }
    } else {
        lock(&shared.rng).draw(&live.plan)
    };

    match draw.early {
        None => {}
        Some(EarlyFault::ServerError) => {
            let body = error_body(wire::MSG_500, Some("server_error"), None);
            return reply.send(
                StatusCode::INTERNAL_SERVER_ERROR,
                Outcome::ServerError,
                body,
                &[],
            );
        }
        Some(EarlyFault::Overloaded) => {
            let body = error_body(wire::MSG_503, Some("server_error"), None);
            return reply.send(
                StatusCode::SERVICE_UNAVAILABLE,
                Outcome::Overloaded,
                body,
                &[],
            );
        }
        Some(EarlyFault::Hang) => {
            // Recorded now: the request never finishes from the client's point of view.
            reply.record(Outcome::Hang, 0, None);
            tokio::select! {
                _ = tokio::time::sleep(HANG) => {}
                _ = shared.stopping() => {}
            }
            let body = error_body(wire::MSG_503, Some("server_error"), None);
            return reply.build(StatusCode::SERVICE_UNAVAILABLE, body, &[]);
        }
    }

    if !draw.latency.is_zero() {
        tokio::select! {
            _ = tokio::time::sleep(draw.latency) => {}
            _ = shared.stopping() => {}
        }
    }

    let damage = match draw.late {
        Some(LateFault::Malformed) => {
            let body = br#"{"id":"chatcmpl-x","object":"chat.compl"#.to_vec();
            return reply.send(StatusCode::OK, Outcome::Malformed, body, &[]);
        }
        Some(LateFault::Truncated) => Damage::Truncated,
        Some(LateFault::WrongSchema) => Damage::WrongSchema,
        None => Damage::None,
    };
    let content = answer::content(&prompt, seed, damage);
    let (finish_reason, completion_tokens, outcome) = match damage {
        Damage::Truncated => (
            "length",
            prompt
                .max_tokens
                .unwrap_or_else(|| wire::completion_tokens(&content)),
            Outcome::Truncated,
        ),
        Damage::WrongSchema => (
            "stop",
            wire::completion_tokens(&content),
            Outcome::WrongSchema,
        ),
        Damage::None => ("stop", wire::completion_tokens(&content), Outcome::Ok),
    };
    let id = format!(
        "chatcmpl-{}",
        id_hex(shared.ids.fetch_add(1, Relaxed), shared.salt)
    );
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let completion = Completion::new(
        &id,
        created,
        prompt.model,
        &content,
        finish_reason,
        prompt_tokens,
        completion_tokens,
    );
    let body = match serde_json::to_vec(&completion) {
        Ok(b) => b,
        Err(e) => {
            let body = error_body(&e.to_string(), Some("server_error"), None);
            return reply.send(
                StatusCode::INTERNAL_SERVER_ERROR,
                Outcome::ServerError,
                body,
                &[],
            );
        }
    };
    reply.record(outcome, 200, Some((prompt_tokens, completion_tokens)));
    reply.build(StatusCode::OK, body, &[])
}

impl Reply<'_> {
    fn record(&self, outcome: Outcome, status: u16, usage: Option<(u64, u64)>) {
        let cap = self.live.config.log_capacity;
        self.shared
            .stats
            .record(outcome, status, usage, &self.facts, cap);
    }

    /// Record the outcome, then build the response.
    fn send(
        &self,
        status: StatusCode,
        outcome: Outcome,
        body: Vec<u8>,
        extra: &[(&'static str, String)],
    ) -> Response {
        self.record(outcome, status.as_u16(), None);
        self.build(status, body, extra)
    }

    fn build(
        &self,
        status: StatusCode,
        body: Vec<u8>,
        extra: &[(&'static str, String)],
    ) -> Response {
        let mut resp = json_response(status, body);
        let h = resp.headers_mut();
        let request_no = self.shared.ids.fetch_add(1, Relaxed);
        put(
            h,
            "x-request-id",
            format!("req_{}", id_hex(request_no, !self.shared.salt)),
        );
        let ms = self.started.elapsed().as_millis() as u64;
        h.insert("openai-processing-ms", HeaderValue::from(ms));
        h.insert("openai-version", HeaderValue::from_static("2020-10-01"));
        h.insert("openai-organization", HeaderValue::from_static("org-mock"));
        if let Some(rate) = &self.rate {
            rate_headers(h, "requests", rate.requests.as_ref());
            rate_headers(h, "tokens", rate.tokens.as_ref());
        }
        for (name, value) in extra {
            put(h, name, value.clone());
        }
        resp
    }
}

fn put(h: &mut HeaderMap, name: &'static str, value: String) {
    if let Ok(v) = HeaderValue::try_from(value) {
        h.insert(HeaderName::from_static(name), v);
    }
}

fn rate_headers(h: &mut HeaderMap, kind: &str, view: Option<&BucketView>) {
    let Some(v) = view else { return };
    let (limit, remaining, reset) = match kind {
        "requests" => (
            "x-ratelimit-limit-requests",
            "x-ratelimit-remaining-requests",
            "x-ratelimit-reset-requests",
        ),
        _ => (
            "x-ratelimit-limit-tokens",
            "x-ratelimit-remaining-tokens",
            "x-ratelimit-reset-tokens",
        ),
    };
    h.insert(limit, HeaderValue::from(v.limit));
    h.insert(remaining, HeaderValue::from(v.remaining));
    put(h, reset, go_duration(v.reset));
}
