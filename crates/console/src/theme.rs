//! Styles. Colour is never the only signal: selection is REVERSED, focus is a
//! double border with a bold title, and every state carries a word or glyph,
//! so the `mono` theme (NO_COLOR, `--no-color`) loses nothing but colour.

use ratatui::style::{Color, Modifier, Style};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Theme {
    pub color: bool,
}

impl Theme {
    /// Colour unless `NO_COLOR` is set (non-empty) or `--no-color` was given.
    pub fn detect(no_color_flag: bool) -> Theme {
        let env_off = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Theme {
            color: !(no_color_flag || env_off),
        }
    }

    pub fn mono() -> Theme {
        Theme { color: false }
    }

    fn fg(self, c: Color) -> Style {
        if self.color {
            Style::new().fg(c)
        } else {
            Style::new()
        }
    }

    pub fn text(self) -> Style {
        Style::new()
    }
    pub fn dim(self) -> Style {
        if self.color {
            Style::new().fg(Color::DarkGray)
        } else {
            Style::new().add_modifier(Modifier::DIM)
        }
    }
    pub fn title(self, focused: bool) -> Style {
        if focused {
            self.fg(Color::Cyan).add_modifier(Modifier::BOLD)
        } else {
            Style::new()
        }
    }
    pub fn border(self, focused: bool) -> Style {
        if focused {
            self.fg(Color::Cyan)
        } else {
            self.dim()
        }
    }
    pub fn selected(self) -> Style {
        Style::new().add_modifier(Modifier::REVERSED)
    }
    pub fn accepted(self) -> Style {
        self.fg(Color::Green)
    }
    pub fn review(self) -> Style {
        self.fg(Color::Yellow)
    }
    pub fn rejected(self) -> Style {
        self.fg(Color::Magenta)
    }
    pub fn error(self) -> Style {
        self.fg(Color::Red).add_modifier(Modifier::BOLD)
    }
    pub fn warn(self) -> Style {
        self.fg(Color::Yellow)
    }
    pub fn badge(self) -> Style {
        if self.color {
            Style::new()
                .fg(Color::Black)
                .bg(Color::Cyan)
                .add_modifier(Modifier::BOLD)
        } else {
            Style::new().add_modifier(Modifier::REVERSED | Modifier::BOLD)
        }
    }
    pub fn alert_badge(self) -> Style {
        if self.color {
            Style::new()
                .fg(Color::Black)
                .bg(Color::Yellow)
                .add_modifier(Modifier::BOLD)
        } else {
            Style::new().add_modifier(Modifier::REVERSED | Modifier::BOLD)
        }
    }
    pub fn key(self) -> Style {
        self.fg(Color::Cyan).add_modifier(Modifier::BOLD)
    }
    pub fn gauge(self) -> Style {
        self.fg(Color::Cyan)
    }
    pub fn marked(self) -> Style {
        self.fg(Color::Yellow).add_modifier(Modifier::BOLD)
    }
}
