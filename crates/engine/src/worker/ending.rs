//! How an item's run ends in the ledger: every stage passed and the outcome
//! routed (the critic's verdict included), or a stage failed and the item
//! ends as `error` (or in review), its later stages skipped.

use serde_json::Value;

use super::{Ended, stage_done, stage_work};
use crate::ctx::Ctx;
use crate::gate::GateOutput;
use crate::stages::{Routed, route};
use crate::template::Prompt;
use docket_ledger::store::{StageWork, WorkItem};
use docket_ledger::writer::{AttemptRecord, FinalResult, StageDone, WriteOp};
use docket_model::routing::Outcome;

/// Stage `k` failed: the item's outcome is `error`, the later stages are
/// skipped, all in one transaction with the last attempt.
pub(super) async fn fail(
    ctx: &Ctx,
    item: &WorkItem,
    k: usize,
    sw: &StageWork,
    message: String,
    rec: Option<AttemptRecord>,
) -> Ended {
    fail_with(ctx, item, k, sw, message, rec, true, FailedAs::Error).await
}

/// How an item whose stage failed ends.
pub(super) enum FailedAs<'a> {
    Error,
    /// In human review (row S7: every answer failed the gate), with the
    /// answer stage's output as the suggestion when that stage had passed
    /// (a critic's answers failed), else with none: the stage's raw
    /// answers are what the reviewer reads, and the item can be rejected
    /// (a later run asks again), not accepted.
    Review(Option<&'a Value>),
}

/// The answer stage's output when it passed before stage `k`.
pub(super) fn answered_before<'a>(
    p: &crate::Prepared,
    k: usize,
    outputs: &'a [Option<Value>],
) -> Option<&'a Value> {
    (k > p.answer).then(|| outputs[p.answer].as_ref()).flatten()
}

/// Stage `k` failed: the item ends as `ends` says, its later stages
/// skipped; `update_request` false leaves the stage's own request as it is
/// (its answer passed; a criterion's follow-up failed).
#[allow(clippy::too_many_arguments)]
pub(super) async fn fail_with(
    ctx: &Ctx,
    item: &WorkItem,
    k: usize,
    sw: &StageWork,
    message: String,
    rec: Option<AttemptRecord>,
    update_request: bool,
    ends: FailedAs<'_>,
) -> Ended {
    let p = &ctx.p;
    let stage = &p.stages[k];
    let done = StageDone {
        error_message: Some(message.clone()),
        skipped: p.stages[k + 1..].iter().map(|s| s.name.clone()).collect(),
        update_request,
        ..stage_done(ctx, item, stage, sw, false, None)
    };
    let answer = p.answer_stage();
    let said = if p.stages.len() > 1 {
        format!("stage {}: {message}", stage.name)
    } else {
        message
    };
    let mut fin = FinalResult {
        session_id: ctx.session_id.clone(),
        item_id: item.item_id.clone(),
        request_id: stage_work(item, &answer.name).map_or(sw.request_id, |a| a.request_id),
        stage: answer.name.clone(),
        outcome: Outcome::Error,
        answer_json: None,
        confidence: None,
        rationale: None,
        model_id: stage.model.clone(),
        error_message: None,
        critic_json: None,
        critic_verdict: None,
        routing_note: None,
        stage_done: Some(done),
        only_request: item.stages.len() == 1 && stage.criteria.is_empty(),
        audit: false,
    };
    match ends {
        FailedAs::Error => fin.error_message = Some(said),
        FailedAs::Review(suggestion) => {
            let (cf, rf) = answer.gate.fields();
            fin.outcome = Outcome::Review;
            // The reason stays in the error column too: exports and
            // batch-results show why a review row has no answer.
            fin.error_message = Some(said.clone());
            fin.answer_json = suggestion.and_then(|a| serde_json::to_string(a).ok());
            fin.confidence = suggestion.and_then(|a| a.get(cf)).and_then(Value::as_f64);
            fin.rationale = suggestion
                .and_then(|a| a.get(rf))
                .and_then(Value::as_str)
                .map(str::to_string);
            fin.routing_note = Some(match suggestion {
                Some(_) => format!(
                    "the answer is unchecked: no answer of stage {} passed its gate (its raw \
                     answers are kept below): {said}",
                    stage.name
                ),
                None => format!(
                    "no answer passed the gate, so there is nothing to accept: read the raw \
                     answers below, then reject it (a later run asks again): {said}"
                ),
            });
        }
    }
    record_final(ctx, item, rec, fin).await
}

