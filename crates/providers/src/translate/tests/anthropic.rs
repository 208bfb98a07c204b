//! Chat <-> Anthropic Messages: every request mapping, every answer mapping,
//! and every refusal naming its path.

use serde_json::{Value, json};

use super::{Kind, body, kind_of};
use crate::translate::{DEFAULT_MAX_TOKENS, anthropic_to_chat, chat_to_anthropic};

fn to(extra: Value) -> Value {
    chat_to_anthropic(&body(extra)).unwrap_or_else(|e| panic!("refused: {e}"))
}

#[test]
fn parameters_map_to_their_anthropic_names() {
    // (chat fields, the Anthropic fields expected beside model and messages)
    let cases: Vec<(Value, Value)> = vec![
        (json!({}), json!({"max_tokens": DEFAULT_MAX_TOKENS})),
        (json!({"max_tokens": 300}), json!({"max_tokens": 300})),
        (
            json!({"max_completion_tokens": 200}),
            json!({"max_tokens": 200}),
        ),
        (
            json!({"max_tokens": 300, "max_completion_tokens": 200}),
            json!({"max_tokens": 200}),
        ),
        (
            json!({"temperature": 0.2}),
            json!({"max_tokens": 4096, "temperature": 0.2}),
        ),
        (
            json!({"top_p": 0.9}),
            json!({"max_tokens": 4096, "top_p": 0.9}),
        ),
        // Current models refuse both: temperature is kept.
        (
            json!({"temperature": 0, "top_p": 0.9}),
            json!({"max_tokens": 4096, "temperature": 0.0}),
        ),
        (
            json!({"stop": "END"}),
            json!({"max_tokens": 4096, "stop_sequences": ["END"]}),
        ),
        (
            json!({"stop": ["a", "b"]}),
            json!({"max_tokens": 4096, "stop_sequences": ["a", "b"]}),
        ),
        (json!({"stop": []}), json!({"max_tokens": 4096})),
        (json!({"seed": 42}), json!({"max_tokens": 4096})),
        (
            json!({"presence_penalty": 0, "frequency_penalty": 0.0}),
            json!({"max_tokens": 4096}),
        ),
        (
            json!({"response_format": {"type": "json_object"}}),
            json!({"max_tokens": 4096}),
        ),
        (
            json!({"response_format": {"type": "text"}}),
            json!({"max_tokens": 4096}),
        ),
        // A model not known to take structured outputs ("m-1"): the schema
        // is an instruction in the system prompt.
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "v", "strict": true, "schema": {"type": "object"}}}}),
            json!({"max_tokens": 4096, "system": crate::anthropic_schema::schema_instruction("response_format", &json!({"type": "object"}))}),
        ),
    ];
    for (chat, want) in cases {
        let mut got = to(chat.clone());
        let obj = got.as_object_mut().expect("object");
        assert_eq!(obj.remove("model"), Some(json!("m-1")));
        assert_eq!(
            obj.remove("messages"),
            Some(json!([{"role": "user", "content": "Hello"}]))
        );
        assert_eq!(got, want, "for {chat}");
    }
}

#[test]
fn a_schema_for_a_structured_outputs_model_is_fitted_into_output_config() {
    let schema = json!({"type": "object", "required": ["confidence"],
        "properties": {"confidence": {"type": "number", "minimum": 0, "maximum": 1}}});
    let got = chat_to_anthropic(&json!({
        "model": "claude-sonnet-4-5",
        "messages": [{"role": "system", "content": "Judge."}, {"role": "user", "content": "Hello"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "v", "schema": schema}},
    }))
    .expect("translated");
    // What the API refuses is taken out of the schema sent...
    assert_eq!(
        got["output_config"],
        json!({"format": {"type": "json_schema", "schema": {"type": "object",
            "required": ["confidence"], "additionalProperties": false,
            "properties": {"confidence": {"type": "number"}}}}})
    );
    // ...and said in words after the body's own system prompt.
    let system = got["system"].as_str().expect("one system text");
    assert!(system.starts_with("Judge.\n\n"), "{system}");
    assert!(
        system.contains("/properties/confidence: minimum 0"),
        "{system}"
    );
    assert!(system.contains("maximum 1"), "{system}");
}

