//! One provider-neutral reading of an OpenAI chat-completions request body:
//! what every field becomes, decided once for both targets. `anthropic` and
//! `gemini` then only write `Chat` in their own words (and refuse what their
//! provider alone lacks).
//!
//! Field names and value ranges follow OpenAI's chat-completions reference
//! (`CreateChatCompletionRequest`, https://platform.openai.com/docs/api-reference/chat/create).

use serde_json::{Map, Value};

use super::messages::read_messages;
pub(crate) use super::messages::{Image, Part, Role, Turn};
use super::{TranslateError, invalid, kind, unsupported};

/// Fields that only mean something to OpenAI: dropped, whatever their value
/// (README table, "dropped").
pub(crate) const DROPPED: &[&str] = &[
    "user",
    "store",
    "metadata",
    "parallel_tool_calls",
    "stream_options",
    "service_tier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "safety_identifier",
];

/// Valid chat fields that ask for something neither translation gives:
/// refused as Unsupported unless `harmless` says their value asks for nothing.
const REFUSED: &[(&str, &str)] = &[
    ("tools", "tool (function) calling is not translated"),
    ("tool_choice", "tool (function) calling is not translated"),
    ("functions", "function calling is not translated"),
    ("function_call", "function calling is not translated"),
    ("logprobs", "log probabilities are not translated"),
    ("top_logprobs", "log probabilities are not translated"),
    ("logit_bias", "neither Anthropic nor Gemini has logit_bias"),
    ("audio", "audio output is not translated"),
    ("modalities", "only text output is translated"),
    ("prediction", "predicted outputs are OpenAI's alone"),
    ("reasoning_effort", "reasoning settings are not translated"),
    ("verbosity", "verbosity is OpenAI's alone"),
    ("web_search_options", "web search is not translated"),
];

/// The fields `read` translates itself.
const TRANSLATED: &[&str] = &[
    "model",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "stop",
    "seed",
    "n",
    "response_format",
    "stream",
    "presence_penalty",
    "frequency_penalty",
];

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Format {
    Text,
    JsonObject,
    JsonSchema(Value),
}

/// The chat body, read.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Chat {
    pub model: String,
    /// The system and developer messages' texts, in order.
    pub system: Vec<String>,
    pub turns: Vec<Turn>,
    pub max_tokens: Option<u64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub stop: Vec<String>,
    pub seed: Option<i64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub format: Format,
}

/// Read a chat-completions request body.
pub(crate) fn read(body: &Value) -> Result<Chat, TranslateError> {
    let Some(obj) = body.as_object() else {
        return Err(invalid(
            "$",
            format!("a chat request is a JSON object, not {}", kind(body)),
        ));
    };
    check_fields(obj)?;
    let model = match obj.get("model") {
        Some(Value::String(m)) if !m.trim().is_empty() => m.clone(),
        Some(Value::String(_)) | None | Some(Value::Null) => {
            return Err(invalid("model", "required"));
        }
        Some(v) => return Err(invalid("model", format!("a string, not {}", kind(v)))),
    };
    let (system, turns) = read_messages(obj.get("messages"))?;
    if matches!(obj.get("stream"), Some(Value::Bool(true))) {
        return Err(invalid(
            "stream",
            "true asks for a stream; batch and sync results are not streams",
        ));
    }
    if let Some(v) = present(obj, "stream").filter(|v| !v.is_boolean()) {
        return Err(invalid("stream", format!("a boolean, not {}", kind(v))));
    }
    check_n(obj)?;
    let max_tokens = match present(obj, "max_completion_tokens") {
        Some(_) => positive(obj, "max_completion_tokens")?,
        None => positive(obj, "max_tokens")?,
    };
    Ok(Chat {
        model,
        system,
        turns,
        max_tokens,
        temperature: number(obj, "temperature", 0.0, 2.0)?,
        top_p: number(obj, "top_p", 0.0, 1.0)?,
        stop: stop(obj)?,
        seed: seed(obj)?,
        presence_penalty: number(obj, "presence_penalty", -2.0, 2.0)?,
        frequency_penalty: number(obj, "frequency_penalty", -2.0, 2.0)?,
        format: format(obj)?,
    })
}

/// A field's value, with `null` read as absent (OpenAI accepts null for
/// every optional field).
fn present<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

