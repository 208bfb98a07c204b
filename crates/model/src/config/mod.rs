//! `docket.toml`: the job a workspace runs.
//!
//! Parsing is strict: unknown keys, wrong types and out-of-range values are
//! errors naming the file, line and key. Nothing here reads an API key: a
//! provider names the environment variable that holds it (`api_key_env`).
//!
//! Here: the loaded config and its lookups. The parts: what the file can
//! say (`types`, `defaults`), parse errors with their key paths
//! (`toml_error`), the checks per section (`validate`) and the comparison
//! with a session's snapshot (`diff`).

use std::path::{Path, PathBuf};

use toml::Spanned;

mod completion;
mod defaults;
mod diff;
pub mod edit;
mod toml_error;
mod types;
mod validate;

#[cfg(test)]
mod tests;

pub use completion::{COMPLETION_MODES, CompletionMode, UnknownCompletionMode};
pub use diff::ConfigChange;
pub use types::*;

use toml_error::{describe_toml_error, line_at};

/// The job file name inside a workspace.
pub const CONFIG_FILE: &str = "docket.toml";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("{path}:{line}: {message} (at `{text}`)")]
    ParseAt {
        path: String,
        line: usize,
        message: String,
        text: String,
    },
    #[error("{path}:{line}: {key}: {message}")]
    Invalid {
        path: String,
        line: usize,
        key: String,
        message: String,
    },
}

/// A parsed, validated config with the file it came from.
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    pub path: PathBuf,
    pub root: PathBuf,
    pub config: Config,
    source: String,
}

impl LoadedConfig {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let source = crate::files::read_text_file(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(path, source)
    }

    pub fn parse(path: &Path, source: String) -> Result<Self, ConfigError> {
        let config: Config =
            toml::from_str(&source).map_err(|e| describe_toml_error(path, &source, &e))?;
        let root = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let loaded = Self {
            path: path.to_path_buf(),
            root,
            config,
            source,
        };
        loaded.validate()?;
        Ok(loaded)
    }

    /// Resolve a path from the config relative to the workspace.
    pub fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.root.join(p)
        }
    }

    pub fn provider_for(&self, stage: &StageConfig) -> &ProviderConfig {
        // validate() guarantees the name exists.
        &self.config.providers[&stage.provider]
    }

    /// The line (1-based) of a span, or of a key found by text when the value
    /// took its default and has no span.
    pub fn line_of<T>(&self, value: &Spanned<T>, key: &str) -> usize {
        let span = value.span();
        if span.end > 0 {
            return line_at(&self.source, span.start);
        }
        let leaf = key.rsplit('.').next().unwrap_or(key);
        self.source
            .lines()
            .position(|l| l.trim_start().starts_with(leaf))
            .map(|i| i + 1)
            .unwrap_or(0)
    }

    pub fn invalid<T>(
        &self,
        value: &Spanned<T>,
        key: &str,
        message: impl Into<String>,
    ) -> ConfigError {
        ConfigError::Invalid {
            path: self.path.display().to_string(),
            line: self.line_of(value, key),
            key: key.to_string(),
            message: message.into(),
        }
    }

    fn invalid_at_text(&self, needle: &str, key: &str, message: impl Into<String>) -> ConfigError {
        let line = self
            .source
            .lines()
            .position(|l| l.contains(needle))
            .map(|i| i + 1)
            .unwrap_or(0);
        ConfigError::Invalid {
            path: self.path.display().to_string(),
            line,
            key: key.to_string(),
            message: message.into(),
        }
    }

    /// The config as JSON for the session snapshot. Holds the names of key
    /// variables, never their values (no key is ever read into the config).
    pub fn snapshot_json(&self) -> serde_json::Value {
        serde_json::to_value(&self.config).unwrap_or(serde_json::Value::Null)
    }

    /// The stage whose answer and confidence are routed.
    pub fn answer_stage(&self) -> &StageConfig {
        let stages = &self.config.stages;
        self.config
            .routing
            .answer_stage
            .as_ref()
            .and_then(|a| stages.iter().find(|s| &s.name == a))
            .or_else(|| stages.iter().rev().find(|s| !s.is_critic()))
            .unwrap_or(&stages[0])
    }

    /// The critic whose verdict the routing rule reads: the one named in
    /// `[routing.critic]`, else the last critic of the answer stage.
    pub fn critic_stage(&self) -> Option<&StageConfig> {
        let stages = &self.config.stages;
        if let Some(name) = self
            .config
            .routing
            .critic
            .as_ref()
            .and_then(|r| r.stage.as_ref())
        {
            return stages.iter().find(|s| &s.name == name);
        }
        let answer = &self.answer_stage().name;
        stages
            .iter()
            .rev()
            .find(|s| s.critic_of.as_deref() == Some(answer.as_str()))
    }
}
