//! The material answers are made of: `AnswerRng` (SplitMix64, the only
//! source of randomness), and `Material`, the RNG plus what the generators
//! borrow from the prompt (labels, UUIDs, content words), extracted lazily,
//! and the steering switches with their own stream (`VerdictChoice`).

use super::Steer;
use crate::wire::{Prompt, splitmix};

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
    pub obeys: bool,
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
    pub(super) fn steer(&mut self, steer: &Steer<'_>, seed: [u8; 32], omit_first: bool) {
        let mut mid = [0u8; 8];
        mid.copy_from_slice(&seed[8..16]);
        self.verdict = steer.verdict.map(str::to_string);
        self.disagree_rate = steer.disagree_rate;
        self.omit_rate = steer.omit_rate;
        self.steer_rng = AnswerRng(splitmix(u64::from_le_bytes(mid) ^ steer.seed));
        self.obeys = steer.obey_injection && orders_an_accept(self.prompt);
        self.omit_first = omit_first;
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
pub(super) fn content_words<'a>(prompt: &'a Prompt<'a>) -> Vec<&'a str> {
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
