//! Headless output: at most one progress line a second while a run is live,
//! and the seed's final summary.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::RunEnd;
use super::stats::{Stats, StatsSnapshot};
use docket_ledger::store::SessionRow;
use docket_providers::limiter::Limiter;

/// Where the engine's lines go (stdout for the CLI; a buffer in tests).
pub trait Reporter: Send + Sync {
    fn line(&self, text: &str);

    /// The session this run works on is known (created, or resumed); called
    /// once, before anything is dispatched.
    fn session_started(&self, _session_id: &str) {}

    /// A dry run planned and estimated this (after its lines were said):
    /// for a caller that reports it another way (`--format json`).
    fn dry_run_planned(&self, _plan: &DryRunPlan<'_>) {}
}

/// What a dry run found, beside its lines.
pub struct DryRunPlan<'a> {
    pub estimate: &'a crate::Estimate,
    /// Items left out because they await review.
    pub awaiting_review: u64,
    /// One message per provider whose key variable is not set: a real run
    /// would refuse to start.
    pub missing_keys: &'a [String],
}

pub struct StdoutReporter;

impl Reporter for StdoutReporter {
    fn line(&self, text: &str) {
        let text = docket_model::sanitize::lines_for_terminal(text);
        let mut out = std::io::stdout().lock();
        // A closed stdout (a pipe to `head`) must not stop the run.
        let _ = writeln!(out, "{text}");
        let _ = out.flush();
    }
}

pub(super) fn spawn_progress(
    stats: Arc<Stats>,
    limiter: Arc<Limiter>,
    reporter: Arc<dyn Reporter>,
    paused: watch::Receiver<bool>,
    estimated_cost: f64,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let started = Instant::now();
        let first = stats.snapshot();
        let mut window: Vec<(Instant, u64)> = vec![(started, first.sent)];
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.tick().await;
        let mut last_line = String::new();
        let mut last_held: Option<String> = None;
        loop {
            tick.tick().await;
            let s = stats.snapshot();
            let now = Instant::now();
            window.push((now, s.sent));
            // Request rate over the last ten seconds.
            while window.len() > 11 {
                window.remove(0);
            }
            let (t0, n0) = window[0];
            let rate = (s.sent - n0) as f64 / now.duration_since(t0).as_secs_f64().max(0.001);
            let elapsed = now.duration_since(started);
            // The control loop's ETA: every stage's remaining requests at
            // the session's pace, the same the console shows.
            let eta = stats.eta().map(Duration::from_secs_f64);
            let lim = limiter.snapshot();
            // Sends held by a breaker (row S5): why, once, in full; then
            // the progress line says they are held.
            let held = stats.held();
            if held != last_held {
                match &held {
                    Some(why) => reporter.line(&format!(
                        "Held: {}",
                        docket_model::sanitize::for_terminal(why)
                    )),
                    None => reporter.line("No longer held: sending again."),
                }
                last_held = held.clone();
            }
            let why = if *paused.borrow() {
                "PAUSED".to_string()
            } else if let Some(why) = &held {
                held_briefly(why)
            } else {
                lim.slow_reason.describe()
            };
            let line = progress_line(
                &s,
                rate,
                elapsed,
                eta,
                lim.concurrency_limit,
                estimated_cost,
                &why,
            );
            if line != last_line {
                reporter.line(&line);
                last_line = line;
            }
        }
    })
}

/// The progress line's word for held sends: "provider main unreachable:
/// sends held" from the full reason "provider main unreachable: its last
/// 10 sends ...".
fn held_briefly(why: &str) -> String {
    let head = why.split(':').next().unwrap_or(why);
    format!("{}: sends held", docket_model::sanitize::for_terminal(head))
}

