//! The lifecycle of one Anthropic message batch, compressed to seconds
//! (reference section 4, "Fake-server state machine"); its result lines
//! come from `batch::anthropic::lines`.
//!
//! Contract: the batch is `in_progress` from its create. It waits
//! `batch_validating_ms`, answers its requests evenly over
//! `batch_running_ms` (with the sync route's deterministic answers and
//! usage), waits `batch_finalizing_ms`, then `ended` — all the while
//! `in_progress` with every request counted in `processing`. At the end the
//! counts move at once and the results (one line per request, shuffled
//! deterministically from the seed) get a `results_url`; with
//! `batch_output_late_ms` the batch is `ended` with a null `results_url`
//! that long. Faults: a request fails at `batch_fail_rate` (an `errored`
//! line with a 500 `api_error`); `params` the sync route would refuse get an
//! `errored` `invalid_request_error` line (params are validated
//! asynchronously); `batch_expire = f`: the batch ends once a fraction f
//! ran, the rest `expired`. Cancel (the route sets `canceling` and
//! `cancel_initiated_at`): the requests in flight (at least one) finish,
//! the batch stays `canceling` for `batch_cancelling_ms`, then `ended` with
//! the rest `canceled`. Transitions are logged (status 0) and counted; with
//! `batch_line_log` every request too (the billing log). The results answer
//! 404 for `batch_results_404_ms` once made. `batch_result_anomalies`: the
//! first N batches get `lines::Anomaly`s (all of them, `expired` and
//! `canceled` lines included) and a line for an unknown custom_id.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use tokio::sync::Notify;

use super::lines::{answer_line, errored, plain};
use crate::MockConfig;
use crate::batch::clock::{Due, Schedule};
use crate::batch::lines::{self, Anomaly};
use crate::gate::anthropic::event;
use crate::state::anthropic::{Batch, Counts, Phase, ROUTE_ONE};
use crate::state::{Shared, lock};
use crate::stats::{BatchCount, BatchEvent};
use crate::wire::splitmix;

