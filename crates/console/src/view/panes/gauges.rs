//! The gauges pane: the live limits and their use, the run's counts, time
//! and cost, and why it is slow or stopped.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::gauge_columns;
use crate::app::{App, Pane};
use crate::theme::Theme;
use crate::view::{batch_summary_text, clock, compact, pane_block, styled};
use docket_ledger::watch::{LiveGauges, SessionView, ShownState};
use docket_model::sanitize::truncate;

pub(in crate::view) fn draw_gauges(frame: &mut Frame, area: Rect, app: &App, theme: Theme) {
    let block = pane_block(app, Pane::Gauges, String::new(), theme);
    let Some(v) = &app.snap.view else {
        frame.render_widget(Paragraph::new("").block(block), area);
        return;
    };
    let g = v.gauges.clone().unwrap_or_default();
    let columns = gauge_columns::Columns::for_pane(block.inner(area));
    let width = columns.width();
    let mut lines = limit_lines(v, &g, width, theme);
    let limits = lines.len();
    lines.extend(run_lines(app, v, &g));
    lines.push(Line::from(status_span(v, &g, theme)));
    if let Some(text) = batch_summary_text(&app.snap.batch_summary, width) {
        let style = if app.snap.batch_summary.in_state("unknown") > 0 {
            theme.warn()
        } else {
            theme.text()
        };
        lines.push(Line::from(styled(text, style)));
    }
    if v.live && g.deadline_secs > 0.0 {
        lines.push(Line::from(deadline_text(&g)));
    }
    columns.draw(frame, area, block, lines, limits, (v, &g), theme);
}

/// Three lines: the rate limits and concurrency in use when an engine runs
/// the session, else what is in flight and pending.
fn limit_lines<'a>(v: &SessionView, g: &LiveGauges, width: usize, theme: Theme) -> Vec<Line<'a>> {
    let live = v.live;
    let limit = |n: u64| {
        if n == 0 {
            "no limit".to_string()
        } else {
            compact(n as f64)
        }
    };
    let mut lines = Vec::new();
    // The limiter's count of the sends of the last 60 seconds, taken when
    // it let them go (not a short span scaled up): never above the limit.
    let rate = compact;
    if live {
        lines.push(Line::from(format!(
            "req/min  {:>7} / {}",
            rate(g.rpm_used),
            limit(g.rpm_limit)
        )));
        lines.push(Line::from(format!(
            "tok/min  {:>7} / {}",
            rate(g.tpm_used),
            limit(g.tpm_limit)
        )));
        lines.push(Line::from(concurrency_text(v, g, width)));
    } else {
        lines.push(Line::from(styled(
            "no engine running this session",
            theme.dim(),
        )));
        lines.push(Line::from(format!(
            "in flight {}{} · pending {}",
            v.in_flight,
            at_provider(v),
            v.pending
        )));
        lines.push(Line::from(""));
    }
    lines
}

/// The concurrency in use and what is in flight (and at the provider),
/// the most detailed form that fits `width`: the counts are never cut.
fn concurrency_text(v: &SessionView, g: &LiveGauges, width: usize) -> String {
    let limit = format!("{}/{}", g.concurrency_limit, g.max_concurrency);
    let counts = format!("{} in flight{}", v.in_flight, at_provider(v));
    let candidates = [
        format!("concurrency {limit} AIMD · {counts}"),
        format!("concurrency {limit} · {counts}"),
        format!("conc {limit} · {counts}"),
        counts,
    ];
    candidates
        .iter()
        .find(|c| c.chars().count() <= width)
        .unwrap_or(&candidates[3])
        .clone()
}

/// Batch lines waiting at the provider: counted apart from what is in
/// flight (they hold no concurrency slot and no request/min).
fn at_provider(v: &SessionView) -> String {
    if v.at_provider > 0 {
        format!(" · {} at provider", v.at_provider)
    } else {
        String::new()
    }
}

/// Rate-limit refusals and retries, time and tokens, cost.
fn run_lines<'a>(app: &App, v: &SessionView, g: &LiveGauges) -> Vec<Line<'a>> {
    let r = &v.row;
    let live = v.live;
    let mut lines = Vec::new();
    lines.push(Line::from(format!(
        "429s {} · retries {} · ambiguous {}",
        r.rate_limited_count, r.retry_count, r.ambiguous_count
    )));
    let elapsed = if live {
        g.elapsed_secs
    } else {
        r.completed_at.unwrap_or(app.snap.now) - r.started_at
    };
    let eta = match g.eta_secs {
        Some(e) if live => clock(e),
        _ => "--:--".into(),
    };
    let tokens = r.input_tokens + r.output_tokens;
    lines.push(Line::from(format!(
        "elapsed {} · ETA {eta} · {} tok",
        clock(elapsed),
        compact(tokens as f64)
    )));
    lines.push(Line::from(format!(
        "cost ${:.4} of est. ${:.4}",
        r.cost_usd, r.estimated_cost_usd
    )));
    lines
}

/// Paused, slow (and why) while live, or why a finished run stopped.
fn status_span<'a>(v: &SessionView, g: &LiveGauges, theme: Theme) -> Span<'a> {
    let r = &v.row;
    let live = v.live;
    if v.shown == ShownState::Paused {
        styled("⏸ PAUSED: no new requests", theme.alert_badge())
    } else if v.shown == ShownState::Pausing {
        styled(
            "⏸ PAUSING: no new requests; in-flight ones finish",
            theme.alert_badge(),
        )
    } else if live && !g.slow_reason.is_empty() {
        styled(
            format!("slow: {}", truncate(&g.slow_reason, 60)),
            theme.warn(),
        )
    } else if let Some(reason) = r.stop_reason.as_deref().filter(|_| !live) {
        styled(
            format!("stopped: {}", docket_model::sanitize::truncate(reason, 60)),
            theme.dim(),
        )
    } else {
        styled("", theme.dim())
    }
}

/// How long a request may go unanswered before it is cut and sent again
/// (last in the pane: the first line a short pane drops).
fn deadline_text(g: &LiveGauges) -> String {
    let cuts = if g.deadline_cuts > 0 {
        format!(" · {} cut", g.deadline_cuts)
    } else {
        String::new()
    };
    match g.latency_p99_secs {
        Some(p99) => format!(
            "deadline {} (p99 {}){cuts}",
            seconds(g.deadline_secs),
            seconds(p99)
        ),
        None => format!(
            "deadline {} (timeout; learning){cuts}",
            seconds(g.deadline_secs)
        ),
    }
}

fn seconds(s: f64) -> String {
    if s < 10.0 {
        format!("{s:.1} s")
    } else {
        format!("{s:.0} s")
    }
}
