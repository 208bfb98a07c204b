//! Fitting a schema to Anthropic's structured-outputs subset.

use super::*;
use serde_json::json;

#[test]
fn model_prefixes_decide_auto() {
    assert!(supports_native("claude-sonnet-4-5-20250929"));
    assert!(supports_native("claude-haiku-4-5"));
    assert!(supports_native("claude-opus-4-7"));
    assert!(!supports_native("claude-opus-4-1-20250805"));
    assert!(!supports_native("claude-3-5-haiku-latest"));
    assert!(
        native_for(
            "claude-3-5-haiku-latest",
            StructuredOutput::Auto,
            Some(&json!({}))
        )
        .is_none()
    );
    assert!(native_for("claude-haiku-4-5", StructuredOutput::Auto, None).is_none());
}

/// Refused keywords go (and are listed), nested schemas are fitted too,
/// every object is closed, `oneOf` becomes `anyOf`, and property names that
/// look like keywords are names, not keywords.
#[test]
fn fit_strips_and_lists_what_the_api_refuses() {
    let s = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "additionalProperties": true,
        "properties": {
            "minimum": {"type": "integer", "maximum": 9},
            "tags": {"type": "array", "minItems": 2, "maxItems": 5,
                     "items": {"type": "string", "pattern": "^(?=a)", "format": "email"}},
            "one": {"oneOf": [{"type": "string", "maxLength": 3}, {"type": "null"}]},
            "when": {"type": "string", "format": "date-time", "pattern": "^[0-9]"}
        },
        "required": ["minimum"]
    });
    let f = fit(&s).expect("fits");
    assert_eq!(
        f.schema,
        json!({
            "type": "object",
            "properties": {
                "minimum": {"type": "integer"},
                "tags": {"type": "array", "items": {"type": "string", "format": "email"}},
                "one": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                "when": {"type": "string", "format": "date-time", "pattern": "^[0-9]"}
            },
            "required": ["minimum"],
            "additionalProperties": false
        })
    );
    for want in [
        "/properties/minimum: maximum 9",
        "/properties/tags: minItems 2",
        "/properties/tags: maxItems 5",
        "/properties/tags/items: pattern \"^(?=a)\"",
        "/properties/one/oneOf/0: maxLength 3",
    ] {
        assert!(
            f.dropped.iter().any(|d| d == want),
            "{want} in {:?}",
            f.dropped
        );
    }
    assert_eq!(f.dropped.len(), 5, "{:?}", f.dropped);
}

#[test]
fn local_acyclic_refs_fit_and_others_do_not() {
    let ok = json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/leaf"}},
                    "$defs": {"leaf": {"type": "string", "minLength": 2}}});
    let f = fit(&ok).expect("local refs fit");
    assert_eq!(f.dropped, vec!["/$defs/leaf: minLength 2".to_string()]);
    assert!(fit(&json!({"$ref": "https://example.com/x.json"})).is_none());
    assert!(fit(&json!({"type": "object", "properties": {"self": {"$ref": "#"}}})).is_none());
    let cycle = json!({"$ref": "#/$defs/a", "$defs": {
        "a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/b"}}},
        "b": {"type": "array", "items": {"$ref": "#/$defs/a"}}}});
    assert!(fit(&cycle).is_none());
    assert!(fit(&json!({"$ref": "#/$defs/missing"})).is_none());
    // A map (its extra properties are the answer) cannot be closed.
    let map = json!({"type": "object", "properties": {"scores": {"type": "object",
        "additionalProperties": {"type": "number"}}}});
    assert!(fit(&map).is_none());
    assert!(fit(&json!({"type": "object", "patternProperties": {"^x": {}}})).is_none());
    let open = fit(&json!({"type": "object", "additionalProperties": true})).expect("narrowed");
    assert_eq!(open.schema["additionalProperties"], json!(false));
}
