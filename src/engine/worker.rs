//! One item's life in a session: render, reserve, record the intent, send,
//! judge the answer, retry within the budgets, and record the outcome (or put
//! the request back to pending when the session stops first).

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use super::batching::Reply;
use super::dispatch::{Ctx, StopCause};
use crate::gate::GateFailure;
use crate::ledger::store::WorkItem;
use crate::ledger::writer::{AttemptRecord, FinalResult, SendIntent, WriteOp};
use crate::limiter::{Reservation, Slot};
use crate::provider::{ChatAnswer, ChatRequest, ErrorClass, FinishReason, ProviderError};
use crate::routing::Outcome;
use crate::template::Prompt;

/// Rate-limit refusals mean "not now", not "broken": they get their own,
/// larger budget instead of using up the transport attempts.
const MAX_RATE_LIMIT_RETRIES: u32 = 30;

/// An answer recorded by an earlier session: route it again, send nothing.
pub(super) async fn reuse_answer(ctx: &Ctx, item: WorkItem) {
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
pub(super) async fn process(ctx: &Ctx, item: WorkItem, slot: Option<crate::limiter::Slot>) {
    let Some(mut job) = Box::pin(Job::new(ctx, &item)).await else {
        return;
    };
    // A resumed run: the latest attempt may be a line of a provider batch
    // still open. Its result is collected, never paid for again.
    if let Some(b) = ctx.batcher()
        && item.attempt > 0
    {
        job.reattached = b.claim(&custom_id(ctx, item.request_id, item.attempt));
        if job.reattached.is_some() {
            job.via = Via::Batch;
        }
    }
    let mut slot = slot;
    loop {
        // Boxed (see `attempt_once`): the outcome's records live only
        // while it is handled.
        let sent = Box::pin(attempt_once(ctx, &mut job, slot.take())).await;
        let next = Box::pin(handle(ctx, &mut job, sent)).await;
        match next {
            Next::Done => return,
            Next::Retry => {}
            Next::RetryAfter(delay) => {
                let wait = Box::pin(async {
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => true,
                        _ = ctx.soft_stop.cancelled() => false,
                    }
                });
                if !wait.await {
                    return;
                }
            }
        }
    }
}

/// What to do after one attempt's outcome.
async fn handle(ctx: &Ctx, job: &mut Job<'_>, sent: Sent) -> Next {
    match sent {
        // A request that did not finish simply stays pending: a resume
        // (or a later session) picks it up.
        Sent::Stopped => Next::Done,
        Sent::Abandoned(rec) => {
            ctx.stats.ambiguous.fetch_add(1, Relaxed);
            ctx.write(WriteOp::Attempt(rec)).await;
            Next::Done
        }
        Sent::LedgerFailed => Next::Done,
        Sent::Answer(base, answer, reservation) => {
            on_answer(ctx, job, base, &answer, reservation).await
        }
        Sent::Failed(base, err) => on_error(ctx, job, base, &err).await,
        Sent::NotRun(base, why) => on_not_run(ctx, job, base, why).await,
    }
}

/// An item being worked on: its prompt, estimates and budgets so far.
struct Job<'a> {
    item: &'a WorkItem,
    /// None while a batch holds it (a line waiting for its batch keeps no
    /// copy): rendered again when another send needs it.
    prompt: Option<Prompt>,
    /// Prompt tokens as reserved with the limiter.
    est_prompt: u64,
    /// What one send could cost at most (prompt + max_tokens of output).
    worst_cost: f64,
    attempt: i64,
    gate_failures: u32,
    transport_failures: u32,
    rate_limited: u32,
    /// How the current attempt went out.
    via: Via,
    /// What the budget holds for the current attempt.
    reserved: f64,
    /// The result of a re-attached batch line (a resume).
    reattached: Option<tokio::sync::oneshot::Receiver<Reply>>,
}

/// How an attempt goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    /// One HTTP call under the rate limits.
    Sync,
    /// A line of a provider batch (the batch price; no rate limits).
    Batch,
}

/// An attempt's id, sent as `X-Client-Request-Id` and as a batch line's
/// `custom_id`.
fn custom_id(ctx: &Ctx, request_id: i64, attempt: i64) -> String {
    format!("{}-{request_id}-{attempt}", ctx.session_id)
}

