//! Google Gemini `generateContent` (Gemini Developer API):
//! `POST {base}/v1beta/models/{model}:generateContent`.
//!
//! The key goes in the `x-goog-api-key` header, never in the URL (a URL ends
//! up in error messages and logs). Structured output is
//! `generationConfig.responseMimeType = "application/json"` with the schema in
//! `responseJsonSchema` (the JSON Schema variant; `responseSchema` takes an
//! OpenAPI subset instead). No client request id header exists.
//!
//! Thinking: 2.5 models count their thinking tokens against
//! `maxOutputTokens`. `generationConfig.thinkingConfig.thinkingBudget` is
//! the stage's `thinking_budget`, or `DEFAULT_THINKING_BUDGET` for 2.5 Pro
//! and Flash; a budget of 0 or more is added to `maxOutputTokens`, so the
//! answer keeps its whole `max_tokens` (see `thinking_budget`). The Batch
//! API's requests are this same body.
//!
//! Gemini sends no rate-limit headers: a 429's body carries
//! `google.rpc.RetryInfo.retryDelay` ("17s"), read into `retry_after`. A 429
//! is a rate limit unless its `QuotaFailure` names a per-day quota or it says
//! the prepaid credits or spend cap are used up: then it is quota, which
//! stops the session (it will not clear within the job).

#![allow(clippy::result_large_err)]

use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};

use super::openai::preview;
use super::{
    ApiKey, ChatAnswer, ChatFuture, ChatProvider, ChatRequest, ErrorClass, FinishReason,
    ProviderError, Usage,
};
use crate::limiter::RateHeaders;

const MAX_TOKENS_REPORTED: u64 = 1_000_000_000_000;
const MAX_RETRY_DELAY: Duration = Duration::from_secs(3600);

pub struct GeminiChat {
    base: String,
    key: ApiKey,
    client: reqwest::Client,
}

impl GeminiChat {
    /// `base_url` is `https://generativelanguage.googleapis.com` (a trailing
    /// `/v1beta` is accepted).
    pub fn new(base_url: &str, key: ApiKey) -> Result<Self, crate::ClientError> {
        let base = base_url.trim_end_matches('/');
        let base = base.strip_suffix("/v1beta").unwrap_or(base).to_string();
        Ok(Self {
            base,
            key,
            client: super::http_client()?,
        })
    }

    /// The URL for a model: a bare id ("gemini-2.5-flash") or a resource
    /// name ("models/gemini-2.5-flash").
    pub fn url_for(&self, model: &str) -> String {
        let id = model.strip_prefix("models/").unwrap_or(model);
        format!(
            "{}/v1beta/models/{}:generateContent",
            self.base,
            super::path_segment(id)
        )
    }

    async fn send_inner(&self, req: &ChatRequest) -> Result<ChatAnswer, ProviderError> {
        let (model, body) = wire_request(req).map_err(super::untranslatable)?;
        let builder = self
            .client
            .post(self.url_for(&model))
            .timeout(req.timeout)
            .header("x-goog-api-key", super::secret_header(self.key.expose())?)
            .json(&body);
        let raw = super::exchange(builder).await?;
        // Gemini has no rate-limit headers; a proxy in front may add
        // retry-after, so it is still read.
        let headers = RateHeaders {
            retry_after: super::openai::rate_headers(&raw.headers).retry_after,
            ..RateHeaders::default()
        };
        if raw.status == 200 {
            let mut answer = parse_success(&raw.bytes, headers, raw.status)?;
            if req.body.is_some() {
                with_chat_body(&mut answer, &raw.bytes, &model)?;
            }
            return Ok(answer);
        }
        Err(classify_error(raw.status, &raw.bytes, headers))
    }
}

impl ChatProvider for GeminiChat {
    fn name(&self) -> &str {
        "gemini"
    }

    fn send<'a>(&'a self, request: &'a ChatRequest) -> ChatFuture<'a> {
        Box::pin(async move {
            self.send_inner(request)
                .await
                .map_err(|e| super::scrub(e, Some(&self.key)))
        })
    }

