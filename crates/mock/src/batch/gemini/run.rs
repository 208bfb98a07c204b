//! The lifecycle of one Gemini batch, compressed to seconds, and the answer
//! to each of its requests.
//!
//! Contract: `BATCH_STATE_PENDING` for `batch_validating_ms`; a file whose
//! lines could not be read then fails the batch (`BATCH_STATE_FAILED`,
//! `error` code 3 naming the line). Else `BATCH_STATE_RUNNING`: requests are
//! answered evenly over `batch_running_ms` (`batchStats` grow) with the sync
//! route's deterministic content and usage, in the GenerateContentResponse
//! shape; a request fails at `batch_fail_rate` (`error` `{code: 13,
//! message}`), one the sync route would refuse gets `{code: 3, message}`.
//! `batch_finalizing_ms` more in RUNNING (Gemini has no finalizing state),
//! then `BATCH_STATE_SUCCEEDED` with `done: true` and the results; with
//! `batch_output_late_ms` the state is SUCCEEDED that long before `done` and
//! the results. `batch_expire = f`: EXPIRED once a fraction f ran, with the
//! finished requests' results only. Cancel: the requests in flight finish,
//! the state stays where it was for `batch_cancelling_ms`, then CANCELLED
//! with what finished. Inline results are in input order; a responses file
//! (`{"key", "response"|"error"}` per line) is shuffled from the seed.
//! `batch_line_log`: every request is logged too (the billing log).
//! `batch_results_404_ms`: a responses file answers 404 that long once made.
//! `batch_result_anomalies`: the first N batches get `lines::Anomaly`s
//! (no `expired` or `canceled` lines: Gemini writes none) and a result for
//! an unknown key, after the others.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tokio::sync::Notify;

use super::answer::answer;
use crate::MockConfig;
use crate::batch::clock::{Due, Schedule};
use crate::batch::lines::{self, Anomaly};
use crate::state::gemini::{GBatch, GFile, GState, GemState, Results, now_rfc3339};
use crate::state::{Shared, lock};
use crate::stats::{BatchCount, BatchEvent};
use crate::wire::{id_hex, splitmix};

const ROUTE: &str = "/v1beta/batches/{batch}";

/// One request of a batch: its key (None when the inline entry had no
/// metadata) and its GenerateContentRequest.
pub(crate) struct Req {
    pub key: Option<String>,
    pub request: Value,
}

pub(crate) struct Plan {
    pub inline: bool,
    pub seq: u64,
    validating: Duration,
    running: Duration,
    finalizing: Duration,
    cancelling: Duration,
    output_late: Duration,
    fail_rate: f64,
    expire: f64,
    seed: u64,
    line_log: bool,
    results_hidden: Duration,
    anomalies: bool,
}

impl Plan {
    pub(crate) fn from_config(c: &MockConfig, inline: bool, seq: u64) -> Plan {
        let ms = Duration::from_millis;
        Plan {
            inline,
            seq,
            validating: ms(c.batch_validating_ms),
            running: ms(c.batch_running_ms),
            finalizing: ms(c.batch_finalizing_ms),
            cancelling: ms(c.batch_cancelling_ms),
            output_late: ms(c.batch_output_late_ms),
            fail_rate: c.batch_fail_rate,
            expire: c.batch_expire,
            seed: c.seed,
            line_log: c.batch_line_log,
            results_hidden: ms(c.batch_results_404_ms),
            anomalies: seq < u64::from(c.batch_result_anomalies),
        }
    }
}

enum Wake {
    Time,
    Cancel,
    Stop,
}

pub(crate) fn spawn(
    shared: Arc<Shared>,
    store: GemState,
    name: String,
    input: Result<Vec<Req>, String>,
    plan: Plan,
    cancel: Arc<Notify>,
) {
    tokio::spawn(async move {
        let rng = StdRng::seed_from_u64(splitmix(plan.seed ^ splitmix(plan.seq ^ 0x6e6d)));
        let mut run = Run {
            shared: &shared,
            store,
            name,
            plan,
            cancel,
            rng,
            done: 0,
            results: Vec::new(),
            extra: Vec::new(),
            unknown: None,
            model: String::new(),
        };
        run.drive(input).await;
    });
}

