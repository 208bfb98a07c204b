//! Dispatch: feed a session's unprocessed items to workers under the shared
//! limiter, obey pause / cancel from the ledger and from signals, and end the
//! session in a resumable state whatever stops it.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::budget::Budget;
use super::progress::{Reporter, spawn_progress};
use super::stats::Stats;
use super::{EngineError, Interrupts, Prepared, RunEnd};
use crate::gate::GateFailure;
use crate::ledger::store::{self, WorkItem};
use crate::ledger::writer::{AttemptRecord, FinalResult, LedgerWriter, SendIntent, WriteOp};
use crate::limiter::{Limiter, LimiterSettings};
use crate::provider::{
    ChatAnswer, ChatProvider, ChatRequest, ErrorClass, FinishReason, ProviderError,
};
use crate::retry::Backoff;
use crate::routing::Outcome;

/// Rate-limit refusals mean "not now", not "broken": they get their own,
/// larger budget instead of using up the transport attempts.
const MAX_RATE_LIMIT_RETRIES: u32 = 30;
const PAGE: usize = 512;
const CONTROL_POLL: Duration = Duration::from_millis(400);

/// Why a run stopped before every item had an outcome.
#[derive(Debug, Clone, PartialEq)]
enum StopCause {
    Cancelled,
    Fatal(String),
    Budget(String),
    LedgerFailed(String),
}

struct Ctx {
    p: Arc<Prepared>,
    session_id: String,
    provider: Box<dyn ChatProvider>,
    limiter: Arc<Limiter>,
    writer: LedgerWriter,
    stats: Arc<Stats>,
    budget: Budget,
    backoff: Backoff,
    /// No new attempts (stop, cancel, budget, fatal error).
    soft_stop: CancellationToken,
    /// Abandon requests in flight.
    hard_stop: CancellationToken,
    paused: watch::Receiver<bool>,
    cause: std::sync::Mutex<Option<StopCause>>,
}

impl Ctx {
    fn stop(&self, cause: StopCause) {
        let mut c = self.cause.lock().unwrap_or_else(|p| p.into_inner());
        // The first cause wins: a cancel after a fatal error is still fatal.
        if c.is_none() {
            *c = Some(cause);
        }
        drop(c);
        self.soft_stop.cancel();
    }

