//! OpenAI Chat Completions (and any server speaking its wire format, the
//! built-in mock included): `POST {base}/chat/completions`.
//!
//! Errors are classified on `error.type` / `error.code`, not the status alone:
//! a 429 is a rate limit unless its type says the quota or billing is spent
//! (then the session stops), or its message says one request is larger than
//! the whole limit (then only the item fails).

// ProviderError carries the rate-limit headers of the failed answer, which
// the limiter needs; errors are the rare path, so its size is not boxed away.
#![allow(clippy::result_large_err)]

use reqwest::header::HeaderMap;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{
    ApiKey, ChatAnswer, ChatFuture, ChatProvider, ChatRequest, ErrorClass, FinishReason,
    ProviderError, Usage,
};
use crate::limiter::RateHeaders;
use crate::retry::{parse_go_duration, parse_retry_after};

const MAX_TOKENS_REPORTED: u64 = 1_000_000_000_000;

pub struct OpenAiChat {
    label: String,
    url: String,
    key: Option<ApiKey>,
    /// Send the output limit as `max_tokens`, not `max_completion_tokens`.
    legacy_max_tokens: bool,
    client: reqwest::Client,
}

impl OpenAiChat {
    pub fn new(
        label: &str,
        base_url: &str,
        key: Option<ApiKey>,
    ) -> Result<Self, crate::ClientError> {
        let client = super::http_client()?;
        let url = format!("{}/chat/completions", base_url.trim_end_matches('/'));
        Ok(Self {
            label: label.to_string(),
            url,
            key,
            legacy_max_tokens: false,
            client,
        })
    }

    /// Send the output limit as `max_tokens` instead of OpenAI's
    /// `max_completion_tokens`. For OpenAI-compatible servers: many (Ollama's
    /// compatible layer, vLLM, older gateways) read only `max_tokens` and
    /// ignore the other, which leaves the output uncapped and a truncation
    /// undetectable.
    pub fn sending_max_tokens(mut self) -> Self {
        self.legacy_max_tokens = true;
        self
    }

    async fn send_inner(&self, req: &ChatRequest) -> Result<ChatAnswer, ProviderError> {
        let mut body = super::body_or(req, request_body);
        if self.legacy_max_tokens && req.body.is_none() {
            use_max_tokens(&mut body);
        }
        let mut builder = self
            .client
            .post(&self.url)
            .timeout(req.timeout)
            .header("X-Client-Request-Id", &req.client_request_id)
            .json(&body);
        if let Some(key) = &self.key {
            builder = builder.bearer_auth(key.expose());
        }
        let raw = super::exchange(builder).await?;
        let headers = rate_headers(&raw.headers);
        let provider_request_id = header_str(&raw.headers, "x-request-id").map(str::to_string);
        if raw.status == 200 {
            return parse_success(&raw.bytes, headers, provider_request_id, raw.status)
                .map(|a| super::keep_body(a, req, &raw.bytes));
        }
        Err(classify_error(raw.status, &raw.bytes, headers))
    }
}

impl ChatProvider for OpenAiChat {
    fn name(&self) -> &str {
        &self.label
    }

    fn send<'a>(&'a self, request: &'a ChatRequest) -> ChatFuture<'a> {
        Box::pin(async move {
            self.send_inner(request)
                .await
                .map_err(|e| super::scrub(e, self.key.as_ref()))
        })
    }

    /// `GET {base}/models`.
    fn preflight(&self) -> super::PreflightFuture<'_> {
        Box::pin(async move {
            let base = super::chat_base(&self.url);
            let mut builder = self.client.get(format!("{base}/models"));
            if let Some(key) = &self.key {
                builder = builder.bearer_auth(key.expose());
            }
            let body = super::probe(builder, self.key.as_ref()).await?;
            Ok(body.and_then(|b| super::listed_ids(&b)))
        })
    }
}

pub(crate) fn request_body(req: &ChatRequest) -> Value {
    let mut messages = Vec::with_capacity(2);
    if let Some(system) = &req.system {
        messages.push(json!({"role": "system", "content": &**system}));
    }
    messages.push(json!({"role": "user", "content": req.user}));
    let mut body = json!({
        "model": req.model,
        "messages": messages,
        "max_completion_tokens": req.max_tokens,
    });
    if let Some(t) = req.temperature {
        body["temperature"] = json!(t);
    }
    if let Some((name, schema)) = req.response_schema.as_deref() {
        body["response_format"] = json!({
            "type": "json_schema",
            "json_schema": {"name": name, "strict": strict_ok(schema), "schema": schema},
        });
    }
    body
}

