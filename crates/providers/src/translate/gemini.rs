//! Chat-completions <-> Gemini `generateContent`
//! (`POST /v1beta/models/{model}:generateContent`).
//!
//! Facts used here (reference section 5.1, python-genai's request mappers,
//! https://ai.google.dev/api/generate-content):
//! - Roles are `user` and `model`; the system prompt is `systemInstruction`.
//! - `generationConfig` holds `maxOutputTokens`, `temperature` (0..2),
//!   `topP`, `stopSequences`, `seed`, `presencePenalty`, `frequencyPenalty`,
//!   and structured output: `responseMimeType: "application/json"` with the
//!   JSON Schema in `responseJsonSchema` (`responseSchema` takes an OpenAPI
//!   subset instead; `$schema` is not among the accepted keywords, so it is
//!   removed, as `crate::gemini` does).
//! - Images are `inlineData {mimeType, data}` (base64). `fileData` takes
//!   uploaded-file URIs, not arbitrary web URLs: an http(s) image is Unsupported.
//! - The answer: `candidates[].content.parts[].text` (parts with
//!   `thought: true` are thoughts, skipped), `finishReason`, `usageMetadata`
//!   (`thoughtsTokenCount` is billed as output), `responseId`; a blocked
//!   prompt has no candidates and a `promptFeedback.blockReason`.

use serde_json::{Map, Value, json};

use super::chat::{self, Chat, Format, Image, Part, Role};
use super::{TranslateError, invalid, kind, unsupported};

/// The Gemini request for a chat body: the model (`models/...` prefix stripped) goes in the URL.
#[derive(Debug, Clone, PartialEq)]
pub struct GeminiRequest {
    pub model: String,
    pub body: Value,
}

/// OpenAI chat-completions request body -> the Gemini model and `generateContent` body.
pub fn chat_to_gemini(body: &Value) -> Result<GeminiRequest, TranslateError> {
    let chat = chat::read(body)?;
    let model = chat
        .model
        .strip_prefix("models/")
        .unwrap_or(&chat.model)
        .to_string();
    let mut out = json!({"contents": contents(&chat)?});
    if !chat.system.is_empty() {
        let parts: Vec<Value> = chat.system.iter().map(|t| json!({"text": t})).collect();
        out["systemInstruction"] = json!({"parts": parts});
    }
    let config = generation_config(&chat);
    if !config.is_empty() {
        out["generationConfig"] = Value::Object(config);
    }
    Ok(GeminiRequest { model, body: out })
}

fn generation_config(chat: &Chat) -> Map<String, Value> {
    let mut c = Map::new();
    if let Some(n) = chat.max_tokens {
        c.insert("maxOutputTokens".into(), json!(n));
    }
    let numbers = [
        ("temperature", chat.temperature),
        ("topP", chat.top_p),
        ("presencePenalty", chat.presence_penalty),
        ("frequencyPenalty", chat.frequency_penalty),
    ];
    for (key, v) in numbers {
        if let Some(v) = v {
            c.insert(key.into(), json!(v));
        }
    }
    if !chat.stop.is_empty() {
        c.insert("stopSequences".into(), json!(chat.stop));
    }
    if let Some(s) = chat.seed {
        c.insert("seed".into(), json!(s));
    }
    match &chat.format {
        Format::Text => {}
        Format::JsonObject => {
            c.insert("responseMimeType".into(), json!("application/json"));
        }
        Format::JsonSchema(schema) => {
            c.insert("responseMimeType".into(), json!("application/json"));
            let mut schema = schema.clone();
            if let Some(obj) = schema.as_object_mut() {
                obj.remove("$schema");
            }
            c.insert("responseJsonSchema".into(), schema);
        }
    }
    c
}

fn contents(chat: &Chat) -> Result<Vec<Value>, TranslateError> {
    chat.turns
        .iter()
        .map(|turn| {
            let role = match turn.role {
                Role::User => "user",
                Role::Assistant => "model",
            };
            let parts = turn.parts.iter().map(part).collect::<Result<Vec<_>, _>>()?;
            Ok(json!({"role": role, "parts": parts}))
        })
        .collect()
}

fn part(part: &Part) -> Result<Value, TranslateError> {
    match part {
        Part::Text(t) => Ok(json!({"text": t})),
        Part::Image(Image::Data { media_type, data }, _) => {
            Ok(json!({"inlineData": {"mimeType": media_type, "data": data}}))
        }
        Part::Image(Image::Url(_), at) => Err(unsupported(
            format!("{at}.image_url.url"),
            "Gemini takes images inline (a base64 data: URL), not from a web URL",
        )),
    }
}

