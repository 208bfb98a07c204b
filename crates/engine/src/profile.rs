//! `batch-adjudicate --profile NAME`: the named rate-limit profile read from
//! the ledger and put over the limits of the stages that use its provider.
//! The config itself (and so the session's snapshot of docket.toml) stays as
//! the file says; the profile and its version are recorded with the session
//! instead, and a resume runs with the version the session started with.

use std::time::Duration;

use docket_ledger::profiles::Profiles;
use docket_ledger::{Ledger, LedgerLocation};
use docket_model::profile::Profile;

use crate::{EngineError, RunOptions, stages::Stage};

/// The profile `opts.profile` names: the version a resumed session recorded
/// under that name, else the newest. `None` without `--profile`.
pub(crate) fn resolve(
    opts: &RunOptions,
    ledger: &LedgerLocation,
) -> Result<Option<Profile>, EngineError> {
    let Some(name) = &opts.profile else {
        return Ok(None);
    };
    // No ledger yet: no profile can have been set in it.
    let (history, pinned, known) = match Ledger::open_read_only(ledger.clone()) {
        Ok(l) => {
            let pinned = match &opts.resume {
                Some(id) => l.session_profile(id)?,
                None => None,
            };
            let known: Vec<String> = l.profiles()?.into_iter().map(|p| p.name).collect();
            (l.profile_history(name)?, pinned, known)
        }
        Err(_) => (Vec::new(), None, Vec::new()),
    };
    let wanted = pinned.filter(|(n, _)| n == name).map(|(_, v)| v);
    let found = match wanted {
        Some(v) => history.into_iter().find(|p| p.version == v),
        None => history.into_iter().last(),
    };
    found.map(Some).ok_or_else(|| {
        EngineError::Usage(format!(
            "--profile {name}: no such rate-limit profile in the ledger (known: {}); create it with `docket profile set {name} --provider NAME --rpm N ...`",
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        ))
    })
}

/// Put the profile's limits over each stage that uses its provider (and
/// model, when the profile names one). A profile no stage can use is
/// refused, naming both sides. `--rate-limit` still wins over its rpm.
pub(crate) fn apply(
    profile: &Profile,
    stages: &mut [Stage],
    rate_limit_flag: Option<u64>,
) -> Result<(), EngineError> {
    let mut used = false;
    for s in stages.iter_mut() {
        if s.provider_name != profile.provider {
            continue;
        }
        if let Some(m) = &profile.model
            && m != &s.model
        {
            return Err(EngineError::Usage(format!(
                "--profile {}: the profile is for provider {} model {m}, but stage \"{}\" sends provider {} model {}",
                profile.name, profile.provider, s.name, s.provider_name, s.model
            )));
        }
        used = true;
        let l = &profile.limits;
        if rate_limit_flag.is_none()
            && let Some(v) = l.requests_per_minute
        {
            s.rpm = v;
        }
        if let Some(v) = l.tokens_per_minute {
            s.tpm = v;
        }
        if let Some(v) = l.max_concurrency {
            s.max_concurrency = v.min(10_000) as usize;
        }
        if let Some(v) = l.request_timeout_secs {
            // Checked when set; a value that is no duration leaves the section's.
            s.request_timeout = Duration::try_from_secs_f64(v).unwrap_or(s.request_timeout);
        }
        if let Some(v) = l.max_transport_attempts {
            s.max_transport_attempts = v.min(u64::from(u32::MAX)) as u32;
        }
        if let Some(v) = l.max_rate_limit_retries {
            s.max_rate_limit_retries = v.min(u64::from(u32::MAX)) as u32;
        }
        if let Some(v) = l.retry_wait_secs {
            s.retry_wait = Duration::try_from_secs_f64(v).unwrap_or(s.retry_wait);
        }
    }
    if used {
        return Ok(());
    }
    let mut providers: Vec<&str> = stages.iter().map(|s| s.provider_name.as_str()).collect();
    providers.dedup();
    Err(EngineError::Usage(format!(
        "--profile {}: the profile is for provider {}, but this job's stages use provider {}",
        profile.name,
        profile.provider,
        providers.join(", ")
    )))
}
