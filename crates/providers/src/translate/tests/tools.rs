//! Tool calling through both targets: declarations, the choice, an
//! assistant's calls and the tool messages answering them, and every
//! refusal naming its path.

use serde_json::{Value, json};

use super::{Kind, assert_refused, body};
use crate::translate::{chat_to_anthropic, chat_to_gemini};

fn weather_tool() -> Value {
    json!({"type": "function", "function": {"name": "weather", "description": "The weather in a city.", "strict": true,
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
}

/// A whole tool round: a question, the assistant's two calls, two tool
/// answers, a follow-up question.
fn conversation() -> Value {
    body(json!({
        "tools": [weather_tool(), {"type": "function", "function": {"name": "now"}}],
        "tool_choice": "auto",
        "messages": [
            {"role": "user", "content": "Weather in Oslo and the time?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Oslo\"}"}},
                {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "rain"},
            {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "12:00"}]},
            {"role": "user", "content": "Thanks. Umbrella?"},
        ],
    }))
}

#[test]
fn a_tool_round_becomes_anthropic_tool_use_and_tool_result_blocks() {
    let a = chat_to_anthropic(&conversation()).expect("translated");
    assert_eq!(
        a["tools"],
        json!([
            {"name": "weather", "description": "The weather in a city.",
             "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
            {"name": "now", "input_schema": {"type": "object", "properties": {}}},
        ])
    );
    assert_eq!(a["tool_choice"], json!({"type": "auto"}));
    assert_eq!(
        a["messages"],
        json!([
            {"role": "user", "content": "Weather in Oslo and the time?"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Oslo"}},
                {"type": "tool_use", "id": "call_2", "name": "now", "input": {}}]},
            // The tool answers and the next question are one user turn, results first.
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "rain"},
                {"type": "tool_result", "tool_use_id": "call_2", "content": "12:00"},
                {"type": "text", "text": "Thanks. Umbrella?"}]},
        ])
    );
}

#[test]
fn a_tool_round_becomes_gemini_function_calls_and_responses() {
    let g = chat_to_gemini(&conversation()).expect("translated").body;
    assert_eq!(
        g["tools"],
        json!([{"functionDeclarations": [
            {"name": "weather", "description": "The weather in a city.",
             "parametersJsonSchema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
            {"name": "now"},
        ]}])
    );
    assert_eq!(
        g["toolConfig"],
        json!({"functionCallingConfig": {"mode": "AUTO"}})
    );
    assert_eq!(
        g["contents"],
        json!([
            {"role": "user", "parts": [{"text": "Weather in Oslo and the time?"}]},
            {"role": "model", "parts": [
                {"functionCall": {"name": "weather", "args": {"city": "Oslo"}}, "thoughtSignature": "skip_thought_signature_validator"},
                {"functionCall": {"name": "now", "args": {}}, "thoughtSignature": "skip_thought_signature_validator"}]},
            {"role": "user", "parts": [
                {"functionResponse": {"name": "weather", "response": {"output": "rain"}}},
                {"functionResponse": {"name": "now", "response": {"output": "12:00"}}},
                {"text": "Thanks. Umbrella?"}]},
        ])
    );
}

#[test]
fn tool_choices_map() {
    let cases = [
        (
            json!("none"),
            json!({"type": "none"}),
            json!({"mode": "NONE"}),
        ),
        (
            json!("auto"),
            json!({"type": "auto"}),
            json!({"mode": "AUTO"}),
        ),
        (
            json!("required"),
            json!({"type": "any"}),
            json!({"mode": "ANY"}),
        ),
        (
            json!({"type": "function", "function": {"name": "weather"}}),
            json!({"type": "tool", "name": "weather"}),
            json!({"mode": "ANY", "allowedFunctionNames": ["weather"]}),
        ),
    ];
    for (choice, anthropic, gemini) in cases {
        let b = body(json!({"tools": [weather_tool()], "tool_choice": choice}));
        assert_eq!(
            chat_to_anthropic(&b).expect("a")["tool_choice"],
            anthropic,
            "{choice}"
        );
        let g = chat_to_gemini(&b).expect("g").body;
        assert_eq!(g["toolConfig"]["functionCallingConfig"], gemini, "{choice}");
    }
    // No choice: the providers' default (auto), nothing sent.
    let b = body(json!({"tools": [weather_tool()]}));
    assert!(
        chat_to_anthropic(&b)
            .expect("a")
            .get("tool_choice")
            .is_none()
    );
    assert!(
        chat_to_gemini(&b)
            .expect("g")
            .body
            .get("toolConfig")
            .is_none()
    );
}

fn with_call(arguments: Value, answer: Value) -> Value {
    body(json!({"tools": [weather_tool()], "messages": [
        {"role": "user", "content": "x"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "weather", "arguments": arguments}}]},
        answer,
    ]}))
}