#[allow(clippy::too_many_arguments)]
fn progress_line(
    s: &StatsSnapshot,
    rate: f64,
    elapsed: Duration,
    eta: Option<Duration>,
    concurrency: usize,
    estimated_cost: f64,
    why: &str,
) -> String {
    // Never 100% while anything is still in flight.
    let pct = if s.total == 0 {
        0.0
    } else {
        (s.done as f64 * 100.0 / s.total as f64).min(if s.in_flight > 0 { 99.9 } else { 100.0 })
    };
    // The seed's bar: 20 cells, full only when nothing is left.
    let filled = ((pct / 5.0).floor() as usize).min(20);
    let bar = format!("{}{}", "█".repeat(filled), "░".repeat(20 - filled));
    let mut line = format!(
        "[{bar}] {}/{} {:>5.1}% | ✓ {} acc  ⚠ {} rev  ✗ {} rej  ⨯ {} err | pending {} | {:.1} req/s  in flight {} ({})  429s {}  retries {}  ambiguous {} | tokens {} | ${:.4} of ~${:.4} | elapsed {}  ETA {}",
        s.done,
        s.total,
        pct,
        s.accepted,
        s.review,
        s.rejected,
        s.errors,
        s.total.saturating_sub(s.done + s.in_flight),
        rate,
        // One "in flight" with the console: requests sent and not answered;
        // batch lines wait at the provider, counted apart.
        s.in_flight.saturating_sub(s.batched),
        if s.batched > 0 {
            format!("limit {concurrency}; {} at provider", s.batched)
        } else {
            format!("limit {concurrency}")
        },
        s.rate_limited,
        s.retries,
        s.ambiguous,
        s.input_tokens + s.output_tokens,
        s.cost_usd,
        estimated_cost,
        clock(elapsed),
        eta.map(clock).unwrap_or_else(|| "--:--".into()),
    );
    if !why.is_empty() {
        line.push_str(&format!(" | {why}"));
    }
    if s.retry_waiting > 0 {
        line.push_str(&format!(
            " | {} waiting to retry (rate limited)",
            s.retry_waiting
        ));
    }
    // A PostgreSQL ledger down (restarting): the run waits for it.
    if let Some(down) = docket_ledger::db::unreachable() {
        line.push_str(&format!(
            " | {}",
            docket_model::sanitize::for_terminal(&down)
        ));
    }
    line
}

pub fn clock(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60)
    } else {
        format!("{}:{:02}", s / 60, s % 60)
    }
}

fn share(n: u64, total: u64) -> String {
    if total == 0 {
        "0%".into()
    } else {
        format!("{:.0}%", n as f64 * 100.0 / total as f64)
    }
}

/// Attempts whose request left but whose answer never came (a timeout, a
/// cut connection, a stop) may have been billed as well as the request
/// sent again (row S6): their count, and what they would cost at the
/// session's average cost per item so far (the ledger counts none of it).
fn possible_duplicate_charges(s: &SessionRow) -> String {
    let per_item = if s.processed_count > 0 {
        s.cost_usd / s.processed_count as f64
    } else {
        0.0
    };
    format!(
        "  possible duplicate charges: {} attempt(s) got no answer after their request left; the provider may have billed each (about ${:.4} at this session's cost per item; not in the cost above)",
        s.ambiguous_count,
        per_item * s.ambiguous_count as f64
    )
}

/// The seed's final summary, from the ledger's counters.
pub fn format_summary(s: &SessionRow, end: &RunEnd) -> Vec<String> {
    let p = s.processed_count;
    let mut lines = vec![
        String::new(),
        format!("Session {}: {}", s.session_id, s.state),
        format!(
            "Processed {}/{} ({})",
            p,
            s.total_count,
            share(p, s.total_count)
        ),
        String::new(),
        "Statistics:".into(),
        format!(
            "  ✓ Auto-accepted:  {} ({})",
            s.accepted_count,
            share(s.accepted_count, p)
        ),
        format!(
            "  ⚠ Needs review:   {} ({})",
            s.reviewed_count,
            share(s.reviewed_count, p)
        ),
        format!(
            "  ✗ Rejected:       {} ({})",
            s.rejected_count,
            share(s.rejected_count, p)
        ),
        format!(
            "  ⨯ Errors:         {} ({})",
            s.error_count,
            share(s.error_count, p)
        ),
        format!(
            "  retries {}  429s {}  ambiguous attempts {}  pending {}",
            s.retry_count,
            s.rate_limited_count,
            s.ambiguous_count,
            s.total_count.saturating_sub(p)
        ),
        format!(
            "  tokens {} in / {} out  cost ${:.4} (estimate ${:.4})",
            s.input_tokens, s.output_tokens, s.cost_usd, s.estimated_cost_usd
        ),
    ];
    if s.ambiguous_count > 0 {
        lines.push(possible_duplicate_charges(s));
    }
    lines.extend(what_next(&s.session_id, end));
    lines
}

