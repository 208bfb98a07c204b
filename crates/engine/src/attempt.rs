//! One request of one item at one stage: render, reserve, record the
//! intent, send (synchronously or in a provider batch), judge the answer,
//! retry within the budgets. The caller records how the stage ended (a pass
//! with its attempt, or the item's error), so a stage's end and the item's
//! outcome commit together.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use serde_json::{Map, Value};

use super::batching::{Delivered, Reply};
use super::ctx::{Ctx, StageRt, StopCause};
use super::stages::Stage;
use crate::gate::{GateFailure, GateOutput};
use crate::template::Prompt;
use docket_ledger::store::WorkItem;
use docket_ledger::writer::{AttemptRecord, SendIntent, WriteOp};
use docket_providers::limiter::{Reservation, Slot};
use docket_providers::{ChatAnswer, ChatRequest, ErrorClass, FinishReason, ProviderError};

/// A truncated answer's retries grow max_tokens up to this many times the
/// stage's.
const TRUNCATION_GROWTH: u64 = 4;
/// ... and never past this many output tokens.
const TRUNCATION_CEILING: u64 = 8_192;
/// Sends of one item that reached nothing (they spend none of its transport
/// attempts; a provider that is gone opens the breaker long before this).
const MAX_UNREACHED_RETRIES: u32 = 30;
/// A request whose last this-many failures (at most its transport attempts)
/// were alike when its attempts run out failed deterministically (row S4):
/// named apart from a run of bad luck.
const DETERMINISTIC_STREAK: u32 = 3;

/// How a stage's request ended.
pub(super) enum StageEnd {
    /// Its answer passed the gate (with the attempt that brought it).
    Passed(GateOutput, AttemptRecord),
    /// Its budgets are spent, or it can never succeed: the item's outcome is
    /// `error` (with the last attempt, if one is not recorded yet).
    Failed(String, Option<AttemptRecord>),
    /// Every answer failed the gate (wrong schema, not JSON), up to the
    /// stage's cap: the item goes to human review with its raw answers kept,
    /// not to `error` (fault-matrix row S7). With the last attempt.
    GateSpent(String, Option<AttemptRecord>),
    /// The session stopped first: the request stays pending.
    Stopped,
    /// The request waits as a line for its provider batch: the item's
    /// result comes to a new task (see `batching::Deliver`).
    Parked,
}

/// Run a request's attempts until its answer passes, its budgets are spent
/// or the session stops. `slot` is a synchronous slot the feed already took.
pub(super) async fn run_request(ctx: &Ctx, job: Job<'_>, slot: Option<Slot>) -> StageEnd {
    /// The stage's count of requests under way, given back however the
    /// request ends (a panic in its handling included: row P6).
    struct Busy<'a>(&'a Ctx, usize);
    impl Drop for Busy<'_> {
        fn drop(&mut self) {
            self.0.busy(self.1, -1);
        }
    }
    let stage = job.stage.index;
    ctx.busy(stage, 1);
    let _busy = Busy(ctx, stage);
    Box::pin(attempts(ctx, job, slot)).await
}

async fn attempts(ctx: &Ctx, mut job: Job<'_>, slot: Option<Slot>) -> StageEnd {
    // The result of a line of a provider batch: applied, never paid again.
    if let Some(d) = job.delivered.take() {
        match d.reply {
            // `auto` had too few for a batch: this attempt goes at once.
            Reply::GoSync => job.sync_only = true,
            Reply::Refused(message) => return StageEnd::Failed(message, None),
            reply if d.attempt == job.attempt => {
                job.reattached = Some(reply);
                job.via = Via::Batch;
            }
            _ => {
                // The ledger moved on from that attempt (another worker
                // applied it): nothing to apply here.
                tracing::warn!(
                    request = job.request_id,
                    line = d.attempt,
                    recorded = job.attempt,
                    "a batch result for an attempt that is not the request's latest: not applied"
                );
                return StageEnd::Stopped;
            }
        }
    }
    let mut slot = slot;
    loop {
        // Boxed (see `attempt_once`): the outcome's records live only
        // while it is handled.
        let sent = Box::pin(attempt_once(ctx, &mut job, slot.take())).await;
        let next = Box::pin(handle(ctx, &mut job, sent)).await;
        let (delay, waiting) = match next {
            Next::Done(end) => return end,
            Next::Retry => continue,
            Next::RetryAfter(delay) => (delay, None),
            Next::RetryWait(delay) => (delay, Some(RetryWaiting::new(ctx))),
        };
        let wait = Box::pin(async {
            tokio::select! {
                _ = tokio::time::sleep(delay) => true,
                _ = ctx.soft_stop.cancelled() => false,
            }
        });
        let waited = wait.await;
        drop(waiting);
        if !waited {
            return StageEnd::Stopped;
        }
    }
}

