//! One key press and its spec form (`ctrl-c`, `G`, `pgdn`, `g g`): parsing
//! what a keymap file says and writing it back.

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::{MAX_SEQUENCE, NAMED_KEYS};

/// What is wrong with a key spec in a keymap file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeySpecError {
    #[error("empty key")]
    Empty,
    /// The modifier prefix as written (`ctrl-`).
    #[error("modifier \"{0}\" given twice")]
    RepeatedModifier(String),
    #[error("a modifier needs a key after it, e.g. \"ctrl-c\" or \"alt-enter\"")]
    ModifierWithoutKey,
    /// The character to write instead (the upper-case form).
    #[error("shift- only goes with named keys; write the character itself (e.g. \"{0}\")")]
    ShiftedCharacter(String),
    #[error(
        "unknown key name \"{0}\"; use a single character, or one of {named}, \
         optionally after ctrl-, alt- or shift-",
        named = NAMED_KEYS
    )]
    UnknownName(String),
    #[error("control characters are not keys; use a name like \"tab\" or \"enter\"")]
    ControlCharacter,
    #[error(
        "keys in a sequence are separated by exactly one space; \
         write \"space\" for the space bar"
    )]
    Spacing,
    /// How many keys the sequence has.
    #[error("a sequence has at most {max} keys, this has {0}", max = MAX_SEQUENCE)]
    TooLong(usize),
    /// One key of a sequence of several is wrong.
    #[error("\"{key}\": {error}")]
    InSequence {
        key: String,
        error: Box<KeySpecError>,
    },
}

/// One normalized key press: SHIFT is folded into the character for `Char`
/// keys (`G`, not `shift-g`) and shift-tab is always `BackTab`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyPress {
    pub code: KeyCode,
    pub modifiers: KeyModifiers,
}

impl KeyPress {
    /// A normalized key press.
    pub fn new(code: KeyCode, modifiers: KeyModifiers) -> KeyPress {
        let mut code = code;
        let mut modifiers = modifiers;
        match code {
            KeyCode::Char(c) if modifiers.contains(KeyModifiers::SHIFT) => {
                modifiers.remove(KeyModifiers::SHIFT);
                if c.is_ascii_lowercase() {
                    code = KeyCode::Char(c.to_ascii_uppercase());
                }
            }
            KeyCode::Tab if modifiers.contains(KeyModifiers::SHIFT) => {
                code = KeyCode::BackTab;
                modifiers.remove(KeyModifiers::SHIFT);
            }
            KeyCode::BackTab => modifiers.remove(KeyModifiers::SHIFT),
            _ => {}
        }
        KeyPress { code, modifiers }
    }

    /// Parse one key spec such as `a`, `G`, `?`, `ctrl-c`, `shift-up`, `pgdn`, `f5`.
    pub fn parse(spec: &str) -> Result<KeyPress, KeySpecError> {
        if spec.is_empty() {
            return Err(KeySpecError::Empty);
        }
        if let Some(c) = single_char(spec) {
            return char_key(c, KeyModifiers::NONE);
        }
        let mut rest = spec;
        let mut modifiers = KeyModifiers::NONE;
        loop {
            if rest.chars().count() < 2 {
                break;
            }
            let lower = rest.to_ascii_lowercase();
            let (len, m) = if lower.starts_with("ctrl-") {
                (5, KeyModifiers::CONTROL)
            } else if lower.starts_with("alt-") {
                (4, KeyModifiers::ALT)
            } else if lower.starts_with("shift-") {
                (6, KeyModifiers::SHIFT)
            } else {
                break;
            };
            if modifiers.contains(m) {
                return Err(KeySpecError::RepeatedModifier(rest[..len].to_string()));
            }
            modifiers |= m;
            rest = &rest[len..];
        }
        if rest.is_empty() {
            return Err(KeySpecError::ModifierWithoutKey);
        }
        if let Some(c) = single_char(rest) {
            if modifiers.contains(KeyModifiers::SHIFT) {
                return Err(KeySpecError::ShiftedCharacter(c.to_uppercase().to_string()));
            }
            return char_key(c, modifiers);
        }
        let code = named_key(&rest.to_ascii_lowercase())
            .ok_or_else(|| KeySpecError::UnknownName(rest.to_string()))?;
        Ok(KeyPress::new(code, modifiers))
    }

