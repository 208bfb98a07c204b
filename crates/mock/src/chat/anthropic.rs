//! Anthropic Messages: `POST /v1/messages` (reference section 3).
//!
//! Contract: `x-api-key` must be non-empty (else 401 `authentication_error`)
//! and `anthropic-version` present (else 400); `model`, `max_tokens` (>= 1) and
//! a non-empty `messages` are required; `system` and each message `content`
//! are a string or an array of blocks (only `text` blocks are read);
//! `stream: true` is refused with a 400 (the mock does not stream). The answer
//! `output_config` is checked as the API checks it (`output_config`: a
//! `format.type` other than `json_schema`, or a schema keyword outside the
//! structured-outputs subset, is a 400 `invalid_request_error` naming it).
//! The answer format follows `infer` (an `output_config.format` JSON schema, else a
//! schema written in the prompt, else JSON if the prompt says "JSON", else the
//! VERDICT/CONFIDENCE text). The system prompt counts as the first message for
//! determinism, so a prompt sent here and to `/v1/chat/completions` with the
//! same model gets the same answer.
//!
//! Errors are `{"type":"error","error":{"type","message"},"request_id"}`:
//! 401 `authentication_error` (unauthorized mode), 400
//! `invalid_request_error` with the credit-balance message (quota mode), 429
//! `rate_limit_error` with `retry-after`, 500 `api_error`, 529
//! `overloaded_error` (the fail-503 fault). Every response carries
//! `request-id` and, when a server limit is set, the
//! `anthropic-ratelimit-{requests,tokens,input-tokens}-{limit,remaining,reset}`
//! headers (reset as an RFC 3339 time). The truncated fault gives
//! `stop_reason: "max_tokens"` with `output_tokens == max_tokens`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::chat::infer;
use crate::chat::openai::has_value;
use crate::chat::output_config;
use crate::chat::pipeline::{self, Answer, Event, Rendered, Request, Wire, put};
use crate::limits::{BucketView, LimitKind, RateHeaders, ceil_ms};
use crate::state::Shared;
use crate::wire::Route;
use crate::wire::{Content, MessageText, Prompt};

pub(crate) const MSG_CREDIT: &str = "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits.";

#[derive(Debug, Deserialize)]
struct MessagesRequest {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    max_tokens: Option<i64>,
    #[serde(default)]
    system: Option<Content>,
    #[serde(default)]
    messages: Option<Vec<Message>>,
    #[serde(default)]
    output_config: Option<serde_json::Value>,
    #[serde(default)]
    stream: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct Message {
    #[serde(default)]
    content: Option<Content>,
}

fn text_of(c: &Option<Content>) -> MessageText<'_> {
    match c {
        None => MessageText::Parts(Vec::new()),
        Some(Content::Text(s)) => MessageText::Whole(s),
        Some(Content::Parts(p)) => {
            MessageText::Parts(p.iter().filter_map(|p| p.text.as_deref()).collect())
        }
    }
}

/// `POST /v1/messages`
pub(crate) async fn handle(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    shared.stats.request_received();
    let live = shared.live();
    let reject = reject_of(&headers);
    let parsed: Result<MessagesRequest, String> = serde_json::from_slice(&body).map_err(|e| {
        if e.is_data() {
            format!("Invalid request body: {e}")
        } else {
            "There was an issue with your request body: it is not valid JSON.".to_string()
        }
    });
    // A refused `output_config` is the request's 400 (see `output_config`).
    let checked = match &parsed {
        Ok(req) => output_config::check(req.output_config.as_ref()),
        Err(_) => Ok(None),
    };
    let texts: Vec<MessageText<'_>> = match &parsed {
        Ok(req) => std::iter::once(&req.system)
            .filter(|s| s.is_some())
            .chain(req.messages.iter().flatten().map(|m| &m.content))
            .map(text_of)
            .collect(),
        Err(_) => Vec::new(),
    };
    let pieces = || texts.iter().flat_map(MessageText::pieces);
    let stated = checked
        .as_ref()
        .ok()
        .and_then(Option::as_ref)
        .map(|s| output_config::with_stated(s.clone(), pieces()));
    let explicit = stated.as_ref();
    let found = if explicit.is_none() {
        infer::schema_in_text(pieces())
    } else {
        None
    };
    let format = infer::format(
        explicit,
        found.as_ref(),
        false,
        infer::mentions_json(pieces()),
    );
    let prompt = match (&parsed, &checked) {
        (Err(msg), _) | (Ok(_), Err(msg)) => Err(msg.clone()),
        (Ok(req), Ok(_)) => validate(req).map(|(model, max)| Prompt {
            model,
            messages: texts,
            format,
            max_tokens: Some(max),
            thinking_tokens: 0,
        }),
    };
    let model = parsed
        .as_ref()
        .ok()
        .and_then(|r| r.model.as_deref())
        .unwrap_or("");
    let req = Request {
        route: Route::Anthropic,
        wire: WIRE,
        client_request_id: headers
            .get("x-client-request-id")
            .and_then(|v| v.to_str().ok()),
        reject,
        prompt,
        model,
        stream: false,
    };
    pipeline::run(&shared, &live, started, req).await
}

