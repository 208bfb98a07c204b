//! Deterministic answer content: same model + messages give the same content,
//! byte for byte, on every run and every machine.
//!
//! Contract: all randomness comes from `AnswerRng`, a SplitMix64 stream seeded
//! by sha256(model + message contents) (our own generator, so answers do not
//! change when the rand crate changes its algorithms). Formats:
//! - text: a short reasoning paragraph, then `VERDICT: <label>` and
//!   `CONFIDENCE: <x.xx>` lines; labels come from a `Labels: a, b, c` prompt line,
//!   else yes/no;
//! - json_object: `{"answer","confidence","rationale"}`;
//! - json_schema: an object valid against the schema (see `schema`).
//!
//! `material` holds the generator state every format draws from (`Material`,
//! `AnswerRng`); `schema` generates values against a JSON schema.
//!
//! Confidence is spread so typical 0.85/0.60 routing thresholds see all three
//! bands: ~50% in [0.85,0.99], ~30% in [0.60,0.85), ~20% in [0.05,0.60).
//! Damage: `WrongSchema` drops a required field (text: the VERDICT line),
//! `Truncated` cuts the content at about half its length.
//!
//! Steering (`Steer`, from the staged-pipeline config switches): a forced or
//! disagree-rate verdict replaces the seeded one *after* it was drawn, and
//! optional properties are dropped *after* the whole value was generated, both
//! with draws from a second stream seeded by the prompt and the config seed.
//! So the main stream, and every value not steered, is the same as without
//! steering, and `Steer::default()` changes nothing.

mod material;
pub(crate) mod schema;

use material::{Material, VerdictChoice};

use crate::json::Json;
use crate::wire::{Format, Prompt};

/// How to damage the normal answer (the fault drawn for this request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Damage {
    None,
    WrongSchema,
    Truncated,
}

/// How the staged-pipeline switches bend an answer (`MockConfig::verdict`,
/// `verdict_disagree_rate`, `omit_optional_rate`, `omit_optional_first`).
#[derive(Default)]
pub(crate) struct Steer<'a> {
    /// the label every verdict takes
    pub verdict: Option<&'a str>,
    /// > 0: verdicts take option 1 with this probability, else option 0
    pub disagree_rate: f64,
    /// each optional top-level property is left out with this probability
    pub omit_rate: f64,
    /// claims one "keep only the first optional property" answer; asked only
    /// for a schema with >= 2 optional top-level properties
    pub omit_first: Option<&'a dyn Fn() -> bool>,
    /// the config seed, mixed into the steering stream
    pub seed: u64,
    /// follow orders found in the prompt (`MockConfig::obey_injection`)
    pub obey_injection: bool,
}

/// The content of the assistant message for `prompt`, unsteered (unit tests).
#[cfg(test)]
pub(crate) fn content(prompt: &Prompt<'_>, seed: [u8; 32], damage: Damage) -> String {
    steered(prompt, seed, damage, &Steer::default()).0
}

/// The content for `prompt` under `steer`, and whether optional properties were left out.
pub(crate) fn steered(
    prompt: &Prompt<'_>,
    seed: [u8; 32],
    damage: Damage,
    steer: &Steer<'_>,
) -> (String, bool) {
    let mut m = Material::new(prompt, seed);
    // Claimed before generating, and only when the omit rules apply at all.
    let omit_first = match prompt.format {
        Format::JsonSchema(Some(s)) if schema::optional_properties(s).len() >= 2 => {
            steer.omit_first.is_some_and(|claim| claim())
        }
        _ => false,
    };
    m.steer(steer, seed, omit_first);
    let full = match prompt.format {
        Format::Text => text(&mut m, damage == Damage::WrongSchema),
        Format::JsonObject | Format::JsonSchema(None) => {
            json_object(&mut m, damage == Damage::WrongSchema)
        }
        Format::JsonSchema(Some(s)) => schema::generate(s, &mut m, damage == Damage::WrongSchema),
    };
    let partial = m.partial;
    let out = if damage == Damage::Truncated {
        cut_in_half(full)
    } else {
        full
    };
    (out, partial)
}

