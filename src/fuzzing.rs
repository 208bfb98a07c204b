//! Entry points for fuzzing every reader of outside input (issue 12): item
//! files, the gates, each provider's answers and batch result lines,
//! `docket.toml` and `keymap.toml`. One function per target takes arbitrary
//! bytes; the only property is that none of them panics (an error is the
//! right answer to garbage). Two drivers use them:
//! - `fuzz/` (cargo-fuzz, coverage-guided, nightly): `fuzz/run-all.sh`, or
//!   `cargo +nightly fuzz run TARGET` there;
//! - `tests/fuzz_props.rs`: the committed corpus and a few thousand seeded
//!   mutations per target (`mutate`), in `cargo test`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::OnceLock;

use crate::gate::Gate;
use crate::items::ImportFormat;
use crate::ledger::LedgerError;
use crate::ledger::import::{Added, ItemBatch, Replaced};
use docket_model::evidence::Evidence;

/// A fuzz target: any bytes in, no panic out.
pub type Target = fn(&[u8]);

/// Every target, by name (the names of `fuzz/fuzz_targets/*.rs` and of the
/// corpus folders `fuzz/corpus/NAME/`).
pub const TARGETS: &[(&str, Target)] = &[
    ("items_jsonl", items_jsonl),
    ("items_csv", items_csv),
    ("gate_json_schema", gate_json_schema),
    ("gate_regex", gate_regex),
    ("answer_openai", answer_openai),
    ("answer_anthropic", answer_anthropic),
    ("answer_gemini", answer_gemini),
    ("answer_ollama", answer_ollama),
    ("answer_openrouter", answer_openrouter),
    ("batch_line_openai", batch_line_openai),
    ("batch_line_anthropic", batch_line_anthropic),
    ("batch_line_gemini", batch_line_gemini),
    ("docket_toml", docket_toml),
    ("keymap_toml", keymap_toml),
];

/// The target called `name`.
pub fn target(name: &str) -> Option<Target> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
}

/// An import into memory: ids seen, as a ledger would answer.
#[derive(Default)]
struct MemoryBatch(HashMap<String, (u64, String)>);

impl ItemBatch for MemoryBatch {
    fn add(&mut self, item_id: &str, evidence: &Evidence, line: u64) -> Result<Added, LedgerError> {
        Ok(match self.0.get(item_id) {
            Some((first, hash)) => Added::EarlierLine {
                line: *first,
                same_evidence: *hash == evidence.hash,
            },
            None => {
                self.0
                    .insert(item_id.to_string(), (line, evidence.hash.clone()));
                Added::New
            }
        })
    }

    fn replace(
        &mut self,
        item_id: &str,
        evidence: &Evidence,
        line: u64,
    ) -> Result<Replaced, LedgerError> {
        self.0
            .insert(item_id.to_string(), (line, evidence.hash.clone()));
        Ok(Replaced::default())
    }

    fn commit(self: Box<Self>) -> Result<(), LedgerError> {
        Ok(())
    }

    fn rollback(self: Box<Self>) -> Result<(), LedgerError> {
        Ok(())
    }
}

pub fn items_jsonl(data: &[u8]) {
    let _ = crate::items::import_from(data, ImportFormat::Jsonl, &mut MemoryBatch::default());
}

pub fn items_csv(data: &[u8]) {
    let _ = crate::items::import_from(data, ImportFormat::Csv, &mut MemoryBatch::default());
}

/// A model's answer against the scaffold's schema.
pub fn gate_json_schema(data: &[u8]) {
    static GATE: OnceLock<Gate> = OnceLock::new();
    let gate = GATE.get_or_init(|| {
        let schema = serde_json::from_str(include_str!(
            "../assets/workspace/schemas/adjudicate.schema.json"
        ))
        .expect("the scaffold's schema is JSON");
        Gate::json_schema(schema, "confidence", "rationale", true).expect("the scaffold's schema")
    });
    let _ = gate.check(&String::from_utf8_lossy(data));
}

/// A model's answer against a regex gate with named captures.
pub fn gate_regex(data: &[u8]) {
    static GATE: OnceLock<Gate> = OnceLock::new();
    let gate = GATE.get_or_init(|| {
        let cfg = crate::config::GateConfig::Regex {
            pattern: r"(?s)(?P<rationale>.*?)\s*VERDICT:\s*(?P<verdict>\w+)\s*CONFIDENCE:\s*(?P<confidence>[0-9.]+)".into(),
            confidence_field: "confidence".into(),
            rationale_field: "rationale".into(),
        };
        Gate::build(&cfg, Path::new("."), Path::new("docket.toml")).expect("the regex gate")
    });
    let _ = gate.check(&String::from_utf8_lossy(data));
}

