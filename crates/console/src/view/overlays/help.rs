//! The `?` overlay: every binding of the live keymap, then the `:` commands.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Borders, Clear, Paragraph};

use super::{centered, clamp_scroll};
use crate::app::App;
use crate::theme::Theme;
use crate::view::styled;
use crate::view::wrap::wrap_line;
use docket_model::sanitize::{for_terminal, truncate};

pub(in crate::view) fn draw_help(
    frame: &mut Frame,
    area: Rect,
    app: &App,
    scroll: u16,
    theme: Theme,
) {
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
    if let Some(files) = &app.log_files {
        lines.push(Line::from(styled("[logs]", theme.title(true))));
        lines.push(Line::from(Span::raw(format!(
            "  {} (DOCKET_LOG=debug records more)",
            for_terminal(files)
        ))));
    }
    let block = Block::default()
        .borders(Borders::ALL)
        .border_type(BorderType::Double)
        .border_style(theme.border(true))
        .title(Span::styled(
            " Help: keys from the live keymap (Esc closes) ",
            theme.title(true),
        ));
    let inner = usize::from(popup.width.saturating_sub(2));
    let lines: Vec<Line> = lines
        .into_iter()
        .flat_map(|l| wrap_line(l, inner))
        .collect();
    let p = Paragraph::new(lines).block(block);
    let scroll = clamp_scroll(app, &p, popup, scroll);
    frame.render_widget(p.scroll((scroll, 0)), popup);
}
