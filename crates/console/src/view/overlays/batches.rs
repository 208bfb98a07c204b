//! The provider batches overlay: each batch of the watched session with its
//! state, counts, next poll and whatever needs the operator's eye.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Borders, Clear, Paragraph, Wrap};

use super::{centered, clamp_scroll};
use crate::app::App;
use crate::theme::Theme;
use crate::view::{batch_summary_text, human_secs, styled};
use docket_ledger::watch::{ProviderBatchRow, is_terminal_state};
use docket_model::sanitize::{for_terminal, truncate};

/// Provider error messages are cut here (the ledger keeps them whole).
const BATCH_ERROR_LIMIT: usize = 400;

/// A batch state as a glyph and its word, so it reads without colour.
fn batch_state<'a>(state: &str, theme: Theme) -> Span<'a> {
    let (glyph, style) = match state {
        "submitting" => ("↑", theme.dim()),
        "validating" | "in_progress" | "finalizing" => ("▶", theme.gauge()),
        "completed" => ("✓", theme.accepted()),
        "ingested" => ("✓", theme.dim()),
        "failed" | "expired" => ("✗", theme.error()),
        "cancelling" | "cancelled" => ("■", theme.warn()),
        "unknown" => ("⚠", theme.warn()),
        _ => ("·", theme.text()),
    };
    styled(format!("{glyph} {:<11}", truncate(state, 11)), style)
}

/// The stall window (`stages.batch.stall_after_secs`) of the watched
/// session's stage `stage`, from its config snapshot; None: the provider's
/// usual window.
fn stall_window(app: &App, stage: &str) -> Option<std::time::Duration> {
    let json = &app.snap.view.as_ref()?.row.config_snapshot_json;
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    let secs = v
        .pointer("/config/stages")?
        .as_array()?
        .iter()
        .find(|s| s.get("name").and_then(|n| n.as_str()) == Some(stage))?
        .pointer("/batch/stall_after_secs")?
        .as_f64()?;
    (secs.is_finite() && secs > 0.0).then(|| std::time::Duration::from_secs_f64(secs))
}

/// Lines done: while the provider works on the batch, its own count of the
/// requests it finished (completed or failed), so progress shows before the
/// results come; once they are read into the ledger, the lines applied.
fn done_lines(b: &ProviderBatchRow) -> u64 {
    match b.state.as_str() {
        "ingested" => b.ingested_count,
        _ => (b.completed_count + b.failed_count).max(b.ingested_count),
    }
}

/// How long ago the provider's counts last moved (`12s ago`), for a batch
/// still at the provider; `—` once it has ended or before its first count.
fn moved(b: &ProviderBatchRow, now: f64) -> String {
    if is_terminal_state(&b.state) {
        return "—".into();
    }
    match b.counts_changed_at.or(b.submitted_at) {
        Some(at) if at.is_finite() => format!("{} ago", human_secs((now - at).max(0.0))),
        _ => "—".into(),
    }
}

/// `in 12s`, `due`, or `—` when nothing will be polled.
fn next_poll(b: &ProviderBatchRow, now: f64) -> String {
    match b.next_poll_at {
        Some(_) if is_terminal_state(&b.state) => "—".into(),
        Some(at) if at - now >= 1.0 => format!("in {}", human_secs(at - now)),
        Some(_) => "due".into(),
        None => "—".into(),
    }
}

pub(in crate::view) fn draw_batches(
    frame: &mut Frame,
    area: Rect,
    app: &App,
    scroll: u16,
    theme: Theme,
) {
    let width = if area.width >= 100 {
        area.width.saturating_sub(6).min(120)
    } else {
        area.width
    };
    let popup = centered(area, width, area.height);
    frame.render_widget(Clear, popup);
    let inner = usize::from(popup.width.saturating_sub(2));
    let now = app.snap.now;
    let mut lines = header_lines(app, inner, theme);
    for b in &app.snap.batches {
        lines.extend(batch_lines(b, inner, now, theme));
        lines.extend(batch_notes(app, b, inner, now, theme));
    }
    let shown = app.snap.batches.len() as u64;
    if app.snap.batch_summary.total > shown && shown > 0 {
        lines.push(Line::from(styled(
            format!(
                "… {} older batch(es) not shown",
                app.snap.batch_summary.total - shown
            ),
            theme.dim(),
        )));
    }
    let title = match app.session_id() {
        Some(id) => format!(" Provider batches · {} (Esc closes) ", truncate(id, 30)),
        None => " Provider batches (Esc closes) ".to_string(),
    };
    let block = Block::default()
        .borders(Borders::ALL)
        .border_type(BorderType::Double)
        .border_style(theme.border(true))
        .title(Span::styled(title, theme.title(true)));
    let p = Paragraph::new(lines)
        .block(block)
        .wrap(Wrap { trim: false });
    let scroll = clamp_scroll(app, &p, popup, scroll);
    frame.render_widget(p.scroll((scroll, 0)), popup);
}

