//! One item through the job's stages, in order: each stage runs only when
//! every stage before it passed (so a critic never judges an output that
//! failed its gate), sees their outputs in its template, and the item's
//! outcome is routed only once every stage — the critic included — is over.
//! A stage that fails ends the item as `error` and the later ones are
//! skipped. Each stage's end commits with its last attempt; the last
//! stage's end commits with the outcome.

mod criteria;
mod ending;

use std::ops::{ControlFlow, Range};

use serde_json::{Map, Value};

use super::attempt::{Counters, Job, StageEnd, run_request};
use super::batching::Delivered;
use super::ctx::Ctx;
use super::stages::Stage;
use crate::gate::GateOutput;
use crate::template::Prompt;
use criteria::{Filled, fill_criteria};
use docket_ledger::store::{StageWork, WorkItem};
use docket_ledger::writer::{AttemptRecord, StageDone, WriteOp};
use docket_providers::limiter::Slot;
use ending::{FailedAs, answered_before, fail, fail_with, finish, unrenderable};

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

/// What a stage's request starts with: a batch line's result to apply, a
/// synchronous slot the feed took, the prompt already rendered.
struct Sending {
    delivered: Option<Delivered>,
    slot: Option<Slot>,
    rendered: Option<Prompt>,
}

impl Sending {
    /// What stage `k`'s request (`request_id`, seeing `extra`) starts with;
    /// what it does not take stays for a later stage.
    fn for_request(&mut self, k: usize, request_id: i64, extra: &Map<String, Value>) -> Sending {
        Sending {
            // A batch line's result is for the request it answered.
            delivered: self.delivered.take_if(|d| d.request_id == request_id),
            slot: self.slot.take(),
            // The check rendered stage 0 with nothing extra: its prompt is
            // this request's when the stage sees nothing else.
            rendered: self.rendered.take().filter(|_| k == 0 && extra.is_empty()),
        }
    }
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
    mut sent: Sending,
) -> StageEnd {
    let mut counters = counters(sw);
    let mut panics = 0u32;
    loop {
        let seen = std::sync::Arc::new(super::attempt::Seen::starting_at(counters.attempt));
        let rendered = sent.rendered.take();
        let job = match Job::new(
            item,
            stage,
            sw.request_id,
            counters,
            extra.clone(),
            rendered,
        ) {
            Ok(job) => job
                .with_delivered(sent.delivered.take())
                .seen_in(seen.clone()),
            Err(message) => return StageEnd::Failed(message, None),
        };
        let what = match confined(run_request(ctx, job, sent.slot.take())).await {
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
    let first_prompt = match unrenderable(ctx, &item, group.start == 0, delivered.is_some()).await {
        Ok(prompt) => prompt,
        Err(ended) => return ended,
    };
    let start = Sending {
        delivered,
        slot,
        rendered: first_prompt,
    };
    run_stages(ctx, item, group, start).await
}

/// `process` once the item's prompts are known to render; `start` holds
/// the first stage's prompt when that check rendered it.
async fn run_stages(ctx: &Ctx, item: WorkItem, group: Range<usize>, mut start: Sending) -> Ended {
    let p = &ctx.p;
    let n = p.stages.len();
    let mut run = ItemRun {
        ctx,
        item: &item,
        outputs: vec![None; n],
    };
    for k in 0..n {
        let stage = &p.stages[k];
        let Some(sw) = stage_work(&item, &stage.name) else {
            // A session from another job shape: nothing to run here.
            tracing::warn!(item = %item.item_id, stage = %stage.name, "no request for the stage");
            return Ended::Open;
        };
        match sw.state.as_str() {
            "passed" => {
                run.outputs[k] = passed_output(sw);
                if run.outputs[k].is_some() {
                    if k + 1 == n {
                        // Every stage passed but the outcome was never
                        // written (a crash between): route it now.
                        return finish(ctx, &item, &run.outputs, None, None).await;
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
        let extra = context(p, k, &run.outputs);
        let end = match reused_answer(stage, sw) {
            Some(end) => end,
            None => {
                let sent = start.for_request(k, sw.request_id, &extra);
                run_confined(ctx, &item, stage, sw, &extra, sent).await
            }
        };
        let reused = sw.status == "completed";
        let step = match end {
            StageEnd::Stopped => ControlFlow::Break(Ended::Open),
            StageEnd::Parked => ControlFlow::Break(Ended::Parked),
            StageEnd::Failed(message, rec) => {
                ControlFlow::Break(fail(ctx, &item, k, sw, message, rec).await)
            }
            StageEnd::GateSpent(message, rec) => {
                let to_review = FailedAs::Review(answered_before(p, k, &run.outputs));
                ControlFlow::Break(
                    fail_with(ctx, &item, k, sw, message, rec, true, to_review).await,
                )
            }
            StageEnd::Passed(out, rec) => {
                let rec = (!reused).then_some(rec);
                run.passed(k, sw, out, rec, &extra).await
            }
        };
        if let ControlFlow::Break(ended) = step {
            return ended;
        }
    }
    Ended::Open
}

/// The output a stage passed with before (None when it cannot be read).
fn passed_output(sw: &StageWork) -> Option<Value> {
    sw.output_json
        .as_deref()
        .or(sw.parsed_output_json.as_deref())
        .and_then(|s| serde_json::from_str(s).ok())
}

/// Answered before with the same template and parameters (this session
/// before a stop, or an earlier one): reused, not paid again.
fn reused_answer(stage: &Stage, sw: &StageWork) -> Option<StageEnd> {
    if sw.status != "completed" {
        return None;
    }
    let answer = serde_json::from_str::<Value>(sw.parsed_output_json.as_deref()?).ok()?;
    let (cf, rf) = stage.gate.fields();
    Some(StageEnd::Passed(
        GateOutput {
            confidence: answer.get(cf).and_then(Value::as_f64),
            rationale: answer.get(rf).and_then(Value::as_str).map(str::to_string),
            answer,
        },
        AttemptRecord::default(),
    ))
}

/// One item on its way through the stages: the outputs of the stages it
/// passed so far.
struct ItemRun<'a> {
    ctx: &'a Ctx,
    item: &'a WorkItem,
    outputs: Vec<Option<Value>>,
}

impl ItemRun<'_> {
    /// Stage `k` passed: its end on record (with the outcome, at the last
    /// stage); with criteria, the ones its answer left out asked first.
    /// Break with how the item's turn ended, or go on to the next stage.
    async fn passed(
        &mut self,
        k: usize,
        sw: &StageWork,
        out: GateOutput,
        rec: Option<AttemptRecord>,
        extra: &Map<String, Value>,
    ) -> ControlFlow<Ended> {
        let (ctx, item) = (self.ctx, self.item);
        let stage = &ctx.p.stages[k];
        let parsed = serde_json::to_string(&out.answer).ok();
        if !stage.criteria.is_empty() {
            return self
                .passed_with_criteria(k, sw, out.answer, parsed, rec, extra)
                .await;
        }
        let done = StageDone {
            output_json: parsed.clone(),
            ..stage_done(ctx, item, stage, sw, true, parsed)
        };
        self.outputs[k] = Some(out.answer);
        if k + 1 == ctx.p.stages.len() {
            return ControlFlow::Break(finish(ctx, item, &self.outputs, rec, Some(done)).await);
        }
        if !ctx.write(item, WriteOp::Stage(rec, done)).await {
            return ControlFlow::Break(Ended::Open);
        }
        ControlFlow::Continue(())
    }

    /// Structured batching: the request's own answer is kept on it; the
    /// criteria it left out are asked one by one and merged into the
    /// stage's output.
    async fn passed_with_criteria(
        &mut self,
        k: usize,
        sw: &StageWork,
        mut output: Value,
        parsed: Option<String>,
        rec: Option<AttemptRecord>,
        extra: &Map<String, Value>,
    ) -> ControlFlow<Ended> {
        let (ctx, item) = (self.ctx, self.item);
        let p = &ctx.p;
        let stage = &p.stages[k];
        let first = StageDone {
            output_json: None,
            settle_item: false,
            ..stage_done(ctx, item, stage, sw, true, parsed)
        };
        if !ctx.write(item, WriteOp::Stage(rec, first)).await {
            return ControlFlow::Break(Ended::Open);
        }
        match Box::pin(fill_criteria(ctx, item, stage, extra, &mut output)).await {
            Filled::All => {}
            Filled::Stopped => return ControlFlow::Break(Ended::Open),
            Filled::Failed(message, rec, gate_spent) => {
                // The stage's own answer passed (and was paid
                // for): it stays reusable; only the item fails
                // (or, its follow-up's answers all failing the
                // gate, goes to review: row S7).
                let ends = if gate_spent {
                    FailedAs::Review(answered_before(p, k, &self.outputs))
                } else {
                    FailedAs::Error
                };
                return ControlFlow::Break(
                    fail_with(ctx, item, k, sw, message, rec, false, ends).await,
                );
            }
        }
        let merged = StageDone {
            parsed_json: None,
            output_json: serde_json::to_string(&output).ok(),
            ..stage_done(ctx, item, stage, sw, true, None)
        };
        self.outputs[k] = Some(output);
        if k + 1 == p.stages.len() {
            return ControlFlow::Break(finish(ctx, item, &self.outputs, None, Some(merged)).await);
        }
        if !ctx.write(item, WriteOp::Stage(None, merged)).await {
            return ControlFlow::Break(Ended::Open);
        }
        ControlFlow::Continue(())
    }
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

// Matched at once by the caller; not kept.
