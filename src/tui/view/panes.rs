//! The header and the three run panes: stages, outcomes, gauges.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::{batch_summary_text, clock, compact, pane_block, share, styled};
use crate::sanitize::truncate;
use crate::tui::app::{App, Pane};
use crate::tui::theme::Theme;

pub(super) fn draw_header(frame: &mut Frame, area: Rect, app: &App, theme: Theme) {
    let mut spans = vec![styled(" docket ", theme.badge()), Span::raw(" ")];
    match &app.snap.view {
        Some(v) => {
            spans.push(styled(truncate(&v.row.session_id, 40), theme.title(true)));
            spans.push(Span::raw("  "));
            spans.push(styled(
                state_word(&v.row.state, v.live),
                state_style(&v.row.state, theme),
            ));
            // A wish only matters while an engine can still act on it.
            let open = matches!(v.row.state.as_str(), "running" | "paused");
            if open && v.row.desired_state != v.row.state {
                spans.push(styled(
                    format!(" (asked: {})", truncate(&v.row.desired_state, 20)),
                    theme.warn(),
                ));
            }
            if app.chosen_session.is_none() {
                spans.push(styled("  · newest session", theme.dim()));
            }
        }
        None if !app.loaded => spans.push(styled("reading the ledger...", theme.dim())),
        None => spans.push(styled(
            "no session yet: run `docket batch-adjudicate` (or `docket demo`)",
            theme.dim(),
        )),
    }
    spans.push(styled(
        format!("  · review queue {}", app.snap.review.total),
        theme.dim(),
    ));
    frame.render_widget(Paragraph::new(Line::from(spans)), area);
}

/// A state as a word with a glyph, so it reads without colour.
pub(super) fn state_word(state: &str, live: bool) -> String {
    let glyph = match state {
        "running" if live => "▶",
        "running" => "◌",
        "paused" => "⏸",
        "completed" => "✓",
        "cancelled" => "■",
        "error" => "!",
        _ => "·",
    };
    let note = match state {
        "running" if !live => " (no engine: interrupted, resumable)",
        _ => "",
    };
    format!("{glyph} {}{note}", state.to_uppercase())
}

pub(super) fn state_style(state: &str, theme: Theme) -> ratatui::style::Style {
    match state {
        "running" => theme.accepted(),
        "paused" | "cancelled" => theme.warn(),
        "error" => theme.error(),
        _ => theme.text(),
    }
}

/// A text bar that reads without colour: `████░░░░`.
pub(super) fn bar(done: u64, total: u64, width: usize) -> String {
    let filled = if total == 0 {
        0
    } else {
        ((done.min(total) as f64 / total as f64) * width as f64).floor() as usize
    };
    let filled = if done < total {
        filled.min(width.saturating_sub(1))
    } else {
        filled
    };
    format!("{}{}", "█".repeat(filled), "░".repeat(width - filled))
}

/// Percent done; never 100% while anything is left or in flight.
pub(super) fn percent(done: u64, total: u64, in_flight: u64) -> String {
    if total == 0 {
        return "0.0%".into();
    }
    let p = done as f64 * 100.0 / total as f64;
    let p = if (done < total || in_flight > 0) && p > 99.9 {
        99.9
    } else {
        (p * 10.0).floor() / 10.0
    };
    format!("{p:.1}%")
}

pub(super) fn draw_stages(frame: &mut Frame, area: Rect, app: &App, theme: Theme) {
    let block = pane_block(app, Pane::Stages, String::new(), theme);
    let inner_w = area.width.saturating_sub(2) as usize;
    let mut lines = Vec::new();
    match &app.snap.view {
        Some(v) => {
            for s in &v.stages {
                let label = truncate(&s.name, 16);
                let pct = percent(s.done, s.total, s.in_flight);
                // Asked to stop after this stage: said on the label line,
                // which is never cut, rather than at the end of the counts.
                let stopping = v.stop_after_stage.as_deref() == Some(s.name.as_str());
                let mark = if stopping { " ⏹ stop after" } else { "" };
                let used = label.chars().count() + mark.chars().count() + pct.len() + 3;
                let bar_w = inner_w.saturating_sub(used).max(4);
                lines.push(Line::from(vec![
                    styled(format!("{label} "), theme.title(false)),
                    styled(bar(s.done, s.total, bar_w), theme.gauge()),
                    Span::raw(format!(" {pct}")),
                    styled(mark, theme.warn()),
                ]));
                let counts = format!(
                    "{}/{} done · {} failed · {} in flight",
                    s.done, s.total, s.failed, s.in_flight
                );
                // On a narrow pane "done" goes first, so "in flight" stays whole.
                let counts = if counts.chars().count() > inner_w {
                    counts.replacen(" done", "", 1)
                } else {
                    counts
                };
                lines.push(Line::from(counts));
            }
        }
        None => lines.push(Line::from(styled("no session", theme.dim()))),
    }
    frame.render_widget(Paragraph::new(lines).block(block), area);
}

