//! The review queue's preview (lazygit-style): on a screen at least
//! `app::PREVIEW_MIN_WIDTH` columns wide, the focused queue shares its row
//! with the card of the item under its cursor, the same card the detail
//! view draws. The data worker reads the card when the cursor moves
//! (`Effect::Detail`); until it has, the preview says it is loading.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::Span;
use ratatui::widgets::{Block, Borders, Paragraph};

use super::overlays::card_lines;
use super::styled;
use crate::app::{App, Overlay, PREVIEW_MIN_WIDTH, Pane};
use crate::theme::Theme;

/// Whether the dashboard in `body` shows the preview (the wide layout is
/// already chosen).
pub(super) fn shown(app: &App, body: Rect) -> bool {
    app.focus == Pane::Review
        && matches!(app.overlay, Overlay::None | Overlay::Filter(_))
        && body.width >= PREVIEW_MIN_WIDTH
}

pub(super) fn draw_preview(frame: &mut Frame, area: Rect, app: &App, theme: Theme) {
    let block = Block::default()
        .borders(Borders::ALL)
        .border_style(theme.border(false))
        .title(Span::styled(
            " Preview (Enter opens it) ",
            theme.title(false),
        ));
    let cursor = app.cursor_row().map(|r| r.review_id);
    // The card of another item (the one the cursor just left) is not shown.
    let card = app
        .snap
        .detail
        .as_ref()
        .filter(|d| Some(d.review_id) == cursor);
    let Some(d) = card else {
        let msg = if cursor.is_none() && app.snap.review.total == 0 {
            "nothing to preview"
        } else {
            "loading..."
        };
        frame.render_widget(Paragraph::new(styled(msg, theme.dim())).block(block), area);
        return;
    };
    let inner = usize::from(area.width.saturating_sub(2));
    let lines = card_lines(app, d, inner, theme);
    frame.render_widget(Paragraph::new(lines).block(block), area);
}
