//! Key bindings: the embedded default `keymap.toml`, the user's override file
//! merged binding by binding, and lookup of key presses (including short
//! sequences such as `g g`) to [`Action`]s per [`Section`].
//!
//! Loading never fails: every problem in a user file becomes a warning naming
//! the file and 1-based line, and the affected binding keeps its default.

use std::path::PathBuf;

use ratatui::crossterm::event::{KeyEvent, KeyEventKind};

use super::action::Action;

mod merge;
mod press;

#[cfg(test)]
mod tests;

pub use press::{KeyPress, KeySpecError, display_sequence, parse_sequence};

/// The documented default keymap, embedded at build time.
pub const DEFAULT_KEYMAP: &str = include_str!("../../../../keymap.toml");

/// Longest key sequence a binding may use.
pub const MAX_SEQUENCE: usize = 3;

/// Origin named in warnings about the embedded default.
const BUILTIN_ORIGIN: &str = "built-in keymap.toml";

/// Named keys accepted in specs, listed in error messages.
const NAMED_KEYS: &str = "enter, esc, tab, backtab, space, up, down, left, right, home, end, \
     pgup, pgdn, backspace, delete, insert, f1..f12";

/// A group of bindings that is active in one context of the console.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Section {
    /// Active everywhere (lowest priority).
    Global,
    /// Active while the review queue is focused; shadows `Global`.
    Review,
    /// Active in a yes/no confirmation dialog.
    Confirm,
    /// Active while typing a filter or a `:` command.
    Input,
}

impl Section {
    /// Every section, in file and help order.
    pub const ALL: [Section; 4] = [
        Section::Global,
        Section::Review,
        Section::Confirm,
        Section::Input,
    ];

