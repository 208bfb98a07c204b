//! Gemini: `POST /v1beta/models/{model}:generateContent` (reference section 5.1).
//!
//! Contract: the key goes in the `x-goog-api-key` header; a `key=` query
//! parameter is refused with 400 INVALID_ARGUMENT (so tests prove a client
//! never puts the key in a URL), a missing header is 403 PERMISSION_DENIED.
//! The body is read in camelCase (snake_case aliases accepted): `contents`
//! (required, non-empty; text parts only, `thought` parts skipped),
//! `systemInstruction`, `generationConfig.{maxOutputTokens,
//! responseMimeType, responseJsonSchema | responseSchema}`. The answer format
//! follows `infer`: `responseJsonSchema`, else `responseSchema` (OpenAPI
//! subset, rewritten), else a schema written in the prompt, else JSON for
//! `responseMimeType: "application/json"` or a prompt that says "JSON", else text.
//!
//! Errors are Google RPC `{"error":{"code","message","status","details"}}`:
//! 429 RESOURCE_EXHAUSTED with `google.rpc.QuotaFailure` (a per-minute quota
//! id) and `google.rpc.RetryInfo` (`retryDelay` like "2s" or "0.35s") for rate
//! limits; quota mode is 429 RESOURCE_EXHAUSTED with Google's "exceeded your
//! current quota, please check your plan and billing details" message, a
//! per-day quota id and no RetryInfo (it will not clear within a job); 503
//! UNAVAILABLE (fail-503), 500 INTERNAL, 403 PERMISSION_DENIED (unauthorized
//! mode). No rate-limit headers, like the real API. The truncated fault gives
//! `finishReason: "MAX_TOKENS"`.
//!
//! Thinking (`thinking`): a 2.5 model spends thinking tokens first,
//! counted against `maxOutputTokens` and reported as `thoughtsTokenCount`;
//! when they leave too little room the answer is cut off (MAX_TOKENS). A
//! `thinkingConfig.thinkingBudget` outside the model's range is 400.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::chat::infer;
use crate::chat::openai::has_value;
use crate::chat::pipeline::{self, Answer, Event, Limited, Rendered, Request, Wire};
use crate::chat::thinking;
use crate::json::Json;
use crate::limits::{LimitKind, ceil_ms};
use crate::state::{Shared, json_response};
use crate::wire::Route;
use crate::wire::{Format, MessageText, Prompt};

pub(crate) const MSG_KEY_IN_URL: &str =
    "API key in URL is not accepted by this mock: send x-goog-api-key";
pub(crate) const MSG_QUOTA: &str = "You exceeded your current quota, please check your plan and billing details. For more information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits.";

#[derive(Debug, Deserialize)]
struct GenerateRequest {
    #[serde(default)]
    contents: Option<Vec<GContent>>,
    #[serde(default, rename = "systemInstruction", alias = "system_instruction")]
    system_instruction: Option<GContent>,
    #[serde(default, rename = "generationConfig", alias = "generation_config")]
    generation_config: Option<GenerationConfig>,
}

#[derive(Debug, Deserialize)]
struct GContent {
    #[serde(default)]
    parts: Option<Vec<GPart>>,
}

#[derive(Debug, Deserialize)]
struct GPart {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    thought: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct GenerationConfig {
    #[serde(default, rename = "maxOutputTokens", alias = "max_output_tokens")]
    max_output_tokens: Option<i64>,
    #[serde(default, rename = "responseMimeType", alias = "response_mime_type")]
    response_mime_type: Option<String>,
    #[serde(default, rename = "responseJsonSchema", alias = "response_json_schema")]
    response_json_schema: Option<Json>,
    #[serde(default, rename = "responseSchema", alias = "response_schema")]
    response_schema: Option<Json>,
    #[serde(default, rename = "thinkingConfig", alias = "thinking_config")]
    thinking_config: Option<ThinkingConfig>,
}

#[derive(Debug, Deserialize)]
struct ThinkingConfig {
    #[serde(default, rename = "thinkingBudget", alias = "thinking_budget")]
    thinking_budget: Option<i64>,
}

fn text_of(c: &GContent) -> MessageText<'_> {
    MessageText::Parts(
        c.parts
            .iter()
            .flatten()
            .filter(|p| p.thought != Some(true))
            .filter_map(|p| p.text.as_deref())
            .collect(),
    )
}

