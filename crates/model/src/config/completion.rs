//! A run's completion policy (`[job] completion_mode`, or `batch-adjudicate
//! --completion-mode`): when a session may call itself finished, from the
//! staged-batching plan's "Run policy" (§1.5).

use serde::{Deserialize, Serialize};

/// When a session is finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CompletionMode {
    /// Every item gets its result: a batch line the provider never ran (its
    /// batch expired or was cancelled by the provider) goes again in a new
    /// batch, spending none of the request's `max_transport_attempts`,
    /// until it runs. The default.
    #[default]
    Exact,
    /// Finish once what is left is only errors past their budgets: a line
    /// never run spends one of `max_transport_attempts`, and past them the
    /// item ends in `error` instead of going again.
    BestEffort,
    /// Cost before latency: as `exact`, and an `auto` stage puts even a
    /// cut smaller than `min_batch_size` in a provider batch (half price)
    /// instead of sending it synchronously.
    Throughput,
}

/// The names, as `docket.toml` and the flag spell them.
pub const COMPLETION_MODES: [&str; 3] = ["exact", "best_effort", "throughput"];

impl CompletionMode {
    pub fn as_str(self) -> &'static str {
        match self {
            CompletionMode::Exact => "exact",
            CompletionMode::BestEffort => "best_effort",
            CompletionMode::Throughput => "throughput",
        }
    }

    /// A line never run spends the request's transport attempts.
    pub fn not_run_spends_budget(self) -> bool {
        self == CompletionMode::BestEffort
    }
}

impl std::fmt::Display for CompletionMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not a completion mode.
#[derive(Debug, thiserror::Error)]
#[error("unknown completion mode `{0}`: expected one of exact, best_effort, throughput")]
pub struct UnknownCompletionMode(pub String);

impl std::str::FromStr for CompletionMode {
    type Err = UnknownCompletionMode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "exact" => Ok(CompletionMode::Exact),
            "best_effort" | "best-effort" => Ok(CompletionMode::BestEffort),
            "throughput" => Ok(CompletionMode::Throughput),
            other => Err(UnknownCompletionMode(other.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_reads_back() {
        for name in COMPLETION_MODES {
            let mode: CompletionMode = name.parse().expect("a mode");
            assert_eq!(mode.as_str(), name);
        }
        let err = "fast".parse::<CompletionMode>().expect_err("not a mode");
        assert!(err.to_string().contains("best_effort"), "{err}");
    }
}
