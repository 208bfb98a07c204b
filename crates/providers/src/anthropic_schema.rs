//! Anthropic's structured outputs: which models take `output_config.format`,
//! and the gate's schema made fit for it.
//!
//! Facts (Anthropic, "Structured outputs",
//! https://platform.claude.com/docs/en/build-with-claude/structured-outputs,
//! read 2026-11; the Vertex AI page "Structured outputs with Anthropic Claude
//! models" lists Opus 4.7 too): the parameter is
//! `output_config: {format: {type: "json_schema", schema}}`, generally
//! available without a beta header (the beta's `output_format` and its
//! `structured-outputs-2025-11-13` header still work for a while, and are
//! not used) on Claude Opus 4.7, Opus 4.6, Sonnet 4.6, Sonnet 4.5, Opus 4.5
//! and Haiku 4.5. Older models refuse the parameter: they keep the schema in
//! the system prompt.
//!
//! The JSON Schema subset it takes (same page, "JSON Schema limitations"):
//! types, `enum` of primitives, `const`, `anyOf`, `allOf`, local `$ref` /
//! `$defs` / `definitions`, `required`, `additionalProperties: false` (on
//! every object), `items`, `minItems` 0 or 1, the common string `format`s,
//! and `pattern` without lookaround or backreferences. Refused: numeric
//! limits (`minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum`,
//! `multipleOf`), string lengths (`minLength`, `maxLength`), other array
//! limits, `additionalProperties` other than false, recursive schemas and
//! external `$ref`s.
//!
//! So the schema sent is a copy with what the API refuses taken out, and each
//! constraint taken out is said in words in the system prompt instead.
//! Nothing is lost: docket's gate still checks every answer against the
//! FULL schema, exactly as for the prompt-only fallback. A schema that
//! cannot be made fit (recursive, an external `$ref`, or an object whose
//! extra properties are the data: `additionalProperties` a schema,
//! `patternProperties`) goes the fallback way whole.

use serde_json::{Map, Value};

use crate::StructuredOutput;

/// Model-id prefixes that take `output_config.format` (the list above; a
/// dated id such as `claude-sonnet-4-5-20250929` matches its prefix).
/// A model not listed is sent the schema in the system prompt, unless the
/// stage says `structured_output = "native"`.
pub(crate) const NATIVE_MODEL_PREFIXES: &[&str] = &[
    "claude-opus-4-7",
    "claude-opus-4-6",
    "claude-sonnet-4-6",
    "claude-opus-4-5",
    "claude-sonnet-4-5",
    "claude-haiku-4-5",
];

/// Keywords sent as they are.
const KEPT: &[&str] = &[
    "type",
    "description",
    "title",
    "enum",
    "const",
    "default",
    "required",
    "$ref",
];

/// Keywords whose value is a map of subschemas.
const SCHEMA_MAPS: &[&str] = &["properties", "$defs", "definitions"];

/// Keywords whose value is a list of subschemas.
const SCHEMA_LISTS: &[&str] = &["anyOf", "allOf"];

/// The string formats the API accepts.
const FORMATS: &[&str] = &[
    "date-time",
    "time",
    "date",
    "duration",
    "email",
    "hostname",
    "uri",
    "ipv4",
    "ipv6",
    "uuid",
];

/// A schema made fit for `output_config.format`, and the constraints
/// taken out of it ("/properties/confidence: minimum 0").
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Fitted {
    pub schema: Value,
    pub dropped: Vec<String>,
}

/// True when the model id is on `NATIVE_MODEL_PREFIXES`.
pub(crate) fn supports_native(model: &str) -> bool {
    NATIVE_MODEL_PREFIXES.iter().any(|p| model.starts_with(p))
}

/// The schema to send as `output_config.format` for this request, or None
/// when the schema goes into the system prompt: no schema, a stage set to
/// `prompt`, a model not known to take it (under `auto`), or a schema the
/// parameter cannot carry.
pub(crate) fn native_for(
    model: &str,
    mode: StructuredOutput,
    schema: Option<&Value>,
) -> Option<Fitted> {
    let wanted = match mode {
        StructuredOutput::Auto => supports_native(model),
        StructuredOutput::Native => true,
        StructuredOutput::Prompt => false,
    };
    if !wanted {
        return None;
    }
    fit(schema?)
}

/// The schema with what the API refuses taken out; None when it is
/// recursive or has a `$ref` outside it.
pub(crate) fn fit(schema: &Value) -> Option<Fitted> {
    if !refs_are_local_and_acyclic(schema) || has_open_map(schema) {
        return None;
    }
    let mut dropped = Vec::new();
    let schema = fit_node(schema, "", &mut dropped);
    Some(Fitted { schema, dropped })
}

