//! The chat-completions translation (`docket::provider::translate`) against
//! the built-in mock over real loopback HTTP: realistic OpenAI Batch bodies
//! are translated, POSTed with reqwest to the mock's Anthropic `/v1/messages`
//! and Gemini `/v1beta/models/{model}:generateContent` routes (which must
//! accept them), and the answers translated back into valid
//! `chat.completion` bodies.

use std::time::Duration;

use docket::mock::{MockConfig, MockServer};
use docket::provider::translate::{
    anthropic_to_chat, chat_to_anthropic, chat_to_gemini, gemini_to_chat,
};
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn start() -> MockServer {
    MockServer::start(MockConfig::default(), "127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("mock server starts")
}

fn root(server: &MockServer) -> String {
    server.base_url().trim_end_matches("/v1").to_string()
}

/// POST `body` with `headers`; the status and the JSON answer.
async fn post(url: &str, headers: &[(&str, &str)], body: &Value) -> (StatusCode, Value) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    let mut req = client.post(url).json(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.expect("request");
    let status = resp.status();
    let text = resp.text().await.expect("body");
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, v)
}

/// Anthropic's answer to a chat body, translated back.
async fn via_anthropic(server: &MockServer, chat: &Value) -> Value {
    let body = chat_to_anthropic(chat).unwrap_or_else(|e| panic!("{chat}: {e}"));
    let headers = [
        ("x-api-key", "sk-ant-test"),
        ("anthropic-version", "2023-06-01"),
    ];
    let url = format!("{}/v1/messages", root(server));
    let (status, answer) = post(&url, &headers, &body).await;
    assert_eq!(status, StatusCode::OK, "the mock refused {body}: {answer}");
    anthropic_to_chat(&answer).unwrap_or_else(|e| panic!("{answer}: {e}"))
}

/// Gemini's answer to a chat body, translated back.
async fn via_gemini(server: &MockServer, chat: &Value) -> Value {
    let req = chat_to_gemini(chat).unwrap_or_else(|e| panic!("{chat}: {e}"));
    let url = format!(
        "{}/v1beta/models/{}:generateContent",
        root(server),
        req.model
    );
    let (status, answer) = post(&url, &[("x-goog-api-key", "AIza-test")], &req.body).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the mock refused {}: {answer}",
        req.body
    );
    gemini_to_chat(&answer, &req.model).unwrap_or_else(|e| panic!("{answer}: {e}"))
}

/// OpenAI's answer to the body as written (the mock's chat route).
async fn via_openai(server: &MockServer, chat: &Value) -> Value {
    let url = format!("{}/chat/completions", server.base_url());
    let (status, answer) = post(&url, &[("authorization", "Bearer sk-test")], chat).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    answer
}

/// A valid `chat.completion`: its shape, one choice, and consistent usage.
/// Returns the content and the finish reason.
fn check_completion(c: &Value, model: &str) -> (String, String) {
    assert_eq!(c["object"], "chat.completion", "{c}");
    assert_eq!(c["model"], model, "{c}");
    assert!(c["id"].as_str().is_some_and(|id| !id.is_empty()), "{c}");
    assert!(
        c["created"].as_i64().is_some_and(|t| t > 1_700_000_000),
        "{c}"
    );
    let choices = c["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 1, "{c}");
    assert_eq!(choices[0]["index"], 0);
    assert_eq!(choices[0]["message"]["role"], "assistant");
    let u = &c["usage"];
    let (p, k) = (
        u["prompt_tokens"].as_u64().expect("p"),
        u["completion_tokens"].as_u64().expect("c"),
    );
    assert!(p > 0 && k > 0, "{u}");
    assert_eq!(u["total_tokens"].as_u64(), Some(p + k), "{u}");
    let content = choices[0]["message"]["content"]
        .as_str()
        .expect("content")
        .to_string();
    let finish = choices[0]["finish_reason"]
        .as_str()
        .expect("finish_reason")
        .to_string();
    (content, finish)
}

fn verdict_schema() -> Value {
    json!({"type": "object", "additionalProperties": false, "required": ["verdict", "confidence"],
           "properties": {"verdict": {"type": "string", "enum": ["same", "different"]},
                          "confidence": {"type": "number", "minimum": 0, "maximum": 1}}})
}

/// Realistic bodies of an OpenAI Batch file, with no schema.
fn plain_bodies() -> Vec<Value> {
    vec![
        json!({"model": "gpt-4.1-mini", "temperature": 0, "max_tokens": 200, "seed": 3, "user": "team-a",
               "messages": [{"role": "developer", "content": "Label the sentiment."},
                            {"role": "user", "content": "I love it"}, {"role": "assistant", "content": "positive"},
                            {"role": "user", "content": [{"type": "text", "text": "It broke after a day."}]}]}),
        json!({"model": "gpt-4o", "max_completion_tokens": 150, "top_p": 0.9, "stop": ["###"],
               "messages": [{"role": "user", "content": [
                   {"type": "text", "text": "What is in this picture?"},
                   {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}}]}]}),
        json!({"model": "gpt-4o-mini", "response_format": {"type": "json_object"}, "metadata": {"run": "1"},
               "messages": [{"role": "system", "content": "Reply in JSON."},
                            {"role": "user", "content": "Is Paris in France?"}]}),
    ]
}