    fn cause(&self) -> Option<StopCause> {
        self.cause.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Wait while paused; false if a stop came meanwhile.
    async fn wait_unpaused(&self) -> bool {
        let mut rx = self.paused.clone();
        loop {
            if self.soft_stop.is_cancelled() {
                return false;
            }
            if !*rx.borrow_and_update() {
                return true;
            }
            tokio::select! {
                r = rx.changed() => if r.is_err() { return !self.soft_stop.is_cancelled() },
                _ = self.soft_stop.cancelled() => return false,
            }
        }
    }

    async fn write(&self, op: WriteOp) -> bool {
        match self.writer.write(op).await {
            Ok(()) => true,
            Err(e) => {
                self.stop(StopCause::LedgerFailed(e));
                false
            }
        }
    }
}

pub(super) async fn dispatch(
    p: Arc<Prepared>,
    session_id: String,
    provider: Box<dyn ChatProvider>,
    reporter: Arc<dyn Reporter>,
    interrupts: Interrupts,
    grace: Duration,
) -> Result<RunEnd, EngineError> {
    let (writer, writer_handle) = LedgerWriter::start(&p.ledger_path)?;
    let read = crate::ledger::open(&p.ledger_path)?;
    let row = store::load_session(&read, &session_id)?.ok_or_else(|| {
        EngineError::Ledger(format!("session {session_id} vanished from the ledger"))
    })?;
    let stats = Arc::new(Stats::default());
    stats.seed(&row);
    let limiter = Arc::new(Limiter::new(LimiterSettings {
        requests_per_minute: p.rpm,
        tokens_per_minute: p.tpm,
        max_concurrency: p.max_concurrency,
    }));
    let (pause_tx, pause_rx) = watch::channel(false);
    let ctx = Arc::new(Ctx {
        budget: Budget::new(row.max_cost_usd, row.cost_usd),
        p: p.clone(),
        session_id: session_id.clone(),
        provider,
        limiter: limiter.clone(),
        writer: writer.clone(),
        stats: stats.clone(),
        backoff: Backoff::default(),
        soft_stop: CancellationToken::new(),
        hard_stop: CancellationToken::new(),
        paused: pause_rx,
        cause: std::sync::Mutex::new(None),
    });
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

    tracing::info!(session = %session_id, model = %p.model, "dispatch started");
    let feed_result = feed(&ctx, read).await;
    if let Err(e) = &feed_result {
        ctx.stop(StopCause::LedgerFailed(e.to_string()));
    }
    control.abort();
    progress.abort();
    let _ = progress.await;

    let cause = ctx.cause();
    let remaining = tokio::task::block_in_place(|| -> Result<usize, EngineError> {
        let conn = crate::ledger::open(&p.ledger_path)?;
        Ok(store::next_work(&conn, &session_id, -1, 1)?.len())
    })?;
    let (state, reason, end) = match cause {
        // Every item has its outcome: a stop that came after the last one
        // changes nothing.
        _ if remaining == 0 => ("completed", None, RunEnd::Completed),
        None => (
            "paused",
            Some("stopped with items left".to_string()),
            RunEnd::Paused("items left".into()),
        ),
        Some(StopCause::Cancelled) => (
            "cancelled",
            Some("cancelled".to_string()),
            RunEnd::Cancelled,
        ),
        Some(StopCause::Fatal(m)) => ("error", Some(m.clone()), RunEnd::Stopped(m)),
        Some(StopCause::Budget(m)) => ("paused", Some(m.clone()), RunEnd::Paused(m)),
        Some(StopCause::LedgerFailed(m)) => ("error", Some(m.clone()), RunEnd::Stopped(m)),
    };
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

/// Page through unprocessed items and hand each to a worker.
async fn feed(ctx: &Arc<Ctx>, read: rusqlite::Connection) -> Result<(), EngineError> {
    let read = Arc::new(std::sync::Mutex::new(read));
    // Bound the tasks alive at once (in flight plus waiting to retry) so a
    // long 429 storm cannot pile up the whole session in memory.
    let outstanding = Arc::new(Semaphore::new((ctx.p.max_concurrency * 4).max(256)));
    let mut workers = JoinSet::new();
    let mut after = -1i64;
    'pages: loop {
        if ctx.soft_stop.is_cancelled() {
            break;
        }
        let page = {
            let read = read.clone();
            let sid = ctx.session_id.clone();
            tokio::task::spawn_blocking(move || {
                let conn = read.lock().unwrap_or_else(|p| p.into_inner());
                store::next_work(&conn, &sid, after, PAGE)
            })
            .await
            .map_err(|e| EngineError::Ledger(e.to_string()))??
        };
        if page.is_empty() {
            break;
        }
        for item in page {
            after = item.position;
            if !ctx.wait_unpaused().await {
                break 'pages;
            }
            let permit = tokio::select! {
                p = outstanding.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break 'pages },
                _ = ctx.soft_stop.cancelled() => break 'pages,
            };
            let ctx2 = ctx.clone();
            if item.status == "completed" {
                workers.spawn(async move {
                    reuse_answer(&ctx2, item).await;
                    drop(permit);
                });
                continue;
            }
            let slot = tokio::select! {
                s = ctx.limiter.acquire_slot() => s,
                _ = ctx.soft_stop.cancelled() => break 'pages,
            };
            workers.spawn(async move {
                process(&ctx2, item, Some(slot)).await;
                drop(permit);
            });
            while let Some(done) = workers.try_join_next() {
                note_crash(ctx, done);
            }
        }
    }
    while let Some(done) = workers.join_next().await {
        note_crash(ctx, done);
    }
    Ok(())
}

/// A worker that panicked left its item without an outcome: stop the session
/// (resumable) rather than report it complete or lose the item silently.
fn note_crash(ctx: &Ctx, done: Result<(), tokio::task::JoinError>) {
    if let Err(e) = done
        && e.is_panic()
    {
        tracing::error!("a worker crashed: {e}");
        ctx.stop(StopCause::LedgerFailed(format!(
            "internal error: a worker crashed ({e}); the session is resumable"
        )));
    }
}

/// Watch the ledger's desired_state, the signals and the heartbeat.
async fn control_loop(
    ctx: Arc<Ctx>,
    pause_tx: watch::Sender<bool>,
    interrupts: Interrupts,
    grace: Duration,
    reporter: Arc<dyn Reporter>,
) {
    let conn = match crate::ledger::open_read_only(&ctx.p.ledger_path) {
        Ok(c) => Arc::new(std::sync::Mutex::new(c)),
        Err(_) => return,
    };
    let mut tick = tokio::time::interval(CONTROL_POLL);
    let mut hard_deadline: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = interrupts.stop.cancelled(), if !ctx.soft_stop.is_cancelled() => {
                reporter.line("^C Stopping gracefully... (in-flight requests may finish; Ctrl-C again to abandon them)");
                ctx.stop(StopCause::Cancelled);
            }
            _ = interrupts.abort.cancelled(), if !ctx.hard_stop.is_cancelled() => {
                ctx.stop(StopCause::Cancelled);
                ctx.hard_stop.cancel();
            }
        }
        if ctx.soft_stop.is_cancelled() && hard_deadline.is_none() {
            hard_deadline = Some(tokio::time::Instant::now() + grace);
        }
        if let Some(d) = hard_deadline
            && tokio::time::Instant::now() >= d
        {
            ctx.hard_stop.cancel();
        }
        ctx.writer.post(WriteOp::Heartbeat {
            session_id: ctx.session_id.clone(),
        });
        let desired = {
            let conn = conn.clone();
            let sid = ctx.session_id.clone();
            tokio::task::spawn_blocking(move || {
                let c = conn.lock().unwrap_or_else(|p| p.into_inner());
                store::desired_state(&c, &sid)
            })
            .await
        };
        let Ok(Ok(Some(desired))) = desired else {
            continue;
        };
        let paused = *pause_tx.borrow();
        match desired.as_str() {
            "paused" if !paused => {
                pause_tx.send_replace(true);
                reporter.line("Paused from the ledger: no new requests; in-flight ones finish. Resume with `docket resume SESSION`.");
                ctx.writer.post(WriteOp::SessionState {
                    session_id: ctx.session_id.clone(),
                    state: "paused",
                    stop_reason: Some("paused by operator".into()),
                    completed: false,
                    released: false,
                });
            }
            "running" if paused => {
                pause_tx.send_replace(false);
                reporter.line("Resumed.");
                ctx.writer.post(WriteOp::SessionState {
                    session_id: ctx.session_id.clone(),
                    state: "running",
                    stop_reason: None,
                    completed: false,
                    released: false,
                });
            }
            "cancelled" if !ctx.soft_stop.is_cancelled() => {
                reporter.line("Cancelled from the ledger: stopping.");
                ctx.stop(StopCause::Cancelled);
            }
            _ => {}
        }
    }
}

