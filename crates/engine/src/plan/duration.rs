//! How long a run takes at least, for the estimate beside its cost: each
//! provider's synchronous requests and tokens against its requests/min and
//! tokens/min limits (stages sharing a provider share its limits; different
//! providers work side by side, so the slowest one sets the time). A lower
//! bound: answers take their own time too, and retries add requests.

use std::collections::BTreeMap;
use std::time::Duration;

use super::StageEstimate;
use crate::Prepared;

/// The run's shortest possible duration, or why none can be given.
#[derive(Debug, Clone, PartialEq)]
pub enum RunDuration {
    /// At least this long; `binding` says which limit sets it.
    AtLeast { secs: f64, binding: String },
    /// A provider takes synchronous requests under no limit: its speed
    /// decides.
    ProviderSpeed { provider: String },
    /// Every request goes to a Batch API: the provider's window decides.
    BatchWindow,
}

impl RunDuration {
    /// The estimate's line about it, if it has one.
    pub fn describe(&self) -> Option<String> {
        match self {
            RunDuration::AtLeast { secs, binding } => Some(format!(
                "  duration: at least ~{} ({binding})",
                docket_providers::batch::human_duration(Duration::from_secs_f64(secs.ceil()))
            )),
            RunDuration::ProviderSpeed { provider } => Some(format!(
                "  duration: provider {provider} has no requests/min or tokens/min limit, so its speed decides"
            )),
            RunDuration::BatchWindow => None,
        }
    }
}

/// Requests and tokens one provider is sent synchronously.
#[derive(Default)]
struct Load {
    requests: u64,
    tokens: u64,
    rpm: u64,
    tpm: u64,
}

/// The shortest duration for `items` items through `stages` (one estimate
/// per stage of `p`, in order).
pub(super) fn run_duration<'a>(
    p: &Prepared,
    stages: impl Iterator<Item = &'a StageEstimate>,
    items: u64,
) -> RunDuration {
    let mut load: BTreeMap<&str, Load> = BTreeMap::new();
    for (st, est) in p.stages.iter().zip(stages) {
        if est.batch_price_factor.is_some() {
            continue;
        }
        let l = load.entry(st.provider_name.as_str()).or_default();
        l.requests += items;
        l.tokens += est.prompt_tokens + est.expected_output_tokens;
        // The provider's limits as this run applies them (--rate-limit).
        (l.rpm, l.tpm) = (st.rpm, st.tpm);
    }
    let mut slowest: Option<(f64, String)> = None;
    for (provider, l) in &load {
        let (rpm, tpm) = (l.rpm, l.tpm);
        if rpm == 0 && tpm == 0 {
            return RunDuration::ProviderSpeed {
                provider: (*provider).to_string(),
            };
        }
        let by_requests = (rpm > 0).then(|| l.requests as f64 / rpm as f64 * 60.0);
        let by_tokens = (tpm > 0).then(|| l.tokens as f64 / tpm as f64 * 60.0);
        let (secs, binding) = match (by_requests, by_tokens) {
            (Some(r), Some(t)) if t > r => (t, tokens_binding(provider, tpm, l.tokens)),
            (Some(r), _) => (r, requests_binding(provider, rpm, l.requests)),
            (None, Some(t)) => (t, tokens_binding(provider, tpm, l.tokens)),
            (None, None) => continue,
        };
        if slowest.as_ref().is_none_or(|(s, _)| secs > *s) {
            slowest = Some((secs, binding));
        }
    }
    match slowest {
        Some((secs, binding)) => RunDuration::AtLeast { secs, binding },
        None => RunDuration::BatchWindow,
    }
}

fn requests_binding(provider: &str, rpm: u64, requests: u64) -> String {
    format!("{requests} requests under provider {provider}'s requests_per_minute = {rpm}")
}

fn tokens_binding(provider: &str, tpm: u64, tokens: u64) -> String {
    format!("~{tokens} tokens under provider {provider}'s tokens_per_minute = {tpm}")
}
