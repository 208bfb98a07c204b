//! Chat-completions <-> Anthropic Messages (`POST /v1/messages`).
//!
//! Facts used here (reference section 3, and Anthropic's docs):
//! - `max_tokens` is required; `DEFAULT_MAX_TOKENS` stands in when the chat
//!   body has none.
//! - `temperature` is 0..1 (OpenAI allows 0..2: above 1 is Unsupported);
//!   current models refuse `temperature` and `top_p` together ("`temperature`
//!   and `top_p` cannot both be specified for this model"), so `top_p` is
//!   sent only without `temperature`.
//! - There is no `seed` (dropped), no `n`, no presence/frequency penalty.
//! - Structured output is `output_config.format = {"type": "json_schema",
//!   "schema": ...}` on the models that take it, with the schema fitted as
//!   for docket's own requests (see `add_format`) (Anthropic structured outputs,
//!   https://platform.claude.com/docs/en/build-with-claude/structured-outputs;
//!   the SDKs' `OutputConfig { format: JSONOutputFormat }`). There is no JSON
//!   mode without a schema: `json_object` is dropped (the prompt that asks
//!   for JSON still does).
//! - Images are `{"type": "image", "source": {"type": "base64", "media_type",
//!   "data"}}` (jpeg, png, gif, webp) or `{"source": {"type": "url", "url"}}`.
//! - The answer's `input_tokens` excludes cached tokens: the prompt is
//!   `input_tokens + cache_creation_input_tokens + cache_read_input_tokens`.

use crate::StructuredOutput;
use serde_json::{Value, json};

use super::chat::{self, Chat, Format, Image, Part, Role, ToolChoice};
use super::{TranslateError, invalid, kind, unsupported};

/// `max_tokens` when the chat body sets neither `max_tokens` nor
/// `max_completion_tokens` (Anthropic requires one; 4096 is what Anthropic's
/// own examples use and fits every current model's output limit).
pub const DEFAULT_MAX_TOKENS: u64 = 4096;

/// The media types Anthropic's base64 image source accepts.
const IMAGE_TYPES: &[&str] = &["image/jpeg", "image/png", "image/gif", "image/webp"];

/// OpenAI chat-completions request body -> Anthropic Messages request body (`model` kept).
pub fn chat_to_anthropic(body: &Value) -> Result<Value, TranslateError> {
    let chat = chat::read(body)?;
    refuse_missing(&chat)?;
    refuse_blank_stops(&chat, body.get("stop").is_some_and(Value::is_string))?;
    let mut out = json!({
        "model": chat.model,
        "max_tokens": chat.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
        "messages": messages(&chat)?,
    });
    match chat.system.as_slice() {
        [] => {}
        [one] => out["system"] = json!(one),
        many => {
            out["system"] = many
                .iter()
                .map(|t| json!({"type": "text", "text": t}))
                .collect()
        }
    }
    if let Some(t) = chat.temperature {
        out["temperature"] = json!(t);
    } else if let Some(p) = chat.top_p {
        out["top_p"] = json!(p);
    }
    if !chat.stop.is_empty() {
        out["stop_sequences"] = json!(chat.stop);
    }
    add_tools(&chat, &mut out);
    if let Format::JsonSchema(schema) = &chat.format {
        add_format(&chat.model, schema, &mut out);
    }
    Ok(out)
}