    /// Back to the spec form: `ctrl-c`, `G`, `space`, `pgdn`.
    pub fn display(&self) -> String {
        let mut out = String::new();
        for (flag, prefix) in [
            (KeyModifiers::CONTROL, "ctrl-"),
            (KeyModifiers::ALT, "alt-"),
            (KeyModifiers::SHIFT, "shift-"),
            (KeyModifiers::SUPER, "super-"),
            (KeyModifiers::HYPER, "hyper-"),
            (KeyModifiers::META, "meta-"),
        ] {
            if self.modifiers.contains(flag) {
                out.push_str(prefix);
            }
        }
        match self.code {
            KeyCode::Char(' ') => out.push_str("space"),
            KeyCode::Char(c) => out.push(c),
            KeyCode::F(n) => out.push_str(&format!("f{n}")),
            code => match named_key_name(code) {
                Some(name) => out.push_str(name),
                None => out.push_str(&format!("{code:?}").to_ascii_lowercase()),
            },
        }
        out
    }
}

impl From<KeyEvent> for KeyPress {
    fn from(ev: KeyEvent) -> KeyPress {
        KeyPress::new(ev.code, ev.modifiers)
    }
}

impl std::fmt::Display for KeyPress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.display())
    }
}

fn single_char(s: &str) -> Option<char> {
    let mut chars = s.chars();
    let c = chars.next()?;
    chars.next().is_none().then_some(c)
}

fn char_key(c: char, modifiers: KeyModifiers) -> Result<KeyPress, KeySpecError> {
    if c.is_control() {
        return Err(KeySpecError::ControlCharacter);
    }
    Ok(KeyPress::new(KeyCode::Char(c), modifiers))
}

fn named_key(lower: &str) -> Option<KeyCode> {
    Some(match lower {
        "enter" | "return" => KeyCode::Enter,
        "esc" | "escape" => KeyCode::Esc,
        "tab" => KeyCode::Tab,
        "backtab" => KeyCode::BackTab,
        "space" => KeyCode::Char(' '),
        "up" => KeyCode::Up,
        "down" => KeyCode::Down,
        "left" => KeyCode::Left,
        "right" => KeyCode::Right,
        "home" => KeyCode::Home,
        "end" => KeyCode::End,
        "pgup" | "pageup" => KeyCode::PageUp,
        "pgdn" | "pagedown" => KeyCode::PageDown,
        "backspace" => KeyCode::Backspace,
        "delete" | "del" => KeyCode::Delete,
        "insert" | "ins" => KeyCode::Insert,
        _ => {
            let n: u8 = lower.strip_prefix('f')?.parse().ok()?;
            if (1..=12).contains(&n) && !lower.starts_with("f0") {
                KeyCode::F(n)
            } else {
                return None;
            }
        }
    })
}

fn named_key_name(code: KeyCode) -> Option<&'static str> {
    Some(match code {
        KeyCode::Enter => "enter",
        KeyCode::Esc => "esc",
        KeyCode::Tab => "tab",
        KeyCode::BackTab => "backtab",
        KeyCode::Up => "up",
        KeyCode::Down => "down",
        KeyCode::Left => "left",
        KeyCode::Right => "right",
        KeyCode::Home => "home",
        KeyCode::End => "end",
        KeyCode::PageUp => "pgup",
        KeyCode::PageDown => "pgdn",
        KeyCode::Backspace => "backspace",
        KeyCode::Delete => "delete",
        KeyCode::Insert => "insert",
        _ => return None,
    })
}

/// Parse a binding: one key, or up to [`MAX_SEQUENCE`] keys separated by
/// single spaces (`"g g"`). The error says what is wrong with `spec`.
pub fn parse_sequence(spec: &str) -> Result<Vec<KeyPress>, KeySpecError> {
    if spec == " " {
        return Ok(vec![KeyPress::new(KeyCode::Char(' '), KeyModifiers::NONE)]);
    }
    if spec.is_empty() {
        return Err(KeySpecError::Empty);
    }
    let parts: Vec<&str> = spec.split(' ').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(KeySpecError::Spacing);
    }
    if parts.len() > MAX_SEQUENCE {
        return Err(KeySpecError::TooLong(parts.len()));
    }
    let many = parts.len() > 1;
    parts
        .into_iter()
        .map(|p| {
            KeyPress::parse(p).map_err(|e| {
                if many {
                    KeySpecError::InSequence {
                        key: p.to_string(),
                        error: Box::new(e),
                    }
                } else {
                    e
                }
            })
        })
        .collect()
}

/// The spec form of a sequence: keys joined by single spaces.
pub fn display_sequence(seq: &[KeyPress]) -> String {
    seq.iter()
        .map(KeyPress::display)
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests;
