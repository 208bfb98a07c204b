//! `docket.toml`: the job a workspace runs.
//!
//! Parsing is strict: unknown keys, wrong types and out-of-range values are
//! errors naming the file, line and key. Nothing here reads an API key: a
//! provider names the environment variable that holds it (`api_key_env`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use toml::Spanned;

use crate::mock_config::MockConfig;

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

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub job: JobConfig,
    pub providers: BTreeMap<String, ProviderConfig>,
    #[serde(rename = "stages")]
    pub stages: Vec<StageConfig>,
    #[serde(default)]
    pub routing: RoutingConfig,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct JobConfig {
    #[serde(default = "default_job_name")]
    pub name: String,
    /// `false` stops `batch-adjudicate` unless `--force` is given.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Which item field names the item in a prompt or a report (informational).
    #[serde(default)]
    pub description: Option<String>,
}

impl Default for JobConfig {
    fn default() -> Self {
        Self {
            name: default_job_name(),
            enabled: true,
            description: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    /// OpenAI's Chat Completions API (api.openai.com or any base URL).
    Openai,
    /// Any server speaking OpenAI's Chat Completions wire format.
    OpenaiCompatible,
    /// The built-in mock, started in-process on a free loopback port and
    /// spoken to over real HTTP in OpenAI's wire format.
    Mock,
    /// Azure OpenAI: `{base_url}/openai/deployments/{model}/chat/completions
    /// ?api-version=..`, `api-key` header; `model` is the deployment name.
    Azure,
    /// Anthropic Messages (`/v1/messages`).
    Anthropic,
    /// Google Gemini `generateContent` (Gemini Developer API).
    Gemini,
    /// Ollama's native `/api/chat` (no key needed).
    Ollama,
    /// OpenRouter (OpenAI's wire format, its own errors and headers).
    Openrouter,
}

impl ProviderKind {
    /// The name used in `docket.toml` and in the ledger.
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Openai => "openai",
            ProviderKind::OpenaiCompatible => "openai_compatible",
            ProviderKind::Mock => "mock",
            ProviderKind::Azure => "azure",
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::Gemini => "gemini",
            ProviderKind::Ollama => "ollama",
            ProviderKind::Openrouter => "openrouter",
        }
    }

    /// `base_url` when the config leaves it out (`None`: it is required, or
    /// for the mock, known only once it listens).
    pub fn default_base_url(self) -> Option<&'static str> {
        match self {
            ProviderKind::Openai => Some("https://api.openai.com/v1"),
            ProviderKind::Anthropic => Some("https://api.anthropic.com"),
            ProviderKind::Gemini => Some("https://generativelanguage.googleapis.com"),
            ProviderKind::Ollama => Some("http://localhost:11434"),
            ProviderKind::Openrouter => Some("https://openrouter.ai/api/v1"),
            ProviderKind::Azure | ProviderKind::OpenaiCompatible => None,
            // The in-process mock is given its address at run time; this
            // fallback (the one every kind had before) is not reached.
            ProviderKind::Mock => Some("https://api.openai.com/v1"),
        }
    }

    /// Kinds that cannot work without a key.
    pub fn requires_key(self) -> bool {
        matches!(
            self,
            ProviderKind::Azure
                | ProviderKind::Anthropic
                | ProviderKind::Gemini
                | ProviderKind::Openrouter
        )
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    pub kind: ProviderKind,
    pub model: String,
    #[serde(default)]
    pub base_url: Option<String>,
    /// The *name* of the environment variable holding the key, never the key.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Azure's `api-version` query parameter (e.g. "2024-10-21"); required
    /// for `kind = "azure"`, refused for every other kind. Left out of the
    /// session snapshot when absent, so snapshots of other kinds are unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<Spanned<String>>,
    /// Client-side requests per minute; 0 means no client-side limit.
    #[serde(default = "default_rpm")]
    pub requests_per_minute: Spanned<u64>,
    /// Client-side tokens per minute; 0 means no client-side limit.
    #[serde(default = "default_tpm")]
    pub tokens_per_minute: Spanned<u64>,
    #[serde(default = "default_concurrency")]
    pub max_concurrency: Spanned<u64>,
    #[serde(default = "default_timeout")]
    pub request_timeout_secs: Spanned<f64>,
    /// Transport attempts per request (network errors, 5xx, timeouts).
    #[serde(default = "default_transport_attempts")]
    pub max_transport_attempts: Spanned<u64>,
    /// 429 rate-limit refusals of one request in a row before it waits
    /// `retry_wait_secs` (row S2: "not now" is never an item's error).
    #[serde(default = "default_rate_limit_retries")]
    pub max_rate_limit_retries: Spanned<u64>,
    /// How long a request that used up its rate-limit retries waits
    /// (jittered) before it goes again.
    #[serde(default = "default_retry_wait")]
    pub retry_wait_secs: Spanned<f64>,
    /// Settings of the in-process mock when `kind = "mock"`.
    #[serde(default)]
    pub mock: Option<MockConfig>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StageConfig {
    pub name: String,
    pub provider: String,
    /// Template file, relative to the workspace.
    pub template: PathBuf,
    /// Optional system prompt file, relative to the workspace.
    #[serde(default)]
    pub system_prompt: Option<PathBuf>,
    #[serde(default = "default_max_tokens")]
    pub max_tokens: Spanned<u64>,
    /// What a typical answer costs in output tokens, for the estimate.
    #[serde(default = "default_expected_output")]
    pub expected_output_tokens: Spanned<u64>,
    #[serde(default)]
    pub temperature: Option<Spanned<f64>>,
    /// Sends allowed when answers fail the gate (parse errors, truncation).
    #[serde(default = "default_max_attempts")]
    pub max_attempts: Spanned<u64>,
    pub gate: GateConfig,
    /// How the stage's requests go out: synchronously under the rate limits,
    /// or through the provider's Batch API (`[stages.batch]`).
    #[serde(default, skip_serializing_if = "BatchConfig::is_default")]
    pub batch: BatchConfig,
    /// This stage is a critic of an earlier stage: it runs for every item
    /// whose output passed that stage's gate (never for one that failed),
    /// and the item's outcome waits for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub critic_of: Option<String>,
    /// Start this stage only once every item is through the one before it
    /// (default: each item moves on as soon as its previous stage passed).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub wait_for_previous: bool,
    /// After this many answers failed the gate, the next attempt sends the
    /// repair prompt (`repair_template`) instead of the stage's template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repair_after: Option<Spanned<u64>>,
    /// The repair prompt: the stage's context plus `failed_output` (the last
    /// answer) and `gate_error` (why it failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repair_template: Option<PathBuf>,
    /// Structured batching: criteria judged in one request. The template
    /// gets `criteria` (the names to judge); the answer holds one property
    /// per criterion. Criteria an answer leaves out are asked again one by
    /// one, and the answers are merged.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub criteria: Vec<String>,
}

impl StageConfig {
    pub fn is_critic(&self) -> bool {
        self.critic_of.is_some()
    }
}

/// `sync`, `batch`, or `auto` (batch when at least `min_batch_size`
/// requests are pending at a cut, else sync).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchMode {
    #[default]
    Sync,
    Batch,
    Auto,
}

