//! Gemini 2.5 thinking, as the mock models it.
//!
//! Contract: `generationConfig.thinkingConfig.thinkingBudget` is checked
//! against the model's range (Google, "Gemini thinking": 2.5 Pro 128 to
//! 32768 and never 0; 2.5 Flash 0 to 24576; 2.5 Flash-Lite 512 to 24576 or
//! 0; -1 dynamic everywhere): out of range is 400 INVALID_ARGUMENT. The
//! thinking spent is the budget, capped at `DYNAMIC_THOUGHTS`, or
//! `DYNAMIC_THOUGHTS` for dynamic thinking (no budget, or -1) on Pro and
//! Flash; Flash-Lite does not think without a budget. Other models do not
//! think and ignore the field. The pipeline counts the thinking against
//! `maxOutputTokens`: when thinking and answer together exceed it the answer
//! is cut off (finishReason MAX_TOKENS), and the usage reports it as
//! `thoughtsTokenCount`, billed as output.

/// What a 2.5 model thinks when left to decide (or at most, with a budget).
pub(crate) const DYNAMIC_THOUGHTS: u64 = 2048;

/// The thinking tokens `model` spends with `budget`, or the 400 message.
pub(crate) fn gemini_thoughts(model: &str, budget: Option<i64>) -> Result<u64, String> {
    let id = model.strip_prefix("models/").unwrap_or(model);
    // (lowest budget, highest, may 0 turn it off, thinks when not asked)
    let (lo, hi, off_ok, by_default) = if id.starts_with("gemini-2.5-pro") {
        (128, 32_768, false, true)
    } else if id.starts_with("gemini-2.5-flash-lite") {
        (512, 24_576, true, false)
    } else if id.starts_with("gemini-2.5-flash") {
        (1, 24_576, true, true)
    } else {
        return Ok(0);
    };
    match budget {
        None if by_default => Ok(DYNAMIC_THOUGHTS),
        None => Ok(0),
        Some(-1) => Ok(DYNAMIC_THOUGHTS),
        Some(0) if off_ok => Ok(0),
        Some(0) => Err("Budget 0 is invalid. This model only works in thinking mode.".into()),
        Some(b) if (lo..=hi).contains(&b) => Ok((b as u64).min(DYNAMIC_THOUGHTS)),
        Some(b) => Err(format!(
            "The thinking budget {b} is invalid. Please choose a value between {lo} and {hi}."
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_by_model() {
        assert_eq!(
            gemini_thoughts("gemini-2.5-flash", None),
            Ok(DYNAMIC_THOUGHTS)
        );
        assert_eq!(gemini_thoughts("gemini-2.5-flash", Some(0)), Ok(0));
        assert_eq!(gemini_thoughts("gemini-2.5-flash", Some(1024)), Ok(1024));
        assert_eq!(
            gemini_thoughts("models/gemini-2.5-pro", Some(-1)),
            Ok(DYNAMIC_THOUGHTS)
        );
        assert!(gemini_thoughts("gemini-2.5-pro", Some(0)).is_err());
        assert!(gemini_thoughts("gemini-2.5-pro", Some(64)).is_err());
        assert_eq!(gemini_thoughts("gemini-2.5-flash-lite", None), Ok(0));
        assert!(gemini_thoughts("gemini-2.5-flash-lite", Some(100)).is_err());
        assert_eq!(gemini_thoughts("gemini-2.0-flash", Some(5000)), Ok(0));
    }
}
