//! Each provider adapter over real loopback HTTP against a tiny axum server
//! that records the request (method, path, query, headers, body) and answers
//! with a canned body shaped like the provider's published examples.
//!
//! Every adapter gets a canary key; no `ProviderError` may show it in its
//! Display or Debug output, even when the server echoes it back.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use docket::config::ProviderConfig;
use docket::provider::{
    AnthropicChat, ApiKey, AzureChat, ChatAnswer, ChatProvider, ChatRequest, ErrorClass,
    FinishReason, GeminiChat, OllamaChat, OpenRouterChat, ProviderError, Usage,
};
use serde_json::{Value, json};

const CANARY: &str = "canary-KEY-7f3a9c21e5";

#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    query: Option<String>,
    headers: HashMap<String, String>,
    body: Value,
}

#[derive(Clone)]
struct Canned {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: String,
    delay: Duration,
}

fn canned(status: u16, body: Value) -> Canned {
    Canned {
        status,
        headers: vec![("content-type", "application/json".into())],
        body: body.to_string(),
        delay: Duration::ZERO,
    }
}

impl Canned {
    fn header(mut self, name: &'static str, value: &str) -> Self {
        self.headers.push((name, value.to_string()));
        self
    }
}

#[derive(Clone)]
struct AppState {
    reply: Canned,
    seen: Arc<Mutex<Vec<Seen>>>,
}

async fn record(
    State(state): State<AppState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let seen = Seen {
        method: method.to_string(),
        path: uri.path().to_string(),
        query: uri.query().map(str::to_string),
        headers: headers
            .iter()
            .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
            .collect(),
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    };
    state.seen.lock().unwrap().push(seen);
    tokio::time::sleep(state.reply.delay).await;
    let mut response = (
        StatusCode::from_u16(state.reply.status).unwrap(),
        state.reply.body.clone(),
    )
        .into_response();
    for (k, v) in &state.reply.headers {
        response
            .headers_mut()
            .insert(*k, v.parse().expect("header value"));
    }
    response
}

struct Server {
    base: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Server {
    async fn start(reply: Canned) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let app = Router::new().fallback(record).with_state(AppState {
            reply,
            seen: seen.clone(),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            axum::serve(listener, app).await.ok();
        });
        Self {
            base: format!("http://{addr}"),
            seen,
        }
    }

    fn only(&self) -> Seen {
        let seen = self.seen.lock().unwrap();
        assert_eq!(seen.len(), 1, "one request expected: {seen:?}");
        seen[0].clone()
    }
}

fn key() -> ApiKey {
    ApiKey::new(CANARY)
}

fn request(model: &str) -> ChatRequest {
    ChatRequest {
        model: model.into(),
        system: Some("You are an adjudicator.".into()),
        user: "Is A the same as B?".into(),
        max_tokens: 300,
        temperature: Some(0.0),
        response_schema: Some(std::sync::Arc::new((
            "verdict".into(),
            json!({"type":"object","properties":{"same":{"type":"boolean"}},"required":["same"],"additionalProperties":false}),
        ))),
        structured_output: Default::default(),
        thinking_budget: None,
        client_request_id: "docket-req-1".into(),
        timeout: Duration::from_secs(5),
        body: None,
    }
}

/// The canary must not show anywhere a ProviderError is printed.
fn assert_no_key(e: &ProviderError) {
    let shown = format!("{e} {e:?}");
    assert!(!shown.contains(CANARY), "key leaked: {shown}");
    assert!(!shown.contains("7f3a9c21e5"), "key leaked: {shown}");
}

async fn fail(p: &dyn ChatProvider, req: &ChatRequest) -> ProviderError {
    let e = p.send(req).await.expect_err("an error");
    assert_no_key(&e);
    e
}

async fn ok(p: &dyn ChatProvider, req: &ChatRequest) -> ChatAnswer {
    p.send(req).await.expect("an answer")
}

fn openai_completion(content: &str, finish: &str) -> Value {
    json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1711652795, "model": "gpt-4o-mini-2024-07-18",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content, "refusal": null, "annotations": []},
                     "logprobs": null, "finish_reason": finish}],
        "usage": {"prompt_tokens": 24, "completion_tokens": 8, "total_tokens": 32,
                  "prompt_tokens_details": {"cached_tokens": 4, "audio_tokens": 0},
                  "completion_tokens_details": {"reasoning_tokens": 2, "audio_tokens": 0}}
    })
}

