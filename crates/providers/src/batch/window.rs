//! How long a batch may take: the usual 24 h window, when a batch counts
//! as stalled (row B8), how that is said, and the clock margin of `find`.

use std::time::Duration;

/// How long a batch may take before it is late: every Batch API docket
/// speaks aims to finish within 24 h (OpenAI's and Azure's
/// `completion_window`, Anthropic's expiry, Gemini's target).
pub const USUAL_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// Row B8: how long a batch in `state` (as the ledger stores it), at the
/// provider since `since` (unix seconds), has been stalled at `now`: the
/// time past `window` (`USUAL_WINDOW` unless configured) while the provider
/// still has not finished it. None when it is not stalled (finished, not
/// at the provider yet, or within its time).
pub fn stalled_for(
    state: &str,
    since: Option<f64>,
    now: f64,
    window: Option<Duration>,
) -> Option<Duration> {
    let running = matches!(
        state,
        "validating" | "in_progress" | "finalizing" | "cancelling"
    );
    let since = since.filter(|s| s.is_finite())?;
    let past = now - since - window.unwrap_or(USUAL_WINDOW).as_secs_f64();
    (running && past.is_finite() && past > 0.0).then(|| Duration::from_secs_f64(past))
}

/// A duration as the console and the run's lines say it: `45s`, `12m`,
/// `3h 5m`, `2d 4h`.
pub fn human_duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86_400 => match (s / 3600, s % 3600 / 60) {
            (h, 0) => format!("{h}h"),
            (h, m) => format!("{h}h {m}m"),
        },
        _ => match (s / 86_400, s % 86_400 / 3600) {
            (d, 0) => format!("{d}d"),
            (d, h) => format!("{d}d {h}h"),
        },
    }
}

/// How far before `created_after` every `find` looks, in seconds:
/// `created_after` is the local clock, compared with the provider's
/// timestamps, and a local clock running a little fast must not hide the
/// batch being looked for. A wider window is the safe side: at worst it
/// makes `Found::Ambiguous` more likely.
pub const FIND_CLOCK_MARGIN: f64 = 600.0;
