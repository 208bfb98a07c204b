//! The `[review]` templates, the chosen candidate and its differing fields.

use super::*;
use crate::config::{ConfigError, LoadedConfig};
use serde_json::json;
use std::path::Path;

const BASE: &str = r#"
[providers.p]
kind = "openai"
model = "gpt-4o-mini"

[[stages]]
name = "s"
provider = "p"
template = "t.j2"

[stages.gate]
kind = "regex"
pattern = "(?P<confidence>[0-9.]+)"
"#;

fn parse(text: &str) -> Result<LoadedConfig, ConfigError> {
    LoadedConfig::parse(Path::new("ws/docket.toml"), text.to_string())
}

fn evidence() -> Value {
    json!({
        "chart": "UK Singles", "week": "1991-03-02", "position": 7,
        "artist": "Blur", "title": "There's No Other Way",
        "candidates": [
            {"crg_mbid": "a1", "title": "There's No Other Way", "artist": "Blur", "first_release": 1991},
            {"crg_mbid": "b2", "title": "There's No Other Way (Remastered)", "artist": "Blur", "first_release": 1994},
        ],
    })
}

#[test]
fn the_summary_renders_evidence_and_answer_and_strips_control_characters() {
    let cfg = parse(&format!(
        "{BASE}\n[review]\nsummary = \"{{{{ artist }}}} – {{{{ title }}}} · {{{{ chart }}}}, {{{{ week }}}}, {{{{ position }}}} → {{{{ answer.crg_mbid }}}}\"\n"
    ))
    .unwrap();
    let t = ReviewTemplates::compile(&cfg.config.review).unwrap();
    let mut ev = evidence();
    ev["artist"] = json!("Blur\u{1b}[2J\n");
    let s = t
        .summary("c1", &ev, &json!({"crg_mbid": "b2"}))
        .unwrap()
        .unwrap();
    assert_eq!(
        s,
        "Blur  – There's No Other Way · UK Singles, 1991-03-02, 7 → b2"
    );
    assert!(t.card("c1", &ev, &json!({})).is_none());
}

#[test]
fn an_undefined_variable_is_named_with_its_key() {
    let t = ReviewTemplates::compile(&ReviewConfig {
        summary: None,
        card: Some("first\n{{ chosen.title }} / {{ item.label }}".into()),
    })
    .unwrap();
    let err = t
        .card("c1", &evidence(), &json!({"crg_mbid": "a1"}))
        .unwrap()
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "review.card: line 2: undefined variable \"item.label\""
    );
}

#[test]
fn a_template_syntax_error_names_the_key_and_the_line_in_docket_toml() {
    let text = format!("{BASE}\n[review]\ncard = \"\"\"\nok\n{{% if %}}\n\"\"\"\n");
    let e = parse(&text).err().unwrap().to_string();
    // `card = """` is on line 16; the template's own line 2 is line 18.
    assert!(e.starts_with("ws/docket.toml:18: review.card:"), "{e}");
    assert!(e.contains("template syntax error"), "{e}");
    let e = parse(&format!("{BASE}\n[review]\nsumary = \"x\"\n"))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("sumary"), "{e}");
}

#[test]
fn the_chosen_candidate_is_the_one_the_answer_names_and_its_differences_show() {
    let ev = evidence();
    let answer = json!({"crg_mbid": "b2", "confidence": 0.7, "rationale": "remaster"});
    let c = chosen_candidate(&ev, &answer).unwrap();
    assert_eq!(
        (c.list, c.index, c.matched_by.clone()),
        ("candidates", 1, vec!["crg_mbid"])
    );
    assert_eq!(
        differing_fields(&ev, c.candidate),
        vec![(
            "title".to_string(),
            "There's No Other Way".to_string(),
            "There's No Other Way (Remastered)".to_string()
        )]
    );
    assert_eq!(chosen_candidate(&ev, &json!({"crg_mbid": "zz"})), None);
    assert_eq!(chosen_candidate(&ev, &json!("text")), None);
}

#[test]
fn a_review_template_is_not_a_change_of_the_run() {
    let then = parse(BASE).unwrap().snapshot_json();
    let now = parse(&format!(
        "{BASE}\n[review]\nsummary = \"{{{{ title }}}}\"\n"
    ))
    .unwrap();
    assert_eq!(now.changes_since(&then), vec![]);
    let later = parse(&format!("{BASE}\n[routing]\nreview_threshold = 0.5\n")).unwrap();
    assert_eq!(later.changes_since(&then).len(), 1);
}
