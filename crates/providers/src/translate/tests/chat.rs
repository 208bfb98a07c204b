//! The chat body's reading, seen through both targets: what is refused
//! (and where), what is dropped, what is merged.

use serde_json::{Value, json};

use super::{Kind, assert_refused, body};
use crate::translate::{chat_to_anthropic, chat_to_gemini};

fn user(content: Value) -> Value {
    json!({"messages": [{"role": "user", "content": content}]})
}

#[test]
fn invalid_chat_bodies_are_refused_naming_the_path() {
    let cases: Vec<(Value, &str)> = vec![
        (json!({"model": "m", "messages": "hi"}), "messages"),
        (json!({"model": "m"}), "messages"),
        (json!({"model": "m", "messages": []}), "messages"),
        (
            json!({"messages": [{"role": "user", "content": "x"}]}),
            "model",
        ),
        (body(json!({"model": ""})), "model"),
        (body(json!({"model": 7})), "model"),
        (body(json!({"messages": ["hi"]})), "messages[0]"),
        (
            body(json!({"messages": [{"content": "hi"}]})),
            "messages[0].role",
        ),
        (
            body(json!({"messages": [{"role": "robot", "content": "hi"}]})),
            "messages[0].role",
        ),
        (body(json!({"stream": true})), "stream"),
        (body(json!({"stream": "yes"})), "stream"),
        (body(json!({"n": 0})), "n"),
        (body(json!({"max_tokens": 0})), "max_tokens"),
        (
            body(json!({"max_tokens": 10, "max_completion_tokens": -1})),
            "max_completion_tokens",
        ),
        (body(json!({"temperature": 3})), "temperature"),
        (body(json!({"temperature": "hot"})), "temperature"),
        (body(json!({"top_p": 1.5})), "top_p"),
        (body(json!({"presence_penalty": 9})), "presence_penalty"),
        (body(json!({"stop": 5})), "stop"),
        (body(json!({"stop": ["a", 1]})), "stop[1]"),
        (body(json!({"seed": "s"})), "seed"),
        (body(json!({"response_format": {}})), "response_format.type"),
        (
            body(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}})),
            "response_format.json_schema.schema",
        ),
    ];
    for (b, path) in cases {
        assert_refused(&b, Kind::Invalid, path);
    }
}

#[test]
fn invalid_message_contents_are_refused_naming_the_path() {
    let cases: Vec<(Value, &str)> = vec![
        (body(user(Value::Null)), "messages[0].content"),
        (body(user(json!(3))), "messages[0].content"),
        (
            body(user(json!([{"text": "x"}]))),
            "messages[0].content[0].type",
        ),
        (
            body(user(json!([{"type": "text"}]))),
            "messages[0].content[0].text",
        ),
        (
            body(user(json!([{"type": "image_url", "image_url": {}}]))),
            "messages[0].content[0].image_url.url",
        ),
        (
            body(user(
                json!([{"type": "image_url", "image_url": {"url": "data:image/png;base64"}}]),
            )),
            "messages[0].content[0].image_url.url",
        ),
        (
            body(user(
                json!([{"type": "image_url", "image_url": {"url": "data:;base64,AAAA"}}]),
            )),
            "messages[0].content[0].image_url.url",
        ),
        (
            body(user(
                json!([{"type": "image_url", "image_url": {"url": "ftp://x/y.png"}}]),
            )),
            "messages[0].content[0].image_url.url",
        ),
        (
            body(
                json!({"messages": [{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "https://x"}}]}, {"role": "user", "content": "x"}]}),
            ),
            "messages[0].content[0].type",
        ),
        (
            body(
                json!({"messages": [{"role": "system", "content": 1}, {"role": "user", "content": "x"}]}),
            ),
            "messages[0].content",
        ),
        (
            body(
                json!({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": [{"type": "refusal"}]}]}),
            ),
            "messages[1].content[0].refusal",
        ),
    ];
    for (b, path) in cases {
        assert_refused(&b, Kind::Invalid, path);
    }
    for garbage in [json!(null), json!("text"), json!([1]), json!(3)] {
        assert_refused(&garbage, Kind::Invalid, "$");
    }
}

#[test]
fn valid_fields_without_an_equivalent_are_unsupported_naming_the_path() {
    let cases: Vec<(Value, &str)> = vec![
        (
            body(json!({"tools": [{"type": "function", "function": {"name": "f"}}]})),
            "tools",
        ),
        (body(json!({"tool_choice": "auto"})), "tool_choice"),
        (body(json!({"functions": [{"name": "f"}]})), "functions"),
        (body(json!({"function_call": "auto"})), "function_call"),
        (body(json!({"logprobs": true})), "logprobs"),
        (body(json!({"top_logprobs": 2})), "top_logprobs"),
        (body(json!({"logit_bias": {"50256": -100}})), "logit_bias"),
        (
            body(json!({"audio": {"voice": "alloy", "format": "wav"}})),
            "audio",
        ),
        (body(json!({"modalities": ["text", "audio"]})), "modalities"),
        (
            body(json!({"prediction": {"type": "content", "content": "x"}})),
            "prediction",
        ),
        (body(json!({"reasoning_effort": "low"})), "reasoning_effort"),
        (
            body(json!({"web_search_options": {}})),
            "web_search_options",
        ),
        (body(json!({"n": 3})), "n"),
        (
            body(json!({"a_field_from_the_future": 1})),
            "a_field_from_the_future",
        ),
        (
            body(json!({"response_format": {"type": "grammar"}})),
            "response_format.type",
        ),
    ];
    for (b, path) in cases {
        assert_refused(&b, Kind::Unsupported, path);
    }
}