    /// `GET /v1beta/models?pageSize=1000` (one page: the largest it gives).
    fn preflight(&self) -> super::PreflightFuture<'_> {
        Box::pin(async move {
            let builder = self
                .client
                .get(format!("{}/v1beta/models?pageSize=1000", self.base))
                .header("x-goog-api-key", super::secret_header(self.key.expose())?);
            let body = super::probe(builder, Some(&self.key)).await?;
            Ok(body.and_then(|b| listed_models(&b)))
        })
    }
}

/// The model ids of a `models.list` answer (`{"models": [{"name":
/// "models/gemini-2.5-flash"}]}`), without the `models/`; None for another
/// shape, or a page of a longer list (`nextPageToken`).
pub(crate) fn listed_models(body: &[u8]) -> super::Listed {
    let v: Value = serde_json::from_slice(body).ok()?;
    if v.get("nextPageToken")
        .and_then(Value::as_str)
        .is_some_and(|t| !t.is_empty())
    {
        return None;
    }
    let models = v.get("models")?.as_array()?;
    Some(
        models
            .iter()
            .filter_map(|m| m.get("name")?.as_str())
            .map(|n| n.strip_prefix("models/").unwrap_or(n).to_string())
            .collect(),
    )
}

/// The model and `generateContent` body to send: a chat-completions body
/// sent as written, translated; else the one built from the request's
/// fields, to the request's model.
pub(crate) fn wire_request(
    req: &ChatRequest,
) -> Result<(String, Value), crate::translate::TranslateError> {
    match &req.body {
        Some(body) => {
            let g = crate::translate::chat_to_gemini(body)?;
            Ok((g.model, g.body))
        }
        None => Ok((req.model.clone(), request_body(req))),
    }
}

/// `answer` with its `generateContent` answer (`bytes`) kept as a
/// `chat.completion` body of `model`; Err when it cannot be translated back.
pub(crate) fn with_chat_body(
    answer: &mut ChatAnswer,
    bytes: &[u8],
    model: &str,
) -> Result<(), ProviderError> {
    super::keep_translated_body(answer, bytes, |r| {
        crate::translate::gemini_to_chat(r, model)
    })
}

