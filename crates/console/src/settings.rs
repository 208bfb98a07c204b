//! The console's own settings file, `console.toml` beside the keymap in the
//! config dir (`$DOCKET_CONFIG_DIR`, else `~/.config/docket/`). One key so
//! far: `mouse = true` turns the mouse on as `--mouse` does. Like the
//! keymap it never stops the console: a problem is a warning naming the
//! file and line, and the setting keeps its default.

use std::path::{Path, PathBuf};

use toml::de::{DeTable, DeValue};

/// What console.toml sets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConsoleSettings {
    /// Clicks and the wheel act (off: the terminal keeps text selection).
    pub mouse: bool,
}

/// `console.toml` in the same dir as the user's keymap.
pub fn default_path() -> Option<PathBuf> {
    Some(crate::keymap::default_path()?.with_file_name("console.toml"))
}

impl ConsoleSettings {
    /// The settings from `file` (None: [`default_path`], when it exists),
    /// and one warning per problem.
    pub fn load(file: Option<&Path>) -> (ConsoleSettings, Vec<String>) {
        let Some(path) = file.map(Path::to_path_buf).or_else(default_path) else {
            return (ConsoleSettings::default(), Vec::new());
        };
        match docket_model::files::read_text_file(&path) {
            Ok(text) => ConsoleSettings::parse(&text, &path.display().to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                (ConsoleSettings::default(), Vec::new())
            }
            Err(e) => (
                ConsoleSettings::default(),
                vec![format!(
                    "{}: cannot read it ({e}); mouse off",
                    path.display()
                )],
            ),
        }
    }

    /// Settings from console.toml text; `origin` names it in warnings.
    pub fn parse(src: &str, origin: &str) -> (ConsoleSettings, Vec<String>) {
        let mut settings = ConsoleSettings::default();
        let mut warnings = Vec::new();
        let doc = match DeTable::parse(src) {
            Ok(doc) => doc,
            Err(e) => {
                let at = e.span().map_or(origin.to_string(), |s| {
                    format!("{origin}:{}", line_of(src, s.start))
                });
                let msg = e.message().trim_end().to_string();
                warnings.push(format!("{at}: TOML syntax error: {msg}; mouse off"));
                return (settings, warnings);
            }
        };
        for (key, value) in doc.get_ref() {
            let line = line_of(src, key.span().start);
            match (key.get_ref().as_ref(), value.get_ref()) {
                ("mouse", DeValue::Boolean(on)) => settings.mouse = *on,
                ("mouse", _) => warnings.push(format!(
                    "{origin}:{line}: mouse must be true or false; mouse off"
                )),
                (other, _) => warnings.push(format!(
                    "{origin}:{line}: unknown key {:?} (console.toml knows: mouse)",
                    docket_model::sanitize::truncate(other, 40)
                )),
            }
        }
        (settings, warnings)
    }
}

/// The 1-based line of byte `offset` in `src`.
fn line_of(src: &str, offset: usize) -> usize {
    let end = offset.min(src.len());
    src.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mouse_on_off_and_bad_values_name_their_line() {
        assert!(ConsoleSettings::parse("mouse = true\n", "c.toml").0.mouse);
        let (s, w) = ConsoleSettings::parse("mouse = false\n", "c.toml");
        assert!(!s.mouse && w.is_empty(), "{w:?}");
        let (s, w) = ConsoleSettings::parse("# hi\nmouse = \"yes\"\n", "c.toml");
        assert!(!s.mouse);
        assert_eq!(w, vec!["c.toml:2: mouse must be true or false; mouse off"]);
        let (_, w) = ConsoleSettings::parse("mouse = true\nmosue = 1\n", "c.toml");
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("c.toml:2: unknown key \"mosue\""),
            "{}",
            w[0]
        );
        let (s, w) = ConsoleSettings::parse("mouse = \n", "c.toml");
        assert!(!s.mouse);
        assert!(w[0].starts_with("c.toml:1: TOML syntax error"), "{}", w[0]);
    }

    #[test]
    fn a_missing_file_is_the_defaults_without_a_word() {
        let dir = tempfile::tempdir().unwrap();
        let (s, w) = ConsoleSettings::load(Some(&dir.path().join("console.toml")));
        assert_eq!(s, ConsoleSettings::default());
        assert!(w.is_empty(), "{w:?}");
    }
}
