//! Batches found open in the ledger (a resume, or a worker that died):
//! re-attached and collected, and one whose create answer was lost looked
//! for at the provider before anything is sent again.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::poll::drive;
use super::submit::{
    Submitting, find_ours, not_submitted, record_submitted, settle_ambiguity, submit_resolved,
};
use super::{Held, Tracked};
use crate::batching::lines::LedgerLines;
use crate::batching::{Adoption, Batcher};
use docket_ledger::batches::OpenBatch;
use docket_providers::batch::{Found, LineSource, Submitted};

/// A batch found open in the ledger (a resume, or one whose worker died):
/// collect it, never send its lines again unless the provider shows it was
/// never made.
pub(in crate::batching) async fn reattach(
    b: Arc<Batcher>,
    batch: OpenBatch,
    waiting: usize,
    adoption: Adoption,
) {
    let permit = tokio::select! {
        p = b.open_slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
        _ = b.detached.cancelled() => return,
    };
    b.open.fetch_add(1, Ordering::Relaxed);
    // Counted open from here: the adoption is over.
    drop(adoption);
    b.stats
        .in_flight
        .fetch_add(waiting as u64, Ordering::Relaxed);
    b.stats.batched.fetch_add(waiting as u64, Ordering::Relaxed);
    let provider_batch_id = match batch.provider_batch_id.clone() {
        Some(id) => Some(id),
        None => adopt_or_resubmit(&b, &batch, waiting).await,
    };
    if let Some(provider_batch_id) = provider_batch_id {
        b.reporter.line(&format!(
            "Re-attached provider batch {} ({}, {waiting} requests waiting): polling it, nothing is sent again.",
            docket_model::sanitize::for_terminal(&provider_batch_id),
            batch.tag,
        ));
        let tracked = Tracked {
            tag: batch.tag.clone(),
            provider_batch_id,
            input_file_id: batch.input_file_id.clone(),
            created_at: batch.created_at,
            // A cancel asked before the stop is asked again (idempotent).
            cancel_wanted: batch.cancel_requested,
            cancel_sent: false,
            // A resumed run's lines hold no budget: what they cost counts
            // as their results are applied.
            held: Held::none(&b),
            // Its tokens are not known: it counts as an open batch.
            open: Some(b.enqueued.open(&b.enqueued_key(), 0)),
            hold: None,
            since: batch.submitted_at.unwrap_or(batch.created_at),
            state: batch.state.clone(),
            stall_told: false,
        };
        drive(&b, tracked).await;
    }
    b.open.fetch_sub(1, Ordering::Relaxed);
    drop(permit);
}

/// A batch recorded but with no provider id: its create may or may not have
/// happened. Look for it first; submit only when the provider shows none.
async fn adopt_or_resubmit(b: &Arc<Batcher>, batch: &OpenBatch, waiting: usize) -> Option<String> {
    match find_ours(
        b,
        &batch.tag,
        batch.created_at,
        batch.request_count as usize,
    )
    .await
    {
        Ok(Found::One(id)) => {
            b.event(
                "info",
                "batch_found",
                format!(
                    "batch {}: its create answer was lost before the stop; found it at the provider as {}: collecting it, nothing is sent again",
                    batch.tag,
                    docket_model::sanitize::for_terminal(&id)
                ),
            );
            let s = Submitted {
                provider_batch_id: id.clone(),
                input_file_id: None,
            };
            record_submitted(b, &batch.tag, &s, batch.request_count as usize)
                .await
                .then_some(id)
        }
        Ok(Found::None) => {
            // Never made: the same lines (same custom ids, same attempts)
            // go again under the same tag, read back from the ledger a page
            // at a time.
            let lines = LedgerLines::new(b.clone(), batch.tag.clone(), waiting);
            b.event(
                "info",
                "batch_resubmitted",
                format!(
                    "batch {}: not found at the provider (it was never made): submitting its {} requests now",
                    batch.tag,
                    lines.len()
                ),
            );
            let sub = submit_resolved(b, &batch.tag, batch.created_at, &mut None, &lines).await;
            on_record(b, &batch.tag, sub, lines).await
        }
        Ok(Found::Ambiguous(candidates)) => {
            // Several could be it: wait for them to end and match their
            // results' custom ids against this batch's lines (row B1).
            let lines = LedgerLines::new(b.clone(), batch.tag.clone(), waiting);
            let ambiguous = Submitting::Ambiguous(candidates);
            let sub = settle_ambiguity(
                b,
                &batch.tag,
                batch.created_at,
                &mut None,
                &lines,
                ambiguous,
            )
            .await;
            on_record(b, &batch.tag, sub, lines).await
        }
        Err(e) => {
            not_submitted(
                b,
                &batch.tag,
                Submitting::Held(format!(
                    "cannot check whether the batch was made ({e}); its requests wait rather than risk paying twice: resume again later"
                )),
            )
            .await;
            None
        }
    }
}

/// A re-sent batch on record with its provider id (which it returns), or
/// its lines told why they were not sent.
async fn on_record(
    b: &Arc<Batcher>,
    tag: &str,
    sub: Submitting,
    lines: LedgerLines,
) -> Option<String> {
    match sub {
        Submitting::Done(s) => record_submitted(b, tag, &s, lines.len())
            .await
            .then_some(s.provider_batch_id),
        other => {
            drop(lines);
            not_submitted(b, tag, other).await;
            None
        }
    }
}