impl<'a> Job<'a> {
    /// Render the prompt; an item that cannot be rendered errors at once.
    async fn new(ctx: &Ctx, item: &'a WorkItem) -> Option<Self> {
        let p = &ctx.p;
        let rendered = render(ctx, item);
        let prompt = match rendered {
            Ok(prompt) => prompt,
            Err(message) => {
                finish_error(ctx, item, None, message).await;
                return None;
            }
        };
        // With a budget the worst case must not be underestimated, so the real
        // tokenizer counts (token-dense text beats characters/4); otherwise a
        // cheap estimate, corrected from the reported usage afterwards.
        let est_prompt = match &p.budget_counter {
            Some(counter) => counter.count_prompt(&prompt),
            None => {
                let chars = prompt.user.len() + prompt.system.as_ref().map_or(0, String::len);
                (chars as u64).div_ceil(4) + 12
            }
        };
        Some(Job {
            item,
            worst_cost: p.price.cost(est_prompt, 0, p.max_tokens),
            est_prompt,
            prompt: Some(prompt),
            attempt: item.attempt,
            gate_failures: item.gate_failures as u32,
            transport_failures: item.transport_retries as u32,
            rate_limited: 0,
            via: Via::Sync,
            reserved: 0.0,
            reattached: None,
        })
    }
}

/// What one send came to.
enum Sent {
    /// The session stopped before the send; nothing left.
    Stopped,
    /// Abandoned in flight at a hard stop (its record, state ambiguous).
    Abandoned(AttemptRecord),
    /// The intent could not be recorded; the session is stopping.
    LedgerFailed,
    /// The limiter's reservation for a synchronous send (None: a batch line).
    Answer(AttemptRecord, ChatAnswer, Option<Reservation>),
    Failed(AttemptRecord, ProviderError),
    /// A batch line never run (its batch expired or was cancelled first).
    NotRun(AttemptRecord, String),
}

/// What to do after an attempt.
enum Next {
    Done,
    Retry,
    RetryAfter(Duration),
}

/// Wait for the budget, a slot and the rate limits; record the intent; send.
///
/// Each path is its own boxed future: a task waiting hours for a batch holds
/// only the small state of that wait, not the largest state of every path
/// (100,000 waiting lines are 100,000 tasks).
async fn attempt_once(ctx: &Ctx, job: &mut Job<'_>, slot: Option<Slot>) -> Sent {
    if let Some(rx) = job.reattached.take() {
        // Recorded and in a batch before the stop: nothing to reserve or
        // send, only the result to wait for.
        job.reserved = 0.0;
        return Box::pin(batch_reply(ctx, job, rx, std::time::Instant::now())).await;
    }
    if !ctx.wait_unpaused().await {
        return Sent::Stopped;
    }
    if let Some(b) = ctx.batcher()
        && b.takes_new()
        && let Some(sent) = Box::pin(via_batch(ctx, b, job)).await
    {
        return sent;
    }
    Box::pin(send_sync(ctx, job, slot)).await
}

/// Render the prompt again when a batch took it. False (the item has its
/// error outcome) when it cannot be rendered.
async fn ensure_prompt(ctx: &Ctx, job: &mut Job<'_>) -> bool {
    if job.prompt.is_some() {
        return true;
    }
    match render(ctx, job.item) {
        Ok(prompt) => {
            job.prompt = Some(prompt);
            true
        }
        Err(message) => {
            // Boxed: a rare path must not size every waiting task's state.
            Box::pin(finish_error(ctx, job.item, None, message)).await;
            false
        }
    }
}

fn render(ctx: &Ctx, item: &WorkItem) -> Result<Prompt, String> {
    serde_json::from_str::<serde_json::Value>(&item.evidence_json)
        .map_err(|e| format!("stored evidence is not JSON: {e}"))
        .and_then(|evidence| {
            ctx.p
                .template
                .render(&item.item_id, &evidence)
                .map_err(|e| e.to_string())
        })
}

