//! The opt-in mouse (`--mouse`): a click focuses the pane under it and
//! selects the list row it hits; the wheel scrolls the list under the
//! pointer (else the focused one), or the open overlay. Off, every mouse
//! event is ignored, so the terminal's own text selection keeps working.

use ratatui::crossterm::event::{MouseButton, MouseEvent, MouseEventKind};

use super::{App, Effect, Overlay, Pane};
use crate::action::Action;

/// Rows one wheel notch moves.
const WHEEL_ROWS: i64 = 3;

/// The first row a list pane shows for `cursor`: whole pages, as the view
/// draws them (`view::lists`), so a click maps to the row it hit.
fn page_start(cursor: u64, rows: u64) -> u64 {
    cursor.checked_div(rows).map_or(0, |pages| pages * rows)
}

/// Rows above a list's first entry inside its pane: the border, and the
/// sessions pane's column header.
fn rows_above(pane: Pane) -> u16 {
    if pane == Pane::Sessions { 2 } else { 1 }
}

impl App {
    /// One mouse event; nothing unless the mouse is on.
    pub fn handle_mouse(&mut self, m: MouseEvent) -> Vec<Effect> {
        if !self.screen.mouse {
            return Vec::new();
        }
        match m.kind {
            MouseEventKind::Down(MouseButton::Left) => self.click(m.column, m.row),
            MouseEventKind::ScrollDown => self.wheel(m.column, m.row, WHEEL_ROWS),
            MouseEventKind::ScrollUp => self.wheel(m.column, m.row, -WHEEL_ROWS),
            _ => Vec::new(),
        }
    }

    fn click(&mut self, x: u16, y: u16) -> Vec<Effect> {
        // A dialog or a view over the panes is closed with its keys first.
        if !matches!(self.overlay, Overlay::None) {
            return Vec::new();
        }
        let Some((pane, area)) = self.screen.pane_at(x, y) else {
            return Vec::new();
        };
        self.toast = None;
        let mut fx = Vec::new();
        if self.focus != pane {
            fx.extend(self.perform(focus_action(pane)));
        }
        let Some(row) = y.checked_sub(area.y + rows_above(pane)) else {
            return fx;
        };
        let rows = area.height.saturating_sub(rows_above(pane) + 1);
        if row >= rows {
            return fx;
        }
        let index = page_start(self.list_cursor(pane), u64::from(rows)) + u64::from(row);
        if index < self.list_len(pane) {
            fx.extend(self.select(pane, index));
        }
        fx
    }

    fn wheel(&mut self, x: u16, y: u16, delta: i64) -> Vec<Effect> {
        match self.overlay {
            Overlay::Help { .. }
            | Overlay::Detail { .. }
            | Overlay::Batches { .. }
            | Overlay::Workers { .. }
            | Overlay::Event { .. } => {
                let step = if delta > 0 { Action::Down } else { Action::Up };
                let mut fx = Vec::new();
                for _ in 0..delta.unsigned_abs() {
                    fx.extend(self.perform(step));
                }
                fx
            }
            Overlay::None => {
                let hovered = self.screen.pane_at(x, y).map(|(p, _)| p);
                let pane = match hovered {
                    Some(p) if p.is_list() => p,
                    _ => self.focus,
                };
                if !pane.is_list() {
                    return Vec::new();
                }
                let len = self.list_len(pane);
                let to = (self.list_cursor(pane) as i64 + delta).clamp(0, (len as i64 - 1).max(0));
                self.select(pane, to as u64)
            }
            _ => Vec::new(),
        }
    }

    /// The cursor of a list pane.
    fn list_cursor(&self, pane: Pane) -> u64 {
        match pane {
            Pane::Review => self.review_cursor,
            Pane::Sessions => self.sessions_cursor as u64,
            Pane::Events => self.events_scroll as u64,
            _ => 0,
        }
    }

    /// How many rows a list pane lists.
    fn list_len(&self, pane: Pane) -> u64 {
        match pane {
            Pane::Review => self.snap.review.total,
            Pane::Sessions => self.visible_sessions().len() as u64,
            Pane::Events => self.visible_events().len() as u64,
            _ => 0,
        }
    }

    /// Put a list pane's cursor on row `index` (within its length).
    fn select(&mut self, pane: Pane, index: u64) -> Vec<Effect> {
        match pane {
            Pane::Review => {
                self.review_cursor = index;
                self.review_cursor_id = None;
                self.restored.clear();
                self.after_cursor_move()
            }
            Pane::Sessions => {
                self.sessions_cursor = index as usize;
                Vec::new()
            }
            Pane::Events => {
                self.events_scroll = index as usize;
                Vec::new()
            }
            _ => Vec::new(),
        }
    }
}

/// The action that focuses `pane` (what its number key does).
fn focus_action(pane: Pane) -> Action {
    match pane {
        Pane::Stages => Action::FocusStages,
        Pane::Outcomes => Action::FocusOutcomes,
        Pane::Gauges => Action::FocusGauges,
        Pane::Events => Action::FocusEvents,
        Pane::Review => Action::FocusReview,
        Pane::Sessions => Action::FocusSessions,
    }
}
