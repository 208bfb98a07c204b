//! Providers behind one trait. Orchestration never names a provider: it
//! builds a `ChatRequest`, sends it through `dyn ChatProvider`, and reads a
//! `ChatAnswer` or a classified `ProviderError`.
//!
//! This crate owns the providers' wire formats (one file per provider for
//! chat, and under `batch/` a folder per provider for its Batch API), the
//! shared rate limiter (`limiter`) and the retry rules and hints
//! (`retry`). It may not touch the ledger, the engine or the terminal: it
//! depends only on `docket-model`.
//!
//! Beside the providers' files, `keys` holds the API keys and their
//! scrubbing, `preflight` the check before a session, and `registry` the
//! adapter a config names; this file holds the trait, its request and
//! answer types, and the HTTP plumbing every adapter shares.

pub(crate) mod anthropic;
pub(crate) mod anthropic_schema;
mod azure;
pub mod batch;
#[doc(hidden)]
pub mod fuzzing;
pub(crate) mod gemini;
mod keys;
pub mod limiter;
pub mod models;
pub(crate) mod ollama;
pub(crate) mod openai;
pub(crate) mod openrouter;
mod preflight;
mod registry;
pub mod retry;
pub mod translate;
mod transport;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde_json::Value;

use crate::limiter::RateHeaders;

pub use anthropic::{ANTHROPIC_VERSION, AnthropicChat};
pub use azure::AzureChat;
pub use docket_model::config::StructuredOutput;
pub use gemini::{GeminiChat, thinking_allowance};
pub use keys::{ApiKey, check_key, key_fingerprint};
pub(crate) use keys::{read_key, scrub, secret_header};
pub use ollama::OllamaChat;
pub use openai::OpenAiChat;
pub use openai::redact;
pub use openrouter::OpenRouterChat;
pub(crate) use preflight::{chat_base, listed_ids, probe};
pub use registry::{ProviderSetupError, build};

/// One synchronous chat call.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    pub model: String,
    /// Shared: usually the same for every request of a stage.
    pub system: Option<std::sync::Arc<str>>,
    pub user: String,
    pub max_tokens: u64,
    pub temperature: Option<f64>,
    /// Structured output: (schema name, JSON schema).
    /// Shared, not copied: a batch of 100,000 requests holds one schema.
    pub response_schema: Option<std::sync::Arc<(String, Value)>>,
    /// How Anthropic is given the schema (the stage's `structured_output`);
    /// the other providers always send their own schema parameter.
    pub structured_output: StructuredOutput,
    /// Gemini's thinking budget (the stage's `thinking_budget`); None: the
    /// adapter's default for the model (see `gemini::thinking_budget`).
    pub thinking_budget: Option<i64>,
    /// Unique per attempt; sent where the provider has a header for it
    /// (OpenAI's `X-Client-Request-Id`), else not sent.
    pub client_request_id: String,
    pub timeout: Duration,
    /// A request body sent as written (`docket run --requests`): the
    /// adapter sends it instead of building one from the fields above,
    /// which then only inform the limiter and the ledger. A chat-completions
    /// body; OpenAI-compatible adapters send it unchanged.
    pub body: Option<std::sync::Arc<Value>>,
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
    /// The provider's whole answer body (compact JSON), kept only for a
    /// request sent as written (`ChatRequest::body`): it is what
    /// `docket run --requests` writes out.
    pub body: Option<String>,
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

/// The models a preflight's answer listed, when it was a models list read
/// whole; None when it was not (a 404 from a compatible server without a
/// list, a 429, OpenRouter's key, a list cut into pages, a body not in the
/// provider's shape): then nothing can be said about the model.
pub type Listed = Option<Vec<String>>;

pub type PreflightFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Listed, ProviderError>> + Send + 'a>>;

/// A synchronous chat endpoint.
pub trait ChatProvider: Send + Sync {
    /// Short provider name for the ledger ("openai", "mock", ...).
    fn name(&self) -> &str;
    fn send<'a>(&'a self, request: &'a ChatRequest) -> ChatFuture<'a>;
    /// One cheap request (the provider's models list or its nearest
    /// equivalent) before a session is created: `Err` when the provider
    /// cannot be reached or refuses the key (see `probe`); else the
    /// models it listed, if its answer was a whole list.
    fn preflight(&self) -> PreflightFuture<'_>;
}

/// Why an adapter could not be made. Its message is the one a
/// `String` error carried before, word for word: users and tests see it.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The HTTP client could not be built (its TLS backend or a system
    /// setting it reads failed).
    #[error("HTTP client: {0}")]
    HttpClient(reqwest::Error),
}

/// The HTTP client every adapter uses.
pub(crate) fn http_client() -> Result<reqwest::Client, ClientError> {
    reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(10))
        .user_agent(concat!("docket/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(ClientError::HttpClient)
}

/// Percent-encode one URL path segment (a model or deployment name).
pub(crate) fn path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The body to send: the request's own when it has one (sent as written),
/// else the one the adapter builds from its fields.
pub(crate) fn body_or(req: &ChatRequest, build: impl FnOnce(&ChatRequest) -> Value) -> Value {
    match &req.body {
        Some(body) => Value::clone(body),
        None => build(req),
    }
}

/// `answer` with the whole answer body kept (compact) when the request was
/// sent as written; unchanged otherwise.
pub(crate) fn keep_body(mut answer: ChatAnswer, req: &ChatRequest, bytes: &[u8]) -> ChatAnswer {
    if req.body.is_some() {
        answer.body = Some(match serde_json::from_slice::<Value>(bytes) {
            Ok(v) => v.to_string(),
            Err(_) => String::from_utf8_lossy(bytes).into_owned(),
        });
    }
    answer
}

/// `answer` with the provider's answer (`bytes`) kept as the
/// `chat.completion` body `back` translates it into (Anthropic, Gemini: a
/// request sent as written); Err when it cannot be translated back.
#[allow(clippy::result_large_err)] // ProviderError, as every adapter returns it
pub(crate) fn keep_translated_body(
    answer: &mut ChatAnswer,
    bytes: &[u8],
    back: impl FnOnce(&Value) -> Result<Value, translate::TranslateError>,
) -> Result<(), ProviderError> {
    let native: Value = serde_json::from_slice(bytes).unwrap_or(Value::Null);
    let chat = back(&native).map_err(|e| ProviderError {
        message: format!("the answer cannot be translated back to a chat completion: {e}"),
        ..untranslatable(e)
    })?;
    answer.body = Some(chat.to_string());
    Ok(())
}

/// A request body sent as written that cannot be translated for the
/// provider: the item's error, never sent again.
pub(crate) fn untranslatable(e: translate::TranslateError) -> ProviderError {
    ProviderError {
        class: ErrorClass::Request,
        http_status: None,
        message: format!("the request cannot be translated for this provider: {e}"),
        headers: Default::default(),
    }
}

/// What came back over the wire, before any provider-specific parsing.
pub(crate) struct RawAnswer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub bytes: Vec<u8>,
}

/// Send and read the whole answer; transport failures are classified like
/// every adapter needs (connect failure = safe to resend; a timeout or a
/// broken connection after the request went out = ambiguous).
pub(crate) async fn exchange(builder: reqwest::RequestBuilder) -> Result<RawAnswer, ProviderError> {
    let response = builder
        .send()
        .await
        .map_err(|e| openai::transport_error(&e))?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let bytes = response
        .bytes()
        .await
        .map_err(|e| openai::transport_error(&e))?;
    Ok(RawAnswer {
        status,
        headers,
        bytes: bytes.to_vec(),
    })
}
