//! `[review]`: the queue's summary and the card templates compile.

use super::super::{ConfigError, LoadedConfig};
use crate::review_card::{ReviewTemplateError, ReviewTemplates};

impl LoadedConfig {
    /// Each `[review]` template compiles; an error names the key and the
    /// line in docket.toml (the key's line plus the template's own line).
    pub(super) fn validate_review(&self) -> Result<(), ConfigError> {
        let Err(e) = ReviewTemplates::compile(&self.config.review) else {
            return Ok(());
        };
        let (ReviewTemplateError::Syntax { key, line, detail }
        | ReviewTemplateError::Render { key, line, detail }) = e;
        let leaf = key.rsplit('.').next().unwrap_or(key);
        let key_line = self.review_key_line(leaf);
        Err(ConfigError::Invalid {
            path: self.path.display().to_string(),
            line: key_line + line.saturating_sub(1),
            key: key.to_string(),
            message: format!("template syntax error: {detail}"),
        })
    }

    /// The line (1-based) of the template of `leaf` inside `[review]`, 0
    /// when not found.
    fn review_key_line(&self, leaf: &str) -> usize {
        let mut in_review = false;
        for (i, l) in self.source.lines().enumerate() {
            let t = l.trim_start();
            if t.starts_with('[') {
                in_review = t.starts_with("[review]");
            } else if in_review && t.starts_with(leaf) {
                // A multi-line string's first newline is not part of it:
                // the template's line 1 is the next line of the file.
                let t = t.trim_end();
                let opens = t.ends_with("\"\"\"") || t.ends_with("'''");
                return i + 1 + usize::from(opens);
            }
        }
        0
    }
}
