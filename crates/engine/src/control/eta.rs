//! The session's ETA: the requests every stage still has to answer, at the
//! pace the session answers them. The pace is measured from the stages'
//! checkpoints in the ledger (so it is every worker's, and a multi-stage
//! run counts each stage's answers, not only items through the last
//! stage), over the last minute; until there is a pace to measure, the
//! binding requests/min limit gives one. Every worker works out the same
//! ETA, so the session's gauges keep it whatever worker wrote last.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use docket_ledger::watch::StageProgress;

/// The span the pace is measured over.
const PACE_WINDOW: Duration = Duration::from_secs(60);
/// A pace from less than this is noise (a batch of answers landing at once).
const PACE_MIN_SPAN: Duration = Duration::from_secs(3);

/// Requests still to answer: each stage's items not yet passed, failed or
/// skipped (an item a stage has not reached yet counts for it too).
pub(super) fn remaining_requests(stages: &[StageProgress]) -> u64 {
    stages.iter().map(|s| s.total.saturating_sub(s.done)).sum()
}

/// Stage answers so far, over every stage.
pub(super) fn answered(stages: &[StageProgress]) -> u64 {
    stages.iter().map(|s| s.done.min(s.total)).sum()
}

/// Stage answers over time, for the pace.
#[derive(Default)]
pub(super) struct Pace {
    samples: VecDeque<(Instant, u64)>,
}

impl Pace {
    /// Note that `answered` stage answers were done at `now`.
    pub(super) fn observe(&mut self, now: Instant, answered: u64) {
        // A resume that rewound stages (`--rerun-stage`) starts over.
        if self.samples.back().is_some_and(|&(_, n)| answered < n) {
            self.samples.clear();
        }
        self.samples.push_back((now, answered));
        while self.samples.len() > 2 && now.duration_since(self.samples[1].0) >= PACE_WINDOW {
            self.samples.pop_front();
        }
    }

    /// Answers per second over the window, once it spans long enough and
    /// something was answered in it.
    pub(super) fn per_sec(&self) -> Option<f64> {
        let (&(t0, n0), &(t1, n1)) = (self.samples.front()?, self.samples.back()?);
        let span = t1.duration_since(t0);
        (span >= PACE_MIN_SPAN && n1 > n0).then(|| (n1 - n0) as f64 / span.as_secs_f64())
    }
}

/// Seconds until `remaining` requests are answered at `pace` (answers per
/// second), never faster than `limit_per_sec` (the binding requests/min
/// limit, when one binds); without a pace, at the limit. None: nothing
/// left, or neither a pace nor a limit to go by.
pub(super) fn eta_secs(
    remaining: u64,
    pace: Option<f64>,
    limit_per_sec: Option<f64>,
) -> Option<f64> {
    if remaining == 0 {
        return None;
    }
    let limit = limit_per_sec.filter(|l| l.is_finite() && *l > 0.0);
    let rate = match (pace, limit) {
        (Some(p), Some(l)) => p.min(l),
        (Some(p), None) => p,
        (None, l) => l?,
    };
    (rate > 0.0).then(|| remaining as f64 / rate)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(total: u64, done: u64) -> StageProgress {
        StageProgress {
            total,
            done,
            ..StageProgress::default()
        }
    }

    /// Four stages, the first half done, the rest not started: every
    /// stage's remaining requests count (the judge-gym run showed `--:--`
    /// until items passed the last stage).
    #[test]
    fn every_stage_counts_and_the_pace_sets_the_eta() {
        let stages = [stage(100, 50), stage(100, 10), stage(100, 0), stage(100, 0)];
        assert_eq!(remaining_requests(&stages), 340);
        assert_eq!(answered(&stages), 60);
        let t0 = Instant::now();
        let mut pace = Pace::default();
        pace.observe(t0, 0);
        assert_eq!(pace.per_sec(), None, "one sample is no pace");
        pace.observe(t0 + Duration::from_secs(1), 10);
        assert_eq!(pace.per_sec(), None, "a second is too short to tell");
        pace.observe(t0 + Duration::from_secs(6), 60);
        assert_eq!(pace.per_sec(), Some(10.0));
        assert_eq!(eta_secs(340, pace.per_sec(), None), Some(34.0));
        // The limit caps a pace measured while it was not binding yet.
        assert_eq!(eta_secs(340, Some(10.0), Some(2.0)), Some(170.0));
        // Before there is a pace, the limit alone.
        assert_eq!(eta_secs(340, None, Some(20.0)), Some(17.0));
        assert_eq!(eta_secs(340, None, None), None);
        assert_eq!(eta_secs(0, Some(10.0), None), None, "nothing left");
    }

    /// The window keeps a minute: an early burst stops counting.
    #[test]
    fn the_pace_is_the_last_minutes() {
        let t0 = Instant::now();
        let mut pace = Pace::default();
        pace.observe(t0, 0);
        pace.observe(t0 + Duration::from_secs(1), 600);
        for s in 2..=120 {
            pace.observe(t0 + Duration::from_secs(s), 600 + (s - 1));
        }
        let p = pace.per_sec().unwrap();
        assert!((p - 1.0).abs() < 0.05, "{p}");
        // Fewer answered than before (a stage rewound): start over.
        pace.observe(t0 + Duration::from_secs(121), 5);
        assert_eq!(pace.per_sec(), None);
    }
}