pub(crate) fn request_body(req: &ChatRequest) -> Value {
    let budget = thinking_budget(&req.model, req.thinking_budget);
    // A fixed budget is added to the limit so thinking cannot starve the
    // answer; -1 (dynamic) cannot be bounded, and shares `max_tokens`.
    let limit = req
        .max_tokens
        .saturating_add(thinking_allowance(&req.model, req.thinking_budget));
    let mut generation = json!({"maxOutputTokens": limit});
    if let Some(b) = budget {
        generation["thinkingConfig"] = json!({"thinkingBudget": b});
    }
    if let Some(t) = req.temperature {
        generation["temperature"] = json!(t);
    }
    if let Some((_, schema)) = req.response_schema.as_deref() {
        generation["responseMimeType"] = json!("application/json");
        // `$schema` is not among the keywords responseJsonSchema accepts.
        let mut schema = schema.clone();
        if let Some(obj) = schema.as_object_mut() {
            obj.remove("$schema");
        }
        generation["responseJsonSchema"] = schema;
    }
    let mut body = json!({
        "contents": [{"role": "user", "parts": [{"text": req.user}]}],
        "generationConfig": generation,
    });
    if let Some(system) = &req.system {
        body["systemInstruction"] = json!({"parts": [{"text": &**system}]});
    }
    body
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ResponseBody {
    #[serde(default)]
    candidates: Vec<Candidate>,
    #[serde(default)]
    prompt_feedback: Option<PromptFeedback>,
    #[serde(default)]
    usage_metadata: Option<UsageMetadata>,
    #[serde(default)]
    model_version: Option<String>,
    #[serde(default)]
    response_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Candidate {
    #[serde(default)]
    content: Option<Content>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Content {
    #[serde(default)]
    parts: Vec<Part>,
}

#[derive(Deserialize)]
struct Part {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    thought: Option<bool>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PromptFeedback {
    #[serde(default)]
    block_reason: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct UsageMetadata {
    #[serde(default)]
    prompt_token_count: u64,
    #[serde(default)]
    candidates_token_count: u64,
    #[serde(default)]
    cached_content_token_count: u64,
    #[serde(default)]
    thoughts_token_count: u64,
}

/// Finish reasons that mean a filter stopped the answer.
fn is_filter(reason: &str) -> bool {
    matches!(
        reason,
        "SAFETY"
            | "RECITATION"
            | "BLOCKLIST"
            | "PROHIBITED_CONTENT"
            | "SPII"
            | "IMAGE_SAFETY"
            | "IMAGE_PROHIBITED_CONTENT"
            | "IMAGE_RECITATION"
    )
}

pub(crate) fn parse_success(
    bytes: &[u8],
    headers: RateHeaders,
    status: u16,
) -> Result<ChatAnswer, ProviderError> {
    // A 2xx that is not an answer: most likely billed, and nothing of it
    // can be used. Retried, and counted ambiguous (row S7).
    let unusable = |message: String| ProviderError {
        class: ErrorClass::Ambiguous,
        http_status: Some(status),
        message,
        headers,
    };
    let body: ResponseBody = serde_json::from_slice(bytes).map_err(|e| {
        unusable(format!(
            "answer body is not a Gemini response: {e}; body starts {}",
            preview(bytes)
        ))
    })?;
    let cap = |n: u64| n.min(MAX_TOKENS_REPORTED);
    // Thinking is billed as output: output = candidates + thoughts, with the
    // thoughts also reported as reasoning (as OpenAI counts them).
    let usage = body.usage_metadata.map(|u| Usage {
        input_tokens: cap(u.prompt_token_count),
        output_tokens: cap(u
            .candidates_token_count
            .saturating_add(u.thoughts_token_count)),
        cached_input_tokens: cap(u.cached_content_token_count),
        reasoning_tokens: cap(u.thoughts_token_count),
    });
    let Some(candidate) = body.candidates.into_iter().next() else {
        // The prompt itself was blocked: an answer, and a refusal.
        if let Some(reason) = body.prompt_feedback.and_then(|f| f.block_reason) {
            return Ok(ChatAnswer {
                content: None,
                refusal: Some(format!("the prompt was blocked (blockReason {reason})")),
                finish_reason: FinishReason::ContentFilter,
                usage,
                provider_request_id: body.response_id,
                model: body.model_version,
                headers,
                http_status: status,
                body: None,
            });
        }
        return Err(unusable("answer has no candidates".into()));
    };
    let mut text: Option<String> = None;
    for part in candidate.content.into_iter().flat_map(|c| c.parts) {
        if part.thought == Some(true) {
            continue;
        }
        if let Some(t) = part.text {
            text.get_or_insert_with(String::new).push_str(&t);
        }
    }
    let reason = candidate.finish_reason.unwrap_or_else(|| "STOP".into());
    let finish_reason = match reason.as_str() {
        "STOP" | "FINISH_REASON_UNSPECIFIED" => FinishReason::Stop,
        "MAX_TOKENS" => FinishReason::Length,
        r if is_filter(r) => FinishReason::ContentFilter,
        r => FinishReason::Other(r.to_ascii_lowercase()),
    };
    let refusal =
        is_filter(&reason).then(|| format!("blocked by the provider (finishReason {reason})"));
    Ok(ChatAnswer {
        content: text,
        refusal,
        finish_reason,
        usage,
        provider_request_id: body.response_id,
        model: body.model_version,
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
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    details: Vec<Value>,
}

/// A proto-JSON duration ("17s", "27.4s"; "900ms" seen from some fronts).
///
/// The number is the server's: it is clamped to `MAX_RETRY_DELAY` as an f64
/// *before* it becomes a `Duration` ("1e30s" would not fit one, and
/// `Duration::from_secs_f64` panics on it). Negative, NaN and infinite values
/// are no delay at all (`None`): the caller falls back to its own backoff.
pub(crate) fn parse_proto_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let (num, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 0.001)
    } else {
        (s.strip_suffix('s')?, 1.0)
    };
    let v: f64 = num.trim().parse().ok()?;
    let secs = v * scale;
    if !secs.is_finite() || secs < 0.0 {
        return None;
    }
    Duration::try_from_secs_f64(secs.min(MAX_RETRY_DELAY.as_secs_f64())).ok()
}

fn detail_type(d: &Value) -> &str {
    d.get("@type")
        .and_then(Value::as_str)
        .and_then(|t| t.rsplit('/').next())
        .unwrap_or("")
}

pub(crate) fn classify_error(status: u16, bytes: &[u8], headers: RateHeaders) -> ProviderError {
    let parsed = serde_json::from_slice::<ErrorEnvelope>(bytes)
        .ok()
        .map(|e| e.error);
    let rpc = parsed
        .as_ref()
        .and_then(|e| e.status.clone())
        .unwrap_or_default();
    let message = parsed
        .as_ref()
        .and_then(|e| e.message.clone())
        .unwrap_or_else(|| format!("body: {}", preview(bytes)));
    let details: &[Value] = parsed.as_ref().map(|e| &e.details[..]).unwrap_or(&[]);
    let reasons: Vec<&str> = details
        .iter()
        .filter(|d| detail_type(d) == "google.rpc.ErrorInfo")
        .filter_map(|d| d.get("reason").and_then(Value::as_str))
        .collect();
    let quota_ids: Vec<&str> = details
        .iter()
        .filter(|d| detail_type(d) == "google.rpc.QuotaFailure")
        .filter_map(|d| d.get("violations").and_then(Value::as_array))
        .flatten()
        .flat_map(|v| {
            ["quotaId", "quotaMetric"]
                .into_iter()
                .filter_map(|k| v.get(k).and_then(Value::as_str))
        })
        .collect();
    let retry_delay = details
        .iter()
        .filter(|d| detail_type(d) == "google.rpc.RetryInfo")
        .find_map(|d| d.get("retryDelay").and_then(Value::as_str))
        .and_then(parse_proto_duration);
    let lower = message.to_ascii_lowercase();
    let per_day = quota_ids
        .iter()
        .any(|q| q.contains("PerDay") || q.contains("Daily"));
    let billing = lower.contains("credits are depleted")
        || lower.contains("spending cap")
        || lower.contains("spend cap")
        || reasons
            .iter()
            .any(|r| r.contains("CREDITS") || r.contains("BILLING"));
    let bad_key = reasons.contains(&"API_KEY_INVALID")
        || reasons.contains(&"API_KEY_EXPIRED")
        || lower.contains("api key not valid")
        || lower.contains("api key expired");
    let class = match (status, rpc.as_str()) {
        _ if bad_key => ErrorClass::Auth,
        (429, _) | (_, "RESOURCE_EXHAUSTED") if per_day || billing => ErrorClass::Quota,
        (429, _) | (_, "RESOURCE_EXHAUSTED") => ErrorClass::RateLimited,
        (401 | 403, _) | (_, "UNAUTHENTICATED") | (_, "PERMISSION_DENIED") => ErrorClass::Auth,
        // "User location is not supported", "enable billing": nothing this
        // job can change, and every request would fail the same way.
        (_, "FAILED_PRECONDITION") => ErrorClass::Quota,
        (503, _) | (_, "UNAVAILABLE") => ErrorClass::Overloaded,
        (408 | 409 | 500..=599, _) => ErrorClass::Transient,
        // 400 INVALID_ARGUMENT, 404 NOT_FOUND, 413.
        _ => ErrorClass::Request,
    };
    let headers = RateHeaders {
        retry_after: retry_delay.or(headers.retry_after),
        ..headers
    };
    let detail = if rpc.is_empty() {
        message
    } else {
        format!("{message} [{rpc}]")
    };
    ProviderError {
        class,
        http_status: Some(status),
        message: detail,
        headers,
    }
}

pub(crate) mod thinking;
pub use thinking::thinking_allowance;
use thinking::thinking_budget;

#[cfg(test)]
mod tests;