/// What to do after one attempt's outcome.
async fn handle(ctx: &Ctx, job: &mut Job<'_>, sent: Sent) -> Next {
    match sent {
        // A request that did not finish simply stays pending: a resume
        // (or a later session) picks it up.
        Sent::Stopped => Next::Done(StageEnd::Stopped),
        Sent::Parked => Next::Done(StageEnd::Parked),
        Sent::Abandoned(rec) => {
            ctx.stats.ambiguous.fetch_add(1, Relaxed);
            ctx.write(job.item, WriteOp::Attempt(rec)).await;
            Next::Done(StageEnd::Stopped)
        }
        Sent::LedgerFailed => Next::Done(StageEnd::Stopped),
        Sent::Answer(base, answer, reservation) => {
            on_answer(ctx, job, base, &answer, reservation).await
        }
        Sent::Failed(base, err) => on_error(ctx, job, base, &err, Resend::AfterBackoff).await,
        Sent::Cut(base, err) => on_error(ctx, job, base, &err, Resend::AtOnce).await,
        Sent::NotRun(base, why) => on_not_run(ctx, job, base, why).await,
        Sent::RenderFailed(message) => Next::Done(StageEnd::Failed(message, None)),
    }
}

/// A request being worked on: its prompt, estimates and budgets so far.
pub(super) struct Job<'a> {
    pub item: &'a WorkItem,
    pub stage: &'a Stage,
    pub request_id: i64,
    /// What the templates see besides the item: earlier stages' outputs
    /// (`stages`), a critic's `target`, `criteria`.
    extra: Map<String, Value>,
    /// None while a batch holds it (a line waiting for its batch keeps no
    /// copy): rendered again when another send needs it.
    prompt: Option<Prompt>,
    /// The prompt is the repair prompt.
    repairing: bool,
    /// The last answer that failed the gate, and why (for a repair prompt).
    last_failure: Option<(String, String)>,
    /// Prompt tokens as reserved with the limiter.
    est_prompt: u64,
    /// The max_tokens of the next send: the stage's, grown after a
    /// truncated answer (see `grow_max_tokens`).
    max_tokens: u64,
    /// What one send could cost at most (prompt + max_tokens of output).
    worst_cost: f64,
    attempt: i64,
    gate_failures: u32,
    transport_failures: u32,
    rate_limited: u32,
    /// Sends that reached nothing (connection refused, DNS, TLS).
    unreached: u32,
    /// The last transport failure (class and HTTP status) and how many
    /// times in a row it came.
    streak: Option<((ErrorClass, Option<u16>), u32)>,
    /// Sends of this item cut at the learned deadline (see `deadline`).
    cuts: u32,
    /// How the current attempt went out.
    via: Via,
    /// What the budget holds for the current attempt.
    reserved: f64,
    /// A batch line's result handed to this job, before it is looked at.
    delivered: Option<Delivered>,
    /// The result of this attempt's batch line, to apply.
    reattached: Option<Reply>,
    /// This attempt goes synchronously even in batch mode (`auto` had too
    /// few for a batch; a criterion's follow-up).
    sync_only: bool,
    /// A narrower structured-output schema than the stage's (a criterion
    /// asked on its own must be answered).
    schema: Option<std::sync::Arc<(String, Value)>>,
    /// Where the job stands, readable after a panic dropped it.
    seen: Option<std::sync::Arc<Seen>>,
}

/// The latest attempt number of a job, kept where a panic in its handling
/// does not take it (row P6): the worker closes that attempt and sends the
/// request again under the next number.
pub(super) struct Seen {
    attempt: std::sync::atomic::AtomicI64,
}

impl Seen {
    pub(super) fn starting_at(attempt: i64) -> Self {
        Seen {
            attempt: std::sync::atomic::AtomicI64::new(attempt),
        }
    }

    pub(super) fn attempt(&self) -> i64 {
        self.attempt.load(Relaxed)
    }
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
pub(super) fn custom_id(ctx: &Ctx, request_id: i64, attempt: i64) -> String {
    format!("{}-{request_id}-{attempt}", ctx.session_id)
}

/// Where a request stands when its job starts.
pub(super) struct Counters {
    pub attempt: i64,
    pub gate_failures: i64,
    pub transport_retries: i64,
}

impl<'a> Job<'a> {
    /// Render the prompt; a prompt that cannot be rendered is the item's
    /// error at once.
    pub(super) fn new(
        item: &'a WorkItem,
        stage: &'a Stage,
        request_id: i64,
        counters: Counters,
        extra: Map<String, Value>,
    ) -> Result<Self, String> {
        let mut job = Job {
            item,
            stage,
            request_id,
            extra,
            prompt: None,
            repairing: false,
            last_failure: None,
            est_prompt: 0,
            max_tokens: stage.max_tokens,
            worst_cost: 0.0,
            attempt: counters.attempt,
            gate_failures: counters.gate_failures.max(0) as u32,
            transport_failures: counters.transport_retries.max(0) as u32,
            rate_limited: 0,
            unreached: 0,
            streak: None,
            cuts: 0,
            via: Via::Sync,
            reserved: 0.0,
            delivered: None,
            reattached: None,
            sync_only: false,
            schema: None,
            seen: None,
        };
        let prompt = job.render()?;
        job.est_prompt = prompt_tokens(stage, &prompt);
        job.worst_cost = stage.price.cost(job.est_prompt, 0, job.max_tokens);
        job.prompt = Some(prompt);
        Ok(job)
    }

