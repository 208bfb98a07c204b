//! The lifecycle of one batch, compressed to seconds: a tokio task per batch.
//!
//! Contract (reference 2.7): `validating` for `batch_validating_ms`, then the
//! input is checked (`input`) → `failed` with `errors.data[]`, or
//! `failed` with `token_limit_exceeded` when the open batches of the model
//! plus this one queue more prompt tokens than `batch_enqueued_token_limit`;
//! else `in_progress`: the lines are answered evenly over `batch_running_ms`
//! (`request_counts` grow as they go) with the sync route's deterministic
//! answers and usage, without its latency or rate limits; a line fails with a
//! 500 at `batch_fail_rate` (per-line draws from the seed), and a body the chat
//! route would refuse gets its 400. Then `finalizing` for `batch_finalizing_ms`,
//! then `completed`. Output and error files are made at the end, their lines
//! shuffled (deterministically from the seed and the batch's creation order);
//! each file id stays null when the file would be empty; with
//! `batch_output_late_ms` the batch is `completed` with null ids that long.
//! `batch_expire = f`: the batch expires once a fraction f of its lines ran;
//! the rest get `batch_expired` lines in the error file and count as failed.
//! Cancel (set by the route, which moves the batch to `cancelling`): the lines
//! in flight (those due by the next tick, at least one) finish, the batch stays
//! `cancelling` for `batch_cancelling_ms`, then `cancelled` with the finished
//! lines in its files. Unrun lines of a cancelled batch get no line at all.
//! The config is read once, at create. Every transition is logged (status 0)
//! and counted; the task ends at a terminal state or at server shutdown.
//! With `batch_line_log` every line is logged too (the billing log: status
//! 200 `batch_line_ok` when billed). `batch_results_404_ms`: the files
//! answer 404 that long once published. `batch_result_anomalies`: the first
//! N batches get `lines::Anomaly`s and a line for an unknown custom_id.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::sync::Notify;

use super::input::{self, Line};
use crate::MockConfig;
use crate::batch::clock::{Due, Schedule};
use crate::batch::lines;
use crate::state::openai::{Api, Batch, BatchError, Status, Store, unix_now};
use crate::state::{Shared, lock};
use crate::stats::{BatchCount, BatchEvent};
use crate::wire::splitmix;

mod answering;

/// What a batch's lifecycle needs from the config, read once at create.
pub(crate) struct Plan {
    api: Api,
    endpoint: String,
    seq: u64,
    validating: Duration,
    running: Duration,
    finalizing: Duration,
    cancelling: Duration,
    output_late: Duration,
    fail_rate: f64,
    expire: f64,
    seed: u64,
    token_limit: u64,
    line_log: bool,
    results_hidden: Duration,
    anomalies: bool,
    /// Fail validation naming an input line (`batch_reject_input`): set by
    /// the create route.
    pub(crate) reject_input: bool,
}

impl Plan {
    pub(crate) fn from_config(c: &MockConfig, api: Api, endpoint: String, seq: u64) -> Plan {
        let ms = Duration::from_millis;
        Plan {
            api,
            endpoint,
            seq,
            validating: ms(c.batch_validating_ms),
            running: ms(c.batch_running_ms),
            finalizing: ms(c.batch_finalizing_ms),
            cancelling: ms(c.batch_cancelling_ms),
            output_late: ms(c.batch_output_late_ms),
            fail_rate: c.batch_fail_rate,
            expire: c.batch_expire,
            seed: c.seed,
            token_limit: c.batch_enqueued_token_limit,
            line_log: c.batch_line_log,
            results_hidden: ms(c.batch_results_404_ms),
            anomalies: seq < u64::from(c.batch_result_anomalies),
            reject_input: false,
        }
    }
}

enum Start {
    Running,
    Cancelled,
    /// failed, or the batch is gone
    Over,
}

enum Wake {
    Time,
    Cancel,
    Stop,
}

pub(crate) fn spawn(
    shared: Arc<Shared>,
    id: String,
    input: Bytes,
    plan: Plan,
    cancel: Arc<Notify>,
) {
    tokio::spawn(async move {
        let rng = StdRng::seed_from_u64(splitmix(plan.seed ^ splitmix(plan.seq)));
        let mut run = Run {
            shared: &shared,
            id,
            plan,
            cancel,
            rng,
            lines: Vec::new(),
            input,
            done: 0,
            out: Vec::new(),
            err: Vec::new(),
            extra: Vec::new(),
            model: String::new(),
        };
        run.drive().await;
    });
}

