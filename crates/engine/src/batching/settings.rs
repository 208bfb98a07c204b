//! A stage's batch settings: its triggers (COUNT, SIZE, TIME) and bounds,
//! from its config within its provider's limits.

use std::time::Duration;

use docket_model::config::{BatchMode, CompletionMode};
use docket_providers::batch::BatchProvider;

/// The triggers and bounds of a stage's batching.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    pub(crate) mode: BatchMode,
    pub(crate) min_batch_size: usize,
    /// COUNT trigger (at most the provider's requests per batch).
    pub(crate) max_requests: usize,
    /// SIZE trigger, in bytes of JSONL (at most the provider's file size).
    pub(crate) max_bytes: u64,
    /// TIME trigger.
    pub(crate) max_wait: Duration,
    pub(crate) max_open: usize,
    /// A fixed poll interval instead of the provider's cadence.
    pub(crate) poll_interval: Option<Duration>,
    /// The provider's enqueued-token limit for the model, when configured.
    pub(crate) max_enqueued_tokens: Option<u64>,
    /// A batch still running this long after its submission is stalled
    /// (None: the provider's completion window).
    pub(crate) stall_after: Option<Duration>,
}

/// The batch settings of a stage for its provider's limits; `None` when
/// batching is off and no batch of the session is open. Under the
/// `throughput` completion mode an `auto` stage batches every cut, however
/// small (half price before latency): a `min_batch_size` of 0.
pub(crate) fn settings_for(
    p: &crate::stages::Stage,
    adapter: &dyn BatchProvider,
    completion: CompletionMode,
) -> Settings {
    let b = &p.batch;
    let limits = adapter.limits();
    let max_requests = b
        .max_requests
        .as_ref()
        .map(|n| *n.get_ref() as usize)
        .unwrap_or(limits.max_requests)
        .clamp(1, limits.max_requests.max(1));
    let max_bytes = b
        .max_bytes
        .as_ref()
        .map(|n| *n.get_ref())
        .unwrap_or(limits.max_bytes)
        .clamp(1, limits.max_bytes.max(1));
    let poll_interval = b
        .poll_interval_secs
        .as_ref()
        .map(|s| Duration::from_secs_f64(*s.get_ref()))
        // The built-in mock runs a batch in seconds: poll it like that.
        .or(
            (p.provider_kind == docket_model::config::ProviderKind::Mock)
                .then(|| Duration::from_millis(250)),
        );
    Settings {
        mode: b.mode,
        min_batch_size: match completion {
            CompletionMode::Throughput => 0,
            _ => (*b.min_batch_size.get_ref()).min(usize::MAX as u64) as usize,
        },
        max_requests,
        max_bytes,
        max_wait: Duration::from_secs_f64(*b.max_wait_secs.get_ref()),
        max_open: (*b.max_open_batches.get_ref()).clamp(1, 1_000) as usize,
        poll_interval,
        max_enqueued_tokens: b.max_enqueued_tokens.as_ref().map(|n| *n.get_ref()),
        stall_after: b
            .stall_after_secs
            .as_ref()
            .map(|s| Duration::from_secs_f64(*s.get_ref())),
    }
}