    /// The table name in `keymap.toml`.
    pub fn name(self) -> &'static str {
        match self {
            Section::Global => "global",
            Section::Review => "review",
            Section::Confirm => "confirm",
            Section::Input => "input",
        }
    }

    /// The section with this table name, if any.
    pub fn from_name(name: &str) -> Option<Section> {
        Section::ALL.into_iter().find(|s| s.name() == name)
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for Section {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a key press (after any pending prefix) means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyMatch {
    /// A binding fired; the pending prefix has been cleared.
    Action(Action),
    /// The keys so far are a prefix of a longer sequence; wait for more.
    Pending,
    /// Nothing is bound to this key (or it was a release event).
    Unbound,
}

/// One action's keys in one section: each entry is a sequence of key presses.
pub type Binding = (Action, Vec<Vec<KeyPress>>);

/// The effective key bindings, per section.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Keymap {
    sections: [Vec<Binding>; 4],
}

enum Lookup {
    Full(Action),
    Prefix,
    None,
}

impl Keymap {
    /// A keymap with nothing bound.
    pub fn empty() -> Keymap {
        Keymap::default()
    }

    /// The embedded default (`keymap.toml` at the top of the repository).
    pub fn default_map() -> Keymap {
        let (map, warnings) = Keymap::from_toml_str(DEFAULT_KEYMAP, BUILTIN_ORIGIN);
        debug_assert!(warnings.is_empty(), "default keymap: {warnings:?}");
        map
    }

    /// A keymap built from `src` alone (no defaults underneath), with warnings.
    pub fn from_toml_str(src: &str, origin: &str) -> (Keymap, Vec<String>) {
        let mut map = Keymap::empty();
        let warnings = map.merge_str(src, origin);
        (map, warnings)
    }

    /// Replace `action`'s keys in `section` (adding the action if new). Does
    /// not check for clashes.
    pub fn bind(&mut self, section: Section, action: Action, keys: Vec<Vec<KeyPress>>) {
        let list = &mut self.sections[section.index()];
        match list.iter_mut().find(|(a, _)| *a == action) {
            Some((_, existing)) => *existing = keys,
            None => list.push((action, keys)),
        }
    }

    /// The bindings of one section, in file order.
    pub fn bindings(&self, section: Section) -> &[Binding] {
        &self.sections[section.index()]
    }

    /// Resolve a key event against `sections` (highest priority first, e.g.
    /// `[Review, Global]`), continuing any sequence in `pending`. Per section,
    /// a full match fires and a strict prefix waits (kept in `pending`). If
    /// pending keys plus this one match nothing, pending is cleared and the
    /// key is tried alone. Release events return `Unbound` and leave
    /// `pending` untouched.
    pub fn resolve(
        &self,
        sections: &[Section],
        pending: &mut Vec<KeyPress>,
        key: KeyEvent,
    ) -> KeyMatch {
        if key.kind == KeyEventKind::Release {
            return KeyMatch::Unbound;
        }
        let press = KeyPress::from(key);
        let mut seq = std::mem::take(pending);
        let retry = !seq.is_empty();
        seq.push(press);
        match self.lookup(sections, &seq) {
            Lookup::Full(a) => return KeyMatch::Action(a),
            Lookup::Prefix => {
                *pending = seq;
                return KeyMatch::Pending;
            }
            Lookup::None if !retry => return KeyMatch::Unbound,
            Lookup::None => {}
        }
        let seq = vec![press];
        match self.lookup(sections, &seq) {
            Lookup::Full(a) => KeyMatch::Action(a),
            Lookup::Prefix => {
                *pending = seq;
                KeyMatch::Pending
            }
            Lookup::None => KeyMatch::Unbound,
        }
    }

    fn lookup(&self, sections: &[Section], seq: &[KeyPress]) -> Lookup {
        for &section in sections {
            let list = self.bindings(section);
            if let Some((a, _)) = list
                .iter()
                .find(|(_, seqs)| seqs.iter().any(|s| s.as_slice() == seq))
            {
                return Lookup::Full(*a);
            }
            if list.iter().any(|(_, seqs)| {
                seqs.iter()
                    .any(|s| s.len() > seq.len() && s.starts_with(seq))
            }) {
                return Lookup::Prefix;
            }
        }
        Lookup::None
    }

    /// The display forms of `action`'s keys in `section` (empty if unbound).
    pub fn keys_for(&self, section: Section, action: Action) -> Vec<String> {
        self.bindings(section)
            .iter()
            .find(|(a, _)| *a == action)
            .map(|(_, seqs)| seqs.iter().map(|s| display_sequence(s)).collect())
            .unwrap_or_default()
    }

    /// The first key of `action` in `section`, for hints in the status bar.
    pub fn first_key(&self, section: Section, action: Action) -> Option<String> {
        self.keys_for(section, action).into_iter().next()
    }

    /// Rows for the `?` overlay: (section, action, keys joined by ", ",
    /// description), in section order then `Action::ALL` order; unbound
    /// actions are left out.
    pub fn help_entries(&self) -> Vec<(Section, Action, String, &'static str)> {
        let mut out = Vec::new();
        for section in Section::ALL {
            for &action in Action::ALL {
                let keys = self.keys_for(section, action);
                if !keys.is_empty() {
                    out.push((section, action, keys.join(", "), action.describe()));
                }
            }
        }
        out
    }

    /// The effective keymap as TOML (for `--print-keymap`); parsing it with
    /// [`Keymap::from_toml_str`] gives back an identical keymap.
    pub fn to_toml(&self) -> String {
        let mut out =
            String::from("# docket effective keymap (defaults merged with any overrides)\n");
        for section in Section::ALL {
            out.push_str(&format!("\n[{section}]\n"));
            for (action, seqs) in self.bindings(section) {
                let keys: Vec<String> = seqs
                    .iter()
                    .map(|s| toml::Value::String(display_sequence(s)).to_string())
                    .collect();
                out.push_str(&format!("{action} = [{}]\n", keys.join(", ")));
            }
        }
        out
    }
}

/// Where the user's keymap lives: `$DOCKET_CONFIG_DIR/keymap.toml` if that
/// variable is set, else `keymap.toml` in the platform config dir for docket
/// (`~/.config/docket/` on Linux).
pub fn default_path() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("DOCKET_CONFIG_DIR").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir).join("keymap.toml"));
    }
    Some(
        directories::ProjectDirs::from("", "", "docket")?
            .config_dir()
            .join("keymap.toml"),
    )
}
