//! Batch results reach their items: the batcher hands over a chunk of a
//! finished batch's results; the items are claimed again (their lines let
//! go of them when the batch was recorded) and run on from each result,
//! through the same gate, routing, retries and records as a synchronous
//! answer. The chunk is done when every item of it is: memory holds one
//! chunk, not the batch.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use tokio::task::JoinSet;

use super::batching::{Deliver, Delivered};
use super::ctx::{Ctx, StopCause};
use super::feed::{note_crash, run_item, stage_groups};
use docket_ledger::Ledger;
use docket_ledger::store::WorkItem;
use docket_ledger::work::WorkQueue;

/// The batchers' way back into the engine. Holds the run's context weakly:
/// the context holds the batchers.
pub(super) fn deliverer(ctx: Weak<Ctx>) -> Deliver {
    Box::new(move |stage, lines| {
        let ctx = ctx.clone();
        Box::pin(async move {
            if let Some(ctx) = ctx.upgrade() {
                deliver(&ctx, stage, lines).await;
            }
        })
    })
}

async fn deliver(ctx: &Arc<Ctx>, stage: usize, lines: Vec<Delivered>) {
    let ids: Vec<i64> = lines.iter().map(|d| d.request_id).collect();
    let items = match claim(ctx, ids).await {
        Ok(items) => items,
        Err(e) => {
            // The results stay unapplied in the ledger ('sent' lines of an
            // open batch): a resume reads them again.
            ctx.stop(StopCause::LedgerFailed(format!(
                "claiming the items of batch results: {e}"
            )));
            return;
        }
    };
    let group = stage_groups(&ctx.p)
        .into_iter()
        .find(|g| g.contains(&stage))
        .unwrap_or(stage..stage + 1);
    let mut by_request: HashMap<i64, Delivered> =
        lines.into_iter().map(|d| (d.request_id, d)).collect();
    let mut tasks = JoinSet::new();
    for item in items {
        let d = item
            .stages
            .iter()
            .find_map(|sw| by_request.remove(&sw.request_id));
        let ctx2 = ctx.clone();
        let group = group.clone();
        ctx.claims
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tasks.spawn(async move { run_item(&ctx2, item, group, None, d).await });
    }
    if !by_request.is_empty() {
        // Another worker holds these items under a live lease, or they have
        // their outcome: their results are not this worker's to apply.
        tracing::warn!(
            n = by_request.len(),
            "batch results whose items could not be claimed: left in the ledger"
        );
    }
    while let Some(done) = tasks.join_next().await {
        note_crash(ctx, done);
    }
}

/// Claim the items of `request_ids` for this worker.
async fn claim(ctx: &Arc<Ctx>, request_ids: Vec<i64>) -> Result<Vec<WorkItem>, String> {
    let ctx = ctx.clone();
    tokio::task::spawn_blocking(move || {
        let mut slot = ctx
            .delivery_ledger
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(Ledger::open(&ctx.p.ledger).map_err(|e| e.to_string())?);
        }
        let Some(ledger) = slot.as_mut() else {
            return Err("no ledger connection".to_string());
        };
        ledger
            .claim_requests(
                &ctx.session_id,
                &ctx.worker_id,
                &request_ids,
                ctx.lease_secs,
            )
            .map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| e.to_string())?
}