impl BatchMode {
    pub fn as_str(self) -> &'static str {
        match self {
            BatchMode::Sync => "sync",
            BatchMode::Batch => "batch",
            BatchMode::Auto => "auto",
        }
    }
}

/// A stage's batching: the mode, and the triggers that cut a batch from the
/// pending requests (COUNT, SIZE in bytes, TIME since the first one waited).
/// A cut is further split to each provider's own limits.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BatchConfig {
    #[serde(default)]
    pub mode: BatchMode,
    /// `auto`: fewer pending requests than this at a cut go synchronously.
    #[serde(default = "default_min_batch_size")]
    pub min_batch_size: Spanned<u64>,
    /// COUNT trigger: cut once this many requests wait (default: the
    /// provider's most per batch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_requests: Option<Spanned<u64>>,
    /// SIZE trigger: cut once the waiting requests' JSONL reaches this many
    /// bytes (default: the provider's largest file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<Spanned<u64>>,
    /// TIME trigger: cut this long after the first request began to wait.
    #[serde(default = "default_max_wait")]
    pub max_wait_secs: Spanned<f64>,
    /// Provider batches open at once; more requests wait for one to finish.
    #[serde(default = "default_max_open_batches")]
    pub max_open_batches: Spanned<u64>,
    /// Poll every this many seconds instead of the provider's cadence
    /// (30 s, then 120 s after 10 minutes, ...). For the mock and tests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll_interval_secs: Option<Spanned<f64>>,
    /// The provider's enqueued-token limit for this stage's model: prompt
    /// tokens (estimated) of its open batches at once. A batch that would
    /// pass it waits until open batches finish. Unset: learned from the
    /// provider's `token_limit_exceeded` refusals.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_enqueued_tokens: Option<Spanned<u64>>,
    /// A batch still running this long after its submission is shown as
    /// stalled (default: the provider's completion window, 24 h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stall_after_secs: Option<Spanned<f64>>,
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig {
            mode: BatchMode::Sync,
            min_batch_size: default_min_batch_size(),
            max_requests: None,
            max_bytes: None,
            max_wait_secs: default_max_wait(),
            max_open_batches: default_max_open_batches(),
            poll_interval_secs: None,
            max_enqueued_tokens: None,
            stall_after_secs: None,
        }
    }
}

