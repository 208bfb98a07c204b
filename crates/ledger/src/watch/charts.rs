//! The console's charts as plain data: each stage's confidences counted in
//! bins (the histogram), and the run's attempts, 429s, errors and spend per
//! slice of time (the sparklines). `ledger::console::ConsoleReads::charts`
//! fills it; the console only draws it.

/// Bins of the confidence histogram: 0.05 wide, from 0 to 1 (a confidence
/// of exactly 1 counts in the last bin).
pub const CONFIDENCE_BINS: usize = 20;
/// Slices of the run's time line; the console merges them to its width.
pub const TIMELINE_SLICES: usize = 240;

/// Everything the charts draw for one session.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChartData {
    /// One histogram per stage whose answers gave a confidence, in job
    /// order (stages the session has no checkpoint of last, by name).
    pub confidence: Vec<StageHistogram>,
    pub timeline: Timeline,
    /// The calibration page's figures (`docket calibrate`'s, at its
    /// default target), computed on the data side: a few bands, not every
    /// confidence of the session, cross to the UI. None without a session.
    pub calibration: Option<docket_model::calibration::Summary>,
}

/// The confidences of the outcomes a stage decided.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StageHistogram {
    /// As stored (the console makes it safe when drawn).
    pub stage: String,
    /// [`CONFIDENCE_BINS`] counts, lowest confidence first.
    pub bins: Vec<u64>,
}

impl StageHistogram {
    pub fn total(&self) -> u64 {
        self.bins.iter().sum()
    }
}

/// The bin of a confidence; None for one outside 0..=1 (or NaN).
pub fn confidence_bin(c: f64) -> Option<usize> {
    if !(0.0..=1.0).contains(&c) {
        return None;
    }
    // `as` truncates toward zero: 0.05 lands in bin 1, 1.0 in the last.
    Some(((c * CONFIDENCE_BINS as f64) as usize).min(CONFIDENCE_BINS - 1))
}

/// The run from its start to its end (or now) in equal slices.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timeline {
    /// Unix seconds of the first slice's start.
    pub start: f64,
    /// Seconds per slice (0 when nothing was sent).
    pub slice_secs: f64,
    /// Attempts sent in each slice.
    pub sent: Vec<u64>,
    /// Attempts answered 429 (rate limited), by when they finished.
    pub throttled: Vec<u64>,
    /// Other failed attempts, by when they finished.
    pub errors: Vec<u64>,
    /// The spend up to the end of each slice (cumulative, USD).
    pub cost: Vec<f64>,
}

/// One attempt, as the timeline counts it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttemptPoint {
    pub sent_at: f64,
    pub finished_at: Option<f64>,
    pub throttled: bool,
    pub failed: bool,
    pub cost_usd: f64,
}

impl Timeline {
    /// Count `points` into [`TIMELINE_SLICES`] slices from `start` to `end`
    /// (widened to cover every point; a point with no finite time is left out).
    pub fn build(start: f64, end: f64, points: &[AttemptPoint]) -> Timeline {
        let finite = |t: f64| t.is_finite().then_some(t);
        let times = points
            .iter()
            .flat_map(|p| [finite(p.sent_at), p.finished_at.and_then(finite)])
            .flatten();
        let (lo, hi) = times.fold((start, end), |(lo, hi), t| (lo.min(t), hi.max(t)));
        if !lo.is_finite() || !hi.is_finite() || points.is_empty() {
            return Timeline::default();
        }
        let n = TIMELINE_SLICES;
        // A run shorter than a second still gets slices a fraction wide.
        let slice_secs = ((hi - lo) / n as f64).max(1e-3);
        let at = |t: f64| (((t - lo) / slice_secs) as usize).min(n - 1);
        let mut t = Timeline {
            start: lo,
            slice_secs,
            sent: vec![0; n],
            throttled: vec![0; n],
            errors: vec![0; n],
            cost: vec![0.0; n],
        };
        for p in points {
            if p.sent_at.is_finite() {
                t.sent[at(p.sent_at)] += 1;
            }
            let done = p.finished_at.filter(|f| f.is_finite()).unwrap_or(p.sent_at);
            if !done.is_finite() {
                continue;
            }
            if p.throttled {
                t.throttled[at(done)] += 1;
            } else if p.failed {
                t.errors[at(done)] += 1;
            }
            if p.cost_usd.is_finite() && p.cost_usd > 0.0 {
                t.cost[at(done)] += p.cost_usd;
            }
        }
        let mut sum = 0.0;
        for c in &mut t.cost {
            sum += *c;
            *c = sum;
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn confidences_fall_in_their_bins_and_odd_ones_in_none() {
        assert_eq!(confidence_bin(0.0), Some(0));
        assert_eq!(confidence_bin(0.049), Some(0));
        assert_eq!(confidence_bin(0.85), Some(17));
        assert_eq!(confidence_bin(1.0), Some(CONFIDENCE_BINS - 1));
        assert_eq!(confidence_bin(1.2), None);
        assert_eq!(confidence_bin(-0.1), None);
        assert_eq!(confidence_bin(f64::NAN), None);
    }

    #[test]
    fn the_timeline_counts_each_attempt_once_and_sums_the_spend() {
        let p = |sent: f64, fin: f64, throttled, failed, cost| AttemptPoint {
            sent_at: sent,
            finished_at: Some(fin),
            throttled,
            failed,
            cost_usd: cost,
        };
        let points = [
            p(0.0, 1.0, false, false, 0.5),
            p(10.0, 11.0, true, true, 0.0),
            p(20.0, 24.0, false, true, 0.25),
            p(23.0, f64::NAN, false, false, 0.0),
        ];
        let t = Timeline::build(0.0, 24.0, &points);
        assert_eq!(t.sent.iter().sum::<u64>(), 4);
        assert_eq!(t.throttled.iter().sum::<u64>(), 1);
        assert_eq!(t.errors.iter().sum::<u64>(), 1);
        assert_eq!(*t.cost.last().unwrap(), 0.75);
        assert_eq!(t.sent.len(), TIMELINE_SLICES);
        assert!((t.slice_secs - 0.1).abs() < 1e-9);
        assert_eq!(Timeline::build(0.0, 1.0, &[]), Timeline::default());
    }
}
