//! Provider batch states as the console reads them: their lifecycle order
//! and which of them are finished at the provider. Pure: the rows
//! themselves are read by `ledger::console`.

/// The states in lifecycle order: how the summary lists them.
pub const BATCH_STATES: &[&str] = &[
    "submitting",
    "validating",
    "in_progress",
    "finalizing",
    "completed",
    "failed",
    "expired",
    "cancelling",
    "cancelled",
    "unknown",
    "ingested",
];

/// A batch in this state is finished at the provider: nothing to poll.
pub fn is_terminal_state(state: &str) -> bool {
    matches!(
        state,
        "completed" | "failed" | "expired" | "cancelled" | "ingested"
    )
}

/// Where `state` sorts in a summary: lifecycle order, then any state this
/// version does not know.
pub fn state_rank(state: &str) -> usize {
    BATCH_STATES
        .iter()
        .position(|k| *k == state)
        .unwrap_or(BATCH_STATES.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_states_sort_last() {
        assert!(state_rank("submitting") < state_rank("ingested"));
        assert_eq!(state_rank("mystery"), BATCH_STATES.len());
        assert!(is_terminal_state("ingested") && !is_terminal_state("in_progress"));
    }
}