#[test]
fn images_become_base64_or_url_sources() {
    let got = to(json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "high"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
    ]}]}));
    assert_eq!(
        got["messages"][0]["content"],
        json!([
            {"type": "text", "text": "What is this?"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
            {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
        ])
    );
}

#[test]
fn what_anthropic_lacks_is_unsupported_naming_the_path() {
    let cases: Vec<(Value, &str)> = vec![
        (json!({"temperature": 1.5}), "temperature"),
        (json!({"presence_penalty": 0.5}), "presence_penalty"),
        (json!({"frequency_penalty": -1}), "frequency_penalty"),
        (json!({"stop": "\n"}), "stop"),
        (json!({"stop": ["END", " \n\t"]}), "stop[1]"),
        (json!({"stop": [""]}), "stop[0]"),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/tiff;base64,AAAA"}}]}]}),
            "messages[0].content[0].image_url.url",
        ),
    ];
    for (chat, path) in cases {
        let e = chat_to_anthropic(&body(chat.clone())).expect_err("accepted");
        assert_eq!(
            (kind_of(&e), e.path()),
            (Kind::Unsupported, path),
            "{chat}: {e}"
        );
    }
}

fn message(content: Value, stop: &str) -> Value {
    json!({
        "id": "msg_01", "type": "message", "role": "assistant", "model": "claude-x",
        "content": content, "stop_reason": stop, "stop_sequence": null,
        "usage": {"input_tokens": 100, "output_tokens": 20,
                  "cache_creation_input_tokens": 5, "cache_read_input_tokens": 30},
    })
}

#[test]
fn an_answer_becomes_a_chat_completion() {
    let m = message(
        json!([
            {"type": "thinking", "thinking": "hmm", "signature": "s"},
            {"type": "text", "text": "VERDICT: "},
            {"type": "text", "text": "yes"},
        ]),
        "end_turn",
    );
    let got = anthropic_to_chat(&m).expect("translated");
    assert_eq!(got["id"], "msg_01");
    assert_eq!(got["object"], "chat.completion");
    assert_eq!(got["model"], "claude-x");
    assert!(
        got["created"].as_i64().is_some_and(|t| t > 1_700_000_000),
        "{got}"
    );
    assert_eq!(
        got["choices"],
        json!([{
            "index": 0,
            "message": {"role": "assistant", "content": "VERDICT: yes", "refusal": null},
            "logprobs": null,
            "finish_reason": "stop",
        }])
    );
    // Cache reads and writes are prompt tokens; reads are the cached ones.
    assert_eq!(
        got["usage"],
        json!({
            "prompt_tokens": 135, "completion_tokens": 20, "total_tokens": 155,
            "prompt_tokens_details": {"cached_tokens": 30},
            "completion_tokens_details": {"reasoning_tokens": 0},
        })
    );
}

#[test]
fn stop_reasons_map_to_finish_reasons() {
    let cases = [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("pause_turn", "stop"),
        ("max_tokens", "length"),
        ("model_context_window_exceeded", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
        ("something_new", "something_new"),
    ];
    for (stop, want) in cases {
        let got =
            anthropic_to_chat(&message(json!([{"type": "text", "text": "x"}]), stop)).expect("ok");
        assert_eq!(got["choices"][0]["finish_reason"], want, "{stop}");
    }
}

#[test]
fn tool_use_blocks_become_tool_calls_and_no_text_is_null() {
    let m = message(
        json!([{"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "x"}}]),
        "tool_use",
    );
    let got = anthropic_to_chat(&m).expect("ok");
    let msg = &got["choices"][0]["message"];
    assert_eq!(msg["content"], Value::Null);
    assert_eq!(
        msg["tool_calls"],
        json!([{"id": "toolu_1", "type": "function", "function": {"name": "lookup", "arguments": "{\"q\":\"x\"}"}}])
    );
}

#[test]
fn an_answer_without_id_or_usage_gets_a_generated_id_and_zero_counts() {
    let got =
        anthropic_to_chat(&json!({"content": [{"type": "text", "text": "hi"}], "model": "c"}))
            .expect("ok");
    let id = got["id"].as_str().expect("id");
    assert!(id.starts_with("chatcmpl-") && id.len() == 33, "{id}");
    assert_eq!(got["usage"]["total_tokens"], 0);
    assert_eq!(got["choices"][0]["finish_reason"], "stop");
}

#[test]
fn garbage_answers_are_invalid_naming_the_path() {
    let cases: Vec<(Value, &str)> = vec![
        (json!("text"), "$"),
        (json!([1, 2]), "$"),
        (json!(null), "$"),
        (
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
            "type",
        ),
        (json!({"type": "message_batch"}), "type"),
        (json!({"type": "message"}), "content"),
        (json!({"content": "just text"}), "content"),
        (json!({"content": [{"text": "no type"}]}), "content[0].type"),
        (json!({"content": [{"type": "text"}]}), "content[0].text"),
        (
            json!({"content": [{"type": "text", "text": 5}]}),
            "content[0].text",
        ),
    ];
    for (m, path) in cases {
        let e = anthropic_to_chat(&m).expect_err("accepted");
        assert_eq!((kind_of(&e), e.path()), (Kind::Invalid, path), "{m}: {e}");
    }
}