/// A `json_schema` response format, by the rule docket's own requests
/// follow (`anthropic_schema::native_for` under `auto`): a model that takes
/// structured outputs gets `output_config.format` with the schema fitted
/// (the keywords the API refuses, e.g. `minimum`, taken out and said in
/// words at the end of the system prompt); an older model, or a schema the
/// parameter cannot carry (recursive, an open map), gets the whole schema as
/// an instruction in the system prompt instead.
fn add_format(model: &str, schema: &Value, out: &mut Value) {
    const NAME: &str = "response_format";
    let fitted = crate::anthropic_schema::native_for(model, StructuredOutput::Auto, Some(schema));
    let instruction = match &fitted {
        Some(f) => {
            out["output_config"] = json!({"format": {"type": "json_schema", "schema": f.schema}});
            crate::anthropic_schema::constraints_instruction(NAME, &f.dropped)
        }
        None => Some(crate::anthropic_schema::schema_instruction(NAME, schema)),
    };
    let Some(instruction) = instruction else {
        return;
    };
    out["system"] = match out.get("system") {
        None => json!(instruction),
        Some(Value::String(s)) => json!(format!("{s}\n\n{instruction}")),
        Some(Value::Array(blocks)) => {
            let mut blocks = blocks.clone();
            blocks.push(json!({"type": "text", "text": instruction}));
            Value::Array(blocks)
        }
        Some(other) => other.clone(),
    };
}

/// `tools` (`input_schema` is the parameters' schema; a tool without one
/// takes an empty object) and `tool_choice` (`required` is Anthropic's
/// `any`); neither is sent without tools.
fn add_tools(chat: &Chat, out: &mut Value) {
    if chat.tools.is_empty() {
        return;
    }
    let tools: Vec<Value> = chat
        .tools
        .iter()
        .map(|t| {
            let schema = t
                .parameters
                .clone()
                .unwrap_or_else(|| json!({"type": "object", "properties": {}}));
            let mut v = json!({"name": t.name, "input_schema": schema});
            if let Some(d) = &t.description {
                v["description"] = json!(d);
            }
            v
        })
        .collect();
    out["tools"] = Value::Array(tools);
    if let Some(choice) = &chat.tool_choice {
        out["tool_choice"] = match choice {
            ToolChoice::None => json!({"type": "none"}),
            ToolChoice::Auto => json!({"type": "auto"}),
            ToolChoice::Required => json!({"type": "any"}),
            ToolChoice::Named(name) => json!({"type": "tool", "name": name}),
        };
    }
}

/// Anthropic refuses an empty or whitespace-only stop sequence ("each stop
/// sequence must contain non-whitespace", a 400 seen by many, e.g.
/// BerriAI/litellm#3286); OpenAI's common `"\n"` stop is one. Dropping it
/// would change the answer, so it is refused here.
fn refuse_blank_stops(chat: &Chat, one_string: bool) -> Result<(), TranslateError> {
    match chat.stop.iter().position(|s| s.trim().is_empty()) {
        None => Ok(()),
        Some(i) => Err(unsupported(
            if one_string {
                "stop".to_string()
            } else {
                format!("stop[{i}]")
            },
            "Anthropic refuses a stop sequence that is empty or only whitespace",
        )),
    }
}

/// What Anthropic has no way to say.
fn refuse_missing(chat: &Chat) -> Result<(), TranslateError> {
    if let Some(t) = chat.temperature.filter(|t| *t > 1.0) {
        return Err(unsupported(
            "temperature",
            format!("{t}: Anthropic's temperature goes from 0 to 1"),
        ));
    }
    for (key, v) in [
        ("presence_penalty", chat.presence_penalty),
        ("frequency_penalty", chat.frequency_penalty),
    ] {
        if v.is_some_and(|v| v != 0.0) {
            return Err(unsupported(
                key,
                "Anthropic has no presence or frequency penalty",
            ));
        }
    }
    Ok(())
}

fn messages(chat: &Chat) -> Result<Vec<Value>, TranslateError> {
    chat.turns
        .iter()
        .map(|turn| {
            let role = match turn.role {
                Role::User => "user",
                Role::Assistant => "assistant",
            };
            let content = match turn.parts.as_slice() {
                [Part::Text(t)] => json!(t),
                parts => Value::Array(parts.iter().map(block).collect::<Result<_, _>>()?),
            };
            Ok(json!({"role": role, "content": content}))
        })
        .collect()
}

