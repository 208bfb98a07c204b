//! The OpenAI-format routes: `POST /v1/chat/completions` (OpenAI),
//! `POST /openai/deployments/{deployment}/chat/completions?api-version=…`
//! (Azure OpenAI) and `POST /api/v1/chat/completions` (OpenRouter).
//!
//! Contract: all three read the OpenAI request body and run the shared
//! pipeline (`pipeline`); they differ in auth, ids and error bodies.
//! - OpenAI: no key check (the demo and older tests send none); errors
//!   `{"error":{"message","type","param","code"}}`; 401 `invalid_api_key`, quota
//!   429 `insufficient_quota` with `x-should-retry: false`; 429 rate limits with
//!   `retry-after`, `retry-after-ms` and the six `x-ratelimit-*` headers; every
//!   response has `x-request-id`, `openai-processing-ms`.
//! - Azure: `api-key` header required (401), `api-version` query required (400);
//!   `model` in the answer is the deployment (the body's `model` is ignored);
//!   OpenAI bodies and headers, except 401 and the rate-limit 429, which use
//!   Azure's own `{"error":{"code":"401"|"429","message"}}` wording.
//! - OpenRouter: `Authorization: Bearer` required (401); id `gen-…`, a
//!   `provider` field, `native_finish_reason` and `usage.cost`; errors
//!   `{"error":{"code":<int>,"message","metadata"?}}`; quota → 402; 429 with
//!   `retry-after`; no `x-ratelimit-*` headers.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use serde_json::json;
use tokio::time::Instant;

use crate::chat::pipeline::{self, Answer, Event, Limited, Rendered, Request, Wire, put};
use crate::limits::{BucketView, LimitKind, RateHeaders, ceil_ms, go_duration};
use crate::state::Shared;
use crate::wire::Route;
use crate::wire::{self, ChatRequest, Completion, Prompt, error_body};

/// `POST /v1/chat/completions`
pub(crate) async fn handle(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    openai_family(&shared, Route::OpenAi, &headers, &body, None, None).await
}

/// `POST /openai/deployments/{deployment}/chat/completions?api-version=…`
pub(crate) async fn azure(
    State(shared): State<Arc<Shared>>,
    Path(deployment): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let reject = if !has_value(&headers, "api-key") {
        Some(Event::NoAuth(MSG_AZURE_401.to_string()))
    } else if query.get("api-version").is_none_or(|v| v.is_empty()) {
        Some(Event::BadRequest(
            "Missing required query parameter: 'api-version'. Set it to a supported version such as 2024-10-21.".to_string(),
        ))
    } else {
        None
    };
    openai_family(
        &shared,
        Route::Azure,
        &headers,
        &body,
        reject,
        Some(deployment),
    )
    .await
}

/// `POST /api/v1/chat/completions`
pub(crate) async fn openrouter(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let bearer = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|k| !k.trim().is_empty());
    let reject = (!bearer).then(|| Event::NoAuth("No auth credentials found".to_string()));
    openai_family(&shared, Route::OpenRouter, &headers, &body, reject, None).await
}

pub(crate) fn has_value(headers: &HeaderMap, name: &str) -> bool {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| !v.trim().is_empty())
}

async fn openai_family(
    shared: &Shared,
    route: Route,
    headers: &HeaderMap,
    body: &[u8],
    reject: Option<Event>,
    deployment: Option<String>,
) -> Response {
    let started = Instant::now();
    shared.stats.request_received();
    let live = shared.live();
    let mut parsed: Result<ChatRequest, serde_json::Error> = serde_json::from_slice(body);
    if let (Ok(req), Some(d)) = (&mut parsed, deployment) {
        req.model = Some(d);
    }
    let prompt = match &parsed {
        Ok(req) => Prompt::from_request(req),
        Err(e) if e.is_data() => Err(format!("Invalid request body: {e}")),
        Err(_) => Err(wire::MSG_NOT_JSON.to_string()),
    };
    let model = match &parsed {
        Ok(req) => req.model.as_deref().unwrap_or(""),
        Err(_) => "",
    };
    let req = Request {
        route,
        wire: WIRE,
        client_request_id: headers
            .get("x-client-request-id")
            .and_then(|v| v.to_str().ok()),
        reject,
        prompt,
        model,
        stream: false,
    };
    pipeline::run(shared, &live, started, req).await
}

/// How the pipeline renders the OpenAI, Azure and OpenRouter wires.
const WIRE: Wire = Wire {
    render_error: |route, ev, model, _request_id| render_error(route, ev, model),
    render_answer,
    common_headers: |route, h, request_id, ms, rate| match route {
        Route::OpenRouter => put(h, "x-request-id", format!("req_{request_id}")),
        _ => common_headers(h, request_id, ms, rate),
    },
};

