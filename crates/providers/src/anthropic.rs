//! Anthropic Messages: `POST {base}/v1/messages`.
//!
//! Headers `x-api-key` and `anthropic-version: 2023-06-01`. Anthropic has no
//! client request id header, so none is sent (its answers carry `request-id`).
//!
//! Structured output: the models that take it (`schema::NATIVE_MODEL_PREFIXES`,
//! or any model under a stage's `structured_output = "native"`) get the
//! gate's schema as `output_config: {format: {type: "json_schema", schema}}`,
//! with the keywords the API refuses taken out and said in the system prompt
//! instead (`schema`); older models, `structured_output = "prompt"` and a
//! schema the parameter cannot carry (recursive) get the whole schema in the
//! system prompt. Either way docket's gate checks the answer against the
//! full schema, as for every provider.
//!
//! Errors: 529 `overloaded_error` is overload (retry, backoff); 429 a rate
//! limit (`retry-after`); a 400 whose message says the credit balance is too
//! low (and 402 `billing_error`) is spent quota and stops the session; 401 /
//! 403 stop it as credentials; 413 / other 4xx fail the item; 5xx retry.

#![allow(clippy::result_large_err)]

use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::header::HeaderMap;
use serde::Deserialize;
use serde_json::{Value, json};

use super::openai::{header_str, header_u64, preview};
use super::{
    ApiKey, ChatAnswer, ChatFuture, ChatProvider, ChatRequest, ErrorClass, FinishReason,
    ProviderError, Usage,
};
use crate::anthropic_schema::{self as schema, constraints_instruction, schema_instruction};
use crate::limiter::RateHeaders;

/// The `anthropic-version` header every request carries.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

const MAX_TOKENS_REPORTED: u64 = 1_000_000_000_000;
/// A reset time further out than this is treated as this far (a clock skew
/// or a nonsense header must not hold every send for hours).
const MAX_RESET: Duration = Duration::from_secs(3600);

pub struct AnthropicChat {
    url: String,
    key: ApiKey,
    client: reqwest::Client,
}

impl AnthropicChat {
    /// `base_url` is `https://api.anthropic.com` (a trailing `/v1` is accepted).
    pub fn new(base_url: &str, key: ApiKey) -> Result<Self, crate::ClientError> {
        let base = base_url.trim_end_matches('/');
        let base = base.strip_suffix("/v1").unwrap_or(base);
        Ok(Self {
            url: format!("{base}/v1/messages"),
            key,
            client: super::http_client()?,
        })
    }

    async fn send_inner(&self, req: &ChatRequest) -> Result<ChatAnswer, ProviderError> {
        let builder = self
            .client
            .post(&self.url)
            .timeout(req.timeout)
            .header("x-api-key", super::secret_header(self.key.expose())?)
            .header("anthropic-version", ANTHROPIC_VERSION)
            .json(&wire_body(req).map_err(super::untranslatable)?);
        let raw = super::exchange(builder).await?;
        let headers = rate_headers_at(&raw.headers, Utc::now());
        let request_id = header_str(&raw.headers, "request-id").map(str::to_string);
        if raw.status == 200 {
            let mut answer = parse_success(&raw.bytes, headers, request_id, raw.status)?;
            if req.body.is_some() {
                with_chat_body(&mut answer, &raw.bytes)?;
            }
            return Ok(answer);
        }
        Err(classify_error(raw.status, &raw.bytes, headers))
    }
}

impl ChatProvider for AnthropicChat {
    fn name(&self) -> &str {
        "anthropic"
    }

    fn send<'a>(&'a self, request: &'a ChatRequest) -> ChatFuture<'a> {
        Box::pin(async move {
            self.send_inner(request)
                .await
                .map_err(|e| super::scrub(e, Some(&self.key)))
        })
    }

    /// `GET /v1/models?limit=1000` (one page: the largest it gives).
    fn preflight(&self) -> super::PreflightFuture<'_> {
        Box::pin(async move {
            let url = self.url.replace("/v1/messages", "/v1/models?limit=1000");
            let builder = self
                .client
                .get(url)
                .header("x-api-key", super::secret_header(self.key.expose())?)
                .header("anthropic-version", ANTHROPIC_VERSION);
            let body = super::probe(builder, Some(&self.key)).await?;
            Ok(body.and_then(|b| super::listed_ids(&b)))
        })
    }
}