// ---------------------------------------------------------------- Azure

#[tokio::test]
async fn azure_sends_deployment_url_api_version_and_api_key_header() {
    let s = Server::start(
        canned(200, openai_completion("{\"same\":true}", "stop"))
            .header("x-request-id", "azure-req-9")
            .header("x-ratelimit-remaining-requests", "99")
            .header("x-ratelimit-remaining-tokens", "9000"),
    )
    .await;
    let p = AzureChat::new(&s.base, "2024-10-21", key()).unwrap();
    let a = ok(&p, &request("gpt4o-mini-prod")).await;
    let r = s.only();
    assert_eq!(r.method, "POST");
    assert_eq!(
        r.path,
        "/openai/deployments/gpt4o-mini-prod/chat/completions"
    );
    assert_eq!(r.query.as_deref(), Some("api-version=2024-10-21"));
    assert_eq!(r.headers.get("api-key").map(String::as_str), Some(CANARY));
    assert!(!r.headers.contains_key("authorization"));
    assert!(!r.query.unwrap().contains(CANARY));
    assert_eq!(r.body["messages"][0]["role"], "system");
    assert_eq!(r.body["messages"][1]["content"], "Is A the same as B?");
    assert_eq!(r.body["max_completion_tokens"], 300);
    assert_eq!(r.body["response_format"]["type"], "json_schema");
    assert_eq!(r.body["response_format"]["json_schema"]["name"], "verdict");
    assert_eq!(a.content.as_deref(), Some("{\"same\":true}"));
    assert_eq!(a.finish_reason, FinishReason::Stop);
    assert_eq!(
        a.usage,
        Some(Usage {
            input_tokens: 24,
            output_tokens: 8,
            cached_input_tokens: 4,
            reasoning_tokens: 2
        })
    );
    assert_eq!(a.provider_request_id.as_deref(), Some("azure-req-9"));
    assert_eq!(a.headers.remaining_requests, Some(99));
    assert_eq!(a.headers.remaining_tokens, Some(9000));
}

#[tokio::test]
async fn azure_429_is_rate_limited_with_retry_after() {
    let s = Server::start(
        canned(
            429,
            json!({"error": {"code": "429", "message": "Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-10-21 have exceeded token rate limit of your current OpenAI S0 pricing tier. Please retry after 6 seconds."}}),
        )
        .header("retry-after", "6")
        .header("retry-after-ms", "6000")
        .header("x-ratelimit-remaining-requests", "0"),
    )
    .await;
    let p = AzureChat::new(&s.base, "2024-10-21", key()).unwrap();
    let e = fail(&p, &request("dep")).await;
    assert_eq!(e.class, ErrorClass::RateLimited);
    assert_eq!(e.http_status, Some(429));
    assert_eq!(e.headers.retry_after, Some(Duration::from_secs(6)));
    assert_eq!(e.headers.remaining_requests, Some(0));
}

// ---------------------------------------------------------------- Anthropic

