//! One item through the job's stages, in order: each stage runs only when
//! every stage before it passed (so a critic never judges an output that
//! failed its gate), sees their outputs in its template, and the item's
//! outcome is routed only once every stage — the critic included — is over.
//! A stage that fails ends the item as `error` and the later ones are
//! skipped. Each stage's end commits with its last attempt; the last
//! stage's end commits with the outcome.

use std::ops::Range;

use serde_json::{Map, Value};

use super::attempt::{Counters, Job, StageEnd, run_request};
use super::batching::Delivered;
use super::ctx::Ctx;
use super::stages::{Routed, Stage, route};
use crate::gate::GateOutput;
use docket_ledger::store::{StageWork, WorkItem};
use docket_ledger::writer::{AttemptRecord, FinalResult, StageDone, WriteOp};
use docket_model::routing::Outcome;
use docket_providers::limiter::Slot;

/// How an item's turn through [`process`] ended, for its claim.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Ended {
    /// Its outcome committed, and with it the end of its lease.
    Settled,
    /// It waits as a line for a provider batch, whose record lets go of it.
    Parked,
    /// No outcome (a stop, a stop-after-stage, a later group's stage, a
    /// write that failed): the caller lets go of it.
    Open,
}

/// Run `item` through the stages of `group` (the stages before it must have
/// passed; the ones after it belong to a later group), applying `delivered`
/// (a batch line's result) to the request it answers. Returns when the item
/// has its outcome, waits at a stop-after-stage, the session stops, or it
/// waits as a line for a provider batch.
/// A request's handling with a panic in it (a bug: in a parser, a gate)
/// confined to its item (fault-matrix row P6): Err is the panic's message,
/// and every other item goes on.
async fn confined(run: impl std::future::Future<Output = StageEnd>) -> Result<StageEnd, String> {
    use futures::FutureExt;
    std::panic::AssertUnwindSafe(Box::pin(run))
        .catch_unwind()
        .await
        .map_err(|panic| {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".into());
            tracing::error!("a request's handling panicked: {what}");
            what
        })
}

/// Run a stage's request, again after a panic in its handling (row P6):
/// the attempt the panic left open is closed as ambiguous (it may have been
/// sent and billed) and the request goes again under the next attempt
/// number, up to the stage's `max_attempts` panics; then the item fails
/// with the panic's message.
async fn run_confined(
    ctx: &Ctx,
    item: &WorkItem,
    stage: &super::stages::Stage,
    sw: &StageWork,
    extra: &Map<String, Value>,
    mut delivered: Option<Delivered>,
    mut slot: Option<Slot>,
) -> StageEnd {
    let mut counters = counters(sw);
    let mut panics = 0u32;
    loop {
        let seen = std::sync::Arc::new(super::attempt::Seen::starting_at(counters.attempt));
        let job = match Job::new(item, stage, sw.request_id, counters, extra.clone()) {
            Ok(job) => job.with_delivered(delivered.take()).seen_in(seen.clone()),
            Err(message) => return StageEnd::Failed(message, None),
        };
        let what = match confined(run_request(ctx, job, slot.take())).await {
            Ok(end) => return end,
            Err(what) => what,
        };
        panics += 1;
        let attempt = seen.attempt();
        let message = format!(
            "internal error while handling this item (a docket bug; please report it): {what}"
        );
        // A send may have left under this number (or a batch line's
        // result under the last one was being applied): an attempt still
        // 'sent' is closed as ambiguous; one already closed stays.
        if attempt > 0 {
            let abandon = WriteOp::Abandon {
                session_id: ctx.session_id.clone(),
                request_id: sw.request_id,
                attempt,
                message: format!("{message}; it may have been billed"),
            };
            if !ctx.write(item, abandon).await {
                return StageEnd::Stopped;
            }
        }
        if panics >= stage.max_attempts.max(1) {
            return StageEnd::Failed(format!("{message} ({panics} times)"), None);
        }
        ctx.event(
            "warn",
            "internal_error",
            format!(
                "item {}: {message}; sending it again",
                docket_model::sanitize::truncate(&item.item_id, 60)
            ),
        );
        counters = Counters {
            attempt,
            gate_failures: sw.gate_failures,
            transport_retries: sw.transport_retries,
        };
    }
}

