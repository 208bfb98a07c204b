//! A stage whose gate never passes stops the run early, before every item
//! has paid for its attempts: when a stage's first answers, from several
//! items, all fail the gate (a prompt that does not ask for the fields the
//! schema requires), the session pauses saying why, and nothing more is
//! sent. Once one answer of the stage has passed, the watch is over: later
//! failures are the job's ordinary noise, retried and recorded as always.
//!
//! The same watch, on requests the provider refuses (a 4xx such as a model
//! name it does not know, row S3), keeps one typo in docket.toml from
//! failing every item: until the stage's first answer, a refusal is retried
//! like a transport failure, and when the first refusals from several items
//! all come before any answer, the session pauses.

use std::collections::HashSet;

use super::per_stage::PerStage;

/// How many failed answers, with no pass among them, stop the run: enough
/// that a job whose answers fail half the time (0.5^12, about 1 in 4,000)
/// is not stopped by bad luck.
const FAILURES: usize = 12;
/// From at least this many items: one item failing again and again is
/// that item's problem.
const ITEMS: usize = 4;
/// Reasons named in the stop message.
const REASONS_SHOWN: usize = 3;

#[derive(Default)]
struct Early {
    /// An answer of the stage passed: the watch is over.
    passed: bool,
    /// Each reason seen, with how often, in order of first sight.
    reasons: Vec<(String, usize)>,
    failures: usize,
    items: HashSet<String>,
    /// The run was stopped for this stage already.
    done: bool,
}

/// One watch per stage, in job order.
pub(super) struct GateWatch {
    stages: PerStage<Early>,
    /// What failed, and how, for the stop message: ("answers", "all failed
    /// the gate").
    words: (&'static str, &'static str),
}

impl GateWatch {
    /// The watch on a stage's gate.
    pub(super) fn new(stages: usize) -> GateWatch {
        GateWatch {
            stages: PerStage::new(stages),
            words: ("answers", "all failed the gate"),
        }
    }

    /// The watch on the requests a stage's provider refuses.
    pub(super) fn on_refusals(stages: usize) -> GateWatch {
        GateWatch {
            stages: PerStage::new(stages),
            words: ("requests", "were all refused by the provider"),
        }
    }

    /// No answer of `stage` has passed yet (also once the run was stopped
    /// for it: requests still under way then are not held against their
    /// items either).
    pub(super) fn undecided(&self, stage: usize) -> bool {
        self.early(stage).is_some_and(|e| !e.passed)
    }

    fn early(&self, stage: usize) -> Option<std::sync::MutexGuard<'_, Early>> {
        self.stages.get(stage)
    }

    /// An answer of `stage` passed its gate.
    pub(super) fn passed(&self, stage: usize) {
        if let Some(mut e) = self.early(stage) {
            e.passed = true;
        }
    }

    /// An answer of `stage` for `item` failed its gate with `reason`. The
    /// reason to stop the run, once: when the stage's first `FAILURES`
    /// answers, from `ITEMS` items or more, all failed.
    pub(super) fn failed(&self, stage: usize, item: &str, reason: &str) -> Option<String> {
        let mut e = self.early(stage)?;
        if e.passed || e.done {
            return None;
        }
        match e.reasons.iter_mut().find(|(r, _)| r == reason) {
            Some((_, n)) => *n += 1,
            None => e.reasons.push((reason.to_string(), 1)),
        }
        e.failures += 1;
        e.items.insert(item.to_string());
        if e.failures < FAILURES || e.items.len() < ITEMS {
            return None;
        }
        e.done = true;
        let mut reasons = e.reasons.clone();
        reasons.sort_by_key(|r| std::cmp::Reverse(r.1));
        let shown: Vec<String> = reasons
            .iter()
            .take(REASONS_SHOWN)
            .map(|(r, n)| format!("{r} ({n}x)"))
            .collect();
        let more = reasons.len().saturating_sub(REASONS_SHOWN);
        Some(format!(
            "its first {} {}, from {} items, {}: {}{}",
            e.failures,
            self.words.0,
            e.items.len(),
            self.words.1,
            shown.join("; "),
            if more > 0 {
                format!("; and {more} other reason(s)")
            } else {
                String::new()
            }
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_from_enough_items_stop_once_naming_the_reasons() {
        let w = GateWatch::new(1);
        let why = "\"crg_mbid\" is a required property";
        for i in 0..10 {
            assert_eq!(w.failed(0, &format!("item{}", i % 4), why), None);
        }
        assert_eq!(
            w.failed(0, "item1", "\"rr_mbid\" is a required property"),
            None
        );
        let stop = w
            .failed(0, "item3", why)
            .expect("the twelfth failure stops");
        assert!(
            stop.contains("first 12 answers, from 4 items")
                && stop.contains(&format!("{why} (11x)"))
                && stop.contains("\"rr_mbid\" is a required property (1x)"),
            "{stop}"
        );
        assert_eq!(w.failed(0, "item4", why), None, "only once");
        assert!(w.undecided(0), "stopped, still not passed");
    }

    #[test]
    fn refusals_name_requests_and_a_pass_decides() {
        let w = GateWatch::on_refusals(1);
        assert!(w.undecided(0));
        let why = "HTTP 404: the model `x` does not exist";
        let mut stop = None;
        for i in 0..12 {
            stop = w.failed(0, &format!("i{}", i % 4), why);
        }
        let stop = stop.expect("twelve refusals from four items");
        assert!(
            stop.contains("first 12 requests, from 4 items, were all refused by the provider"),
            "{stop}"
        );
        let passed = GateWatch::on_refusals(1);
        passed.passed(0);
        assert!(!passed.undecided(0));
    }

    #[test]
    fn a_pass_or_one_item_never_stops() {
        let why = "x is required";
        let passed = GateWatch::new(1);
        passed.failed(0, "a", why);
        passed.passed(0);
        let one_item = GateWatch::new(1);
        for i in 0..20 {
            assert_eq!(passed.failed(0, &format!("i{i}"), why), None);
            assert_eq!(one_item.failed(0, "same", why), None);
        }
    }
}