/// An answer recorded by an earlier session: route it again, send nothing.
async fn reuse_answer(ctx: &Ctx, item: WorkItem) {
    let (confidence_field, rationale_field) = ctx.p.gate.fields();
    let parsed = item
        .parsed_output_json
        .as_deref()
        .and_then(|s| serde_json::from_str::<serde_json::Value>(s).ok());
    let confidence = parsed
        .as_ref()
        .and_then(|v| v.get(confidence_field))
        .and_then(serde_json::Value::as_f64);
    let rationale = parsed
        .as_ref()
        .and_then(|v| v.get(rationale_field))
        .and_then(|x| x.as_str())
        .map(str::to_string);
    let (outcome, error) = match confidence {
        Some(c) => (ctx.p.thresholds.route(c), None),
        None => (
            Outcome::Error,
            Some("stored answer could not be read".to_string()),
        ),
    };
    let ok = ctx
        .write(WriteOp::Final(
            None,
            FinalResult {
                session_id: ctx.session_id.clone(),
                item_id: item.item_id,
                request_id: item.request_id,
                stage: ctx.p.stage.clone(),
                outcome,
                answer_json: item.parsed_output_json,
                confidence,
                rationale,
                model_id: ctx.p.model.clone(),
                error_message: error,
                request_status: "completed",
            },
        ))
        .await;
    if ok {
        ctx.stats.record_outcome(outcome);
    }
}

