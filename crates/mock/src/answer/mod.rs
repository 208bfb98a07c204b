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

use super::json::Json;
use super::schema;
use super::wire::{Format, Prompt, splitmix};

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

/// How a steered verdict is chosen among its options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VerdictChoice<'a> {
    /// not steered: keep the seeded value
    Seeded,
    /// this label if an option allows it (else option 0)
    Label(&'a str),
    /// this option index
    Index(usize),
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
    m.steer(steer, seed);
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

/// The gullible model's rule, deliberately its own (not docket's detector):
/// a message says to ignore or disregard something and to accept, or
/// carries a confidence of 1 as JSON.
fn orders_an_accept(prompt: &Prompt<'_>) -> bool {
    prompt.messages.iter().flat_map(|m| m.pieces()).any(|text| {
        let t = text.to_ascii_lowercase();
        let compact: String = t.chars().filter(|c| !c.is_whitespace()).collect();
        ((t.contains("ignore") || t.contains("disregard")) && t.contains("accept"))
            || compact.contains("\"confidence\":1")
    })
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

/// SplitMix64: tiny, fast, and stable forever.
pub(crate) struct AnswerRng(u64);

impl AnswerRng {
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        splitmix(self.0)
    }

    /// Uniform in [0, 1).
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in 0..n (0 when n is 0).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }

    pub(crate) fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
}

/// The RNG plus everything the generators borrow from the prompt, extracted lazily.
pub(crate) struct Material<'a> {
    pub rng: AnswerRng,
    prompt: &'a Prompt<'a>,
    labels: Option<Vec<&'a str>>,
    uuids: Option<Vec<&'a str>>,
    words: Option<Vec<&'a str>>,
    /// the steering switches (owned copies: cheap, and no lifetime knots)
    verdict: Option<String>,
    disagree_rate: f64,
    omit_rate: f64,
    omit_first: bool,
    /// second stream for steering draws, so the main stream never shifts
    steer_rng: AnswerRng,
    /// set when optional properties were left out
    pub partial: bool,
    /// the prompt ordered an accept and the model obeys (`obey_injection`)
    obeys: bool,
}

const FALLBACK_WORDS: [&str; 4] = ["the title", "the date", "the source", "the wording"];

