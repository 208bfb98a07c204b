//! What docket.toml can say: the serde types of the job file, strict about
//! unknown keys. Numbers that validation checks keep their `Spanned` place in
//! the file so an error can name its line.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use toml::Spanned;

use super::defaults::*;
use crate::mock_config::MockConfig;
pub use crate::review_card::ReviewConfig;

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
    /// How an item looks in review (`[review]`): its queue line and card.
    #[serde(default, skip_serializing_if = "ReviewConfig::is_empty")]
    pub review: ReviewConfig,
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
    /// When a session is finished: `exact` (default), `best_effort` or
    /// `throughput` (see `CompletionMode`).
    #[serde(default)]
    pub completion_mode: super::CompletionMode,
}

impl Default for JobConfig {
    fn default() -> Self {
        Self {
            name: default_job_name(),
            enabled: true,
            description: None,
            completion_mode: super::CompletionMode::default(),
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
    /// Gemini only: the thinking budget in tokens (`thinkingConfig.
    /// thinkingBudget`; -1 dynamic, 0 off where the model allows it). Unset:
    /// the provider's safe default (see the README's config reference).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking_budget: Option<Spanned<i64>>,
    /// Anthropic only: how the gate's schema is sent (`auto`: the API's own
    /// `output_config.format` on the models that support it, else in the
    /// system prompt).
    #[serde(default, skip_serializing_if = "StructuredOutput::is_auto")]
    pub structured_output: StructuredOutput,
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
    /// The rendered template is the request's whole JSON body (a
    /// chat-completions body, `docket run --requests`), sent as written:
    /// the stage's system prompt, max_tokens, temperature and gate schema
    /// are not added to it, and its answer needs no confidence (an answer
    /// that passes the gate is accepted).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub send_body: bool,
    /// With `send_body`: the provider's model replaces the body's (else
    /// the body's own model is sent, the provider's only when it has none).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub override_model: bool,
}

impl StageConfig {
    pub fn is_critic(&self) -> bool {
        self.critic_of.is_some()
    }
}

/// How a stage's schema reaches a provider that has a structured-output
/// parameter on some models only (Anthropic): `auto` decides by the model
/// id, `native` always sends the parameter, `prompt` never does (the schema
/// goes into the system prompt). Every answer is checked against the full
/// schema by the gate whichever way it was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StructuredOutput {
    #[default]
    Auto,
    Native,
    Prompt,
}

impl StructuredOutput {
    pub fn is_auto(&self) -> bool {
        *self == StructuredOutput::Auto
    }

    pub fn as_str(self) -> &'static str {
        match self {
            StructuredOutput::Auto => "auto",
            StructuredOutput::Native => "native",
            StructuredOutput::Prompt => "prompt",
        }
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
    /// The share (0..1) of the items routing auto-accepts that also go to
    /// review, marked "audit", so the accept band's precision is measured
    /// (`docket calibrate`). Which items: a stable hash of session and item.
    #[serde(default = "default_no_share")]
    pub audit_accept_share: Spanned<f64>,
    /// The same for the items routing rejects.
    #[serde(default = "default_no_share")]
    pub audit_reject_share: Spanned<f64>,
    /// The precision (the share of auto-accepts a human agrees with, at
    /// the lower 95% bound) the accept threshold should reach: what
    /// `docket calibrate`, the console's calibration page and the report
    /// suggest a threshold for. Recorded with each session.
    #[serde(default = "default_target_precision")]
    pub target_precision: Spanned<f64>,
}

impl Default for RoutingConfig {
    fn default() -> Self {
        Self {
            auto_accept_threshold: default_auto_accept(),
            review_threshold: default_review(),
            answer_stage: None,
            critic: None,
            flag_injection: true,
            audit_accept_share: default_no_share(),
            audit_reject_share: default_no_share(),
            target_precision: default_target_precision(),
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