/// The session's batch summary, and the column heads when there are rows.
fn header_lines<'a>(app: &App, inner: usize, theme: Theme) -> Vec<Line<'a>> {
    let mut lines = Vec::new();
    match batch_summary_text(&app.snap.batch_summary, inner) {
        Some(text) => lines.push(Line::from(styled(text, theme.title(true)))),
        None => lines.push(Line::from(styled(
            "no provider batches in this session (it does not use a Batch API)",
            theme.dim(),
        ))),
    }
    if !app.snap.batches.is_empty() {
        lines.push(Line::from(""));
        lines.push(Line::from(styled(
            format!(
                "{:<14} {:<13} {:>13} {:>6} {:>5} {:>8}  {}",
                "provider", "state", "done/all", "failed", "age", "moved", "next poll"
            ),
            theme.dim(),
        )));
    }
    lines
}

/// One batch's row and the line naming it (id, tag, provider, stage).
fn batch_lines<'a>(b: &ProviderBatchRow, inner: usize, now: f64, theme: Theme) -> Vec<Line<'a>> {
    let mut lines = Vec::new();
    let age = b
        .created_at
        .filter(|at| at.is_finite())
        .map_or("?".to_string(), |at| human_secs(now - at));
    let row = vec![
        styled(
            format!("{:<14} ", truncate(&b.provider, 14)),
            theme.title(false),
        ),
        batch_state(&b.state, theme),
        Span::raw(format!(
            " {:>13} {:>6} {:>5} {:>8}  {}",
            format!("{}/{}", done_lines(b), b.request_count),
            b.failed_count,
            age,
            moved(b, now),
            next_poll(b, now)
        )),
    ];
    lines.push(Line::from(row));
    let id = match &b.provider_batch_id {
        Some(id) => for_terminal(id),
        None if b.state == "submitting" => "creating…".into(),
        None => "—".into(),
    };
    let about = format!(
        "  id {id} · tag {} · {} {} · stage {}",
        for_terminal(&b.tag),
        for_terminal(&b.provider_kind),
        for_terminal(&b.model),
        for_terminal(&b.stage)
    );
    lines.push(Line::from(styled(truncate(&about, inner), theme.dim())));
    lines
}

/// What needs the operator's eye about one batch: a stall, an unknown
/// state, a cancel asked, quarantined lines, the provider's error.
fn batch_notes<'a>(
    app: &App,
    b: &ProviderBatchRow,
    inner: usize,
    now: f64,
    theme: Theme,
) -> Vec<Line<'a>> {
    let mut lines = Vec::new();
    let window = stall_window(app, &b.stage);
    let since = b.submitted_at.or(b.created_at);
    if let Some(late) = docket_providers::batch::stalled_for(&b.state, since, now, window) {
        let human = docket_providers::batch::human_duration;
        let at = std::time::Duration::from_secs_f64((now - since.unwrap_or(now)).max(0.0));
        let text = format!(
            "  ⚠ stalled for {}: still {} {} after its submission (expected within {}); polling goes on, nothing is sent again",
            human(late),
            for_terminal(&b.state),
            human(at),
            human(window.unwrap_or(docket_providers::batch::USUAL_WINDOW)),
        );
        lines.push(Line::from(styled(truncate(&text, inner), theme.warn())));
    }
    if b.state == "unknown" {
        lines.push(Line::from(styled(
            truncate(
                "  ⚠ cannot tell which provider batch is ours; check the provider console",
                inner,
            ),
            theme.warn(),
        )));
    }
    if let Some(at) = b.cancel_requested_at {
        lines.push(Line::from(styled(
            format!("  ■ cancel requested {} ago", human_secs(now - at)),
            theme.warn(),
        )));
    }
    if b.quarantined_count > 0 {
        lines.push(Line::from(styled(
            format!(
                "  ⚠ {} result line(s) quarantined (not applied)",
                b.quarantined_count
            ),
            theme.warn(),
        )));
    }
    if let Some(e) = &b.error_message {
        lines.push(Line::from(styled(
            format!("  ✗ {}", truncate(e, BATCH_ERROR_LIMIT)),
            theme.error(),
        )));
    }
    lines
}
