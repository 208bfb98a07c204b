//! "Bring your own requests": an OpenAI chat-completions request body (a
//! line of an OpenAI Batch API file, as the user wrote it) translated into an
//! Anthropic Messages or a Gemini `generateContent` request, and the
//! provider's answer translated back into an OpenAI `chat.completion`
//! response body, so a results file has the OpenAI Batch output shape
//! whatever the provider.
//!
//! Pure functions over `serde_json::Value`: no I/O. The request side goes
//! through one provider-neutral reading of the chat body (`chat`), which
//! decides what every chat field becomes; `anthropic` and `gemini` then
//! write it in their provider's words and read their provider's answer.
//!
//! Nothing is guessed: a valid chat field with no equivalent is
//! `TranslateError::Unsupported`, a body that is not a valid chat request
//! (or an answer that is not the provider's) is `TranslateError::Invalid`,
//! each naming the JSON path (`messages[2].content[1].type`). Fields that
//! only mean something to OpenAI (`user`, `store`, `metadata`, ...) are
//! dropped; the list is `chat::DROPPED` and README.md has the whole table
//! ("Bring your own requests: translation to Anthropic and Gemini").

mod anthropic;
mod chat;
mod gemini;
mod messages;
#[cfg(test)]
mod tests;

use serde_json::{Value, json};

pub use anthropic::{DEFAULT_MAX_TOKENS, anthropic_to_chat, chat_to_anthropic};
pub use gemini::{GeminiRequest, chat_to_gemini, gemini_to_chat};

/// What cannot be translated, naming the JSON path (e.g. `messages[2].content[1].type`).
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum TranslateError {
    /// A valid chat field with no equivalent at the provider.
    #[error("{path}: {reason}")]
    Unsupported { path: String, reason: String },
    /// Not a valid chat body, or not a valid provider answer.
    #[error("{path}: {reason}")]
    Invalid { path: String, reason: String },
}

impl TranslateError {
    /// The JSON path the error names.
    pub fn path(&self) -> &str {
        match self {
            TranslateError::Unsupported { path, .. } | TranslateError::Invalid { path, .. } => path,
        }
    }
}

pub(crate) fn unsupported(path: impl Into<String>, reason: impl Into<String>) -> TranslateError {
    TranslateError::Unsupported {
        path: path.into(),
        reason: reason.into(),
    }
}

pub(crate) fn invalid(path: impl Into<String>, reason: impl Into<String>) -> TranslateError {
    TranslateError::Invalid {
        path: path.into(),
        reason: reason.into(),
    }
}

/// The JSON type of a value, for error messages.
pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// An id for an answer that carries none: `chatcmpl-` and 24 hex digits,
/// the shape of OpenAI's own ids.
pub(crate) fn generated_id(prefix: &str) -> String {
    let a: u64 = rand::random();
    let b: u32 = rand::random();
    format!("{prefix}{a:016x}{b:08x}")
}

/// A token count read leniently: a non-negative integer, else 0 (a usage
/// block is informative; a garbled count must not lose the answer).
pub(crate) fn count(v: Option<&Value>) -> u64 {
    v.and_then(Value::as_u64).unwrap_or(0)
}

/// The `usage` object of a chat.completion.
pub(crate) fn usage(prompt: u64, completion: u64, cached: u64, reasoning: u64) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt.saturating_add(completion),
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    })
}

/// One `choices[]` entry: the assistant message (content null when there is
/// no text), its tool calls when there are any, and the finish reason.
pub(crate) fn choice(
    index: usize,
    text: Option<String>,
    tool_calls: Vec<Value>,
    finish: &str,
) -> Value {
    let mut message = json!({"role": "assistant", "content": text, "refusal": null});
    if !tool_calls.is_empty() {
        message["tool_calls"] = Value::Array(tool_calls);
    }
    json!({
        "index": index,
        "message": message,
        "logprobs": null,
        "finish_reason": finish,
    })
}

/// The `chat.completion` body around its choices.
pub(crate) fn completion(id: String, model: &str, choices: Vec<Value>, usage: Value) -> Value {
    json!({
        "id": id,
        "object": "chat.completion",
        "created": chrono::Utc::now().timestamp(),
        "model": model,
        "choices": choices,
        "usage": usage,
    })
}
