//! Telling a batch apart from others that could be it (row B1): wait for
//! every candidate to end, then match their results' custom ids.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use super::poll::{backoff, cadence, pause};
use super::{line_ids, mark_unknown};
use crate::batching::Batcher;
use docket_providers::batch::{BatchState, BatchStatus};

/// What the candidates' custom ids showed.
pub(super) enum Resolved {
    /// This one has the batch's custom ids.
    Ours(String),
    /// None has any: the batch was never made (or ran nothing).
    NotMade,
    /// Cannot tell (results not to be had, several with its ids): why.
    Unsure(String),
    /// The run let go of its batches meanwhile.
    Stopped,
}

/// Polls before a candidate that keeps failing to answer leaves the batch
/// to the operator.
const RESOLVE_POLL_ERRORS_MAX: u32 = 20;

/// Wait for every one of `candidates` to end, then read their results for
/// batch `tag`'s custom ids.
pub(super) async fn resolve_by_custom_ids(
    b: &Arc<Batcher>,
    tag: &str,
    created_at: f64,
    candidates: &[String],
) -> Resolved {
    let listed = candidates
        .iter()
        .take(5)
        .map(|c| docket_model::sanitize::for_terminal(c))
        .collect::<Vec<_>>()
        .join(", ");
    let why = format!(
        "the create answer was lost and the provider shows {} batches that could be this one ({listed}): nothing is sent again; once they have all ended, their results are matched against its custom ids",
        candidates.len()
    );
    mark_unknown(b, tag, &why).await;
    let Some(ours) = line_ids(b, tag).await else {
        return Resolved::Stopped;
    };
    let ended = match wait_for_all_to_end(b, created_at, candidates, &why).await {
        Ok(ended) => ended,
        Err(unresolved) => return unresolved,
    };
    // Whose results have this batch's custom ids.
    let mut matched = Vec::new();
    for (id, status) in &ended {
        match has_our_ids(b, id, status, &ours, &why).await {
            Ok(true) => matched.push(id.clone()),
            Ok(false) => {}
            Err(unresolved) => return unresolved,
        }
    }
    match matched.len() {
        0 => Resolved::NotMade,
        1 => Resolved::Ours(matched.remove(0)),
        _ => Resolved::Unsure(format!(
            "{why}; {} of them have its custom ids ({}): its requests wait. Check them at the provider, then resume",
            matched.len(),
            matched
                .iter()
                .map(|c| docket_model::sanitize::for_terminal(c))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// Poll every candidate to its end, at the cadence (slower while polls
/// fail). Their last statuses; or how it was left undecided.
async fn wait_for_all_to_end(
    b: &Arc<Batcher>,
    created_at: f64,
    candidates: &[String],
    why: &str,
) -> Result<Vec<(String, BatchStatus)>, Resolved> {
    let mut ended: Vec<(String, BatchStatus)> = Vec::new();
    let mut running: Vec<String> = candidates.to_vec();
    let mut errors = 0u32;
    while !running.is_empty() {
        let mut still = Vec::new();
        for id in running {
            let polled = tokio::select! {
                r = b.adapter.poll(&id) => r,
                _ = b.detached.cancelled() => return Err(Resolved::Stopped),
            };
            match polled {
                Ok(s) if s.state.is_terminal() && !s.results_pending => ended.push((id, s)),
                Ok(_) => still.push(id),
                Err(e) => {
                    errors += 1;
                    if errors >= RESOLVE_POLL_ERRORS_MAX {
                        return Err(Resolved::Unsure(format!(
                            "{why}; but batch {} cannot be polled ({e}): its requests wait rather than risk paying twice. Check it at the provider, then resume",
                            docket_model::sanitize::for_terminal(&id)
                        )));
                    }
                    still.push(id);
                }
            }
        }
        running = still;
        if !running.is_empty() {
            // At the cadence; slower while polls fail.
            let mut wait = cadence(b, &BatchState::InProgress, created_at);
            if errors > 0 {
                wait = wait.max(backoff(errors).min(Duration::from_secs(60)));
            }
            if !pause(b, wait).await {
                return Err(Resolved::Stopped);
            }
        }
    }
    Ok(ended)
}

/// Whether the ended batch `id`'s results hold any of `ours` (its stream
/// read again a few times when it breaks off first); or how it was left
/// undecided.
async fn has_our_ids(
    b: &Arc<Batcher>,
    id: &str,
    status: &BatchStatus,
    ours: &HashSet<String>,
    why: &str,
) -> Result<bool, Resolved> {
    let mut hits = 0u64;
    let mut read;
    let mut tries = 0u32;
    loop {
        tries += 1;
        read = {
            let mut sink = |l: docket_providers::batch::ResultLine| {
                if ours.contains(&l.custom_id) {
                    hits += 1;
                }
            };
            tokio::select! {
                r = b.adapter.results(status, ours, &mut sink) => r,
                _ = b.detached.cancelled() => return Err(Resolved::Stopped),
            }
        };
        // A stream that broke off before any of its ids, or a read
        // that failed: read again, a few times.
        let again = match &read {
            Ok(sum) => sum.cut && hits == 0,
            Err(_) => true,
        };
        if !again || tries >= 3 {
            break;
        }
        if !pause(b, backoff(tries)).await {
            return Err(Resolved::Stopped);
        }
    }
    match read {
        Ok(sum) if !sum.cut => {}
        Ok(_) if hits > 0 => {}
        Ok(_) => {
            return Err(Resolved::Unsure(format!(
                "{why}; but the results of {} broke off before any of its custom ids: its requests wait rather than risk paying twice; resume to look again",
                docket_model::sanitize::for_terminal(id)
            )));
        }
        Err(e) => {
            return Err(Resolved::Unsure(format!(
                "{why}; but the results of {} cannot be read ({e}): its requests wait rather than risk paying twice. Check it at the provider, then resume",
                docket_model::sanitize::for_terminal(id)
            )));
        }
    }
    Ok(hits > 0)
}
