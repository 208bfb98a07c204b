//! Ollama's native chat endpoint: `POST {base}/api/chat` with `stream: false`
//! (the default is an NDJSON stream). No key is needed; when the config names
//! one (a proxy or Ollama's hosted API) it is sent as a bearer token.
//!
//! Structured output is the native `format: <JSON schema>`; the output limit
//! is `options.num_predict`. No rate-limit headers and no client request id.
//! Errors are `{"error": "text"}`: 404 (model not pulled) and 400 fail the
//! item, 429 is a rate limit, 503 (queue full) overload, other 5xx transient.

#![allow(clippy::result_large_err)]

use serde::Deserialize;
use serde_json::{Value, json};

use super::openai::preview;
use super::{
    ApiKey, ChatAnswer, ChatFuture, ChatProvider, ChatRequest, ErrorClass, FinishReason,
    ProviderError, Usage,
};
use crate::limiter::RateHeaders;

const MAX_TOKENS_REPORTED: u64 = 1_000_000_000_000;

pub struct OllamaChat {
    url: String,
    key: Option<ApiKey>,
    client: reqwest::Client,
}

impl OllamaChat {
    /// `base_url` is the server root, `http://localhost:11434`.
    pub fn new(base_url: &str, key: Option<ApiKey>) -> Result<Self, crate::ClientError> {
        let base = base_url.trim_end_matches('/');
        let base = base.strip_suffix("/api").unwrap_or(base);
        Ok(Self {
            url: format!("{base}/api/chat"),
            key,
            client: super::http_client()?,
        })
    }

    async fn send_inner(&self, req: &ChatRequest) -> Result<ChatAnswer, ProviderError> {
        let mut builder = self
            .client
            .post(&self.url)
            .timeout(req.timeout)
            .json(&request_body(req));
        if let Some(key) = &self.key {
            builder = builder.bearer_auth(key.expose());
        }
        let raw = super::exchange(builder).await?;
        let headers = RateHeaders {
            retry_after: super::openai::rate_headers(&raw.headers).retry_after,
            ..RateHeaders::default()
        };
        if raw.status == 200 {
            return parse_success(&raw.bytes, headers, raw.status);
        }
        Err(classify_error(raw.status, &raw.bytes, headers))
    }
}

impl ChatProvider for OllamaChat {
    fn name(&self) -> &str {
        "ollama"
    }

    fn send<'a>(&'a self, request: &'a ChatRequest) -> ChatFuture<'a> {
        Box::pin(async move {
            self.send_inner(request)
                .await
                .map_err(|e| super::scrub(e, self.key.as_ref()))
        })
    }

    /// `GET /api/tags` (the local models).
    fn preflight(&self) -> super::PreflightFuture<'_> {
        Box::pin(async move {
            let url = self.url.replace("/api/chat", "/api/tags");
            let mut builder = self.client.get(url);
            if let Some(key) = &self.key {
                builder = builder.bearer_auth(key.expose());
            }
            let body = super::probe(builder, self.key.as_ref()).await?;
            Ok(body.and_then(|b| listed_tags(&b)))
        })
    }
}

/// The local models of an `/api/tags` answer (`{"models": [{"name":
/// "llama3.2:latest", "model": "llama3.2:latest"}]}`); None for another
/// shape.
pub(crate) fn listed_tags(body: &[u8]) -> super::Listed {
    let v: Value = serde_json::from_slice(body).ok()?;
    let models = v.get("models")?.as_array()?;
    let mut out = Vec::new();
    for m in models {
        for field in ["name", "model"] {
            if let Some(n) = m.get(field).and_then(Value::as_str)
                && !out.iter().any(|o| o == n)
            {
                out.push(n.to_string());
            }
        }
    }
    Some(out)
}

pub(crate) fn request_body(req: &ChatRequest) -> Value {
    let mut messages = Vec::with_capacity(2);
    if let Some(system) = &req.system {
        messages.push(json!({"role": "system", "content": &**system}));
    }
    messages.push(json!({"role": "user", "content": req.user}));
    let mut options = json!({"num_predict": req.max_tokens});
    if let Some(t) = req.temperature {
        options["temperature"] = json!(t);
    }
    let mut body = json!({
        "model": req.model,
        "messages": messages,
        "stream": false,
        "options": options,
    });
    if let Some((_, schema)) = req.response_schema.as_deref() {
        body["format"] = schema.clone();
    }
    body
}

