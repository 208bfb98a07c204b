//! OpenRouter: OpenAI's Chat Completions wire format at
//! `POST {base}/chat/completions` (`base` = `https://openrouter.ai/api/v1`),
//! `Authorization: Bearer`, optional `HTTP-Referer` / `X-Title` attribution.
//!
//! Differences from OpenAI that matter here:
//! - the output limit is sent as `max_tokens` (OpenRouter's documented name;
//!   it maps it onto each upstream's own parameter);
//! - errors are `{"error":{"code":<int>,"message","metadata"}}`: 402 is spent
//!   credit (stops the session), 403 a moderation flag on this input (the item
//!   fails), 401 a bad key, 429 a rate limit (`Retry-After`), 502 / 408 an
//!   upstream failure (retry), 503 no upstream available (overload);
//! - an error after generation started comes back with HTTP 200: a top-level
//!   `error` object, or a choice with `finish_reason: "error"` (and usually
//!   its own `error` object). It is a failed generation, not an answer: it is
//!   retried (`Transient`; a rate limit or overload `code` keeps its class).
//!
//! - a request with a `response_format` also sends
//!   `provider: {require_parameters: true}`, so it is never routed to an
//!   upstream that would ignore the schema.
//!
//! No client request id header is documented, so none is sent.

#![allow(clippy::result_large_err)]

use serde::Deserialize;
use serde_json::Value;

use super::openai::{header_str, parse_success, preview, rate_headers};
use super::{ApiKey, ChatAnswer, ChatFuture, ChatProvider, ChatRequest, ErrorClass, ProviderError};
use crate::limiter::RateHeaders;

pub struct OpenRouterChat {
    url: String,
    key: ApiKey,
    referer: Option<String>,
    title: Option<String>,
    client: reqwest::Client,
}

impl OpenRouterChat {
    pub fn new(base_url: &str, key: ApiKey) -> Result<Self, crate::ClientError> {
        Ok(Self {
            url: format!("{}/chat/completions", base_url.trim_end_matches('/')),
            key,
            referer: None,
            title: None,
            client: super::http_client()?,
        })
    }

    /// Attribution headers (`HTTP-Referer`: the app's URL, `X-Title`: its name).
    pub fn with_attribution(mut self, referer: Option<&str>, title: Option<&str>) -> Self {
        self.referer = referer.map(str::to_string);
        self.title = title.map(str::to_string);
        self
    }

    async fn send_inner(&self, req: &ChatRequest) -> Result<ChatAnswer, ProviderError> {
        let mut builder = self
            .client
            .post(&self.url)
            .timeout(req.timeout)
            .bearer_auth(self.key.expose())
            .json(&super::body_or(req, request_body));
        if let Some(r) = &self.referer {
            builder = builder.header("HTTP-Referer", r);
        }
        if let Some(t) = &self.title {
            builder = builder.header("X-Title", t);
        }
        let raw = super::exchange(builder).await?;
        let headers = rate_headers(&raw.headers);
        let request_id = header_str(&raw.headers, "x-request-id").map(str::to_string);
        if raw.status == 200 {
            if let Some(e) = failed_generation(&raw.bytes, headers) {
                return Err(e);
            }
            return parse_success(&raw.bytes, headers, request_id, raw.status)
                .map(|a| super::keep_body(a, req, &raw.bytes));
        }
        Err(classify_error(raw.status, &raw.bytes, headers))
    }
}

impl ChatProvider for OpenRouterChat {
    fn name(&self) -> &str {
        "openrouter"
    }

    fn send<'a>(&'a self, request: &'a ChatRequest) -> ChatFuture<'a> {
        Box::pin(async move {
            self.send_inner(request)
                .await
                .map_err(|e| super::scrub(e, Some(&self.key)))
        })
    }

    /// `GET {base}/key` (the key's own limits: it checks the key, where the models list does not).
    fn preflight(&self) -> super::PreflightFuture<'_> {
        Box::pin(async move {
            let base = super::chat_base(&self.url);
            let builder = self
                .client
                .get(format!("{base}/key"))
                .bearer_auth(self.key.expose());
            // The key's limits, not a models list: nothing to say of the
            // model (its ids take variants, `:free`, `:nitro`, too).
            super::probe(builder, Some(&self.key)).await.map(|_| None)
        })
    }
}