/// One item, from its first attempt to its outcome (or back to pending when
/// the session stops first).
async fn process(ctx: &Ctx, item: WorkItem, mut slot: Option<crate::limiter::Slot>) {
    let p = &ctx.p;
    let evidence: serde_json::Value = match serde_json::from_str(&item.evidence_json) {
        Ok(v) => v,
        Err(e) => {
            finish_error(
                ctx,
                &item,
                None,
                format!("stored evidence is not JSON: {e}"),
            )
            .await;
            return;
        }
    };
    let prompt = match p.template.render(&item.item_id, &evidence) {
        Ok(pr) => pr,
        Err(e) => {
            finish_error(ctx, &item, None, e.to_string()).await;
            return;
        }
    };
    // A cheap estimate for the limiter (corrected from usage afterwards); the
    // pre-run estimate used the real tokenizer.
    let prompt_chars = prompt.user.len() + prompt.system.as_ref().map_or(0, String::len);
    // With a budget, the worst case must not be underestimated: count with
    // the real tokenizer (token-dense text beats characters/4).
    let est_prompt = match &p.budget_counter {
        Some(counter) => counter.count_prompt(&prompt),
        None => (prompt_chars as u64).div_ceil(4) + 12,
    };
    let worst_cost = p.price.cost(est_prompt, 0, p.max_tokens);
    let mut attempt = item.attempt;
    let mut gate_failures = item.gate_failures as u32;
    let mut transport_failures = item.transport_retries as u32;
    let mut rate_limited = 0u32;
    loop {
        if !ctx.wait_unpaused().await {
            requeue(ctx, &item).await;
            return;
        }
        if !ctx.budget.try_reserve(worst_cost) {
            let max = ctx.budget.max().unwrap_or(0.0);
            ctx.stop(StopCause::Budget(format!(
                "budget reached: ${:.4} spent of ${max:.4}; the next request could cost up to ${worst_cost:.4}",
                ctx.budget.spent()
            )));
            requeue(ctx, &item).await;
            return;
        }
        let slot_now = match slot.take() {
            Some(s) => s,
            None => tokio::select! {
                s = ctx.limiter.acquire_slot() => s,
                _ = ctx.soft_stop.cancelled() => { ctx.budget.settle(worst_cost, 0.0); requeue(ctx, &item).await; return; }
            },
        };
        let reservation = tokio::select! {
            r = ctx.limiter.reserve(est_prompt + p.max_tokens) => r,
            _ = ctx.soft_stop.cancelled() => { ctx.budget.settle(worst_cost, 0.0); requeue(ctx, &item).await; return; }
        };
        attempt += 1;
        let client_request_id = format!("{}-{}-{}", ctx.session_id, item.request_id, attempt);
        let intent = SendIntent {
            session_id: ctx.session_id.clone(),
            request_id: item.request_id,
            attempt,
            client_request_id: client_request_id.clone(),
            system_prompt: prompt.system.clone(),
            user_prompt: prompt.user.clone(),
        };
        // Intent before side effect: the attempt is on disk before a byte leaves.
        if !ctx.write(WriteOp::Send(intent)).await {
            ctx.budget.settle(worst_cost, 0.0);
            return;
        }
        let request = ChatRequest {
            model: p.model.clone(),
            system: prompt.system.clone(),
            user: prompt.user.clone(),
            max_tokens: p.max_tokens,
            temperature: p.temperature,
            response_schema: p
                .gate
                .response_schema()
                .map(|s| (schema_name(&p.stage), s.clone())),
            client_request_id,
            timeout: p.request_timeout,
        };
        ctx.stats.in_flight.fetch_add(1, Relaxed);
        ctx.stats.sent.fetch_add(1, Relaxed);
        let started = std::time::Instant::now();
        let result = tokio::select! {
            r = ctx.provider.send(&request) => Some(r),
            _ = ctx.hard_stop.cancelled() => None,
        };
        let latency_ms = started.elapsed().as_secs_f64() * 1000.0;
        ctx.stats.in_flight.fetch_sub(1, Relaxed);
        drop(slot_now);
        let base = AttemptRecord {
            session_id: ctx.session_id.clone(),
            request_id: item.request_id,
            attempt,
            latency_ms,
            ..Default::default()
        };
        let Some(result) = result else {
            // Abandoned at shutdown: the bytes left, the answer never came.
            ctx.budget.settle(worst_cost, 0.0);
            ctx.stats.ambiguous.fetch_add(1, Relaxed);
            let rec = AttemptRecord {
                state: "ambiguous",
                error_kind: Some("ambiguous".into()),
                error_message: Some(
                    "abandoned in flight at shutdown; it may have been billed".into(),
                ),
                ..base
            };
            if ctx.write(WriteOp::Attempt(rec)).await {
                requeue(ctx, &item).await;
            }
            return;
        };
        match result {
            Ok(answer) => {
                let usage = answer.usage.unwrap_or_default();
                // An answer without usage is charged its worst case: the
                // budget must never believe a send was free.
                let cost = match answer.usage {
                    Some(u) => p
                        .price
                        .cost(u.input_tokens, u.cached_input_tokens, u.output_tokens),
                    None => worst_cost,
                };
                ctx.budget.settle(worst_cost, cost);
                ctx.limiter.on_success(
                    reservation,
                    answer.usage.map(|u| u.input_tokens + u.output_tokens),
                    &answer.headers,
                );
                ctx.stats
                    .add_usage(usage.input_tokens, usage.output_tokens, cost);
                let rec = answered_record(base, &answer, cost);
                match judge(ctx, &answer) {
                    Ok(out) => {
                        let outcome = p.thresholds.route(out.confidence);
                        let answer_json = serde_json::to_string(&out.answer).ok();
                        let fin = FinalResult {
                            session_id: ctx.session_id.clone(),
                            item_id: item.item_id.clone(),
                            request_id: item.request_id,
                            stage: p.stage.clone(),
                            outcome,
                            answer_json,
                            confidence: Some(out.confidence),
                            rationale: out.rationale,
                            model_id: answer.model.clone().unwrap_or_else(|| p.model.clone()),
                            error_message: None,
                            request_status: "completed",
                        };
                        if ctx.write(WriteOp::Final(Some(rec), fin)).await {
                            ctx.stats.record_outcome(outcome);
                        }
                        return;
                    }
                    Err(reason) => {
                        gate_failures += 1;
                        let rec = AttemptRecord {
                            error_kind: Some(reason.kind().into()),
                            error_message: Some(reason.to_string()),
                            gate_failure: true,
                            will_retry: gate_failures < p.max_attempts,
                            ..rec
                        };
                        if gate_failures >= p.max_attempts {
                            let msg = format!(
                                "{} (after {gate_failures} answers failed the gate)",
                                reason
                            );
                            finish_error(ctx, &item, Some(rec), msg).await;
                            return;
                        }
                        ctx.stats.retries.fetch_add(1, Relaxed);
                        if !ctx.write(WriteOp::Attempt(rec)).await {
                            return;
                        }
                        continue;
                    }
                }
            }
            Err(err) => {
                ctx.budget.settle(worst_cost, 0.0);
                match err.class {
                    ErrorClass::RateLimited | ErrorClass::Overloaded => {
                        ctx.limiter.on_throttled(&err.headers)
                    }
                    _ => ctx.limiter.on_other(&err.headers),
                }
                let is_rl = err.class == ErrorClass::RateLimited;
                let ambiguous = err.class == ErrorClass::Ambiguous;
                if is_rl {
                    ctx.stats.rate_limited.fetch_add(1, Relaxed);
                }
                if ambiguous {
                    ctx.stats.ambiguous.fetch_add(1, Relaxed);
                }
                let rec = AttemptRecord {
                    state: if ambiguous { "ambiguous" } else { "failed" },
                    http_status: err.http_status,
                    error_kind: Some(err.class.as_str().into()),
                    error_message: Some(err.message.clone()),
                    rate_limited: is_rl,
                    transport_failure: !is_rl && err.class.is_retryable(),
                    ..base
                };
                tracing::debug!(request = item.request_id, attempt, "attempt failed: {err}");
                if err.class.stops_session() {
                    tracing::warn!(session = %ctx.session_id, "stopping: {err}");
                    ctx.stop(StopCause::Fatal(fatal_message(&err, &p.provider_name)));
                    if ctx.write(WriteOp::Attempt(rec)).await {
                        requeue(ctx, &item).await;
                    }
                    return;
                }
                if !err.class.is_retryable() {
                    finish_error(ctx, &item, Some(rec), err.to_string()).await;
                    return;
                }
                let (exhausted, retry_no) = if is_rl {
                    rate_limited += 1;
                    (rate_limited > MAX_RATE_LIMIT_RETRIES, rate_limited)
                } else {
                    transport_failures += 1;
                    (
                        transport_failures >= p.max_transport_attempts,
                        transport_failures,
                    )
                };
                if exhausted {
                    let msg = format!("gave up after {retry_no} failed attempts: {err}");
                    finish_error(ctx, &item, Some(rec), msg).await;
                    return;
                }
                ctx.stats.retries.fetch_add(1, Relaxed);
                if !ctx
                    .write(WriteOp::Attempt(AttemptRecord {
                        will_retry: true,
                        ..rec
                    }))
                    .await
                {
                    return;
                }
                let delay = {
                    let mut rng = rand::rng();
                    ctx.backoff
                        .delay_with_hint(retry_no, err.headers.retry_after, &mut rng)
                };
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = ctx.soft_stop.cancelled() => { requeue(ctx, &item).await; return; }
                }
            }
        }
    }
}

