//! Chat <-> Gemini generateContent: every request mapping, every answer
//! mapping, and every refusal naming its path.

use serde_json::{Value, json};

use super::{Kind, body, kind_of};
use crate::translate::{GeminiRequest, chat_to_gemini, gemini_to_chat};

fn to(extra: Value) -> GeminiRequest {
    chat_to_gemini(&body(extra)).unwrap_or_else(|e| panic!("refused: {e}"))
}

#[test]
fn parameters_map_to_generation_config() {
    // (chat fields, the generationConfig expected; null: none sent)
    let cases: Vec<(Value, Value)> = vec![
        (json!({}), Value::Null),
        (json!({"max_tokens": 300}), json!({"maxOutputTokens": 300})),
        (
            json!({"max_completion_tokens": 200, "max_tokens": 300}),
            json!({"maxOutputTokens": 200}),
        ),
        (
            json!({"temperature": 1.5, "top_p": 0.9}),
            json!({"temperature": 1.5, "topP": 0.9}),
        ),
        (json!({"stop": "END"}), json!({"stopSequences": ["END"]})),
        (
            json!({"stop": ["a", "b"]}),
            json!({"stopSequences": ["a", "b"]}),
        ),
        (json!({"seed": -3}), json!({"seed": -3})),
        (
            json!({"presence_penalty": 0.5, "frequency_penalty": -0.5}),
            json!({"presencePenalty": 0.5, "frequencyPenalty": -0.5}),
        ),
        (json!({"response_format": {"type": "text"}}), Value::Null),
        (
            json!({"response_format": {"type": "json_object"}}),
            json!({"responseMimeType": "application/json"}),
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "v", "schema": {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object"}}}}),
            json!({"responseMimeType": "application/json", "responseJsonSchema": {"type": "object"}}),
        ),
    ];
    for (chat, want) in cases {
        let got = to(chat.clone());
        assert_eq!(got.model, "m-1");
        assert_eq!(
            got.body["contents"],
            json!([{"role": "user", "parts": [{"text": "Hello"}]}])
        );
        assert_eq!(
            got.body
                .get("generationConfig")
                .cloned()
                .unwrap_or(Value::Null),
            want,
            "for {chat}"
        );
        assert!(got.body.get("model").is_none(), "the model goes in the URL");
    }
}

#[test]
fn the_models_prefix_is_stripped() {
    assert_eq!(
        to(json!({"model": "models/gemini-2.5-flash"})).model,
        "gemini-2.5-flash"
    );
    assert_eq!(
        to(json!({"model": "gemini-2.5-pro"})).model,
        "gemini-2.5-pro"
    );
}

#[test]
fn images_become_inline_data_and_web_urls_are_unsupported() {
    let got = to(json!({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/heic;base64,AAAA"}},
        {"type": "text", "text": "Describe"},
    ]}]}));
    assert_eq!(
        got.body["contents"][0]["parts"],
        json!([
            {"inlineData": {"mimeType": "image/heic", "data": "AAAA"}},
            {"text": "Describe"},
        ])
    );
    let web = body(json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "Describe"},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
    ]}]}));
    let e = chat_to_gemini(&web).expect_err("accepted");
    assert_eq!(
        (kind_of(&e), e.path()),
        (Kind::Unsupported, "messages[0].content[1].image_url.url"),
        "{e}"
    );
}

fn response(parts: Value, finish: &str) -> Value {
    json!({
        "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": finish, "index": 0}],
        "usageMetadata": {"promptTokenCount": 50, "candidatesTokenCount": 20, "totalTokenCount": 85,
                          "cachedContentTokenCount": 8, "thoughtsTokenCount": 15},
        "modelVersion": "gemini-2.5-flash-001", "responseId": "resp-1",
    })
}

