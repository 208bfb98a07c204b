//! Views over the panes: the review item detail, the generated help and the
//! confirmation dialogs.

use ratatui::Frame;
use ratatui::layout::{Constraint, Flex, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Borders, Clear, Paragraph, Wrap};

use super::styled;
use crate::sanitize::{for_terminal, truncate};
use crate::tui::action::Action;
use crate::tui::app::{App, Dialog};
use crate::tui::keymap::Section;
use crate::tui::theme::Theme;

/// Long model outputs are cut here in the detail view (the ledger and the
/// exports keep them whole).
const FIELD_LIMIT: usize = 20_000;

/// Text from an item or a model as safe lines: each source line sanitized.
fn safe_lines<'a>(text: &str, indent: &str) -> Vec<Line<'a>> {
    let text: String = text.chars().take(FIELD_LIMIT).collect();
    text.lines()
        .map(|l| Line::from(format!("{indent}{}", for_terminal(l))))
        .collect()
}

fn heading<'a>(text: &str, theme: Theme) -> Line<'a> {
    Line::from(styled(format!("── {text} "), theme.title(true)))
}

pub(super) fn draw_detail(frame: &mut Frame, area: Rect, app: &App, scroll: u16, theme: Theme) {
    let block = Block::default()
        .borders(Borders::ALL)
        .border_type(BorderType::Double)
        .border_style(theme.border(true))
        .title(Span::styled(" Review item (Esc back) ", theme.title(true)));
    let Some(d) = &app.snap.detail else {
        let msg = if app.cursor_row().is_none() {
            "the review queue is empty"
        } else {
            "loading..."
        };
        frame.render_widget(Paragraph::new(styled(msg, theme.dim())).block(block), area);
        return;
    };
    let mut lines = vec![Line::from(vec![
        styled(truncate(&d.item_id, 40), theme.title(true)),
        Span::raw(format!(
            "  confidence {}  model {}  status {}",
            d.confidence.map_or("--".into(), |c| format!("{c:.2}")),
            truncate(d.model_id.as_deref().unwrap_or("?"), 30),
            d.status.to_uppercase(),
        )),
    ])];
    let mut who = Vec::new();
    if let Some(s) = &d.session_id {
        who.push(format!("session {}", truncate(s, 30)));
    }
    if let Some(by) = &d.decided_by {
        who.push(format!("decided by {}", truncate(by, 30)));
    }
    match (app.held_by_other(d.claimed_by.as_deref()), &d.claimed_by) {
        (Some(other), _) => who.push(format!("held by {}", truncate(other, 40))),
        (None, Some(_)) => who.push("held by you".into()),
        (None, None) => {}
    }
    lines.push(Line::from(styled(who.join(" · "), theme.dim())));
    lines.push(heading("Suggested answer", theme));
    lines.extend(safe_lines(&d.suggestion_json, "  "));
    lines.push(heading("Rationale", theme));
    lines.extend(safe_lines(d.rationale.as_deref().unwrap_or("(none)"), "  "));
    lines.push(heading("Evidence", theme));
    lines.extend(safe_lines(&d.evidence_json, "  "));
    for s in &d.stages {
        lines.push(heading(
            &format!(
                "Stage {} · {}/{} · {} · {} attempt(s) · {} in / {} out tok · ${:.5}",
                truncate(&s.stage, 20),
                truncate(&s.provider, 20),
                truncate(&s.model, 30),
                s.status,
                s.attempts,
                s.input_tokens,
                s.output_tokens,
                s.cost_usd
            ),
            theme,
        ));
        if let Some(p) = &s.parsed_output_json {
            lines.push(Line::from(styled("  parsed:", theme.dim())));
            lines.extend(safe_lines(p, "    "));
        }
        if let Some(raw) = &s.raw_output {
            let finish = s.finish_reason.as_deref().unwrap_or("?");
            lines.push(Line::from(styled(
                format!("  raw output (finish: {}):", for_terminal(finish)),
                theme.dim(),
            )));
            lines.extend(safe_lines(raw, "    "));
        }
    }
    let p = Paragraph::new(lines)
        .block(block)
        .wrap(Wrap { trim: false });
    let scroll = clamp_scroll(app, &p, area, scroll);
    frame.render_widget(p.scroll((scroll, 0)), area);
}

/// Record how far this overlay can scroll (its wrapped lines past one
/// screenful) for the keys, and the scroll to draw with now.
fn clamp_scroll(app: &App, p: &Paragraph, area: Rect, scroll: u16) -> u16 {
    let rows = p.line_count(area.width.saturating_sub(2)).saturating_sub(2);
    let shown = usize::from(area.height.saturating_sub(2));
    let max = u16::try_from(rows.saturating_sub(shown)).unwrap_or(u16::MAX);
    app.scroll_max.set(max);
    scroll.min(max)
}