/// Gemini finish reasons that mean a filter stopped the answer.
fn is_filter(reason: &str) -> bool {
    matches!(
        reason,
        "SAFETY" | "RECITATION" | "BLOCKLIST" | "PROHIBITED_CONTENT" | "SPII" | "IMAGE_SAFETY"
    )
}

/// Gemini `GenerateContentResponse` -> OpenAI `chat.completion` body (`model` from the request).
pub fn gemini_to_chat(response: &Value, model: &str) -> Result<Value, TranslateError> {
    let Some(obj) = response.as_object() else {
        return Err(invalid(
            "$",
            format!("a Gemini response is an object, not {}", kind(response)),
        ));
    };
    if let Some(e) = obj.get("error") {
        let msg = e.get("message").and_then(Value::as_str).unwrap_or("");
        return Err(invalid("error", format!("an error, not a response: {msg}")));
    }
    let candidates = match obj.get("candidates") {
        None | Some(Value::Null) => &[][..],
        Some(Value::Array(c)) => c.as_slice(),
        Some(v) => return Err(invalid("candidates", format!("an array, not {}", kind(v)))),
    };
    let choices = if candidates.is_empty() {
        // A blocked prompt: an answer that says so, not an error.
        match response
            .pointer("/promptFeedback/blockReason")
            .and_then(Value::as_str)
        {
            Some(_) => vec![super::choice(0, None, Vec::new(), "content_filter")],
            None => {
                return Err(invalid(
                    "candidates",
                    "no candidates and no promptFeedback.blockReason",
                ));
            }
        }
    } else {
        candidates
            .iter()
            .enumerate()
            .map(|(i, c)| candidate(i, c))
            .collect::<Result<_, _>>()?
    };
    let u = obj.get("usageMetadata");
    let field = |k: &str| super::count(u.and_then(|u| u.get(k)));
    let thoughts = field("thoughtsTokenCount");
    // OpenAI's completion_tokens include the reasoning tokens.
    let completion = field("candidatesTokenCount").saturating_add(thoughts);
    let usage = super::usage(
        field("promptTokenCount"),
        completion,
        field("cachedContentTokenCount"),
        thoughts,
    );
    let id = match obj.get("responseId").and_then(Value::as_str) {
        Some(id) if !id.is_empty() => id.to_string(),
        _ => super::generated_id("chatcmpl-"),
    };
    let model = model.strip_prefix("models/").unwrap_or(model);
    Ok(super::completion(id, model, choices, usage))
}

/// One candidate as a chat choice.
fn candidate(i: usize, c: &Value) -> Result<Value, TranslateError> {
    let at = format!("candidates[{i}]");
    if !c.is_object() {
        return Err(invalid(
            at,
            format!("a candidate is an object, not {}", kind(c)),
        ));
    }
    let parts = match c.pointer("/content/parts") {
        None | Some(Value::Null) => &[][..],
        Some(Value::Array(p)) => p.as_slice(),
        Some(v) => {
            return Err(invalid(
                format!("{at}.content.parts"),
                format!("an array, not {}", kind(v)),
            ));
        }
    };
    let mut text: Option<String> = None;
    let mut calls = Vec::new();
    for p in parts {
        if p.get("thought").and_then(Value::as_bool) == Some(true) {
            continue;
        }
        if let Some(t) = p.get("text").and_then(Value::as_str) {
            text.get_or_insert_with(String::new).push_str(t);
        } else if let Some(f) = p.get("functionCall") {
            let args = f.get("args").cloned().unwrap_or_else(|| json!({}));
            calls.push(json!({
                "id": f.get("id").and_then(Value::as_str).map(str::to_string)
                    .unwrap_or_else(|| super::generated_id("call_")),
                "type": "function",
                "function": {
                    "name": f.get("name").and_then(Value::as_str).unwrap_or(""),
                    "arguments": args.to_string(),
                },
            }));
        }
    }
    let finish = match c.get("finishReason").and_then(Value::as_str) {
        None | Some("STOP") if !calls.is_empty() => "tool_calls".to_string(),
        None | Some("STOP") | Some("FINISH_REASON_UNSPECIFIED") => "stop".to_string(),
        Some("MAX_TOKENS") => "length".to_string(),
        Some(r) if is_filter(r) => "content_filter".to_string(),
        Some(other) => other.to_ascii_lowercase(),
    };
    let index = c
        .get("index")
        .and_then(Value::as_u64)
        .map_or(i, |n| n as usize);
    Ok(super::choice(index, text, calls, &finish))
}
