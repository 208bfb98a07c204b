//! The messages of a chat-completions body: system and developer texts
//! hoisted out in order, user and assistant turns with their text and image
//! parts, same-role neighbours merged. Part of `chat`'s reading.

use serde_json::{Map, Value};

use super::{TranslateError, invalid, kind, unsupported};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    User,
    Assistant,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Image {
    /// A `data:` URL: its media type and base64 data.
    Data { media_type: String, data: String },
    /// An http(s) URL.
    Url(String),
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Part {
    Text(String),
    /// The image and the path of its content part (for the target's errors).
    Image(Image, String),
}

/// One user or assistant turn, same-role neighbours already merged.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Turn {
    pub role: Role,
    pub parts: Vec<Part>,
}

/// The system texts and the merged user/assistant turns.
pub(crate) fn read_messages(
    messages: Option<&Value>,
) -> Result<(Vec<String>, Vec<Turn>), TranslateError> {
    let list = match messages {
        Some(Value::Array(list)) if !list.is_empty() => list,
        Some(Value::Array(_)) => {
            return Err(invalid("messages", "at least one message is required"));
        }
        None | Some(Value::Null) => return Err(invalid("messages", "required")),
        Some(v) => return Err(invalid("messages", format!("an array, not {}", kind(v)))),
    };
    let mut system = Vec::new();
    let mut turns: Vec<Turn> = Vec::new();
    for (i, m) in list.iter().enumerate() {
        let at = format!("messages[{i}]");
        let Some(m) = m.as_object() else {
            return Err(invalid(
                at,
                format!("a message is an object, not {}", kind(m)),
            ));
        };
        let role = match m.get("role") {
            Some(Value::String(r)) => r.as_str(),
            _ => return Err(invalid(format!("{at}.role"), "required: a string")),
        };
        match role {
            "system" | "developer" => system.extend(texts(m, &at)?),
            "user" => push(&mut turns, Role::User, content(m, &at, Role::User)?),
            "assistant" => push(
                &mut turns,
                Role::Assistant,
                content(m, &at, Role::Assistant)?,
            ),
            "tool" | "function" => {
                return Err(unsupported(
                    format!("{at}.role"),
                    format!("\"{role}\" messages: tool (function) calling is not translated"),
                ));
            }
            other => {
                return Err(invalid(
                    format!("{at}.role"),
                    format!("unknown role \"{other}\""),
                ));
            }
        }
    }
    if turns.is_empty() {
        return Err(unsupported(
            "messages",
            "no user or assistant message: Anthropic and Gemini need at least one",
        ));
    }
    Ok((system, turns))
}

/// Append a turn, merged into the last one when it has the same role (both
/// targets want user and assistant turns to alternate).
fn push(turns: &mut Vec<Turn>, role: Role, parts: Vec<Part>) {
    match turns.last_mut() {
        Some(last) if last.role == role => last.parts.extend(parts),
        _ => turns.push(Turn { role, parts }),
    }
}

/// Keys a message may carry besides `role` and `content`: `name` is dropped
/// (neither target has per-message names), as is an assistant's `refusal`.
fn check_message_keys(
    m: &Map<String, Value>,
    at: &str,
    role: Option<Role>,
) -> Result<(), TranslateError> {
    for (key, value) in m {
        match key.as_str() {
            "role" | "content" | "name" => {}
            "refusal" if role == Some(Role::Assistant) => {}
            "tool_calls" | "function_call" if role == Some(Role::Assistant) => {
                if !value.is_null() && !value.as_array().is_some_and(Vec::is_empty) {
                    return Err(unsupported(
                        format!("{at}.{key}"),
                        "tool (function) calling is not translated",
                    ));
                }
            }
            "audio" if role == Some(Role::Assistant) && !value.is_null() => {
                return Err(unsupported(
                    format!("{at}.audio"),
                    "audio is not translated",
                ));
            }
            _ if value.is_null() => {}
            _ => {
                return Err(unsupported(
                    format!("{at}.{key}"),
                    "not a message field the translation knows",
                ));
            }
        }
    }
    Ok(())
}

