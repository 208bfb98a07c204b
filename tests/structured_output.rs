//! Each provider's own structured output against the built-in mock, over
//! real loopback HTTP: Anthropic's `output_config.format` (the mock checks
//! it as the API does), Gemini 2.5's thinking budget (the mock counts
//! thinking against `maxOutputTokens`) and OpenRouter's
//! `provider.require_parameters`.

use std::time::Duration;

use docket::mock::{MockConfig, MockServer};
use docket::provider::{
    AnthropicChat, ApiKey, ChatProvider, ChatRequest, FinishReason, GeminiChat, OpenRouterChat,
    StructuredOutput,
};
use serde_json::{Value, json};

async fn mock() -> (MockServer, String) {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let m = MockServer::start(MockConfig::default(), addr)
        .await
        .expect("mock");
    let base = m
        .base_url()
        .trim_end_matches('/')
        .trim_end_matches("/v1")
        .to_string();
    (m, base)
}

fn key() -> ApiKey {
    ApiKey::new("test-key-0123456789")
}

/// A schema with the numeric and length limits Anthropic's parameter refuses.
fn verdict_schema() -> Value {
    json!({"type": "object",
        "properties": {
            "label": {"type": "string", "enum": ["same", "different"], "minLength": 1},
            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
            "score": {"type": "integer", "minimum": 90, "maximum": 99}
        },
        "required": ["label", "confidence", "score"]})
}

fn request(model: &str, max_tokens: u64) -> ChatRequest {
    ChatRequest {
        model: model.into(),
        system: Some("You are an adjudicator.".into()),
        user: "Is A the same as B?".into(),
        max_tokens,
        temperature: Some(0.0),
        response_schema: Some(std::sync::Arc::new(("verdict".into(), verdict_schema()))),
        structured_output: StructuredOutput::Auto,
        thinking_budget: None,
        body: None,
        client_request_id: "docket-req-1".into(),
        timeout: Duration::from_secs(10),
    }
}

fn valid_verdict(content: Option<&str>) {
    let v: Value = serde_json::from_str(content.expect("content")).expect("JSON answer");
    assert!(
        matches!(v["label"].as_str(), Some("same" | "different")),
        "{v}"
    );
    assert!(v["confidence"].is_number(), "{v}");
    // Anthropic's parameter cannot carry the range: docket says it in the
    // system prompt, and the mock's model keeps to it as told.
    let score = v["score"].as_i64().expect("an integer score");
    assert!((90..=99).contains(&score), "{v}");
}