#[tokio::test]
async fn anthropic_sends_messages_with_key_and_version_headers() {
    let s = Server::start(
        canned(
            200,
            json!({
                "id": "msg_013Zva2CMHLNnXjNJJKqJ2EF", "type": "message", "role": "assistant",
                "model": "claude-sonnet-4-5-20250929",
                "content": [{"type": "text", "text": "{\"same\": true}"}],
                "stop_reason": "end_turn", "stop_sequence": null,
                "usage": {"input_tokens": 120, "output_tokens": 48,
                          "cache_creation_input_tokens": 0, "cache_read_input_tokens": 20,
                          "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
                          "service_tier": "standard"}
            }),
        )
        .header("request-id", "req_011CSHoEeqs5C35K2UUqR7Fy")
        .header("anthropic-ratelimit-requests-limit", "50")
        .header("anthropic-ratelimit-requests-remaining", "49")
        .header("anthropic-ratelimit-requests-reset", "2099-01-01T00:00:00Z")
        .header("anthropic-ratelimit-tokens-limit", "40000")
        .header("anthropic-ratelimit-tokens-remaining", "39000"),
    )
    .await;
    let p = AnthropicChat::new(&s.base, key()).unwrap();
    let a = ok(&p, &request("claude-sonnet-4-5")).await;
    let r = s.only();
    assert_eq!(
        (r.method.as_str(), r.path.as_str()),
        ("POST", "/v1/messages")
    );
    assert_eq!(r.query, None);
    assert_eq!(r.headers.get("x-api-key").map(String::as_str), Some(CANARY));
    assert_eq!(
        r.headers.get("anthropic-version").map(String::as_str),
        Some("2023-06-01")
    );
    assert!(!r.headers.contains_key("authorization"));
    assert_eq!(r.body["model"], "claude-sonnet-4-5");
    assert_eq!(r.body["max_tokens"], 300);
    assert_eq!(
        r.body["messages"],
        json!([{"role": "user", "content": "Is A the same as B?"}])
    );
    assert_eq!(r.body["temperature"], 0.0);
    // Sonnet 4.5 takes structured outputs: the schema is a parameter (GA:
    // no beta header), and nothing had to be taken out of it, so the system
    // prompt is the stage's own.
    assert_eq!(r.body["system"], "You are an adjudicator.");
    assert_eq!(
        r.body["output_config"],
        json!({"format": {"type": "json_schema", "schema":
            {"type":"object","properties":{"same":{"type":"boolean"}},"required":["same"],"additionalProperties":false}}})
    );
    assert!(!r.headers.contains_key("anthropic-beta"));
    assert_eq!(a.content.as_deref(), Some("{\"same\": true}"));
    assert_eq!(a.finish_reason, FinishReason::Stop);
    assert_eq!(
        a.usage,
        Some(Usage {
            input_tokens: 140,
            output_tokens: 48,
            cached_input_tokens: 20,
            reasoning_tokens: 0
        })
    );
    assert_eq!(
        a.provider_request_id.as_deref(),
        Some("req_011CSHoEeqs5C35K2UUqR7Fy")
    );
    assert_eq!(a.headers.limit_requests, Some(50));
    assert_eq!(a.headers.remaining_tokens, Some(39_000));
    // Capped at an hour, however far away the reset is.
    assert_eq!(a.headers.reset_requests, Some(Duration::from_secs(3600)));
}

/// An older model, or a stage set to `prompt`, gets the schema in the
/// system prompt and no `output_config`; the constraints a structured-outputs
/// model cannot take are said in its system prompt instead.
#[tokio::test]
async fn anthropic_schema_goes_where_the_model_takes_it() {
    let answer = json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
        "content": [{"type": "text", "text": "{}"}], "stop_reason": "end_turn", "stop_sequence": null,
        "usage": {"input_tokens": 1, "output_tokens": 1}});
    let s = Server::start(canned(200, answer.clone())).await;
    let p = AnthropicChat::new(&s.base, key()).unwrap();
    ok(&p, &request("claude-3-7-sonnet-20250219")).await;
    let r = s.only();
    assert!(r.body.get("output_config").is_none());
    let system = r.body["system"].as_str().unwrap();
    assert!(
        system.contains("\"additionalProperties\":false"),
        "{system}"
    );

    let s = Server::start(canned(200, answer)).await;
    let p = AnthropicChat::new(&s.base, key()).unwrap();
    let mut req = request("claude-haiku-4-5");
    req.response_schema = Some(std::sync::Arc::new((
        "verdict".into(),
        json!({"type":"object","properties":{"confidence":{"type":"number","minimum":0,"maximum":1}}}),
    )));
    ok(&p, &req).await;
    let r = s.only();
    let schema = &r.body["output_config"]["format"]["schema"];
    assert_eq!(
        schema["properties"]["confidence"],
        json!({"type": "number"})
    );
    assert_eq!(schema["additionalProperties"], false);
    let system = r.body["system"].as_str().unwrap();
    assert!(
        system.contains("/properties/confidence: minimum 0"),
        "{system}"
    );
}

#[tokio::test]
async fn anthropic_max_tokens_is_truncation() {
    let s = Server::start(canned(
        200,
        json!({"id": "msg_2", "type": "message", "role": "assistant", "model": "claude-haiku-4-5",
               "content": [{"type": "text", "text": "{\"same\": tr"}],
               "stop_reason": "max_tokens", "stop_sequence": null,
               "usage": {"input_tokens": 10, "output_tokens": 300}}),
    ))
    .await;
    let p = AnthropicChat::new(&s.base, key()).unwrap();
    let a = ok(&p, &request("claude-haiku-4-5")).await;
    assert_eq!(a.finish_reason, FinishReason::Length);
}

