//! A worker's batch mode: the stages' batchers set up (with the open
//! batches of an earlier run re-attached) before the feed, and after it
//! the wait for open batches to settle and the word on what is still open
//! at the provider.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use crate::EngineError;
use crate::batching::{self, Batcher};
use crate::ctx::{Ctx, StopCause};
use crate::progress::Reporter;
use docket_ledger::Ledger;
use docket_ledger::batches::BatchOp;
use docket_ledger::work::BatchLedger;
use docket_ledger::writer::WriteOp;
use docket_model::config::BatchMode;
use docket_providers::batch::BatchProvider;

/// Every stage's batch mode, with its batches still `open` (per stage) and
/// new batches numbered from `tags`.
pub(super) async fn attach_batchers(
    ctx: &Arc<Ctx>,
    (open, tags): (Vec<u64>, Arc<AtomicU64>),
    batch_adapters: &HashMap<String, Arc<dyn BatchProvider>>,
    reporter: &Arc<dyn Reporter>,
) -> Result<(), EngineError> {
    for (k, st) in ctx.p.stages.iter().enumerate() {
        start_batching(
            ctx,
            k,
            open[k],
            tags.clone(),
            batch_adapters.get(&st.provider_name).cloned(),
            reporter,
        )
        .await?;
    }
    Ok(())
}

/// Each stage's batches still open, and the counter new batches' tags
/// start from. (Read before the batchers start: a `Ledger` is not `Sync`,
/// so a borrowed one is never held across their awaits.)
pub(super) fn open_per_stage(
    ctx: &Ctx,
    read: &Ledger,
) -> Result<(Vec<u64>, Arc<AtomicU64>), EngineError> {
    let open_batches = read.open_batches(&ctx.session_id)?;
    let tags = Arc::new(AtomicU64::new(read.batch_count(&ctx.session_id)? + 1));
    let open = ctx
        .p
        .stages
        .iter()
        .map(|st| open_batches.iter().filter(|b| b.stage == st.name).count() as u64)
        .collect();
    Ok((open, tags))
}

/// Set up batch mode: the batcher, with the open batches of an earlier run
/// re-attached. Without a Batch API (Ollama, OpenRouter) `batch`/`auto`
/// send synchronously (simulated batching), and the run says so.
async fn start_batching(
    ctx: &Arc<Ctx>,
    stage: usize,
    open: u64,
    tags: Arc<std::sync::atomic::AtomicU64>,
    adapter: Option<Arc<dyn BatchProvider>>,
    reporter: &Arc<dyn Reporter>,
) -> Result<(), EngineError> {
    let p = &ctx.p.stages[stage];
    let mode = p.batch.mode;
    let Some(adapter) = adapter else {
        if mode != BatchMode::Sync {
            note_simulated_batching(ctx, stage, reporter);
        }
        return Ok(());
    };
    if mode == BatchMode::Sync && open == 0 {
        return Ok(());
    }
    let settings = batching::settings_for(p, &*adapter, ctx.p.completion_mode);
    let weak = Arc::downgrade(ctx);
    let b = Batcher::new(
        settings,
        adapter,
        ctx.writer.clone(),
        ctx.session_id.clone(),
        ctx.p.clone(),
        stage,
        ctx.stats.clone(),
        reporter.clone(),
        ctx.budget.clone(),
        crate::delivery::deliverer(Arc::downgrade(ctx)),
        tags,
        Box::new(move |e| {
            if let Some(ctx) = weak.upgrade() {
                ctx.stop(StopCause::LedgerFailed(e));
            }
        }),
        ctx.paused.clone(),
        batching::Lease {
            worker_id: ctx.worker_id.clone(),
            secs: ctx.lease_secs,
        },
    );
    let _ = ctx.stages[stage].batcher.set(b.clone());
    if b.takes_new() {
        announce_batch_mode(ctx, stage, &b, &settings);
    }
    if open > 0 {
        let n = b.reattach().await.map_err(EngineError::Ledger)?;
        if n > 0 {
            reporter.line(&format!(
                "{n} provider batch(es) of this session are still open: collecting their results (nothing is sent twice)."
            ));
        }
    }
    Ok(())
}