pub(crate) fn render_error(route: Route, ev: &Event, model: &str) -> Rendered {
    match route {
        Route::OpenRouter => openrouter_error(ev, model),
        Route::Azure => match ev {
            Event::NoAuth(msg) => azure_error(StatusCode::UNAUTHORIZED, "401", msg),
            Event::Unauthorized => azure_error(StatusCode::UNAUTHORIZED, "401", MSG_AZURE_401),
            Event::RateLimited(l) => {
                let secs = ceil_ms(l.wait).max(1).div_ceil(1000);
                let what = if l.kind == LimitKind::Requests {
                    "call"
                } else {
                    "token"
                };
                let msg = format!(
                    "Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-10-21 have exceeded {what} rate limit of your current OpenAI S0 pricing tier. Please retry after {secs} seconds. Please go here: https://aka.ms/oai/quotaincrease if you would like to further increase the default rate limit."
                );
                azure_error(StatusCode::TOO_MANY_REQUESTS, "429", &msg)
                    .with("retry-after", secs.to_string())
                    .with("retry-after-ms", ceil_ms(l.wait).max(1).to_string())
            }
            other => openai_error(other, model),
        },
        _ => openai_error(ev, model),
    }
}

fn azure_error(status: StatusCode, code: &str, msg: &str) -> Rendered {
    let body = json!({"error": {"code": code, "message": msg}});
    Rendered::json(status, serde_json::to_vec(&body).unwrap_or_default())
}

pub(crate) const MSG_AZURE_401: &str = "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid key for an active subscription and use a correct regional API endpoint for your resource.";

fn openai_error(ev: &Event, model: &str) -> Rendered {
    let e = |status, msg: &str, kind, code| Rendered::json(status, error_body(msg, kind, code));
    match ev {
        Event::NoAuth(msg) => e(
            StatusCode::UNAUTHORIZED,
            msg,
            Some("invalid_request_error"),
            None,
        ),
        Event::BadRequest(msg) => e(
            StatusCode::BAD_REQUEST,
            msg,
            Some("invalid_request_error"),
            None,
        ),
        Event::Unauthorized => e(
            StatusCode::UNAUTHORIZED,
            wire::MSG_BAD_KEY,
            Some("invalid_request_error"),
            Some("invalid_api_key"),
        ),
        Event::Forbidden => e(
            StatusCode::FORBIDDEN,
            &format!("Project `proj_mock` does not have access to model `{model}`"),
            Some("invalid_request_error"),
            Some("model_not_found"),
        ),
        Event::ModelNotFound(m) => e(
            StatusCode::NOT_FOUND,
            &format!("The model `{m}` does not exist or you do not have access to it."),
            Some("invalid_request_error"),
            Some("model_not_found"),
        ),
        Event::Quota => e(
            StatusCode::TOO_MANY_REQUESTS,
            wire::MSG_QUOTA,
            Some("insufficient_quota"),
            Some("insufficient_quota"),
        )
        .with("x-should-retry", "false".to_string()),
        Event::RateLimited(l) => rate_limited_error(l, model),
        Event::TooLarge { limit, requested } => too_large_error(*limit, *requested, model),
        Event::ServerError => e(
            StatusCode::INTERNAL_SERVER_ERROR,
            wire::MSG_500,
            Some("server_error"),
            None,
        ),
        Event::Overloaded => e(
            StatusCode::SERVICE_UNAVAILABLE,
            wire::MSG_503,
            Some("server_error"),
            None,
        ),
    }
}

/// A refused bucket, with the wait in `retry-after` and `retry-after-ms`.
fn rate_limited_error(l: &Limited, model: &str) -> Rendered {
    let (what, unit) = match l.kind {
        LimitKind::Requests => ("requests", "RPM"),
        LimitKind::Tokens => ("tokens", "TPM"),
    };
    let msg = format!(
        "Rate limit reached for {model} in organization org-mock on {what} per min ({unit}): Limit {}, Used {}, Requested {}. Please try again in {}.",
        l.limit,
        l.used,
        l.requested,
        go_duration(l.wait)
    );
    let wait_ms = ceil_ms(l.wait).max(1);
    Rendered::json(
        StatusCode::TOO_MANY_REQUESTS,
        error_body(&msg, Some(what), Some("rate_limit_exceeded")),
    )
    .with("retry-after", wait_ms.div_ceil(1000).max(1).to_string())
    .with("retry-after-ms", wait_ms.to_string())
}