/// What the operator can do next, as the run ended: read the results, or
/// resume the session.
fn what_next(session_id: &str, end: &RunEnd) -> Vec<String> {
    let mut next = Vec::new();
    let resume = format!("  docket batch-adjudicate --resume {session_id}");
    match end {
        RunEnd::Completed => {
            next.push(String::new());
            next.push(format!("Results: docket batch-results {session_id}"));
        }
        RunEnd::Cancelled => {
            next.push(String::new());
            next.push("Session saved. Resume with:".into());
            next.push(resume);
        }
        RunEnd::Stopped(why) | RunEnd::LedgerFailed(why) => {
            next.push(String::new());
            next.push(format!(
                "Stopped: {}",
                docket_model::sanitize::for_terminal(why)
            ));
            next.push("Session saved. Resume with:".into());
            next.push(resume);
        }
        RunEnd::Paused(why) => {
            next.push(String::new());
            next.push(format!(
                "Paused: {}",
                docket_model::sanitize::for_terminal(why)
            ));
            // Only the budget is helped by a higher --max-cost; an operator's
            // pause, a full disk or an unknown model are not.
            next.push(if why.starts_with(crate::budget::BUDGET_REACHED) {
                "Session saved. Raise --max-cost, then resume with:".into()
            } else {
                "Session saved. Resume with:".into()
            });
            next.push(resume);
        }
        _ => {}
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_shows_100_percent_while_in_flight() {
        let line = |in_flight| {
            let s = StatsSnapshot {
                total: 10,
                done: 10,
                in_flight,
                ..Default::default()
            };
            progress_line(&s, 1.0, Duration::from_secs(5), None, 4, 0.0, "")
        };
        assert!(line(1).contains(" 99.9%"), "{}", line(1));
        assert!(line(1).contains("███████████████████░]"), "{}", line(1));
        assert!(line(0).contains("100.0%"), "{}", line(0));
        assert!(line(0).starts_with("[████████████████████]"), "{}", line(0));
    }

    #[test]
    fn held_sends_are_named_on_the_line() {
        let why = held_briefly(
            "provider main unreachable: its last 10 sends, for 4 items, did not reach the provider (the last: dns error)",
        );
        assert_eq!(why, "provider main unreachable: sends held");
        let line = progress_line(
            &StatsSnapshot::default(),
            0.0,
            Duration::from_secs(5),
            None,
            4,
            0.0,
            &why,
        );
        assert!(
            line.ends_with(" | provider main unreachable: sends held"),
            "{line}"
        );
    }

    #[test]
    fn only_a_budget_pause_says_to_raise_max_cost() {
        let text =
            |why: &str| what_next("batch_20261124_5u8", &RunEnd::Paused(why.into())).join("\n");
        let by_operator = text("paused by operator");
        assert!(!by_operator.contains("--max-cost"), "{by_operator}");
        assert!(
            by_operator
                .contains("Resume with:\n  docket batch-adjudicate --resume batch_20261124_5u8"),
            "{by_operator}"
        );
        let budget = text(&format!(
            "{}: $0.0010 spent of $0.0010",
            crate::budget::BUDGET_REACHED
        ));
        assert!(
            budget.contains("Raise --max-cost, then resume with:"),
            "{budget}"
        );
    }

    #[test]
    fn clock_format() {
        assert_eq!(clock(Duration::from_secs(923)), "15:23");
        assert_eq!(clock(Duration::from_secs(3_723)), "1:02:03");
    }
}