impl BatchConfig {
    fn is_default(&self) -> bool {
        self == &BatchConfig::default()
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum GateConfig {
    /// The answer must be a JSON object valid against the schema; the schema is
    /// also sent to the provider as its structured-output format.
    JsonSchema {
        schema: PathBuf,
        #[serde(default = "default_confidence_field")]
        confidence_field: String,
        #[serde(default = "default_rationale_field")]
        rationale_field: String,
    },
    /// The answer must match the pattern; named captures become the answer's
    /// fields, and the `confidence` capture is required.
    Regex {
        pattern: String,
        #[serde(default = "default_confidence_field")]
        confidence_field: String,
        #[serde(default = "default_rationale_field")]
        rationale_field: String,
    },
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RoutingConfig {
    #[serde(default = "default_auto_accept")]
    pub auto_accept_threshold: Spanned<f64>,
    #[serde(default = "default_review")]
    pub review_threshold: Spanned<f64>,
    /// The stage whose answer and confidence are routed (default: the last
    /// stage that is not a critic).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_stage: Option<String>,
    /// How a critic of the answer stage bears on the routing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub critic: Option<CriticRule>,
    /// Send an item whose evidence reads like a prompt injection to review
    /// instead of accepting or rejecting it (`crate::injection`).
    #[serde(default = "default_true")]
    pub flag_injection: bool,
}

impl Default for RoutingConfig {
    fn default() -> Self {
        Self {
            auto_accept_threshold: default_auto_accept(),
            review_threshold: default_review(),
            answer_stage: None,
            critic: None,
            flag_injection: true,
        }
    }
}

/// The routing rule for a critic's verdict (`[routing.critic]`). Without
/// it, a critic of the answer stage routes by these defaults.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CriticRule {
    /// The critic stage (default: the critic of the answer stage).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    /// The field of the critic's answer holding its verdict.
    #[serde(default = "default_verdict_field")]
    pub verdict_field: String,
    /// Verdicts that mean the critic agrees (compared case-insensitively).
    #[serde(default = "default_agree")]
    pub agree: Vec<String>,
    /// Where an item the critic disagrees with goes, when the generator's
    /// confidence would have auto-accepted it.
    #[serde(default)]
    pub on_disagree: OnDisagree,
    /// `generator`: route on the generator's confidence. `min`: on the lower
    /// of it and the critic's `confidence_field`.
    #[serde(default)]
    pub confidence: CriticConfidence,
    #[serde(default = "default_confidence_field")]
    pub confidence_field: String,
}

impl Default for CriticRule {
    fn default() -> Self {
        CriticRule {
            stage: None,
            verdict_field: default_verdict_field(),
            agree: default_agree(),
            on_disagree: OnDisagree::default(),
            confidence: CriticConfidence::default(),
            confidence_field: default_confidence_field(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnDisagree {
    /// An auto-accept becomes a human review; review and reject stay.
    #[default]
    Review,
    /// Any outcome but an error becomes a reject.
    Reject,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CriticConfidence {
    #[default]
    Generator,
    Min,
}

fn default_verdict_field() -> String {
    "verdict".into()
}
fn default_agree() -> Vec<String> {
    ["agree", "agrees", "correct", "yes", "pass", "accept"]
        .map(String::from)
        .to_vec()
}

fn default_job_name() -> String {
    "docket-job".into()
}
fn yes() -> bool {
    true
}
fn unspanned<T>(v: T) -> Spanned<T> {
    Spanned::new(0..0, v)
}
fn default_rpm() -> Spanned<u64> {
    unspanned(500)
}
fn default_tpm() -> Spanned<u64> {
    unspanned(200_000)
}
fn default_concurrency() -> Spanned<u64> {
    unspanned(16)
}
fn default_timeout() -> Spanned<f64> {
    unspanned(120.0)
}
fn default_transport_attempts() -> Spanned<u64> {
    unspanned(5)
}
fn default_rate_limit_retries() -> Spanned<u64> {
    unspanned(30)
}
fn default_retry_wait() -> Spanned<f64> {
    unspanned(60.0)
}
fn default_max_tokens() -> Spanned<u64> {
    unspanned(512)
}
fn default_expected_output() -> Spanned<u64> {
    unspanned(120)
}
fn default_max_attempts() -> Spanned<u64> {
    unspanned(3)
}
fn default_min_batch_size() -> Spanned<u64> {
    unspanned(100)
}
fn default_max_wait() -> Spanned<f64> {
    unspanned(60.0)
}
fn default_max_open_batches() -> Spanned<u64> {
    unspanned(4)
}
fn default_confidence_field() -> String {
    "confidence".into()
}
fn default_rationale_field() -> String {
    "rationale".into()
}
fn default_auto_accept() -> Spanned<f64> {
    unspanned(0.85)
}
fn default_review() -> Spanned<f64> {
    unspanned(0.60)
}

fn default_true() -> bool {
    true
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

    fn validate(&self) -> Result<(), ConfigError> {
        let c = &self.config;
        if c.providers.is_empty() {
            return Err(self.invalid_at_text(
                "[providers",
                "providers",
                "at least one provider is required",
            ));
        }
        for (name, p) in &c.providers {
            let key = |k: &str| format!("providers.{name}.{k}");
            if p.model.trim().is_empty() {
                return Err(self.invalid_at_text("model", &key("model"), "must not be empty"));
            }
            range_u64(self, &p.max_concurrency, &key("max_concurrency"), 1, 10_000)?;
            range_u64(
                self,
                &p.requests_per_minute,
                &key("requests_per_minute"),
                0,
                100_000_000,
            )?;
            range_u64(
                self,
                &p.tokens_per_minute,
                &key("tokens_per_minute"),
                0,
                10_000_000_000,
            )?;
            range_u64(
                self,
                &p.max_transport_attempts,
                &key("max_transport_attempts"),
                1,
                100,
            )?;
            range_u64(
                self,
                &p.max_rate_limit_retries,
                &key("max_rate_limit_retries"),
                1,
                1000,
            )?;
            let w = *p.retry_wait_secs.get_ref();
            if !(0.1..=86_400.0).contains(&w) {
                return Err(self.invalid(
                    &p.retry_wait_secs,
                    &key("retry_wait_secs"),
                    format!("{w} is out of range (0.1 to 86400 seconds)"),
                ));
            }
            let t = *p.request_timeout_secs.get_ref();
            if !(0.05..=3600.0).contains(&t) {
                return Err(self.invalid(
                    &p.request_timeout_secs,
                    &key("request_timeout_secs"),
                    format!("{t} is out of range (0.05 to 3600 seconds)"),
                ));
            }
            let table = format!("[providers.{name}");
            let kind = p.kind.as_str();
            match (&p.api_version, p.kind) {
                (None, ProviderKind::Azure) => {
                    return Err(self.invalid_at_text(
                        &table,
                        &key("api_version"),
                        "is required for kind = \"azure\" (Azure's api-version, e.g. \"2024-10-21\")",
                    ));
                }
                (Some(v), ProviderKind::Azure) if v.get_ref().trim().is_empty() => {
                    return Err(self.invalid(v, &key("api_version"), "must not be empty"));
                }
                (Some(v), k) if k != ProviderKind::Azure => {
                    return Err(self.invalid(
                        v,
                        &key("api_version"),
                        format!(
                            "is only for kind = \"azure\" (this provider is kind = \"{kind}\")"
                        ),
                    ));
                }
                _ => {}
            }
            // A setting that would have no effect is a mistake to name, not
            // to ignore: someone who moved from the mock to a real provider
            // (or back) believes it applies.
            if p.mock.is_some() && p.kind != ProviderKind::Mock {
                return Err(self.invalid_at_text(
                    &format!("[providers.{name}.mock]"),
                    &format!("providers.{name}.mock"),
                    format!(
                        "the built-in mock's settings are only for kind = \"mock\" (this provider is kind = \"{kind}\"): remove the section"
                    ),
                ));
            }
            if p.kind == ProviderKind::Mock && p.base_url.is_some() {
                return Err(self.invalid_at_text(
                    "base_url",
                    &key("base_url"),
                    "has no effect for kind = \"mock\" (the built-in mock listens on a free loopback port of its own): remove it, or use kind = \"openai_compatible\" for a server of your own",
                ));
            }
            if p.base_url.is_none()
                && matches!(p.kind, ProviderKind::OpenaiCompatible | ProviderKind::Azure)
            {
                let example = if p.kind == ProviderKind::Azure {
                    " (https://RESOURCE.openai.azure.com)"
                } else {
                    ""
                };
                return Err(self.invalid_at_text(
                    &table,
                    &key("base_url"),
                    format!("is required for kind = \"{kind}\"{example}"),
                ));
            }
            if p.kind != ProviderKind::Mock
                && let Some(url) = &p.base_url
                && !(url.starts_with("http://") || url.starts_with("https://"))
            {
                return Err(self.invalid_at_text(
                    "base_url",
                    &key("base_url"),
                    format!("\"{url}\" is not an http:// or https:// URL"),
                ));
            }
            // Secrets come from the environment only: a user or password in
            // the URL would go into the session's snapshot (row X1).
            if let Some(url) = &p.base_url
                && url::Url::parse(url)
                    .is_ok_and(|u| !u.username().is_empty() || u.password().is_some())
            {
                return Err(self.invalid_at_text(
                    "base_url",
                    &key("base_url"),
                    "holds a user or password (user:pass@host): docket keeps base_url in the session's \
                     record, so credentials never go there; put the key in the variable api_key_env names",
                ));
            }
            if p.kind.requires_key() && p.api_key_env.is_none() {
                return Err(self.invalid_at_text(
                    &table,
                    &key("api_key_env"),
                    format!(
                        "is required for kind = \"{kind}\": provider \"{name}\" needs the name of the environment variable holding its key"
                    ),
                ));
            }
            if let Some(env) = &p.api_key_env
                && !is_env_var_name(env)
            {
                return Err(self.invalid_at_text("api_key_env", &key("api_key_env"),
                    "is not an environment variable name such as OPENAI_API_KEY (it must name the variable that holds the key, never the key itself; the value is not repeated here)".to_string()));
            }
        }
        if c.stages.is_empty() {
            return Err(self.invalid_at_text(
                "stages",
                "stages",
                "at least one [[stages]] entry is required",
            ));
        }
        let mut names = std::collections::HashSet::new();
        for (i, s) in c.stages.iter().enumerate() {
            let key = |k: &str| format!("stages[{i}].{k}");
            if !names.insert(s.name.as_str()) {
                return Err(self.invalid_at_text(
                    &s.name,
                    &key("name"),
                    format!("duplicate stage name \"{}\"", s.name),
                ));
            }
            if s.name.is_empty()
                || !s
                    .name
                    .chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '-')
            {
                return Err(self.invalid_at_text(
                    "name",
                    &key("name"),
                    "use letters, digits, '_' or '-'",
                ));
            }
            if !c.providers.contains_key(&s.provider) {
                return Err(self.invalid_at_text(
                    &format!("\"{}\"", s.provider),
                    &key("provider"),
                    format!(
                        "no provider named \"{}\" (declared: {})",
                        s.provider,
                        c.providers.keys().cloned().collect::<Vec<_>>().join(", ")
                    ),
                ));
            }
            range_u64(self, &s.max_tokens, &key("max_tokens"), 1, 1_000_000)?;
            range_u64(self, &s.max_attempts, &key("max_attempts"), 1, 100)?;
            range_u64(
                self,
                &s.expected_output_tokens,
                &key("expected_output_tokens"),
                0,
                1_000_000,
            )?;
            self.validate_batch(&s.batch, i)?;
            if let Some(t) = &s.temperature
                && !(0.0..=2.0).contains(t.get_ref())
            {
                return Err(self.invalid(
                    t,
                    &key("temperature"),
                    format!("{} is out of range (0 to 2)", t.get_ref()),
                ));
            }
            if let Some(t) = &s.temperature
                && *t.get_ref() > 1.0
                && c.providers.get(&s.provider).map(|p| p.kind) == Some(ProviderKind::Anthropic)
            {
                return Err(self.invalid(
                    t,
                    &key("temperature"),
                    format!(
                        "{} is out of range for an anthropic provider (0 to 1)",
                        t.get_ref()
                    ),
                ));
            }
            self.validate_pipeline(s, i)?;
        }
        self.validate_routing_stages()?;
        let r = &c.routing;
        for (v, k) in [
            (&r.auto_accept_threshold, "routing.auto_accept_threshold"),
            (&r.review_threshold, "routing.review_threshold"),
        ] {
            if !(0.0..=1.0).contains(v.get_ref()) {
                return Err(self.invalid(
                    v,
                    k,
                    format!("{} is out of range (0.0 to 1.0)", v.get_ref()),
                ));
            }
        }
        if r.review_threshold.get_ref() > r.auto_accept_threshold.get_ref() {
            return Err(self.invalid(
                &r.review_threshold,
                "routing.review_threshold",
                format!(
                    "{} is above auto_accept_threshold {}",
                    r.review_threshold.get_ref(),
                    r.auto_accept_threshold.get_ref()
                ),
            ));
        }
        Ok(())
    }

    /// The config as JSON for the session snapshot. Holds the names of key
    /// variables, never their values (no key is ever read into the config).
    pub fn snapshot_json(&self) -> serde_json::Value {
        serde_json::to_value(&self.config).unwrap_or(serde_json::Value::Null)
    }
}

/// `OPENAI_API_KEY`-shaped: upper-case letters, digits and `_`, not starting
/// with a digit, at most 64 characters. Stricter than POSIX on purpose: a key
/// pasted here by mistake (they are mixed-case or contain `-`) is refused
/// instead of being stored in the session snapshot.
fn is_env_var_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

impl LoadedConfig {
    /// A stage's place in the pipeline: a critic judges an earlier stage
    /// that is not itself a critic; a repair prompt comes with its count;
    /// criteria are distinct names.
    fn validate_pipeline(&self, s: &StageConfig, i: usize) -> Result<(), ConfigError> {
        let stages = &self.config.stages;
        let key = |k: &str| format!("stages[{i}].{k}");
        if let Some(of) = &s.critic_of {
            match stages.iter().position(|x| &x.name == of) {
                Some(j) if j < i && !stages[j].is_critic() => {}
                Some(j) if j < i => {
                    return Err(self.invalid_at_text(
                        "critic_of",
                        &key("critic_of"),
                        format!("\"{of}\" is itself a critic; a critic judges a stage that is not"),
                    ));
                }
                Some(_) => {
                    return Err(self.invalid_at_text(
                        "critic_of",
                        &key("critic_of"),
                        format!("\"{of}\" does not come before stage \"{}\"; a critic judges an earlier stage", s.name),
                    ));
                }
                None => {
                    return Err(self.invalid_at_text(
                        "critic_of",
                        &key("critic_of"),
                        format!(
                            "no stage named \"{of}\" (stages: {})",
                            stages
                                .iter()
                                .map(|x| x.name.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    ));
                }
            }
        }
        if s.wait_for_previous && i == 0 {
            return Err(self.invalid_at_text(
                "wait_for_previous",
                &key("wait_for_previous"),
                "the first stage has no previous stage to wait for",
            ));
        }
        match (&s.repair_after, &s.repair_template) {
            (Some(n), Some(_)) => {
                range_u64(self, n, &key("repair_after"), 1, 100)?;
                if *n.get_ref() >= *s.max_attempts.get_ref() {
                    return Err(self.invalid(
                        n,
                        &key("repair_after"),
                        format!(
                            "{} leaves no attempt for the repair prompt (max_attempts is {})",
                            n.get_ref(),
                            s.max_attempts.get_ref()
                        ),
                    ));
                }
            }
            (Some(n), None) => {
                return Err(self.invalid(
                    n,
                    &key("repair_after"),
                    "needs repair_template (the prompt sent after that many gate failures)",
                ));
            }
            (None, Some(_)) => {
                return Err(self.invalid_at_text(
                    "repair_template",
                    &key("repair_template"),
                    "needs repair_after (after how many gate failures to send it)",
                ));
            }
            (None, None) => {}
        }
        let mut seen = std::collections::HashSet::new();
        for c in &s.criteria {
            let ok = !c.is_empty() && c.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '_');
            if !ok || !seen.insert(c.as_str()) {
                return Err(self.invalid_at_text(
                    "criteria",
                    &key("criteria"),
                    format!("\"{c}\": criteria are distinct names of letters, digits and '_'"),
                ));
            }
        }
        Ok(())
    }

    /// The answer stage and the critic rule name stages that exist and fit.
    fn validate_routing_stages(&self) -> Result<(), ConfigError> {
        let stages = &self.config.stages;
        let r = &self.config.routing;
        let find = |n: &str| stages.iter().find(|s| s.name == n);
        if let Some(a) = &r.answer_stage {
            match find(a) {
                Some(s) if !s.is_critic() => {}
                Some(_) => {
                    return Err(self.invalid_at_text(
                        "answer_stage",
                        "routing.answer_stage",
                        format!("\"{a}\" is a critic; the answer stage is the one a critic judges"),
                    ));
                }
                None => {
                    return Err(self.invalid_at_text(
                        "answer_stage",
                        "routing.answer_stage",
                        format!("no stage named \"{a}\""),
                    ));
                }
            }
        }
        if let Some(rule) = &r.critic {
            if let Some(c) = &rule.stage {
                match find(c) {
                    Some(s) if s.is_critic() => {}
                    Some(_) => {
                        return Err(self.invalid_at_text(
                            "[routing.critic]",
                            "routing.critic.stage",
                            format!("\"{c}\" is not a critic (it has no critic_of)"),
                        ));
                    }
                    None => {
                        return Err(self.invalid_at_text(
                            "[routing.critic]",
                            "routing.critic.stage",
                            format!("no stage named \"{c}\""),
                        ));
                    }
                }
            } else if self.critic_stage().is_none() {
                return Err(self.invalid_at_text(
                    "[routing.critic]",
                    "routing.critic",
                    format!(
                        "no stage is a critic of the answer stage \"{}\" (give it one with critic_of, or name the critic in routing.critic.stage)",
                        self.answer_stage().name
                    ),
                ));
            }
            if rule.agree.is_empty() {
                return Err(self.invalid_at_text(
                    "agree",
                    "routing.critic.agree",
                    "list at least one verdict that means the critic agrees",
                ));
            }
        }
        Ok(())
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

    fn validate_batch(&self, b: &BatchConfig, i: usize) -> Result<(), ConfigError> {
        let key = |k: &str| format!("stages[{i}].batch.{k}");
        range_u64(
            self,
            &b.min_batch_size,
            &key("min_batch_size"),
            1,
            10_000_000,
        )?;
        range_u64(
            self,
            &b.max_open_batches,
            &key("max_open_batches"),
            1,
            1_000,
        )?;
        if let Some(n) = &b.max_requests {
            range_u64(self, n, &key("max_requests"), 1, 10_000_000)?;
        }
        if let Some(n) = &b.max_bytes {
            range_u64(self, n, &key("max_bytes"), 1024, 1 << 40)?;
        }
        let w = *b.max_wait_secs.get_ref();
        if !(0.0..=86_400.0).contains(&w) {
            return Err(self.invalid(
                &b.max_wait_secs,
                &key("max_wait_secs"),
                format!("{w} is out of range (0 to 86400 seconds)"),
            ));
        }
        if let Some(p) = &b.poll_interval_secs {
            let x = *p.get_ref();
            if !(0.01..=3600.0).contains(&x) {
                return Err(self.invalid(
                    p,
                    &key("poll_interval_secs"),
                    format!("{x} is out of range (0.01 to 3600 seconds)"),
                ));
            }
        }
        if let Some(n) = &b.max_enqueued_tokens {
            range_u64(self, n, &key("max_enqueued_tokens"), 1, 1 << 50)?;
        }
        if let Some(p) = &b.stall_after_secs {
            let x = *p.get_ref();
            if !(1.0..=30.0 * 86_400.0).contains(&x) {
                return Err(self.invalid(
                    p,
                    &key("stall_after_secs"),
                    format!("{x} is out of range (1 to 2592000 seconds)"),
                ));
            }
        }
        Ok(())
    }
}

fn range_u64(
    cfg: &LoadedConfig,
    v: &Spanned<u64>,
    key: &str,
    min: u64,
    max: u64,
) -> Result<(), ConfigError> {
    let x = *v.get_ref();
    if x < min || x > max {
        return Err(cfg.invalid(v, key, format!("{x} is out of range ({min} to {max})")));
    }
    Ok(())
}

fn line_at(source: &str, offset: usize) -> usize {
    source[..offset.min(source.len())]
        .bytes()
        .filter(|b| *b == b'\n')
        .count()
        + 1
}

/// toml's message says what was expected; add the file and line in the
/// usual `file:line:` form, and the key's whole path (toml names only the
/// last part of it, if that).
fn describe_toml_error(path: &Path, source: &str, e: &toml::de::Error) -> ConfigError {
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
fn key_path_at(source: &str, offset: usize) -> Option<String> {
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
fn key_parts(key: &str) -> Vec<String> {
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

/// One setting of docket.toml that differs from a session's snapshot of it.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigChange {
    /// Its path: `routing.auto_accept_threshold`, `stages[0].max_tokens`.
    pub key: String,
    /// The value then and now (JSON; None: not set).
    pub before: Option<String>,
    pub after: Option<String>,
}

impl std::fmt::Display for ConfigChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = |x: &Option<String>| x.clone().unwrap_or_else(|| "(not set)".into());
        write!(f, "{} {} -> {}", self.key, v(&self.before), v(&self.after))
    }
}

impl LoadedConfig {
    /// What differs between this config and `snapshot`, the config a
    /// session recorded when it started (its snapshot's `config`), key by
    /// key. Comments, layout and the order of keys are not changes; nor is
    /// a setting left out then and given its default now (the snapshot is
    /// read back with today's defaults first).
    pub fn changes_since(&self, snapshot: &serde_json::Value) -> Vec<ConfigChange> {
        let before = with_defaults(snapshot).unwrap_or_else(|| snapshot.clone());
        let mut out = Vec::new();
        diff_json("", &before, &self.snapshot_json(), &mut out);
        out
    }
}

/// A config snapshot read back as a `Config` (taking today's defaults for
/// what it leaves out) and written again; None when it no longer reads.
fn with_defaults(snapshot: &serde_json::Value) -> Option<serde_json::Value> {
    fn drop_nulls(v: &serde_json::Value) -> serde_json::Value {
        match v {
            serde_json::Value::Object(m) => serde_json::Value::Object(
                m.iter()
                    .filter(|(_, v)| !v.is_null())
                    .map(|(k, v)| (k.clone(), drop_nulls(v)))
                    .collect(),
            ),
            serde_json::Value::Array(a) => {
                serde_json::Value::Array(a.iter().map(drop_nulls).collect())
            }
            v => v.clone(),
        }
    }
    let text = toml::to_string(&drop_nulls(snapshot)).ok()?;
    let config: Config = toml::from_str(&text).ok()?;
    serde_json::to_value(&config).ok()
}

fn diff_json(
    path: &str,
    before: &serde_json::Value,
    after: &serde_json::Value,
    out: &mut Vec<ConfigChange>,
) {
    use serde_json::Value;
    let show = |v: &Value| -> Option<String> {
        (!v.is_null()).then(|| crate::sanitize::truncate(&v.to_string(), 80))
    };
    match (before, after) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                let null = Value::Null;
                diff_json(
                    &p,
                    a.get(k).unwrap_or(&null),
                    b.get(k).unwrap_or(&null),
                    out,
                );
            }
        }
        (Value::Array(a), Value::Array(b))
            if a.len() == b.len() && a.iter().chain(b).all(Value::is_object) =>
        {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                diff_json(&format!("{path}[{i}]"), x, y, out);
            }
        }
        (a, b) if a != b => out.push(ConfigChange {
            key: path.to_string(),
            before: show(a),
            after: show(b),
        }),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
[providers.p]
kind = "openai"
model = "gpt-4o-mini"

[[stages]]
name = "s"
provider = "p"
template = "t.j2"

[stages.gate]
kind = "regex"
pattern = "(?P<confidence>[0-9.]+)"
"#;

    fn parse(text: &str) -> Result<LoadedConfig, ConfigError> {
        LoadedConfig::parse(Path::new("ws/docket.toml"), text.to_string())
    }

    #[test]
    fn a_minimal_config_takes_defaults() {
        let c = parse(BASE).unwrap();
        assert_eq!(*c.config.routing.auto_accept_threshold.get_ref(), 0.85);
        assert_eq!(*c.config.providers["p"].requests_per_minute.get_ref(), 500);
        assert_eq!(c.resolve(Path::new("t.j2")), Path::new("ws/t.j2"));
    }

    #[test]
    fn unknown_keys_name_the_line_and_key() {
        let text = BASE.replace(
            "model = \"gpt-4o-mini\"",
            "model = \"gpt-4o-mini\"\nrate = 3",
        );
        let e = parse(&text).err().unwrap().to_string();
        assert!(e.starts_with("ws/docket.toml:5:"), "{e}");
        assert!(e.contains("rate"), "{e}");
        let e = parse(&format!("{BASE}\n[routing]\nauto_accept = 0.9\n"))
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("auto_accept") && e.contains("docket.toml:16:"),
            "{e}"
        );
    }

    #[test]
    fn wrong_types_and_ranges_name_the_key() {
        let e = parse(&BASE.replace(
            "model = \"gpt-4o-mini\"",
            "model = \"m\"\nmax_concurrency = -1",
        ))
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("docket.toml:5"), "{e}");
        let e = parse(&format!(
            "{BASE}\n[routing]\nreview_threshold = 0.9\nauto_accept_threshold = 0.8\n"
        ))
        .err()
        .unwrap()
        .to_string();
        assert!(
            e.contains("routing.review_threshold") && e.contains("above"),
            "{e}"
        );
        let e = parse(&BASE.replace(
            "template = \"t.j2\"",
            "template = \"t.j2\"\ntemperature = 3.0",
        ))
        .err()
        .unwrap()
        .to_string();
        assert!(
            e.contains("stages[0].temperature") && e.contains(":10:"),
            "{e}"
        );
    }

    #[test]
    fn references_and_key_names_are_checked() {
        let e = parse(&BASE.replace("provider = \"p\"", "provider = \"q\""))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("no provider named \"q\""), "{e}");
        for bad in ["sk-live-abc", "gsk_abcDEF123", "1KEY", ""] {
            let text = BASE.replace(
                "model = \"gpt-4o-mini\"",
                &format!("model = \"m\"\napi_key_env = \"{bad}\""),
            );
            let e = parse(&text).err().unwrap().to_string();
            assert!(
                e.contains("api_key_env") && e.contains("not an environment variable name"),
                "{e}"
            );
            assert!(
                bad.len() < 5 || !e.contains(bad),
                "the would-be key is not echoed: {e}"
            );
        }
        let ok = BASE.replace(
            "model = \"gpt-4o-mini\"",
            "model = \"m\"\napi_key_env = \"OPENAI_API_KEY\"",
        );
        assert!(parse(&ok).is_ok());
        let e = parse(&BASE.replace("kind = \"openai\"", "kind = \"nope\""))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("nope"), "{e}");
        let two = format!(
            "{BASE}\n[[stages]]\nname = \"critic\"\nprovider = \"p\"\ntemplate = \"c.j2\"\n[stages.gate]\nkind = \"regex\"\npattern = \"(?P<confidence>.)\"\n"
        );
        assert!(parse(&two).is_ok(), "two stages are a pipeline");
        // A critic must judge an earlier stage that exists.
        let bad = two.replace(
            "name = \"critic\"\n",
            "name = \"critic\"\ncritic_of = \"nowhere\"\n",
        );
        let e = parse(&bad).err().unwrap().to_string();
        assert!(e.contains("critic_of") && e.contains("nowhere"), "{e}");
        let later = two.replace(
            "name = \"critic\"\n",
            "name = \"critic\"\ncritic_of = \"critic\"\n",
        );
        let e = parse(&later).err().unwrap().to_string();
        assert!(e.contains("does not come before"), "{e}");
        // A repair prompt needs its count, and leaves an attempt for itself.
        let repair = two.replace(
            "name = \"critic\"\n",
            "name = \"critic\"\nrepair_template = \"r.j2\"\n",
        );
        let e = parse(&repair).err().unwrap().to_string();
        assert!(e.contains("repair_after"), "{e}");
        let repair = two.replace(
            "name = \"critic\"\n",
            "name = \"critic\"\nrepair_template = \"r.j2\"\nrepair_after = 3\n",
        );
        let e = parse(&repair).err().unwrap().to_string();
        assert!(e.contains("leaves no attempt"), "{e}");
        let first_waits = BASE.replace("[stages.gate]", "wait_for_previous = true\n[stages.gate]");
        if first_waits != BASE {
            let e = parse(&first_waits).err().unwrap().to_string();
            assert!(e.contains("no previous stage"), "{e}");
        }
    }

    /// Settings that would do nothing are named, with their line: the
    /// mock's section under a real provider (left behind after switching
    /// `kind`), and a base_url for the built-in mock.
    #[test]
    fn settings_with_no_effect_are_named() {
        let text = BASE.to_string() + "\n[providers.p.mock]\nlatency_median_ms = 5.0\n";
        let e = parse(&text).unwrap_err().to_string();
        let line = text
            .lines()
            .position(|l| l == "[providers.p.mock]")
            .unwrap()
            + 1;
        assert!(
            e.contains("providers.p.mock")
                && e.contains("kind = \"openai\"")
                && e.contains(&format!(":{line}")),
            "{e}"
        );
        let text = BASE.replace(
            "kind = \"openai\"",
            "kind = \"mock\"\nbase_url = \"http://x\"",
        );
        let e = parse(&text).unwrap_err().to_string();
        assert!(
            e.contains("providers.p.base_url") && e.contains("no effect"),
            "{e}"
        );
    }

    #[test]
    fn mock_settings_are_strict_too() {
        let text = BASE.replace("kind = \"openai\"", "kind = \"mock\"")
            + "\n[providers.p.mock]\nlatency_median_ms = 5.0\nlatencyy = 1\n";
        let e = parse(&text).err().unwrap().to_string();
        assert!(e.contains("latencyy"), "{e}");
    }

    fn provider(kind: &str, lines: &str) -> String {
        BASE.replace(
            "kind = \"openai\"\nmodel = \"gpt-4o-mini\"",
            &format!("kind = \"{kind}\"\nmodel = \"m\"{lines}"),
        )
    }

    #[test]
    fn credentials_in_base_url_are_refused() {
        let e = parse(&BASE.replace(
            "kind = \"openai\"",
            "kind = \"openai\"\nbase_url = \"https://me:secret@proxy.example/v1\"",
        ))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("providers.p.base_url")
                && e.contains("user or password")
                && !e.contains("secret"),
            "{e}"
        );
    }