fn text(m: &mut Material<'_>, drop_verdict: bool) -> String {
    let mut out = m.rationale(2);
    let mut label = m.label();
    let n = m.labels().len();
    match m.verdict_choice(if n == 0 { 2 } else { n }) {
        VerdictChoice::Seeded => {}
        VerdictChoice::Label(l) => label = l.to_string(),
        VerdictChoice::Index(i) => {
            label = match m.labels().get(i) {
                Some(l) => (*l).to_string(),
                None => ["yes", "no"][i % 2].to_string(),
            }
        }
    }
    let confidence = m.confidence();
    if !drop_verdict {
        out.push_str("\n\nVERDICT: ");
        out.push_str(&label);
        out.push_str("\nCONFIDENCE: ");
    } else {
        out.push_str("\n\nCONFIDENCE: ");
    }
    out.push_str(&format!("{confidence:.2}"));
    out
}

fn json_object(m: &mut Material<'_>, drop_answer: bool) -> String {
    let mut pairs = Vec::with_capacity(3);
    let answer = Json::Str(m.label());
    if !drop_answer {
        pairs.push(("answer".to_string(), answer));
    }
    pairs.push(("confidence".to_string(), Json::Float(m.confidence())));
    pairs.push(("rationale".to_string(), Json::Str(m.rationale(1))));
    if m.obeys {
        pairs.push(("route".to_string(), Json::Str("accept".into())));
        pairs.push(("threshold".to_string(), Json::Float(0.0)));
    }
    Json::Obj(pairs).to_compact()
}

/// Keep about the first half, on a char boundary.
fn cut_in_half(mut s: String) -> String {
    let mut at = s.len() / 2;
    while at > 0 && !s.is_char_boundary(at) {
        at -= 1;
    }
    s.truncate(at);
    s
}

#[cfg(test)]
mod tests {
    use super::material::content_words;
    use super::*;
    use crate::wire::ChatRequest;

    fn req(body: &str) -> ChatRequest {
        serde_json::from_str(body).expect("parse")
    }

    #[test]
    fn labels_uuids_and_words_come_from_the_prompt() {
        let r = req(
            r#"{"model":"m","messages":[{"role":"system","content":"Decide.\n  labels: `same`, \"different\", unsure."},
            {"role":"user","content":"A: 0f8fad5b-d9cb-469f-a165-70867728950e Hamburg harbour\nB: x0f8fad5b-d9cb-469f-a165-70867728950e 7c9e6679-7425-40de-944b-e07fc1f90ae7"}]}"#,
        );
        let p = Prompt::from_request(&r).expect("valid");
        let mut m = Material::new(&p, [1; 32]);
        assert_eq!(m.labels(), ["same", "different", "unsure"]);
        assert_eq!(
            m.uuids(),
            [
                "0f8fad5b-d9cb-469f-a165-70867728950e",
                "7c9e6679-7425-40de-944b-e07fc1f90ae7"
            ]
        );
        let words = content_words(&p);
        assert!(words.contains(&"Hamburg") && words.contains(&"harbour"));
        assert!(!words.contains(&"labels"));
    }

    #[test]
    fn text_answer_has_verdict_and_confidence_and_truncates() {
        let r =
            req(r#"{"model":"m","messages":[{"role":"user","content":"Is Paris in France?"}]}"#);
        let p = Prompt::from_request(&r).expect("valid");
        let (_, seed) = p.hashes();
        let full = content(&p, seed, Damage::None);
        assert_eq!(full, content(&p, seed, Damage::None));
        let verdict = full.lines().find_map(|l| l.strip_prefix("VERDICT: "));
        assert!(matches!(verdict, Some("yes" | "no")), "{full}");
        assert!(full.lines().any(|l| l.starts_with("CONFIDENCE: 0.")));
        assert!(!content(&p, seed, Damage::WrongSchema).contains("VERDICT"));
        let cut = content(&p, seed, Damage::Truncated);
        assert!(full.starts_with(&cut) && cut.len() <= full.len() / 2 + 1);
    }

    #[test]
    fn confidence_bands() {
        let r = req(r#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#);
        let p = Prompt::from_request(&r).expect("valid");
        let mut m = Material::new(&p, [7; 32]);
        let mut bands = [0; 3];
        for _ in 0..10_000 {
            let c = m.confidence();
            assert!((0.05..=0.99).contains(&c));
            bands[if c >= 0.85 {
                0
            } else if c >= 0.60 {
                1
            } else {
                2
            }] += 1;
        }
        assert!((4_700..5_300).contains(&bands[0]), "{bands:?}");
        assert!((2_700..3_300).contains(&bands[1]), "{bands:?}");
        assert!((1_700..2_300).contains(&bands[2]), "{bands:?}");
    }
}
