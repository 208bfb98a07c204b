//! Anthropic's `output_config`, checked as the Messages API checks it (the
//! sync route and the Batch API's `params` alike).
//!
//! Contract: `output_config` is an object; its optional `format` must be
//! `{"type": "json_schema", "schema": {...}}` (another `type`, or no
//! `schema`, is a 400). The schema must keep to the structured-outputs
//! subset: none of the numeric, string-length or array-length keywords
//! (`minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum`,
//! `multipleOf`, `minLength`, `maxLength`, `maxItems`, `minItems` above 1,
//! `minProperties`, `maxProperties`, `uniqueItems`), every object schema
//! with `additionalProperties: false`, and only local `$ref`s. The first
//! violation is the 400 `invalid_request_error`, naming the keyword and
//! where it is. A schema that passes is what the answer is generated
//! against (valid JSON for it), with the constraints the prompt states in
//! words put back (`with_stated`): the mock's model keeps to them, as a
//! real one follows its instructions.

use serde_json::Value;

use crate::json::Json;

/// Keywords the structured-outputs subset refuses wherever they appear.
const REFUSED: &[&str] = &[
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "maxItems",
    "minProperties",
    "maxProperties",
    "uniqueItems",
];

/// The schema to answer against (None: no `format`), or the 400 message.
pub(crate) fn check(output_config: Option<&Value>) -> Result<Option<Json>, String> {
    let Some(cfg) = output_config else {
        return Ok(None);
    };
    let Some(cfg) = cfg.as_object() else {
        return Err("output_config: Input should be a valid dictionary".into());
    };
    let Some(format) = cfg.get("format").filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    match format.get("type").and_then(Value::as_str) {
        Some("json_schema") => {}
        Some(other) => {
            return Err(format!(
                "output_config.format.type: Input should be 'json_schema', not '{other}'"
            ));
        }
        None => return Err("output_config.format.type: Field required".into()),
    }
    let Some(schema) = format.get("schema").filter(|s| s.is_object()) else {
        return Err("output_config.format.schema: Field required (a JSON Schema object)".into());
    };
    walk(schema, "").map_err(|e| format!("output_config.format.schema: {e}"))?;
    serde_json::from_value(schema.clone())
        .map(Some)
        .map_err(|e| format!("output_config.format.schema: {e}"))
}

/// The schema the mock's model answers: the `output_config` schema with
/// the constraints the prompt states in words put back (docket's wording
/// for what the parameter cannot carry: a line `- /properties/c: minimum 0`),
/// as a model keeping to its instructions would. Other lines are ignored.
pub(crate) fn with_stated<'t>(mut schema: Json, texts: impl IntoIterator<Item = &'t str>) -> Json {
    for line in texts.into_iter().flat_map(str::lines) {
        let Some((at, said)) = line.strip_prefix("- ").and_then(|r| r.split_once(": ")) else {
            continue;
        };
        let Some((keyword, value)) = said.split_once(' ') else {
            continue;
        };
        let pointer = if at == "(root)" { "" } else { at };
        let Ok(value) = serde_json::from_str::<Json>(value) else {
            continue;
        };
        if !(pointer.is_empty() || pointer.starts_with('/')) {
            continue;
        }
        if let Some(Json::Obj(pairs)) = node_mut(&mut schema, pointer)
            && !pairs.iter().any(|(k, _)| k == keyword)
        {
            pairs.push((keyword.to_string(), value));
        }
    }
    schema
}

