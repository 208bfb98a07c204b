//! Providers behind one trait. Orchestration never names a provider: it
//! builds a `ChatRequest`, sends it through `dyn ChatProvider`, and reads a
//! `ChatAnswer` or a classified `ProviderError`.

mod openai;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde_json::Value;

use crate::config::{ProviderConfig, ProviderKind};
use crate::limiter::RateHeaders;

pub use openai::OpenAiChat;

/// One synchronous chat call.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    pub model: String,
    pub system: Option<String>,
    pub user: String,
    pub max_tokens: u64,
    pub temperature: Option<f64>,
    /// Structured output: (schema name, JSON schema).
    pub response_schema: Option<(String, Value)>,
    /// Sent as `X-Client-Request-Id`; unique per attempt.
    pub client_request_id: String,
    pub timeout: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    /// Cut off at max_tokens: truncation, not a parse error.
    Length,
    ContentFilter,
    Other(String),
}

impl FinishReason {
    pub fn as_str(&self) -> &str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ContentFilter => "content_filter",
            FinishReason::Other(s) => s,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cached_input_tokens: u64,
    pub reasoning_tokens: u64,
}

#[derive(Debug, Clone)]
pub struct ChatAnswer {
    pub content: Option<String>,
    pub refusal: Option<String>,
    pub finish_reason: FinishReason,
    pub usage: Option<Usage>,
    pub provider_request_id: Option<String>,
    pub model: Option<String>,
    pub headers: RateHeaders,
    pub http_status: u16,
}

/// How an error bears on the request, the item and the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// 429 rate limit: retry after the server's delay; cut concurrency.
    RateLimited,
    /// 503 / 529: retry with backoff; cut concurrency.
    Overloaded,
    /// 5xx, garbage bodies, network failures: retry with backoff.
    Transient,
    /// Sent, but no answer came (timeout, connection lost mid-request): it may
    /// have been billed. Retry, and count it as ambiguous.
    Ambiguous,
    /// This request can never succeed (400, request too large): the item errors.
    Request,
    /// Credentials rejected: stop the session.
    Auth,
    /// Quota or billing exhausted: stop the session.
    Quota,
}

impl ErrorClass {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::RateLimited => "rate_limited",
            ErrorClass::Overloaded => "overloaded",
            ErrorClass::Transient => "transient",
            ErrorClass::Ambiguous => "ambiguous",
            ErrorClass::Request => "request",
            ErrorClass::Auth => "auth",
            ErrorClass::Quota => "quota",
        }
    }

    pub fn stops_session(self) -> bool {
        matches!(self, ErrorClass::Auth | ErrorClass::Quota)
    }

    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            ErrorClass::RateLimited
                | ErrorClass::Overloaded
                | ErrorClass::Transient
                | ErrorClass::Ambiguous
        )
    }
}

#[derive(Debug, Clone)]
pub struct ProviderError {
    pub class: ErrorClass,
    pub http_status: Option<u16>,
    pub message: String,
    pub headers: RateHeaders,
}

impl fmt::Display for ProviderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.http_status {
            Some(s) => write!(f, "HTTP {s} ({}): {}", self.class.as_str(), self.message),
            None => write!(f, "{}: {}", self.class.as_str(), self.message),
        }
    }
}

impl std::error::Error for ProviderError {}

pub type ChatFuture<'a> =
    Pin<Box<dyn Future<Output = Result<ChatAnswer, ProviderError>> + Send + 'a>>;

/// A synchronous chat endpoint.
pub trait ChatProvider: Send + Sync {
    /// Short provider name for the ledger ("openai", "mock", ...).
    fn name(&self) -> &str;
    fn send<'a>(&'a self, request: &'a ChatRequest) -> ChatFuture<'a>;
}

/// An API key held in memory only; never printed, logged or serialized.
#[derive(Clone)]
pub struct ApiKey(String);

impl ApiKey {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(***)")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProviderSetupError {
    #[error(
        "providers.{provider}.api_key_env names {var}, which is not set in the environment (export {var}=... and run again)"
    )]
    MissingKey { provider: String, var: String },
    #[error("providers.{provider}: {message}")]
    Other { provider: String, message: String },
}

/// Check that the key the config names is in the environment (without
/// keeping it): run before anything is planned or created.
pub fn check_key(name: &str, cfg: &ProviderConfig) -> Result<(), ProviderSetupError> {
    read_key(name, cfg).map(|_| ())
}

fn read_key(name: &str, cfg: &ProviderConfig) -> Result<Option<ApiKey>, ProviderSetupError> {
    match &cfg.api_key_env {
        Some(var) => match std::env::var(var) {
            Ok(v) if !v.is_empty() => Ok(Some(ApiKey(v))),
            _ => Err(ProviderSetupError::MissingKey {
                provider: name.into(),
                var: var.clone(),
            }),
        },
        None => Ok(None),
    }
}

/// Build the provider a config names. `base_url_override` is used for the
/// in-process mock, whose port is only known at run time.
pub fn build(
    name: &str,
    cfg: &ProviderConfig,
    base_url_override: Option<&str>,
) -> Result<Box<dyn ChatProvider>, ProviderSetupError> {
    let key = read_key(name, cfg)?;
    let base = base_url_override
        .map(str::to_string)
        .or_else(|| cfg.base_url.clone())
        .unwrap_or_else(|| "https://api.openai.com/v1".to_string());
    let label = match cfg.kind {
        ProviderKind::Openai => "openai",
        ProviderKind::OpenaiCompatible => "openai_compatible",
        ProviderKind::Mock => "mock",
    };
    let chat = OpenAiChat::new(label, &base, key).map_err(|message| ProviderSetupError::Other {
        provider: name.into(),
        message,
    })?;
    Ok(Box::new(chat))
}
