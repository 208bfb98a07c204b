//! Reading keymap text over a keymap: each action listed replaces its keys,
//! and every problem becomes a warning naming the file and line.

use std::ops::Range;
use std::path::Path;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::{KeyPress, Keymap, Section, default_path, display_sequence, parse_sequence};
use crate::action::Action;

impl Keymap {
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

    /// One `action = [keys]` line of a section: parsed whole, or skipped
    /// with a warning so the action keeps its keys.
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
        let entry = Entry {
            section,
            name,
            src,
            origin,
        };
        let Some(specs) = entry.key_specs(value, warnings) else {
            return;
        };
        let Some(seqs) = entry.parse_specs(specs, warnings) else {
            return;
        };
        self.take_from_others(section, action, &seqs, &at, warnings);
        self.bind(section, action, seqs);
    }

    /// The new binding wins: drop clashing keys from the section's other actions.
    fn take_from_others(
        &mut self,
        section: Section,
        action: Action,
        seqs: &[Vec<KeyPress>],
        at: &str,
        warnings: &mut Vec<String>,
    ) {
        let name = action.name();
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
    }
}

/// Where one entry of a keymap file sits, for its warnings.
struct Entry<'a> {
    section: Section,
    name: &'a str,
    src: &'a str,
    origin: &'a str,
}

impl<'a> Entry<'a> {
    /// The key strings of the entry with their places; None (after a
    /// warning) when the value is not a string or a list of strings.
    fn key_specs<'v>(
        &self,
        value: &'v Spanned<DeValue<'_>>,
        warnings: &mut Vec<String>,
    ) -> Option<Vec<(&'v str, Range<usize>)>> {
        let Entry {
            section,
            name,
            src,
            origin,
        } = self;
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
                            return None;
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
                return None;
            }
        }
        Some(specs)
    }

    /// Each spec as a key sequence, duplicates dropped; None (after a
    /// warning) when one of them is not a key.
    fn parse_specs(
        &self,
        specs: Vec<(&str, Range<usize>)>,
        warnings: &mut Vec<String>,
    ) -> Option<Vec<Vec<KeyPress>>> {
        let Entry {
            section,
            name,
            src,
            origin,
        } = self;
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
                    return None;
                }
            }
        }
        Some(seqs)
    }
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
