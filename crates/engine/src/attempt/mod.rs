//! One request of one item at one stage: render, reserve, record the
//! intent, send (synchronously or in a provider batch), judge the answer,
//! retry within the budgets. The caller records how the stage ended (a pass
//! with its attempt, or the item's error), so a stage's end and the item's
//! outcome commit together.

mod answer;
mod failure;
mod send;

use answer::{on_answer, on_not_run};
use failure::{Resend, on_error};
use send::{batch_reply, send_sync, via_batch};
pub(super) use send::{over_token_limit, prompt_tokens};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use serde_json::{Map, Value};

use super::batching::{Delivered, Reply};
use super::ctx::{Ctx, StageRt};
use super::stages::Stage;
use crate::gate::GateOutput;
use crate::template::Prompt;
use docket_ledger::store::WorkItem;
use docket_ledger::writer::{AttemptRecord, WriteOp};
use docket_providers::limiter::{Reservation, Slot};
use docket_providers::{ChatAnswer, ErrorClass, ProviderError};

/// A truncated answer's retries grow max_tokens up to this many times the
/// stage's.
const TRUNCATION_GROWTH: u64 = 4;
/// ... and never past this many output tokens.
const TRUNCATION_CEILING: u64 = 8_192;

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
    /// Render the prompt (or take `rendered`, the stage's template
    /// rendered with `extra` already); a prompt that cannot be rendered is
    /// the item's error at once.
    pub(super) fn new(
        item: &'a WorkItem,
        stage: &'a Stage,
        request_id: i64,
        counters: Counters,
        extra: Map<String, Value>,
        rendered: Option<Prompt>,
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
        let prompt = match rendered {
            // Not the repair prompt: that one needs the answers that failed.
            Some(prompt) if !job.stage.template_for(job.gate_failures).1 => prompt,
            _ => job.render()?,
        };
        job.est_prompt = prompt_tokens(stage, &prompt);
        job.worst_cost =
            stage
                .price
                .cost(job.est_prompt, 0, job.max_tokens + stage.thinking_allowance);
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
        self.worst_cost = self.stage.price.cost(
            self.est_prompt,
            0,
            self.max_tokens + self.stage.thinking_allowance,
        );
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
