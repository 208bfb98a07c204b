//! Gemini 2.5's thinking budget: what `thinkingConfig.thinkingBudget` is
//! sent, and how many output tokens it may add beyond `max_tokens`.

/// The thinking budget a 2.5 Pro or Flash model gets when the stage sets
/// none. Those models think by default with a *dynamic* budget, and the
/// thinking is counted against `maxOutputTokens`: a short `max_tokens` can be
/// spent on thinking before the answer starts (finishReason MAX_TOKENS, no
/// text). A fixed budget bounds it: 1024 is inside every 2.5 model's range
/// (Pro 128 to 32768, Flash 0 to 24576, Flash-Lite 512 to 24576) and ample
/// for an adjudication, and it is *added* to `maxOutputTokens` (below), so
/// the answer keeps the whole `max_tokens` whatever the thinking took.
/// Flash-Lite does not think unless asked, so it gets none.
pub const DEFAULT_THINKING_BUDGET: i64 = 1024;

/// The `thinkingConfig.thinkingBudget` sent: the stage's, else the default
/// for a 2.5 Pro / Flash model, else none (the model's own behaviour; 3.x
/// models take `thinkingLevel` and accept `thinkingBudget` as set).
/// Sources (2026-11): Google, "Thinking mode",
/// https://ai.google.dev/gemini-api/docs/thinking-mode (0 turns thinking
/// off); the per-model ranges, -1 (dynamic) and that 2.5 Pro cannot turn it
/// off come from third-party summaries (dev.to "Gemini's thinking budget
/// parameter", help.apiyi.com on Gemini 2.5 vs 3 parameters), not from a
/// Google page read here.
pub(crate) fn thinking_budget(model: &str, set: Option<i64>) -> Option<i64> {
    let id = model.strip_prefix("models/").unwrap_or(model);
    set.or_else(|| {
        (id.starts_with("gemini-2.5-") && !id.starts_with("gemini-2.5-flash-lite"))
            .then_some(DEFAULT_THINKING_BUDGET)
    })
}

/// The output tokens a request may be billed beyond `max_tokens`: the
/// thinking budget added to `maxOutputTokens` (0 for dynamic thinking,
/// which shares `max_tokens`, and for every other provider kind).
pub fn thinking_allowance(model: &str, set: Option<i64>) -> u64 {
    thinking_budget(model, set).map_or(0, |b| u64::try_from(b).unwrap_or(0))
}