#[tokio::test]
async fn translated_bodies_are_accepted_and_answers_come_back_as_chat_completions() {
    let server = start().await;
    for chat in plain_bodies() {
        let model = chat["model"].as_str().expect("model");
        let (text, finish) = check_completion(&via_anthropic(&server, &chat).await, model);
        assert!(
            !text.is_empty() && finish == "stop",
            "anthropic: {finish} {text}"
        );
        let (text, finish) = check_completion(&via_gemini(&server, &chat).await, model);
        assert!(
            !text.is_empty() && finish == "stop",
            "gemini: {finish} {text}"
        );
    }
}

#[tokio::test]
async fn the_prompt_arrives_whole_the_mock_answers_as_it_answers_openai() {
    // The mock's answer is a function of the model and the prompt's texts
    // (the system prompt first): a translation that lost or reordered a text
    // would change it.
    let server = start().await;
    for chat in plain_bodies() {
        let openai = via_openai(&server, &chat).await;
        let want = openai["choices"][0]["message"]["content"].clone();
        let anthropic = via_anthropic(&server, &chat).await;
        assert_eq!(
            anthropic["choices"][0]["message"]["content"], want,
            "{chat}"
        );
    }
}

#[tokio::test]
async fn a_json_schema_reaches_both_providers_and_the_answers_follow_it() {
    let server = start().await;
    let chat = json!({"model": "gpt-4o-mini", "temperature": 0, "max_tokens": 300,
        "messages": [{"role": "system", "content": "You adjudicate record pairs."},
                     {"role": "user", "content": "A: Ann Lee, 1990. B: Ann Lee, 1990. Same person?"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "verdict", "strict": true,
                                                                   "schema": verdict_schema()}}});
    let anthropic = check_completion(&via_anthropic(&server, &chat).await, "gpt-4o-mini");
    let gemini = check_completion(&via_gemini(&server, &chat).await, "gpt-4o-mini");
    for (who, (text, finish)) in [("anthropic", anthropic), ("gemini", gemini)] {
        assert_eq!(finish, "stop", "{who}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{who}: {e}: {text}"));
        let mut keys: Vec<&str> = v
            .as_object()
            .expect("object")
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        assert_eq!(keys, ["confidence", "verdict"], "{who}: {text}");
        assert!(
            matches!(v["verdict"].as_str(), Some("same" | "different")),
            "{who}: {text}"
        );
    }
}

#[tokio::test]
async fn a_cut_answer_is_length_and_a_refusal_is_content_filter() {
    // The mock's truncated fault answers max_tokens tokens, cut off; its
    // refusal fault declines (Anthropic `refusal`, Gemini `SAFETY`).
    let chat = json!({"model": "gpt-4o-mini", "max_tokens": 7,
        "messages": [{"role": "user", "content": "Is the sky blue? Explain at length."}]});
    let server = MockServer::start(
        MockConfig {
            truncated: 1.0,
            ..Default::default()
        },
        "127.0.0.1:0".parse().expect("addr"),
    )
    .await
    .expect("mock server starts");
    let a = via_anthropic(&server, &chat).await;
    assert_eq!(a["choices"][0]["finish_reason"], "length", "{a}");
    assert_eq!(a["usage"]["completion_tokens"], 7, "{a}");
    let g = via_gemini(&server, &chat).await;
    assert_eq!(g["choices"][0]["finish_reason"], "length", "{g}");
    server.set_config(MockConfig {
        refusal: 1.0,
        ..Default::default()
    });
    let a = via_anthropic(&server, &chat).await;
    assert_eq!(a["choices"][0]["finish_reason"], "content_filter", "{a}");
    let g = via_gemini(&server, &chat).await;
    assert_eq!(g["choices"][0]["finish_reason"], "content_filter", "{g}");
    assert_eq!(g["choices"][0]["message"]["content"], Value::Null, "{g}");
}

#[tokio::test]
async fn a_gemini_model_name_goes_in_the_url_without_its_prefix() {
    let server = start().await;
    let chat = json!({"model": "models/gemini-2.5-flash",
        "messages": [{"role": "user", "content": "Is Paris in France?"}]});
    let g = via_gemini(&server, &chat).await;
    check_completion(&g, "gemini-2.5-flash");
}

#[tokio::test]
async fn a_tool_round_is_accepted_by_both_providers() {
    let server = start().await;
    let weather = json!({"type": "function", "function": {"name": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}});
    let chat = json!({"model": "gpt-4o-mini", "tools": [weather], "tool_choice": "auto",
        "messages": [
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "weather", "arguments": "{\"city\":\"Oslo\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "rain"},
            {"role": "user", "content": "Umbrella, then?"}]});
    let (text, finish) = check_completion(&via_anthropic(&server, &chat).await, "gpt-4o-mini");
    assert!(
        !text.is_empty() && finish == "stop",
        "anthropic: {finish} {text}"
    );
    let (text, finish) = check_completion(&via_gemini(&server, &chat).await, "gpt-4o-mini");
    assert!(
        !text.is_empty() && finish == "stop",
        "gemini: {finish} {text}"
    );
}