/// The Messages body to send: a chat-completions body sent as written,
/// translated; else the one built from the request's fields.
pub(crate) fn wire_body(req: &ChatRequest) -> Result<Value, crate::translate::TranslateError> {
    match &req.body {
        Some(body) => crate::translate::chat_to_anthropic(body),
        None => Ok(request_body(req)),
    }
}

/// `answer` with its Messages answer (`bytes`) kept as a `chat.completion`
/// body; Err when that answer cannot be translated back.
pub(crate) fn with_chat_body(answer: &mut ChatAnswer, bytes: &[u8]) -> Result<(), ProviderError> {
    super::keep_translated_body(answer, bytes, crate::translate::anthropic_to_chat)
}

/// The Messages body. With a schema, a model that takes structured outputs
/// gets it as `output_config.format` (fitted: see `schema`), and the
/// constraints taken out of it in the system prompt; any other model gets
/// the whole schema in the system prompt. The Batch API's `params` are this
/// same body.
pub(crate) fn request_body(req: &ChatRequest) -> Value {
    let schema = req.response_schema.as_deref();
    let native = schema::native_for(&req.model, req.structured_output, schema.map(|(_, s)| s));
    let instruction = match (schema, &native) {
        (None, _) => None,
        (Some((name, _)), Some(fitted)) => constraints_instruction(name, &fitted.dropped),
        (Some((name, s)), None) => Some(schema_instruction(name, s)),
    };
    let system = match (req.system.as_deref(), instruction) {
        (Some(s), Some(i)) => Some(format!("{s}\n\n{i}")),
        (None, Some(i)) => Some(i),
        (s, None) => s.map(str::to_string),
    };
    let mut body = json!({
        "model": req.model,
        "max_tokens": req.max_tokens,
        "messages": [{"role": "user", "content": req.user}],
    });
    if let Some(s) = system {
        body["system"] = json!(s);
    }
    // Only temperature: current models refuse temperature and top_p together.
    if let Some(t) = req.temperature {
        body["temperature"] = json!(t);
    }
    if let Some(fitted) = native {
        body["output_config"] = json!({"format": {"type": "json_schema", "schema": fitted.schema}});
    }
    body
}

#[derive(Deserialize)]
struct MessageBody {
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    model: Option<String>,
    content: Vec<Block>,
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    usage: Option<UsageBody>,
}

#[derive(Deserialize)]
struct Block {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Deserialize)]
struct UsageBody {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
}

pub(crate) fn parse_success(
    bytes: &[u8],
    headers: RateHeaders,
    provider_request_id: Option<String>,
    status: u16,
) -> Result<ChatAnswer, ProviderError> {
    // A 2xx that is not an answer: most likely billed (row S7).
    let body: MessageBody = serde_json::from_slice(bytes).map_err(|e| ProviderError {
        class: ErrorClass::Ambiguous,
        http_status: Some(status),
        message: format!(
            "answer body is not an Anthropic message: {e}; body starts {}",
            preview(bytes)
        ),
        headers,
    })?;
    if body.kind.as_deref() == Some("error") {
        return Err(classify_error(status, bytes, headers));
    }
    let mut text: Option<String> = None;
    for block in body.content.iter().filter(|b| b.kind == "text") {
        text.get_or_insert_with(String::new)
            .push_str(block.text.as_deref().unwrap_or(""));
    }
    let stop = body.stop_reason.as_deref();
    let finish_reason = match stop {
        Some("end_turn") | Some("stop_sequence") | None => FinishReason::Stop,
        // Both mean the answer was cut off, not that it is malformed.
        Some("max_tokens") | Some("model_context_window_exceeded") => FinishReason::Length,
        Some("refusal") => FinishReason::ContentFilter,
        Some(other) => FinishReason::Other(other.to_string()),
    };
    let refusal = (stop == Some("refusal")).then(|| {
        let said = text.as_deref().unwrap_or("").trim();
        if said.is_empty() {
            "the model declined to answer (stop_reason refusal)".to_string()
        } else {
            said.to_string()
        }
    });
    let cap = |n: Option<u64>| n.unwrap_or(0).min(MAX_TOKENS_REPORTED);
    // `input_tokens` excludes cached and cache-written tokens; the ledger's
    // input is the whole prompt, with the cache reads as its cached part.
    let usage = body.usage.map(|u| {
        let read = cap(u.cache_read_input_tokens);
        Usage {
            input_tokens: cap(u.input_tokens)
                .saturating_add(cap(u.cache_creation_input_tokens))
                .saturating_add(read)
                .min(MAX_TOKENS_REPORTED),
            output_tokens: cap(u.output_tokens),
            cached_input_tokens: read,
            // Thinking tokens are billed inside output_tokens and are not
            // reported apart.
            reasoning_tokens: 0,
        }
    });
    Ok(ChatAnswer {
        content: text,
        refusal,
        finish_reason,
        usage,
        provider_request_id: provider_request_id.or(body.id),
        model: body.model,
        headers,
        http_status: status,
        body: None,
    })
}