pub use docket_providers::fuzzing::{
    answer_anthropic, answer_gemini, answer_ollama, answer_openai, answer_openrouter,
    batch_line_anthropic, batch_line_gemini, batch_line_openai,
};

/// `docket.toml`, read as `docket` reads it (its checks included), in a
/// folder with nothing else: a file it names is missing, which is an error.
pub fn docket_toml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = crate::config::LoadedConfig::parse(
        Path::new("/nonexistent-docket-fuzz/docket.toml"),
        text.to_string(),
    );
}

pub fn keymap_toml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = crate::tui::keymap::Keymap::from_toml_str(text, "keymap.toml");
}

/// The corpus of `target` (`fuzz/corpus/TARGET/*`, sorted by name).
pub fn corpus(root: &Path, target: &str) -> std::io::Result<Vec<Vec<u8>>> {
    let mut files: Vec<_> = std::fs::read_dir(root.join(target))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files.iter().map(std::fs::read).collect()
}

/// Tokens a mutation may insert: the structure the readers look for.
const TOKENS: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b":",
    b",",
    b"\n",
    b"\r\n",
    b"\\",
    b"\\u0000",
    b"\\ud800",
    b"null",
    b"true",
    b"-0",
    b"1e400",
    b"18446744073709551616",
    b"NaN",
    b"\"id\"",
    b"\"custom_id\"",
    b"\"key\"",
    b"\"content\"",
    b"\"choices\"",
    b"\"candidates\"",
    b"\"usage\"",
    b"\"error\"",
    b"\"confidence\"",
    b"\xEF\xBB\xBF",
    b"\xFF",
    b"\xC3\x28",
    "é".as_bytes(),
    "\u{202E}".as_bytes(),
    b"\x1b[2J",
    b"[[stages]]",
    b"[providers.x]",
    b"=",
    b"'''",
    b"ctrl-",
    b"VERDICT:",
    b"CONFIDENCE:",
];

/// One mutation of a corpus entry (or a splice of two), as a coverage-blind
/// fuzzer makes them: flips, interesting bytes, inserted tokens, deleted or
/// repeated ranges. Stacks 1 to 8 of them.
pub fn mutate(rng: &mut impl rand::Rng, corpus: &[Vec<u8>]) -> Vec<u8> {
    let mut data = match corpus.len() {
        0 => Vec::new(),
        n => corpus[rng.random_range(0..n)].clone(),
    };
    for _ in 0..rng.random_range(1..=8) {
        let len = data.len();
        let at = if len == 0 {
            0
        } else {
            rng.random_range(0..=len)
        };
        match rng.random_range(0..8) {
            0 if len > 0 => {
                let i = rng.random_range(0..len);
                data[i] ^= 1 << rng.random_range(0..8);
            }
            1 if len > 0 => {
                let i = rng.random_range(0..len);
                data[i] = [0u8, 0x7f, 0x80, 0xff, b'"', b'\\', b'\n', b'0'][rng.random_range(0..8)];
            }
            2 => {
                let t = TOKENS[rng.random_range(0..TOKENS.len())];
                data.splice(at..at, t.iter().copied());
            }
            3 if len > 0 => {
                let end = (at + rng.random_range(1..=64)).min(len);
                data.drain(at.min(end)..end);
            }
            4 if len > 0 && len < 1 << 20 => {
                // Repeat a range: deep nesting, long lines.
                let start = rng.random_range(0..len);
                let end = (start + rng.random_range(1..=32)).min(len);
                let piece = data[start..end].repeat(rng.random_range(1..=64));
                data.splice(at..at, piece);
            }
            5 if corpus.len() > 1 => {
                let other = &corpus[rng.random_range(0..corpus.len())];
                if !other.is_empty() {
                    let from = rng.random_range(0..other.len());
                    data.truncate(at);
                    data.extend_from_slice(&other[from..]);
                }
            }
            6 => data.truncate(at),
            _ => {
                let n = rng.random_range(1..=8);
                let bytes: Vec<u8> = (0..n).map(|_| rng.random()).collect();
                data.splice(at..at, bytes);
            }
        }
    }
    data
}