    #[test]
    fn azure_needs_api_version_and_base_url() {
        // The provider table starts on line 2.
        let e = parse(&provider(
            "azure",
            "\nbase_url = \"https://r.openai.azure.com\"\napi_key_env = \"AZURE_OPENAI_API_KEY\"",
        ))
        .err()
        .unwrap()
        .to_string();
        assert!(
            e.contains("ws/docket.toml:2:")
                && e.contains("providers.p.api_version")
                && e.contains("required"),
            "{e}"
        );
        let e = parse(&provider(
            "azure",
            "\napi_version = \"2024-10-21\"\napi_key_env = \"AZURE_OPENAI_API_KEY\"",
        ))
        .err()
        .unwrap()
        .to_string();
        assert!(
            e.contains("ws/docket.toml:2:")
                && e.contains("providers.p.base_url")
                && e.contains("RESOURCE.openai.azure.com"),
            "{e}"
        );
        let ok = parse(&provider(
            "azure",
            "\nbase_url = \"https://r.openai.azure.com\"\napi_version = \"2024-10-21\"\napi_key_env = \"AZURE_OPENAI_API_KEY\"",
        ))
        .unwrap();
        let p = &ok.config.providers["p"];
        assert_eq!(p.kind, ProviderKind::Azure);
        assert_eq!(p.api_version.as_ref().unwrap().get_ref(), "2024-10-21");
        let e = parse(&provider(
            "azure",
            "\nbase_url = \"https://r.openai.azure.com\"\napi_version = \"2024-10-21\"",
        ))
        .err()
        .unwrap()
        .to_string();
        assert!(
            e.contains("providers.p.api_key_env") && e.contains("\"p\""),
            "{e}"
        );
    }

