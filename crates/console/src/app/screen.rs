//! What the console knows of its terminal: its size (whether the review
//! preview fits, so its item is read ahead), whether the mouse is on, and
//! where the last frame put each pane (for clicks).

use std::cell::RefCell;

use ratatui::layout::Rect;

use super::{App, Effect, Overlay, Pane};

/// From this many columns (and [`PREVIEW_MIN_HEIGHT`] rows) the focused
/// review queue shares its row with a preview of the item under its cursor.
pub const PREVIEW_MIN_WIDTH: u16 = 160;
/// The preview needs the layout that shows every pane at once.
pub const PREVIEW_MIN_HEIGHT: u16 = 32;

/// Whether a body of `width` x `height` cells has room for the preview.
pub fn preview_fits(width: u16, height: u16) -> bool {
    width >= PREVIEW_MIN_WIDTH && height >= PREVIEW_MIN_HEIGHT
}

/// The terminal as the console last saw it.
#[derive(Debug, Default)]
pub struct Screen {
    pub width: u16,
    pub height: u16,
    /// Clicks and the wheel act (`--mouse`, or `mouse = true` in console.toml).
    pub mouse: bool,
    /// Each pane the last frame drew and where (set by the view).
    pub areas: RefCell<Vec<(Pane, Rect)>>,
    /// The last frame showed every chart at once (set by the view): tab
    /// then switches between them and the calibration page.
    pub charts_all: std::cell::Cell<bool>,
}

impl Screen {
    /// The pane drawn at (`x`, `y`) in the last frame, and where it is.
    pub fn pane_at(&self, x: u16, y: u16) -> Option<(Pane, Rect)> {
        let pos = ratatui::layout::Position::new(x, y);
        self.areas
            .borrow()
            .iter()
            .find(|(_, r)| r.contains(pos))
            .copied()
    }
}

impl App {
    /// The terminal is now `width` x `height`: the preview may have come
    /// or gone, and with it the read of its item.
    pub fn resized(&mut self, width: u16, height: u16) -> Vec<Effect> {
        self.screen.width = width;
        self.screen.height = height;
        self.after_cursor_move()
    }

    /// The focused review queue shows a preview of its cursor item: the
    /// terminal is wide enough and nothing but the filter line is over it.
    pub fn preview_shown(&self) -> bool {
        self.focus == Pane::Review
            && matches!(self.overlay, Overlay::None | Overlay::Filter(_))
            && preview_fits(self.screen.width, self.screen.height)
    }
}