#[derive(Deserialize)]
struct ErrorEnvelope {
    error: ErrorBody,
}

#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

pub(crate) fn classify_error(status: u16, bytes: &[u8], headers: RateHeaders) -> ProviderError {
    let parsed = serde_json::from_slice::<ErrorEnvelope>(bytes)
        .ok()
        .map(|e| e.error);
    let kind = parsed
        .as_ref()
        .and_then(|e| e.kind.clone())
        .unwrap_or_default();
    let message = parsed
        .as_ref()
        .and_then(|e| e.message.clone())
        .unwrap_or_else(|| format!("body: {}", preview(bytes)));
    let lower = message.to_ascii_lowercase();
    let out_of_credit = lower.contains("credit balance is too low")
        || lower.contains("credit balance is insufficient");
    let class = match (status, kind.as_str()) {
        (_, "overloaded_error") | (529, _) | (503, _) => ErrorClass::Overloaded,
        (_, "rate_limit_error") | (429, _) => ErrorClass::RateLimited,
        (_, "billing_error") | (402, _) => ErrorClass::Quota,
        (400, _) if out_of_credit => ErrorClass::Quota,
        (_, "authentication_error") | (_, "permission_error") | (401 | 403, _) => ErrorClass::Auth,
        (408 | 409, _) | (500..=599, _) => ErrorClass::Transient,
        // 400 invalid_request_error, 404 not_found_error, 413 request_too_large.
        _ => ErrorClass::Request,
    };
    let detail = if kind.is_empty() {
        message
    } else {
        format!("{message} [{kind}]")
    };
    ProviderError {
        class,
        http_status: Some(status),
        message: detail,
        headers,
    }
}

/// An RFC 3339 reset time as the wait from `now` (zero when already past).
fn reset_in(h: &HeaderMap, name: &str, now: DateTime<Utc>) -> Option<Duration> {
    let at = DateTime::parse_from_rfc3339(header_str(h, name)?.trim()).ok()?;
    let wait = (at.with_timezone(&Utc) - now)
        .to_std()
        .unwrap_or(Duration::ZERO);
    Some(wait.min(MAX_RESET))
}

/// `anthropic-ratelimit-*` (resets are RFC 3339 times, read against `now`)
/// and `retry-after` (seconds; `retry-after-ms` first when present).
pub(crate) fn rate_headers_at(h: &HeaderMap, now: DateTime<Utc>) -> RateHeaders {
    // `tokens-*` is whichever token limit binds now; older answers only had
    // the input/output ones.
    let tokens = if h.contains_key("anthropic-ratelimit-tokens-limit")
        || h.contains_key("anthropic-ratelimit-tokens-remaining")
    {
        "tokens"
    } else {
        "input-tokens"
    };
    let name = |what: &str, part: &str| format!("anthropic-ratelimit-{what}-{part}");
    RateHeaders {
        limit_requests: header_u64(h, &name("requests", "limit")),
        limit_tokens: header_u64(h, &name(tokens, "limit")),
        remaining_requests: header_u64(h, &name("requests", "remaining")),
        remaining_tokens: header_u64(h, &name(tokens, "remaining")),
        reset_requests: reset_in(h, &name("requests", "reset"), now),
        reset_tokens: reset_in(h, &name(tokens, "reset"), now),
        retry_after: super::openai::rate_headers(h).retry_after,
    }
}

#[cfg(test)]
mod tests;