/// What a batch's lifecycle needs from the config, read once at create.
pub(crate) struct Plan {
    seq: u64,
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
    pub(crate) fn from_config(c: &MockConfig, seq: u64) -> Plan {
        let ms = Duration::from_millis;
        Plan {
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

    /// How long a batch stays in progress when nothing goes wrong.
    pub(crate) fn length(&self) -> Duration {
        self.validating + self.running + self.finalizing
    }
}

enum Wake {
    Time,
    Cancel,
    Stop,
}

pub(crate) fn spawn(
    shared: Arc<Shared>,
    id: String,
    requests: Vec<(String, Value)>,
    plan: Plan,
    cancel: Arc<Notify>,
) {
    tokio::spawn(async move {
        let rng = StdRng::seed_from_u64(splitmix(plan.seed ^ splitmix(plan.seq) ^ 0xA17));
        let mut run = Run {
            shared: &shared,
            id,
            plan,
            cancel,
            rng,
            requests,
            done: 0,
            lines: Vec::new(),
            extra: Vec::new(),
            counts: Counts::default(),
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
    requests: Vec<(String, Value)>,
    /// requests run so far (in input order)
    done: usize,
    lines: Vec<String>,
    /// result lines for the end of the results (anomalies)
    extra: Vec<String>,
    counts: Counts,
    model: String,
}

impl Run<'_> {
    async fn drive(&mut self) {
        self.model = lock(&self.shared.anthropic_batches)
            .batches
            .get(&self.id)
            .map(|b| b.model.clone())
            .unwrap_or_default();
        match self.pause(self.plan.validating).await {
            Wake::Stop => return,
            Wake::Cancel => return self.canceled().await,
            Wake::Time => {}
        }
        if !self.run_requests().await {
            return;
        }
        match self.pause(self.plan.finalizing).await {
            Wake::Stop => return,
            Wake::Cancel => return self.canceled().await,
            Wake::Time => {}
        }
        if self.plan.output_late.is_zero() {
            if !self.end("", "batch_completed", BatchCount::Completed) {
                self.canceled().await;
            }
            return;
        }
        self.complete_before_output().await;
    }

    /// Run the requests on the schedule; false when the batch ended on the
    /// way (expired, cancelled) or the server stops.
    async fn run_requests(&mut self) -> bool {
        let n = self.requests.len();
        let sched = Schedule::start(n, self.plan.running, self.plan.expire);
        loop {
            match sched.now() {
                Due::Expire(k) => {
                    self.step(k);
                    self.end("expired", "batch_expired", BatchCount::Expired);
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
                    self.canceled().await;
                    return false;
                }
            }
        }
    }

    /// `batch_output_late_ms`: the batch ends, but its results appear that
    /// much later.
    async fn complete_before_output(&mut self) {
        // Ended, but the results are not there yet.
        let results = self.results();
        let canceling = {
            let mut store = lock(&self.shared.anthropic_batches);
            let Some(b) = store.batches.get_mut(&self.id) else {
                return;
            };
            let canceling = b.phase == Phase::Canceling;
            if !canceling {
                self.finish(b);
                event(
                    self.shared,
                    ROUTE_ONE,
                    &b.id,
                    &b.model,
                    0,
                    "batch_completed",
                );
            }
            canceling
        };
        if canceling {
            return self.canceled().await;
        }
        self.shared.stats.count(BatchCount::Completed);
        tokio::select! {
            _ = tokio::time::sleep(self.plan.output_late) => {}
            _ = self.shared.stopping() => return,
        }
        let mut store = lock(&self.shared.anthropic_batches);
        if let Some(b) = store.batches.get_mut(&self.id) {
            b.results = Some(results);
            b.results_hidden_until = self.hidden_until();
            event(
                self.shared,
                ROUTE_ONE,
                &b.id,
                &b.model,
                0,
                "batch_output_ready",
            );
        }
    }

    /// Sleep, unless cancelled or the server stops first.
    async fn pause(&self, d: Duration) -> Wake {
        tokio::select! {
            _ = tokio::time::sleep(d) => Wake::Time,
            _ = self.cancel.notified() => Wake::Cancel,
            _ = self.shared.stopping() => Wake::Stop,
        }
    }

    /// One request in the billing log (`batch_line_log`).
    fn bill(&self, custom_id: &str, status: u16, outcome: &str) {
        if !self.plan.line_log {
            return;
        }
        // Never takes the store's lock: `close` runs under it.
        let e = BatchEvent {
            provider: "anthropic",
            route: ROUTE_ONE,
            batch_id: &self.id,
            client_request_id: Some(custom_id),
            model: &self.model,
            status,
            outcome,
        };
        self.shared
            .stats
            .event(&e, self.shared.live().config.log_capacity);
    }

    /// When a download of results made now may first succeed.
    fn hidden_until(&self) -> Option<std::time::Instant> {
        (!self.plan.results_hidden.is_zero())
            .then(|| std::time::Instant::now() + self.plan.results_hidden)
    }

    /// Run requests `done..upto`.
    fn step(&mut self, upto: usize) {
        let (mut ok, mut failed) = (0, 0);
        while self.done < upto {
            let (custom_id, params) = &self.requests[self.done];
            let custom_id = custom_id.clone();
            let anomaly = self
                .plan
                .anomalies
                .then(|| Anomaly::of_line(self.done, true))
                .flatten();
            let fail = self.rng.random::<f64>() < self.plan.fail_rate
                || anomaly == Some(Anomaly::Retryable);
            let answered = match anomaly {
                Some(Anomaly::Refused) => Err(errored(
                    self.shared,
                    &custom_id,
                    "invalid_request_error",
                    "messages: the request was refused (mock anomaly)",
                )),
                Some(Anomaly::Expired | Anomaly::Canceled) => {
                    let (kind, outcome) = if anomaly == Some(Anomaly::Expired) {
                        self.counts.expired += 1;
                        ("expired", "batch_line_expired")
                    } else {
                        self.counts.canceled += 1;
                        ("canceled", "batch_line_canceled")
                    };
                    self.lines.push(plain(&custom_id, kind));
                    self.bill(&custom_id, 0, outcome);
                    self.done += 1;
                    continue;
                }
                _ => answer_line(self.shared, &custom_id, params, fail),
            };
            match answered {
                Ok((line, _, _)) => {
                    if anomaly == Some(Anomaly::Twice) {
                        let usage = "/result/message/usage";
                        let copy =
                            lines::second_copy(self.shared, &line, usage, "output_tokens", "");
                        self.extra.extend(copy);
                    }
                    if anomaly != Some(Anomaly::Dropped) {
                        self.lines.push(line);
                    }
                    ok += 1;
                    self.bill(&custom_id, 200, "batch_line_ok");
                }
                Err(line) => {
                    self.lines.push(line);
                    failed += 1;
                    self.bill(
                        &custom_id,
                        if fail { 500 } else { 400 },
                        "batch_line_failed",
                    );
                }
            }
            self.done += 1;
        }
        self.counts.succeeded += ok;
        self.counts.errored += failed;
        self.shared.stats.add(BatchCount::LineOk, ok);
        self.shared.stats.add(BatchCount::LineFailed, failed);
    }

    /// The rest of the requests become `rest` lines ("" = none left).
    fn close(&mut self, rest: &str) {
        let left = self.requests.len() - self.done;
        for (custom_id, _) in &self.requests[self.done..] {
            self.lines.push(plain(custom_id, rest));
        }
        if !rest.is_empty() {
            for (custom_id, _) in &self.requests[self.done..] {
                self.bill(custom_id, 0, &format!("batch_line_{rest}"));
            }
        }
        self.done = self.requests.len();
        match rest {
            "expired" => {
                self.counts.expired += left as u64;
                self.shared.stats.add(BatchCount::LineFailed, left as u64);
            }
            "canceled" => self.counts.canceled += left as u64,
            _ => {}
        }
    }

    fn results(&mut self) -> Bytes {
        self.lines.shuffle(&mut self.rng);
        self.lines.append(&mut self.extra);
        if self.plan.anomalies {
            let unknown = lines::unknown_id(self.plan.seq);
            let answered = self
                .lines
                .iter()
                .find(|l| l.contains(r#""type":"succeeded""#))
                .and_then(|l| lines::with_id(l, "/custom_id", &unknown));
            self.lines.extend(answered);
        }
        let mut bytes = self.lines.join("\n");
        bytes.push('\n');
        Bytes::from(bytes)
    }

    fn finish(&self, b: &mut Batch) {
        b.phase = Phase::Ended;
        b.ended_at = Some(chrono::Utc::now());
        b.counts = self.counts;
    }

    /// End now with the rest as `rest` lines; false when a cancel came first
    /// (on a normal end only: the cancel path takes over).
    fn end(&mut self, rest: &str, what: &str, count: BatchCount) -> bool {
        let mut store = lock(&self.shared.anthropic_batches);
        let Some(b) = store.batches.get_mut(&self.id) else {
            return true;
        };
        if rest.is_empty() && b.phase == Phase::Canceling {
            return false;
        }
        self.close(rest);
        let results = self.results();
        self.finish(b);
        b.results = Some(results);
        b.results_hidden_until = self.hidden_until();
        event(self.shared, ROUTE_ONE, &b.id, &b.model, 0, what);
        drop(store);
        self.shared.stats.count(count);
        true
    }

    /// The route already moved the batch to `canceling`; wait, then end.
    async fn canceled(&mut self) {
        tokio::select! {
            _ = tokio::time::sleep(self.plan.cancelling) => {}
            _ = self.shared.stopping() => return,
        }
        self.end("canceled", "batch_cancelled", BatchCount::Cancelled);
    }
}