    #[test]
    fn api_version_is_only_for_azure() {
        let e = parse(&provider(
            "openai",
            "\napi_key_env = \"OPENAI_API_KEY\"\napi_version = \"2024-10-21\"",
        ))
        .err()
        .unwrap()
        .to_string();
        assert!(
            e.contains("ws/docket.toml:6:")
                && e.contains("providers.p.api_version")
                && e.contains("only for kind = \"azure\""),
            "{e}"
        );
    }

    #[test]
    fn keyed_kinds_need_api_key_env_and_ollama_does_not() {
        for kind in ["anthropic", "gemini", "openrouter"] {
            let e = parse(&provider(kind, "")).err().unwrap().to_string();
            assert!(
                e.contains("ws/docket.toml:2:")
                    && e.contains("providers.p.api_key_env")
                    && e.contains(&format!("kind = \"{kind}\""))
                    && e.contains("provider \"p\""),
                "{e}"
            );
            let var = format!("{}_API_KEY", kind.to_uppercase());
            assert!(parse(&provider(kind, &format!("\napi_key_env = \"{var}\""))).is_ok());
        }
        let c = parse(&provider("ollama", "")).unwrap();
        assert_eq!(c.config.providers["p"].kind, ProviderKind::Ollama);
        assert!(parse(&provider("mock", "")).is_ok());
        assert!(parse(&provider("openai", "")).is_ok());
        let e = parse(&provider("ollama", "\nbase_url = \"localhost:11434\""))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("not an http:// or https:// URL"), "{e}");
    }

    #[test]
    fn default_base_urls_per_kind() {
        use ProviderKind::*;
        assert_eq!(Openai.default_base_url(), Some("https://api.openai.com/v1"));
        assert_eq!(
            Anthropic.default_base_url(),
            Some("https://api.anthropic.com")
        );
        assert_eq!(
            Gemini.default_base_url(),
            Some("https://generativelanguage.googleapis.com")
        );
        assert_eq!(Ollama.default_base_url(), Some("http://localhost:11434"));
        assert_eq!(
            Openrouter.default_base_url(),
            Some("https://openrouter.ai/api/v1")
        );
        assert_eq!(Azure.default_base_url(), None);
        assert_eq!(OpenaiCompatible.default_base_url(), None);
    }

    #[test]
    fn anthropic_temperature_is_at_most_one() {
        let text = provider("anthropic", "\napi_key_env = \"ANTHROPIC_API_KEY\"").replace(
            "template = \"t.j2\"",
            "template = \"t.j2\"\ntemperature = 1.5",
        );
        let e = parse(&text).err().unwrap().to_string();
        assert!(
            e.contains("stages[0].temperature") && e.contains("0 to 1"),
            "{e}"
        );
    }

    /// Row I4: an error toml reports (a wrong type, a negative count, an
    /// unknown key or table) names the key's whole path, not only its line.
    #[test]
    fn parse_errors_name_the_whole_key_path() {
        let two_stages = format!(
            "{BASE}\n[[stages]]\nname = \"t\"\nprovider = \"p\"\ntemplate = \"t.j2\"\n\n[stages.gate]\nkind = \"regex\"\npattern = \"x\"\nflavour = 1\n"
        );
        for (text, path) in [
            (
                BASE.replace(
                    "model = \"gpt-4o-mini\"",
                    "model = \"m\"\nrequests_per_minute = -5",
                ),
                "providers.p.requests_per_minute: ",
            ),
            (
                BASE.replace(
                    "template = \"t.j2\"",
                    "template = \"t.j2\"\nmax_tokens = -1",
                ),
                "stages[0].max_tokens: ",
            ),
            (
                BASE.replace(
                    "model = \"gpt-4o-mini\"",
                    "model = \"m\"\nbackoff_max_secs = 1",
                ),
                "providers.p.backoff_max_secs: ",
            ),
            (two_stages, "stages[1].gate.flavour: "),
            (
                format!("{BASE}\n[retry]\nbackoff_base_secs = 2\n"),
                "retry: ",
            ),
            (
                BASE.replace("[providers.p]", "[providers.\"p.q\"]\nkind = 1"),
                "providers.p.q.kind: ",
            ),
        ] {
            let e = parse(&text).err().unwrap().to_string();
            assert!(e.contains(path), "{path:?} missing from {e}");
            assert!(e.starts_with("ws/docket.toml:"), "{e}");
        }
        assert_eq!(key_parts("a.\"b.c\" . d"), vec!["a", "b.c", "d"]);
    }

    /// Row I4: what a resume compares, key by key: a changed value, a key
    /// added or taken out; not comments, layout or a default spelled out.
    #[test]
    fn changes_since_a_snapshot_are_named_key_by_key() {
        let then = parse(BASE).unwrap().snapshot_json();
        let same = parse(&format!("# a comment\n{}", BASE.replace("\n\n", "\n\n\n")))
            .unwrap()
            .changes_since(&then);
        assert_eq!(same, vec![]);
        // The default written out is no change.
        let spelled = parse(&BASE.replace(
            "model = \"gpt-4o-mini\"",
            "model = \"gpt-4o-mini\"\nmax_concurrency = 16",
        ))
        .unwrap();
        assert_eq!(spelled.changes_since(&then), vec![]);
        let edited = parse(&format!(
            "{}\n[routing]\nauto_accept_threshold = 0.9\n",
            BASE.replace("model = \"gpt-4o-mini\"", "model = \"gpt-4o\"")
                .replace(
                    "template = \"t.j2\"",
                    "template = \"t.j2\"\ntemperature = 0.5"
                )
        ))
        .unwrap();
        let changes: Vec<String> = edited
            .changes_since(&then)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            changes,
            vec![
                "providers.p.model \"gpt-4o-mini\" -> \"gpt-4o\"",
                "routing.auto_accept_threshold 0.85 -> 0.9",
                "stages[0].temperature (not set) -> 0.5",
            ]
        );
        // A snapshot that leaves out a key with a default (one written
        // before the key existed) reads it as the default.
        let mut old = then.clone();
        old["routing"]
            .as_object_mut()
            .unwrap()
            .remove("flag_injection");
        old["providers"]["p"]
            .as_object_mut()
            .unwrap()
            .remove("max_transport_attempts");
        assert_eq!(parse(BASE).unwrap().changes_since(&old), vec![]);
    }
}
