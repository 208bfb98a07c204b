//! The staged-pipeline switches applied to one answer, the same for every chat
//! route and every batch path (OpenAI/Azure lines, Anthropic, Gemini).
//!
//! Contract: `answer` builds an `answer::Steer` from the live config
//! (`verdict`, `verdict_disagree_rate`, `omit_optional_rate`,
//! `omit_optional_first`), generates the content, and counts
//! `partial_answers` when optional properties were left out. The
//! `omit_optional_first` budget is one server-wide counter, zeroed by every
//! config change and by `POST /_mock/reset`; an answer claims from it only when
//! its schema has at least two optional top-level properties.

use std::sync::atomic::Ordering::Relaxed;

use crate::answer::{self, Damage, Steer};
use crate::state::{Live, Shared};
use crate::wire::Prompt;

/// The content for `prompt` with the live steering switches applied.
pub(crate) fn answer(
    shared: &Shared,
    live: &Live,
    prompt: &Prompt<'_>,
    seed: [u8; 32],
    damage: Damage,
) -> String {
    let c = &live.config;
    let limit = c.omit_optional_first;
    let claim = || {
        shared
            .omit_first_used
            .fetch_update(Relaxed, Relaxed, |n| (n < limit).then_some(n + 1))
            .is_ok()
    };
    let steer = Steer {
        verdict: c.verdict.as_deref(),
        disagree_rate: c.verdict_disagree_rate,
        omit_rate: c.omit_optional_rate,
        omit_first: (limit > 0).then_some(&claim as &dyn Fn() -> bool),
        seed: c.seed,
        obey_injection: c.obey_injection,
    };
    let (content, partial) = answer::steered(prompt, seed, damage, &steer);
    if partial {
        shared.stats.partial_answer();
    }
    content
}