#[test]
fn bad_tool_declarations_are_refused_naming_the_path() {
    let invalid: Vec<(Value, &str)> = vec![
        (body(json!({"tools": {"a": 1}})), "tools"),
        (
            body(json!({"tools": [{"function": {"name": "f"}}]})),
            "tools[0].type",
        ),
        (
            body(json!({"tools": [{"type": "function", "function": {}}]})),
            "tools[0].function.name",
        ),
        (
            body(
                json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}),
            ),
            "tools[0].function.parameters",
        ),
        (
            body(json!({"tools": [weather_tool()], "tool_choice": "always"})),
            "tool_choice",
        ),
        (
            body(json!({"tools": [weather_tool()], "tool_choice": 3})),
            "tool_choice",
        ),
        (
            body(
                json!({"tools": [weather_tool()], "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            ),
            "tool_choice.function.name",
        ),
        (body(json!({"tool_choice": "required"})), "tool_choice"),
    ];
    for (b, path) in invalid {
        assert_refused(&b, Kind::Invalid, path);
    }
    assert_refused(
        &body(json!({"tools": [{"type": "custom", "custom": {"name": "g"}}]})),
        Kind::Unsupported,
        "tools[0].type",
    );
}

#[test]
fn bad_tool_calls_and_results_are_refused_naming_the_path() {
    let ok_answer = json!({"role": "tool", "tool_call_id": "c1", "content": "r"});
    let invalid: Vec<(Value, &str)> = vec![
        (
            with_call(json!("{not json"), ok_answer.clone()),
            "messages[1].tool_calls[0].function.arguments",
        ),
        (
            with_call(json!("[1]"), ok_answer.clone()),
            "messages[1].tool_calls[0].function.arguments",
        ),
        (
            with_call(json!(7), ok_answer.clone()),
            "messages[1].tool_calls[0].function.arguments",
        ),
        (
            with_call(
                json!("{}"),
                json!({"role": "tool", "tool_call_id": "c9", "content": "r"}),
            ),
            "messages[2].tool_call_id",
        ),
        (
            with_call(json!("{}"), json!({"role": "tool", "content": "r"})),
            "messages[2].tool_call_id",
        ),
        (
            with_call(
                json!("{}"),
                json!({"role": "tool", "tool_call_id": "c1", "content": 5}),
            ),
            "messages[2].content",
        ),
        (
            with_call(
                json!("{}"),
                json!({"role": "tool", "tool_call_id": "c1", "content": [{"type": "image_url"}]}),
            ),
            "messages[2].content[0]",
        ),
        (
            body(json!({"messages": [{"role": "assistant", "tool_calls": {"id": "c"}}]})),
            "messages[0].tool_calls",
        ),
        (
            body(
                json!({"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}),
            ),
            "messages[0].tool_calls[0].id",
        ),
    ];
    for (b, path) in invalid {
        assert_refused(&b, Kind::Invalid, path);
    }
    let unsupported: Vec<(Value, &str)> = vec![
        (
            body(
                json!({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "custom", "custom": {}}]}]}),
            ),
            "messages[0].tool_calls[0].type",
        ),
        (
            with_call(
                json!("{}"),
                json!({"role": "tool", "tool_call_id": "c1", "content": "r", "extra": 1}),
            ),
            "messages[2].extra",
        ),
    ];
    for (b, path) in unsupported {
        assert_refused(&b, Kind::Unsupported, path);
    }
}