pub(super) fn draw_outcomes(frame: &mut Frame, area: Rect, app: &App, theme: Theme) {
    let block = pane_block(app, Pane::Outcomes, String::new(), theme);
    let Some(v) = &app.snap.view else {
        frame.render_widget(Paragraph::new("").block(block), area);
        return;
    };
    let r = &v.row;
    let processed = r.processed_count;
    let bar_w = (area.width.saturating_sub(2) as usize)
        .saturating_sub(30)
        .clamp(0, 30);
    let row = |glyph: &str, name: &str, n: u64, style| {
        Line::from(vec![
            styled(format!("{glyph} {name:<9}"), style),
            Span::raw(format!("{n:>7} {:>6} ", share(n, processed))),
            styled(bar(n, processed.max(1), bar_w), style),
        ])
    };
    let lines = vec![
        row("✓", "accepted", r.accepted_count, theme.accepted()),
        row("?", "review", r.reviewed_count, theme.review()),
        row("✗", "rejected", r.rejected_count, theme.rejected()),
        row("!", "errors", r.error_count, theme.error()),
    ];
    frame.render_widget(Paragraph::new(lines).block(block), area);
}

pub(super) fn draw_gauges(frame: &mut Frame, area: Rect, app: &App, theme: Theme) {
    let block = pane_block(app, Pane::Gauges, String::new(), theme);
    let Some(v) = &app.snap.view else {
        frame.render_widget(Paragraph::new("").block(block), area);
        return;
    };
    let r = &v.row;
    let g = v.gauges.clone().unwrap_or_default();
    let live = v.live;
    let limit = |n: u64| {
        if n == 0 {
            "no limit".to_string()
        } else {
            compact(n as f64)
        }
    };
    let mut lines = Vec::new();
    // A rate over the first seconds is mostly the start-up burst scaled to a
    // minute: it would read as the limiter failing, so it waits.
    let rate = |n: f64| {
        if g.elapsed_secs < 5.0 {
            "--".to_string()
        } else {
            compact(n)
        }
    };
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
        lines.push(Line::from(format!(
            "concurrency {}/{} AIMD · {} in flight",
            g.concurrency_limit, g.max_concurrency, v.in_flight
        )));
    } else {
        lines.push(Line::from(styled(
            "no engine running this session",
            theme.dim(),
        )));
        lines.push(Line::from(format!(
            "in flight {} · pending {}",
            v.in_flight, v.pending
        )));
        lines.push(Line::from(""));
    }
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
    let slow = if app.paused() {
        styled("⏸ PAUSED: no new requests", theme.alert_badge())
    } else if live && !g.slow_reason.is_empty() {
        styled(
            format!("slow: {}", truncate(&g.slow_reason, 60)),
            theme.warn(),
        )
    } else if let Some(reason) = r.stop_reason.as_deref().filter(|_| !live) {
        styled(
            format!("stopped: {}", crate::sanitize::truncate(reason, 60)),
            theme.dim(),
        )
    } else {
        styled("", theme.dim())
    };
    lines.push(Line::from(slow));
    let width = usize::from(area.width.saturating_sub(2));
    if let Some(text) = batch_summary_text(&app.snap.batch_summary, width) {
        let style = if app.snap.batch_summary.in_state("unknown") > 0 {
            theme.warn()
        } else {
            theme.text()
        };
        lines.push(Line::from(styled(text, style)));
    }
    frame.render_widget(Paragraph::new(lines).block(block), area);
}