#[tokio::test]
async fn anthropic_429_529_and_credit_400() {
    let err = |kind: &str, msg: &str| json!({"type": "error", "error": {"type": kind, "message": msg}, "request_id": "req_011"});
    let s = Server::start(
        canned(
            429,
            err(
                "rate_limit_error",
                "This request would exceed the rate limit for your organization",
            ),
        )
        .header("retry-after", "17")
        .header("anthropic-ratelimit-requests-remaining", "0"),
    )
    .await;
    let p = AnthropicChat::new(&s.base, key()).unwrap();
    let e = fail(&p, &request("claude-haiku-4-5")).await;
    assert_eq!(e.class, ErrorClass::RateLimited);
    assert_eq!(e.headers.retry_after, Some(Duration::from_secs(17)));
    assert_eq!(e.headers.remaining_requests, Some(0));

    let s = Server::start(canned(529, err("overloaded_error", "Overloaded"))).await;
    let p = AnthropicChat::new(&s.base, key()).unwrap();
    let e = fail(&p, &request("claude-haiku-4-5")).await;
    assert_eq!(e.class, ErrorClass::Overloaded);
    assert!(e.class.is_retryable());

    let s = Server::start(canned(
        400,
        err(
            "invalid_request_error",
            "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits.",
        ),
    ))
    .await;
    let p = AnthropicChat::new(&s.base, key()).unwrap();
    let e = fail(&p, &request("claude-haiku-4-5")).await;
    assert_eq!(e.class, ErrorClass::Quota);
    assert!(e.class.stops_session());

    // A server that echoes the key back: the error must not carry it.
    let s = Server::start(canned(
        401,
        err(
            "authentication_error",
            &format!("invalid x-api-key: {CANARY}"),
        ),
    ))
    .await;
    let p = AnthropicChat::new(&s.base, key()).unwrap();
    let e = fail(&p, &request("claude-haiku-4-5")).await;
    assert_eq!(e.class, ErrorClass::Auth);
    assert!(e.message.contains("[redacted]"), "{}", e.message);
}

#[tokio::test]
async fn a_timeout_after_sending_is_ambiguous() {
    let mut reply = canned(200, json!({}));
    reply.delay = Duration::from_secs(3);
    let s = Server::start(reply).await;
    let p = AnthropicChat::new(&s.base, key()).unwrap();
    let mut req = request("claude-haiku-4-5");
    req.timeout = Duration::from_millis(200);
    let e = fail(&p, &req).await;
    assert_eq!(e.class, ErrorClass::Ambiguous);
    // Nothing listening: nothing was sent, safe to resend.
    let p = GeminiChat::new("http://127.0.0.1:9", key()).unwrap();
    let e = fail(&p, &request("gemini-2.5-flash")).await;
    assert_eq!(e.class, ErrorClass::Transient);
}

// ---------------------------------------------------------------- Gemini

#[tokio::test]
async fn gemini_sends_the_key_in_a_header_never_the_url() {
    let s = Server::start(canned(
        200,
        json!({
            "candidates": [{"content": {"role": "model", "parts": [{"text": "{\"same\": false}"}]},
                            "finishReason": "STOP", "index": 0, "safetyRatings": []}],
            "usageMetadata": {"promptTokenCount": 50, "candidatesTokenCount": 20, "totalTokenCount": 70,
                              "cachedContentTokenCount": 0, "thoughtsTokenCount": 0},
            "modelVersion": "gemini-2.5-flash", "responseId": "mNgYaP7oKdbR"
        }),
    ))
    .await;
    let p = GeminiChat::new(&s.base, key()).unwrap();
    let a = ok(&p, &request("gemini-2.5-flash")).await;
    let r = s.only();
    assert_eq!(r.method, "POST");
    assert_eq!(r.path, "/v1beta/models/gemini-2.5-flash:generateContent");
    assert_eq!(r.query, None, "no ?key= in the URL");
    assert!(!r.path.contains(CANARY));
    assert_eq!(
        r.headers.get("x-goog-api-key").map(String::as_str),
        Some(CANARY)
    );
    assert!(!r.headers.contains_key("authorization"));
    assert_eq!(
        r.body["contents"],
        json!([{"role": "user", "parts": [{"text": "Is A the same as B?"}]}])
    );
    assert_eq!(
        r.body["systemInstruction"],
        json!({"parts": [{"text": "You are an adjudicator."}]})
    );
    let g = &r.body["generationConfig"];
    // 2.5 Flash thinks within maxOutputTokens: the default budget is sent
    // and added to the limit, so the answer keeps its 300.
    assert_eq!(g["thinkingConfig"], json!({"thinkingBudget": 1024}));
    assert_eq!(g["maxOutputTokens"], 300 + 1024);
    assert_eq!(g["temperature"], 0.0);
    assert_eq!(g["responseMimeType"], "application/json");
    assert_eq!(g["responseJsonSchema"]["required"], json!(["same"]));
    assert_eq!(a.content.as_deref(), Some("{\"same\": false}"));
    assert_eq!(a.finish_reason, FinishReason::Stop);
    assert_eq!(a.usage.unwrap().input_tokens, 50);
    assert_eq!(a.usage.unwrap().output_tokens, 20);
    assert_eq!(a.provider_request_id.as_deref(), Some("mNgYaP7oKdbR"));
}

