//! Views over the panes: the review item detail, one event in full, the
//! generated help, the provider batches and the confirmation dialogs, one module each; here the
//! placing and scrolling they share.

use ratatui::layout::{Constraint, Flex, Layout, Rect};
use ratatui::widgets::Paragraph;

use crate::app::App;

mod batches;
mod correct;
mod detail;
mod dialog;
mod event;
mod fields;
mod help;

pub(super) use batches::draw_batches;
pub(super) use correct::draw_correction;
pub(super) use detail::{card_lines, draw_detail};
pub(super) use dialog::draw_dialog;
pub(super) use event::draw_event;
pub(super) use help::draw_help;

/// Record how far this overlay can scroll (its wrapped lines past one
/// screenful) for the keys, and the scroll to draw with now.
pub(super) fn clamp_scroll(app: &App, p: &Paragraph, area: Rect, scroll: u16) -> u16 {
    let rows = p.line_count(area.width.saturating_sub(2)).saturating_sub(2);
    let shown = usize::from(area.height.saturating_sub(2));
    let max = u16::try_from(rows.saturating_sub(shown)).unwrap_or(u16::MAX);
    app.scroll_max.set(max);
    scroll.min(max)
}

pub(super) fn centered(area: Rect, width: u16, height: u16) -> Rect {
    let [row] = Layout::vertical([Constraint::Length(height.min(area.height))])
        .flex(Flex::Center)
        .areas(area);
    let [cell] = Layout::horizontal([Constraint::Length(width.min(area.width))])
        .flex(Flex::Center)
        .areas(row);
    cell
}
