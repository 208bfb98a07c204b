//! An attempt that was answered (or, in a batch, never ran): the answer
//! paid for and judged against the stage's gate, then passed, asked again
//! differently, or given up on.

use std::sync::atomic::Ordering::Relaxed;

use super::{Job, Next, StageEnd, Via};
use crate::ctx::{Ctx, StopCause};
use crate::gate::{GateFailure, GateOutput};
use crate::stages::Stage;
use docket_ledger::writer::{AttemptRecord, WriteOp};
use docket_providers::limiter::Reservation;
use docket_providers::{ChatAnswer, FinishReason};

/// A batch line that never ran: not billed. It goes again (a new batch, or
/// synchronously) unless the run is stopping or, under `best_effort`, its
/// sends are used up.
pub(super) async fn on_not_run(
    ctx: &Ctx,
    job: &mut Job<'_>,
    base: AttemptRecord,
    why: String,
) -> Next {
    // Never run is the provider's doing, not the request's: `exact` (and
    // `throughput`) send it again until it runs, spending none of its
    // budget; `best_effort` counts it, so the session can finish.
    let counted = ctx.p.completion_mode.not_run_spends_budget();
    if counted {
        job.transport_failures += 1;
    }
    let stopping = ctx.soft_stop.is_cancelled();
    let exhausted = counted && job.transport_failures >= job.stage.max_transport_attempts;
    let rec = AttemptRecord {
        state: "failed",
        error_kind: Some("not_run".into()),
        error_message: Some(why.clone()),
        // Kept as a transport retry only when it counts, so a resume
        // starts from the same budget.
        transport_failure: counted,
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
pub(super) async fn on_answer(
    ctx: &Ctx,
    job: &mut Job<'_>,
    base: AttemptRecord,
    answer: &ChatAnswer,
    reservation: Option<Reservation>,
) -> Next {
    let cost = pay_for_answer(ctx, job, answer, reservation);
    let rec = answered_record(base, answer, cost, job.stage.send_body);
    // An answer breaks any run of alike failures.
    job.streak = None;
    match judge(job.stage, answer, job.max_tokens) {
        Ok(out) => {
            ctx.gate_watch.passed(job.stage.index);
            Next::Done(StageEnd::Passed(out, rec))
        }
        Err(reason) => on_judged_failed(ctx, job, answer, reason, rec).await,
    }
}

/// The answer's cost (its usage at the stage's price, or its worst case
/// without usage) settled against the budget; the limiter, the breakers and
/// the refusal watch told the provider answered.
fn pay_for_answer(
    ctx: &Ctx,
    job: &Job<'_>,
    answer: &ChatAnswer,
    reservation: Option<Reservation>,
) -> f64 {
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
        crate::reach_probe::healed(ctx, job.stage.index, open_for);
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
    cost
}

/// The answer failed its judgement: asked again (differently: never the
/// same request for the same answer), or the stage given up on.
async fn on_judged_failed(
    ctx: &Ctx,
    job: &mut Job<'_>,
    answer: &ChatAnswer,
    reason: Judged,
    rec: AttemptRecord,
) -> Next {
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
        let msg = format!("{reason} (not asked again: the same request would get the same answer)");
        return Next::Done(StageEnd::Failed(msg, Some(rec)));
    }
    ctx.stats.retries.fetch_add(1, Relaxed);
    if ctx.write(job.item, WriteOp::Attempt(rec)).await {
        Next::Retry
    } else {
        Next::Done(StageEnd::Stopped)
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

/// Gate the answer. A cut-off answer is truncation, a refusal or a safety
/// block is a refusal, no content is an empty answer: each its own outcome,
/// not a parse error (row S8).
fn judge(stage: &Stage, answer: &ChatAnswer, max_tokens: u64) -> Result<GateOutput, Judged> {
    if stage.send_body {
        return judge_as_written(stage, answer);
    }
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

/// A request sent as written is answered as the provider answered it: a
/// truncated, refused or empty answer is its answer (sending the same body
/// again would get the same), so only the gate can fail it. Without a
/// confidence in it, an answer is accepted.
fn judge_as_written(stage: &Stage, answer: &ChatAnswer) -> Result<GateOutput, Judged> {
    let text = answer.content.as_deref().unwrap_or_default();
    let mut out = if text.trim().is_empty() {
        GateOutput {
            answer: serde_json::Value::Null,
            confidence: None,
            rationale: None,
        }
    } else {
        stage.gate.check(text).map_err(Judged::Gate)?
    };
    out.confidence.get_or_insert(1.0);
    Ok(out)
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

/// The attempt's record of an answer. A request sent as written keeps the
/// provider's whole answer body as its output (what `docket run
/// --requests` writes out), compact, instead of only its text.
fn answered_record(base: AttemptRecord, a: &ChatAnswer, cost: f64, whole: bool) -> AttemptRecord {
    let u = a.usage;
    let text = || a.content.clone().or_else(|| a.refusal.clone());
    AttemptRecord {
        state: "answered",
        output: if whole {
            a.body.clone().or_else(text)
        } else {
            text()
        },
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