pub(super) async fn process(
    ctx: &Ctx,
    item: WorkItem,
    group: Range<usize>,
    slot: Option<Slot>,
    delivered: Option<Delivered>,
) -> Ended {
    let p = &ctx.p;
    let n = p.stages.len();
    let mut outputs: Vec<Option<Value>> = vec![None; n];
    let mut slot = slot;
    let mut delivered = delivered;
    for k in 0..n {
        let stage = &p.stages[k];
        let Some(sw) = stage_work(&item, &stage.name) else {
            // A session from another job shape: nothing to run here.
            tracing::warn!(item = %item.item_id, stage = %stage.name, "no request for the stage");
            return Ended::Open;
        };
        match sw.state.as_str() {
            "passed" => {
                outputs[k] = sw
                    .output_json
                    .as_deref()
                    .or(sw.parsed_output_json.as_deref())
                    .and_then(|s| serde_json::from_str(s).ok());
                if outputs[k].is_some() {
                    if k + 1 == n {
                        // Every stage passed but the outcome was never
                        // written (a crash between): route it now.
                        return finish(ctx, &item, &outputs, None, None).await;
                    }
                    continue;
                }
            }
            "failed" | "skipped" => return Ended::Open,
            _ => {}
        }
        if k < group.start || k >= group.end {
            // Not this group's stage: an earlier group left it (a stop), or
            // a later group runs it.
            return Ended::Open;
        }
        if k > 0 && ctx.stops_before(k) {
            // Stop after stage k-1: the item waits here for a resume.
            return Ended::Open;
        }
        let extra = context(p, k, &outputs);
        let end = if sw.status == "completed"
            && let Some(parsed) = sw.parsed_output_json.as_deref()
            && let Ok(answer) = serde_json::from_str::<Value>(parsed)
        {
            // Answered before with the same template and parameters (this
            // session before a stop, or an earlier one): reused, not paid again.
            let (cf, rf) = stage.gate.fields();
            StageEnd::Passed(
                GateOutput {
                    confidence: answer.get(cf).and_then(Value::as_f64),
                    rationale: answer.get(rf).and_then(Value::as_str).map(str::to_string),
                    answer,
                },
                AttemptRecord::default(),
            )
        } else {
            // A batch line's result is for the request it answered.
            let d = delivered.take_if(|d| d.request_id == sw.request_id);
            run_confined(ctx, &item, stage, sw, &extra, d, slot.take()).await
        };
        let reused = sw.status == "completed";
        match end {
            StageEnd::Stopped => return Ended::Open,
            StageEnd::Parked => return Ended::Parked,
            StageEnd::Failed(message, rec) => {
                return fail(ctx, &item, k, sw, message, rec).await;
            }
            StageEnd::GateSpent(message, rec) => {
                let to_review = FailedAs::Review(answered_before(p, k, &outputs));
                return fail_with(ctx, &item, k, sw, message, rec, true, to_review).await;
            }
            StageEnd::Passed(out, rec) => {
                let rec = (!reused).then_some(rec);
                let parsed = serde_json::to_string(&out.answer).ok();
                let mut output = out.answer;
                if !stage.criteria.is_empty() {
                    // Structured batching: the request's own answer is kept
                    // on it; the criteria it left out are asked one by one.
                    let first = StageDone {
                        output_json: None,
                        settle_item: false,
                        ..stage_done(ctx, &item, stage, sw, true, parsed.clone())
                    };
                    if !ctx.write(&item, WriteOp::Stage(rec, first)).await {
                        return Ended::Open;
                    }
                    match Box::pin(fill_criteria(ctx, &item, stage, &extra, &mut output)).await {
                        Filled::All => {}
                        Filled::Stopped => return Ended::Open,
                        Filled::Failed(message, rec, gate_spent) => {
                            // The stage's own answer passed (and was paid
                            // for): it stays reusable; only the item fails
                            // (or, its follow-up's answers all failing the
                            // gate, goes to review: row S7).
                            let ends = if gate_spent {
                                FailedAs::Review(answered_before(p, k, &outputs))
                            } else {
                                FailedAs::Error
                            };
                            return fail_with(ctx, &item, k, sw, message, rec, false, ends).await;
                        }
                    }
                    let merged = StageDone {
                        parsed_json: None,
                        output_json: serde_json::to_string(&output).ok(),
                        ..stage_done(ctx, &item, stage, sw, true, None)
                    };
                    outputs[k] = Some(output);
                    if k + 1 == n {
                        return finish(ctx, &item, &outputs, None, Some(merged)).await;
                    }
                    if !ctx.write(&item, WriteOp::Stage(None, merged)).await {
                        return Ended::Open;
                    }
                    continue;
                }
                let done = StageDone {
                    output_json: parsed.clone(),
                    ..stage_done(ctx, &item, stage, sw, true, parsed)
                };
                outputs[k] = Some(output);
                if k + 1 == n {
                    return finish(ctx, &item, &outputs, rec, Some(done)).await;
                }
                if !ctx.write(&item, WriteOp::Stage(rec, done)).await {
                    return Ended::Open;
                }
            }
        }
    }
    Ended::Open
}

fn stage_work<'a>(item: &'a WorkItem, stage: &str) -> Option<&'a StageWork> {
    item.stages.iter().find(|s| s.stage == stage)
}

