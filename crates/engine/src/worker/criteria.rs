//! Structured batching: the criteria a stage's answer left out, asked one
//! by one (each its own request, `STAGE:CRITERION`) and merged into the
//! stage's output.

use serde_json::{Map, Value};

use super::{counters, request_done, stage_work};
use crate::attempt::{Counters, Job, StageEnd, run_request};
use crate::ctx::Ctx;
use crate::stages::Stage;
use docket_ledger::store::WorkItem;
use docket_ledger::writer::{AttemptRecord, StageDone, WriteOp};

#[allow(clippy::large_enum_variant)]
pub(super) enum Filled {
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
pub(super) async fn fill_criteria(
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
        let follow_up = FollowUp {
            ctx,
            item,
            stage,
            name: format!("{}:{criterion}", stage.name),
            criterion,
        };
        let (request_id, counters) = match follow_up.request().await {
            Request::Answered(v) => {
                merge(output, &follow_up.criterion, v);
                continue;
            }
            Request::Stopped => return Filled::Stopped,
            Request::Ask(request_id, counters) => (request_id, counters),
        };
        match follow_up.ask(extra, request_id, counters).await {
            Ok(v) => merge(output, &follow_up.criterion, v),
            Err(filled) => return filled,
        }
    }
    Filled::All
}

/// One criterion asked on its own, as request `name` ("STAGE:CRITERION").
struct FollowUp<'a> {
    ctx: &'a Ctx,
    item: &'a WorkItem,
    stage: &'a Stage,
    criterion: String,
    name: String,
}

/// Where a follow-up request stands before it is asked.
enum Request {
    /// Answered before (this session, or the same question earlier): the
    /// criterion's value, reused.
    Answered(Value),
    /// To ask, as this request, numbering its attempts after these.
    Ask(i64, Counters),
    Stopped,
}

impl FollowUp<'_> {
    /// The follow-up's request: the item's own when it has one, else made
    /// now (or found made before, and answered, by another session).
    async fn request(&self) -> Request {
        let (ctx, item, criterion) = (self.ctx, self.item, &self.criterion);
        match stage_work(item, &self.name) {
            Some(sw) if sw.state == "passed" => {
                if let Some(v) = sw
                    .output_json
                    .as_deref()
                    .and_then(|s| serde_json::from_str::<Value>(s).ok())
                    .and_then(|v| v.get(criterion).cloned())
                {
                    return Request::Answered(v);
                }
                Request::Ask(sw.request_id, counters(sw))
            }
            Some(sw) => Request::Ask(sw.request_id, counters(sw)),
            None => match ctx.follow_up(item, self.stage, &self.name).await {
                Some(docket_ledger::writer::MadeRequest {
                    request_id: id,
                    answered: Some(parsed),
                    attempts,
                }) => {
                    // The same question was answered before: reused.
                    let v = serde_json::from_str::<Value>(&parsed)
                        .ok()
                        .and_then(|a| a.get(criterion).cloned())
                        .filter(|v| !v.is_null());
                    let Some(v) = v else {
                        return Request::Ask(id, made_counters(attempts));
                    };
                    let reused = StageDone {
                        output_json: Some(parsed),
                        ..request_done(ctx, item, &self.name, id, true, None)
                    };
                    if !ctx.write(item, WriteOp::Stage(None, reused)).await {
                        return Request::Stopped;
                    }
                    Request::Answered(v)
                }
                Some(made) => Request::Ask(made.request_id, made_counters(made.attempts)),
                None => Request::Stopped,
            },
        }
    }

    /// Ask the criterion alone (synchronously) and record the answer; its
    /// value, or how filling the criteria ends.
    async fn ask(
        &self,
        extra: &Map<String, Value>,
        request_id: i64,
        counters: Counters,
    ) -> Result<Value, Filled> {
        let (ctx, item, stage, criterion) = (self.ctx, self.item, self.stage, &self.criterion);
        let mut extra = extra.clone();
        extra.insert(
            "criteria".into(),
            Value::Array(vec![Value::String(criterion.clone())]),
        );
        let job = match Job::new(item, stage, request_id, counters, extra, None) {
            Ok(job) => job
                .with_schema(criterion_schema(stage, criterion))
                .sync_only(),
            Err(message) => return Err(Filled::Failed(message, None, false)),
        };
        let done = |passed: bool, parsed: Option<String>, error: Option<String>| StageDone {
            output_json: parsed.clone(),
            error_message: error,
            ..request_done(ctx, item, &self.name, request_id, passed, parsed)
        };
        let end = Box::pin(run_request(ctx, job, None)).await;
        let gate_spent = matches!(end, StageEnd::GateSpent(..));
        let (rec, failure) = match end {
            // (A follow-up never waits in a batch: it is sync only.)
            StageEnd::Stopped | StageEnd::Parked => return Err(Filled::Stopped),
            StageEnd::Failed(message, rec) | StageEnd::GateSpent(message, rec) => (
                rec,
                format!("criterion {criterion}, asked on its own: {message}"),
            ),
            StageEnd::Passed(out, rec) => {
                if let Some(v) = out.answer.get(criterion).filter(|v| !v.is_null()).cloned() {
                    let parsed = serde_json::to_string(&out.answer).ok();
                    if !ctx
                        .write(item, WriteOp::Stage(Some(rec), done(true, parsed, None)))
                        .await
                    {
                        return Err(Filled::Stopped);
                    }
                    return Ok(v);
                }
                // Asked for it alone and still left out: that answer
                // does not do; the stage fails rather than guess.
                (
                    Some(rec),
                    format!(
                        "criterion {criterion}: asked on its own, the answer still leaves it out"
                    ),
                )
            }
        };
        if !ctx
            .write(
                item,
                WriteOp::Stage(rec, done(false, None, Some(failure.clone()))),
            )
            .await
        {
            return Err(Filled::Stopped);
        }
        Err(Filled::Failed(failure, None, gate_spent))
    }
}

/// A request made now may have attempts from an earlier session: new ones
/// are numbered after them.
fn made_counters(attempts: i64) -> Counters {
    Counters {
        attempt: attempts,
        gate_failures: 0,
        transport_retries: 0,
    }
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