/// No `x-api-key` (401), or no `anthropic-version` (400).
fn reject_of(headers: &HeaderMap) -> Option<Event> {
    if !has_value(headers, "x-api-key") {
        Some(Event::NoAuth("x-api-key header is required".to_string()))
    } else if !has_value(headers, "anthropic-version") {
        Some(Event::BadRequest(
            "anthropic-version: header is required".to_string(),
        ))
    } else {
        None
    }
}

fn validate(req: &MessagesRequest) -> Result<(&str, u64), String> {
    let model = match req.model.as_deref() {
        Some(m) if !m.is_empty() => m,
        _ => return Err("model: Field required".to_string()),
    };
    let max = match req.max_tokens {
        None => return Err("max_tokens: Field required".to_string()),
        Some(n) if n < 1 => {
            return Err("max_tokens: Input should be greater than or equal to 1".to_string());
        }
        Some(n) => n as u64,
    };
    match &req.messages {
        None => return Err("messages: Field required".to_string()),
        Some(m) if m.is_empty() => {
            return Err("messages: at least one message is required".to_string());
        }
        Some(_) => {}
    }
    if req.stream == Some(true) {
        return Err(
            "stream: the docket mock provider does not stream; send \"stream\": false".to_string(),
        );
    }
    Ok((model, max))
}

/// How the pipeline renders Anthropic's wire.
const WIRE: Wire = Wire {
    render_error: |_route, ev, model, request_id| render_error(ev, model, request_id),
    render_answer: |_route, a| render_answer(a),
    common_headers: |_route, h, request_id, _ms, rate| common_headers(h, request_id, rate),
};

pub(crate) fn render_error(ev: &Event, _model: &str, request_id: &str) -> Rendered {
    let (status, kind, message) = classify(ev);
    let r = error_body(status, kind, &message, request_id);
    match ev {
        Event::RateLimited(l) => r.with(
            "retry-after",
            ceil_ms(l.wait).max(1).div_ceil(1000).to_string(),
        ),
        Event::TooLarge { .. } => r.with("x-should-retry", "false".to_string()),
        _ => r,
    }
}

/// Anthropic's status, error type and message for each event.
fn classify(ev: &Event) -> (StatusCode, &'static str, String) {
    match ev {
        Event::NoAuth(msg) => (
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            msg.clone(),
        ),
        Event::Unauthorized => (
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "invalid x-api-key".to_string(),
        ),
        Event::BadRequest(msg) => (
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            msg.clone(),
        ),
        Event::Forbidden => (
            StatusCode::FORBIDDEN,
            "permission_error",
            "Your API key does not have permission to use the specified resource.".to_string(),
        ),
        Event::ModelNotFound(m) => (
            StatusCode::NOT_FOUND,
            "not_found_error",
            format!("model: {m}"),
        ),
        Event::Quota => (
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            MSG_CREDIT.to_string(),
        ),
        Event::RateLimited(l) => {
            let what = match l.kind {
                LimitKind::Requests => "requests",
                LimitKind::Tokens => "input tokens",
            };
            let msg = format!(
                "This request would exceed the rate limit for your organization (org-mock) of {} {what} per minute. For details, refer to: https://docs.claude.com/en/api/rate-limits. You can see the response headers for current usage. Please reduce the prompt length or the maximum tokens requested, or try again later.",
                l.limit
            );
            (StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", msg)
        }
        Event::TooLarge { limit, requested } => {
            let msg = format!(
                "This request would exceed the rate limit for your organization (org-mock) of {limit} input tokens per minute: it asks for {requested} tokens on its own. Please reduce the prompt length or the maximum tokens requested."
            );
            (StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", msg)
        }
        Event::ServerError => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "api_error",
            "Internal server error".to_string(),
        ),
        Event::Overloaded => (overloaded(), "overloaded_error", "Overloaded".to_string()),
    }
}

/// The error body: `{"type": "error", "error": {type, message}, "request_id"}`.
fn error_body(status: StatusCode, kind: &str, message: &str, request_id: &str) -> Rendered {
    #[derive(Serialize)]
    struct Body<'a> {
        #[serde(rename = "type")]
        kind: &'static str,
        error: Inner<'a>,
        request_id: String,
    }
    #[derive(Serialize)]
    struct Inner<'a> {
        #[serde(rename = "type")]
        kind: &'a str,
        message: &'a str,
    }
    let body = Body {
        kind: "error",
        error: Inner { kind, message },
        request_id: format!("req_{request_id}"),
    };
    Rendered::json(status, serde_json::to_vec(&body).unwrap_or_default())
}

