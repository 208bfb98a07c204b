//! Sending an attempt: the budget held for it, then either one synchronous
//! send under the rate limits and the request's deadline, or the line
//! handed to the stage's batcher.

use std::sync::atomic::Ordering::Relaxed;

use super::{Job, Sent, Via, custom_id};
use crate::as_written::{body_model, request_body};
use crate::batching::Reply;
use crate::ctx::{Ctx, StopCause};
use crate::template::Prompt;
use docket_ledger::writer::{AttemptRecord, SendIntent, WriteOp};
use docket_providers::limiter::{Reservation, Slot};
use docket_providers::{ChatAnswer, ChatRequest, ErrorClass, ProviderError};

/// Hold `worst` of the budget for a send; when it would pass the budget,
/// stop the session (paused, resumable) instead.
fn reserve(ctx: &Ctx, worst: f64) -> bool {
    if ctx.budget.try_reserve(worst) {
        return true;
    }
    ctx.stop(StopCause::Budget(format!(
        "{}: ${:.4} spent of ${:.4}; the next request could cost up to ${:.4}",
        crate::budget::BUDGET_REACHED,
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
pub(crate) fn prompt_tokens(stage: &crate::stages::Stage, prompt: &crate::template::Prompt) -> u64 {
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
pub(crate) fn over_token_limit(stage: &crate::stages::Stage, prompt_tokens: u64) -> Option<String> {
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
pub(super) async fn send_sync(ctx: &Ctx, job: &mut Job<'_>, slot: Option<Slot>) -> Sent {
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
    let Some((slot, reservation)) = wait_for_room(ctx, job, slot).await else {
        ctx.budget.settle(job.worst_cost, 0.0);
        return Sent::Stopped;
    };
    let request = match record_intent(ctx, job).await {
        Ok(request) => request,
        Err(sent) => {
            ctx.budget.settle(job.worst_cost, 0.0);
            return sent;
        }
    };
    let started = std::time::Instant::now();
    let (result, cut) = send_before_deadline(ctx, job, &request, started).await;
    drop(slot);
    job.cuts += u32::from(cut);
    let base = job.record(ctx, started);
    if let Some(Ok(_)) = &result {
        job.rt(ctx).deadline.answered(started.elapsed());
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

/// Wait for a slot and the tokens under the stage's rate limits, then for
/// the run to be neither paused nor cut off from the provider. None when
/// the run stops meanwhile.
async fn wait_for_room(
    ctx: &Ctx,
    job: &Job<'_>,
    slot: Option<Slot>,
) -> Option<(Slot, Reservation)> {
    let slot = match slot {
        Some(s) => s,
        None => tokio::select! {
            s = job.rt(ctx).limiter.acquire_slot() => s,
            _ = ctx.soft_stop.cancelled() => return None,
        },
    };
    let reservation = tokio::select! {
        r = job.rt(ctx).limiter.reserve(job.est_prompt + job.max_tokens) => r,
        _ = ctx.soft_stop.cancelled() => return None,
    };
    // A pause that came while this send waited for the rate limits holds it
    // too: nothing leaves while paused, or while the provider is unreachable.
    if !ctx.wait_unpaused().await
        || !ctx
            .reach_watch
            .wait_closed(job.stage.index, &ctx.soft_stop)
            .await
    {
        return None;
    }
    Some((slot, reservation))
}

/// Number the attempt and put its intent on record before a byte leaves;
/// the request to send. Err with how the attempt ended when it cannot be.
async fn record_intent(ctx: &Ctx, job: &mut Job<'_>) -> Result<ChatRequest, Sent> {
    let Some(prompt) = job.prompt.as_ref() else {
        return Err(Sent::Stopped);
    };
    let body = request_body(job.stage, prompt).map_err(Sent::RenderFailed)?;
    job.attempt += 1;
    job.note_seen();
    let client_request_id = custom_id(ctx, job.request_id, job.attempt);
    let intent = SendIntent {
        session_id: ctx.session_id.clone(),
        request_id: job.request_id,
        attempt: job.attempt,
        client_request_id: client_request_id.clone(),
        system_prompt: prompt.system.clone(),
        user_prompt: prompt.user.clone(),
        evidence_hash: job.item.evidence_hash.clone(),
    };
    // Intent before side effect: the attempt is on disk before a byte leaves.
    if !ctx.write(job.item, WriteOp::Send(intent)).await {
        return Err(Sent::LedgerFailed);
    }
    docket_model::failpoint::hit("after_intent");
    Ok(ChatRequest {
        model: body_model(job.stage, body.as_deref()),
        system: prompt.system.clone(),
        user: prompt.user.clone(),
        max_tokens: job.max_tokens,
        temperature: job.stage.temperature,
        response_schema: job.response_schema(),
        structured_output: job.stage.structured_output,
        thinking_budget: job.stage.thinking_budget,
        client_request_id,
        timeout: job.stage.request_timeout,
        body,
    })
}

/// Send, racing the stage's deadline and a hard stop. None when the hard
/// stop came first; true with the error when the deadline cut the request.
async fn send_before_deadline(
    ctx: &Ctx,
    job: &Job<'_>,
    request: &ChatRequest,
    started: std::time::Instant,
) -> (Option<Result<ChatAnswer, ProviderError>>, bool) {
    ctx.stats.in_flight.fetch_add(1, Relaxed);
    ctx.stats.sent.fetch_add(1, Relaxed);
    let deadline = &job.rt(ctx).deadline;
    let in_flight = deadline.begin();
    let mut cut = false;
    let result = tokio::select! {
        // An answer that is there wins over a deadline that is also due.
        biased;
        r = job.rt(ctx).provider.send(request) => Some(r),
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
    (result, cut)
}

/// Hand the request to the batcher: the line holds its prompt and its
/// share of the budget until its batch is recorded; its result comes to a
/// new task (see `batching::Deliver`).
pub(super) fn via_batch(
    ctx: &Ctx,
    b: &std::sync::Arc<crate::batching::Batcher>,
    job: &mut Job<'_>,
) -> Sent {
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
    let body = match request_body(job.stage, &prompt) {
        Ok(body) => body,
        Err(message) => {
            ctx.budget.settle(worst, 0.0);
            return Sent::RenderFailed(message);
        }
    };
    let request = ChatRequest {
        model: body_model(job.stage, body.as_deref()),
        system: prompt.system,
        user: prompt.user,
        max_tokens: job.max_tokens,
        temperature: job.stage.temperature,
        response_schema: job.response_schema(),
        structured_output: job.stage.structured_output,
        thinking_budget: job.stage.thinking_budget,
        client_request_id: id,
        timeout: job.stage.request_timeout,
        body,
    };
    let item = (job.item.item_id.clone(), job.item.claim_token);
    let evidence_hash = job.item.evidence_hash.clone();
    b.enqueue(job.request_id, attempt, request, item, evidence_hash, worst);
    Sent::Parked
}

/// A batch line's result as an attempt's outcome.
pub(super) fn batch_reply(
    ctx: &Ctx,
    job: &mut Job<'_>,
    reply: Reply,
    started: std::time::Instant,
) -> Sent {
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