/// Rename `max_completion_tokens` to `max_tokens` in a `request_body`: the
/// name OpenRouter documents and OpenAI-compatible servers read.
pub(crate) fn use_max_tokens(body: &mut Value) {
    if let Some(obj) = body.as_object_mut()
        && let Some(n) = obj.remove("max_completion_tokens")
    {
        obj.insert("max_tokens".into(), n);
    }
}

#[derive(Deserialize)]
struct CompletionBody {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    model: Option<String>,
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<UsageBody>,
}

#[derive(Deserialize)]
struct Choice {
    message: MessageBody,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct MessageBody {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    refusal: Option<String>,
}

#[derive(Deserialize, Default)]
struct UsageBody {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    #[serde(default)]
    prompt_tokens_details: Option<PromptDetails>,
    #[serde(default)]
    completion_tokens_details: Option<CompletionDetails>,
}

#[derive(Deserialize, Default)]
struct PromptDetails {
    #[serde(default)]
    cached_tokens: u64,
}

#[derive(Deserialize, Default)]
struct CompletionDetails {
    #[serde(default)]
    reasoning_tokens: u64,
}

pub(crate) fn parse_success(
    bytes: &[u8],
    headers: RateHeaders,
    provider_request_id: Option<String>,
    status: u16,
) -> Result<ChatAnswer, ProviderError> {
    let body: CompletionBody = serde_json::from_slice(bytes).map_err(|e| ProviderError {
        // A 2xx that is not an answer: most likely billed, and nothing of it
        // can be used. Retried, and counted ambiguous (row S7).
        class: ErrorClass::Ambiguous,
        http_status: Some(status),
        message: format!(
            "answer body is not a chat completion: {e}; body starts {}",
            preview(bytes)
        ),
        headers,
    })?;
    let Some(choice) = body.choices.into_iter().next() else {
        return Err(ProviderError {
            class: ErrorClass::Ambiguous,
            http_status: Some(status),
            message: "answer has no choices".into(),
            headers,
        });
    };
    let finish_reason = match choice.finish_reason.as_deref() {
        Some("stop") | None => FinishReason::Stop,
        Some("length") => FinishReason::Length,
        Some("content_filter") => FinishReason::ContentFilter,
        Some(other) => FinishReason::Other(other.to_string()),
    };
    // Counts are capped so a nonsense number cannot overflow a sum or a
    // ledger column (no real request comes near a trillion tokens).
    let cap = |n: u64| n.min(MAX_TOKENS_REPORTED);
    let usage = body.usage.map(|u| Usage {
        input_tokens: cap(u.prompt_tokens),
        output_tokens: cap(u.completion_tokens),
        cached_input_tokens: cap(u
            .prompt_tokens_details
            .map(|d| d.cached_tokens)
            .unwrap_or(0)),
        reasoning_tokens: cap(u
            .completion_tokens_details
            .map(|d| d.reasoning_tokens)
            .unwrap_or(0)),
    });
    Ok(ChatAnswer {
        content: choice.message.content,
        refusal: choice.message.refusal,
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
    #[serde(default)]
    message: Option<String>,
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    code: Option<Value>,
}

pub(crate) fn classify_error(status: u16, bytes: &[u8], headers: RateHeaders) -> ProviderError {
    let parsed: Option<ErrorBody> = serde_json::from_slice::<ErrorEnvelope>(bytes)
        .ok()
        .map(|e| e.error);
    let kind = parsed
        .as_ref()
        .and_then(|e| e.kind.clone())
        .unwrap_or_default();
    let code = parsed
        .as_ref()
        .and_then(|e| e.code.as_ref())
        .map(|c| {
            c.as_str()
                .map(str::to_string)
                .unwrap_or_else(|| c.to_string())
        })
        .unwrap_or_default();
    let message = parsed
        .as_ref()
        .and_then(|e| e.message.clone())
        .unwrap_or_else(|| format!("body: {}", preview(bytes)));
    let quota = kind == "insufficient_quota"
        || code == "insufficient_quota"
        || code == "credit_balance_exhausted"
        || code == "billing_hard_limit_reached";
    let class = match status {
        401 | 403 => ErrorClass::Auth,
        429 if quota => ErrorClass::Quota,
        429 if message.starts_with("Request too large") => ErrorClass::Request,
        429 => ErrorClass::RateLimited,
        503 | 529 => ErrorClass::Overloaded,
        408 | 409 | 500..=599 => ErrorClass::Transient,
        _ if quota => ErrorClass::Quota,
        _ => ErrorClass::Request,
    };
    let detail = if code.is_empty() {
        message
    } else {
        format!("{message} [{code}]")
    };
    ProviderError {
        class,
        http_status: Some(status),
        message: redact(&detail),
        headers,
    }
}

pub(crate) fn transport_error(e: &reqwest::Error) -> ProviderError {
    // A connect failure means nothing left this machine: safe to resend.
    // A timeout or a broken connection after the request went out may have
    // been billed: ambiguous.
    let class = if e.is_connect() {
        ErrorClass::Transient
    } else if e.is_timeout() || e.is_request() || e.is_body() || e.is_decode() {
        ErrorClass::Ambiguous
    } else {
        ErrorClass::Transient
    };
    // What failed, down to its cause (row S5): "DNS: ...", "TLS: ...",
    // "connection refused", not only reqwest's "error sending request".
    let what = if e.is_connect() && e.is_timeout() {
        format!(
            "{}: no connection within the connect timeout",
            super::transport::head(e)
        )
    } else if e.is_timeout() {
        "no answer before the request timeout".to_string()
    } else {
        super::transport::describe(e)
    };
    ProviderError {
        class,
        http_status: None,
        message: redact(&what),
        headers: RateHeaders::default(),
    }
}

pub(crate) fn header_u64(h: &HeaderMap, name: &str) -> Option<u64> {
    h.get(name)?.to_str().ok()?.trim().parse().ok()
}

pub(crate) fn header_str<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name)?.to_str().ok()
}

pub(crate) fn rate_headers(h: &HeaderMap) -> RateHeaders {
    let retry_after = header_str(h, "retry-after-ms")
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|ms| ms.is_finite() && *ms >= 0.0)
        .map(|ms| std::time::Duration::from_secs_f64(ms.min(3_600_000.0) / 1000.0))
        .or_else(|| header_str(h, "retry-after").and_then(parse_retry_after));
    RateHeaders {
        limit_requests: header_u64(h, "x-ratelimit-limit-requests"),
        limit_tokens: header_u64(h, "x-ratelimit-limit-tokens"),
        remaining_requests: header_u64(h, "x-ratelimit-remaining-requests"),
        remaining_tokens: header_u64(h, "x-ratelimit-remaining-tokens"),
        reset_requests: header_str(h, "x-ratelimit-reset-requests").and_then(parse_go_duration),
        reset_tokens: header_str(h, "x-ratelimit-reset-tokens").and_then(parse_go_duration),
        retry_after,
    }
}