struct Run<'a> {
    shared: &'a Shared,
    store: GemState,
    name: String,
    plan: Plan,
    cancel: Arc<Notify>,
    rng: StdRng,
    done: usize,
    /// (key, "response"|"error", value) per finished request, input order
    results: Vec<(Option<String>, &'static str, Value)>,
    /// results after the others (anomalies)
    extra: Vec<(Option<String>, &'static str, Value)>,
    /// an answer to put under a key the batch never had (anomalies)
    unknown: Option<Value>,
    model: String,
}

impl Run<'_> {
    async fn drive(&mut self, input: Result<Vec<Req>, String>) {
        match self.pause(self.plan.validating).await {
            Wake::Stop => return,
            Wake::Cancel => return self.finish(GState::Cancelled).await,
            Wake::Time => {}
        }
        let reqs = match input {
            Ok(r) => r,
            Err(msg) => return self.fail(msg),
        };
        let started = {
            let mut store = lock(&self.store);
            match store.batches.get_mut(&self.name) {
                None => None,
                Some(b) if b.cancel_requested => Some(None),
                Some(b) => {
                    b.state = GState::Running;
                    b.update_time = now_rfc3339();
                    Some(Some(b.model.clone()))
                }
            }
        };
        let model = match started {
            None => return,
            Some(None) => return self.finish(GState::Cancelled).await,
            Some(Some(m)) => m,
        };
        self.log("batch_in_progress", &model);
        self.model = model.clone();
        if !self.run_requests(&reqs, &model).await {
            return;
        }
        match self.pause(self.plan.finalizing).await {
            Wake::Stop => return,
            Wake::Cancel => return self.finish(GState::Cancelled).await,
            Wake::Time => {}
        }
        if !self.plan.output_late.is_zero() {
            {
                let mut store = lock(&self.store);
                if let Some(b) = store.batches.get_mut(&self.name) {
                    b.state = GState::Succeeded;
                    b.update_time = now_rfc3339();
                }
            }
            self.log("batch_completed", &model);
            tokio::select! {
                _ = tokio::time::sleep(self.plan.output_late) => {}
                _ = self.shared.stopping() => return,
            }
            self.publish(GState::Succeeded);
            self.log("batch_output_ready", &model);
        } else {
            self.publish(GState::Succeeded);
            self.log("batch_completed", &model);
        }
        self.shared.stats.count(BatchCount::Completed);
    }

    /// Run the requests on the schedule; false when the batch ended on the
    /// way (expired, cancelled) or the server stops.
    async fn run_requests(&mut self, reqs: &[Req], model: &str) -> bool {
        let sched = Schedule::start(reqs.len(), self.plan.running, self.plan.expire);
        loop {
            match sched.now() {
                Due::Expire(k) => {
                    self.step(reqs, model, k);
                    self.bill_rest(reqs, "batch_line_expired");
                    self.finish(GState::Expired).await;
                    return false;
                }
                Due::Run(target) => self.step(reqs, model, target),
            }
            if sched.finished(self.done) {
                return true;
            }
            match self.pause(sched.tick).await {
                Wake::Stop => return false,
                Wake::Time => {}
                Wake::Cancel => {
                    // The lines in flight finish.
                    self.step(reqs, model, sched.on_cancel(self.done));
                    self.bill_rest(reqs, "batch_line_canceled");
                    self.finish(GState::Cancelled).await;
                    return false;
                }
            }
        }
    }

    async fn pause(&self, d: Duration) -> Wake {
        tokio::select! {
            _ = tokio::time::sleep(d) => Wake::Time,
            _ = self.cancel.notified() => Wake::Cancel,
            _ = self.shared.stopping() => Wake::Stop,
        }
    }

    fn log(&self, outcome: &str, model: &str) {
        crate::gate::gemini::event(self.shared, ROUTE, &self.name, model, 0, outcome);
    }

    /// One request in the billing log (`batch_line_log`).
    fn bill(&self, key: Option<&str>, status: u16, outcome: &str) {
        if !self.plan.line_log {
            return;
        }
        let e = BatchEvent {
            provider: "gemini",
            route: ROUTE,
            batch_id: &self.name,
            client_request_id: key,
            model: &self.model,
            status,
            outcome,
        };
        self.shared
            .stats
            .event(&e, self.shared.live().config.log_capacity);
    }

    /// The requests never run, in the billing log as `outcome`.
    fn bill_rest(&self, reqs: &[Req], outcome: &str) {
        for r in &reqs[self.done.min(reqs.len())..] {
            self.bill(r.key.as_deref(), 0, outcome);
        }
    }

    /// Answer requests `done..upto` and add them to the stats.
    fn step(&mut self, reqs: &[Req], model: &str, upto: usize) {
        let (mut ok, mut failed) = (0u64, 0u64);
        while self.done < upto {
            let r = &reqs[self.done];
            let anomaly = self
                .plan
                .anomalies
                .then(|| Anomaly::of_line(self.done, false))
                .flatten();
            let fail = self.rng.random::<f64>() < self.plan.fail_rate
                || anomaly == Some(Anomaly::Retryable);
            let outcome = if fail {
                Err(
                    json!({"code": 13, "message": "An internal error has occurred. Please retry or report in https://developers.generativeai.google/guide/troubleshooting"}),
                )
            } else if anomaly == Some(Anomaly::Refused) {
                Err(
                    json!({"code": 3, "message": "Request contains an invalid argument (mock anomaly)."}),
                )
            } else {
                answer(self.shared, model, &r.request)
            };
            match outcome {
                Ok((body, _, _)) => {
                    if anomaly == Some(Anomaly::Twice) {
                        let mut copy = body.clone();
                        let (out, total) = ("candidatesTokenCount", "totalTokenCount");
                        if lines::more_output(&mut copy, "/usageMetadata", out, total) {
                            self.extra.push((r.key.clone(), "response", copy));
                        }
                    }
                    if self.plan.anomalies && self.unknown.is_none() {
                        self.unknown = Some(body.clone());
                    }
                    if anomaly != Some(Anomaly::Dropped) {
                        self.results.push((r.key.clone(), "response", body));
                    }
                    ok += 1;
                    self.bill(r.key.as_deref(), 200, "batch_line_ok");
                }
                Err(e) => {
                    let status = if fail { 500 } else { 400 };
                    self.results.push((r.key.clone(), "error", e));
                    failed += 1;
                    self.bill(r.key.as_deref(), status, "batch_line_failed");
                }
            }
            self.done += 1;
        }
        if ok + failed == 0 {
            return;
        }
        self.shared.stats.add(BatchCount::LineOk, ok);
        self.shared.stats.add(BatchCount::LineFailed, failed);
        let mut store = lock(&self.store);
        if let Some(b) = store.batches.get_mut(&self.name) {
            b.ok += ok;
            b.failed += failed;
            b.update_time = now_rfc3339();
        }
    }

    fn fail(&mut self, message: String) {
        let model = {
            let mut store = lock(&self.store);
            let Some(b) = store.batches.get_mut(&self.name) else {
                return;
            };
            b.state = GState::Failed;
            b.done = true;
            b.error = Some(json!({"code": 3, "message": message}));
            let now = now_rfc3339();
            b.end_time = Some(now.clone());
            b.update_time = now;
            b.model.clone()
        };
        self.log("batch_failed", &model);
        self.shared.stats.count(BatchCount::Failed);
    }

    /// Expired now, or cancelled after the cancelling period.
    async fn finish(&mut self, to: GState) {
        if to == GState::Cancelled {
            tokio::select! {
                _ = tokio::time::sleep(self.plan.cancelling) => {}
                _ = self.shared.stopping() => return,
            }
        }
        self.publish(to);
        let model = lock(&self.store)
            .batches
            .get(&self.name)
            .map(|b| b.model.clone())
            .unwrap_or_default();
        let (outcome, count) = match to {
            GState::Expired => ("batch_expired", BatchCount::Expired),
            _ => ("batch_cancelled", BatchCount::Cancelled),
        };
        self.log(outcome, &model);
        self.shared.stats.count(count);
    }

    /// The results into the batch (inline) or a responses file, and `to` with `done`.
    fn publish(&mut self, to: GState) {
        let results = std::mem::take(&mut self.results);
        let mut extra = std::mem::take(&mut self.extra);
        if let Some(v) = self.unknown.take() {
            extra.push((Some(lines::unknown_id(self.plan.seq)), "response", v));
        }
        let mut store = lock(&self.store);
        let stored = if results.is_empty() {
            None
        } else if self.plan.inline {
            let items = results
                .into_iter()
                .chain(extra)
                .map(|(key, kind, v)| {
                    let mut item = serde_json::Map::new();
                    if let Some(k) = key {
                        item.insert("metadata".into(), json!({"key": k}));
                    }
                    item.insert(kind.into(), v);
                    Value::Object(item)
                })
                .collect();
            Some(Results::Inline(items))
        } else {
            let mut lines: Vec<String> = results
                .into_iter()
                .map(|(key, kind, v)| json!({"key": key, kind: v}).to_string())
                .collect();
            lines.shuffle(&mut self.rng);
            lines.extend(
                extra
                    .into_iter()
                    .map(|(key, kind, v)| json!({"key": key, kind: v}).to_string()),
            );
            let mut bytes = lines.join("\n");
            bytes.push('\n');
            let hex = id_hex(
                self.shared
                    .ids
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                self.shared.salt,
            );
            let name = format!("files/batch-{}", &hex[..20]);
            store.files.insert(
                name.clone(),
                GFile {
                    name: name.clone(),
                    display_name: format!("{}-responses", self.name),
                    mime: "application/jsonl".into(),
                    bytes: Bytes::from(bytes),
                    create_time: now_rfc3339(),
                    output: true,
                    downloads: 0,
                    hidden_until: (!self.plan.results_hidden.is_zero())
                        .then(|| std::time::Instant::now() + self.plan.results_hidden),
                },
            );
            Some(Results::File(name))
        };
        if let Some(b) = store.batches.get_mut(&self.name) {
            set_terminal(b, to, stored);
        }
    }
}

fn set_terminal(b: &mut GBatch, to: GState, results: Option<Results>) {
    b.state = to;
    b.done = true;
    b.results = results;
    let now = now_rfc3339();
    b.end_time = Some(now.clone());
    b.update_time = now;
}