/// A system or developer message's texts: a string, or text parts.
fn texts(m: &Map<String, Value>, at: &str) -> Result<Vec<String>, TranslateError> {
    check_message_keys(m, at, None)?;
    let parts = match m.get("content") {
        Some(Value::String(s)) => vec![Part::Text(s.clone())],
        Some(Value::Array(parts)) => parts
            .iter()
            .enumerate()
            .map(|(j, p)| text_part(p, &format!("{at}.content[{j}]")))
            .collect::<Result<_, _>>()?,
        _ => {
            return Err(invalid(
                format!("{at}.content"),
                "a string or an array of text parts",
            ));
        }
    };
    Ok(parts
        .into_iter()
        .filter_map(|p| match p {
            Part::Text(t) if !t.is_empty() => Some(t),
            _ => None,
        })
        .collect())
}

fn text_part(p: &Value, at: &str) -> Result<Part, TranslateError> {
    match p.get("type").and_then(Value::as_str) {
        Some("text") => match p.get("text") {
            Some(Value::String(t)) => Ok(Part::Text(t.clone())),
            _ => Err(invalid(format!("{at}.text"), "required: a string")),
        },
        Some(other) => Err(invalid(
            format!("{at}.type"),
            format!("\"{other}\": only text parts are allowed here"),
        )),
        None => Err(invalid(format!("{at}.type"), "required")),
    }
}

/// A user or assistant message's parts (empty texts left out).
fn content(m: &Map<String, Value>, at: &str, role: Role) -> Result<Vec<Part>, TranslateError> {
    check_message_keys(m, at, Some(role))?;
    let parts = match m.get("content") {
        Some(Value::String(s)) => vec![Part::Text(s.clone())],
        Some(Value::Array(parts)) => {
            let mut out = Vec::new();
            for (j, p) in parts.iter().enumerate() {
                out.push(part(p, &format!("{at}.content[{j}]"), role)?);
            }
            out
        }
        None | Some(Value::Null) => return Err(invalid(format!("{at}.content"), "required")),
        Some(v) => {
            return Err(invalid(
                format!("{at}.content"),
                format!("a string or an array of parts, not {}", kind(v)),
            ));
        }
    };
    let parts: Vec<Part> = parts
        .into_iter()
        .filter(|p| !matches!(p, Part::Text(t) if t.is_empty()))
        .collect();
    if parts.is_empty() {
        return Err(unsupported(
            format!("{at}.content"),
            "an empty message: Anthropic and Gemini refuse empty content",
        ));
    }
    Ok(parts)
}

fn part(p: &Value, at: &str, role: Role) -> Result<Part, TranslateError> {
    match p.get("type").and_then(Value::as_str) {
        Some("text") => text_part(p, at),
        // An assistant's earlier refusal is text it said.
        Some("refusal") if role == Role::Assistant => match p.get("refusal") {
            Some(Value::String(t)) => Ok(Part::Text(t.clone())),
            _ => Err(invalid(format!("{at}.refusal"), "required: a string")),
        },
        Some("image_url") if role == Role::User => image(p, at),
        Some(other @ ("input_audio" | "file")) => Err(unsupported(
            format!("{at}.type"),
            format!("\"{other}\" parts are not translated"),
        )),
        Some(other) => Err(unsupported(
            format!("{at}.type"),
            format!("\"{other}\" parts are not translated in a message of this role"),
        )),
        None => Err(invalid(format!("{at}.type"), "required")),
    }
}

/// An `image_url` part: a base64 `data:` URL or an http(s) URL (`detail`
/// is dropped: neither target has it).
fn image(p: &Value, at: &str) -> Result<Part, TranslateError> {
    let url_at = format!("{at}.image_url.url");
    let Some(url) = p.pointer("/image_url/url").and_then(Value::as_str) else {
        return Err(invalid(url_at, "required: a string"));
    };
    let image = if let Some(rest) = url.strip_prefix("data:") {
        let Some((meta, data)) = rest.split_once(',') else {
            return Err(invalid(url_at, "a data: URL without a comma"));
        };
        let Some(meta) = meta.strip_suffix(";base64") else {
            return Err(unsupported(url_at, "only base64 data: URLs are translated"));
        };
        let media_type = meta.split(';').next().unwrap_or("").to_string();
        if media_type.is_empty() {
            return Err(invalid(url_at, "a data: URL without a media type"));
        }
        Image::Data {
            media_type,
            data: data.to_string(),
        }
    } else if url.starts_with("https://") || url.starts_with("http://") {
        Image::Url(url.to_string())
    } else {
        return Err(invalid(url_at, "an http(s) or a data: URL"));
    };
    Ok(Part::Image(image, at.to_string()))
}