fn counters(sw: &StageWork) -> Counters {
    Counters {
        attempt: sw.attempt,
        gate_failures: sw.gate_failures,
        transport_retries: sw.transport_retries,
    }
}

/// What stage `k`'s templates see besides the item: every earlier stage's
/// output by name (`stages.NAME.FIELD`), a critic's `target` (the output it
/// judges) and `criteria`.
fn context(p: &super::Prepared, k: usize, outputs: &[Option<Value>]) -> Map<String, Value> {
    let mut stages = Map::new();
    for (j, out) in outputs.iter().enumerate().take(k) {
        if let Some(o) = out {
            stages.insert(p.stages[j].name.clone(), o.clone());
        }
    }
    // Only what a stage can use: the first stage of a one-stage job gets
    // nothing extra (no allocation per item on the hot path).
    let mut extra = Map::new();
    if k > 0 {
        extra.insert("stages".into(), Value::Object(stages));
    }
    let stage = &p.stages[k];
    if let Some(t) = stage.critic_of.and_then(|c| outputs[c].clone()) {
        extra.insert("target".into(), t);
    }
    if !stage.criteria.is_empty() {
        extra.insert(
            "criteria".into(),
            Value::Array(stage.criteria.iter().cloned().map(Value::String).collect()),
        );
    }
    extra
}

fn stage_done(
    ctx: &Ctx,
    item: &WorkItem,
    stage: &Stage,
    sw: &StageWork,
    passed: bool,
    parsed_json: Option<String>,
) -> StageDone {
    request_done(ctx, item, &stage.name, sw.request_id, passed, parsed_json)
}

/// The end of one request of an item (`stage` is its row's name: a stage,
/// or `STAGE:CRITERION`).
fn request_done(
    ctx: &Ctx,
    item: &WorkItem,
    stage: &str,
    request_id: i64,
    passed: bool,
    parsed_json: Option<String>,
) -> StageDone {
    StageDone {
        session_id: ctx.session_id.clone(),
        item_id: item.item_id.clone(),
        stage: stage.to_string(),
        request_id,
        passed,
        parsed_json,
        output_json: None,
        error_message: None,
        skipped: Vec::new(),
        settle_item: true,
        update_request: true,
    }
}

/// Stage `k` failed: the item's outcome is `error`, the later stages are
/// skipped, all in one transaction with the last attempt.
async fn fail(
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
enum FailedAs<'a> {
    Error,
    /// In human review (row S7: every answer failed the gate), with the
    /// answer stage's output as the suggestion when that stage had passed
    /// (a critic's answers failed), else with none: the stage's raw
    /// answers are what the reviewer reads, and the item can be rejected
    /// (a later run asks again), not accepted.
    Review(Option<&'a Value>),
}

/// The answer stage's output when it passed before stage `k`.
fn answered_before<'a>(
    p: &super::Prepared,
    k: usize,
    outputs: &'a [Option<Value>],
) -> Option<&'a Value> {
    (k > p.answer).then(|| outputs[p.answer].as_ref()).flatten()
}