#[test]
fn message_features_without_an_equivalent_are_unsupported_naming_the_path() {
    let tool_msgs = json!([{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "c", "content": "r"}]);
    let call =
        json!([{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]);
    let cases: Vec<(Value, &str)> = vec![
        (body(json!({"messages": tool_msgs})), "messages[1].role"),
        (
            body(json!({"messages": [{"role": "function", "name": "f", "content": "r"}]})),
            "messages[0].role",
        ),
        (
            body(json!({"messages": [{"role": "assistant", "content": null, "tool_calls": call}]})),
            "messages[0].tool_calls",
        ),
        (
            body(
                json!({"messages": [{"role": "assistant", "content": "x", "audio": {"id": "a"}}]}),
            ),
            "messages[0].audio",
        ),
        (
            body(json!({"messages": [{"role": "user", "content": "x", "mood": "happy"}]})),
            "messages[0].mood",
        ),
        (
            body(user(
                json!([{"type": "input_audio", "input_audio": {"data": "AA", "format": "wav"}}]),
            )),
            "messages[0].content[0].type",
        ),
        (
            body(user(json!([{"type": "file", "file": {"file_id": "f"}}]))),
            "messages[0].content[0].type",
        ),
        (
            body(user(
                json!([{"type": "image_url", "image_url": {"url": "data:image/png,rawbytes"}}]),
            )),
            "messages[0].content[0].image_url.url",
        ),
        (body(user(json!(""))), "messages[0].content"),
        (
            body(user(json!([{"type": "text", "text": ""}]))),
            "messages[0].content",
        ),
        (
            body(json!({"messages": [{"role": "system", "content": "only a system prompt"}]})),
            "messages",
        ),
    ];
    for (b, path) in cases {
        assert_refused(&b, Kind::Unsupported, path);
    }
}

#[test]
fn openai_only_fields_and_values_that_ask_for_nothing_are_dropped() {
    let b = body(json!({
        "user": "u-1", "store": true, "metadata": {"k": "v"}, "parallel_tool_calls": false,
        "stream_options": {"include_usage": true}, "service_tier": "flex",
        "prompt_cache_key": "k", "safety_identifier": "s", "logprobs": false,
        "logit_bias": {}, "tools": [], "tool_choice": "none", "modalities": ["text"],
        "stream": false, "n": 1, "top_logprobs": null, "seed": 7,
        "messages": [{"role": "user", "name": "ann", "content": "Hello"}],
    }));
    let a = chat_to_anthropic(&b).expect("anthropic");
    assert_eq!(
        a,
        json!({"model": "m-1", "max_tokens": 4096, "messages": [{"role": "user", "content": "Hello"}]})
    );
    let g = chat_to_gemini(&b).expect("gemini");
    // The seed is the one of these Gemini keeps.
    assert_eq!(
        g.body,
        json!({"contents": [{"role": "user", "parts": [{"text": "Hello"}]}], "generationConfig": {"seed": 7}})
    );
}

#[test]
fn system_messages_anywhere_are_hoisted_and_same_role_turns_merged() {
    let b = body(json!({"messages": [
        {"role": "system", "content": "S1"},
        {"role": "user", "content": "U1"},
        {"role": "developer", "content": [{"type": "text", "text": "S2"}, {"type": "text", "text": "S3"}]},
        {"role": "user", "content": [{"type": "text", "text": "U2"}]},
        {"role": "assistant", "content": "A1"},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "R1"}]},
        {"role": "user", "content": "U3"},
    ]}));
    let a = chat_to_anthropic(&b).expect("anthropic");
    let texts = |t: &[&str]| {
        t.iter()
            .map(|t| json!({"type": "text", "text": t}))
            .collect::<Vec<_>>()
    };
    assert_eq!(a["system"], json!(texts(&["S1", "S2", "S3"])));
    assert_eq!(
        a["messages"],
        json!([
            {"role": "user", "content": texts(&["U1", "U2"])},
            {"role": "assistant", "content": texts(&["A1", "R1"])},
            {"role": "user", "content": "U3"},
        ])
    );
    let g = chat_to_gemini(&b).expect("gemini").body;
    assert_eq!(
        g["systemInstruction"],
        json!({"parts": [{"text": "S1"}, {"text": "S2"}, {"text": "S3"}]})
    );
    assert_eq!(
        g["contents"],
        json!([
            {"role": "user", "parts": [{"text": "U1"}, {"text": "U2"}]},
            {"role": "model", "parts": [{"text": "A1"}, {"text": "R1"}]},
            {"role": "user", "parts": [{"text": "U3"}]},
        ])
    );
}

#[test]
fn null_fields_are_read_as_absent() {
    let b = body(
        json!({"temperature": null, "max_tokens": null, "stop": null, "response_format": null, "tools": null}),
    );
    assert_eq!(
        chat_to_anthropic(&b).expect("anthropic")["max_tokens"],
        json!(4096)
    );
    assert!(
        chat_to_gemini(&b)
            .expect("gemini")
            .body
            .get("generationConfig")
            .is_none()
    );
}
