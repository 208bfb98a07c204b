//! Dispatch: one worker's run of a session, from set-up to its end. It
//! builds the run's context (clients, limiters, batchers, the worker's
//! claim), starts the control loop and the feed, and when the feed is over
//! lets go of what this worker holds and ends the session in a resumable
//! state, or leaves it to the other workers still on it.

mod batch_mode;
mod ending;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;

use super::budget::Budget;
use super::control::control_loop;
use super::ctx::{
    Ctx, StageRt, StopCause, lease_secs, outstanding_for, per_minute, share, tuned_settings,
    worker_beat,
};
use super::deadline::Deadline;
use super::feed::feed;
use super::progress::{Reporter, spawn_progress};
use super::stats::Stats;
use super::{EngineError, Interrupts, Prepared, RunEnd};
use batch_mode::{attach_batchers, end_batching, open_per_stage, settle_batches};
use docket_ledger::Ledger;
use docket_ledger::queue;
use docket_ledger::store::SessionRow;
use docket_ledger::work::{RunSessions, WorkQueue};
use docket_ledger::writer::{LedgerWriter, WriteOp};
use docket_model::live::Tune;
use docket_providers::ChatProvider;
use docket_providers::batch::BatchProvider;
use docket_providers::limiter::Limiter;
use docket_providers::retry::Backoff;

#[allow(clippy::too_many_arguments)]
pub(super) async fn dispatch(
    p: Arc<Prepared>,
    session_id: String,
    chat: HashMap<String, Arc<dyn ChatProvider>>,
    batch_adapters: HashMap<String, Arc<dyn BatchProvider>>,
    reporter: Arc<dyn Reporter>,
    interrupts: Interrupts,
    grace: Duration,
    resumed: bool,
) -> Result<RunEnd, EngineError> {
    let (writer, writer_handle) = LedgerWriter::start(&p.ledger).map_err(EngineError::opening)?;
    let read = super::open_ledger(&p.ledger)?;
    let row = read.load_session(&session_id)?.ok_or_else(|| {
        EngineError::Ledger(format!("session {session_id} vanished from the ledger"))
    })?;
    let (pause_tx, pause_rx) = watch::channel(false);
    let ctx = new_ctx(
        &p,
        &session_id,
        &read,
        &row,
        &chat,
        writer.clone(),
        pause_rx,
    )?;
    // On record as a worker before the first claim, so the others split
    // the limits with it from the start.
    let _ = writer
        .write(WriteOp::Heartbeat {
            session_id: session_id.clone(),
            live_json: None,
            worker: Some(worker_beat(&ctx, 0.0, None)),
        })
        .await;
    attach_batchers(
        &ctx,
        open_per_stage(&ctx, &read)?,
        &batch_adapters,
        &reporter,
    )
    .await?;
    announce_start(&ctx, resumed);
    let progress = spawn_progress(
        ctx.stats.clone(),
        ctx.stages[0].limiter.clone(),
        reporter.clone(),
        ctx.paused.clone(),
        row.estimated_cost_usd,
    );
    let control = tokio::spawn(control_loop(
        ctx.clone(),
        pause_tx,
        interrupts,
        grace,
        reporter.clone(),
    ));

    tracing::info!(session = %session_id, stages = p.stages.len(), "dispatch started");
    let read = Arc::new(Mutex::new(read));
    let feed_result = feed(&ctx, &read).await;
    if let Err(e) = &feed_result {
        ctx.stop(StopCause::LedgerFailed(e.to_string()));
    }
    settle_batches(&ctx).await;
    control.abort();
    // The last waits, said even within the events' spacing.
    ctx.retry_waits.flush_now(&ctx);
    let left_at_provider = end_batching(&ctx, &read, &*reporter).await;
    progress.abort();
    let _ = progress.await;

    let end = ending::end_session(ctx, &read, left_at_provider).await?;
    // Every other sender went with the context: the writer drains and stops.
    drop(writer);
    tokio::task::block_in_place(|| writer_handle.join());
    Ok(end)
}