    /// Apply this batch line's result first.
    pub(super) fn with_delivered(mut self, d: Option<Delivered>) -> Self {
        self.delivered = d;
        self
    }

    /// Keep the job's attempt number in `seen` as it changes.
    pub(super) fn seen_in(mut self, seen: std::sync::Arc<Seen>) -> Self {
        self.seen = Some(seen);
        self
    }

    fn note_seen(&self) {
        if let Some(s) = &self.seen {
            s.attempt.store(self.attempt, Relaxed);
        }
    }

    /// Never through a batch (a criterion's follow-up waits on its stage's
    /// answer in the same task).
    pub(super) fn sync_only(mut self) -> Self {
        self.sync_only = true;
        self
    }

    /// Send this schema as the structured output instead of the stage's.
    pub(super) fn with_schema(mut self, schema: Option<std::sync::Arc<(String, Value)>>) -> Self {
        self.schema = schema;
        self
    }

    fn response_schema(&self) -> Option<std::sync::Arc<(String, Value)>> {
        self.schema
            .clone()
            .or_else(|| self.stage.response_schema.clone())
    }

    /// The record of the current attempt, before its outcome is known.
    fn record(&self, ctx: &Ctx, started: std::time::Instant) -> AttemptRecord {
        AttemptRecord {
            session_id: ctx.session_id.clone(),
            request_id: self.request_id,
            attempt: self.attempt,
            latency_ms: started.elapsed().as_secs_f64() * 1000.0,
            ..Default::default()
        }
    }

    /// A truncated answer is never asked again as it was (fault-matrix
    /// row S8): the next send has twice the max_tokens, up to
    /// `TRUNCATION_GROWTH` times the stage's, within tokens/min, and not
    /// past `TRUNCATION_CEILING` (what current models all allow, so the
    /// larger request is not refused as over the model's output limit; a
    /// stage already at or past it is not asked again: row S8). False when
    /// it is at its ceiling already (asking again would ask the same).
    fn grow_max_tokens(&mut self) -> bool {
        let before = self.max_tokens;
        let mut cap = self
            .stage
            .max_tokens
            .saturating_mul(TRUNCATION_GROWTH)
            .min(self.stage.max_tokens.max(TRUNCATION_CEILING));
        if self.stage.tpm > 0 {
            cap = cap.min(self.stage.tpm.saturating_sub(self.est_prompt));
        }
        self.max_tokens = self
            .max_tokens
            .saturating_mul(2)
            .min(cap)
            .max(self.max_tokens);
        self.worst_cost = self.stage.price.cost(self.est_prompt, 0, self.max_tokens);
        self.max_tokens > before
    }

    fn rt<'c>(&self, ctx: &'c Ctx) -> &'c StageRt {
        ctx.rt(self.stage.index)
    }

    /// The prompt for the next attempt: the stage's template, or its repair
    /// prompt once enough answers failed the gate.
    fn render(&mut self) -> Result<Prompt, String> {
        let evidence = serde_json::from_str::<Value>(&self.item.evidence_json)
            .map_err(|e| format!("stored evidence is not JSON: {e}"))?;
        let (template, repairing) = self.stage.template_for(self.gate_failures);
        let mut extra = self.extra.clone();
        if repairing {
            let (output, why) = self.last_failure.clone().unwrap_or_default();
            extra.insert("failed_output".into(), Value::String(output));
            extra.insert("gate_error".into(), Value::String(why));
        }
        self.repairing = repairing;
        template
            .render_with(&self.item.item_id, &evidence, extra)
            .map_err(|e| e.to_string())
    }
}

/// What one send came to.
enum Sent {
    /// The session stopped before the send; nothing left.
    Stopped,
    /// Handed to the batcher: the result comes to a new task.
    Parked,
    /// Abandoned in flight at a hard stop (its record, state ambiguous).
    Abandoned(AttemptRecord),
    /// The intent could not be recorded; the session is stopping.
    LedgerFailed,
    /// The limiter's reservation for a synchronous send (None: a batch line).
    Answer(AttemptRecord, ChatAnswer, Option<Reservation>),
    Failed(AttemptRecord, ProviderError),
    /// No answer within the learned deadline: cut (see `deadline`).
    Cut(AttemptRecord, ProviderError),
    /// A batch line never run (its batch expired or was cancelled first).
    NotRun(AttemptRecord, String),
    /// The prompt could not be rendered: the item's error.
    RenderFailed(String),
}

/// What to do after an attempt.
/// A request in `retry_wait`, counted in the stats while it waits.
struct RetryWaiting<'a>(&'a Ctx);

impl<'a> RetryWaiting<'a> {
    fn new(ctx: &'a Ctx) -> Self {
        ctx.stats.retry_waiting.fetch_add(1, Relaxed);
        RetryWaiting(ctx)
    }
}

impl Drop for RetryWaiting<'_> {
    fn drop(&mut self) {
        self.0.stats.retry_waiting.fetch_sub(1, Relaxed);
    }
}

// Built once per attempt and matched at once: boxing the big variant would
// only add an allocation.
#[allow(clippy::large_enum_variant)]
enum Next {
    Done(StageEnd),
    Retry,
    RetryAfter(Duration),
    /// Its rate-limit retries ran out: it waits this long (row S2's
    /// `retry_wait` until `run_at`), counted in the gauges meanwhile.
    RetryWait(Duration),
}

