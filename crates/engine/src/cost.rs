//! Token counts and prices.
//!
//! OpenAI models are counted with their real tokenizer (tiktoken); other
//! models fall back to a characters/4 estimate and say so. Prices come from
//! `assets/prices.toml`, embedded at build time.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use serde::Deserialize;

use crate::template::Prompt;

const PRICES_TOML: &str = include_str!("../../../assets/prices.toml");

/// Per-request framing tokens OpenAI adds around each chat message.
const TOKENS_PER_MESSAGE: u64 = 4;

#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
pub struct Price {
    /// USD per million input tokens.
    pub input: f64,
    /// USD per million cached input tokens (defaults to `input`).
    #[serde(default)]
    pub cached_input: Option<f64>,
    /// USD per million output tokens.
    pub output: f64,
}

#[derive(Debug, Deserialize)]
struct PriceTable {
    default: Price,
    models: BTreeMap<String, Price>,
}

fn table() -> &'static PriceTable {
    static TABLE: OnceLock<PriceTable> = OnceLock::new();
    TABLE.get_or_init(|| {
        toml::from_str(PRICES_TOML).unwrap_or(PriceTable {
            default: Price {
                input: 1.0,
                cached_input: None,
                output: 4.0,
            },
            models: BTreeMap::new(),
        })
    })
}

/// The price of `model`, and whether it was found (not the default).
/// Dated snapshots ("gpt-4o-mini-2024-07-18") use their family's price; a
/// routed name ("openai/gpt-4o-mini", "models/gemini-2.5-flash") is looked up
/// by its last path part.
pub fn price_of(model: &str) -> (Price, bool) {
    let t = table();
    let model = model.rsplit('/').next().unwrap_or(model);
    if let Some(p) = t.models.get(model) {
        return (*p, true);
    }
    let best = t
        .models
        .iter()
        .filter(|(name, _)| model.starts_with(name.as_str()))
        .max_by_key(|(name, _)| name.len());
    match best {
        Some((_, p)) => (*p, true),
        None => (t.default, false),
    }
}

impl Price {
    pub fn cost(&self, input_tokens: u64, cached_input_tokens: u64, output_tokens: u64) -> f64 {
        let cached = cached_input_tokens.min(input_tokens);
        let fresh = input_tokens - cached;
        (fresh as f64 * self.input
            + cached as f64 * self.cached_input.unwrap_or(self.input)
            + output_tokens as f64 * self.output)
            / 1_000_000.0
    }
}

/// Counts prompt tokens for one model.
pub struct TokenCounter {
    bpe: Option<Arc<tiktoken_rs::CoreBPE>>,
}

/// An OpenAI tokenizer's tables.
#[derive(Clone, Copy)]
enum Encoding {
    O200k,
    Cl100k,
}

/// Each tokenizer is built on first use and shared while a counter holds
/// it, then dropped with the last one: o200k's tables are about 27 MB of
/// heap, and a run without a cost cap needs them only while it plans (a
/// process-wide singleton kept them for the whole of a million-item run).
fn shared(encoding: Encoding) -> Option<Arc<tiktoken_rs::CoreBPE>> {
    static O200K: Mutex<Weak<tiktoken_rs::CoreBPE>> = Mutex::new(Weak::new());
    static CL100K: Mutex<Weak<tiktoken_rs::CoreBPE>> = Mutex::new(Weak::new());
    let slot = match encoding {
        Encoding::O200k => &O200K,
        Encoding::Cl100k => &CL100K,
    };
    let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(bpe) = slot.upgrade() {
        return Some(bpe);
    }
    // The tables are embedded in the binary: building them cannot fail
    // short of a broken build, and then counts fall back to the estimate.
    let built = match encoding {
        Encoding::O200k => tiktoken_rs::o200k_base(),
        Encoding::Cl100k => tiktoken_rs::cl100k_base(),
    };
    let bpe = Arc::new(built.ok()?);
    *slot = Arc::downgrade(&bpe);
    Some(bpe)
}