impl<'a> Material<'a> {
    pub(crate) fn new(prompt: &'a Prompt<'a>, seed: [u8; 32]) -> Material<'a> {
        let mut head = [0u8; 8];
        head.copy_from_slice(&seed[..8]);
        Material {
            rng: AnswerRng(u64::from_le_bytes(head)),
            prompt,
            labels: None,
            uuids: None,
            words: None,
            verdict: None,
            disagree_rate: 0.0,
            omit_rate: 0.0,
            omit_first: false,
            steer_rng: AnswerRng(0),
            partial: false,
            obeys: false,
        }
    }

    /// Take the steering switches; the steering stream is seeded by the prompt
    /// hash (bytes 8..16) and the config seed.
    fn steer(&mut self, steer: &Steer<'_>, seed: [u8; 32]) {
        let mut mid = [0u8; 8];
        mid.copy_from_slice(&seed[8..16]);
        self.verdict = steer.verdict.map(str::to_string);
        self.disagree_rate = steer.disagree_rate;
        self.omit_rate = steer.omit_rate;
        self.steer_rng = AnswerRng(splitmix(u64::from_le_bytes(mid) ^ steer.seed));
        self.obeys = steer.obey_injection && orders_an_accept(self.prompt);
        // Claimed before generating, and only when the omit rules apply at all.
        self.omit_first = match self.prompt.format {
            Format::JsonSchema(Some(s)) if schema::optional_properties(s).len() >= 2 => {
                steer.omit_first.is_some_and(|claim| claim())
            }
            _ => false,
        };
    }

    /// How the verdict among `n` options is steered (draws from the steering stream).
    pub(crate) fn verdict_choice(&mut self, n: usize) -> VerdictChoice<'_> {
        if let Some(label) = &self.verdict {
            return VerdictChoice::Label(label);
        }
        if self.disagree_rate > 0.0 {
            let disagree = self.steer_rng.chance(self.disagree_rate);
            return VerdictChoice::Index(if disagree && n >= 2 { 1 } else { 0 });
        }
        VerdictChoice::Seeded
    }

    /// Which optional properties (top level, schema order) to leave out, if the omit rules apply.
    pub(crate) fn omitted<'s>(&mut self, optional: &[&'s str]) -> Vec<&'s str> {
        if optional.len() < 2 {
            return Vec::new();
        }
        if self.omit_first {
            return optional[1..].to_vec();
        }
        if self.omit_rate <= 0.0 {
            return Vec::new();
        }
        let rate = self.omit_rate;
        optional
            .iter()
            .copied()
            .filter(|_| self.steer_rng.chance(rate))
            .collect()
    }

    /// Confidence with the three-band spread, in hundredths (1.0 when the
    /// model obeys an order in the prompt; drawn all the same, so the rest
    /// of the answer does not change).
    pub(crate) fn confidence(&mut self) -> f64 {
        let drawn = self.drawn_confidence();
        if self.obeys { 1.0 } else { drawn }
    }

    fn drawn_confidence(&mut self) -> f64 {
        let band = self.rng.unit();
        let (lo, hi) = if band < 0.5 {
            (85, 99)
        } else if band < 0.8 {
            (60, 84)
        } else {
            (5, 59)
        };
        (lo + self.rng.below(hi - lo + 1)) as f64 / 100.0
    }

    /// Labels from the first `Labels: a, b, c` line of the prompt, if any.
    pub(crate) fn labels(&mut self) -> &[&'a str] {
        let prompt = self.prompt;
        self.labels.get_or_insert_with(|| find_labels(prompt))
    }

    /// A label from the prompt's label line, else yes/no.
    pub(crate) fn label(&mut self) -> String {
        let n = self.labels().len();
        let i = self.rng.below(if n == 0 { 2 } else { n });
        match self.labels().get(i) {
            Some(l) => (*l).to_string(),
            None => ["yes", "no"][i % 2].to_string(),
        }
    }

    /// UUID-shaped tokens (8-4-4-4-12 hex) of the prompt, in order of appearance, deduplicated.
    pub(crate) fn uuids(&mut self) -> &[&'a str] {
        let prompt = self.prompt;
        self.uuids.get_or_insert_with(|| {
            let mut found = Vec::new();
            for piece in prompt.pieces() {
                find_uuids(piece, &mut found);
            }
            found
        })
    }

    /// `sentences` (1-3) plausible sentences naming a few words of the prompt.
    pub(crate) fn rationale(&mut self, sentences: usize) -> String {
        let prompt = self.prompt;
        let words = self.words.get_or_insert_with(|| content_words(prompt));
        let mut out = String::with_capacity(200);
        let first = self.rng.below(TEMPLATES.len());
        for k in 0..sentences.clamp(1, 3) {
            let template = TEMPLATES[(first + k) % TEMPLATES.len()];
            let (a, b) = pick_two(words, &mut self.rng);
            if k > 0 {
                out.push(' ');
            }
            for (i, chunk) in template.split('@').enumerate() {
                if i > 0 {
                    out.push_str(if i == 1 { a } else { b });
                }
                out.push_str(chunk);
            }
        }
        out
    }
}

/// Two different words of the prompt (or of the fallbacks when it has fewer than two).
fn pick_two<'w>(words: &[&'w str], rng: &mut AnswerRng) -> (&'w str, &'w str) {
    let pool: &[&'w str] = if words.len() >= 2 {
        words
    } else {
        &FALLBACK_WORDS
    };
    let a = rng.below(pool.len());
    let b = (a + 1 + rng.below(pool.len() - 1)) % pool.len();
    (pool[a], pool[b])
}