fn overloaded() -> StatusCode {
    // 529 is Anthropic's own code; it is a valid status number, so this never fails.
    StatusCode::from_u16(529).unwrap_or(StatusCode::SERVICE_UNAVAILABLE)
}

#[derive(Serialize)]
struct MessageBody<'a> {
    id: String,
    #[serde(rename = "type")]
    kind: &'static str,
    role: &'static str,
    model: &'a str,
    content: Vec<TextBlock<'a>>,
    stop_reason: &'static str,
    stop_sequence: Option<&'a str>,
    usage: Usage,
}

#[derive(Serialize)]
struct TextBlock<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    text: &'a str,
}

#[derive(Serialize)]
struct Usage {
    input_tokens: u64,
    output_tokens: u64,
    cache_creation_input_tokens: u64,
    cache_read_input_tokens: u64,
    cache_creation: CacheCreation,
    service_tier: &'static str,
}

#[derive(Serialize)]
struct CacheCreation {
    ephemeral_5m_input_tokens: u64,
    ephemeral_1h_input_tokens: u64,
}

pub(crate) fn render_answer(a: &Answer<'_>) -> Result<Rendered, String> {
    let body = MessageBody {
        id: format!("msg_{}", a.id),
        kind: "message",
        role: "assistant",
        model: a.model,
        // A refusal stops before any content block.
        content: if a.refused {
            Vec::new()
        } else {
            vec![TextBlock {
                kind: "text",
                text: a.content,
            }]
        },
        stop_reason: if a.refused {
            "refusal"
        } else if a.truncated {
            "max_tokens"
        } else {
            "end_turn"
        },
        stop_sequence: None,
        usage: Usage {
            input_tokens: a.prompt_tokens,
            output_tokens: a.completion_tokens,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: 0,
            cache_creation: CacheCreation {
                ephemeral_5m_input_tokens: 0,
                ephemeral_1h_input_tokens: 0,
            },
            service_tier: "standard",
        },
    };
    let body = serde_json::to_vec(&body).map_err(|e| e.to_string())?;
    Ok(Rendered::json(StatusCode::OK, body))
}

/// `request-id`, `anthropic-organization-id` and the rate-limit headers.
pub(crate) fn common_headers(h: &mut HeaderMap, request_id: &str, rate: Option<&RateHeaders>) {
    put(h, "request-id", format!("req_{request_id}"));
    h.insert(
        "anthropic-organization-id",
        HeaderValue::from_static("00000000-0000-4000-8000-00000000d0c7"),
    );
    let Some(rate) = rate else { return };
    let now_ms = chrono::Utc::now().timestamp_millis();
    let mut one = |names: [&'static str; 3], v: Option<&BucketView>| {
        let Some(v) = v else { return };
        // The moment the bucket is full again, rounded up to the whole second
        // so a client waiting for it never retries early.
        let at_ms = now_ms.saturating_add(ceil_ms(v.reset) as i64);
        let secs = at_ms.div_euclid(1000) + i64::from(at_ms.rem_euclid(1000) != 0);
        h.insert(names[0], HeaderValue::from(v.limit));
        h.insert(names[1], HeaderValue::from(v.remaining));
        if let Some(t) = chrono::DateTime::from_timestamp(secs, 0) {
            put(
                h,
                names[2],
                t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            );
        }
    };
    one(
        [
            "anthropic-ratelimit-requests-limit",
            "anthropic-ratelimit-requests-remaining",
            "anthropic-ratelimit-requests-reset",
        ],
        rate.requests.as_ref(),
    );
    one(
        [
            "anthropic-ratelimit-tokens-limit",
            "anthropic-ratelimit-tokens-remaining",
            "anthropic-ratelimit-tokens-reset",
        ],
        rate.tokens.as_ref(),
    );
    one(
        [
            "anthropic-ratelimit-input-tokens-limit",
            "anthropic-ratelimit-input-tokens-remaining",
            "anthropic-ratelimit-input-tokens-reset",
        ],
        rate.tokens.as_ref(),
    );
}