/// `POST /v1beta/models/{model}:generateContent` (the whole last segment is captured).
pub(crate) async fn handle(
    State(shared): State<Arc<Shared>>,
    Path(target): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some((model, "generateContent")) = target.rsplit_once(':') else {
        let msg = format!(
            "Method not found: models/{target} is not served by this mock (only :generateContent)."
        );
        let r = rpc_error(StatusCode::NOT_FOUND, "NOT_FOUND", &msg, Vec::new());
        return json_response(r.status, r.body);
    };
    let started = Instant::now();
    shared.stats.request_received();
    let live = shared.live();
    let reject = reject_of(&query, &headers);
    let parsed = parse_body(&body);
    let config = parsed
        .as_ref()
        .ok()
        .and_then(|r| r.generation_config.as_ref());
    let converted = config
        .and_then(|c| c.response_schema.as_ref())
        .map(infer::from_openapi);
    let explicit = config
        .and_then(|c| c.response_json_schema.as_ref())
        .or(converted.as_ref());
    let json_mode =
        config.and_then(|c| c.response_mime_type.as_deref()) == Some("application/json");
    let texts = texts_of(&parsed);
    let pieces = || texts.iter().flat_map(MessageText::pieces);
    let found = if explicit.is_none() {
        infer::schema_in_text(pieces())
    } else {
        None
    };
    let format = infer::format(
        explicit,
        found.as_ref(),
        json_mode,
        infer::mentions_json(pieces()),
    );
    let prompt = prompt_of(&parsed, model, texts, format);
    let req = Request {
        route: Route::Gemini,
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

/// The key in the URL (400), or no `x-goog-api-key` (403).
fn reject_of(query: &HashMap<String, String>, headers: &HeaderMap) -> Option<Event> {
    if query.contains_key("key") {
        Some(Event::BadRequest(MSG_KEY_IN_URL.to_string()))
    } else if !has_value(headers, "x-goog-api-key") {
        Some(Event::NoAuth(
            "Method doesn't allow unregistered callers (callers without established identity). Please use API Key or other form of API consumer identity to call this API.".to_string(),
        ))
    } else {
        None
    }
}

/// The body, or the 400 message Gemini gives for it.
fn parse_body(body: &[u8]) -> Result<GenerateRequest, String> {
    serde_json::from_slice(body).map_err(|e| {
        if e.is_data() {
            format!("Invalid JSON payload received. {e}")
        } else {
            format!("Invalid JSON payload received. Unexpected token. {e}")
        }
    })
}

/// The system instruction's and the contents' texts, one entry per content.
fn texts_of(parsed: &Result<GenerateRequest, String>) -> Vec<MessageText<'_>> {
    match parsed {
        Ok(req) => req
            .system_instruction
            .iter()
            .chain(req.contents.iter().flatten())
            .map(text_of)
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// The validated prompt, or the 400 message (a model and contents are required).
fn prompt_of<'a>(
    parsed: &'a Result<GenerateRequest, String>,
    model: &'a str,
    texts: Vec<MessageText<'a>>,
    format: Format<'a>,
) -> Result<Prompt<'a>, String> {
    match parsed {
        Err(msg) => Err(msg.clone()),
        Ok(_) if model.is_empty() => {
            Err("* GenerateContentRequest.model: unexpected model name format\n".to_string())
        }
        Ok(req) if req.contents.as_ref().is_none_or(Vec::is_empty) => {
            Err("* GenerateContentRequest.contents: contents is not specified\n".to_string())
        }
        Ok(req) => {
            let config = req.generation_config.as_ref();
            let budget = config
                .and_then(|c| c.thinking_config.as_ref())
                .and_then(|t| t.thinking_budget);
            Ok(Prompt {
                model,
                messages: texts,
                format,
                max_tokens: config
                    .and_then(|c| c.max_output_tokens)
                    .filter(|n| *n > 0)
                    .map(|n| n as u64),
                thinking_tokens: thinking::gemini_thoughts(model, budget)?,
            })
        }
    }
}

fn rpc_error(status: StatusCode, rpc_status: &str, message: &str, details: Vec<Value>) -> Rendered {
    let body = json!({"error": {"code": status.as_u16(), "message": message, "status": rpc_status, "details": details}});
    Rendered::json(status, serde_json::to_vec(&body).unwrap_or_default())
}

fn quota_failure(quota_id: &str, metric: &str, model: &str) -> Value {
    json!({
        "@type": "type.googleapis.com/google.rpc.QuotaFailure",
        "violations": [{
            "quotaMetric": format!("generativelanguage.googleapis.com/{metric}"),
            "quotaId": quota_id,
            "quotaDimensions": {"location": "global", "model": model},
        }]
    })
}

fn help() -> Value {
    json!({
        "@type": "type.googleapis.com/google.rpc.Help",
        "links": [{"description": "Learn more about Gemini API quotas", "url": "https://ai.google.dev/gemini-api/docs/rate-limits"}]
    })
}

fn error_info(reason: &str) -> Value {
    json!({
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": reason,
        "domain": "googleapis.com",
        "metadata": {"service": "generativelanguage.googleapis.com"}
    })
}

/// A protobuf Duration in JSON: "2s", "0.35s", "1.5s".
pub(crate) fn proto_duration(ms: u64) -> String {
    let (s, frac) = (ms / 1000, ms % 1000);
    if frac == 0 {
        format!("{s}s")
    } else {
        format!("{s}.{}s", format!("{frac:03}").trim_end_matches('0'))
    }
}

/// How the pipeline renders Gemini's wire (no extra per-response headers).
const WIRE: Wire = Wire {
    render_error: |_route, ev, model, _request_id| render_error(ev, model),
    render_answer: |_route, a| render_answer(a),
    common_headers: |_route, _h, _request_id, _ms, _rate| {},
};

pub(crate) fn render_error(ev: &Event, model: &str) -> Rendered {
    match ev {
        Event::NoAuth(msg) => rpc_error(
            StatusCode::FORBIDDEN,
            "PERMISSION_DENIED",
            msg,
            vec![error_info("CONSUMER_INVALID")],
        ),
        Event::Unauthorized => rpc_error(
            StatusCode::FORBIDDEN,
            "PERMISSION_DENIED",
            "Permission denied: Consumer 'api_key:mock' has been suspended.",
            vec![error_info("CONSUMER_SUSPENDED")],
        ),
        Event::BadRequest(msg) => {
            rpc_error(StatusCode::BAD_REQUEST, "INVALID_ARGUMENT", msg, Vec::new())
        }
        Event::Forbidden => rpc_error(
            StatusCode::FORBIDDEN,
            "PERMISSION_DENIED",
            "The caller does not have permission",
            Vec::new(),
        ),
        Event::ModelNotFound(m) => rpc_error(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            &format!(
                "models/{m} is not found for API version v1beta, or is not supported for generateContent."
            ),
            Vec::new(),
        ),
        Event::Quota => quota_error(model),
        Event::RateLimited(l) => rate_limited_error(l, model),
        Event::TooLarge { limit, requested } => too_large_error(*limit, *requested, model),
        Event::ServerError => rpc_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "INTERNAL",
            "An internal error has occurred. Please retry or report in https://developers.generativeai.google/guide/troubleshooting",
            Vec::new(),
        ),
        Event::Overloaded => rpc_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "UNAVAILABLE",
            "The model is overloaded. Please try again later.",
            Vec::new(),
        ),
    }
}