fn schema_name(stage: &str) -> String {
    let s: String = stage
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
        .take(64)
        .collect();
    if s.is_empty() { "answer".into() } else { s }
}

/// Gate the answer. A cut-off answer is truncation, not a parse error.
fn judge(ctx: &Ctx, answer: &ChatAnswer) -> Result<crate::gate::GateOutput, Judged> {
    if answer.finish_reason == FinishReason::Length {
        return Err(Judged::Truncated(ctx.p.max_tokens));
    }
    match (&answer.content, &answer.refusal) {
        (_, Some(r)) if !r.is_empty() => Err(Judged::Refused(r.clone())),
        (None, _) => Err(Judged::Gate(GateFailure::Empty)),
        (Some(text), _) => ctx.p.gate.check(text).map_err(Judged::Gate),
    }
}

#[derive(Debug)]
enum Judged {
    Truncated(u64),
    Refused(String),
    Gate(GateFailure),
}

impl Judged {
    fn kind(&self) -> &'static str {
        match self {
            Judged::Truncated(_) => "truncated",
            Judged::Refused(_) => "refused",
            Judged::Gate(_) => "gate",
        }
    }
}

impl std::fmt::Display for Judged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Judged::Truncated(n) => write!(
                f,
                "truncated: the answer hit max_tokens ({n}) before it finished (finish_reason=length)"
            ),
            Judged::Refused(r) => write!(
                f,
                "the model refused: {}",
                crate::sanitize::truncate(r, 200)
            ),
            Judged::Gate(g) => write!(f, "parse error: {g}"),
        }
    }
}