/// Without a Batch API the stage still runs, synchronously: the run says so.
fn note_simulated_batching(ctx: &Ctx, stage: usize, reporter: &Arc<dyn Reporter>) {
    let p = &ctx.p.stages[stage];
    let note = format!(
        "stage {}: {} (kind {}) has no Batch API here: mode = \"{}\" sends each request synchronously under the rate limits (simulated batching), at the synchronous price",
        p.name,
        p.provider_name,
        p.provider_kind.as_str(),
        p.batch.mode.as_str()
    );
    reporter.line(&format!("Note: {note}."));
    ctx.event("info", "simulated_batching", note);
}

/// Say where the stage's new requests go, at what price, and when a batch is cut.
fn announce_batch_mode(ctx: &Ctx, stage: usize, b: &Batcher, settings: &batching::Settings) {
    let p = &ctx.p.stages[stage];
    let mode = p.batch.mode;
    ctx.event(
        "info",
        "batch_mode",
        format!(
            "stage {}: {} mode: requests go to the {} Batch API at {:.0}% of the synchronous price; a batch is cut at {} requests, {} bytes or {:.0} s{}",
            p.name,
            mode.as_str(),
            b.adapter.name(),
            b.price_factor() * 100.0,
            settings.max_requests,
            settings.max_bytes,
            settings.max_wait.as_secs_f64(),
            if mode == BatchMode::Auto {
                format!(" (fewer than {} go synchronously)", settings.min_batch_size)
            } else {
                String::new()
            }
        ),
    );
}

/// After the feed: at a stop, the control loop steers this worker's open
/// provider batches (a cancel cancels them and collects what they finished;
/// any other stop leaves them to the provider). Wait until each is left or
/// collected.
pub(super) async fn settle_batches(ctx: &Ctx) {
    while ctx
        .batchers()
        .any(|b| b.open_count() > 0 && !b.detached().is_cancelled())
    {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// After the feed: mark delivered batches finished with, stop the batcher,
/// and say what is still open at the provider. Returns that count.
pub(super) async fn end_batching(
    ctx: &Arc<Ctx>,
    read: &Arc<Mutex<Ledger>>,
    reporter: &dyn Reporter,
) -> u64 {
    if ctx.batchers().next().is_none() {
        return 0;
    }
    for b in ctx.batchers() {
        b.shutdown();
    }
    // This worker's batches only: another worker's are its own to collect.
    let mine = |ledger: &Ledger| {
        ledger
            .open_batches(&ctx.session_id)
            .unwrap_or_default()
            .into_iter()
            .filter(|o| o.claimed_by.as_deref() == Some(&*ctx.worker_id))
            .collect::<Vec<_>>()
    };
    let open = {
        let ledger = read.lock().unwrap_or_else(|p| p.into_inner());
        mine(&ledger)
    };
    for o in &open {
        let _ = ctx
            .writer
            .write(WriteOp::Batch(BatchOp::Settle { tag: o.tag.clone() }))
            .await;
    }
    let left = {
        let ledger = read.lock().unwrap_or_else(|p| p.into_inner());
        mine(&ledger)
    };
    let at_provider = left
        .iter()
        .filter(|o| {
            !matches!(
                o.state.as_str(),
                "completed" | "failed" | "expired" | "cancelled"
            )
        })
        .count() as u64;
    if !left.is_empty() {
        let message = format!(
            "{} provider batch(es) of this session are not finished with{}. The provider keeps working on {} (and bills for {}). \
             Resume with `docket batch-adjudicate --resume {}` to collect the results; to stop them, resume and cancel (`c` in the console, or `docket cancel {}` while it runs)",
            left.len(),
            if at_provider > 0 {
                format!(" ({at_provider} still running at the provider)")
            } else {
                String::new()
            },
            if left.len() == 1 { "it" } else { "them" },
            if left.len() == 1 { "it" } else { "them" },
            ctx.session_id,
            ctx.session_id
        );
        reporter.line(&format!("{message}."));
        ctx.event("warn", "batches_left_open", message);
    }
    left.len() as u64
}