/// Every stage passed: route on the answer stage (and the critic's
/// verdict) and record the outcome, with the last stage's end.
pub(super) async fn finish(
    ctx: &Ctx,
    item: &WorkItem,
    outputs: &[Option<Value>],
    rec: Option<AttemptRecord>,
    last: Option<StageDone>,
) -> Ended {
    let p = &ctx.p;
    let answer_stage = p.answer_stage();
    let answer = outputs[p.answer].clone().unwrap_or(Value::Null);
    let (cf, rf) = answer_stage.gate.fields();
    // A request sent as written needs no confidence: answered, it is accepted.
    let as_written = answer_stage.send_body.then_some(1.0);
    let gate_out = GateOutput {
        confidence: answer.get(cf).and_then(Value::as_f64).or(as_written),
        rationale: answer.get(rf).and_then(Value::as_str).map(str::to_string),
        answer: answer.clone(),
    };
    let critic = p
        .critic
        .as_ref()
        .and_then(|c| outputs[c.stage].as_ref().map(|o| (&c.rule, o)));
    let Routed {
        outcome,
        confidence,
        verdict,
        note,
    } = route(&ctx.thresholds(), &gate_out, critic);
    let (outcome, note) = if p.flag_injection {
        flag_injection(outcome, note, &item.evidence_json)
    } else {
        (outcome, note)
    };
    let audit = audit_pick(ctx, &item.item_id, outcome);
    let fin = FinalResult {
        session_id: ctx.session_id.clone(),
        item_id: item.item_id.clone(),
        request_id: stage_work(item, &answer_stage.name).map_or(0, |a| a.request_id),
        stage: answer_stage.name.clone(),
        outcome,
        answer_json: serde_json::to_string(&answer).ok(),
        confidence,
        rationale: gate_out.rationale,
        model_id: answer_stage.model.clone(),
        error_message: (outcome == Outcome::Error).then(|| {
            note.clone()
                .unwrap_or_else(|| "the answer could not be routed".into())
        }),
        critic_json: critic.and_then(|(_, o)| serde_json::to_string(o).ok()),
        critic_verdict: verdict,
        routing_note: note,
        stage_done: last,
        only_request: item.stages.len() == 1 && p.stages[p.answer].criteria.is_empty(),
        audit,
    };
    record_final(ctx, item, rec, fin).await
}

/// Whether the audit sample sends this accepted or rejected item to review
/// as well (`[routing] audit_accept_share`, `audit_reject_share`): decided
/// by a hash of session and item, so a resume or another worker decides
/// the same.
fn audit_pick(ctx: &Ctx, item_id: &str, outcome: Outcome) -> bool {
    let r = &ctx.p.config.config.routing;
    let share = match outcome {
        Outcome::Accepted => *r.audit_accept_share.get_ref(),
        Outcome::Rejected => *r.audit_reject_share.get_ref(),
        Outcome::Review | Outcome::Error => return false,
    };
    docket_model::calibration::audit_pick(&ctx.session_id, item_id, share)
}

/// An accept or a reject of an item whose evidence reads like a prompt
/// injection becomes a review, the signal named in the routing note (row
/// X3): the model's answer may have been bent by the text it judged.
fn flag_injection(
    outcome: Outcome,
    note: Option<String>,
    evidence_json: &str,
) -> (Outcome, Option<String>) {
    if !matches!(outcome, Outcome::Accepted | Outcome::Rejected) {
        return (outcome, note);
    }
    let Some(suspicion) = docket_model::injection::scan(evidence_json) else {
        return (outcome, note);
    };
    let flagged = format!("{}: {} -> review", suspicion.describe(), outcome.as_str());
    let note = match note {
        Some(n) => format!("{n}; {flagged}"),
        None => flagged,
    };
    (Outcome::Review, Some(note))
}

/// Commit the item's outcome (its lease ends with it) and count it.
async fn record_final(
    ctx: &Ctx,
    item: &WorkItem,
    rec: Option<AttemptRecord>,
    fin: FinalResult,
) -> Ended {
    let outcome = fin.outcome;
    if ctx.write(item, WriteOp::Final(rec, fin)).await {
        ctx.stats.record_outcome(outcome);
        Ended::Settled
    } else {
        Ended::Open
    }
}

/// Before anything is sent for an item: its prompts must render at every
/// stage (the later ones with stand-ins for the earlier outputs, as
/// planning checked them). One that lacks a field a template needs ends
/// in error here, with why, costing nothing; the other items go on. Only
/// an item nothing was sent for yet, from its first stage. Ok holds the
/// first stage's prompt when it was rendered here, for its request to
/// send rather than render it again.
pub(super) async fn unrenderable(
    ctx: &Ctx,
    item: &WorkItem,
    from_first_stage: bool,
    delivered: bool,
) -> Result<Option<Prompt>, Ended> {
    if !from_first_stage || delivered {
        return Ok(None);
    }
    let Some(first) = ctx.p.stages.first() else {
        return Ok(None);
    };
    let Some(sw) = stage_work(item, &first.name) else {
        return Ok(None);
    };
    if sw.state != "pending" || sw.attempt > 0 || sw.status == "completed" {
        return Ok(None);
    }
    // Evidence that is not JSON: the first stage's request says so.
    let Ok(evidence) = serde_json::from_str::<Value>(&item.evidence_json) else {
        return Ok(None);
    };
    match crate::renders::render_job(&ctx.p, &item.item_id, &evidence) {
        Ok(prompt) => Ok(prompt),
        Err(why) => Err(fail(ctx, item, 0, sw, why.message(), None).await),
    }
}