/// Wait for the budget, a slot and the rate limits; record the intent; send.
///
/// Each path is its own boxed future: a task waiting hours for a batch holds
/// only the small state of that wait, not the largest state of every path
/// (100,000 waiting lines are 100,000 tasks).
async fn attempt_once(ctx: &Ctx, job: &mut Job<'_>, slot: Option<Slot>) -> Sent {
    if let Some(reply) = job.reattached.take() {
        // Recorded and in a batch: its budget was held by the batch, which
        // gives it back as results are applied; only what it cost counts.
        job.reserved = 0.0;
        return batch_reply(ctx, job, reply, std::time::Instant::now());
    }
    // Nothing new leaves while paused, nor while the ledger's disk is
    // almost full (a batch line included: it is written with its prompt).
    if !ctx.wait_unpaused().await || !ctx.wait_disk_room().await {
        return Sent::Stopped;
    }
    if !std::mem::take(&mut job.sync_only)
        && let Some(b) = ctx.batcher(job.stage.index)
        && b.takes_new()
    {
        return via_batch(ctx, b, job);
    }
    Box::pin(send_sync(ctx, job, slot)).await
}

/// Hold `worst` of the budget for a send; when it would pass the budget,
/// stop the session (paused, resumable) instead.
fn reserve(ctx: &Ctx, worst: f64) -> bool {
    if ctx.budget.try_reserve(worst) {
        return true;
    }
    ctx.stop(StopCause::Budget(format!(
        "budget reached: ${:.4} spent of ${:.4}; the next request could cost up to ${:.4}",
        ctx.budget.spent(),
        ctx.budget.max().unwrap_or(0.0),
        worst
    )));
    false
}

/// The prompt's tokens as the limiter counts them. With a budget the worst
/// case must not be underestimated, so the real tokenizer counts
/// (token-dense text beats characters/4); otherwise a cheap estimate,
/// corrected from the reported usage afterwards.
pub(super) fn prompt_tokens(stage: &super::stages::Stage, prompt: &crate::template::Prompt) -> u64 {
    match &stage.budget_counter {
        Some(counter) => counter.count_prompt(prompt),
        None => {
            let chars = prompt.user.len() + prompt.system.as_deref().map_or(0, str::len);
            (chars as u64).div_ceil(4) + 12
        }
    }
}

/// Why a request of `prompt_tokens` can never be sent under the stage's
/// tokens/min limit: it needs more than a whole minute's tokens (the
/// provider would refuse it as too large, and the limiter would hold it
/// for ever). None when it fits, or there is no limit.
pub(super) fn over_token_limit(stage: &super::stages::Stage, prompt_tokens: u64) -> Option<String> {
    let need = prompt_tokens + stage.max_tokens;
    (stage.tpm > 0 && need > stage.tpm).then(|| {
        format!(
            "needs about {need} tokens (a prompt of about {prompt_tokens} + max_tokens {}), more than the provider's tokens_per_minute = {}: it can never be sent (shorten the item, or raise tokens_per_minute)",
            stage.max_tokens, stage.tpm
        )
    })
}

/// Render the prompt again when a batch took it (or the repair prompt is
/// due). The message when it cannot be rendered: the item's error.
fn ensure_prompt(job: &mut Job<'_>) -> Result<(), String> {
    let repair_due = job.stage.template_for(job.gate_failures).1;
    if job.prompt.is_some() && repair_due == job.repairing {
        return Ok(());
    }
    job.prompt = Some(job.render()?);
    Ok(())
}