impl TokenCounter {
    pub fn for_model(model: &str) -> Self {
        let bpe = if is_openai_family(model) {
            // o200k covers gpt-4o, gpt-4.1, o-series; older models use cl100k.
            if model.starts_with("gpt-4o")
                || model.starts_with("gpt-4.1")
                || model.starts_with('o')
                || model.starts_with("gpt-5")
            {
                shared(Encoding::O200k)
            } else {
                shared(Encoding::Cl100k)
            }
        } else {
            None
        };
        Self { bpe }
    }

    /// True when counts come from the model's real tokenizer.
    pub fn is_exact(&self) -> bool {
        self.bpe.is_some()
    }

    pub fn count_text(&self, text: &str) -> u64 {
        match &self.bpe {
            Some(bpe) => bpe.encode_ordinary(text).len() as u64,
            None => (text.chars().count() as u64).div_ceil(4),
        }
    }

    /// Input tokens of a chat request carrying this prompt.
    pub fn count_prompt(&self, prompt: &Prompt) -> u64 {
        let mut n = 3 + TOKENS_PER_MESSAGE + self.count_text(&prompt.user);
        if let Some(s) = &prompt.system {
            n += TOKENS_PER_MESSAGE + self.count_text(s);
        }
        n
    }
}

fn is_openai_family(model: &str) -> bool {
    ["gpt-", "o1", "o3", "o4", "chatgpt-", "text-embedding-"]
        .iter()
        .any(|p| model.starts_with(p))
}

pub use docket_model::ids::sha256_hex;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_and_snapshot_and_unknown_prices() {
        let (p, found) = price_of("gpt-4o-mini");
        assert!(found);
        assert!((p.input - 0.15).abs() < 1e-12);
        let (q, found) = price_of("gpt-4o-mini-2024-07-18");
        assert!(found);
        assert_eq!(p, q);
        let (_, found) = price_of("some-local-llama");
        assert!(!found);
    }

    #[test]
    fn anthropic_gemini_and_routed_names_are_priced() {
        let (p, found) = price_of("claude-haiku-4-5-20251001");
        assert!(found);
        assert!((p.output - 5.0).abs() < 1e-12);
        let (p, _) = price_of("gemini-2.5-flash-lite");
        assert!((p.input - 0.10).abs() < 1e-12);
        let (p, _) = price_of("gemini-2.5-flash");
        assert!((p.input - 0.30).abs() < 1e-12);
        assert_eq!(
            price_of("models/gemini-2.5-flash"),
            price_of("gemini-2.5-flash")
        );
        assert_eq!(price_of("openai/gpt-4o-mini"), price_of("gpt-4o-mini"));
        // The whole table parses (a typo would silently fall back to defaults).
        assert!(table().models.len() >= 15);
    }

    #[test]
    fn cost_uses_cached_and_output_prices() {
        let p = Price {
            input: 1.0,
            cached_input: Some(0.5),
            output: 2.0,
        };
        let c = p.cost(1_000_000, 500_000, 1_000_000);
        assert!((c - (0.5 + 0.25 + 2.0)).abs() < 1e-9);
    }

    #[test]
    fn real_tokenizer_for_openai_models() {
        let t = TokenCounter::for_model("gpt-4o-mini");
        assert!(t.is_exact());
        // "hello world" is two tokens in o200k.
        assert_eq!(t.count_text("hello world"), 2);
        let other = TokenCounter::for_model("llama3");
        assert!(!other.is_exact());
        assert_eq!(other.count_text("abcdefgh"), 2);
    }

    #[test]
    fn a_tokenizer_is_shared_while_held_and_dropped_with_its_last_counter() {
        // cl100k: no other test of this crate counts with it.
        let slot_is_empty = || {
            TokenCounter::for_model("gpt-3.5-turbo")
                .bpe
                .is_some_and(|held| {
                    // Only the counter just made holds it: it was built afresh.
                    Arc::strong_count(&held) == 1
                })
        };
        let a = TokenCounter::for_model("gpt-4-turbo");
        let b = TokenCounter::for_model("gpt-3.5-turbo");
        let (Some(x), Some(y)) = (&a.bpe, &b.bpe) else {
            panic!("OpenAI models count with the real tokenizer");
        };
        assert!(Arc::ptr_eq(x, y), "two counters share one set of tables");
        assert_eq!(a.count_text("hello world"), 2);
        drop((a, b));
        assert!(slot_is_empty(), "the tables went with the last counter");
    }

    #[test]
    fn sha256_is_hex() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