#[derive(Deserialize)]
struct ChatBody {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    message: Option<Message>,
    #[serde(default)]
    done_reason: Option<String>,
    #[serde(default)]
    prompt_eval_count: Option<u64>,
    #[serde(default)]
    eval_count: Option<u64>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    content: Option<String>,
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
    let body: ChatBody = serde_json::from_slice(bytes).map_err(|e| {
        unusable(format!(
            "answer body is not an Ollama chat answer: {e}; body starts {}",
            preview(bytes)
        ))
    })?;
    if let Some(error) = body.error {
        // An error after generation started comes back with a 200.
        return Err(unusable(error));
    }
    let Some(message) = body.message else {
        return Err(unusable("answer has no message".into()));
    };
    let finish_reason = match body.done_reason.as_deref() {
        Some("stop") | None => FinishReason::Stop,
        Some("length") => FinishReason::Length,
        Some(other) => FinishReason::Other(other.to_string()),
    };
    let cap = |n: Option<u64>| n.unwrap_or(0).min(MAX_TOKENS_REPORTED);
    // prompt_eval_count is left out when the whole prompt came from the cache.
    let usage = (body.prompt_eval_count.is_some() || body.eval_count.is_some()).then(|| Usage {
        input_tokens: cap(body.prompt_eval_count),
        output_tokens: cap(body.eval_count),
        cached_input_tokens: 0,
        reasoning_tokens: 0,
    });
    Ok(ChatAnswer {
        content: message.content,
        refusal: None,
        finish_reason,
        usage,
        provider_request_id: None,
        model: body.model,
        headers,
        http_status: status,
        body: None,
    })
}

pub(crate) fn classify_error(status: u16, bytes: &[u8], headers: RateHeaders) -> ProviderError {
    #[derive(Deserialize)]
    struct ErrorBody {
        error: Value,
    }
    let message = serde_json::from_slice::<ErrorBody>(bytes)
        .ok()
        .map(|b| match b.error {
            Value::String(s) => s,
            // The OpenAI-compatible layer's shape, should a proxy send it.
            other => other
                .get("message")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| other.to_string()),
        })
        .unwrap_or_else(|| format!("body: {}", preview(bytes)));
    let class = match status {
        401 | 403 => ErrorClass::Auth,
        429 => ErrorClass::RateLimited,
        503 => ErrorClass::Overloaded,
        408 | 409 | 500..=599 => ErrorClass::Transient,
        _ => ErrorClass::Request,
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

    #[test]
    fn request_body_is_native_chat_without_streaming() {
        let req = ChatRequest {
            model: "llama3.2".into(),
            system: Some("sys".into()),
            user: "u".into(),
            max_tokens: 256,
            temperature: Some(0.0),
            response_schema: Some(std::sync::Arc::new((
                "verdict".into(),
                json!({"type":"object","properties":{"a":{"type":"integer"}}}),
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
                "model": "llama3.2",
                "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "u"}],
                "stream": false,
                "options": {"num_predict": 256, "temperature": 0.0},
                "format": {"type":"object","properties":{"a":{"type":"integer"}}}
            })
        );
    }

    #[test]
    fn parses_doc_shaped_answers() {
        let body = br#"{"model":"llama3.2","created_at":"2023-12-12T14:13:43.416799Z","message":{"role":"assistant","content":"{\"a\":1}"},
          "done":true,"done_reason":"stop","total_duration":5191566416,"load_duration":2154458,"prompt_eval_count":26,
          "prompt_eval_duration":383809000,"eval_count":298,"eval_duration":4799921000}"#;
        let a = parse_success(body, RateHeaders::default(), 200).unwrap();
        assert_eq!(a.content.as_deref(), Some("{\"a\":1}"));
        assert_eq!(a.finish_reason, FinishReason::Stop);
        assert_eq!(
            a.usage,
            Some(Usage {
                input_tokens: 26,
                output_tokens: 298,
                cached_input_tokens: 0,
                reasoning_tokens: 0
            })
        );
        let body = br#"{"model":"llama3.2","created_at":"x","message":{"role":"assistant","content":"{\"a\":"},"done":true,"done_reason":"length","eval_count":4}"#;
        let a = parse_success(body, RateHeaders::default(), 200).unwrap();
        assert_eq!(a.finish_reason, FinishReason::Length);
        assert_eq!(a.usage.unwrap().input_tokens, 0);
        let e = parse_success(
            br#"{"error":"an error was encountered while running the model"}"#,
            RateHeaders::default(),
            200,
        )
        .unwrap_err();
        assert_eq!(e.class, ErrorClass::Ambiguous);
    }

    #[test]
    fn classifies_ollama_errors() {
        let c = |s: u16, b: &str| classify_error(s, b.as_bytes(), RateHeaders::default());
        let e = c(
            404,
            r#"{"error":"model 'llama9' not found, try pulling it first"}"#,
        );
        assert_eq!(e.class, ErrorClass::Request);
        assert!(e.message.contains("try pulling it first"));
        assert_eq!(
            c(400, r#"{"error":"invalid format"}"#).class,
            ErrorClass::Request
        );
        assert_eq!(
            c(429, r#"{"error":"too many requests"}"#).class,
            ErrorClass::RateLimited
        );
        assert_eq!(
            c(
                503,
                r#"{"error":"server busy, please try again.  maximum pending requests exceeded"}"#
            )
            .class,
            ErrorClass::Overloaded
        );
        assert_eq!(c(500, r#"{"error":"boom"}"#).class, ErrorClass::Transient);
        assert_eq!(c(502, "bad gateway").class, ErrorClass::Transient);
    }
}
