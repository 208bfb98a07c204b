//! Submitting a formed batch: the create, and when its answer is lost,
//! the look for the batch at the provider before anything goes again.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use super::poll::{backoff, pause};
use super::resolve::{Resolved, resolve_by_custom_ids};
use super::{end_unrun, hold, hold_base, mark_unknown, waiting_ids};
use crate::batching::{Batcher, Reply};
use docket_ledger::Ledger;
use docket_ledger::batches::BatchOp;
use docket_ledger::work::BatchLedger;
use docket_ledger::writer::WriteOp;
use docket_providers::batch::{Found, LineSource, SubmitSpec, Submitted};
use docket_providers::{ErrorClass, ProviderError};

/// Submissions tried before a batch's requests are failed back to their
/// items (which retry them within their own budgets).
const MAX_SUBMITS: u32 = 5;

fn held_message(candidates: &[String]) -> String {
    format!(
        "the create answer was lost and the provider shows {} batches that could be this one ({}): its requests wait rather than risk paying twice. Check them at the provider; cancel the extra ones, then resume",
        candidates.len(),
        candidates
            .iter()
            .take(5)
            .map(|c| docket_model::sanitize::for_terminal(c))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

pub(super) enum Submitting {
    Done(Submitted),
    /// The provider refused the batch; it was not made.
    Failed(ProviderError),
    /// It may exist and cannot be told apart: wait for the operator.
    Held(String),
    /// Its create answer was lost and several batches at the provider could
    /// be it (their ids): `settle_ambiguity` tells them apart.
    Ambiguous(Vec<String>),
    /// The run stopped while submitting (the batch may exist: a resume
    /// looks for it).
    Stopped,
}

/// `submit`, and when the batch cannot be told apart from others, the
/// wait for them to end and the match of their custom ids.
pub(super) async fn submit_resolved(
    b: &Arc<Batcher>,
    tag: &str,
    created_at: f64,
    open: &mut Option<crate::batching::enqueued::Opened>,
    lines: &dyn LineSource,
) -> Submitting {
    let sub = submit(b, tag, created_at, open, lines).await;
    settle_ambiguity(b, tag, created_at, open, lines, sub).await
}

/// Row B1: a batch whose create answer was lost, with several batches at
/// the provider that could be it (Anthropic keeps no metadata: same window,
/// same request count). Nothing is sent while they run; once every one has
/// ended, their results are read for this batch's custom ids (unique to
/// each session, request and attempt): the one that has them is adopted;
/// when none has any, the create never made a batch (or one that ran
/// nothing) and it is submitted again. Anything else holds the batch for
/// the operator.
pub(super) async fn settle_ambiguity(
    b: &Arc<Batcher>,
    tag: &str,
    created_at: f64,
    open: &mut Option<crate::batching::enqueued::Opened>,
    lines: &dyn LineSource,
    mut sub: Submitting,
) -> Submitting {
    for _ in 0..3 {
        let Submitting::Ambiguous(candidates) = sub else {
            return sub;
        };
        match resolve_by_custom_ids(b, tag, created_at, &candidates).await {
            Resolved::Ours(id) => {
                b.event(
                    "info",
                    "batch_found",
                    format!(
                        "batch {tag}: of the {} batches that could be it, {} has its custom ids: collecting it, nothing is sent again",
                        candidates.len(),
                        docket_model::sanitize::for_terminal(&id)
                    ),
                );
                return Submitting::Done(Submitted {
                    provider_batch_id: id,
                    input_file_id: None,
                });
            }
            Resolved::NotMade => {
                b.event(
                    "info",
                    "batch_resubmitted",
                    format!(
                        "batch {tag}: none of the {} batches that could be it has any of its custom ids (they all ended): it was never made; submitting its {} requests now",
                        candidates.len(),
                        lines.len()
                    ),
                );
                sub = submit(b, tag, created_at, open, lines).await;
            }
            Resolved::Unsure(why) => return Submitting::Held(why),
            Resolved::Stopped => return Submitting::Stopped,
        }
    }
    match sub {
        Submitting::Ambiguous(c) => Submitting::Held(held_message(&c)),
        other => other,
    }
}

/// Submit `lines` as batch `tag`. When the create's answer is lost (a
/// network error, a 5xx after the batch may have been made), look for the
/// batch before submitting again.
pub(super) async fn submit(
    b: &Arc<Batcher>,
    tag: &str,
    created_at: f64,
    open: &mut Option<crate::batching::enqueued::Opened>,
    lines: &dyn LineSource,
) -> Submitting {
    let mut tries = 0u32;
    loop {
        tries += 1;
        let spec = SubmitSpec {
            tag,
            model: &b.stage().model,
            lines,
        };
        let r = tokio::select! {
            r = b.adapter.submit(spec) => r,
            _ = b.detached.cancelled() => return Submitting::Stopped,
        };
        let e = match r {
            Ok(s) => return Submitting::Done(s),
            Err(e) => e,
        };
        tracing::warn!(tag, "batch submit failed: {e}");
        // The model's enqueued-token limit (a 429 at create): no batch was
        // made. Learn from it and give the lines back to wait, rather than
        // ask again in a loop (row B3).
        if e.class == ErrorClass::RateLimited
            && crate::batching::enqueued::is_token_limit(&e.message)
        {
            let delay = match open.take() {
                Some(o) => o.refused(hold_base(b)),
                None => b
                    .enqueued
                    .refused(&b.enqueued_key(), 0, false, hold_base(b)),
            };
            let mut e = e;
            e.headers.retry_after = Some(delay.max(e.headers.retry_after.unwrap_or_default()));
            return Submitting::Failed(e);
        }
        match e.class {
            ErrorClass::RateLimited if tries < MAX_SUBMITS * 2 => {
                let wait = e.headers.retry_after.unwrap_or_else(|| backoff(tries));
                if !pause(b, wait).await {
                    return Submitting::Stopped;
                }
            }
            ErrorClass::Ambiguous | ErrorClass::Transient | ErrorClass::Overloaded => {
                if !pause(b, backoff(tries).min(Duration::from_secs(10))).await {
                    return Submitting::Stopped;
                }
                if let Some(end) = look_for_lost(b, tag, created_at, lines, e, tries).await {
                    return end;
                }
            }
            _ => return Submitting::Failed(e),
        }
    }
}

/// The create's answer was lost: look for the batch at the provider before
/// submitting again. How submitting ends, or None to submit again.
async fn look_for_lost(
    b: &Arc<Batcher>,
    tag: &str,
    created_at: f64,
    lines: &dyn LineSource,
    e: ProviderError,
    tries: u32,
) -> Option<Submitting> {
    match find_ours(b, tag, created_at, lines.len()).await {
        Ok(Found::One(id)) => {
            b.event(
                "info",
                "batch_found",
                format!(
                    "batch {tag}: the create answer was lost ({}); found the batch at the provider as {}: not submitted again",
                    e.message,
                    docket_model::sanitize::for_terminal(&id)
                ),
            );
            Some(Submitting::Done(Submitted {
                provider_batch_id: id,
                input_file_id: None,
            }))
        }
        Ok(Found::None) if tries < MAX_SUBMITS => None,
        Ok(Found::None) => Some(Submitting::Failed(e)),
        Ok(Found::Ambiguous(c)) => Some(Submitting::Ambiguous(c)),
        Err(fe) => Some(Submitting::Held(format!(
            "the create answer was lost ({}) and the provider's batch list could not be read ({fe}): its requests wait rather than risk paying twice; resume later",
            e.message
        ))),
    }
}

/// `find`, with the batches docket already knows taken out: a batch that is
/// another of ours can never be the one looked for.
pub(super) async fn find_ours(
    b: &Arc<Batcher>,
    tag: &str,
    created_at: f64,
    count: usize,
) -> Result<Found, ProviderError> {
    let found = b.adapter.find(tag, created_at, count).await?;
    let path = b.p.ledger.clone();
    let known: HashSet<String> = tokio::task::spawn_blocking(move || {
        Ledger::open_read_only(&path)
            .ok()
            .and_then(|l| l.known_provider_ids().ok())
            .unwrap_or_default()
    })
    .await
    .unwrap_or_default()
    .into_iter()
    .collect();
    Ok(match found {
        Found::One(id) if known.contains(&id) => Found::None,
        Found::Ambiguous(ids) => {
            let mut rest: Vec<String> = ids.into_iter().filter(|i| !known.contains(i)).collect();
            match rest.len() {
                0 => Found::None,
                1 => Found::One(rest.remove(0)),
                _ => Found::Ambiguous(rest),
            }
        }
        other => other,
    })
}

pub(super) async fn record_submitted(b: &Arc<Batcher>, tag: &str, s: &Submitted, n: usize) -> bool {
    let ok = b
        .write(WriteOp::Batch(BatchOp::Submitted {
            tag: tag.to_string(),
            provider_batch_id: s.provider_batch_id.clone(),
            input_file_id: s.input_file_id.clone(),
        }))
        .await;
    if ok {
        let id = docket_model::sanitize::for_terminal(&s.provider_batch_id);
        b.event(
            "info",
            "batch_submitted",
            format!(
                "batch {tag} submitted to {}: {n} requests, provider id {id}",
                b.stage().provider_name
            ),
        );
        b.reporter.line(&format!(
            "Submitted batch {tag} to {} ({}): {n} requests, provider id {id}",
            b.stage().provider_name,
            b.adapter.name()
        ));
    }
    ok
}

/// The batch was not made (refused) or cannot be told apart (held): tell
/// its lines, and the operator.
pub(super) async fn not_submitted(b: &Arc<Batcher>, tag: &str, how: Submitting) {
    match how {
        Submitting::Failed(e) => {
            // No batch was made and this tag is not asked for again: an
            // upload the adapter kept for it goes (row B2).
            if let Err(e) = b.adapter.abandon(tag).await {
                tracing::warn!(tag, "could not delete a kept upload: {e}");
            }
            let msg = format!("not submitted: {e}");
            let event = ("warn", "batch_failed", format!("batch {tag} {msg}"));
            // A create the provider refused made no batch and cost nothing
            // (row B2): its lines go back, each spending one transport
            // attempt, rather than fail their items at once. A refusal that
            // never changes ends them after `max_transport_attempts`. What
            // docket's own checks refused (no HTTP status) fails at once.
            let lines_get = if e.class == ErrorClass::Request && e.http_status.is_some() {
                ProviderError {
                    class: ErrorClass::Transient,
                    message: format!("batch create refused: {}", e.message),
                    ..e.clone()
                }
            } else {
                e.clone()
            };
            end_unrun(b, tag, "failed", msg, event, || {
                Reply::Error(lines_get.clone())
            })
            .await;
        }
        Submitting::Held(why) => {
            mark_unknown(b, tag, &why).await;
            // The lines stay as they are, in their batch: nothing claims
            // their items until the operator settles it and resumes.
            if let Some(waiting) = waiting_ids(b, tag).await {
                hold(b, waiting.len());
            }
        }
        Submitting::Ambiguous(c) => {
            Box::pin(not_submitted(b, tag, Submitting::Held(held_message(&c)))).await
        }
        Submitting::Stopped | Submitting::Done(_) => {}
    }
}
