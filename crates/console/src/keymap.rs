//! Key bindings: the embedded default `keymap.toml`, the user's override file
//! merged binding by binding, and lookup of key presses (including short
//! sequences such as `g g`) to [`Action`]s per [`Section`].
//!
//! Loading never fails: every problem in a user file becomes a warning naming
//! the file and 1-based line, and the affected binding keeps its default.

use std::ops::Range;
use std::path::{Path, PathBuf};

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::action::Action;

/// The documented default keymap, embedded at build time.
pub const DEFAULT_KEYMAP: &str = include_str!("../../../keymap.toml");

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
    pub fn parse(spec: &str) -> Result<KeyPress, String> {
        if spec.is_empty() {
            return Err("empty key".to_string());
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
                return Err(format!("modifier \"{}\" given twice", &rest[..len]));
            }
            modifiers |= m;
            rest = &rest[len..];
        }
        if rest.is_empty() {
            return Err(
                "a modifier needs a key after it, e.g. \"ctrl-c\" or \"alt-enter\"".to_string(),
            );
        }
        if let Some(c) = single_char(rest) {
            if modifiers.contains(KeyModifiers::SHIFT) {
                return Err(format!(
                    "shift- only goes with named keys; write the character itself (e.g. \"{}\")",
                    c.to_uppercase()
                ));
            }
            return char_key(c, modifiers);
        }
        let code = named_key(&rest.to_ascii_lowercase()).ok_or_else(|| {
            format!(
                "unknown key name \"{rest}\"; use a single character, or one of {NAMED_KEYS}, \
                 optionally after ctrl-, alt- or shift-"
            )
        })?;
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