/// One synchronous send under the budget and the rate limits.
async fn send_sync(ctx: &Ctx, job: &mut Job<'_>, slot: Option<Slot>) -> Sent {
    let p = &ctx.p;
    if !ensure_prompt(ctx, job).await {
        return Sent::Stopped;
    }
    job.via = Via::Sync;
    job.reserved = job.worst_cost;
    if !ctx.budget.try_reserve(job.worst_cost) {
        ctx.stop(StopCause::Budget(format!(
            "budget reached: ${:.4} spent of ${:.4}; the next request could cost up to ${:.4}",
            ctx.budget.spent(),
            ctx.budget.max().unwrap_or(0.0),
            job.worst_cost
        )));
        return Sent::Stopped;
    }
    let slot = match slot {
        Some(s) => s,
        None => tokio::select! {
            s = ctx.limiter.acquire_slot() => s,
            _ = ctx.soft_stop.cancelled() => { ctx.budget.settle(job.worst_cost, 0.0); return Sent::Stopped; }
        },
    };
    let reservation = tokio::select! {
        r = ctx.limiter.reserve(job.est_prompt + p.max_tokens) => r,
        _ = ctx.soft_stop.cancelled() => { ctx.budget.settle(job.worst_cost, 0.0); return Sent::Stopped; }
    };
    // A pause that came while this send waited for the rate limits holds it
    // too: nothing leaves while paused.
    if !ctx.wait_unpaused().await {
        ctx.budget.settle(job.worst_cost, 0.0);
        return Sent::Stopped;
    }
    job.attempt += 1;
    let client_request_id = custom_id(ctx, job.item.request_id, job.attempt);
    let Some(prompt) = job.prompt.as_ref() else {
        ctx.budget.settle(job.worst_cost, 0.0);
        return Sent::Stopped;
    };
    let intent = SendIntent {
        session_id: ctx.session_id.clone(),
        request_id: job.item.request_id,
        attempt: job.attempt,
        client_request_id: client_request_id.clone(),
        system_prompt: prompt.system.clone(),
        user_prompt: prompt.user.clone(),
    };
    // Intent before side effect: the attempt is on disk before a byte leaves.
    if !ctx.write(WriteOp::Send(intent)).await {
        ctx.budget.settle(job.worst_cost, 0.0);
        return Sent::LedgerFailed;
    }
    let request = ChatRequest {
        model: p.model.clone(),
        system: prompt.system.clone(),
        user: prompt.user.clone(),
        max_tokens: p.max_tokens,
        temperature: p.temperature,
        response_schema: p.response_schema.clone(),
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
    ctx.stats.in_flight.fetch_sub(1, Relaxed);
    drop(slot);
    let base = AttemptRecord {
        session_id: ctx.session_id.clone(),
        request_id: job.item.request_id,
        attempt: job.attempt,
        latency_ms: started.elapsed().as_secs_f64() * 1000.0,
        ..Default::default()
    };
    match result {
        None => {
            // The bytes left, the answer never came: it may have been billed.
            ctx.budget.settle(job.worst_cost, 0.0);
            Sent::Abandoned(AttemptRecord {
                state: "ambiguous",
                error_kind: Some("ambiguous".into()),
                error_message: Some(
                    "abandoned in flight at shutdown; it may have been billed".into(),
                ),
                ..base
            })
        }
        Some(Ok(answer)) => Sent::Answer(base, answer, Some(reservation)),
        Some(Err(err)) => {
            ctx.budget.settle(job.worst_cost, 0.0);
            Sent::Failed(base, err)
        }
    }
}

/// Hand the request to the batcher and wait for its line's result. None:
/// `auto` had too few requests for a batch: send it synchronously.
async fn via_batch(
    ctx: &Ctx,
    b: &std::sync::Arc<super::batching::Batcher>,
    job: &mut Job<'_>,
) -> Option<Sent> {
    let p = &ctx.p;
    let worst = job.worst_cost * b.price_factor();
    if !ctx.budget.try_reserve(worst) {
        ctx.stop(StopCause::Budget(format!(
            "budget reached: ${:.4} spent of ${:.4}; the next request could cost up to ${:.4}",
            ctx.budget.spent(),
            ctx.budget.max().unwrap_or(0.0),
            worst
        )));
        return Some(Sent::Stopped);
    }
    if !ensure_prompt(ctx, job).await {
        ctx.budget.settle(worst, 0.0);
        return Some(Sent::Stopped);
    }
    let attempt = job.attempt + 1;
    let id = custom_id(ctx, job.item.request_id, attempt);
    // The batch takes the prompt: a waiting line keeps no copy of it.
    let prompt = job.prompt.take().unwrap_or_else(|| Prompt {
        system: None,
        user: String::new(),
    });
    let request = ChatRequest {
        model: p.model.clone(),
        system: prompt.system,
        user: prompt.user,
        max_tokens: p.max_tokens,
        temperature: p.temperature,
        response_schema: p.response_schema.clone(),
        client_request_id: id,
        timeout: p.request_timeout,
    };
    let started = std::time::Instant::now();
    let rx = b.enqueue(job.item.request_id, attempt, request);
    let reply = tokio::select! {
        r = rx => r.ok(),
        // The run lets go of its batches: the attempt stays recorded in
        // its batch and a resume collects the result.
        _ = b.detached().cancelled() => {
            ctx.budget.settle(worst, 0.0);
            return Some(Sent::Stopped);
        }
    };
    match reply {
        Some(Reply::GoSync) => {
            ctx.budget.settle(worst, 0.0);
            None
        }
        // Dropped before its batch was recorded: the run is stopping.
        None => {
            ctx.budget.settle(worst, 0.0);
            Some(Sent::Stopped)
        }
        Some(r) => {
            job.attempt = attempt;
            job.via = Via::Batch;
            job.reserved = worst;
            let (tx, rx) = tokio::sync::oneshot::channel();
            let _ = tx.send(r);
            Some(Box::pin(batch_reply(ctx, job, rx, started)).await)
        }
    }
}

/// A batch line's result as an attempt's outcome.
async fn batch_reply(
    ctx: &Ctx,
    job: &mut Job<'_>,
    rx: tokio::sync::oneshot::Receiver<Reply>,
    started: std::time::Instant,
) -> Sent {
    job.via = Via::Batch;
    let reply = match ctx.batcher() {
        Some(b) => tokio::select! {
            r = rx => r.ok(),
            _ = b.detached().cancelled() => None,
        },
        None => rx.await.ok(),
    };
    let Some(reply) = reply else {
        ctx.budget.settle(job.reserved, 0.0);
        return Sent::Stopped;
    };
    ctx.stats.in_flight.fetch_sub(1, Relaxed);
    ctx.stats.batched.fetch_sub(1, Relaxed);
    let base = AttemptRecord {
        session_id: ctx.session_id.clone(),
        request_id: job.item.request_id,
        attempt: job.attempt,
        latency_ms: started.elapsed().as_secs_f64() * 1000.0,
        ..Default::default()
    };
    match reply {
        Reply::Answer(a) => Sent::Answer(base, a, None),
        Reply::Error(e) => {
            ctx.budget.settle(job.reserved, 0.0);
            Sent::Failed(base, e)
        }
        Reply::NotRun(why) => {
            ctx.budget.settle(job.reserved, 0.0);
            Sent::NotRun(base, why)
        }
        // Waits for the operator: the attempt stays recorded in its batch.
        Reply::Held(why) => {
            tracing::info!(request = job.item.request_id, "held: {why}");
            ctx.budget.settle(job.reserved, 0.0);
            Sent::Stopped
        }
        Reply::GoSync => {
            ctx.budget.settle(job.reserved, 0.0);
            Sent::Stopped
        }
    }
}

/// A batch line that never ran: not billed. It goes again (a new batch, or
/// synchronously) unless the run is stopping or its sends are used up.
async fn on_not_run(ctx: &Ctx, job: &mut Job<'_>, base: AttemptRecord, why: String) -> Next {
    job.transport_failures += 1;
    let stopping = ctx.soft_stop.is_cancelled();
    let exhausted = job.transport_failures >= ctx.p.max_transport_attempts;
    let rec = AttemptRecord {
        state: "failed",
        error_kind: Some("not_run".into()),
        error_message: Some(why.clone()),
        transport_failure: true,
        will_retry: !stopping && !exhausted,
        ..base
    };
    if exhausted && !stopping {
        let msg = format!(
            "gave up after {} sends that did not run: {why}",
            job.transport_failures
        );
        finish_error(ctx, job.item, Some(rec), msg).await;
        return Next::Done;
    }
    if stopping {
        // Back to pending: a resume (or a later session) sends it.
        ctx.write(WriteOp::Attempt(rec)).await;
        return Next::Done;
    }
    ctx.stats.retries.fetch_add(1, Relaxed);
    if ctx.write(WriteOp::Attempt(rec)).await {
        Next::Retry
    } else {
        Next::Done
    }
}

/// An answer came: account for it, gate it, route it or try again.
async fn on_answer(
    ctx: &Ctx,
    job: &mut Job<'_>,
    base: AttemptRecord,
    answer: &ChatAnswer,
    reservation: Option<Reservation>,
) -> Next {
    let p = &ctx.p;
    let factor = match (job.via, ctx.batcher()) {
        (Via::Batch, Some(b)) => b.price_factor(),
        _ => 1.0,
    };
    // An answer without usage is charged its worst case: the budget must
    // never believe a send was free.
    let cost = match answer.usage {
        Some(u) => {
            p.price
                .cost(u.input_tokens, u.cached_input_tokens, u.output_tokens)
                * factor
        }
        None => job.worst_cost * factor,
    };
    ctx.budget.settle(job.reserved, cost);
    if let Some(reservation) = reservation {
        ctx.limiter.on_success(
            reservation,
            answer.usage.map(|u| u.input_tokens + u.output_tokens),
            &answer.headers,
        );
    }
    let usage = answer.usage.unwrap_or_default();
    ctx.stats
        .add_usage(usage.input_tokens, usage.output_tokens, cost);
    let rec = answered_record(base, answer, cost);
    match judge(ctx, answer) {
        Ok(out) => {
            let outcome = p.thresholds.route(out.confidence);
            let fin = FinalResult {
                session_id: ctx.session_id.clone(),
                item_id: job.item.item_id.clone(),
                request_id: job.item.request_id,
                stage: p.stage.clone(),
                outcome,
                answer_json: serde_json::to_string(&out.answer).ok(),
                confidence: Some(out.confidence),
                rationale: out.rationale,
                model_id: answer.model.clone().unwrap_or_else(|| p.model.clone()),
                error_message: None,
                request_status: "completed",
            };
            if ctx.write(WriteOp::Final(Some(rec), fin)).await {
                ctx.stats.record_outcome(outcome);
            }
            Next::Done
        }
        Err(reason) => {
            job.gate_failures += 1;
            let retry = job.gate_failures < p.max_attempts;
            let rec = AttemptRecord {
                error_kind: Some(reason.kind().into()),
                error_message: Some(reason.to_string()),
                gate_failure: true,
                will_retry: retry,
                ..rec
            };
            if !retry {
                let msg = format!(
                    "{reason} (after {} answers failed the gate)",
                    job.gate_failures
                );
                finish_error(ctx, job.item, Some(rec), msg).await;
                return Next::Done;
            }
            ctx.stats.retries.fetch_add(1, Relaxed);
            if ctx.write(WriteOp::Attempt(rec)).await {
                Next::Retry
            } else {
                Next::Done
            }
        }
    }
}

/// No answer: throttle, stop the session, fail the item, or back off.
async fn on_error(ctx: &Ctx, job: &mut Job<'_>, base: AttemptRecord, err: &ProviderError) -> Next {
    let p = &ctx.p;
    // A batch line's error says nothing about the synchronous limits.
    if job.via == Via::Sync {
        match err.class {
            ErrorClass::RateLimited | ErrorClass::Overloaded => {
                ctx.limiter.on_throttled(&err.headers)
            }
            _ => ctx.limiter.on_other(&err.headers),
        }
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
    tracing::debug!(
        request = job.item.request_id,
        attempt = job.attempt,
        "attempt failed: {err}"
    );
    if err.class.stops_session() {
        tracing::warn!(session = %ctx.session_id, "stopping: {err}");
        ctx.stop(StopCause::Fatal(fatal_message(err, &p.provider_name)));
        ctx.write(WriteOp::Attempt(rec)).await;
        return Next::Done;
    }
    if !err.class.is_retryable() {
        finish_error(ctx, job.item, Some(rec), err.to_string()).await;
        return Next::Done;
    }
    let (exhausted, retry_no) = if is_rl {
        job.rate_limited += 1;
        (job.rate_limited > MAX_RATE_LIMIT_RETRIES, job.rate_limited)
    } else {
        job.transport_failures += 1;
        (
            job.transport_failures >= p.max_transport_attempts,
            job.transport_failures,
        )
    };
    if exhausted {
        let msg = format!("gave up after {retry_no} failed attempts: {err}");
        finish_error(ctx, job.item, Some(rec), msg).await;
        return Next::Done;
    }
    ctx.stats.retries.fetch_add(1, Relaxed);
    if !ctx
        .write(WriteOp::Attempt(AttemptRecord {
            will_retry: true,
            ..rec
        }))
        .await
    {
        return Next::Done;
    }
    let delay = ctx
        .backoff
        .delay_with_hint(retry_no, err.headers.retry_after, &mut rand::rng());
    Next::RetryAfter(delay)
}

/// The name a provider's structured-output mode gets for the stage's schema.
pub(super) fn schema_name(stage: &str) -> String {
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
