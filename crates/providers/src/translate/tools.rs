//! Tool (function) calling in a chat body: the `tools` list, `tool_choice`,
//! an assistant's `tool_calls` and the `tool` messages that answer them,
//! read into provider-neutral parts. The deprecated `functions` /
//! `function_call` pair is not read (refused by `chat`).
//!
//! OpenAI: https://platform.openai.com/docs/api-reference/chat/create
//! (`tools[].function {name, description, parameters, strict}`,
//! `tool_choice` none | auto | required | {type: function, function: {name}},
//! `tool_calls[] {id, type: function, function {name, arguments}}` with the
//! arguments a JSON text, `{role: tool, tool_call_id, content}`).

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::messages::Part;
use super::{TranslateError, invalid, kind};

/// One function the model may call (`strict` is dropped: the targets have
/// no such switch on a declaration).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// The parameters' JSON Schema, when given.
    pub parameters: Option<Value>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ToolChoice {
    None,
    Auto,
    /// Some tool must be called.
    Required,
    /// This tool must be called.
    Named(String),
}

fn string<'a>(v: Option<&'a Value>, at: &str) -> Result<&'a str, TranslateError> {
    match v {
        Some(Value::String(s)) if !s.is_empty() => Ok(s),
        _ => Err(invalid(at, "required: a non-empty string")),
    }
}

/// The `tools` list (absent or null: none).
pub(crate) fn read_tools(v: Option<&Value>) -> Result<Vec<Tool>, TranslateError> {
    let list = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(l)) => l,
        Some(v) => return Err(invalid("tools", format!("an array, not {}", kind(v)))),
    };
    let mut tools = Vec::new();
    for (i, t) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        match t.get("type").and_then(Value::as_str) {
            Some("function") => {}
            Some(other) => {
                return Err(super::unsupported(
                    format!("{at}.type"),
                    format!("\"{other}\" tools are not translated"),
                ));
            }
            None => return Err(invalid(format!("{at}.type"), "required")),
        }
        let f = t.get("function");
        let name = string(
            f.and_then(|f| f.get("name")),
            &format!("{at}.function.name"),
        )?;
        let parameters = match f.and_then(|f| f.get("parameters")) {
            None | Some(Value::Null) => None,
            Some(p) if p.is_object() => Some(p.clone()),
            Some(_) => {
                return Err(invalid(
                    format!("{at}.function.parameters"),
                    "a JSON Schema object",
                ));
            }
        };
        tools.push(Tool {
            name: name.to_string(),
            description: f
                .and_then(|f| f.get("description"))
                .and_then(Value::as_str)
                .map(str::to_string),
            parameters,
        });
    }
    Ok(tools)
}

/// `tool_choice` (absent or null: the provider's default, auto).
pub(crate) fn read_choice(
    v: Option<&Value>,
    tools: &[Tool],
) -> Result<Option<ToolChoice>, TranslateError> {
    let choice = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => return Err(invalid("tool_choice", format!("unknown value \"{other}\""))),
        },
        Some(Value::Object(o)) => {
            let name = string(
                o.get("function").and_then(|f| f.get("name")),
                "tool_choice.function.name",
            )?;
            if !tools.iter().any(|t| t.name == name) {
                return Err(invalid(
                    "tool_choice.function.name",
                    format!("\"{name}\" is not among the tools"),
                ));
            }
            ToolChoice::Named(name.to_string())
        }
        Some(v) => {
            return Err(invalid(
                "tool_choice",
                format!("a string or an object, not {}", kind(v)),
            ));
        }
    };
    if tools.is_empty() && choice != ToolChoice::None {
        return Err(invalid("tool_choice", "set without tools"));
    }
    Ok(Some(choice))
}

/// An assistant's `tool_calls` as parts, each call's name remembered by id
/// for the `tool` messages that answer it.
pub(crate) fn read_calls(
    v: &Value,
    at: &str,
    names: &mut HashMap<String, String>,
) -> Result<Vec<Part>, TranslateError> {
    let Some(list) = v.as_array() else {
        return Err(invalid(
            format!("{at}.tool_calls"),
            format!("an array, not {}", kind(v)),
        ));
    };
    let mut parts = Vec::new();
    for (j, c) in list.iter().enumerate() {
        let at = format!("{at}.tool_calls[{j}]");
        if c.get("type").and_then(Value::as_str) != Some("function") {
            return Err(super::unsupported(
                format!("{at}.type"),
                "only function tool calls are translated",
            ));
        }
        let id = string(c.get("id"), &format!("{at}.id"))?;
        let name = string(c.pointer("/function/name"), &format!("{at}.function.name"))?;
        let text = string(
            c.pointer("/function/arguments"),
            &format!("{at}.function.arguments"),
        )?;
        let args: Value = serde_json::from_str(text)
            .map_err(|e| invalid(format!("{at}.function.arguments"), format!("not JSON: {e}")))?;
        if !args.is_object() {
            return Err(invalid(
                format!("{at}.function.arguments"),
                "a JSON object is required",
            ));
        }
        names.insert(id.to_string(), name.to_string());
        parts.push(Part::ToolCall {
            id: id.to_string(),
            name: name.to_string(),
            args,
        });
    }
    Ok(parts)
}

/// A `tool` message: the result of an earlier call, named by its id.
pub(crate) fn read_result(
    m: &Map<String, Value>,
    at: &str,
    names: &HashMap<String, String>,
) -> Result<Part, TranslateError> {
    for key in m.keys() {
        if !matches!(key.as_str(), "role" | "content" | "tool_call_id" | "name")
            && !m[key].is_null()
        {
            return Err(super::unsupported(
                format!("{at}.{key}"),
                "not a message field the translation knows",
            ));
        }
    }
    let id = string(m.get("tool_call_id"), &format!("{at}.tool_call_id"))?;
    let Some(name) = names.get(id) else {
        return Err(invalid(
            format!("{at}.tool_call_id"),
            format!("\"{id}\": no earlier assistant tool call has this id"),
        ));
    };
    let content = match m.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                match (
                    p.get("type").and_then(Value::as_str),
                    p.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    _ => {
                        return Err(invalid(
                            format!("{at}.content[{j}]"),
                            "a text part is required",
                        ));
                    }
                }
            }
            text
        }
        _ => {
            return Err(invalid(
                format!("{at}.content"),
                "a string or an array of text parts",
            ));
        }
    };
    Ok(Part::ToolResult {
        id: id.to_string(),
        name: name.clone(),
        content,
    })
}