async fn post(url: &str, headers: &[(&str, &str)], body: Value) -> (u16, Value) {
    let mut b = reqwest::Client::new().post(url).json(&body);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let r = b.send().await.expect("sent");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// docket's fitted schema passes the mock's check and is answered against;
/// the unfitted schema, or another format type, is the API's 400 naming why.
#[tokio::test]
async fn anthropic_output_config_is_checked_and_answered() {
    let (_m, base) = mock().await;
    let p = AnthropicChat::new(&base, key()).unwrap();
    for model in ["claude-haiku-4-5", "claude-3-7-sonnet-20250219"] {
        let a = p.send(&request(model, 400)).await.expect("an answer");
        assert_eq!(a.finish_reason, FinishReason::Stop, "{model}");
        valid_verdict(a.content.as_deref());
    }
    let url = format!("{base}/v1/messages");
    let headers = [("x-api-key", "k"), ("anthropic-version", "2023-06-01")];
    let body = |format: Value| {
        json!({"model": "claude-haiku-4-5", "max_tokens": 100,
               "messages": [{"role": "user", "content": "x"}], "output_config": {"format": format}})
    };
    let (status, e) = post(
        &url,
        &headers,
        body(json!({"type": "json_schema", "schema": verdict_schema()})),
    )
    .await;
    assert_eq!(status, 400, "{e}");
    assert_eq!(e["error"]["type"], "invalid_request_error");
    let msg = e["error"]["message"].as_str().unwrap_or("");
    assert!(
        msg.contains("not supported") && msg.contains("/properties/"),
        "{msg}"
    );
    let (status, e) = post(&url, &headers, body(json!({"type": "json_object"}))).await;
    assert_eq!(status, 400, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("json_schema"),
        "{e}"
    );
}

/// The default budget is added to the output limit: the answer is whole and
/// the thinking is reported. Dynamic thinking (-1) shares max_tokens and
/// the mock's 2.5 Flash spends it all thinking: cut off, as the real API
/// does. A budget outside the model's range is a 400.
#[tokio::test]
async fn gemini_thinking_budget_keeps_the_answer_whole() {
    let (_m, base) = mock().await;
    let p = GeminiChat::new(&base, key()).unwrap();
    let a = p
        .send(&request("gemini-2.5-flash", 300))
        .await
        .expect("an answer");
    assert_eq!(a.finish_reason, FinishReason::Stop);
    valid_verdict(a.content.as_deref());
    let usage = a.usage.expect("usage");
    assert_eq!(usage.reasoning_tokens, 1024);
    assert!(usage.output_tokens > 1024, "{usage:?}");

    let mut dynamic = request("gemini-2.5-flash", 300);
    dynamic.thinking_budget = Some(-1);
    let a = p.send(&dynamic).await.expect("an answer");
    assert_eq!(a.finish_reason, FinishReason::Length);

    let mut pro_off = request("gemini-2.5-pro", 300);
    pro_off.thinking_budget = Some(0);
    let e = p
        .send(&pro_off)
        .await
        .expect_err("Pro cannot turn thinking off");
    assert_eq!(e.http_status, Some(400));
    assert!(e.message.contains("thinking mode"), "{e}");
}

/// OpenRouter's routing requirement goes with the schema, and the mock's
/// route takes it.
#[tokio::test]
async fn openrouter_require_parameters_is_accepted() {
    let (_m, base) = mock().await;
    let p = OpenRouterChat::new(&format!("{base}/api/v1"), key()).unwrap();
    let a = p
        .send(&request("openai/gpt-4o-mini", 300))
        .await
        .expect("an answer");
    valid_verdict(a.content.as_deref());
}

/// Run the real binary on a gemini-2.5-flash stage against the mock, with
/// `stage_line` added to the stage; the mock's outcome of every request.
async fn gemini_run(stage_line: &str) -> Vec<String> {
    use docket_testkit as support;
    const ITEMS: usize = 4;
    let (m, ws) = support::mocked(MockConfig::default(), ITEMS, |j| {
        j.api_key_env = Some("DOCKET_PROVIDER_KEY");
    })
    .await;
    let path = ws.path().join("docket.toml");
    let base = m.base_url();
    let base = base.trim_end_matches('/').trim_end_matches("/v1");
    let toml = std::fs::read_to_string(&path).unwrap();
    let toml = toml
        .replace(
            &format!(
                "kind = \"openai_compatible\"\nmodel = \"gpt-4o-mini\"\nbase_url = \"{}\"",
                m.base_url()
            ),
            &format!("kind = \"gemini\"\nmodel = \"gemini-2.5-flash\"\nbase_url = \"{base}\""),
        )
        .replace(
            "max_tokens = 200\n",
            &format!("max_tokens = 200\n{stage_line}\n"),
        );
    assert!(toml.contains("kind = \"gemini\""), "{toml}");
    std::fs::write(&path, toml).unwrap();
    let home = tempfile::tempdir().unwrap();
    let out = support::procs::docket_at(ws.path(), home.path())
        .env("DOCKET_PROVIDER_KEY", "test-key-0123456789")
        .args(["run", "--yes", "--headless"])
        .output()
        .unwrap();
    let outcomes: Vec<String> = m.log().into_iter().map(|e| e.outcome).collect();
    if !outcomes.iter().any(|o| o == "truncated") {
        let said = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{said}\n{outcomes:?}");
    }
    assert!(outcomes.len() >= ITEMS, "{outcomes:?}");
    m.shutdown().await;
    outcomes
}

/// Through the real binary: a stage without `thinking_budget` gets the
/// default budget on top of its max_tokens, so no answer is cut off; with
/// `thinking_budget = -1` (dynamic) the mock's 2.5 Flash thinks past the
/// 200 tokens and every item's first answer is cut off (a run without cut
/// offs must end cleanly, exit 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_thinking_budget_from_the_stage_through_the_binary() {
    let default = gemini_run("").await;
    assert!(default.iter().all(|o| o == "ok"), "{default:?}");
    let dynamic = gemini_run("thinking_budget = -1").await;
    let cut = dynamic.iter().filter(|o| *o == "truncated").count();
    assert!(cut >= 4, "every first answer cut off: {dynamic:?}");
}
