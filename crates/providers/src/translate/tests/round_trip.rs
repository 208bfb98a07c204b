//! Round trips over realistic bodies: every text of the chat body reaches
//! each target in order; an answer's text comes back unchanged; and no
//! mangled body makes the translation panic (each gives a result or an error
//! naming a path).

use serde_json::{Value, json};

use crate::translate::{anthropic_to_chat, chat_to_anthropic, chat_to_gemini, gemini_to_chat};

/// Realistic chat bodies: a classifier with a schema, a multi-turn few-shot
/// chat, an image question, a JSON-mode extraction.
fn realistic() -> Vec<Value> {
    vec![
        json!({"model": "gpt-4o-mini", "temperature": 0, "max_tokens": 256,
               "messages": [{"role": "system", "content": "You adjudicate claims."},
                            {"role": "user", "content": "Claim: the sky is green."}],
               "response_format": {"type": "json_schema", "json_schema": {"name": "verdict", "strict": true,
                   "schema": {"type": "object", "properties": {"verdict": {"type": "string", "enum": ["yes", "no"]}},
                              "required": ["verdict"], "additionalProperties": false}}}}),
        json!({"model": "gpt-4.1", "top_p": 0.5, "stop": ["###"], "seed": 1, "user": "team-a",
               "messages": [{"role": "developer", "content": "Label sentiment."},
                            {"role": "user", "content": "I love it"}, {"role": "assistant", "content": "positive"},
                            {"role": "user", "content": "I hate it"}, {"role": "assistant", "content": "negative"},
                            {"role": "user", "content": [{"type": "text", "text": "It is fine"}]}]}),
        json!({"model": "gpt-4o", "max_completion_tokens": 100,
               "messages": [{"role": "user", "content": [{"type": "text", "text": "What is in the picture?"},
                   {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/4AAQ", "detail": "low"}}]}]}),
        json!({"model": "gpt-4o", "response_format": {"type": "json_object"}, "metadata": {"run": "7"},
               "messages": [{"role": "system", "content": [{"type": "text", "text": "Extract fields as JSON."}]},
                            {"role": "user", "content": "Name: Ann, age 31"}]}),
    ]
}

/// The texts of a chat body in order (system messages first, as both
/// targets put them).
fn chat_texts(b: &Value) -> Vec<String> {
    let texts = |m: &Value| -> Vec<String> {
        match &m["content"] {
            Value::String(s) => vec![s.clone()],
            Value::Array(parts) => parts
                .iter()
                .filter_map(|p| p["text"].as_str().map(str::to_string))
                .collect(),
            _ => Vec::new(),
        }
    };
    let msgs = b["messages"].as_array().cloned().unwrap_or_default();
    let is_system = |m: &Value| matches!(m["role"].as_str(), Some("system" | "developer"));
    let system = msgs.iter().filter(|m| is_system(m)).flat_map(texts);
    let rest = msgs.iter().filter(|m| !is_system(m)).flat_map(texts);
    system.chain(rest).collect()
}

fn anthropic_texts(a: &Value) -> Vec<String> {
    let of = |c: &Value| -> Vec<String> {
        match c {
            Value::String(s) => vec![s.clone()],
            Value::Array(blocks) => blocks
                .iter()
                .filter_map(|b| b["text"].as_str().map(str::to_string))
                .collect(),
            _ => Vec::new(),
        }
    };
    let mut out = of(&a["system"]);
    for m in a["messages"].as_array().into_iter().flatten() {
        out.extend(of(&m["content"]));
    }
    out
}

fn gemini_texts(g: &Value) -> Vec<String> {
    let parts = |c: &Value| -> Vec<String> {
        c["parts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["text"].as_str().map(str::to_string))
            .collect()
    };
    let mut out = parts(&g["systemInstruction"]);
    for c in g["contents"].as_array().into_iter().flatten() {
        out.extend(parts(c));
    }
    out
}

#[test]
fn every_text_reaches_both_targets_in_order() {
    for b in realistic() {
        let want = chat_texts(&b);
        let a = chat_to_anthropic(&b).unwrap_or_else(|e| panic!("{b}: {e}"));
        // A json_schema format for a model without structured outputs (these
        // bodies name OpenAI models) is said at the end of the system prompt.
        let mut got = anthropic_texts(&a);
        if b.pointer("/response_format/json_schema").is_some() {
            let system = got.first_mut().expect("a system text");
            let at = system
                .find("Answer with one JSON object")
                .unwrap_or_else(|| panic!("no schema instruction in {a}"));
            system.truncate(at);
            let kept = system.trim_end().to_string();
            *system = kept;
        }
        assert_eq!(got, want, "anthropic for {b}");
        assert_eq!(a["model"], b["model"]);
        let g = chat_to_gemini(&b).unwrap_or_else(|e| panic!("{b}: {e}"));
        assert_eq!(gemini_texts(&g.body), want, "gemini for {b}");
        // Pure: the same body gives the same translation.
        assert_eq!(chat_to_anthropic(&b), Ok(a));
        assert_eq!(chat_to_gemini(&b), Ok(g));
    }
}

#[test]
fn an_answer_text_comes_back_unchanged() {
    for text in [
        "{\"verdict\":\"no\"}",
        "positive",
        "multi\nline \u{e9}\u{1F600}",
        "",
    ] {
        let m = json!({"id": "msg_1", "type": "message", "model": "c", "content": [{"type": "text", "text": text}], "stop_reason": "end_turn"});
        let got = anthropic_to_chat(&m).expect("anthropic");
        assert_eq!(got["choices"][0]["message"]["content"], text);
        let r = json!({"candidates": [{"content": {"parts": [{"text": text}]}, "finishReason": "STOP"}]});
        let got = gemini_to_chat(&r, "g").expect("gemini");
        assert_eq!(got["choices"][0]["message"]["content"], text);
    }
}

/// Values that break a field's type or range.
fn garbage() -> Vec<Value> {
    vec![
        json!(null),
        json!(true),
        json!(-1),
        json!(1e300),
        json!("x"),
        json!([]),
        json!([null]),
        json!({}),
        json!({"type": 1}),
    ]
}

#[test]
fn no_mangled_body_makes_the_translation_panic() {
    for b in realistic() {
        let keys: Vec<String> = b
            .as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default();
        for key in keys {
            for g in garbage() {
                let mut m = b.clone();
                m[key.as_str()] = g.clone();
                for e in [chat_to_anthropic(&m).err(), chat_to_gemini(&m).err()]
                    .into_iter()
                    .flatten()
                {
                    assert!(!e.path().is_empty(), "{key} = {g}: {e}");
                }
            }
        }
        // Each message's fields too.
        for i in 0..b["messages"].as_array().map_or(0, Vec::len) {
            for field in ["role", "content"] {
                let mut refused = 0;
                for g in garbage() {
                    let mut m = b.clone();
                    m["messages"][i][field] = g.clone();
                    for e in [chat_to_anthropic(&m).err(), chat_to_gemini(&m).err()]
                        .into_iter()
                        .flatten()
                    {
                        assert!(
                            e.path().starts_with("messages"),
                            "messages[{i}].{field} = {g}: {e}"
                        );
                        refused += 1;
                    }
                }
                // "x" is a valid content, as is `[]` for a system message; the rest is refused.
                assert!(
                    refused >= 2 * (garbage().len() - 2),
                    "messages[{i}].{field}: {refused}"
                );
            }
        }
    }
}
