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
//! against (valid JSON for it).

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