/// Stage `k` failed: the item ends as `ends` says, its later stages
/// skipped; `update_request` false leaves the stage's own request as it is
/// (its answer passed; a criterion's follow-up failed).
#[allow(clippy::too_many_arguments)]
async fn fail_with(
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
async fn finish(
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
    let gate_out = GateOutput {
        confidence: answer.get(cf).and_then(Value::as_f64),
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
    } = route(&p.thresholds, &gate_out, critic);
    let (outcome, note) = if p.flag_injection {
        flag_injection(outcome, note, &item.evidence_json)
    } else {
        (outcome, note)
    };
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
    };
    record_final(ctx, item, rec, fin).await
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

// Matched at once by the caller; not kept.
#[allow(clippy::large_enum_variant)]
enum Filled {
    All,
    Stopped,
    /// With whether every answer failed the gate (row S7: the item goes to
    /// review, not to `error`).
    Failed(String, Option<AttemptRecord>, bool),
}

/// Structured batching: ask each criterion the stage's answer left out on
/// its own (the same template with `criteria` = just that one), merging
/// each answer in. Each follow-up is its own request ("STAGE:CRITERION"),
/// under the same limits and budgets.
async fn fill_criteria(
    ctx: &Ctx,
    item: &WorkItem,
    stage: &Stage,
    extra: &Map<String, Value>,
    output: &mut Value,
) -> Filled {
    let missing: Vec<String> = stage
        .criteria
        .iter()
        .filter(|c| output.get(c.as_str()).is_none_or(Value::is_null))
        .cloned()
        .collect();
    for criterion in missing {
        let name = format!("{}:{criterion}", stage.name);
        let mut made_attempts = 0;
        let (request_id, sw) = match stage_work(item, &name) {
            Some(sw) if sw.state == "passed" => {
                if let Some(v) = sw
                    .output_json
                    .as_deref()
                    .and_then(|s| serde_json::from_str::<Value>(s).ok())
                    .and_then(|v| v.get(&criterion).cloned())
                {
                    merge(output, &criterion, v);
                    continue;
                }
                (sw.request_id, Some(sw))
            }
            Some(sw) => (sw.request_id, Some(sw)),
            None => match ctx.follow_up(item, stage, &name).await {
                Some(docket_ledger::writer::MadeRequest {
                    request_id: id,
                    answered: Some(parsed),
                    attempts,
                }) => {
                    made_attempts = attempts;
                    // The same question was answered before: reused.
                    let v = serde_json::from_str::<Value>(&parsed)
                        .ok()
                        .and_then(|a| a.get(&criterion).cloned())
                        .filter(|v| !v.is_null());
                    if let Some(v) = v {
                        let reused = StageDone {
                            output_json: Some(parsed),
                            ..request_done(ctx, item, &name, id, true, None)
                        };
                        if !ctx.write(item, WriteOp::Stage(None, reused)).await {
                            return Filled::Stopped;
                        }
                        merge(output, &criterion, v);
                        continue;
                    }
                    (id, None)
                }
                Some(made) => {
                    made_attempts = made.attempts;
                    (made.request_id, None)
                }
                None => return Filled::Stopped,
            },
        };
        let mut extra = extra.clone();
        extra.insert(
            "criteria".into(),
            Value::Array(vec![Value::String(criterion.clone())]),
        );
        // A request made now may have attempts from an earlier session:
        // new ones are numbered after them.
        let counters = sw.map(counters).unwrap_or(Counters {
            attempt: made_attempts,
            gate_failures: 0,
            transport_retries: 0,
        });
        let job = match Job::new(item, stage, request_id, counters, extra) {
            Ok(job) => job
                .with_schema(criterion_schema(stage, &criterion))
                .sync_only(),
            Err(message) => return Filled::Failed(message, None, false),
        };
        let done = |passed: bool, parsed: Option<String>, error: Option<String>| StageDone {
            output_json: parsed.clone(),
            error_message: error,
            ..request_done(ctx, item, &name, request_id, passed, parsed)
        };
        let end = Box::pin(run_request(ctx, job, None)).await;
        let gate_spent = matches!(end, StageEnd::GateSpent(..));
        match end {
            // (A follow-up never waits in a batch: it is sync only.)
            StageEnd::Stopped | StageEnd::Parked => return Filled::Stopped,
            StageEnd::Failed(message, rec) | StageEnd::GateSpent(message, rec) => {
                let m = format!("criterion {criterion}, asked on its own: {message}");
                if !ctx
                    .write(
                        item,
                        WriteOp::Stage(rec, done(false, None, Some(m.clone()))),
                    )
                    .await
                {
                    return Filled::Stopped;
                }
                return Filled::Failed(m, None, gate_spent);
            }
            StageEnd::Passed(out, rec) => {
                let Some(v) = out.answer.get(&criterion).filter(|v| !v.is_null()).cloned() else {
                    // Asked for it alone and still left out: that answer
                    // does not do; the stage fails rather than guess.
                    let m = format!(
                        "criterion {criterion}: asked on its own, the answer still leaves it out"
                    );
                    if !ctx
                        .write(
                            item,
                            WriteOp::Stage(Some(rec), done(false, None, Some(m.clone()))),
                        )
                        .await
                    {
                        return Filled::Stopped;
                    }
                    return Filled::Failed(m, None, false);
                };
                let parsed = serde_json::to_string(&out.answer).ok();
                if !ctx
                    .write(item, WriteOp::Stage(Some(rec), done(true, parsed, None)))
                    .await
                {
                    return Filled::Stopped;
                }
                merge(output, &criterion, v);
            }
        }
    }
    Filled::All
}

/// The stage's structured-output schema narrowed to one criterion, now
/// required: the other criteria are left out, the stage's required fields
/// stay. (The stage's own gate still checks the answer.)
fn criterion_schema(stage: &Stage, criterion: &str) -> Option<std::sync::Arc<(String, Value)>> {
    let (name, schema) = stage.response_schema.as_deref()?;
    let mut schema = schema.clone();
    if let Some(Value::Object(props)) = schema.get_mut("properties") {
        props.retain(|k, _| k == criterion || !stage.criteria.iter().any(|c| c == k));
    }
    if let Some(obj) = schema.as_object_mut() {
        let req = obj
            .entry("required")
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Value::Array(a) = req
            && !a.iter().any(|v| v.as_str() == Some(criterion))
        {
            a.push(Value::String(criterion.to_string()));
        }
    }
    Some(std::sync::Arc::new((name.clone(), schema)))
}

fn merge(output: &mut Value, criterion: &str, v: Value) {
    if let Value::Object(m) = output {
        m.insert(criterion.to_string(), v);
    }
}
