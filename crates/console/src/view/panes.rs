//! The header and the three run panes: stages, outcomes, gauges.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::{batch_summary_text, clock, compact, pane_block, share, styled};
use crate::app::{App, Pane};
use crate::theme::Theme;
use docket_ledger::watch::{SessionView, StageProgress};
use docket_model::sanitize::truncate;

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
    let p = done.min(total) as f64 * 100.0 / total as f64;
    let p = if (done < total || in_flight > 0) && p > 99.9 {
        99.9
    } else {
        (p * 10.0).floor() / 10.0
    };
    format!("{p:.1}%")
}

/// A stage's state as a glyph (the words the header uses for sessions);
/// empty when the ledger has no checkpoint for it.
fn stage_glyph(s: &StageProgress) -> &'static str {
    match s.state.as_deref() {
        None => "",
        Some("done") => "✓ ",
        Some("running") => "▶ ",
        Some("pending") => "· ",
        Some(_) => "? ",
    }
}

/// Done (finished with the stage in any way) as the bar and the percentage
/// show it: never all of it while anything is pending or in flight.
fn shown_done(s: &StageProgress) -> (u64, u64) {
    let finished = s.is_finished();
    let done = if finished {
        s.done
    } else {
        s.done.min(s.total.saturating_sub(1))
    };
    (done, u64::from(!finished).max(s.in_flight))
}

/// The counts line of a stage on two rows: the most detailed that fits.
fn stage_counts(s: &StageProgress, width: usize) -> String {
    if s.state.is_none() && !s.is_critic() && s.skipped == 0 {
        // A session without a checkpoint: its one stage, as always.
        let counts = format!(
            "{}/{} done · {} failed · {} in flight",
            s.done, s.total, s.failed, s.in_flight
        );
        // On a narrow pane "done" goes first, so "in flight" stays whole.
        return if counts.chars().count() > width {
            counts.replacen(" done", "", 1)
        } else {
            counts
        };
    }
    let all = format!(
        "{}/{} done · {} failed · {} skipped · {} in flight",
        s.done, s.total, s.failed, s.skipped, s.in_flight
    );
    let state = s.state.as_deref().map(|st| truncate(st, 10).to_uppercase());
    let with_state = match &state {
        Some(st) => format!("{all} · {st}"),
        None => all.clone(),
    };
    let of = s
        .critic_of
        .as_deref()
        .map(|of| format!(" · critic of {}", truncate(of, 20)))
        .unwrap_or_default();
    // Narrow: what is zero goes, then the words shorten.
    let some = |long: bool| {
        let mut parts = vec![format!("{}/{}", s.done, s.total)];
        for (n, word, short) in [
            (s.failed, "failed", "fail"),
            (s.skipped, "skipped", "skip"),
            (s.in_flight, "in flight", "in flight"),
        ] {
            if n > 0 {
                parts.push(format!("{n} {}", if long { word } else { short }));
            }
        }
        parts
    };
    let candidates = [
        format!("{with_state}{of}"),
        with_state,
        all,
        some(true).join(" · "),
        some(false).join(" · "),
        some(false).join(" "),
    ];
    candidates
        .iter()
        .find(|c| c.chars().count() <= width)
        .cloned()
        .unwrap_or_else(|| truncate(&candidates[5], width.max(1)))
}

/// How many rows the stages pane wants for `n` stages: two each, or one
/// each and a legend (`compact`).
pub(super) fn stages_height(n: usize, compact: bool) -> u16 {
    let n = u16::try_from(n.max(1)).unwrap_or(u16::MAX / 4);
    if compact { 2 + n } else { 2 + n * 2 }
}

pub(super) fn draw_stages(frame: &mut Frame, area: Rect, app: &App, compact: bool, theme: Theme) {
    let mut block = pane_block(app, Pane::Stages, String::new(), theme);
    let inner_w = area.width.saturating_sub(2) as usize;
    let mut lines = Vec::new();
    match &app.snap.view {
        Some(v) if compact => {
            let (rows, legend, total) = compact_stages(v, inner_w, theme);
            lines = rows;
            if let Some(total) = total {
                let extra = format!(" · of {total} each");
                block = pane_block(app, Pane::Stages, extra, theme);
            }
            if !legend.is_empty() {
                block = block.title_bottom(Line::from(styled(legend, theme.dim())));
            }
        }
        Some(v) => {
            for s in &v.stages {
                let glyph = stage_glyph(s);
                let role = if s.is_critic() { "↳ " } else { "" };
                let mut label = truncate(&s.name, 16);
                let (done, pending) = shown_done(s);
                let mut pct = format!(" {}", percent(s.done, s.total, pending));
                // Asked to stop after this stage: said on the label line,
                // which is never cut, rather than at the end of the counts.
                let stopping = v.stop_after_stage.as_deref() == Some(s.name.as_str());
                let mark = if stopping { " ⏹ stop after" } else { "" };
                let width = |label: &str, pct: &str| {
                    glyph.chars().count()
                        + role.chars().count()
                        + label.chars().count()
                        + mark.chars().count()
                        + pct.chars().count()
                        + 2
                };
                // Too narrow for all of it: the percentage goes (the counts
                // say as much), then the name is cut.
                if inner_w.saturating_sub(width(&label, &pct)) < 4 {
                    pct.clear();
                }
                let over = (width(&label, &pct) + 4).saturating_sub(inner_w);
                if over > 0 {
                    label = truncate(&s.name, label.chars().count().saturating_sub(over).max(4));
                }
                // A critic names what it judges where the bar can spare it.
                let of = s
                    .critic_of
                    .as_deref()
                    .map(|of| format!("of {} ", truncate(of, 20)))
                    .filter(|of| {
                        inner_w.saturating_sub(width(&label, &pct) + of.chars().count()) >= 16
                    })
                    .unwrap_or_default();
                let bar_w = inner_w
                    .saturating_sub(width(&label, &pct) + of.chars().count())
                    .max(4);
                lines.push(Line::from(vec![
                    styled(glyph, theme.text()),
                    styled(role, theme.dim()),
                    styled(format!("{label} "), theme.title(false)),
                    styled(of, theme.dim()),
                    styled(bar(done, s.total, bar_w), theme.gauge()),
                    Span::raw(pct),
                    styled(mark, theme.warn()),
                ]));
                lines.push(Line::from(stage_counts(s, inner_w)));
            }
        }
        None => lines.push(Line::from(styled("no session", theme.dim()))),
    }
    frame.render_widget(Paragraph::new(lines).block(block), area);
}

