//! The header and the three run panes: stages, outcomes, gauges. The
//! stages and gauges panes have modules of their own; here the header, the
//! outcomes pane and the bars and state words they share.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::{pane_block, share, styled};
use crate::app::{App, Pane};
use crate::theme::Theme;
use docket_model::sanitize::truncate;
use docket_model::session_state::ShownState;

mod gauge_columns;
mod gauges;
mod stages;

pub(super) use gauges::draw_gauges;
pub(super) use stages::{draw_stages, stages_height};

pub(super) fn draw_header(frame: &mut Frame, area: Rect, app: &App, theme: Theme) {
    let mut spans = vec![styled(" docket ", theme.badge()), Span::raw(" ")];
    match &app.snap.view {
        Some(v) => {
            spans.push(styled(truncate(&v.row.session_id, 40), theme.title(true)));
            spans.push(Span::raw("  "));
            spans.push(styled(state_word(v.shown), state_style(v.shown, theme)));
            if let Some(mode) = completion_mode(&v.row.config_snapshot_json) {
                spans.push(styled(format!(" · {mode}"), theme.dim()));
            }
            if let Some((name, version)) = &v.profile {
                let name = truncate(&docket_model::sanitize::for_terminal(name), 24);
                spans.push(styled(format!(" · profile {name} v{version}"), theme.dim()));
            }
            if v.shown == ShownState::Interrupted {
                spans.push(styled(" · no engine; resumable", theme.dim()));
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

/// The session's completion mode when it is not the default (`exact`), from
/// its config snapshot: `best_effort` or `throughput`.
fn completion_mode(snapshot_json: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(snapshot_json).ok()?;
    let mode = v.pointer("/flags/completion_mode")?.as_str()?;
    (mode != "exact").then(|| truncate(mode, 16))
}

/// A session's state as its glyph and word (the one vocabulary of
/// `session_state`), so it reads without colour.
pub(super) fn state_word(shown: ShownState) -> String {
    format!("{} {}", shown.glyph(), shown.word().to_uppercase())
}

pub(super) fn state_style(shown: ShownState, theme: Theme) -> ratatui::style::Style {
    match shown {
        ShownState::Running => theme.accepted(),
        ShownState::Completed => theme.text(),
        ShownState::Pausing
        | ShownState::Paused
        | ShownState::StoppingAtStage
        | ShownState::Cancelling
        | ShownState::Cancelled
        | ShownState::Interrupted => theme.warn(),
        ShownState::Failed | ShownState::Unknown => theme.error(),
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

pub(super) fn draw_outcomes(frame: &mut Frame, area: Rect, app: &App, theme: Theme) {
    let block = pane_block(app, Pane::Outcomes, String::new(), theme);
    let Some(v) = &app.snap.view else {
        frame.render_widget(Paragraph::new("").block(block), area);
        return;
    };
    let r = &v.row;
    let processed = r.processed_count;
    // The bars take the width the pane has (the counts take 26 cells).
    let bar_w = (area.width.saturating_sub(2) as usize).saturating_sub(27);
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

#[cfg(test)]
mod tests {
    use super::completion_mode;

    #[test]
    fn the_header_names_a_completion_mode_other_than_exact() {
        let snap = |mode: &str| format!(r#"{{"flags":{{"completion_mode":"{mode}"}}}}"#);
        assert_eq!(completion_mode(&snap("exact")), None);
        assert_eq!(
            completion_mode(&snap("best_effort")).as_deref(),
            Some("best_effort")
        );
        assert_eq!(
            completion_mode(&snap("throughput")).as_deref(),
            Some("throughput")
        );
        // A session from before the mode was recorded.
        assert_eq!(completion_mode(r#"{"flags":{}}"#), None);
    }
}
