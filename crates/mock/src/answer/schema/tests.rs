use super::*;
use crate::wire::{ChatRequest, Prompt};

fn run(schema: &str, drop_required: bool, prompt_no: usize) -> serde_json::Value {
    let body = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"case {prompt_no}\nLabels: keep, drop"}}]}}"#
    );
    let req: ChatRequest = serde_json::from_str(&body).expect("request");
    let prompt = Prompt::from_request(&req).expect("valid");
    let (_, seed) = prompt.hashes();
    let schema: Json = serde_json::from_str(schema).expect("schema");
    let mut m = Material::new(&prompt, seed);
    serde_json::from_str(&generate(&schema, &mut m, drop_required)).expect("json out")
}

#[test]
fn bounds_unions_and_recursion_are_respected() {
    let schema = r##"{"type":"object","properties":{
            "n":{"type":"number","exclusiveMinimum":2,"maximum":3},
            "i":{"type":"integer","minimum":-4,"exclusiveMaximum":-1},
            "pct_confidence":{"type":"integer","minimum":0,"maximum":100},
            "maybe":{"anyOf":[{"type":"null"},{"type":"string","maxLength":3}]},
            "pick":{"enum":["a",null]},
            "final_label":{"type":"string"},
            "when":{"type":"string","format":"date"},
            "list":{"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":2},
            "tree":{"$ref":"#/$defs/node"}},
            "$defs":{"node":{"type":"object","properties":{"child":{"$ref":"#/$defs/node"}}}}}"##;
    let mut non_null = 0;
    for k in 0..200 {
        let v = run(schema, false, k);
        let n = v["n"].as_f64().expect("n");
        assert!(n > 2.0 && n <= 3.0, "{n}");
        let i = v["i"].as_i64().expect("i");
        assert!((-4..-1).contains(&i), "{i}");
        let c = v["pct_confidence"].as_i64().expect("int confidence");
        assert!((5..=99).contains(&c), "{c}");
        if let Some(s) = v["maybe"].as_str() {
            assert!(s.chars().count() <= 3);
            non_null += 1;
        }
        assert!(v["pick"].is_null() || v["pick"] == "a");
        assert!(["keep", "drop"].contains(&v["final_label"].as_str().expect("label")));
        assert_eq!(v["when"].as_str().map(str::len), Some(10));
        assert_eq!(v["list"].as_array().map(Vec::len), Some(2));
        assert!(
            v["tree"]["child"]["child"].is_object(),
            "recursion bottoms out deep down"
        );
    }
    assert!(
        (150..200).contains(&non_null),
        "nullable is usually non-null: {non_null}"
    );
}

#[test]
fn wrong_schema_drops_a_required_field_or_breaks_the_type() {
    let schema = r#"{"type":"object","required":["a","b"],"properties":{"a":{"type":"boolean"},"b":{"type":"boolean"},"c":{"type":"boolean"}}}"#;
    for k in 0..20 {
        let v = run(schema, true, k);
        let o = v.as_object().expect("object");
        assert!(o.contains_key("c") && o.len() == 2);
    }
    let explosive = r##"{"$ref":"#/$defs/n","$defs":{"n":{"type":"object","properties":{
            "l":{"$ref":"#/$defs/n"},"r":{"type":"array","minItems":50,"items":{"$ref":"#/$defs/n"}},
            "x":{"type":"number","minimum":-1e308,"maximum":1e308,"exclusiveMaximum":1e308}}}}}"##;
    assert!(
        run(explosive, false, 0).is_object(),
        "terminates without panicking"
    );
    let no_required = r#"{"type":"object","properties":{"a":{"type":"boolean"}}}"#;
    assert_eq!(run(no_required, true, 0), serde_json::json!([]));
}

/// The demo's answers name one candidate's release group and recording
/// together: ids come from the same candidate, in schema order.
#[test]
fn id_fields_take_one_candidates_ids() {
    let ids = [
        (
            "e23bc1ec-a8c7-46a6-acea-a8c60ddc65f1",
            "a3020925-6e35-49fb-a417-a2d8d9ed086c",
        ),
        (
            "22b69d66-7e5a-4805-ad00-a3f57027bcb1",
            "053242a9-719d-4a48-ab4f-4910fa60671f",
        ),
        (
            "39327b06-4110-40cf-abfc-917b69eee67a",
            "2228e00b-7d66-4b74-af69-d68956ca1f3f",
        ),
    ];
    let schema: Json = serde_json::from_str(
        r#"{"type":"object","properties":{"crg_mbid":{"type":"string"},"rr_mbid":{"type":"string"}}}"#,
    )
    .unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for k in 0..60 {
        let mut content = format!("case {k}\n");
        for (crg, rr) in ids {
            content.push_str(&format!("  - {crg}: \"t\"\n    recording {rr}: \"r\"\n"));
        }
        let body =
            serde_json::json!({"model": "m", "messages": [{"role": "user", "content": content}]});
        let req: ChatRequest = serde_json::from_value(body).expect("request");
        let prompt = Prompt::from_request(&req).expect("valid");
        let (_, seed) = prompt.hashes();
        let mut m = Material::new(&prompt, seed);
        let v: serde_json::Value = serde_json::from_str(&generate(&schema, &mut m, false)).unwrap();
        let pair = (
            v["crg_mbid"].as_str().unwrap(),
            v["rr_mbid"].as_str().unwrap(),
        );
        assert!(ids.contains(&pair), "{pair:?} is not one candidate's");
        seen.insert(pair.0.to_string());
    }
    assert_eq!(seen.len(), ids.len(), "every candidate is chosen sometimes");
}