fn fit_node(v: &Value, path: &str, dropped: &mut Vec<String>) -> Value {
    let Some(obj) = v.as_object() else {
        return v.clone();
    };
    let mut out = Map::new();
    for (k, val) in obj {
        let at = format!("{path}/{k}");
        let key = k.as_str();
        let fitted = match key {
            "$schema" | "$id" | "$comment" | "additionalProperties" => continue,
            "enum" if val.as_array().is_some_and(|a| a.iter().any(is_compound)) => None,
            _ if KEPT.contains(&key) => Some(val.clone()),
            _ if SCHEMA_MAPS.contains(&key) => Some(match val.as_object() {
                Some(m) => Value::Object(
                    m.iter()
                        .map(|(name, sub)| {
                            (
                                name.clone(),
                                fit_node(sub, &format!("{at}/{name}"), dropped),
                            )
                        })
                        .collect(),
                ),
                None => val.clone(),
            }),
            _ if SCHEMA_LISTS.contains(&key) || key == "oneOf" => Some(fit_list(val, &at, dropped)),
            "items" if val.is_array() => Some(fit_list(val, &at, dropped)),
            "items" => Some(fit_node(val, &at, dropped)),
            "minItems" if val.as_u64().is_some_and(|n| n <= 1) => Some(val.clone()),
            "format" if val.as_str().is_some_and(|f| FORMATS.contains(&f)) => Some(val.clone()),
            "pattern" if val.as_str().is_some_and(pattern_ok) => Some(val.clone()),
            _ => None,
        };
        match fitted {
            // `oneOf` is not in the subset; `anyOf` is the nearest it has
            // (the gate still checks "exactly one").
            Some(f) if key == "oneOf" => {
                out.insert("anyOf".to_string(), f);
            }
            Some(f) => {
                out.insert(k.clone(), f);
            }
            None => dropped.push(format!("{}: {k} {val}", pointer(path))),
        }
    }
    if is_object_schema(obj) {
        out.insert("additionalProperties".into(), Value::Bool(false));
    }
    Value::Object(out)
}

fn fit_list(v: &Value, path: &str, dropped: &mut Vec<String>) -> Value {
    match v.as_array() {
        Some(items) => Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, s)| fit_node(s, &format!("{path}/{i}"), dropped))
                .collect(),
        ),
        None => v.clone(),
    }
}

fn is_compound(v: &Value) -> bool {
    v.is_object() || v.is_array()
}

fn is_object_schema(obj: &Map<String, Value>) -> bool {
    obj.get("type").and_then(Value::as_str) == Some("object")
        || obj.get("properties").is_some_and(Value::is_object)
}

/// A regex without lookaround, backreferences or word boundaries (what the
/// API's pattern subset leaves out).
fn pattern_ok(p: &str) -> bool {
    let b = p.as_bytes();
    let escaped = |c: u8| {
        b.windows(2)
            .any(|w| w[0] == b'\\' && (w[1] == c || (c == b'1' && w[1].is_ascii_digit())))
    };
    !p.contains("(?") && !escaped(b'b') && !escaped(b'B') && !escaped(b'1')
}

/// `/properties/a` as written in a note; the root is `(root)`.
fn pointer(path: &str) -> &str {
    if path.is_empty() { "(root)" } else { path }
}

/// Every `$ref` names a definition of this schema (`#/$defs/X`,
/// `#/definitions/X`), and no definition reaches itself.
fn refs_are_local_and_acyclic(schema: &Value) -> bool {
    let mut refs = Vec::new();
    collect_refs(schema, &mut refs);
    let defs = |name: &str| {
        ["$defs", "definitions"]
            .iter()
            .find_map(|d| schema.get(d).and_then(|m| m.get(name)))
    };
    let target = |r: &str| {
        r.strip_prefix("#/$defs/")
            .or_else(|| r.strip_prefix("#/definitions/"))
            .filter(|n| !n.contains('/'))
            .map(str::to_string)
    };
    if refs
        .iter()
        .any(|r| target(r).is_none_or(|n| defs(&n).is_none()))
    {
        return false;
    }
    // Depth-first from each definition; a name met again on the path is a cycle.
    fn reaches(
        name: &str,
        path: &mut Vec<String>,
        body: &dyn Fn(&str) -> Option<Vec<String>>,
    ) -> bool {
        if path.iter().any(|p| p == name) {
            return true;
        }
        path.push(name.to_string());
        let cyclic = body(name)
            .unwrap_or_default()
            .iter()
            .any(|n| reaches(n, path, body));
        path.pop();
        cyclic
    }
    let body = |name: &str| {
        defs(name).map(|d| {
            let mut inner = Vec::new();
            collect_refs(d, &mut inner);
            inner.iter().filter_map(|r| target(r)).collect()
        })
    };
    let names: Vec<String> = refs.iter().filter_map(|r| target(r)).collect();
    !names.iter().any(|n| reaches(n, &mut Vec::new(), &body))
}

/// An object whose extra properties are data (`additionalProperties` a
/// schema, or `patternProperties`): closing it, as the parameter requires,
/// would forbid the very answer asked for, so such a schema goes whole into
/// the prompt. (`additionalProperties: true` is only narrowed to false.)
fn has_open_map(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.iter().any(|(k, val)| match k.as_str() {
            "additionalProperties" => val.is_object() || has_open_map(val),
            "patternProperties" => true,
            "enum" | "const" | "default" => false,
            _ => has_open_map(val),
        }),
        Value::Array(a) => a.iter().any(has_open_map),
        _ => false,
    }
}

fn collect_refs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, val) in m {
                match (k.as_str(), val) {
                    ("$ref", Value::String(r)) => out.push(r.clone()),
                    // Enum and const values are data, not schemas.
                    ("enum" | "const" | "default", _) => {}
                    _ => collect_refs(val, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| collect_refs(x, out)),
        _ => {}
    }
}

/// The instruction that stands in for a schema parameter.
pub(crate) fn schema_instruction(name: &str, schema: &Value) -> String {
    format!(
        "Answer with one JSON object only (no prose, no code fences) that is valid against this JSON Schema (\"{name}\"):\n{schema}"
    )
}

/// The constraints `output_config.format` could not carry, in words; None
/// when nothing was taken out.
pub(crate) fn constraints_instruction(name: &str, dropped: &[String]) -> Option<String> {
    if dropped.is_empty() {
        return None;
    }
    Some(format!(
        "The answer must also keep to these constraints of its JSON Schema (\"{name}\"):\n- {}",
        dropped.join("\n- ")
    ))
}

#[cfg(test)]
mod tests;