/// The run's context for this worker: the stages' clients and limiters,
/// the budget and the stop and pause signals, with the limits split
/// between the workers already on the session and this one.
fn new_ctx(
    p: &Arc<Prepared>,
    session_id: &str,
    read: &Ledger,
    row: &SessionRow,
    chat: &HashMap<String, Arc<dyn ChatProvider>>,
    writer: LedgerWriter,
    paused: watch::Receiver<bool>,
) -> Result<Arc<Ctx>, EngineError> {
    let stats = Arc::new(Stats::default());
    stats.seed(row);
    // The workers already on the session, and this one: the limits are
    // split between them from the first request on.
    let workers_now = read.live_workers(session_id)? + 1;
    let (stages, limiters) = stage_runtimes(p, chat, workers_now)?;
    let max_concurrency = p
        .stages
        .iter()
        .map(|s| s.max_concurrency)
        .max()
        .unwrap_or(1);
    let stop_after = read
        .session_controls(session_id)?
        .and_then(|c| c.stop_after_stage)
        .and_then(|n| p.stages.iter().position(|s| s.name == n));
    Ok(Arc::new(Ctx {
        budget: Arc::new(Budget::new(row.max_cost_usd, row.cost_usd)),
        p: p.clone(),
        session_id: session_id.to_string(),
        stages,
        limiters,
        stop_after: std::sync::Mutex::new(stop_after),
        gate_watch: super::gate_watch::GateWatch::new(p.stages.len()),
        refusal_watch: super::gate_watch::GateWatch::on_refusals(p.stages.len()),
        retry_waits: Default::default(),
        reach_watch: super::reach_watch::ReachWatch::new(p.stages.len()),
        busy: (0..p.stages.len()).map(|_| AtomicUsize::new(0)).collect(),
        last_frontier: AtomicUsize::new(0),
        writer,
        stats,
        backoff: Backoff::default(),
        soft_stop: CancellationToken::new(),
        hard_stop: CancellationToken::new(),
        paused,
        disk_hold: tokio::sync::watch::Sender::new(false),
        cause: std::sync::Mutex::new(None),
        outstanding: Arc::new(Semaphore::new(outstanding_for(max_concurrency))),
        outstanding_cap: AtomicUsize::new(outstanding_for(max_concurrency)),
        worker_id: Arc::from(queue::new_worker_id()),
        lease_secs: lease_secs(p),
        claims: AtomicU64::new(0),
        workers: AtomicU64::new(workers_now),
        stop_from_ledger: AtomicBool::new(false),
        orphaned: AtomicU64::new(0),
        claim_room: tokio::sync::Notify::new(),
        delivery_ledger: Mutex::new(None),
        routing: Mutex::new(p.thresholds),
    }))
}

/// Each stage's runtime, and the distinct limiters: one per provider, so
/// stages on the same provider share its limits (and its client).
#[allow(clippy::type_complexity)]
fn stage_runtimes(
    p: &Prepared,
    chat: &HashMap<String, Arc<dyn ChatProvider>>,
    workers_now: u64,
) -> Result<(Vec<StageRt>, Vec<(String, Arc<Limiter>)>), EngineError> {
    let mut limiters: Vec<(String, Arc<Limiter>)> = Vec::new();
    let mut stages = Vec::with_capacity(p.stages.len());
    for st in &p.stages {
        // One learned deadline per stage: its prompts and answers set its
        // latency (a critic's answers take longer than a triage's).
        let deadline = Arc::new(Deadline::new(st.request_timeout));
        let limiter = match limiters.iter().find(|(n, _)| *n == st.provider_name) {
            Some((_, l)) => l.clone(),
            None => {
                let l = Arc::new(Limiter::new(share(
                    tuned_settings(st, &Tune::default()),
                    workers_now,
                )));
                limiters.push((st.provider_name.clone(), l.clone()));
                l
            }
        };
        // Stages on one provider share its client.
        let Some(provider) = chat.get(&st.provider_name).cloned() else {
            return Err(EngineError::Ledger(format!(
                "internal error: no client for provider {}",
                st.provider_name
            )));
        };
        stages.push(StageRt {
            provider,
            limiter,
            deadline,
            batcher: std::sync::OnceLock::new(),
        });
    }
    Ok((stages, limiters))
}

/// Say how the run starts: each stage's model, provider and limits.
fn announce_start(ctx: &Ctx, resumed: bool) {
    let p = &ctx.p;
    let one = p.stages.len() == 1;
    let shown: Vec<String> = p
        .stages
        .iter()
        .map(|st| {
            format!(
                "{}with {} ({}): requests/min {}, tokens/min {}, concurrency {}",
                if one {
                    String::new()
                } else {
                    format!("stage {} ", st.name)
                },
                st.model,
                st.provider_name,
                per_minute(st.rpm),
                per_minute(st.tpm),
                st.max_concurrency
            )
        })
        .collect();
    ctx.event(
        "info",
        "started",
        format!(
            "{}{} {}",
            if resumed { "resumed" } else { "started" },
            if one { "" } else { ":" },
            shown.join("; ")
        ),
    );
}