/// The node a JSON Pointer names, if there is one.
fn node_mut<'a>(mut cur: &'a mut Json, pointer: &str) -> Option<&'a mut Json> {
    for seg in pointer.split('/').skip(1) {
        cur = match cur {
            Json::Obj(pairs) => pairs.iter_mut().find(|(k, _)| k == seg).map(|(_, v)| v)?,
            Json::Arr(items) => items.get_mut(seg.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(cur)
}

/// The first violation of the subset in one schema node, with its place.
fn walk(v: &Value, at: &str) -> Result<(), String> {
    let Some(obj) = v.as_object() else {
        return Ok(());
    };
    let here = if at.is_empty() { "(root)" } else { at };
    for (k, val) in obj {
        let key = k.as_str();
        let too_many = key == "minItems" && val.as_u64().is_none_or(|n| n > 1);
        if REFUSED.contains(&key) || too_many {
            return Err(format!(
                "the '{key}' keyword is not supported in structured outputs (at {here})"
            ));
        }
        match key {
            "additionalProperties" if *val != Value::Bool(false) => {
                return Err(format!(
                    "additionalProperties must be false for object types (at {here})"
                ));
            }
            "$ref" if !val.as_str().is_some_and(|r| r.starts_with('#')) => {
                return Err(format!("external $ref {val} is not supported (at {here})"));
            }
            "properties" | "$defs" | "definitions" => {
                for (name, sub) in val.as_object().into_iter().flatten() {
                    walk(sub, &format!("{at}/{key}/{name}"))?;
                }
            }
            "items" | "anyOf" | "allOf" | "oneOf" | "not" => match val {
                Value::Array(list) => {
                    for (i, sub) in list.iter().enumerate() {
                        walk(sub, &format!("{at}/{key}/{i}"))?;
                    }
                }
                _ => walk(val, &format!("{at}/{key}"))?,
            },
            _ => {}
        }
    }
    let is_object = obj.get("type").and_then(Value::as_str) == Some("object")
        || obj.get("properties").is_some_and(Value::is_object);
    if is_object && obj.get("additionalProperties") != Some(&Value::Bool(false)) {
        return Err(format!(
            "additionalProperties must be explicitly set to false for object types (at {here})"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fmt(schema: Value) -> Value {
        json!({"format": {"type": "json_schema", "schema": schema}})
    }

    #[test]
    fn a_fitted_schema_passes_and_is_answered_against() {
        let ok = fmt(json!({"type": "object", "additionalProperties": false,
            "properties": {"minimum": {"type": "number"}, "label": {"type": "string", "enum": ["a"]}},
            "required": ["label"]}));
        let s = check(Some(&ok)).expect("valid").expect("a schema");
        assert!(s.get("properties").is_some());
        assert_eq!(check(Some(&json!({"effort": "low"}))), Ok(None));
        assert_eq!(check(None), Ok(None));
    }

    #[test]
    fn constraints_stated_in_the_prompt_are_put_back() {
        let sent = fmt(json!({"type": "object", "additionalProperties": false,
            "properties": {"score": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}}}));
        let schema = check(Some(&sent)).expect("valid").expect("a schema");
        let prompt = "Judge.\n\nThe answer must also keep to these constraints of its JSON Schema (\"v\"):\n- /properties/score: minimum 1\n- /properties/score: maximum 5\n- /properties/tags: maxItems 2\n- /nowhere: minimum 3\n- not a constraint";
        let j = with_stated(schema, [prompt]).to_compact();
        assert!(
            j.contains(r#""score":{"type":"integer","minimum":1,"maximum":5}"#),
            "{j}"
        );
        assert!(j.contains(r#""maxItems":2"#), "{j}");
        assert!(!j.contains("nowhere"), "{j}");
    }

    #[test]
    fn refused_keywords_wrong_type_and_open_objects_are_named() {
        let num = fmt(json!({"type": "object", "additionalProperties": false,
            "properties": {"c": {"type": "number", "minimum": 0}}}));
        let e = check(Some(&num)).expect_err("minimum");
        assert!(
            e.contains("'minimum'") && e.contains("/properties/c"),
            "{e}"
        );
        let open = fmt(json!({"type": "object", "properties": {"c": {"type": "string"}}}));
        assert!(
            check(Some(&open))
                .expect_err("open")
                .contains("additionalProperties")
        );
        let kind = json!({"format": {"type": "json_object", "schema": {}}});
        assert!(
            check(Some(&kind))
                .expect_err("type")
                .contains("'json_schema'")
        );
        let missing = json!({"format": {"type": "json_schema"}});
        assert!(
            check(Some(&missing))
                .expect_err("schema")
                .contains("schema")
        );
        let far = fmt(json!({"$ref": "https://example.com/s.json"}));
        assert!(check(Some(&far)).expect_err("ref").contains("$ref"));
    }
}
