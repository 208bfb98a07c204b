//! Structured batching: the criteria a stage's answer left out, asked one
//! by one (each its own request, `STAGE:CRITERION`) and merged into the
//! stage's output.

use serde_json::{Map, Value};

use super::{counters, request_done, stage_work};
use crate::attempt::Counters;
use crate::attempt::Job;
use crate::attempt::StageEnd;
use crate::attempt::run_request;
use crate::ctx::Ctx;
use crate::stages::Stage;
use docket_ledger::store::WorkItem;
use docket_ledger::writer::AttemptRecord;
use docket_ledger::writer::StageDone;
use docket_ledger::writer::WriteOp;

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