fn block(part: &Part) -> Result<Value, TranslateError> {
    match part {
        Part::Text(t) => Ok(json!({"type": "text", "text": t})),
        Part::Image(Image::Data { media_type, data }, at) => {
            if !IMAGE_TYPES.contains(&media_type.as_str()) {
                return Err(unsupported(
                    format!("{at}.image_url.url"),
                    format!("{media_type}: Anthropic takes jpeg, png, gif or webp images"),
                ));
            }
            Ok(
                json!({"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}),
            )
        }
        Part::Image(Image::Url(url), _) => {
            Ok(json!({"type": "image", "source": {"type": "url", "url": url}}))
        }
        Part::ToolCall { id, name, args } => {
            Ok(json!({"type": "tool_use", "id": id, "name": name, "input": args}))
        }
        Part::ToolResult { id, content, .. } => {
            Ok(json!({"type": "tool_result", "tool_use_id": id, "content": content}))
        }
    }
}

/// Anthropic Messages response (a `message` object) -> OpenAI `chat.completion` response body.
pub fn anthropic_to_chat(message: &Value) -> Result<Value, TranslateError> {
    let Some(obj) = message.as_object() else {
        return Err(invalid(
            "$",
            format!("an Anthropic message is an object, not {}", kind(message)),
        ));
    };
    match obj.get("type").and_then(Value::as_str) {
        None | Some("message") => {}
        Some("error") => {
            let msg = message
                .pointer("/error/message")
                .and_then(Value::as_str)
                .unwrap_or("");
            return Err(invalid("type", format!("an error, not a message: {msg}")));
        }
        Some(other) => return Err(invalid("type", format!("\"{other}\", not \"message\""))),
    }
    let Some(blocks) = obj.get("content").and_then(Value::as_array) else {
        return Err(invalid("content", "required: an array of blocks"));
    };
    let (text, tool_calls) = read_blocks(blocks)?;
    let finish = match obj.get("stop_reason").and_then(Value::as_str) {
        // Never null outside streams; read as a normal end if it is.
        None | Some("end_turn") | Some("stop_sequence") | Some("pause_turn") => "stop",
        Some("max_tokens") | Some("model_context_window_exceeded") => "length",
        Some("tool_use") => "tool_calls",
        Some("refusal") => "content_filter",
        Some(other) => other,
    };
    let u = obj.get("usage");
    let field = |k: &str| super::count(u.and_then(|u| u.get(k)));
    let cached = field("cache_read_input_tokens");
    let prompt = field("input_tokens")
        .saturating_add(field("cache_creation_input_tokens"))
        .saturating_add(cached);
    let id = match obj.get("id").and_then(Value::as_str) {
        Some(id) if !id.is_empty() => id.to_string(),
        _ => super::generated_id("chatcmpl-"),
    };
    let model = obj.get("model").and_then(Value::as_str).unwrap_or("");
    let choice = super::choice(0, text, tool_calls, finish);
    let usage = super::usage(prompt, field("output_tokens"), cached, 0);
    Ok(super::completion(id, model, vec![choice], usage))
}

/// The text blocks joined (None when there is none) and the `tool_use`
/// blocks as chat tool calls; `thinking` and other blocks are skipped.
fn read_blocks(blocks: &[Value]) -> Result<(Option<String>, Vec<Value>), TranslateError> {
    let mut text: Option<String> = None;
    let mut calls = Vec::new();
    for (i, b) in blocks.iter().enumerate() {
        match b.get("type").and_then(Value::as_str) {
            Some("text") => {
                let Some(t) = b.get("text").and_then(Value::as_str) else {
                    return Err(invalid(format!("content[{i}].text"), "required: a string"));
                };
                text.get_or_insert_with(String::new).push_str(t);
            }
            Some("tool_use") => {
                let id = b.get("id").and_then(Value::as_str).unwrap_or("");
                let name = b.get("name").and_then(Value::as_str).unwrap_or("");
                let input = b.get("input").cloned().unwrap_or_else(|| json!({}));
                calls.push(json!({
                    "id": id,
                    "type": "function",
                    "function": {"name": name, "arguments": input.to_string()},
                }));
            }
            Some(_) => {}
            None => return Err(invalid(format!("content[{i}].type"), "required")),
        }
    }
    Ok((text, calls))
}