#[tokio::test]
async fn gemini_429_reads_retry_delay_from_the_body() {
    let s = Server::start(canned(
        429,
        json!({"error": {"code": 429,
            "message": "You exceeded your current quota, please check your plan and billing details.",
            "status": "RESOURCE_EXHAUSTED",
            "details": [
                {"@type": "type.googleapis.com/google.rpc.QuotaFailure",
                 "violations": [{"quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
                                 "quotaId": "GenerateRequestsPerMinutePerProjectPerModel-FreeTier",
                                 "quotaDimensions": {"location": "global", "model": "gemini-2.5-flash"}, "quotaValue": "10"}]},
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "17s"}
            ]}}),
    ))
    .await;
    let p = GeminiChat::new(&s.base, key()).unwrap();
    let e = fail(&p, &request("gemini-2.5-flash")).await;
    assert_eq!(e.class, ErrorClass::RateLimited);
    assert_eq!(e.headers.retry_after, Some(Duration::from_secs(17)));

    // A bad key (echoed back by the server) is Auth, and never shown.
    let s = Server::start(canned(
        400,
        json!({"error": {"code": 400, "message": format!("API key not valid: {CANARY}. Please pass a valid API key."),
            "status": "INVALID_ARGUMENT",
            "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID",
                         "domain": "googleapis.com", "metadata": {"service": "generativelanguage.googleapis.com"}}]}}),
    ))
    .await;
    let p = GeminiChat::new(&s.base, key()).unwrap();
    let e = fail(&p, &request("gemini-2.5-flash")).await;
    assert_eq!(e.class, ErrorClass::Auth);
}

#[tokio::test]
async fn gemini_max_tokens_is_truncation() {
    let s = Server::start(canned(
        200,
        json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "{\"same\""}]},
                               "finishReason": "MAX_TOKENS", "index": 0}],
               "usageMetadata": {"promptTokenCount": 5, "candidatesTokenCount": 300, "totalTokenCount": 305}}),
    ))
    .await;
    let p = GeminiChat::new(&s.base, key()).unwrap();
    assert_eq!(
        ok(&p, &request("gemini-2.5-flash")).await.finish_reason,
        FinishReason::Length
    );
}

// ---------------------------------------------------------------- Ollama

