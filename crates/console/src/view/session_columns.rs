//! The sessions pane on a wide screen: after the counters, when and how
//! long each session ran, its estimated cost and why it stopped, instead of
//! empty columns. A narrow pane keeps the base columns alone.

use docket_ledger::watch::SessionSummary;
use docket_model::sanitize::truncate;

use super::clock;

/// The base columns take this many cells: the header's 93 (the state
/// column as wide as the longest state word), the age padded to 5.
const BASE: usize = 95;
/// The wide columns (without the stop reason) take this many.
const WIDE: usize = 16 + 2 + 9 + 2 + 10;
/// Room for at least this much of the stop reason, or no wide columns.
const REASON_MIN: usize = 12;

fn wide(width: usize) -> bool {
    width >= BASE + WIDE + 2 + REASON_MIN
}

/// `text` padded to the base columns (`BASE` cells).
fn padded(text: String) -> String {
    let n = text.chars().count();
    format!("{text}{}", " ".repeat(BASE.saturating_sub(n)))
}

/// The header line, with the wide columns when `width` has room.
pub(super) fn header(base: &str, width: usize) -> String {
    if !wide(width) {
        return base.to_string();
    }
    format!(
        "{}{:<16}  {:>9}  {:>10}  stop reason",
        padded(base.to_string()),
        "started (UTC)",
        "took",
        "est. cost"
    )
}

/// A session's row, with the wide columns when `width` has room.
pub(super) fn row(base: String, s: &SessionSummary, now: f64, width: usize) -> String {
    if !wide(width) {
        return base;
    }
    let started = chrono::DateTime::from_timestamp(s.started_at as i64, 0)
        .map(|t| t.format("%Y-%m-%d %H:%M").to_string())
        .unwrap_or_else(|| "--".into());
    let took = clock(s.completed_at.unwrap_or(now) - s.started_at);
    let reason = s.stop_reason.as_deref().unwrap_or("");
    let room = width - BASE - WIDE - 2;
    format!(
        "{}{started:<16}  {took:>9}  {:>10}  {}",
        padded(base),
        format!("${:.4}", s.estimated_cost_usd),
        truncate(reason, room)
    )
}