/// One request above the whole per-minute token limit: retrying cannot help.
fn too_large_error(limit: u64, requested: u64, model: &str) -> Rendered {
    let msg = format!(
        "Request too large for {model} in organization org-mock on tokens per min (TPM): Limit {limit}, Requested {requested}. The input or output tokens must be reduced in order to run successfully."
    );
    Rendered::json(
        StatusCode::TOO_MANY_REQUESTS,
        error_body(&msg, Some("tokens"), Some("rate_limit_exceeded")),
    )
    .with("x-should-retry", "false".to_string())
}

fn openrouter_error(ev: &Event, model: &str) -> Rendered {
    let (status, msg, metadata) = match ev {
        Event::NoAuth(msg) => (StatusCode::UNAUTHORIZED, msg.clone(), None),
        Event::Unauthorized => (
            StatusCode::UNAUTHORIZED,
            "User not found.".to_string(),
            None,
        ),
        Event::BadRequest(msg) => (StatusCode::BAD_REQUEST, msg.clone(), None),
        Event::Forbidden => (
            StatusCode::FORBIDDEN,
            format!("{model} requires moderation: your key may not use it"),
            None,
        ),
        Event::ModelNotFound(m) => (
            StatusCode::NOT_FOUND,
            format!("No endpoints found for {m}."),
            None,
        ),
        Event::Quota => (
            StatusCode::PAYMENT_REQUIRED,
            "Insufficient credits. Add more using https://openrouter.ai/settings/credits"
                .to_string(),
            Some(json!({"limit_source": "openrouter_credits"})),
        ),
        Event::RateLimited(l) => (
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "Rate limit exceeded: {model} is temporarily rate-limited. Please retry in {}.",
                go_duration(l.wait)
            ),
            None,
        ),
        Event::TooLarge { limit, requested } => (
            StatusCode::BAD_REQUEST,
            format!(
                "This request asks for {requested} tokens, more than the {limit} tokens per minute allowed. Please reduce the length of the messages or completion."
            ),
            None,
        ),
        Event::ServerError => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "Internal Server Error".to_string(),
            None,
        ),
        Event::Overloaded => (
            StatusCode::SERVICE_UNAVAILABLE,
            "No allowed providers are available for the selected model.".to_string(),
            None,
        ),
    };
    let mut error = json!({"code": status.as_u16(), "message": msg});
    if let Some(m) = metadata {
        error["metadata"] = m;
    }
    let body = serde_json::to_vec(&json!({"error": error})).unwrap_or_default();
    let r = Rendered::json(status, body);
    match ev {
        Event::RateLimited(l) => r.with(
            "retry-after",
            ceil_ms(l.wait).max(1).div_ceil(1000).to_string(),
        ),
        _ => r,
    }
}

pub(crate) fn render_answer(route: Route, a: &Answer<'_>) -> Result<Rendered, String> {
    let finish = if a.truncated { "length" } else { "stop" };
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let prefix = if route == Route::OpenRouter {
        "gen-"
    } else {
        "chatcmpl-"
    };
    let id = format!("{prefix}{}", a.id);
    let mut completion = Completion::new(
        &id,
        created,
        a.model,
        a.content,
        finish,
        a.prompt_tokens,
        a.completion_tokens,
    );
    if a.refused {
        // OpenAI's structured-output refusal: no content, the reason apart.
        completion.choices[0].message.content = None;
        completion.choices[0].message.refusal = Some(crate::chat::pipeline::REFUSAL);
    }
    let body = if route == Route::OpenRouter {
        let mut v = serde_json::to_value(&completion).map_err(|e| e.to_string())?;
        v["provider"] = json!("Mock");
        v["choices"][0]["native_finish_reason"] = json!(finish);
        // a nominal $0.10 / $0.40 per million tokens, in credits (USD)
        let cost = (a.prompt_tokens as f64 * 0.1 + a.completion_tokens as f64 * 0.4) / 1e6;
        v["usage"]["cost"] = json!(cost);
        v["usage"]["is_byok"] = json!(false);
        serde_json::to_vec(&v)
    } else {
        serde_json::to_vec(&completion)
    };
    Ok(Rendered::json(
        StatusCode::OK,
        body.map_err(|e| e.to_string())?,
    ))
}

/// OpenAI and Azure: ids, timing and the `x-ratelimit-*` headers.
pub(crate) fn common_headers(
    h: &mut HeaderMap,
    request_id: &str,
    ms: u64,
    rate: Option<&RateHeaders>,
) {
    put(h, "x-request-id", format!("req_{request_id}"));
    h.insert("openai-processing-ms", HeaderValue::from(ms));
    h.insert("openai-version", HeaderValue::from_static("2020-10-01"));
    h.insert("openai-organization", HeaderValue::from_static("org-mock"));
    if let Some(rate) = rate {
        rate_headers(h, "requests", rate.requests.as_ref());
        rate_headers(h, "tokens", rate.tokens.as_ref());
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