/// One synchronous send under the budget and the rate limits.
async fn send_sync(ctx: &Ctx, job: &mut Job<'_>, slot: Option<Slot>) -> Sent {
    if let Err(message) = ensure_prompt(job) {
        return Sent::RenderFailed(message);
    }
    job.via = Via::Sync;
    if let Some(why) = over_token_limit(job.stage, job.est_prompt) {
        return Sent::RenderFailed(why);
    }
    job.reserved = job.worst_cost;
    if !reserve(ctx, job.worst_cost) {
        return Sent::Stopped;
    }
    let slot = match slot {
        Some(s) => s,
        None => tokio::select! {
            s = job.rt(ctx).limiter.acquire_slot() => s,
            _ = ctx.soft_stop.cancelled() => { ctx.budget.settle(job.worst_cost, 0.0); return Sent::Stopped; }
        },
    };
    let reservation = tokio::select! {
        r = job.rt(ctx).limiter.reserve(job.est_prompt + job.max_tokens) => r,
        _ = ctx.soft_stop.cancelled() => { ctx.budget.settle(job.worst_cost, 0.0); return Sent::Stopped; }
    };
    // A pause that came while this send waited for the rate limits holds it
    // too: nothing leaves while paused, or while the provider is unreachable.
    if !ctx.wait_unpaused().await
        || !ctx
            .reach_watch
            .wait_closed(job.stage.index, &ctx.soft_stop)
            .await
    {
        ctx.budget.settle(job.worst_cost, 0.0);
        return Sent::Stopped;
    }
    job.attempt += 1;
    job.note_seen();
    let client_request_id = custom_id(ctx, job.request_id, job.attempt);
    let Some(prompt) = job.prompt.as_ref() else {
        ctx.budget.settle(job.worst_cost, 0.0);
        return Sent::Stopped;
    };
    let intent = SendIntent {
        session_id: ctx.session_id.clone(),
        request_id: job.request_id,
        attempt: job.attempt,
        client_request_id: client_request_id.clone(),
        system_prompt: prompt.system.clone(),
        user_prompt: prompt.user.clone(),
    };
    // Intent before side effect: the attempt is on disk before a byte leaves.
    if !ctx.write(job.item, WriteOp::Send(intent)).await {
        ctx.budget.settle(job.worst_cost, 0.0);
        return Sent::LedgerFailed;
    }
    docket_model::failpoint::hit("after_intent");
    let request = ChatRequest {
        model: job.stage.model.clone(),
        system: prompt.system.clone(),
        user: prompt.user.clone(),
        max_tokens: job.max_tokens,
        temperature: job.stage.temperature,
        response_schema: job.response_schema(),
        client_request_id,
        timeout: job.stage.request_timeout,
    };
    ctx.stats.in_flight.fetch_add(1, Relaxed);
    ctx.stats.sent.fetch_add(1, Relaxed);
    let started = std::time::Instant::now();
    let deadline = &job.rt(ctx).deadline;
    let in_flight = deadline.begin();
    let mut cut = false;
    let result = tokio::select! {
        // An answer that is there wins over a deadline that is also due.
        biased;
        r = job.rt(ctx).provider.send(&request) => Some(r),
        _ = ctx.hard_stop.cancelled() => None,
        missed = deadline.passed(started, job.cuts) => {
            // Dropping the send closes its connection.
            deadline.cut();
            cut = true;
            Some(Err(ProviderError {
                class: ErrorClass::Ambiguous,
                http_status: None,
                message: deadline.cut_message(missed),
                headers: Default::default(),
            }))
        }
    };
    ctx.stats.in_flight.fetch_sub(1, Relaxed);
    drop(in_flight);
    drop(slot);
    job.cuts += u32::from(cut);
    let base = job.record(ctx, started);
    if let Some(Ok(_)) = &result {
        deadline.answered(started.elapsed());
        docket_model::failpoint::hit("after_answer");
    }
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
        Some(Err(err)) if cut => {
            ctx.budget.settle(job.worst_cost, 0.0);
            Sent::Cut(base, err)
        }
        Some(Err(err)) => {
            ctx.budget.settle(job.worst_cost, 0.0);
            Sent::Failed(base, err)
        }
    }
}

/// Hand the request to the batcher: the line holds its prompt and its
/// share of the budget until its batch is recorded; its result comes to a
/// new task (see `batching::Deliver`).
fn via_batch(ctx: &Ctx, b: &std::sync::Arc<super::batching::Batcher>, job: &mut Job<'_>) -> Sent {
    let worst = job.worst_cost * b.price_factor();
    if !reserve(ctx, worst) {
        return Sent::Stopped;
    }
    if let Err(message) = ensure_prompt(job) {
        ctx.budget.settle(worst, 0.0);
        return Sent::RenderFailed(message);
    }
    let attempt = job.attempt + 1;
    let id = custom_id(ctx, job.request_id, attempt);
    // The batch takes the prompt: the job is done with it.
    let prompt = job.prompt.take().unwrap_or_else(|| Prompt {
        system: None,
        user: String::new(),
    });
    let request = ChatRequest {
        model: job.stage.model.clone(),
        system: prompt.system,
        user: prompt.user,
        max_tokens: job.max_tokens,
        temperature: job.stage.temperature,
        response_schema: job.response_schema(),
        client_request_id: id,
        timeout: job.stage.request_timeout,
    };
    let item = (job.item.item_id.clone(), job.item.claim_token);
    b.enqueue(job.request_id, attempt, request, item, worst);
    Sent::Parked
}

/// A batch line's result as an attempt's outcome.
fn batch_reply(ctx: &Ctx, job: &mut Job<'_>, reply: Reply, started: std::time::Instant) -> Sent {
    job.via = Via::Batch;
    ctx.stats.in_flight.fetch_sub(1, Relaxed);
    ctx.stats.batched.fetch_sub(1, Relaxed);
    let base = job.record(ctx, started);
    match reply {
        Reply::Answer(a) => Sent::Answer(base, a, None),
        Reply::Error(e) => Sent::Failed(base, e),
        Reply::NotRun(why) => Sent::NotRun(base, why),
        // Never recorded: handled before the attempt (see `attempts`).
        Reply::GoSync | Reply::Refused(_) => Sent::Stopped,
    }
}