pub(crate) fn request_body(req: &ChatRequest) -> Value {
    let mut body = super::openai::request_body(req);
    super::openai::use_max_tokens(&mut body);
    // With a schema, only upstreams that honour every parameter sent may
    // take the request: by default OpenRouter may route to one that ignores
    // `response_format` (OpenRouter, "Provider Routing", `require_parameters`,
    // https://openrouter.ai/docs/features/provider-routing, read 2026-11).
    // Set inside any `provider` object the body has (one is made if none).
    if body.get("response_format").is_some() {
        body["provider"]["require_parameters"] = Value::Bool(true);
    }
    body
}

#[derive(Deserialize)]
struct ErrorEnvelope {
    error: ErrorBody,
}

#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default)]
    code: Option<Value>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    metadata: Option<Value>,
}

/// A 200 whose body says the generation failed after it started: a
/// top-level `error`, or a first choice with `finish_reason: "error"` or an
/// `error` object of its own. `None` when the body is anything else (an
/// answer, or garbage for `parse_success` to report).
///
/// The failure is retryable: `Transient`, unless the upstream `code` says
/// rate limit or overload (those keep their class, so concurrency is cut).
/// A code that would stop the session or fail the item on a non-200 does not
/// here: the request was accepted, and the next attempt gets its own status.
pub(crate) fn failed_generation(bytes: &[u8], headers: RateHeaders) -> Option<ProviderError> {
    let body: Value = serde_json::from_slice(bytes).ok()?;
    let choice = body
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first());
    let choice_failed = choice.is_some_and(|c| {
        c.get("finish_reason").and_then(Value::as_str) == Some("error")
            || c.get("error").is_some_and(|e| !e.is_null())
    });
    let error = match body.get("error").filter(|e| !e.is_null()) {
        Some(e) => e,
        None if choice_failed => choice
            .and_then(|c| c.get("error"))
            .filter(|e| !e.is_null())
            .unwrap_or(&Value::Null),
        None => return None,
    };
    // `error` may be an object, a bare string, or missing (finish_reason only).
    let parsed: Option<ErrorBody> = match error {
        Value::String(s) => Some(ErrorBody {
            code: None,
            message: Some(s.clone()),
            metadata: None,
        }),
        Value::Null => None,
        other => serde_json::from_value(other.clone()).ok(),
    };
    let code = parsed
        .as_ref()
        .and_then(|e| e.code.as_ref())
        .and_then(|c| c.as_u64().or_else(|| c.as_str()?.trim().parse().ok()))
        .and_then(|c| u16::try_from(c).ok())
        .filter(|c| *c >= 400);
    let has_message = parsed.as_ref().is_some_and(|e| e.message.is_some());
    let mut e = classify_parsed(code.unwrap_or(502), parsed, bytes, headers);
    if !has_message {
        e.message = format!(
            "generation failed after it started (an error in a 200 answer, no message); body starts {}",
            preview(bytes)
        );
    }
    if !matches!(e.class, ErrorClass::RateLimited | ErrorClass::Overloaded) {
        e.class = ErrorClass::Transient;
    }
    e.http_status = Some(200);
    Some(e)
}

pub(crate) fn classify_error(status: u16, bytes: &[u8], headers: RateHeaders) -> ProviderError {
    let parsed = serde_json::from_slice::<ErrorEnvelope>(bytes)
        .ok()
        .map(|e| e.error);
    classify_parsed(status, parsed, bytes, headers)
}

