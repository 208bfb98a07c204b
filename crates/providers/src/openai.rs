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
    pub fn new(label: &str, base_url: &str, key: Option<ApiKey>) -> Result<Self, String> {
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
        let mut body = request_body(req);
        if self.legacy_max_tokens {
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
            return parse_success(&raw.bytes, headers, provider_request_id, raw.status);
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
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn parses_a_spec_shaped_completion() {
        let body = br#"{"id":"chatcmpl-1","object":"chat.completion","created":1711652795,"model":"gpt-4o-mini-2024-07-18",
          "choices":[{"index":0,"message":{"role":"assistant","content":"{\"a\":1}","refusal":null,"annotations":[]},"logprobs":null,"finish_reason":"length"}],
          "usage":{"prompt_tokens":24,"completion_tokens":8,"total_tokens":32,"prompt_tokens_details":{"cached_tokens":4,"audio_tokens":0},
                   "completion_tokens_details":{"reasoning_tokens":2,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},
          "service_tier":"default","system_fingerprint":"fp_x"}"#;
        let a = parse_success(body, RateHeaders::default(), None, 200).unwrap();
        assert_eq!(a.finish_reason, FinishReason::Length);
        assert_eq!(a.content.as_deref(), Some("{\"a\":1}"));
        assert_eq!(
            a.usage,
            Some(Usage {
                input_tokens: 24,
                output_tokens: 8,
                cached_input_tokens: 4,
                reasoning_tokens: 2
            })
        );
        assert_eq!(a.provider_request_id.as_deref(), Some("chatcmpl-1"));
    }

    #[test]
    fn usage_and_details_may_be_missing() {
        let body = br#"{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"logprobs":null,"finish_reason":"stop"}]}"#;
        let a = parse_success(body, RateHeaders::default(), None, 200).unwrap();
        assert_eq!(a.usage, None);
        let body = br#"{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}"#;
        let a = parse_success(body, RateHeaders::default(), None, 200).unwrap();
        assert_eq!(a.usage.unwrap().cached_input_tokens, 0);
    }

    #[test]
    fn a_garbage_2xx_is_ambiguous_not_a_panic() {
        let e = parse_success(
            b"{\"id\":\"chatcmpl-x\",\"object\":\"chat.compl",
            RateHeaders::default(),
            None,
            200,
        )
        .unwrap_err();
        assert_eq!(e.class, ErrorClass::Ambiguous);
        let e = parse_success(b"{\"choices\":[]}", RateHeaders::default(), None, 200).unwrap_err();
        assert_eq!(e.class, ErrorClass::Ambiguous);
    }

    #[test]
    fn classifies_openai_error_bodies() {
        let c =
            |status, body: &str| classify_error(status, body.as_bytes(), RateHeaders::default());
        let e = c(
            401,
            r#"{"error":{"message":"Incorrect API key provided: sk-abc12***. You can find your API key at x.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#,
        );
        assert_eq!(e.class, ErrorClass::Auth);
        assert!(!e.message.contains("sk-abc"), "{}", e.message);
        let e = c(
            429,
            r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#,
        );
        assert_eq!(e.class, ErrorClass::Quota);
        let e = c(
            429,
            r#"{"error":{"message":"You have no credits remaining.","type":"x","param":null,"code":"credit_balance_exhausted"}}"#,
        );
        assert_eq!(e.class, ErrorClass::Quota);
        let e = c(
            429,
            r#"{"error":{"message":"Rate limit reached for gpt-4o-mini on requests per min (RPM): Limit 3, Used 3, Requested 1.","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#,
        );
        assert_eq!(e.class, ErrorClass::RateLimited);
        let e = c(
            429,
            r#"{"error":{"message":"Request too large for gpt-4o on tokens per min (TPM): Limit 30000, Requested 50000.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}"#,
        );
        assert_eq!(e.class, ErrorClass::Request);
        assert_eq!(
            c(
                500,
                r#"{"error":{"message":"boom","type":"server_error","param":null,"code":null}}"#
            )
            .class,
            ErrorClass::Transient
        );
        assert_eq!(c(503, "Service Unavailable").class, ErrorClass::Overloaded);
        let e = c(
            400,
            r#"{"error":{"message":"maximum context length","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
        );
        assert_eq!(e.class, ErrorClass::Request);
        assert!(e.message.contains("context_length_exceeded"));
    }

    #[test]
    fn reads_rate_limit_headers() {
        let mut h = HeaderMap::new();
        h.insert(
            "x-ratelimit-limit-requests",
            HeaderValue::from_static("6000"),
        );
        h.insert(
            "x-ratelimit-remaining-requests",
            HeaderValue::from_static("0"),
        );
        h.insert(
            "x-ratelimit-reset-requests",
            HeaderValue::from_static("1m30.5s"),
        );
        h.insert("retry-after", HeaderValue::from_static("2"));
        let r = rate_headers(&h);
        assert_eq!(r.limit_requests, Some(6000));
        assert_eq!(r.remaining_requests, Some(0));
        assert_eq!(
            r.reset_requests,
            Some(std::time::Duration::from_millis(90_500))
        );
        assert_eq!(r.retry_after, Some(std::time::Duration::from_secs(2)));
        // Row S1: an HTTP date, 30 s from now.
        let date = (chrono::Utc::now() + chrono::Duration::seconds(30))
            .format("%a, %d %b %Y %H:%M:%S GMT")
            .to_string();
        h.insert("retry-after", HeaderValue::from_str(&date).unwrap());
        let wait = rate_headers(&h).retry_after.expect("a date is a hint");
        assert!((28..=30).contains(&wait.as_secs()), "{wait:?} for {date}");
        h.insert("retry-after", HeaderValue::from_static("2"));
        h.insert("retry-after-ms", HeaderValue::from_static("250"));
        assert_eq!(
            rate_headers(&h).retry_after,
            Some(std::time::Duration::from_millis(250))
        );
    }

    #[test]
    fn request_body_uses_structured_output() {
        let req = ChatRequest {
            model: "gpt-4o-mini".into(),
            system: Some("sys".into()),
            user: "u".into(),
            max_tokens: 100,
            temperature: Some(0.0),
            response_schema: Some(std::sync::Arc::new((
                "verdict".into(),
                json!({"type":"object"}),
            ))),
            client_request_id: "r1".into(),
            timeout: std::time::Duration::from_secs(1),
        };
        let b = request_body(&req);
        assert_eq!(b["messages"][0]["role"], "system");
        assert_eq!(b["messages"][1]["content"], "u");
        assert_eq!(b["response_format"]["type"], "json_schema");
        assert_eq!(b["response_format"]["json_schema"]["strict"], true);
        // Optional properties (criteria an answer may leave out): not strict.
        assert!(!strict_ok(
            &json!({"type":"object","properties":{"a":{"type":"string"},"b":{"type":"string"}},
            "required":["a"],"additionalProperties":false})
        ));
        assert!(strict_ok(
            &json!({"type":"object","properties":{"a":{"type":"object","properties":{"x":{"type":"number"}},
            "required":["x"],"additionalProperties":false}},"required":["a"],"additionalProperties":false})
        ));
        assert_eq!(b["max_completion_tokens"], 100);
        assert!(b.get("max_tokens").is_none());
        let mut b = b;
        use_max_tokens(&mut b);
        assert_eq!(b["max_tokens"], 100);
        assert!(b.get("max_completion_tokens").is_none());
    }

    #[test]
    fn nonsense_numbers_from_the_server_never_panic() {
        let body = format!(
            r#"{{"id":"x","model":"m","choices":[{{"index":0,"message":{{"role":"assistant","content":"hi"}},"finish_reason":"stop"}}],"usage":{{"prompt_tokens":{m},"completion_tokens":{m},"prompt_tokens_details":{{"cached_tokens":{m}}},"completion_tokens_details":{{"reasoning_tokens":{m}}}}}}}"#,
            m = u64::MAX
        );
        let u = parse_success(body.as_bytes(), RateHeaders::default(), None, 200)
            .unwrap()
            .usage
            .unwrap();
        assert_eq!(u.input_tokens, MAX_TOKENS_REPORTED);
        assert_eq!(u.reasoning_tokens, MAX_TOKENS_REPORTED);
        for n in ["1e30", "-1", "18446744073709551616"] {
            let body = format!(
                r#"{{"choices":[{{"message":{{"content":"hi"}}}}],"usage":{{"prompt_tokens":{n}}}}}"#
            );
            let e = parse_success(body.as_bytes(), RateHeaders::default(), None, 200).unwrap_err();
            assert_eq!(e.class, ErrorClass::Ambiguous, "{n}");
        }
        let hour = std::time::Duration::from_secs(3600);
        for (ms, after, want) in [
            ("1e300", "", Some(hour)),
            ("NaN", "1e30", Some(hour)),
            ("-5", "-5", None),
            ("inf", "inf", None),
        ] {
            let mut h = HeaderMap::new();
            h.insert("retry-after-ms", HeaderValue::from_str(ms).unwrap());
            if !after.is_empty() {
                h.insert("retry-after", HeaderValue::from_str(after).unwrap());
            }
            h.insert(
                "x-ratelimit-reset-requests",
                HeaderValue::from_static("99999999999999999999999h"),
            );
            h.insert(
                "x-ratelimit-limit-requests",
                HeaderValue::from_static("99999999999999999999999"),
            );
            let r = rate_headers(&h);
            assert_eq!(r.retry_after, want, "{ms} / {after}");
            assert_eq!(r.limit_requests, None);
            assert_eq!(
                r.reset_requests,
                Some(std::time::Duration::from_secs(86_400))
            );
        }
    }

    #[test]
    fn redacts_key_shaped_words() {
        assert_eq!(
            redact("bad key sk-abc123*** given"),
            "bad key [redacted] given"
        );
        assert_eq!(
            redact("key \"sk-abc123\"\nsk_live_99x: no"),
            "key \"[redacted]\"\n[redacted]: no"
        );
    }
}