/// Sentence templates; each `@` is replaced by a prompt word (first a, then b).
const TEMPLATES: [&str; 5] = [
    "Both descriptions agree on @ and @, which supports this assessment.",
    "The details around @ are consistent with @, and no conflicting evidence was found.",
    "Key fields such as @ and @ were compared; the remaining differences look like formatting noise.",
    "The mention of @ lines up with @, so the match is plausible.",
    "Differences in @ are minor compared with the agreement on @.",
];

fn find_labels<'a>(prompt: &'a Prompt<'a>) -> Vec<&'a str> {
    for piece in prompt.pieces() {
        for line in piece.lines() {
            let Some(list) = labels_list(line) else {
                continue;
            };
            let labels: Vec<&str> = list
                .split([',', '|'])
                .map(|l| l.trim().trim_matches(['"', '\'', '`', '.', ' ']))
                .filter(|l| !l.is_empty())
                .collect();
            if !labels.is_empty() {
                return labels;
            }
        }
    }
    Vec::new()
}

/// The text after `Labels:` when `line` is a label line (bullets and case ignored).
fn labels_list(line: &str) -> Option<&str> {
    let line = line.trim_start_matches([' ', '\t', '-', '*', '#']);
    let head = line.get(..7)?;
    head.eq_ignore_ascii_case("labels:").then(|| &line[7..])
}

fn find_uuids<'a>(text: &'a str, out: &mut Vec<&'a str>) {
    let b = text.as_bytes();
    let mut i = 0;
    while i + 36 <= b.len() {
        let fenced_before = i == 0 || !is_token_byte(b[i - 1]);
        let fenced_after = i + 36 == b.len() || !is_token_byte(b[i + 36]);
        if fenced_before && fenced_after && is_uuid(&b[i..i + 36]) {
            // All 36 bytes are ASCII, so the slice is on char boundaries.
            let u = &text[i..i + 36];
            if !out.contains(&u) {
                out.push(u);
            }
            i += 36;
        } else {
            i += 1;
        }
    }
}

fn is_token_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'-' || c == b'_'
}

fn is_uuid(b: &[u8]) -> bool {
    b.iter().enumerate().all(|(i, c)| match i {
        8 | 13 | 18 | 23 => *c == b'-',
        _ => c.is_ascii_hexdigit(),
    })
}

const STOPWORDS: [&str; 40] = [
    "about",
    "above",
    "after",
    "again",
    "against",
    "answer",
    "because",
    "before",
    "being",
    "below",
    "between",
    "both",
    "confidence",
    "could",
    "does",
    "each",
    "from",
    "have",
    "into",
    "json",
    "label",
    "labels",
    "more",
    "only",
    "other",
    "rationale",
    "respond",
    "return",
    "should",
    "some",
    "than",
    "that",
    "their",
    "them",
    "there",
    "these",
    "this",
    "verdict",
    "which",
    "with",
];

/// Words worth quoting back: 4-20 letters, not stopwords, no digits (ids read badly).
/// Later messages first (the item usually sits in the last user message), capped for speed.
fn content_words<'a>(prompt: &'a Prompt<'a>) -> Vec<&'a str> {
    let mut words: Vec<&str> = Vec::new();
    for msg in prompt.messages.iter().rev() {
        // Label lines are instructions, not the item: quoting them back reads oddly.
        let lines = msg.pieces().flat_map(str::lines);
        for line in lines.filter(|l| labels_list(l).is_none()) {
            for w in line.split(|c: char| !c.is_alphabetic()) {
                let n = w.chars().count();
                if (4..=20).contains(&n)
                    && !STOPWORDS.iter().any(|s| s.eq_ignore_ascii_case(w))
                    && !words.iter().any(|x| x.eq_ignore_ascii_case(w))
                {
                    words.push(w);
                    if words.len() >= 48 {
                        return words;
                    }
                }
            }
        }
    }
    words
}

#[cfg(test)]
mod tests {
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