/// A batch line that never ran: not billed. It goes again (a new batch, or
/// synchronously) unless the run is stopping or its sends are used up.
async fn on_not_run(ctx: &Ctx, job: &mut Job<'_>, base: AttemptRecord, why: String) -> Next {
    job.transport_failures += 1;
    let stopping = ctx.soft_stop.is_cancelled();
    let exhausted = job.transport_failures >= job.stage.max_transport_attempts;
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
        return Next::Done(StageEnd::Failed(msg, Some(rec)));
    }
    if stopping {
        // Back to pending: a resume (or a later session) sends it.
        ctx.write(job.item, WriteOp::Attempt(rec)).await;
        return Next::Done(StageEnd::Stopped);
    }
    ctx.stats.retries.fetch_add(1, Relaxed);
    if ctx.write(job.item, WriteOp::Attempt(rec)).await {
        Next::Retry
    } else {
        Next::Done(StageEnd::Stopped)
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
    let factor = match (job.via, ctx.batcher(job.stage.index)) {
        (Via::Batch, Some(b)) => b.price_factor(),
        _ => 1.0,
    };
    // An answer without usage is charged its worst case: the budget must
    // never believe a send was free.
    let cost = match answer.usage {
        Some(u) => {
            job.stage
                .price
                .cost(u.input_tokens, u.cached_input_tokens, u.output_tokens)
                * factor
        }
        None => job.worst_cost * factor,
    };
    ctx.budget.settle(job.reserved, cost);
    if let Some(open_for) = ctx.reach_watch.answered(job.stage.index) {
        super::reach_probe::healed(ctx, job.stage.index, open_for);
    }
    if let Some(reservation) = reservation {
        job.rt(ctx).limiter.on_success(
            reservation,
            answer.usage.map(|u| u.input_tokens + u.output_tokens),
            &answer.headers,
        );
    }
    let usage = answer.usage.unwrap_or_default();
    ctx.stats
        .add_usage(usage.input_tokens, usage.output_tokens, cost);
    // The provider takes this stage's requests: a refusal from now on is
    // the item's own.
    ctx.refusal_watch.passed(job.stage.index);
    let rec = answered_record(base, answer, cost);
    // An answer breaks any run of alike failures.
    job.streak = None;
    match judge(job.stage, answer, job.max_tokens) {
        Ok(out) => {
            ctx.gate_watch.passed(job.stage.index);
            Next::Done(StageEnd::Passed(out, rec))
        }
        Err(reason) => {
            if let Judged::Gate(_) = &reason {
                watch_gate(ctx, job, &reason.to_string());
            }
            job.gate_failures += 1;
            // Never the same request again for these (row S8): a truncated
            // answer is asked again only with more room, a refusal or an
            // empty answer only when the repair prompt comes next.
            let asked_again_differently = match &reason {
                Judged::Truncated(_) => job.grow_max_tokens(),
                Judged::Refused(_) | Judged::Empty(_) => {
                    !job.repairing && job.stage.template_for(job.gate_failures).1
                }
                Judged::Gate(_) => true,
            };
            let retry = job.gate_failures < job.stage.max_attempts && asked_again_differently;
            // What the repair prompt shows: the answer and why it failed.
            job.last_failure = Some((
                answer
                    .content
                    .clone()
                    .or_else(|| answer.refusal.clone())
                    .unwrap_or_default(),
                reason.to_string(),
            ));
            let gate = matches!(reason, Judged::Gate(_));
            let rec = AttemptRecord {
                error_kind: Some(reason.kind().into()),
                error_message: Some(reason.to_string()),
                gate_failure: true,
                will_retry: retry,
                // An answer kept for a human to read: anything key-shaped in
                // it is masked before it is stored (row S7).
                output: rec.output.map(|o| {
                    if gate {
                        docket_providers::redact(&o)
                    } else {
                        o
                    }
                }),
                ..rec
            };
            if !retry {
                if asked_again_differently {
                    let msg = format!(
                        "{reason} (after {} answers failed the gate)",
                        job.gate_failures
                    );
                    return Next::Done(if gate {
                        StageEnd::GateSpent(msg, Some(rec))
                    } else {
                        StageEnd::Failed(msg, Some(rec))
                    });
                }
                let msg = format!(
                    "{reason} (not asked again: the same request would get the same answer)"
                );
                return Next::Done(StageEnd::Failed(msg, Some(rec)));
            }
            ctx.stats.retries.fetch_add(1, Relaxed);
            if ctx.write(job.item, WriteOp::Attempt(rec)).await {
                Next::Retry
            } else {
                Next::Done(StageEnd::Stopped)
            }
        }
    }
}

/// A gate failure for the early watch: when the stage's first answers all
/// failed alike, the session pauses before every item pays for them.
fn watch_gate(ctx: &Ctx, job: &Job<'_>, reason: &str) {
    let stage = job.stage.index;
    let Some(why) = ctx.gate_watch.failed(stage, &job.item.item_id, reason) else {
        return;
    };
    let gate = match ctx.p.config.config.stages.get(stage).map(|s| &s.gate) {
        Some(docket_model::config::GateConfig::JsonSchema { schema, .. }) => {
            format!("the JSON schema {}", schema.display())
        }
        Some(docket_model::config::GateConfig::Regex { .. }) => "the regex gate".to_string(),
        None => "its gate".to_string(),
    };
    ctx.stop(StopCause::Paused(format!(
        "stage {}: {why} (checked against {gate}). Nothing more is sent: make the prompt ask for what the gate requires, then resume the session",
        job.stage.name
    )));
}