/// One row per stage: `▶ ↳name ███░ done ✗f ⊘s ⇡n ⏹` (`done/total` when the
/// stages' totals differ; else the total is in the title), the bars and
/// counts aligned. Also the title's total and a legend of the glyphs shown,
/// for the pane's bottom border.
fn compact_stages<'a>(
    v: &SessionView,
    inner_w: usize,
    theme: Theme,
) -> (Vec<Line<'a>>, String, Option<u64>) {
    let same_total = v
        .stages
        .first()
        .map(|f| f.total)
        .filter(|t| v.stages.iter().all(|s| s.total == *t));
    let (mut any_failed, mut any_skipped, mut any_flight, mut any_critic, mut any_stop) =
        (false, false, false, false, false);
    let tails: Vec<(String, &str)> = v
        .stages
        .iter()
        .map(|s| {
            let mut tail = match same_total {
                Some(_) => format!(" {}", s.done),
                None => format!(" {}/{}", s.done, s.total),
            };
            if s.failed > 0 {
                any_failed = true;
                tail.push_str(&format!(" ✗{}", s.failed));
            }
            if s.skipped > 0 {
                any_skipped = true;
                tail.push_str(&format!(" ⊘{}", s.skipped));
            }
            if s.in_flight > 0 {
                any_flight = true;
                tail.push_str(&format!(" ⇡{}", s.in_flight));
            }
            let stopping = v.stop_after_stage.as_deref() == Some(s.name.as_str());
            any_stop |= stopping;
            any_critic |= s.is_critic();
            (tail, if stopping { " ⏹" } else { "" })
        })
        .collect();
    let tail_w = tails
        .iter()
        .map(|(t, stop)| t.chars().count() + stop.chars().count())
        .max()
        .unwrap_or(0);
    let longest = v
        .stages
        .iter()
        .map(|s| truncate(&s.name, 16).chars().count())
        .max()
        .unwrap_or(0);
    // glyph, space, role; the name and a space; a bar of 4 at least; counts.
    let name_w = longest.min(inner_w.saturating_sub(3 + 1 + 4 + tail_w).max(4));
    let bar_w = inner_w.saturating_sub(3 + name_w + 1 + tail_w).max(3);
    let mut rows = Vec::new();
    for (s, (tail, stop)) in v.stages.iter().zip(tails) {
        let glyph = match stage_glyph(s) {
            "" => "  ",
            g => g,
        };
        let role = if s.is_critic() { "↳" } else { " " };
        let name = truncate(&s.name, name_w);
        let (done, _) = shown_done(s);
        rows.push(Line::from(vec![
            styled(glyph, theme.text()),
            styled(role, theme.dim()),
            styled(format!("{name:<name_w$} "), theme.title(false)),
            styled(bar(done, s.total, bar_w), theme.gauge()),
            Span::raw(tail),
            styled(stop, theme.warn()),
        ]));
    }
    let mut legend = String::new();
    for (shown, word) in [
        (any_failed, "✗ failed"),
        (any_skipped, "⊘ skipped"),
        (any_flight, "⇡ in flight"),
        (any_stop, "⏹ stop after"),
        (any_critic, "↳ critic"),
    ] {
        if shown && legend.chars().count() + word.chars().count() + 3 <= inner_w {
            legend.push(' ');
            legend.push_str(word);
        }
    }
    if !legend.is_empty() {
        legend.push(' ');
    }
    (rows, legend, same_total)
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
            format!("stopped: {}", docket_model::sanitize::truncate(reason, 60)),
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
    if live && g.deadline_secs > 0.0 {
        lines.push(Line::from(deadline_text(&g)));
    }
    frame.render_widget(Paragraph::new(lines).block(block), area);
}

/// How long a request may go unanswered before it is cut and sent again
/// (last in the pane: the first line a short pane drops).
fn deadline_text(g: &docket_ledger::watch::LiveGauges) -> String {
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
