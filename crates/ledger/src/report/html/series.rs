//! The run over time: attempts binned by when they were sent (requests per
//! minute, 429s, failed attempts) and the cost as it accrued (by when each
//! attempt finished). The bin width is chosen from the run's length so a
//! chart has between a few dozen and `MAX_BINS` points.

/// Bin widths to choose from, in seconds.
const WIDTHS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0, 7200.0,
    21600.0, 43200.0, 86400.0,
];

/// At most this many bins (a wider run takes the widest width and more).
pub(super) const MAX_BINS: usize = 120;

/// One attempt's times and outcome.
#[derive(Debug, Clone, Copy)]
pub(super) struct Attempt {
    pub sent: f64,
    pub finished: Option<f64>,
    pub cost: f64,
    pub failed: bool,
    pub rate_limited: bool,
}

/// Counts per bin, the first bin starting at `start`.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct Series {
    pub start: f64,
    pub width: f64,
    pub sent: Vec<u64>,
    pub rate_limited: Vec<u64>,
    pub failed: Vec<u64>,
    /// The cost accrued up to the end of each bin.
    pub cost_so_far: Vec<f64>,
}

impl Series {
    /// The series of `attempts` (any order); empty without attempts.
    pub fn of(attempts: &[Attempt]) -> Series {
        let times = attempts
            .iter()
            .flat_map(|a| [Some(a.sent), a.finished])
            .flatten()
            .filter(|t| t.is_finite());
        let (lo, hi) = times.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), t| {
            (lo.min(t), hi.max(t))
        });
        if !lo.is_finite() {
            return Series::default();
        }
        let span = (hi - lo).max(0.0);
        let width = WIDTHS
            .iter()
            .copied()
            .find(|w| span / w < MAX_BINS as f64)
            .unwrap_or_else(|| (span / MAX_BINS as f64).ceil().max(1.0));
        let n = ((span / width).floor() as usize + 1).min(MAX_BINS + 1);
        let mut s = Series {
            start: lo,
            width,
            sent: vec![0; n],
            rate_limited: vec![0; n],
            failed: vec![0; n],
            cost_so_far: vec![0.0; n],
        };
        let bin = |t: f64| (((t - lo) / width).floor().max(0.0) as usize).min(n - 1);
        let mut cost = vec![0.0; n];
        for a in attempts.iter().filter(|a| a.sent.is_finite()) {
            let b = bin(a.sent);
            s.sent[b] += 1;
            s.failed[b] += u64::from(a.failed);
            s.rate_limited[b] += u64::from(a.rate_limited);
            let paid = a.finished.filter(|t| t.is_finite()).unwrap_or(a.sent);
            cost[bin(paid)] += a.cost;
        }
        let mut total = 0.0;
        for (i, c) in cost.iter().enumerate() {
            total += c;
            s.cost_so_far[i] = total;
        }
        s
    }

    /// Attempts sent per minute in each bin.
    pub fn per_minute(&self, counts: &[u64]) -> Vec<f64> {
        counts
            .iter()
            .map(|&c| c as f64 * 60.0 / self.width.max(1.0))
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.sent.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(sent: f64, finished: f64, cost: f64) -> Attempt {
        Attempt {
            sent,
            finished: Some(finished),
            cost,
            failed: false,
            rate_limited: false,
        }
    }

    #[test]
    fn a_short_run_gets_second_bins_and_the_cost_accrues() {
        let s = Series::of(&[
            at(100.0, 100.5, 0.25),
            at(100.2, 103.9, 0.5),
            at(102.0, 102.1, 1.0),
        ]);
        assert_eq!(s.width, 1.0);
        assert_eq!(s.sent, vec![2, 0, 1, 0]);
        assert_eq!(s.cost_so_far, vec![0.25, 0.25, 1.25, 1.75]);
        assert_eq!(s.per_minute(&s.sent)[0], 120.0);
    }

    #[test]
    fn a_long_run_stays_within_the_bins() {
        let s = Series::of(&[at(0.0, 1.0, 0.0), at(50_000.0, 50_001.0, 0.0)]);
        assert_eq!(s.width, 600.0);
        assert!(s.sent.len() <= MAX_BINS + 1);
        assert_eq!(s.sent.iter().sum::<u64>(), 2);
        assert!(Series::of(&[]).is_empty());
    }
}
