//! Running a batch's lines: each one answered like the sync route (or
//! failed by the draw or an anomaly), billed in the line log, counted on the
//! batch, and at the end published as the output and error files.

use rand::Rng;

use super::Run;
use crate::batch::lines::{self, Anomaly, Extras};
use crate::state::lock;
use crate::state::openai::Store;
use crate::stats::{BatchCount, BatchEvent};

impl Run<'_> {
    /// One line in the billing log (`batch_line_log`).
    pub(super) fn bill(&self, custom_id: &str, status: u16, outcome: &str) {
        if !self.plan.line_log {
            return;
        }
        let event = BatchEvent {
            provider: self.plan.api.provider(),
            route: self.plan.api.line_route(),
            batch_id: &self.id,
            client_request_id: Some(custom_id),
            model: &self.model,
            status,
            outcome,
        };
        let cap = self.shared.live().config.log_capacity;
        self.shared.stats.event(&event, cap);
    }

    /// Run lines `done..upto` and add them to the counts.
    pub(super) fn step(&mut self, upto: usize) {
        let (mut ok, mut failed, mut input_tokens, mut output_tokens) = (0, 0, 0, 0);
        while self.done < upto {
            let line = &self.lines[self.done];
            let custom_id = line.custom_id.clone();
            let raw = &self.input[line.start..line.end];
            let anomaly = self
                .plan
                .anomalies
                .then(|| Anomaly::of_line(self.done, false))
                .flatten();
            let fail = self.rng.random::<f64>() < self.plan.fail_rate
                || anomaly == Some(Anomaly::Retryable);
            let answered = if anomaly == Some(Anomaly::Refused) {
                let msg = "Invalid 'messages': the request was refused (mock anomaly).";
                Err(lines::refused(self.shared, &custom_id, msg))
            } else {
                lines::answer(self.shared, &custom_id, raw, fail)
            };
            match answered {
                Ok((line, p, c)) => {
                    if anomaly == Some(Anomaly::Twice) {
                        let usage = "/response/body/usage";
                        let copy = lines::second_copy(
                            self.shared,
                            &line,
                            usage,
                            "completion_tokens",
                            "total_tokens",
                        );
                        self.extra.extend(copy);
                    }
                    if anomaly != Some(Anomaly::Dropped) {
                        self.out.push(line);
                    }
                    ok += 1;
                    input_tokens += p;
                    output_tokens += c;
                    self.bill(&custom_id, 200, "batch_line_ok");
                }
                Err(line) => {
                    self.err.push(line);
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
        if ok + failed == 0 {
            return;
        }
        self.shared.stats.add(BatchCount::LineOk, ok);
        self.shared.stats.add(BatchCount::LineFailed, failed);
        let mut store = lock(&self.shared.store);
        if let Some(b) = self.batch(&mut store) {
            b.completed += ok;
            b.failed += failed;
            b.input_tokens += input_tokens;
            b.output_tokens += output_tokens;
        }
    }

    /// The output and error files made from the lines so far (with the
    /// anomalies' extra lines), and their ids set on the batch.
    pub(super) fn publish(&mut self, store: &mut Store) {
        let mut extras = Extras {
            lines: std::mem::take(&mut self.extra),
            hidden_until: (!self.plan.results_hidden.is_zero())
                .then(|| std::time::Instant::now() + self.plan.results_hidden),
        };
        if self.plan.anomalies {
            let unknown = lines::unknown_id(self.plan.seq);
            let line = self.out.first();
            extras
                .lines
                .extend(line.and_then(|l| lines::with_id(l, "/custom_id", &unknown)));
        }
        let (api, id) = (self.plan.api, self.id.as_str());
        let files = [(&mut self.out, "output"), (&mut self.err, "error")];
        lines::publish(self.shared, store, api, id, files, extras, &mut self.rng);
    }
}