/// `mode = "quota"`: the free tier's daily requests spent.
fn quota_error(model: &str) -> Rendered {
    rpc_error(
        StatusCode::TOO_MANY_REQUESTS,
        "RESOURCE_EXHAUSTED",
        &format!(
            "{MSG_QUOTA}\n* Quota exceeded for metric: generativelanguage.googleapis.com/generate_content_free_tier_requests, limit: 250, model: {model}"
        ),
        vec![
            quota_failure(
                "GenerateRequestsPerDayPerProjectPerModel-FreeTier",
                "generate_content_free_tier_requests",
                model,
            ),
            help(),
        ],
    )
}

/// A refused bucket: the paid tier's per-minute quota and when to retry.
fn rate_limited_error(l: &Limited, model: &str) -> Rendered {
    let (quota_id, metric) = match l.kind {
        LimitKind::Requests => (
            "GenerateRequestsPerMinutePerProjectPerModel",
            "generate_content_paid_tier_requests",
        ),
        LimitKind::Tokens => (
            "GenerateContentPaidTierInputTokensPerModelPerMinute",
            "generate_content_paid_tier_input_token_count",
        ),
    };
    let delay = proto_duration(ceil_ms(l.wait).max(1));
    let msg = format!(
        "{MSG_QUOTA}\n* Quota exceeded for metric: generativelanguage.googleapis.com/{metric}, limit: {}, model: {model}\nPlease retry in {delay}.",
        l.limit
    );
    let retry = json!({"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay});
    rpc_error(
        StatusCode::TOO_MANY_REQUESTS,
        "RESOURCE_EXHAUSTED",
        &msg,
        vec![quota_failure(quota_id, metric, model), help(), retry],
    )
}

/// One request above the whole per-minute token quota.
fn too_large_error(limit: u64, requested: u64, model: &str) -> Rendered {
    rpc_error(
        StatusCode::TOO_MANY_REQUESTS,
        "RESOURCE_EXHAUSTED",
        &format!(
            "{MSG_QUOTA}\n* Quota exceeded for metric: generativelanguage.googleapis.com/generate_content_paid_tier_input_token_count, limit: {limit}, model: {model}\nThis request alone needs {requested} tokens."
        ),
        vec![
            quota_failure(
                "GenerateContentPaidTierInputTokensPerModelPerMinute",
                "generate_content_paid_tier_input_token_count",
                model,
            ),
            help(),
        ],
    )
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GenerateResponse<'a> {
    candidates: [Candidate<'a>; 1],
    usage_metadata: UsageMetadata,
    model_version: &'a str,
    response_id: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Candidate<'a> {
    /// absent when the answer was blocked (finishReason SAFETY)
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<CandidateContent<'a>>,
    finish_reason: &'static str,
    index: u32,
}

#[derive(Serialize)]
struct CandidateContent<'a> {
    parts: [TextPart<'a>; 1],
    role: &'static str,
}

#[derive(Serialize)]
struct TextPart<'a> {
    text: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct UsageMetadata {
    prompt_token_count: u64,
    candidates_token_count: u64,
    #[serde(skip_serializing_if = "is_zero")]
    thoughts_token_count: u64,
    total_token_count: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

pub(crate) fn render_answer(a: &Answer<'_>) -> Result<Rendered, String> {
    let body = GenerateResponse {
        candidates: [Candidate {
            content: (!a.refused).then_some(CandidateContent {
                parts: [TextPart { text: a.content }],
                role: "model",
            }),
            finish_reason: if a.refused {
                "SAFETY"
            } else if a.truncated {
                "MAX_TOKENS"
            } else {
                "STOP"
            },
            index: 0,
        }],
        usage_metadata: UsageMetadata {
            prompt_token_count: a.prompt_tokens,
            candidates_token_count: a.completion_tokens,
            thoughts_token_count: a.thinking_tokens,
            total_token_count: a.prompt_tokens + a.completion_tokens + a.thinking_tokens,
        },
        model_version: a.model,
        response_id: a.id[..22].to_string(),
    };
    let body = serde_json::to_vec(&body).map_err(|e| e.to_string())?;
    Ok(Rendered::json(StatusCode::OK, body))
}
