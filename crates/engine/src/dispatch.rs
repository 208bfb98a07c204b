//! Dispatch: one worker's run of a session, from set-up to its end. It
//! builds the run's context (clients, limiters, batchers, the worker's
//! claim), starts the control loop and the feed, and when the feed is over
//! lets go of what this worker holds and ends the session in a resumable
//! state, or leaves it to the other workers still on it.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;

use super::batching::{self, Batcher};
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
use docket_ledger::batches::BatchOp;
use docket_ledger::queue;
use docket_ledger::work::{BatchLedger, RunSessions, WorkQueue};
use docket_ledger::writer::{LedgerWriter, WriteOp};
use docket_ledger::{Ledger, LedgerError};
use docket_model::live::Tune;
use docket_providers::ChatProvider;
use docket_providers::limiter::Limiter;
use docket_providers::retry::Backoff;

#[allow(clippy::too_many_arguments)]
pub(super) async fn dispatch(
    p: Arc<Prepared>,
    session_id: String,
    chat: std::collections::HashMap<String, Arc<dyn ChatProvider>>,
    batch_adapters: std::collections::HashMap<
        String,
        Arc<dyn docket_providers::batch::BatchProvider>,
    >,
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
    let stats = Arc::new(Stats::default());
    stats.seed(&row);
    // The workers already on the session, and this one: the limits are
    // split between them from the first request on.
    let workers_now = read.live_workers(&session_id)? + 1;
    // One limiter per provider: stages on the same provider share its limits.
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
    let limiter = stages[0].limiter.clone();
    let max_concurrency = p
        .stages
        .iter()
        .map(|s| s.max_concurrency)
        .max()
        .unwrap_or(1);
    let stop_after = read
        .session_controls(&session_id)?
        .and_then(|c| c.stop_after_stage)
        .and_then(|n| p.stages.iter().position(|s| s.name == n));
    let (pause_tx, pause_rx) = watch::channel(false);
    let ctx = Arc::new(Ctx {
        budget: Arc::new(Budget::new(row.max_cost_usd, row.cost_usd)),
        p: p.clone(),
        session_id: session_id.clone(),
        stages,
        limiters,
        stop_after: std::sync::Mutex::new(stop_after),
        gate_watch: super::gate_watch::GateWatch::new(p.stages.len()),
        refusal_watch: super::gate_watch::GateWatch::on_refusals(p.stages.len()),
        retry_waits: Default::default(),
        reach_watch: super::reach_watch::ReachWatch::new(p.stages.len()),
        busy: (0..p.stages.len()).map(|_| AtomicUsize::new(0)).collect(),
        last_frontier: AtomicUsize::new(0),
        writer: writer.clone(),
        stats: stats.clone(),
        backoff: Backoff::default(),
        soft_stop: CancellationToken::new(),
        hard_stop: CancellationToken::new(),
        paused: pause_rx,
        disk_hold: tokio::sync::watch::Sender::new(false),
        cause: std::sync::Mutex::new(None),
        outstanding: Arc::new(Semaphore::new(outstanding_for(max_concurrency))),
        outstanding_cap: AtomicUsize::new(outstanding_for(max_concurrency)),
        worker_id: Arc::from(queue::new_worker_id()),
        lease_secs: lease_secs(&p),
        claims: AtomicU64::new(0),
        workers: AtomicU64::new(workers_now),
        stop_from_ledger: AtomicBool::new(false),
        orphaned: AtomicU64::new(0),
        claim_room: tokio::sync::Notify::new(),
        delivery_ledger: Mutex::new(None),
    });
    // On record as a worker before the first claim, so the others split
    // the limits with it from the start.
    let _ = writer
        .write(WriteOp::Heartbeat {
            session_id: session_id.clone(),
            live_json: None,
            worker: Some(worker_beat(&ctx, 0.0, None)),
        })
        .await;
    let open_batches = read.open_batches(&session_id)?;
    let tags = Arc::new(std::sync::atomic::AtomicU64::new(
        read.batch_count(&session_id)? + 1,
    ));
    for (k, st) in p.stages.iter().enumerate() {
        let open = open_batches.iter().filter(|b| b.stage == st.name).count() as u64;
        start_batching(
            &ctx,
            k,
            open,
            tags.clone(),
            batch_adapters.get(&st.provider_name).cloned(),
            &reporter,
        )
        .await?;
    }
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
    let progress = spawn_progress(
        stats.clone(),
        limiter.clone(),
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

    // Let go of every item this worker still holds: other workers (or a
    // resume) take them at once, with nothing to repair.
    let _ = writer
        .write(WriteOp::Leave {
            session_id: session_id.clone(),
            worker_id: ctx.worker_id.clone(),
        })
        .await;
    let cause = ctx.cause();
    let (remaining, others) = tokio::task::block_in_place(|| {
        let ledger = read.lock().unwrap_or_else(|p| p.into_inner());
        let remaining = ledger.next_work(&session_id, -1, 1).map(|w| w.len())?;
        let others = ledger.live_workers(&session_id)?;
        Ok::<_, LedgerError>((remaining, others))
    })?;
    let (state, reason, end) = match cause {
        // Every item has its outcome: a stop that came after the last one
        // changes nothing.
        _ if remaining == 0 => ("completed", None, RunEnd::Completed),
        None => {
            let held: usize = ctx.batchers().map(|b| b.held_count()).sum();
            let stopped_at = *ctx.stop_after.lock().unwrap_or_else(|p| p.into_inner());
            let why = match (held, stopped_at) {
                (0, Some(s)) if s + 1 < ctx.p.stages.len() => format!(
                    "stopped after stage {} as asked; resume to run {} and the stages after it",
                    ctx.p.stages[s].name,
                    ctx.p.stages[s + 1].name
                ),
                (held, _) if held > 0 => format!(
                    "{held} request(s) wait on a provider batch that could not be told apart from others (see the session's events); resume once it is sorted out"
                ),
                _ => "stopped with items left".to_string(),
            };
            ("paused", Some(why.clone()), RunEnd::Paused(why))
        }
        Some(StopCause::Cancelled) => (
            "cancelled",
            Some("cancelled".to_string()),
            RunEnd::Cancelled,
        ),
        Some(StopCause::Paused(m)) => ("paused", Some(m.clone()), RunEnd::Paused(m)),
        Some(StopCause::Fatal(m)) => ("error", Some(m.clone()), RunEnd::Stopped(m)),
        Some(StopCause::Budget(m)) => ("paused", Some(m.clone()), RunEnd::Paused(m)),
        Some(StopCause::LedgerFailed(m)) => ("error", Some(m.clone()), RunEnd::LedgerFailed(m)),
    };
    // This worker stopped on its own (a signal, its budget, a failure) while
    // others still work the session: it leaves, and the session runs on.
    if remaining > 0 && others > 0 && !ctx.stop_from_ledger.load(Ordering::Relaxed) {
        ctx.event(
            "info",
            "worker_left",
            format!(
                "worker {} left the session ({}); {others} other worker(s) carry on",
                ctx.worker_id,
                reason.as_deref().unwrap_or("its work ran out")
            ),
        );
        tracing::info!(session = %session_id, "worker left; the session runs on");
        drop(ctx);
        drop(writer);
        tokio::task::block_in_place(|| writer_handle.join());
        return Ok(end);
    }
    let s = stats.snapshot();
    let level = match state {
        "error" => "error",
        "completed" => "info",
        _ => "warn",
    };
    // Posted just before the final state, so both land in one flush.
    ctx.event(
        level,
        "ended",
        format!(
            "session ended {state}: {} ({} of {} items processed){}",
            reason.as_deref().unwrap_or("every item has an outcome"),
            s.done,
            s.total,
            if left_at_provider > 0 {
                format!("; {left_at_provider} provider batch(es) still open at the provider")
            } else {
                String::new()
            }
        ),
    );
    let _ = writer
        .write(WriteOp::SessionState {
            session_id: session_id.clone(),
            state,
            stop_reason: reason,
            completed: state == "completed",
            released: true,
        })
        .await;
    tracing::info!(session = %session_id, state, "dispatch ended");
    drop(ctx);
    drop(writer);
    tokio::task::block_in_place(|| writer_handle.join());
    Ok(end)
}

/// Set up batch mode: the batcher, with the open batches of an earlier run
/// re-attached. Without a Batch API (Ollama, OpenRouter) `batch`/`auto`
/// send synchronously (simulated batching), and the run says so.
async fn start_batching(
    ctx: &Arc<Ctx>,
    stage: usize,
    open: u64,
    tags: Arc<std::sync::atomic::AtomicU64>,
    adapter: Option<Arc<dyn docket_providers::batch::BatchProvider>>,
    reporter: &Arc<dyn Reporter>,
) -> Result<(), EngineError> {
    let p = &ctx.p.stages[stage];
    let mode = p.batch.mode;
    let Some(adapter) = adapter else {
        if mode != docket_model::config::BatchMode::Sync {
            let note = format!(
                "stage {}: {} (kind {}) has no Batch API here: mode = \"{}\" sends each request synchronously under the rate limits (simulated batching), at the synchronous price",
                p.name,
                p.provider_name,
                p.provider_kind.as_str(),
                mode.as_str()
            );
            reporter.line(&format!("Note: {note}."));
            ctx.event("info", "simulated_batching", note);
        }
        return Ok(());
    };
    if mode == docket_model::config::BatchMode::Sync && open == 0 {
        return Ok(());
    }
    let settings = batching::settings_for(p, &*adapter);
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
        super::delivery::deliverer(Arc::downgrade(ctx)),
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
                if mode == docket_model::config::BatchMode::Auto {
                    format!(" (fewer than {} go synchronously)", settings.min_batch_size)
                } else {
                    String::new()
                }
            ),
        );
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

/// After the feed: at a stop, the control loop steers this worker's open
/// provider batches (a cancel cancels them and collects what they finished;
/// any other stop leaves them to the provider). Wait until each is left or
/// collected.
async fn settle_batches(ctx: &Ctx) {
    while ctx
        .batchers()
        .any(|b| b.open_count() > 0 && !b.detached().is_cancelled())
    {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// After the feed: mark delivered batches finished with, stop the batcher,
/// and say what is still open at the provider. Returns that count.
async fn end_batching(ctx: &Arc<Ctx>, read: &Arc<Mutex<Ledger>>, reporter: &dyn Reporter) -> u64 {
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