struct Run<'a> {
    shared: &'a Shared,
    id: String,
    plan: Plan,
    cancel: Arc<Notify>,
    rng: StdRng,
    lines: Vec<Line>,
    input: Bytes,
    /// lines run so far (in input order)
    done: usize,
    out: Vec<String>,
    err: Vec<String>,
    /// result lines for the end of the output file (anomalies)
    extra: Vec<String>,
    model: String,
}

impl Run<'_> {
    async fn drive(&mut self) {
        match self.pause(self.plan.validating).await {
            Wake::Stop => return,
            Wake::Cancel => return self.cancelled().await,
            Wake::Time => {}
        }
        let Some(parsed) = self.validate_input().await else {
            return;
        };
        let n = parsed.lines.len();
        match self.start(parsed) {
            Start::Running => {}
            Start::Over => return,
            Start::Cancelled => return self.cancelled().await,
        }

        if !self.run_lines(n).await {
            return;
        }

        if !self.transition(Status::Finalizing, "batch_finalizing") {
            return self.cancelled().await;
        }
        match self.pause(self.plan.finalizing).await {
            Wake::Stop => return,
            Wake::Cancel => return self.cancelled().await,
            Wake::Time => {}
        }
        let late = !self.plan.output_late.is_zero();
        if late {
            if !self.transition(Status::Completed, "batch_completed") {
                return self.cancelled().await;
            }
            tokio::select! {
                _ = tokio::time::sleep(self.plan.output_late) => {}
                _ = self.shared.stopping() => return,
            }
            self.output_ready();
        } else if !self.complete() {
            return self.cancelled().await;
        }
        self.shared.stats.count(BatchCount::Completed);
    }

    /// Validate the input file off the async threads; None when the batch
    /// failed (a bad line, or `batch_reject_input`) or the check died.
    async fn validate_input(&mut self) -> Option<input::Parsed> {
        let (input, endpoint, max) = (
            self.input.clone(),
            self.plan.endpoint.clone(),
            self.plan.api.max_requests(),
        );
        let checked =
            tokio::task::spawn_blocking(move || input::validate(&input, &endpoint, max)).await;
        let parsed = match checked {
            Ok(Ok(p)) => p,
            Ok(Err(errors)) => {
                self.fail(errors, None);
                return None;
            }
            Err(_) => return None,
        };
        if self.plan.reject_input {
            let line = parsed.lines.len().min(2) as u64;
            let e = BatchError {
                code: "invalid_json_line".to_string(),
                message: format!(
                    "This line is not parseable as valid JSON (mock: batch_reject_input, line {line})."
                ),
                param: None,
                line: Some(line),
            };
            self.fail(vec![e], Some(parsed.model));
            return None;
        }
        Some(parsed)
    }

    /// Run the `n` lines on the schedule; false when the batch ended on the
    /// way (expired, cancelled) or the server stops.
    async fn run_lines(&mut self, n: usize) -> bool {
        let sched = Schedule::start(n, self.plan.running, self.plan.expire);
        loop {
            match sched.now() {
                Due::Expire(k) => {
                    self.step(k);
                    self.expired();
                    return false;
                }
                Due::Run(target) => self.step(target),
            }
            if sched.finished(self.done) {
                return true;
            }
            match self.pause(sched.tick).await {
                Wake::Stop => return false,
                Wake::Time => {}
                Wake::Cancel => {
                    // The lines in flight finish.
                    self.step(sched.on_cancel(self.done));
                    self.cancelled().await;
                    return false;
                }
            }
        }
    }

    /// Validation passed: fail on the enqueued token limit, or go `in_progress`.
    fn start(&mut self, parsed: input::Parsed) -> Start {
        let mut store = lock(&self.shared.store);
        let queued = store.enqueued_tokens(self.plan.api, &parsed.model);
        let limit = self.plan.token_limit;
        if limit > 0 && queued + parsed.prompt_tokens > limit {
            drop(store);
            let msg = format!(
                "Enqueued token limit reached for {} in organization org-mock. Limit: {limit} enqueued tokens. Please try again once some in_progress batches have been completed.",
                parsed.model
            );
            let e = BatchError {
                code: "token_limit_exceeded".to_string(),
                message: msg,
                param: None,
                line: None,
            };
            self.fail(vec![e], Some(parsed.model));
            return Start::Over;
        }
        let Some(b) = self.batch(&mut store) else {
            return Start::Over;
        };
        self.model = parsed.model.clone();
        b.model = Some(parsed.model);
        if b.cancel_requested {
            return Start::Cancelled;
        }
        b.total = parsed.lines.len() as u64;
        b.queued_tokens = parsed.prompt_tokens;
        b.status = Status::InProgress;
        b.at.in_progress = Some(unix_now());
        self.log(b, "batch_in_progress");
        drop(store);
        self.lines = parsed.lines;
        Start::Running
    }

    /// Files and `completed` at once; false when a cancel came first.
    fn complete(&mut self) -> bool {
        let mut store = lock(&self.shared.store);
        if self.batch(&mut store).is_none_or(|b| b.cancel_requested) {
            return false;
        }
        self.publish(&mut store);
        if let Some(b) = self.batch(&mut store) {
            b.status = Status::Completed;
            b.at.completed = Some(unix_now());
            self.log(b, "batch_completed");
        }
        true
    }

    fn output_ready(&mut self) {
        let mut store = lock(&self.shared.store);
        self.publish(&mut store);
        if let Some(b) = self.batch(&mut store) {
            self.log(b, "batch_output_ready");
        }
    }

    fn batch<'s>(&self, store: &'s mut Store) -> Option<&'s mut Batch> {
        store.batch_mut(self.plan.api, &self.id)
    }

    fn log(&self, b: &Batch, outcome: &str) {
        let event = BatchEvent {
            provider: self.plan.api.provider(),
            route: b.route(),
            batch_id: &b.id,
            client_request_id: None,
            model: b.model.as_deref().unwrap_or(""),
            status: 0,
            outcome,
        };
        let cap = self.shared.live().config.log_capacity;
        self.shared.stats.event(&event, cap);
    }

    /// Move to `to` unless a cancel came first (then false: the cancel path takes over).
    fn transition(&self, to: Status, outcome: &str) -> bool {
        let mut store = lock(&self.shared.store);
        let Some(b) = self.batch(&mut store) else {
            return true;
        };
        if b.cancel_requested {
            return false;
        }
        b.status = to;
        let now = Some(unix_now());
        match to {
            Status::Finalizing => b.at.finalizing = now,
            Status::Completed => b.at.completed = now,
            _ => {}
        }
        self.log(b, outcome);
        true
    }

    /// Sleep, unless cancelled or the server stops first.
    async fn pause(&self, d: Duration) -> Wake {
        tokio::select! {
            _ = tokio::time::sleep(d) => Wake::Time,
            _ = self.cancel.notified() => Wake::Cancel,
            _ = self.shared.stopping() => Wake::Stop,
        }
    }

    fn fail(&mut self, errors: Vec<BatchError>, model: Option<String>) {
        let mut store = lock(&self.shared.store);
        let Some(b) = self.batch(&mut store) else {
            return;
        };
        b.errors = errors;
        b.model = model.or(b.model.take());
        b.status = Status::Failed;
        b.at.failed = Some(unix_now());
        self.log(b, "batch_failed");
        self.shared.stats.count(BatchCount::Failed);
    }

    fn expired(&mut self) {
        let mut expired = 0;
        for line in &self.lines[self.done..] {
            self.err.push(lines::expired(self.shared, &line.custom_id));
            self.bill(&line.custom_id, 0, "batch_line_expired");
            expired += 1;
        }
        self.done = self.lines.len();
        self.shared.stats.add(BatchCount::LineFailed, expired);
        let mut store = lock(&self.shared.store);
        self.publish(&mut store);
        if let Some(b) = self.batch(&mut store) {
            b.failed += expired;
            b.status = Status::Expired;
            b.at.expired = Some(unix_now());
            self.log(b, "batch_expired");
        }
        self.shared.stats.count(BatchCount::Expired);
    }

    /// The route already moved the batch to `cancelling`; wait, then `cancelled`.
    async fn cancelled(&mut self) {
        tokio::select! {
            _ = tokio::time::sleep(self.plan.cancelling) => {}
            _ = self.shared.stopping() => return,
        }
        for line in &self.lines[self.done..] {
            self.bill(&line.custom_id, 0, "batch_line_canceled");
        }
        let mut store = lock(&self.shared.store);
        self.publish(&mut store);
        if let Some(b) = self.batch(&mut store) {
            b.status = Status::Cancelled;
            b.at.cancelled = Some(unix_now());
            self.log(b, "batch_cancelled");
        }
        self.shared.stats.count(BatchCount::Cancelled);
    }
}