fn answered_record(base: AttemptRecord, a: &ChatAnswer, cost: f64) -> AttemptRecord {
    let u = a.usage;
    AttemptRecord {
        state: "answered",
        output: a.content.clone().or_else(|| a.refusal.clone()),
        finish_reason: Some(a.finish_reason.as_str().to_string()),
        http_status: Some(a.http_status),
        provider_request_id: a.provider_request_id.clone(),
        model_reported: a.model.clone(),
        input_tokens: u.map(|u| u.input_tokens),
        output_tokens: u.map(|u| u.output_tokens),
        cached_input_tokens: u.map(|u| u.cached_input_tokens),
        reasoning_tokens: u.map(|u| u.reasoning_tokens),
        cost_usd: cost,
        ..base
    }
}

fn fatal_message(err: &ProviderError, provider: &str) -> String {
    match err.class {
        ErrorClass::Auth => format!(
            "the provider rejected the credentials ({err}). Check the key named by providers.{provider}.api_key_env, then resume."
        ),
        _ => format!(
            "the provider says the quota or billing is exhausted ({err}). Add credit or raise the limit, then resume."
        ),
    }
}

async fn requeue(ctx: &Ctx, item: &WorkItem) {
    let _ = ctx
        .writer
        .write(WriteOp::Requeue {
            request_id: item.request_id,
            last_error: None,
        })
        .await;
}

async fn finish_error(ctx: &Ctx, item: &WorkItem, rec: Option<AttemptRecord>, message: String) {
    let fin = FinalResult {
        session_id: ctx.session_id.clone(),
        item_id: item.item_id.clone(),
        request_id: item.request_id,
        stage: ctx.p.stage.clone(),
        outcome: Outcome::Error,
        answer_json: None,
        confidence: None,
        rationale: None,
        model_id: ctx.p.model.clone(),
        error_message: Some(message),
        request_status: "error",
    };
    if ctx.write(WriteOp::Final(rec, fin)).await {
        ctx.stats.record_outcome(Outcome::Error);
    }
}