#[test]
fn an_answer_becomes_a_chat_completion() {
    let r = response(
        json!([{"text": "thinking...", "thought": true}, {"text": "VERDICT: "}, {"text": "no"}]),
        "STOP",
    );
    let got = gemini_to_chat(&r, "models/gemini-2.5-flash").expect("translated");
    assert_eq!(got["id"], "resp-1");
    assert_eq!(got["object"], "chat.completion");
    assert_eq!(got["model"], "gemini-2.5-flash");
    assert!(
        got["created"].as_i64().is_some_and(|t| t > 1_700_000_000),
        "{got}"
    );
    assert_eq!(
        got["choices"],
        json!([{
            "index": 0,
            "message": {"role": "assistant", "content": "VERDICT: no", "refusal": null},
            "logprobs": null,
            "finish_reason": "stop",
        }])
    );
    // Thoughts are billed as output: completion tokens include them.
    assert_eq!(
        got["usage"],
        json!({
            "prompt_tokens": 50, "completion_tokens": 35, "total_tokens": 85,
            "prompt_tokens_details": {"cached_tokens": 8},
            "completion_tokens_details": {"reasoning_tokens": 15},
        })
    );
}

#[test]
fn finish_reasons_map() {
    let cases = [
        ("STOP", "stop"),
        ("MAX_TOKENS", "length"),
        ("SAFETY", "content_filter"),
        ("RECITATION", "content_filter"),
        ("BLOCKLIST", "content_filter"),
        ("PROHIBITED_CONTENT", "content_filter"),
        ("SPII", "content_filter"),
        ("IMAGE_SAFETY", "content_filter"),
        ("MALFORMED_FUNCTION_CALL", "malformed_function_call"),
        ("OTHER", "other"),
    ];
    for (reason, want) in cases {
        let got = gemini_to_chat(&response(json!([{"text": "x"}]), reason), "g").expect("ok");
        assert_eq!(got["choices"][0]["finish_reason"], want, "{reason}");
    }
}

#[test]
fn a_blocked_prompt_is_a_content_filter_answer_not_an_error() {
    let r = json!({"promptFeedback": {"blockReason": "PROHIBITED_CONTENT"}, "usageMetadata": {"promptTokenCount": 9, "totalTokenCount": 9}});
    let got = gemini_to_chat(&r, "g").expect("an answer");
    assert_eq!(got["choices"][0]["finish_reason"], "content_filter");
    assert_eq!(got["choices"][0]["message"]["content"], Value::Null);
    assert_eq!(got["usage"]["prompt_tokens"], 9);
    assert!(
        got["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("chatcmpl-")),
        "{got}"
    );
    // A candidate stopped by a filter, with no content at all.
    let r = json!({"candidates": [{"finishReason": "SAFETY"}]});
    let got = gemini_to_chat(&r, "g").expect("an answer");
    assert_eq!(got["choices"][0]["message"]["content"], Value::Null);
    assert_eq!(got["choices"][0]["finish_reason"], "content_filter");
}

#[test]
fn function_calls_become_tool_calls() {
    let r = response(
        json!([{"functionCall": {"name": "lookup", "args": {"q": 1}}}]),
        "STOP",
    );
    let got = gemini_to_chat(&r, "g").expect("ok");
    let call = &got["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(
        call["function"],
        json!({"name": "lookup", "arguments": "{\"q\":1}"})
    );
    assert!(
        call["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("call_")),
        "{call}"
    );
    assert_eq!(got["choices"][0]["finish_reason"], "tool_calls");
}

#[test]
fn garbage_answers_are_invalid_naming_the_path() {
    let cases: Vec<(Value, &str)> = vec![
        (json!("text"), "$"),
        (json!(null), "$"),
        (json!({}), "candidates"),
        (json!({"candidates": []}), "candidates"),
        (json!({"candidates": {"a": 1}}), "candidates"),
        (json!({"candidates": ["x"]}), "candidates[0]"),
        (
            json!({"candidates": [{"content": {"parts": "x"}}]}),
            "candidates[0].content.parts",
        ),
        (
            json!({"error": {"code": 429, "message": "Resource exhausted", "status": "RESOURCE_EXHAUSTED"}}),
            "error",
        ),
    ];
    for (r, path) in cases {
        let e = gemini_to_chat(&r, "g").expect_err("accepted");
        assert_eq!((kind_of(&e), e.path()), (Kind::Invalid, path), "{r}: {e}");
    }
}
