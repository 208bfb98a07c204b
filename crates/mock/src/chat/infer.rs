//! The answer format for routes whose request carries no schema field, or
//! only an optional one (Anthropic, Gemini, Ollama).
//!
//! Rule, first match wins:
//! 1. a schema given in the request's own field (Anthropic `output_config.format`
//!    with `type: "json_schema"`, Gemini `generationConfig.responseJsonSchema` /
//!    `responseSchema`, Ollama `format` as an object) → an object valid against it;
//! 2. a JSON Schema written into the prompt text (system first, then the
//!    messages in order): the first embedded JSON object that has a
//!    `properties` object, `"type": "object"` or `$schema` → valid against it;
//! 3. JSON asked for without a schema (Gemini `responseMimeType:
//!    "application/json"`, Ollama `format: "json"`) or the word "JSON" anywhere
//!    in the prompt → the default `{"answer","confidence","rationale"}` object;
//! 4. else the `VERDICT:` / `CONFIDENCE:` text answer.
//!
//! So the same prompt sent to OpenAI with `response_format` and to Anthropic
//! with the schema in its system prompt gets the same kind of answer.

use crate::json::Json;
use crate::wire::Format;

/// At most this many `{` positions are tried per prompt (keeps huge prompts cheap).
const MAX_TRIES: usize = 64;

/// The first JSON Schema embedded in the texts, if any.
pub(crate) fn schema_in_text<'t>(texts: impl IntoIterator<Item = &'t str>) -> Option<Json> {
    let mut tries = 0;
    for text in texts {
        for (at, _) in text.match_indices('{') {
            if tries >= MAX_TRIES {
                return None;
            }
            tries += 1;
            let mut values = serde_json::Deserializer::from_str(&text[at..]).into_iter::<Json>();
            if let Some(Ok(value)) = values.next()
                && is_schema(&value)
            {
                return Some(value);
            }
        }
    }
    None
}

fn is_schema(v: &Json) -> bool {
    matches!(v.get("properties"), Some(Json::Obj(_)))
        || v.get("type").and_then(Json::as_str) == Some("object")
        || v.get("$schema").is_some()
}

/// True when some text says "JSON" (any case, as a word).
pub(crate) fn mentions_json<'t>(texts: impl IntoIterator<Item = &'t str>) -> bool {
    texts.into_iter().any(|t| {
        t.split(|c: char| !c.is_ascii_alphanumeric())
            .any(|w| w.eq_ignore_ascii_case("json"))
    })
}

/// Apply the rule of the module doc. `found` is what `schema_in_text` returned.
pub(crate) fn format<'a>(
    explicit: Option<&'a Json>,
    found: Option<&'a Json>,
    json_mode: bool,
    mentions_json: bool,
) -> Format<'a> {
    match explicit.or(found) {
        Some(schema) => Format::JsonSchema(Some(schema)),
        None if json_mode || mentions_json => Format::JsonObject,
        None => Format::Text,
    }
}

/// Gemini's `responseSchema` is an OpenAPI subset: upper-case type names and
/// `nullable: true`. Rewrite it as the JSON Schema the generator reads.
pub(crate) fn from_openapi(s: &Json) -> Json {
    match s {
        Json::Obj(pairs) => {
            let nullable = pairs
                .iter()
                .any(|(k, v)| k == "nullable" && *v == Json::Bool(true));
            let out = pairs
                .iter()
                .filter(|(k, _)| k != "nullable")
                .map(|(k, v)| {
                    let v = match (k.as_str(), v) {
                        ("type", Json::Str(t)) if nullable => Json::Arr(vec![
                            Json::Str(t.to_ascii_lowercase()),
                            Json::Str("null".to_string()),
                        ]),
                        ("type", Json::Str(t)) => Json::Str(t.to_ascii_lowercase()),
                        // property names and enum values are data, not schemas
                        ("properties" | "$defs" | "definitions", Json::Obj(props)) => Json::Obj(
                            props
                                .iter()
                                .map(|(name, p)| (name.clone(), from_openapi(p)))
                                .collect(),
                        ),
                        ("enum" | "required" | "propertyOrdering", other) => other.clone(),
                        (_, other) => from_openapi(other),
                    };
                    (k.clone(), v)
                })
                .collect();
            Json::Obj(out)
        }
        Json::Arr(items) => Json::Arr(items.iter().map(from_openapi).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_schema_in_prose_and_skips_plain_objects() {
        let text = r#"Items look like {"id": 1}. Reply with JSON matching {"type":"object","properties":{"verdict":{"type":"string"}},"required":["verdict"]} only."#;
        let s = schema_in_text([text]).expect("schema");
        assert!(s.get("properties").and_then(|p| p.get("verdict")).is_some());
        assert!(schema_in_text(["no braces here", "{ broken"]).is_none());
        assert!(mentions_json([text]));
        assert!(!mentions_json(["jsonl files are not the word"]));
    }

    #[test]
    fn openapi_types_become_json_schema() {
        let s: Json = serde_json::from_str(
            r#"{"type":"OBJECT","properties":{"type":{"type":"STRING","enum":["A"]},"n":{"type":"NUMBER","nullable":true}}}"#,
        )
        .expect("json");
        let j = from_openapi(&s).to_compact();
        assert_eq!(
            j,
            r#"{"type":"object","properties":{"type":{"type":"string","enum":["A"]},"n":{"type":["number","null"]}}}"#
        );
    }
}