/// A refused request for the early watch: true when the stage's first
/// requests were all refused alike and the session pauses (row S3).
fn watch_refusals(ctx: &Ctx, job: &Job<'_>, err: &ProviderError) -> bool {
    let reason = match err.http_status {
        Some(status) => format!(
            "HTTP {status}: {}",
            docket_model::sanitize::truncate(&err.message, 160)
        ),
        None => err.message.clone(),
    };
    let Some(why) = ctx
        .refusal_watch
        .failed(job.stage.index, &job.item.item_id, &reason)
    else {
        return false;
    };
    ctx.stop(StopCause::Paused(format!(
        "stage {} (provider {}, model {}): {why}. Nothing more is sent and no item is failed for it. \
         If docket.toml is wrong (the model's name, a parameter), fix it and start the job again \
         (`docket cancel {}` first: none of its requests was answered); if the provider's side \
         (access to the model) is fixed instead, resume the session",
        job.stage.name, job.stage.provider_name, job.stage.model, ctx.session_id
    )));
    true
}

/// When a failed attempt goes again.
#[derive(Clone, Copy, PartialEq)]
enum Resend {
    AfterBackoff,
    /// A request cut at its deadline: the provider is answering others,
    /// this one was lost; waiting would only stretch the run.
    AtOnce,
}

