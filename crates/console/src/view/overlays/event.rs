//! One event in full (Enter on the events pane): when, how bad, what kind,
//! which item, and the whole message, word-wrapped with its continuation
//! rows indented, scrollable; Esc closes.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Borders, Clear, Paragraph};

use super::{centered, clamp_scroll};
use crate::app::App;
use crate::theme::Theme;
use crate::view::styled;
use crate::view::wrap::wrap_indented;
use docket_ledger::watch::{Event, Level};
use docket_model::sanitize::for_terminal;

/// The widest the overlay gets: past this a line is too long to read.
const MAX_WIDTH: u16 = 120;

pub(in crate::view) fn draw_event(
    frame: &mut Frame,
    area: Rect,
    app: &App,
    event: &Event,
    scroll: u16,
    theme: Theme,
) {
    let width = area.width.saturating_sub(4).min(MAX_WIDTH);
    let inner = usize::from(width.saturating_sub(2));
    let lines = event_lines(event, inner, theme);
    let height = u16::try_from(lines.len() + 2).unwrap_or(u16::MAX);
    let popup = centered(area, width, height.max(5));
    frame.render_widget(Clear, popup);
    let block = Block::default()
        .borders(Borders::ALL)
        .border_type(BorderType::Double)
        .border_style(theme.border(true))
        .title(Span::styled(" Event (Esc closes) ", theme.title(true)));
    let p = Paragraph::new(lines).block(block);
    let scroll = clamp_scroll(app, &p, popup, scroll);
    frame.render_widget(p.scroll((scroll, 0)), popup);
}

/// The event's lines, each at most `inner` cells: a heading line, the item
/// when there is one, then the message (each of its lines wrapped).
fn event_lines<'a>(e: &Event, inner: usize, theme: Theme) -> Vec<Line<'a>> {
    let (level, style) = match e.level {
        Level::Info => ("info", theme.dim()),
        Level::Warn => ("warning", theme.warn()),
        Level::Error => ("error", theme.error()),
    };
    let when = chrono::DateTime::from_timestamp(e.at as i64, 0)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_else(|| "--".into());
    let head = format!("{when} · {level} · {}", for_terminal(&e.kind));
    let mut lines: Vec<Line> = wrap_indented(&head, inner, 2)
        .into_iter()
        .map(|r| Line::from(styled(r, style)))
        .collect();
    if let Some(item) = &e.item_id {
        let item = format!("item {}", for_terminal(item));
        lines.extend(wrap_indented(&item, inner, 2).into_iter().map(Line::from));
    }
    lines.push(Line::from(""));
    for l in e.message.lines() {
        let rows = wrap_indented(&for_terminal(l), inner, 2);
        lines.extend(rows.into_iter().map(Line::from));
    }
    lines
}