#[tokio::test]
async fn ollama_needs_no_key_and_never_streams() {
    let s = Server::start(canned(
        200,
        json!({"model": "llama3.2", "created_at": "2023-12-12T14:13:43.416799Z",
               "message": {"role": "assistant", "content": "{\"same\": true}"},
               "done": true, "done_reason": "length",
               "total_duration": 5191566416u64, "load_duration": 2154458, "prompt_eval_count": 26,
               "prompt_eval_duration": 383809000, "eval_count": 298, "eval_duration": 4799921000u64}),
    ))
    .await;
    // Through the registry, as the engine builds it: no key configured.
    let cfg: ProviderConfig = toml::from_str("kind = \"ollama\"\nmodel = \"llama3.2\"\n").unwrap();
    let p = docket::provider::build("local", &cfg, Some(&s.base)).unwrap();
    assert_eq!(p.name(), "ollama");
    let a = ok(p.as_ref(), &request("llama3.2")).await;
    let r = s.only();
    assert_eq!((r.method.as_str(), r.path.as_str()), ("POST", "/api/chat"));
    assert!(!r.headers.contains_key("authorization"));
    assert_eq!(r.body["stream"], false);
    assert_eq!(r.body["model"], "llama3.2");
    assert_eq!(r.body["options"]["num_predict"], 300);
    assert_eq!(r.body["format"]["required"], json!(["same"]));
    assert_eq!(r.body["messages"][0]["role"], "system");
    assert_eq!(a.finish_reason, FinishReason::Length);
    assert_eq!(
        a.usage,
        Some(Usage {
            input_tokens: 26,
            output_tokens: 298,
            cached_input_tokens: 0,
            reasoning_tokens: 0
        })
    );

    let s = Server::start(canned(
        404,
        json!({"error": "model 'llama9' not found, try pulling it first"}),
    ))
    .await;
    let p = OllamaChat::new(&s.base, None).unwrap();
    let e = fail(&p, &request("llama9")).await;
    assert_eq!(e.class, ErrorClass::Request);
    assert!(e.message.contains("not found"));
}

// ---------------------------------------------------------------- OpenAI kinds

#[tokio::test]
async fn the_output_limit_goes_under_the_name_each_kind_reads() {
    // OpenAI proper (and the built-in mock, which mimics it) take
    // max_completion_tokens; compatible servers (Ollama's /v1, vLLM) read
    // only max_tokens.
    for (kind, want, other) in [
        ("openai", "max_completion_tokens", "max_tokens"),
        ("mock", "max_completion_tokens", "max_tokens"),
        ("openai_compatible", "max_tokens", "max_completion_tokens"),
    ] {
        let s = Server::start(canned(200, openai_completion("{\"same\":true}", "stop"))).await;
        let cfg: ProviderConfig = toml::from_str(&format!(
            "kind = \"{kind}\"\nmodel = \"m\"\nbase_url = \"{}/v1\"\n",
            s.base
        ))
        .unwrap();
        let p = docket::provider::build("p", &cfg, None).unwrap();
        let a = ok(p.as_ref(), &request("m")).await;
        assert_eq!(a.finish_reason, FinishReason::Stop);
        let r = s.only();
        assert_eq!(r.path, "/v1/chat/completions", "{kind}");
        assert_eq!(r.body[want], 300, "{kind}: {}", r.body);
        assert!(r.body.get(other).is_none(), "{kind}: {}", r.body);
        assert_eq!(r.body["response_format"]["type"], "json_schema", "{kind}");
    }
}

// ---------------------------------------------------------------- OpenRouter

#[tokio::test]
async fn openrouter_sends_bearer_and_attribution() {
    let mut body = openai_completion("{\"same\":true}", "stop");
    body["id"] = json!("gen-1737-abc");
    body["provider"] = json!("OpenAI");
    body["usage"]["cost"] = json!(0.000012);
    let s = Server::start(canned(200, body)).await;
    let p = OpenRouterChat::new(&format!("{}/api/v1", s.base), key())
        .unwrap()
        .with_attribution(Some("https://example.org/docket"), Some("docket"));
    let a = ok(&p, &request("openai/gpt-4o-mini")).await;
    let r = s.only();
    assert_eq!(r.path, "/api/v1/chat/completions");
    assert_eq!(
        r.headers.get("authorization").map(String::as_str),
        Some(format!("Bearer {CANARY}").as_str())
    );
    assert_eq!(
        r.headers.get("http-referer").map(String::as_str),
        Some("https://example.org/docket")
    );
    assert_eq!(r.headers.get("x-title").map(String::as_str), Some("docket"));
    assert_eq!(r.body["model"], "openai/gpt-4o-mini");
    assert_eq!(r.body["max_tokens"], 300);
    assert!(r.body.get("max_completion_tokens").is_none());
    assert_eq!(r.body["response_format"]["type"], "json_schema");
    // Never routed to an upstream that would ignore the schema.
    assert_eq!(r.body["provider"], json!({"require_parameters": true}));
    assert_eq!(a.content.as_deref(), Some("{\"same\":true}"));
    assert_eq!(a.provider_request_id.as_deref(), Some("gen-1737-abc"));
}