/// No answer: throttle, stop the session, fail the item, or back off.
async fn on_error(
    ctx: &Ctx,
    job: &mut Job<'_>,
    base: AttemptRecord,
    err: &ProviderError,
    resend: Resend,
) -> Next {
    // A batch line's error says nothing about the synchronous limits.
    if job.via == Via::Sync {
        match err.class {
            ErrorClass::RateLimited | ErrorClass::Overloaded => {
                job.rt(ctx).limiter.on_throttled(&err.headers)
            }
            _ => job.rt(ctx).limiter.on_other(&err.headers),
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
    // Nothing reached the provider (no status came back, and the request
    // is not ambiguous): not one of the item's transport attempts, and a
    // streak of these opens the stage's breaker, which holds its sends
    // until a probe gets an answer (row S5).
    let unreached =
        err.class == ErrorClass::Transient && err.http_status.is_none() && job.via == Via::Sync;
    // A server error while the stage's breaker is open for server errors
    // (this send was its half-open probe, or was under way when it opened):
    // the outage's, not the item's (row S4).
    let server_error = job.via == Via::Sync
        && err.http_status.is_some_and(|s| s >= 500)
        && matches!(err.class, ErrorClass::Transient | ErrorClass::Overloaded);
    let held = server_error
        && ctx
            .reach_watch
            .opened(job.stage.index)
            .is_some_and(|(_, cause, _)| cause == super::reach_watch::Cause::Failing);
    // A request the provider refused before it ever answered this stage:
    // the job may be at fault (a model it does not know), not the item.
    // Retried like a transport failure while the refusal watch decides.
    let probation = err.class == ErrorClass::Request
        && err.http_status.is_some()
        && job.via == Via::Sync
        && ctx.refusal_watch.undecided(job.stage.index);
    let retryable = err.class.is_retryable() || probation;
    let rec = AttemptRecord {
        state: if ambiguous { "ambiguous" } else { "failed" },
        http_status: err.http_status,
        error_kind: Some(err.class.as_str().into()),
        error_message: Some(err.message.clone()),
        rate_limited: is_rl,
        transport_failure: !is_rl && !unreached && !held && !probation && retryable,
        ..base
    };
    tracing::debug!(
        request = job.request_id,
        attempt = job.attempt,
        "attempt failed: {err}"
    );
    if unreached {
        if let Some(why) =
            ctx.reach_watch
                .unreached(job.stage.index, &job.item.item_id, &err.message)
        {
            tracing::warn!(stage = %job.stage.name, "breaker open: {why}");
        }
    } else if server_error {
        if let Some(why) =
            ctx.reach_watch
                .server_failed(job.stage.index, &job.item.item_id, &err.message)
        {
            tracing::warn!(stage = %job.stage.name, "breaker open: {why}");
        }
    } else if err.http_status.is_some()
        && let Some(open_for) = ctx.reach_watch.answered(job.stage.index)
    {
        super::reach_probe::healed(ctx, job.stage.index, open_for);
    }
    if err.class.stops_session() {
        tracing::warn!(session = %ctx.session_id, "stopping: {err}");
        ctx.stop(StopCause::Fatal(fatal_message(
            err,
            &job.stage.provider_name,
        )));
        ctx.write(job.item, WriteOp::Attempt(rec)).await;
        return Next::Done(StageEnd::Stopped);
    }
    if probation && watch_refusals(ctx, job, err) {
        ctx.write(job.item, WriteOp::Attempt(rec)).await;
        return Next::Done(StageEnd::Stopped);
    }
    if !retryable {
        return Next::Done(StageEnd::Failed(err.to_string(), Some(rec)));
    }
    if is_rl && job.rate_limited >= job.stage.max_rate_limit_retries {
        // Row S2: refused for rate limits every time, `max_rate_limit_retries`
        // in a row. "Not now" never fails an item: the request waits
        // `retry_wait_secs` (jittered, so waiting requests do not come back
        // together), then its rate-limit retries start over.
        return retry_wait(ctx, job, rec, err).await;
    }
    // `deterministic`: the request's last failures were all this one
    // (row S4), named apart from a run of bad luck when it gives up.
    let (exhausted, retry_no, deterministic) = if is_rl {
        job.rate_limited += 1;
        // Something else came between: not "in a row".
        job.streak = None;
        (false, job.rate_limited, None)
    } else if unreached || held || probation {
        // Nothing was sent, the provider is down for everyone, or it has
        // refused this stage's every request so far: not one of the
        // item's transport attempts. A breaker or the refusal watch stops
        // the sends long before this cap.
        job.unreached += 1;
        job.streak = None;
        (job.unreached > MAX_UNREACHED_RETRIES, job.unreached, None)
    } else {
        job.transport_failures += 1;
        let how = (err.class, err.http_status);
        let n = match job.streak {
            Some((last, n)) if last == how => n + 1,
            _ => 1,
        };
        job.streak = Some((how, n));
        // Two alike at least: one failure says nothing of the next.
        let alike = DETERMINISTIC_STREAK
            .min(job.stage.max_transport_attempts)
            .max(2);
        (
            job.transport_failures >= job.stage.max_transport_attempts,
            job.transport_failures,
            (n >= alike).then_some(n),
        )
    };
    if exhausted {
        let msg = match deterministic {
            Some(n) => format!(
                "failed_deterministic: the same request failed the same way {n} times in a row: {err}"
            ),
            None => format!("gave up after {retry_no} failed attempts: {err}"),
        };
        return Next::Done(StageEnd::Failed(msg, Some(rec)));
    }
    ctx.stats.retries.fetch_add(1, Relaxed);
    if !ctx
        .write(
            job.item,
            WriteOp::Attempt(AttemptRecord {
                will_retry: true,
                ..rec
            }),
        )
        .await
    {
        return Next::Done(StageEnd::Stopped);
    }
    if resend == Resend::AtOnce {
        return Next::Retry;
    }
    let delay = ctx
        .backoff
        .delay_with_hint(retry_no, err.headers.retry_after, &mut rand::rng());
    Next::RetryAfter(delay)
}

/// Send a request whose rate-limit retries ran out to `retry_wait` (see
/// `retry_wait`): its attempt recorded, to go again after the wait.
async fn retry_wait(ctx: &Ctx, job: &mut Job<'_>, rec: AttemptRecord, err: &ProviderError) -> Next {
    let refused = job.rate_limited + 1;
    job.rate_limited = 0;
    job.streak = None;
    let wait = ctx
        .retry_waits
        .enter(ctx, job.stage.retry_wait, refused, &err.message);
    ctx.stats.retries.fetch_add(1, Relaxed);
    let recorded = ctx
        .write(
            job.item,
            WriteOp::Attempt(AttemptRecord {
                will_retry: true,
                ..rec
            }),
        )
        .await;
    if recorded {
        Next::RetryWait(wait)
    } else {
        Next::Done(StageEnd::Stopped)
    }
}

/// Gate the answer. A cut-off answer is truncation, a refusal or a safety
/// block is a refusal, no content is an empty answer: each its own outcome,
/// not a parse error (row S8).
fn judge(stage: &Stage, answer: &ChatAnswer, max_tokens: u64) -> Result<GateOutput, Judged> {
    if answer.finish_reason == FinishReason::Length {
        return Err(Judged::Truncated(max_tokens));
    }
    let blank = answer
        .content
        .as_deref()
        .is_none_or(|t| t.trim().is_empty());
    match &answer.refusal {
        Some(r) if !r.is_empty() => return Err(Judged::Refused(r.clone())),
        _ if blank && answer.finish_reason == FinishReason::ContentFilter => {
            return Err(Judged::Refused(
                "blocked by the provider's content filter (finish_reason content_filter)".into(),
            ));
        }
        _ => {}
    }
    match &answer.content {
        Some(text) if !blank => stage.gate.check(text).map_err(Judged::Gate),
        _ => Err(Judged::Empty(answer.finish_reason.as_str().to_string())),
    }
}

#[derive(Debug)]
enum Judged {
    Truncated(u64),
    Refused(String),
    /// No content (with this finish reason).
    Empty(String),
    Gate(GateFailure),
}

impl Judged {
    /// The attempt's `error_kind`, and the first word of the item's error.
    fn kind(&self) -> &'static str {
        match self {
            Judged::Truncated(_) => "output_truncated",
            Judged::Refused(_) => "refused",
            Judged::Empty(_) => "empty",
            Judged::Gate(_) => "gate",
        }
    }
}

impl std::fmt::Display for Judged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Judged::Truncated(n) => write!(
                f,
                "output_truncated: the answer hit max_tokens ({n}) before it finished (finish_reason=length)"
            ),
            Judged::Refused(r) => write!(
                f,
                "refused: the model refused: {}",
                docket_model::sanitize::truncate(r, 200)
            ),
            Judged::Empty(finish) => write!(
                f,
                "empty: the answer has no content (finish_reason={finish})"
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
