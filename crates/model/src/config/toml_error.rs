//! Parse errors in the usual `file:line:` form, naming the whole dotted path
//! of the key they are about.

use std::collections::BTreeMap;
use std::path::Path;

use super::ConfigError;

pub(super) fn line_at(source: &str, offset: usize) -> usize {
    source[..offset.min(source.len())]
        .bytes()
        .filter(|b| *b == b'\n')
        .count()
        + 1
}

/// toml's message says what was expected; add the file and line in the
/// usual `file:line:` form, and the key's whole path (toml names only the
/// last part of it, if that).
pub(super) fn describe_toml_error(path: &Path, source: &str, e: &toml::de::Error) -> ConfigError {
    let message = e.message().trim().replace('\n', " ");
    match e.span() {
        Some(span) => {
            // An unknown key can be reported at its table (a gate's, whose
            // `kind` picks the fields): the key is in the message.
            let unknown = message
                .strip_prefix("unknown field `")
                .and_then(|m| m.split('`').next());
            let message = match (key_path_at(source, span.start), unknown) {
                (Some(key), Some(field))
                    if key != field && !key.ends_with(&format!(".{field}")) =>
                {
                    format!("{key}.{field}: {message}")
                }
                (Some(key), _) => format!("{key}: {message}"),
                (None, _) => message,
            };
            let line = line_at(source, span.start);
            let text = source
                .lines()
                .nth(line.saturating_sub(1))
                .unwrap_or("")
                .trim()
                .to_string();
            ConfigError::ParseAt {
                path: path.display().to_string(),
                line,
                message,
                text,
            }
        }
        None => ConfigError::Parse {
            path: path.display().to_string(),
            message,
        },
    }
}

/// The whole path of the key on the line holding byte `offset` of a
/// docket.toml (`providers.main.requests_per_minute`, `stages[1].gate.kind`),
/// from the table headers above it; for a header line, the table's own
/// path. None for a line that holds no key (a value spanning lines).
pub(super) fn key_path_at(source: &str, offset: usize) -> Option<String> {
    let offset = offset.min(source.len());
    let line_start = source[..offset].rfind('\n').map_or(0, |i| i + 1);
    let line_end = source[offset..]
        .find('\n')
        .map_or(source.len(), |i| offset + i);
    // Arrays of tables seen so far, by their dotted name: how many entries.
    let mut arrays: BTreeMap<String, usize> = BTreeMap::new();
    let mut table = String::new();
    fn header(text: &str, arrays: &mut BTreeMap<String, usize>) -> Option<String> {
        let (inner, is_array) = if let Some(t) = text.strip_prefix("[[") {
            (t.split("]]").next()?, true)
        } else {
            (text.strip_prefix('[')?.split(']').next()?, false)
        };
        let parts = key_parts(inner);
        let name = parts.join(".");
        if is_array {
            *arrays.entry(name.clone()).or_default() += 1;
        }
        // Each part that names an array of tables takes its last entry.
        let mut resolved = String::new();
        for (i, part) in parts.iter().enumerate() {
            if i > 0 {
                resolved.push('.');
            }
            resolved.push_str(part);
            if let Some(n) = arrays.get(&parts[..=i].join(".")) {
                resolved.push_str(&format!("[{}]", n.saturating_sub(1)));
            }
        }
        Some(resolved)
    }
    for l in source[..line_start].lines() {
        let t = l.trim_start();
        if t.starts_with('[')
            && let Some(h) = header(t, &mut arrays)
        {
            table = h;
        }
    }
    let line = source[line_start..line_end].trim();
    if line.starts_with('[') {
        return header(line, &mut arrays);
    }
    let (key, _) = line.split_once('=')?;
    let key = key_parts(key).join(".");
    if key.is_empty() {
        return None;
    }
    Some(if table.is_empty() {
        key
    } else {
        format!("{table}.{key}")
    })
}

/// The parts of a dotted TOML key (`a."b.c".d` is `a`, `b.c`, `d`).
pub(super) fn key_parts(key: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut part = String::new();
    let mut quote: Option<char> = None;
    for c in key.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => part.push(c),
            (None, '"' | '\'') => quote = Some(c),
            (None, '.') => parts.push(std::mem::take(&mut part).trim().to_string()),
            (None, c) => part.push(c),
        }
    }
    parts.push(part.trim().to_string());
    parts
}