/// Every top-level field is translated, dropped or refused; one nobody
/// knows is refused too (a new OpenAI field may ask for something the
/// translation would silently lose).
fn check_fields(obj: &Map<String, Value>) -> Result<(), TranslateError> {
    for (key, value) in obj {
        if TRANSLATED.contains(&key.as_str()) || DROPPED.contains(&key.as_str()) {
            continue;
        }
        if value.is_null() || harmless(key, value) {
            continue;
        }
        let reason = REFUSED
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, r)| (*r).to_string())
            .unwrap_or_else(|| "not a chat-completions field the translation knows".to_string());
        return Err(unsupported(key.as_str(), reason));
    }
    Ok(())
}

/// A refused field's value that asks for nothing (`logprobs: false`, an
/// empty `logit_bias`, `modalities: ["text"]`, no tools, `tool_choice: "none"`).
fn harmless(key: &str, value: &Value) -> bool {
    match key {
        "logprobs" => value == &Value::Bool(false),
        "logit_bias" | "tools" | "functions" => {
            value.as_object().is_some_and(Map::is_empty)
                || value.as_array().is_some_and(Vec::is_empty)
        }
        "modalities" => value == &serde_json::json!(["text"]),
        "tool_choice" | "function_call" => value.as_str() == Some("none"),
        _ => false,
    }
}

fn check_n(obj: &Map<String, Value>) -> Result<(), TranslateError> {
    match present(obj, "n") {
        None => Ok(()),
        Some(v) => match v.as_i64() {
            Some(1) => Ok(()),
            Some(n) if n > 1 => Err(unsupported(
                "n",
                format!("{n} choices: only n = 1 is translated"),
            )),
            _ => Err(invalid("n", format!("a positive integer, not {v}"))),
        },
    }
}

fn positive(obj: &Map<String, Value>, key: &str) -> Result<Option<u64>, TranslateError> {
    match present(obj, key) {
        None => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => Ok(Some(n)),
            _ => Err(invalid(key, format!("a positive integer, not {v}"))),
        },
    }
}

fn number(
    obj: &Map<String, Value>,
    key: &str,
    min: f64,
    max: f64,
) -> Result<Option<f64>, TranslateError> {
    match present(obj, key) {
        None => Ok(None),
        Some(v) => match v.as_f64() {
            Some(x) if (min..=max).contains(&x) => Ok(Some(x)),
            _ => Err(invalid(
                key,
                format!("a number from {min} to {max}, not {v}"),
            )),
        },
    }
}

fn seed(obj: &Map<String, Value>) -> Result<Option<i64>, TranslateError> {
    match present(obj, "seed") {
        None => Ok(None),
        Some(v) => v
            .as_i64()
            .map(Some)
            .ok_or_else(|| invalid("seed", format!("an integer, not {v}"))),
    }
}

/// `stop`: a string or an array of strings.
fn stop(obj: &Map<String, Value>) -> Result<Vec<String>, TranslateError> {
    match present(obj, "stop") {
        None => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, s)| {
                s.as_str().map(str::to_string).ok_or_else(|| {
                    invalid(format!("stop[{i}]"), format!("a string, not {}", kind(s)))
                })
            })
            .collect(),
        Some(v) => Err(invalid(
            "stop",
            format!("a string or an array of strings, not {}", kind(v)),
        )),
    }
}

/// `response_format`: text, json_object, or json_schema with its schema.
fn format(obj: &Map<String, Value>) -> Result<Format, TranslateError> {
    let Some(rf) = present(obj, "response_format") else {
        return Ok(Format::Text);
    };
    match rf.get("type").and_then(Value::as_str) {
        Some("text") => Ok(Format::Text),
        Some("json_object") => Ok(Format::JsonObject),
        Some("json_schema") => match rf.pointer("/json_schema/schema") {
            Some(s) if s.is_object() => Ok(Format::JsonSchema(s.clone())),
            _ => Err(invalid(
                "response_format.json_schema.schema",
                "a JSON Schema object is required",
            )),
        },
        Some(other) => Err(unsupported(
            "response_format.type",
            format!("\"{other}\" is not translated"),
        )),
        None => Err(invalid(
            "response_format.type",
            "required: text, json_object or json_schema",
        )),
    }
}