fn classify_parsed(
    status: u16,
    parsed: Option<ErrorBody>,
    bytes: &[u8],
    headers: RateHeaders,
) -> ProviderError {
    let message = parsed
        .as_ref()
        .and_then(|e| e.message.clone())
        .unwrap_or_else(|| format!("body: {}", preview(bytes)));
    let source = parsed
        .as_ref()
        .and_then(|e| e.metadata.as_ref())
        .and_then(|m| m.get("limit_source").or_else(|| m.get("provider_name")))
        .and_then(Value::as_str)
        .map(str::to_string);
    let class = match status {
        402 => ErrorClass::Quota,
        401 => ErrorClass::Auth,
        // Moderation flagged this input: only this item fails.
        403 => ErrorClass::Request,
        429 => ErrorClass::RateLimited,
        503 => ErrorClass::Overloaded,
        408 | 409 | 500..=599 => ErrorClass::Transient,
        _ => ErrorClass::Request,
    };
    let message = match source {
        Some(s) => format!("{message} [{s}]"),
        None => message,
    };
    ProviderError {
        class,
        http_status: Some(status),
        message,
        headers,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FinishReason, Usage};
    use serde_json::json;

    #[test]
    fn body_is_openai_with_max_tokens() {
        let req = ChatRequest {
            model: "anthropic/claude-sonnet-4.5".into(),
            system: Some("sys".into()),
            user: "u".into(),
            max_tokens: 300,
            temperature: Some(0.0),
            response_schema: Some(std::sync::Arc::new((
                "verdict".into(),
                json!({"type":"object"}),
            ))),
            structured_output: Default::default(),
            thinking_budget: None,
            client_request_id: "r".into(),
            timeout: std::time::Duration::from_secs(1),
            body: None,
        };
        assert_eq!(
            request_body(&req),
            json!({
                "model": "anthropic/claude-sonnet-4.5",
                "messages": [{"role":"system","content":"sys"},{"role":"user","content":"u"}],
                "max_tokens": 300,
                "temperature": 0.0,
                "response_format": {"type":"json_schema","json_schema":{"name":"verdict","strict":true,"schema":{"type":"object"}}},
                "provider": {"require_parameters": true}
            })
        );
        // Without a schema there is nothing an upstream could ignore.
        let plain = ChatRequest {
            response_schema: None,
            ..req
        };
        assert!(request_body(&plain).get("provider").is_none());
    }

    #[test]
    fn parses_usage_accounting() {
        let body = br#"{"id":"gen-1","provider":"Anthropic","model":"anthropic/claude-sonnet-4.5","object":"chat.completion","created":1,
          "choices":[{"index":0,"logprobs":null,"finish_reason":"length","native_finish_reason":"max_tokens","message":{"role":"assistant","content":"{\"a\":","refusal":null}}],
          "usage":{"prompt_tokens":194,"completion_tokens":2,"total_tokens":196,"prompt_tokens_details":{"cached_tokens":100,"cache_write_tokens":0,"audio_tokens":0},
                   "completion_tokens_details":{"reasoning_tokens":1},"cost":0.95,"is_byok":false,
                   "cost_details":{"upstream_inference_cost":null,"upstream_inference_prompt_cost":0.0008,"upstream_inference_completions_cost":0.0004}}}"#;
        let a = parse_success(body, RateHeaders::default(), None, 200).unwrap();
        assert_eq!(a.finish_reason, FinishReason::Length);
        assert_eq!(
            a.usage,
            Some(Usage {
                input_tokens: 194,
                output_tokens: 2,
                cached_input_tokens: 100,
                reasoning_tokens: 1
            })
        );
        assert_eq!(a.provider_request_id.as_deref(), Some("gen-1"));
    }

    #[test]
    fn classifies_openrouter_errors() {
        let c = |status: u16, body: Value| {
            classify_error(status, body.to_string().as_bytes(), RateHeaders::default())
        };
        let e = c(
            402,
            json!({"error":{"code":402,"message":"Insufficient credits. Add more using https://openrouter.ai/credits","metadata":{"limit_source":"openrouter_credits"}}}),
        );
        assert_eq!(e.class, ErrorClass::Quota);
        assert!(e.message.contains("openrouter_credits"));
        assert_eq!(
            c(
                401,
                json!({"error":{"code":401,"message":"No auth credentials found"}})
            )
            .class,
            ErrorClass::Auth
        );
        assert_eq!(
            c(403, json!({"error":{"code":403,"message":"Input was flagged","metadata":{"reasons":["x"],"flagged_input":"y","provider_name":"p","model_slug":"m"}}})).class,
            ErrorClass::Request
        );
        assert_eq!(
            c(
                429,
                json!({"error":{"code":429,"message":"Rate limit exceeded"}})
            )
            .class,
            ErrorClass::RateLimited
        );
        assert_eq!(
            c(
                502,
                json!({"error":{"code":502,"message":"Provider returned error"}})
            )
            .class,
            ErrorClass::Transient
        );
        assert_eq!(
            c(
                503,
                json!({"error":{"code":503,"message":"No endpoints found"}})
            )
            .class,
            ErrorClass::Overloaded
        );
        assert_eq!(
            c(400, json!({"error":{"code":400,"message":"bad"}})).class,
            ErrorClass::Request
        );
    }

    #[test]
    fn a_failed_generation_in_a_200_is_retried_not_an_answer() {
        let f =
            |body: Value| failed_generation(body.to_string().as_bytes(), RateHeaders::default());
        // A top-level error.
        let e = f(json!({"error":{"code":502,"message":"upstream died mid-generation"}})).unwrap();
        assert_eq!(e.class, ErrorClass::Transient);
        assert_eq!(e.http_status, Some(200));
        assert!(e.message.contains("upstream died mid-generation"));
        // Codes that would stop the session or fail the item on a non-200
        // are a failed generation here; rate limits keep their class.
        for (code, class) in [
            (json!(400), ErrorClass::Transient),
            (json!(402), ErrorClass::Transient),
            (json!("500"), ErrorClass::Transient),
            (json!(null), ErrorClass::Transient),
            (json!(429), ErrorClass::RateLimited),
            (json!(503), ErrorClass::Overloaded),
        ] {
            let e = f(json!({"error":{"code":code,"message":"m"}})).unwrap();
            assert_eq!(e.class, class, "{code}");
            assert!(e.class.is_retryable());
        }
        assert!(
            f(json!({"error":"bare text"}))
                .unwrap()
                .message
                .contains("bare text")
        );
        // finish_reason "error" with the choice's own error object.
        let e = f(json!({"id":"gen-1","provider":"Together","model":"m","object":"chat.completion","created":1,
            "choices":[{"index":0,"finish_reason":"error","native_finish_reason":"error",
                        "error":{"code":502,"message":"Upstream provider crashed","metadata":{"provider_name":"Together"}},
                        "message":{"role":"assistant","content":"{\"same\":"}}],
            "usage":{"prompt_tokens":10,"completion_tokens":3,"total_tokens":13}}))
        .unwrap();
        assert_eq!(e.class, ErrorClass::Transient);
        assert!(
            e.message.contains("Upstream provider crashed"),
            "{}",
            e.message
        );
        assert!(e.message.contains("Together"), "{}", e.message);
        // finish_reason "error" alone.
        let e = f(json!({"choices":[{"index":0,"finish_reason":"error","message":{"role":"assistant","content":""}}]}))
            .unwrap();
        assert_eq!(e.class, ErrorClass::Transient);
        assert!(e.message.contains("generation failed"), "{}", e.message);
        // A choice error object with another finish reason.
        let e = f(json!({"choices":[{"index":0,"finish_reason":"stop","error":{"message":"late failure"},"message":{"content":"x"}}]}))
            .unwrap();
        assert_eq!(e.class, ErrorClass::Transient);
        assert!(e.message.contains("late failure"));
        // Answers, and garbage (left to parse_success), are not failures.
        assert!(f(json!({"id":"gen","choices":[]})).is_none());
        assert!(f(json!({"choices":[{"finish_reason":"stop","error":null,"message":{"content":"x"}}],"error":null})).is_none());
        assert!(
            f(json!({"choices":[{"finish_reason":"length","message":{"content":"x"}}]})).is_none()
        );
        assert!(failed_generation(b"not json", RateHeaders::default()).is_none());
    }
}