fn char_key(c: char, modifiers: KeyModifiers) -> Result<KeyPress, String> {
    if c.is_control() {
        return Err("control characters are not keys; use a name like \"tab\" or \"enter\"".into());
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
pub fn parse_sequence(spec: &str) -> Result<Vec<KeyPress>, String> {
    if spec == " " {
        return Ok(vec![KeyPress::new(KeyCode::Char(' '), KeyModifiers::NONE)]);
    }
    if spec.is_empty() {
        return Err("empty key".to_string());
    }
    let parts: Vec<&str> = spec.split(' ').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err("keys in a sequence are separated by exactly one space; \
                    write \"space\" for the space bar"
            .to_string());
    }
    if parts.len() > MAX_SEQUENCE {
        return Err(format!(
            "a sequence has at most {MAX_SEQUENCE} keys, this has {}",
            parts.len()
        ));
    }
    let many = parts.len() > 1;
    parts
        .into_iter()
        .map(|p| KeyPress::parse(p).map_err(|e| if many { format!("\"{p}\": {e}") } else { e }))
        .collect()
}

/// The spec form of a sequence: keys joined by single spaces.
pub fn display_sequence(seq: &[KeyPress]) -> String {
    seq.iter()
        .map(KeyPress::display)
        .collect::<Vec<_>>()
        .join(" ")
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

    /// The default keymap with the user's file merged over it. With `None`
    /// the file at [`default_path`] is used if it exists; an explicit path
    /// that is missing or unreadable is a warning. Never fails.
    pub fn load(user_file: Option<&Path>) -> (Keymap, Vec<String>) {
        let mut map = Keymap::default_map();
        let mut warnings = Vec::new();
        let (path, explicit) = match user_file {
            Some(p) => (Some(p.to_path_buf()), true),
            None => (default_path(), false),
        };
        if let Some(path) = path {
            match docket_model::files::read_text_file(&path) {
                Ok(text) => warnings.extend(map.merge_str(&text, &path.display().to_string())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => {}
                Err(e) => warnings.push(format!(
                    "{}: cannot read keymap ({e}); using the default keys",
                    path.display()
                )),
            }
        }
        (map, warnings)
    }

    /// Merge override text over this keymap: every action listed replaces
    /// that action's keys in that section. Returns one warning per problem,
    /// each starting `origin:LINE:`. A file with a TOML syntax error is not
    /// applied at all (only the first error is reported); a bad entry is skipped and its action keeps its keys.
    pub fn merge_str(&mut self, src: &str, origin: &str) -> Vec<String> {
        let mut warnings = Vec::new();
        // Only the first syntax error: recovery after it mostly reports echoes.
        let doc = match DeTable::parse(src) {
            Ok(doc) => doc,
            Err(e) => {
                let msg = e.message().trim_end();
                let at = match e.span() {
                    Some(span) => format!("{origin}:{}", line_of(src, span.start)),
                    None => origin.to_string(),
                };
                warnings.push(format!(
                    "{at}: TOML syntax error: {msg}; the file is not applied, \
                     using the previous keys"
                ));
                return warnings;
            }
        };
        for (key, value) in sorted_entries(doc.get_ref()) {
            let name: &str = key.get_ref();
            let line = line_of(src, key.span().start);
            let Some(section) = Section::from_name(name) else {
                if matches!(value.get_ref(), DeValue::Table(_)) {
                    let hint = suggest(name, Section::ALL.iter().map(|s| s.name()))
                        .map(|s| format!(" (did you mean [{s}]?)"))
                        .unwrap_or_default();
                    warnings.push(format!(
                        "{origin}:{line}: no section [{name}]; sections are global, review, \
                         confirm, input{hint}"
                    ));
                } else {
                    warnings.push(format!(
                        "{origin}:{line}: {name}: bindings go inside a section: [global], \
                         [review], [confirm] or [input]"
                    ));
                }
                continue;
            };
            let DeValue::Table(table) = value.get_ref() else {
                warnings.push(format!(
                    "{origin}:{line}: {name} must be a table ([{name}]), found {}",
                    value.get_ref().type_str()
                ));
                continue;
            };
            for (akey, avalue) in sorted_entries(table) {
                self.merge_entry(section, akey, avalue, src, origin, &mut warnings);
            }
        }
        warnings
    }

    fn merge_entry(
        &mut self,
        section: Section,
        key: &Spanned<std::borrow::Cow<'_, str>>,
        value: &Spanned<DeValue<'_>>,
        src: &str,
        origin: &str,
        warnings: &mut Vec<String>,
    ) {
        let name: &str = key.get_ref();
        let line = line_of(src, key.span().start);
        let at = format!("{origin}:{line}: {section}.{name}");
        let Some(action) = Action::from_name(name) else {
            let hint = suggest(name, Action::ALL.iter().map(|a| a.name()))
                .map(|s| format!(" (did you mean {s}?)"))
                .unwrap_or_default();
            warnings.push(format!("{at}: no such action{hint}"));
            return;
        };
        let mut specs: Vec<(&str, Range<usize>)> = Vec::new();
        match value.get_ref() {
            DeValue::String(s) => specs.push((s, value.span())),
            DeValue::Array(items) => {
                for item in items.iter() {
                    match item.get_ref() {
                        DeValue::String(s) => specs.push((s, item.span())),
                        other => {
                            warnings.push(format!(
                                "{origin}:{}: {section}.{name}: expected key strings like \
                                 [\"a\", \"ctrl-x\"], found {} in the list; keeping the default",
                                line_of(src, item.span().start),
                                other.type_str()
                            ));
                            return;
                        }
                    }
                }
            }
            other => {
                warnings.push(format!(
                    "{origin}:{}: {section}.{name}: expected a list of keys like [\"a\"], \
                     found {}; keeping the default",
                    line_of(src, value.span().start),
                    other.type_str()
                ));
                return;
            }
        }
        let mut seqs: Vec<Vec<KeyPress>> = Vec::new();
        for (spec, span) in specs {
            match parse_sequence(spec) {
                Ok(seq) => {
                    if !seqs.contains(&seq) {
                        seqs.push(seq);
                    }
                }
                Err(e) => {
                    warnings.push(format!(
                        "{origin}:{}: {section}.{name}: \"{spec}\" is not a key: {e}; \
                         keeping the default",
                        line_of(src, span.start)
                    ));
                    return;
                }
            }
        }
        // The new binding wins: drop clashing keys from the section's other actions.
        for (other, other_seqs) in self.sections[section.index()].iter_mut() {
            if *other == action {
                continue;
            }
            let before = other_seqs.len();
            other_seqs.retain(|old| {
                let Some(new) = seqs.iter().find(|new| clashes(new, old)) else {
                    return true;
                };
                let (new_s, old_s) = (display_sequence(new), display_sequence(old));
                let what = if new == old {
                    format!("\"{new_s}\" was also bound to {section}.{other}")
                } else {
                    format!("\"{new_s}\" clashes with \"{old_s}\" of {section}.{other}")
                };
                warnings.push(format!(
                    "{at}: {what}; {name} keeps it, {other} loses \"{old_s}\""
                ));
                false
            });
            if before > 0 && other_seqs.is_empty() {
                warnings.push(format!("{at}: {section}.{other} is now unbound"));
            }
        }
        self.bind(section, action, seqs);
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

/// Equal, or one a prefix of the other (the shorter would hide the longer).
fn clashes(a: &[KeyPress], b: &[KeyPress]) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

fn sorted_entries<'a, 'i>(
    table: &'a DeTable<'i>,
) -> Vec<(
    &'a Spanned<std::borrow::Cow<'i, str>>,
    &'a Spanned<DeValue<'i>>,
)> {
    let mut entries: Vec<_> = table.iter().collect();
    entries.sort_by_key(|(k, _)| k.span().start);
    entries
}

/// 1-based line of a byte offset.
fn line_of(src: &str, offset: usize) -> usize {
    let end = offset.min(src.len());
    src.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// The closest candidate within a small edit distance, for "did you mean".
fn suggest<'a>(name: &str, candidates: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let limit = (name.chars().count() / 3).clamp(1, 3);
    candidates
        .map(|c| (edit_distance(name, c), c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(code: KeyCode, mods: KeyModifiers) -> KeyEvent {
        KeyEvent::new(code, mods)
    }

    fn ch(c: char) -> KeyEvent {
        ev(KeyCode::Char(c), KeyModifiers::NONE)
    }

    fn kp(spec: &str) -> Vec<KeyPress> {
        parse_sequence(spec).unwrap()
    }

    fn merged(src: &str) -> (Keymap, Vec<String>) {
        let mut map = Keymap::default_map();
        let w = map.merge_str(src, "keymap.toml");
        (map, w)
    }

    fn resolve1(map: &Keymap, sections: &[Section], key: KeyEvent) -> KeyMatch {
        map.resolve(sections, &mut Vec::new(), key)
    }

    #[test]
    fn default_parses_without_warnings() {
        let (map, warnings) = Keymap::from_toml_str(DEFAULT_KEYMAP, "keymap.toml");
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(map, Keymap::default_map());
        assert_eq!(map.keys_for(Section::Review, Action::Accept), vec!["a"]);
        assert_eq!(
            map.first_key(Section::Review, Action::Accept).as_deref(),
            Some("a")
        );
        assert_eq!(map.keys_for(Section::Global, Action::Help), vec!["?", "f1"]);
        assert_eq!(
            map.keys_for(Section::Global, Action::PageDown),
            vec!["pgdn", "ctrl-d"]
        );
        assert_eq!(
            map.keys_for(Section::Confirm, Action::ConfirmNo),
            vec!["n", "esc"]
        );
        assert_eq!(map.first_key(Section::Global, Action::Accept), None);
    }

    #[test]
    fn every_action_is_bound_somewhere() {
        let map = Keymap::default_map();
        for &a in Action::ALL {
            let bound = Section::ALL.iter().any(|&s| !map.keys_for(s, a).is_empty());
            assert!(bound, "{a} has no default key");
        }
        assert_eq!(map.help_entries().len(), Action::ALL.len());
    }

    #[test]
    fn key_specs_round_trip() {
        for spec in [
            "a",
            "G",
            "?",
            "/",
            ":",
            "1",
            "-",
            "space",
            "enter",
            "esc",
            "tab",
            "backtab",
            "up",
            "down",
            "left",
            "right",
            "home",
            "end",
            "pgup",
            "pgdn",
            "backspace",
            "delete",
            "insert",
            "f1",
            "f12",
            "ctrl-c",
            "ctrl-u",
            "alt-x",
            "ctrl-alt-left",
            "shift-up",
            "alt-enter",
            "ctrl--",
            "ctrl-space",
            "g g",
            "ctrl-x ctrl-s",
            "g g G",
        ] {
            let seq = parse_sequence(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
            assert_eq!(display_sequence(&seq), spec, "{spec}");
        }
        for (alias, canonical) in [
            ("shift-tab", "backtab"),
            ("pageup", "pgup"),
            ("pagedown", "pgdn"),
            ("Enter", "enter"),
            ("CTRL-c", "ctrl-c"),
            ("alt-ctrl-x", "ctrl-alt-x"),
            (" ", "space"),
        ] {
            assert_eq!(display_sequence(&kp(alias)), canonical, "{alias}");
        }
        for bad in [
            "",
            "ctrl-",
            "ctrl-ctrl-c",
            "shift-a",
            "f13",
            "f0",
            "hello",
            "g  g",
            "a b c d",
            "ctrl-enterr",
        ] {
            assert!(parse_sequence(bad).is_err(), "{bad:?} should not parse");
        }
        assert!(parse_sequence("ctrl-").unwrap_err().contains("needs a key"));
    }

    #[test]
    fn shift_is_ignored_for_chars() {
        let map = Keymap::default_map();
        let g = [Section::Global];
        let shifted_g = ev(KeyCode::Char('G'), KeyModifiers::SHIFT);
        assert_eq!(
            resolve1(&map, &g, shifted_g),
            KeyMatch::Action(Action::Bottom)
        );
        assert_eq!(
            resolve1(&map, &g, ev(KeyCode::Char('G'), KeyModifiers::NONE)),
            KeyMatch::Action(Action::Bottom)
        );
        assert_eq!(
            resolve1(&map, &g, ev(KeyCode::Char('?'), KeyModifiers::SHIFT)),
            KeyMatch::Action(Action::Help)
        );
        assert_eq!(resolve1(&map, &g, ch('g')), KeyMatch::Action(Action::Top));
        assert_eq!(
            resolve1(&map, &g, ev(KeyCode::BackTab, KeyModifiers::SHIFT)),
            KeyMatch::Action(Action::FocusPrev)
        );
        assert_eq!(
            resolve1(&map, &g, ev(KeyCode::Tab, KeyModifiers::SHIFT)),
            KeyMatch::Action(Action::FocusPrev)
        );
        // Shift on a named key is significant.
        assert_eq!(
            resolve1(&map, &g, ev(KeyCode::Up, KeyModifiers::SHIFT)),
            KeyMatch::Unbound
        );
    }

    #[test]
    fn ctrl_c_and_modifiers_match() {
        let map = Keymap::default_map();
        let g = [Section::Global];
        assert_eq!(
            resolve1(&map, &g, ev(KeyCode::Char('c'), KeyModifiers::CONTROL)),
            KeyMatch::Action(Action::ForceQuit)
        );
        assert_eq!(
            resolve1(&map, &g, ch('c')),
            KeyMatch::Action(Action::CancelRun)
        );
        assert_eq!(
            resolve1(&map, &g, ev(KeyCode::Char('c'), KeyModifiers::ALT)),
            KeyMatch::Unbound
        );
        assert_eq!(
            resolve1(
                &map,
                &[Section::Review],
                ev(KeyCode::Char(' '), KeyModifiers::NONE)
            ),
            KeyMatch::Action(Action::ToggleMark)
        );
    }

    #[test]
    fn release_events_are_ignored() {
        let map = Keymap::default_map();
        let mut release = ch('q');
        release.kind = KeyEventKind::Release;
        let mut pending = kp("x");
        assert_eq!(
            map.resolve(&[Section::Global], &mut pending, release),
            KeyMatch::Unbound
        );
        assert_eq!(pending, kp("x"));
    }

    #[test]
    fn section_priority_review_shadows_global() {
        let (map, w) = merged("[review]\nquit = [\"c\"]\n");
        assert!(w.is_empty(), "{w:?}");
        let rg = [Section::Review, Section::Global];
        assert_eq!(resolve1(&map, &rg, ch('c')), KeyMatch::Action(Action::Quit));
        assert_eq!(
            resolve1(&map, &[Section::Global], ch('c')),
            KeyMatch::Action(Action::CancelRun)
        );
        assert_eq!(
            resolve1(&map, &rg, ch('a')),
            KeyMatch::Action(Action::Accept)
        );
        assert_eq!(resolve1(&map, &rg, ch('j')), KeyMatch::Action(Action::Down));
        assert_eq!(
            resolve1(&map, &[Section::Global], ch('a')),
            KeyMatch::Unbound
        );
    }

    #[test]
    fn sequence_override_waits_then_fires() {
        let (map, w) = merged("[global]\ntop = [\"g g\", \"home\"]\n");
        assert!(w.is_empty(), "{w:?}");
        let g = [Section::Global];
        let mut pending = Vec::new();
        assert_eq!(map.resolve(&g, &mut pending, ch('g')), KeyMatch::Pending);
        assert_eq!(pending, kp("g"));
        assert_eq!(
            map.resolve(&g, &mut pending, ch('g')),
            KeyMatch::Action(Action::Top)
        );
        assert!(pending.is_empty());
        // A pending prefix followed by a non-continuing bound key: drop the prefix, fire the key.
        assert_eq!(map.resolve(&g, &mut pending, ch('g')), KeyMatch::Pending);
        assert_eq!(
            map.resolve(&g, &mut pending, ch('j')),
            KeyMatch::Action(Action::Down)
        );
        assert!(pending.is_empty());
        // ...or an unbound key: nothing, and nothing left pending.
        assert_eq!(map.resolve(&g, &mut pending, ch('g')), KeyMatch::Pending);
        assert_eq!(map.resolve(&g, &mut pending, ch('x')), KeyMatch::Unbound);
        assert!(pending.is_empty());
        assert_eq!(
            map.keys_for(Section::Global, Action::Top),
            vec!["g g", "home"]
        );
    }

    #[test]
    fn unbound_first_key_then_bound_key_resolves_second() {
        let map = Keymap::default_map();
        let g = [Section::Global];
        let mut pending = Vec::new();
        assert_eq!(map.resolve(&g, &mut pending, ch('x')), KeyMatch::Unbound);
        assert!(pending.is_empty());
        assert_eq!(
            map.resolve(&g, &mut pending, ch('q')),
            KeyMatch::Action(Action::Quit)
        );
        // A stale pending key that leads nowhere is dropped and the new key tried alone.
        let mut pending = kp("x");
        assert_eq!(
            map.resolve(&g, &mut pending, ch('k')),
            KeyMatch::Action(Action::Up)
        );
        assert!(pending.is_empty());
    }

    #[test]
    fn override_replaces_only_that_action() {
        let (map, w) = merged("[review]\naccept = [\"y\", \"enter\"]\n");
        assert!(w.is_empty(), "{w:?}");
        let default = Keymap::default_map();
        assert_eq!(
            map.keys_for(Section::Review, Action::Accept),
            vec!["y", "enter"]
        );
        for section in Section::ALL {
            for &a in Action::ALL {
                if (section, a) != (Section::Review, Action::Accept) {
                    assert_eq!(
                        map.keys_for(section, a),
                        default.keys_for(section, a),
                        "{section}.{a}"
                    );
                }
            }
        }
        assert_eq!(
            resolve1(&map, &[Section::Review, Section::Global], ch('a')),
            KeyMatch::Unbound
        );
    }

    #[test]
    fn unknown_action_warns_with_line() {
        let src = "# mine\n\n[review]\nreject = [\"x\"]\nacept = [\"z\"]\n";
        let (map, w) = merged(src);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("keymap.toml:5: review.acept: no such action"),
            "{}",
            w[0]
        );
        assert!(w[0].contains("did you mean accept?"), "{}", w[0]);
        assert_eq!(map.keys_for(Section::Review, Action::Accept), vec!["a"]);
        assert_eq!(map.keys_for(Section::Review, Action::Reject), vec!["x"]);
    }

    #[test]
    fn unknown_section_warns_with_line() {
        let src = "[global]\nquit = [\"Q\"]\n[revew]\naccept = [\"z\"]\n";
        let (map, w) = merged(src);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with(
                "keymap.toml:3: no section [revew]; sections are global, review, confirm, input"
            ),
            "{}",
            w[0]
        );
        assert!(w[0].contains("did you mean [review]?"), "{}", w[0]);
        assert_eq!(map.keys_for(Section::Review, Action::Accept), vec!["a"]);
        assert_eq!(map.keys_for(Section::Global, Action::Quit), vec!["Q"]);
        // A binding outside any section.
        let (_, w) = merged("quit = [\"Q\"]\n");
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].starts_with("keymap.toml:1: quit: "), "{}", w[0]);
    }

    #[test]
    fn bad_key_warns_with_line_and_keeps_default() {
        let src = "[global]\nup = [\"z\"]\n\n\n\n\n\n\nquit = [\"x\",\n  \"ctrl-\"]\n";
        let (map, w) = merged(src);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("keymap.toml:10: global.quit: \"ctrl-\" is not a key: "),
            "{}",
            w[0]
        );
        assert_eq!(map.keys_for(Section::Global, Action::Quit), vec!["q"]);
        assert_eq!(map.keys_for(Section::Global, Action::Up), vec!["z"]);
        let (map, w) = merged("[global]\nquit = [\"ctrl-\"]\n");
        assert!(
            w[0].starts_with("keymap.toml:2: global.quit: \"ctrl-\" is not a key: "),
            "{w:?}"
        );
        assert_eq!(map, Keymap::default_map());
    }

    #[test]
    fn wrong_type_warns_with_line_and_keeps_default() {
        let (map, w) = merged("\n[review]\n\naccept = 5\n");
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("keymap.toml:4: review.accept: "),
            "{}",
            w[0]
        );
        assert!(w[0].contains("integer"), "{}", w[0]);
        assert_eq!(map, Keymap::default_map());
        let (map, w) = merged("[review]\naccept = [\"b\", true]\n");
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("keymap.toml:2: review.accept: "),
            "{}",
            w[0]
        );
        assert_eq!(map, Keymap::default_map());
        let (_, w) = merged("review = 3\n");
        assert!(
            w[0].starts_with("keymap.toml:1: review must be a table"),
            "{w:?}"
        );
        // A bare string is accepted as a one-key list.
        let (map, w) = merged("[review]\naccept = \"b\"\n");
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(map.keys_for(Section::Review, Action::Accept), vec!["b"]);
    }

    #[test]
    fn syntax_error_warns_with_line_and_keeps_default() {
        let src = "[review]\naccept = [\"b\"]\n\nreject = [\"x\"\nskip = [\"z\"]\n";
        let (map, w) = merged(src);
        // The unclosed array on line 4 is noticed at line 5; one warning, not echoes.
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("keymap.toml:5: TOML syntax error"),
            "{w:?}"
        );
        assert!(w[0].contains("not applied"), "{w:?}");
        assert_eq!(map, Keymap::default_map());
        let (map, w) = merged("[global]\nquit = [\"Q\"]\nup = = \n");
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("keymap.toml:3: TOML syntax error"),
            "{w:?}"
        );
        assert_eq!(map, Keymap::default_map());
    }

    #[test]
    fn conflict_names_both_actions_and_user_wins() {
        let (map, w) = merged("[review]\naccept = [\"r\"]\n");
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            w[0].starts_with("keymap.toml:2: review.accept: "),
            "{}",
            w[0]
        );
        assert!(w[0].contains("review.reject"), "{}", w[0]);
        assert!(w[1].contains("reject is now unbound"), "{}", w[1]);
        assert_eq!(map.keys_for(Section::Review, Action::Accept), vec!["r"]);
        assert!(map.keys_for(Section::Review, Action::Reject).is_empty());
        assert_eq!(
            resolve1(&map, &[Section::Review], ch('r')),
            KeyMatch::Action(Action::Accept)
        );
        // An alias is taken from the other action, which keeps its remaining keys.
        let (map, w) = merged("[global]\nquit = [\"q\", \"end\"]\n");
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("quit") && w[0].contains("bottom"), "{}", w[0]);
        assert_eq!(map.keys_for(Section::Global, Action::Bottom), vec!["G"]);
        assert_eq!(
            map.keys_for(Section::Global, Action::Quit),
            vec!["q", "end"]
        );
        // A prefix clash: "g g" for bottom would be hidden by top's "g".
        let (map, w) = merged("[global]\nbottom = [\"g g\"]\n");
        assert!(
            w.iter().any(|w| w.contains("bottom") && w.contains("top")),
            "{w:?}"
        );
        assert_eq!(map.keys_for(Section::Global, Action::Top), vec!["home"]);
        // The same key in review and global is shadowing, not a conflict.
        let (_, w) = merged("[review]\nundo = [\"q\"]\n");
        assert!(w.is_empty(), "{w:?}");
    }

    #[test]
    fn to_toml_round_trips() {
        let (map, w) = merged(
            "[global]\ntop = [\"g g\", \"home\"]\nquit = [\"q\", \"ctrl-q\"]\n\
             [review]\naccept = [\"\\\"\", \"\\\\\"]\nreject = []\n",
        );
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(
            map.keys_for(Section::Review, Action::Accept),
            vec!["\"", "\\"]
        );
        for m in [Keymap::default_map(), map] {
            let text = m.to_toml();
            let (back, w) = Keymap::from_toml_str(&text, "printed");
            assert!(w.is_empty(), "{w:?}\n{text}");
            assert_eq!(back, m, "{text}");
        }
    }

    #[test]
    fn help_entries_are_ordered() {
        let map = Keymap::default_map();
        let entries = map.help_entries();
        assert_eq!(
            entries[0],
            (Section::Global, Action::Up, "k, up".to_string(), "move up")
        );
        let sections: Vec<Section> = entries.iter().map(|e| e.0).collect();
        let mut sorted = sections.clone();
        sorted.sort();
        assert_eq!(sections, sorted);
        assert!(entries.contains(&(
            Section::Review,
            Action::Accept,
            "a".to_string(),
            "accept the suggestion"
        )));
    }

    #[test]
    fn load_reports_missing_explicit_file_and_merges_present_one() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.toml");
        let (map, w) = Keymap::load(Some(&missing));
        assert_eq!(map, Keymap::default_map());
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("nope.toml"), "{}", w[0]);
        let file = dir.path().join("keymap.toml");
        std::fs::write(&file, "[global]\nquit = [\"Q\"]\nbogus = [\"x\"]\n").unwrap();
        let (map, w) = Keymap::load(Some(&file));
        assert_eq!(map.keys_for(Section::Global, Action::Quit), vec!["Q"]);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with(&format!("{}:3: global.bogus", file.display())),
            "{}",
            w[0]
        );
    }

    #[test]
    fn default_path_ends_in_keymap_toml() {
        if let Some(p) = default_path() {
            assert!(p.ends_with("keymap.toml"), "{}", p.display());
        }
    }
}