fn centered(area: Rect, width: u16, height: u16) -> Rect {
    let [row] = Layout::vertical([Constraint::Length(height.min(area.height))])
        .flex(Flex::Center)
        .areas(area);
    let [cell] = Layout::horizontal([Constraint::Length(width.min(area.width))])
        .flex(Flex::Center)
        .areas(row);
    cell
}

pub(super) fn draw_help(frame: &mut Frame, area: Rect, app: &App, scroll: u16, theme: Theme) {
    let popup = centered(area, area.width.saturating_sub(6).min(96), area.height);
    frame.render_widget(Clear, popup);
    let mut lines = Vec::new();
    let mut section = None;
    for (sec, action, keys, desc) in app.keymap.help_entries() {
        if section != Some(sec) {
            section = Some(sec);
            lines.push(Line::from(styled(
                format!("[{}]", sec.name()),
                theme.title(true),
            )));
        }
        lines.push(Line::from(vec![
            styled(format!("  {:<16}", truncate(&keys, 16)), theme.key()),
            Span::raw(format!("{:<16} {desc}", action.name())),
        ]));
    }
    lines.push(Line::from(styled("[: commands]", theme.title(true))));
    for (cmd, what) in [
        ("pause / resume", "pause or resume the watched session"),
        ("stop-at-stage", "finish the current stage, then stop"),
        ("cancel", "cancel the watched session (asks first)"),
        (
            "retune rpm=N tpm=N concurrency=N",
            "change a live run's limits",
        ),
        (
            "export [what] [csv|jsonl] [PATH]",
            "write decisions, results or requests",
        ),
        ("session ID", "watch another session"),
        ("any action name", "e.g. :accept, :focus_review"),
    ] {
        lines.push(Line::from(vec![
            styled(format!("  {cmd:<34}"), theme.key()),
            Span::raw(what),
        ]));
    }
    let block = Block::default()
        .borders(Borders::ALL)
        .border_type(BorderType::Double)
        .border_style(theme.border(true))
        .title(Span::styled(
            " Help: keys from the live keymap (Esc closes) ",
            theme.title(true),
        ));
    let p = Paragraph::new(lines).block(block);
    let scroll = clamp_scroll(app, &p, popup, scroll);
    frame.render_widget(p.scroll((scroll, 0)), popup);
}

pub(super) fn draw_dialog(frame: &mut Frame, area: Rect, app: &App, dialog: &Dialog, theme: Theme) {
    let key = |a: Action| {
        app.keymap
            .first_key(Section::Confirm, a)
            .unwrap_or_else(|| a.name().to_string())
    };
    let (title, body, answer): (&str, Vec<String>, String) = match dialog {
        Dialog::CancelRun {
            session_id,
            pending,
        } => (
            " Cancel the run? ",
            vec![
                format!("Cancel session {}?", truncate(session_id, 40)),
                format!("{pending} item(s) not processed yet stop being sent."),
                "In-flight requests finish; the session stays resumable.".into(),
            ],
            format!(
                "{} yes   {} no (default)",
                key(Action::ConfirmYes),
                key(Action::ConfirmNo)
            ),
        ),
        Dialog::BulkReject { ids } => (
            " Reject many? ",
            vec![
                format!("Reject {} marked suggestions?", ids.len()),
                "Their decisions stay undecided; u undoes them one by one.".into(),
            ],
            format!(
                "{} yes   {} no (default)",
                key(Action::ConfirmYes),
                key(Action::ConfirmNo)
            ),
        ),
        Dialog::QuitLive => (
            " Quit while the run is live? ",
            vec![
                "This process is running the session.".into(),
                format!(
                    "{:<3}keep it running headless (line output)",
                    key(Action::QuitKeep)
                ),
                format!(
                    "{:<3}pause it (in-flight requests finish), save and exit",
                    key(Action::QuitPause)
                ),
                format!(
                    "{:<3}cancel it (resumable), save and exit",
                    key(Action::QuitCancel)
                ),
            ],
            format!("{} back", key(Action::ConfirmNo)),
        ),
    };
    let height = body.len() as u16 + 4;
    let popup = centered(area, 64, height);
    frame.render_widget(Clear, popup);
    let mut lines: Vec<Line> = body.into_iter().map(Line::from).collect();
    lines.push(Line::from(""));
    lines.push(Line::from(styled(answer, theme.key())));
    let block = Block::default()
        .borders(Borders::ALL)
        .border_type(BorderType::Double)
        .border_style(theme.warn())
        .title(Span::styled(title, theme.alert_badge()));
    frame.render_widget(Paragraph::new(lines).block(block), popup);
}