#[tokio::test]
async fn openrouter_failed_generation_in_a_200_is_transient() {
    // finish_reason "error" with the choice's own error object (the key
    // echoed in it, to check the scrub).
    let mut body = openai_completion("{\"same\":", "error");
    body["id"] = json!("gen-err-1");
    body["choices"][0]["native_finish_reason"] = json!("error");
    body["choices"][0]["error"] = json!({"code": 502,
        "message": format!("Upstream provider crashed (key {CANARY})"),
        "metadata": {"provider_name": "Together"}});
    let s = Server::start(canned(200, body)).await;
    let p = OpenRouterChat::new(&s.base, key()).unwrap();
    let e = fail(&p, &request("openai/gpt-4o-mini")).await;
    assert_eq!(e.class, ErrorClass::Transient);
    assert!(e.class.is_retryable());
    assert_eq!(e.http_status, Some(200));
    assert!(e.message.contains("Upstream provider crashed"), "{e}");

    // finish_reason "error" alone: still a failure, not an answer.
    let body = openai_completion("", "error");
    let s = Server::start(canned(200, body)).await;
    let p = OpenRouterChat::new(&s.base, key()).unwrap();
    let e = fail(&p, &request("openai/gpt-4o-mini")).await;
    assert_eq!(e.class, ErrorClass::Transient);

    // A top-level error in a 200 whose code would fail the item on a 400.
    let s = Server::start(canned(
        200,
        json!({"error": {"code": 400, "message": "stream broke mid-generation"}}),
    ))
    .await;
    let p = OpenRouterChat::new(&s.base, key()).unwrap();
    let e = fail(&p, &request("openai/gpt-4o-mini")).await;
    assert_eq!(e.class, ErrorClass::Transient);
    assert!(e.message.contains("stream broke"));
}

#[tokio::test]
async fn openrouter_402_is_quota_and_429_rate_limited() {
    let s = Server::start(canned(
        402,
        json!({"error": {"code": 402, "message": "Insufficient credits. Add more using https://openrouter.ai/credits",
                         "metadata": {"limit_source": "openrouter_credits"}}}),
    ))
    .await;
    let p = OpenRouterChat::new(&s.base, key()).unwrap();
    let e = fail(&p, &request("openai/gpt-4o-mini")).await;
    assert_eq!(e.class, ErrorClass::Quota);
    assert!(e.class.stops_session());

    let s = Server::start(
        canned(
            429,
            json!({"error": {"code": 429, "message": "Rate limit exceeded: free-models-per-min"}}),
        )
        .header("retry-after", "12"),
    )
    .await;
    let p = OpenRouterChat::new(&s.base, key()).unwrap();
    let e = fail(&p, &request("openai/gpt-4o-mini")).await;
    assert_eq!(e.class, ErrorClass::RateLimited);
    assert_eq!(e.headers.retry_after, Some(Duration::from_secs(12)));

    // An error inside a 200 (generation failed after it started).
    let s = Server::start(canned(
        200,
        json!({"error": {"code": 502, "message": format!("upstream error for key {CANARY}")}}),
    ))
    .await;
    let p = OpenRouterChat::new(&s.base, key()).unwrap();
    let e = fail(&p, &request("openai/gpt-4o-mini")).await;
    assert_eq!(e.class, ErrorClass::Transient);
}

#[tokio::test]
async fn no_adapter_debug_or_error_shows_the_key() {
    // Garbage bodies and refusals from every adapter, all with the canary key.
    let s = Server::start(canned(500, json!({"error": {"message": CANARY}}))).await;
    let adapters: Vec<Box<dyn ChatProvider>> = vec![
        Box::new(AzureChat::new(&s.base, "2024-10-21", key()).unwrap()),
        Box::new(AnthropicChat::new(&s.base, key()).unwrap()),
        Box::new(GeminiChat::new(&s.base, key()).unwrap()),
        Box::new(OllamaChat::new(&s.base, Some(key())).unwrap()),
        Box::new(OpenRouterChat::new(&s.base, key()).unwrap()),
    ];
    for p in &adapters {
        let e = fail(p.as_ref(), &request("m")).await;
        assert_eq!(e.class, ErrorClass::Transient, "{}", p.name());
    }
    assert_eq!(format!("{:?}", key()), "ApiKey(***)");
}