pub(crate) fn preview(bytes: &[u8]) -> String {
    let s = String::from_utf8_lossy(&bytes[..bytes.len().min(120)]);
    docket_model::sanitize::for_terminal(&s)
}

/// Providers echo a partial key in 401 messages ("Incorrect API key provided:
/// sk-abc***"). Mask anything key-shaped before it is stored or shown.
pub fn redact(text: &str) -> String {
    // Words are runs of key-ish characters, so a key after a quote, a colon
    // or a newline is caught as well as one after a space.
    let is_key_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '*' | '.');
    let mut out = String::with_capacity(text.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        let looks_like_key =
            (word.starts_with("sk-") || word.starts_with("sk_") || word.starts_with("key-"))
                && word.len() > 6;
        out.push_str(if looks_like_key { "[redacted]" } else { word });
        word.clear();
    };
    for c in text.chars() {
        if is_key_char(c) {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}

/// Whether OpenAI's strict structured outputs take `schema`: every object
/// lists all its properties as required and allows no others. A schema with
/// optional properties (structured batching's criteria) goes non-strict
/// rather than being refused; docket's own gate checks it either way.
pub(crate) fn strict_ok(schema: &Value) -> bool {
    fn walk(v: &Value, depth: usize) -> bool {
        if depth > 32 {
            return true;
        }
        match v {
            Value::Object(m) => {
                if let Some(Value::Object(props)) = m.get("properties") {
                    let required: Vec<&str> = m
                        .get("required")
                        .and_then(Value::as_array)
                        .map(|a| a.iter().filter_map(Value::as_str).collect())
                        .unwrap_or_default();
                    if props.keys().any(|k| !required.contains(&k.as_str()))
                        || m.get("additionalProperties") != Some(&Value::Bool(false))
                    {
                        return false;
                    }
                }
                m.values().all(|x| walk(x, depth + 1))
            }
            Value::Array(a) => a.iter().all(|x| walk(x, depth + 1)),
            _ => true,
        }
    }
    walk(schema, 0)
}

#[cfg(test)]
mod tests;
