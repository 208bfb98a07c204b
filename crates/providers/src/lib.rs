//! Providers behind one trait. Orchestration never names a provider: it
//! builds a `ChatRequest`, sends it through `dyn ChatProvider`, and reads a
//! `ChatAnswer` or a classified `ProviderError`.
//!
//! This crate owns the providers' wire formats (one file per provider for
//! chat, `batch/` for the Batch APIs), the shared rate limiter (`limiter`)
//! and the retry rules and hints (`retry`). It may not touch the ledger,
//! the engine or the terminal: it depends only on `docket-model`.

pub(crate) mod anthropic;
mod azure;
pub mod batch;
#[doc(hidden)]
pub mod fuzzing;
pub(crate) mod gemini;
pub mod limiter;
pub mod models;
pub(crate) mod ollama;
pub(crate) mod openai;
pub(crate) mod openrouter;
pub mod retry;
mod transport;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use reqwest::header::HeaderValue;
use serde_json::Value;

use crate::limiter::RateHeaders;
use docket_model::config::{ProviderConfig, ProviderKind};

pub use anthropic::{ANTHROPIC_VERSION, AnthropicChat};
pub use azure::AzureChat;
pub use gemini::GeminiChat;
pub use ollama::OllamaChat;
pub use openai::OpenAiChat;
pub use openai::redact;
pub use openrouter::OpenRouterChat;

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
    /// Unique per attempt; sent where the provider has a header for it
    /// (OpenAI's `X-Client-Request-Id`), else not sent.
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
    /// cannot be reached or refuses the key (see [`probe`]); else the
    /// models it listed, if its answer was a whole list.
    fn preflight(&self) -> PreflightFuture<'_>;
}

/// The base URL of an OpenAI-shaped chat URL (`{base}/chat/completions`),
/// where the preflight's `{base}/models` or `{base}/key` lives.
pub(crate) fn chat_base(chat_url: &str) -> &str {
    chat_url
        .strip_suffix("/chat/completions")
        .unwrap_or(chat_url)
}

/// How long a preflight waits for its answer.
const PREFLIGHT_TIMEOUT: Duration = Duration::from_secs(15);

/// Send a preflight request. The provider is there unless it cannot be
/// reached (connection refused, DNS, TLS, no answer in 15 s) or refuses
/// the key (401, 403). Any other answer counts as there: a compatible
/// server without a models list answers 404, a busy one 429 or 503, and
/// each of those will still take requests. The body of a 200, for the
/// adapter to read its models list from.
pub(crate) async fn probe(
    builder: reqwest::RequestBuilder,
    key: Option<&ApiKey>,
) -> Result<Option<Vec<u8>>, ProviderError> {
    let raw = exchange(builder.timeout(PREFLIGHT_TIMEOUT))
        .await
        .map_err(|e| scrub(e, key))?;
    if raw.status == 200 {
        return Ok(Some(raw.bytes));
    }
    if !matches!(raw.status, 401 | 403) {
        return Ok(None);
    }
    let body: String = String::from_utf8_lossy(&raw.bytes)
        .chars()
        .take(300)
        .collect();
    Err(scrub(
        ProviderError {
            class: ErrorClass::Auth,
            http_status: Some(raw.status),
            message: format!(
                "the key was refused: {}",
                docket_model::sanitize::for_terminal(&body)
            ),
            headers: RateHeaders::default(),
        },
        key,
    ))
}

/// The ids of an OpenAI- or Anthropic-shaped models list (`{"data": [{"id":
/// ...}]}`); None for another shape, or a page of a longer list
/// (`has_more`: Anthropic's).
pub(crate) fn listed_ids(body: &[u8]) -> Listed {
    let v: Value = serde_json::from_slice(body).ok()?;
    if v.get("has_more").and_then(Value::as_bool) == Some(true) {
        return None;
    }
    let data = v.get("data")?.as_array()?;
    Some(
        data.iter()
            .filter_map(|m| m.get("id")?.as_str().map(str::to_string))
            .collect(),
    )
}

/// An API key held in memory only; never printed, logged or serialized.
#[derive(Clone)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wrap a key read from elsewhere (tests, a secret store).
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }

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

/// A short fingerprint of the key the config names, if it is set: the
/// first 8 hex digits of its SHA-256 (32 bits: enough to tell two keys
/// apart, nothing to guess one from). A session's config snapshot keeps it
/// beside the variable's name (row X1), so a resume with another key is
/// told, never mistaken for a provider failure (row B8).
pub fn key_fingerprint(cfg: &ProviderConfig) -> Option<String> {
    let var = cfg.api_key_env.as_ref()?;
    let key = std::env::var(var).ok().filter(|k| !k.is_empty())?;
    Some(format!(
        "sha256:{}",
        &docket_model::ids::sha256_hex(key.as_bytes())[..8]
    ))
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
    build_with_key(name, cfg, base_url_override, key)
}

/// The registry: one constructor per kind. Adding a provider adds an arm
/// here and a file beside this one; orchestration never changes.
pub(crate) fn build_with_key(
    name: &str,
    cfg: &ProviderConfig,
    base_url_override: Option<&str>,
    key: Option<ApiKey>,
) -> Result<Box<dyn ChatProvider>, ProviderSetupError> {
    let setup = |message: String| ProviderSetupError::Other {
        provider: name.into(),
        message,
    };
    let base = base_url_override
        .map(str::to_string)
        .or_else(|| cfg.base_url.clone())
        .or_else(|| cfg.kind.default_base_url().map(str::to_string))
        .ok_or_else(|| {
            setup(format!(
                "base_url is required for kind = \"{}\"",
                cfg.kind.as_str()
            ))
        })?;
    let need_key = |key: Option<ApiKey>| {
        key.ok_or_else(|| {
            setup(format!(
                "api_key_env is required for kind = \"{}\"",
                cfg.kind.as_str()
            ))
        })
    };
    let chat: Box<dyn ChatProvider> = match cfg.kind {
        // The built-in mock speaks OpenAI's wire format (and reads either name
        // for the output limit); compatible servers often read only
        // `max_tokens`.
        ProviderKind::Openai | ProviderKind::Mock => {
            Box::new(OpenAiChat::new(cfg.kind.as_str(), &base, key).map_err(setup)?)
        }
        ProviderKind::OpenaiCompatible => Box::new(
            OpenAiChat::new(cfg.kind.as_str(), &base, key)
                .map_err(setup)?
                .sending_max_tokens(),
        ),
        ProviderKind::Azure => {
            let version = cfg
                .api_version
                .as_ref()
                .map(|v| v.get_ref().clone())
                .ok_or_else(|| setup("api_version is required for kind = \"azure\"".into()))?;
            Box::new(AzureChat::new(&base, &version, need_key(key)?).map_err(setup)?)
        }
        ProviderKind::Anthropic => {
            Box::new(AnthropicChat::new(&base, need_key(key)?).map_err(setup)?)
        }
        ProviderKind::Gemini => Box::new(GeminiChat::new(&base, need_key(key)?).map_err(setup)?),
        ProviderKind::Ollama => Box::new(OllamaChat::new(&base, key).map_err(setup)?),
        ProviderKind::Openrouter => Box::new(
            OpenRouterChat::new(&base, need_key(key)?)
                .map_err(setup)?
                .with_attribution(None, Some("docket")),
        ),
    };
    Ok(chat)
}

/// The HTTP client every adapter uses.
pub(crate) fn http_client() -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(10))
        .user_agent(concat!("docket/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| format!("HTTP client: {e}"))
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

/// A header value that carries a secret (`api-key`, `x-api-key`,
/// `x-goog-api-key`): marked sensitive, so HTTP/2 never indexes it (HPACK) and
/// `Debug` output of the request or its headers prints `Sensitive`.
/// `bearer_auth` already does this for `Authorization`.
///
/// A key that is not a valid header value (a stray newline from a secret
/// file) can never succeed: `Auth`, which stops the session. The message never
/// holds the value.
// Errors are the rare path; ProviderError is returned unboxed as everywhere.
#[allow(clippy::result_large_err)]
pub(crate) fn secret_header(value: &str) -> Result<HeaderValue, ProviderError> {
    let mut v = HeaderValue::from_str(value).map_err(|_| ProviderError {
        class: ErrorClass::Auth,
        http_status: None,
        message: "the API key is not a valid HTTP header value (check it for stray whitespace, newlines or non-ASCII characters)".into(),
        headers: RateHeaders::default(),
    })?;
    v.set_sensitive(true);
    Ok(v)
}

/// Take the key (and anything key-shaped) out of an error before it is
/// stored or shown: providers echo keys in some messages.
pub(crate) fn scrub(mut err: ProviderError, key: Option<&ApiKey>) -> ProviderError {
    if let Some(k) = key
        && k.expose().len() >= 4
    {
        err.message = err.message.replace(k.expose(), "[redacted]");
        err.message = without_key_fragments(&err.message, k.expose());
    }
    err.message = openai::redact(&err.message);
    err
}

/// The shortest piece of a key that is taken out of a message.
const KEY_FRAGMENT: usize = 6;

/// `text` with every run of at least [`KEY_FRAGMENT`] characters that is
/// also a piece of `key` replaced: providers echo a key's start and end
/// ("Incorrect API key provided: plainCANARYs*****887766"), and a key
/// without a known prefix is not caught by its shape (fault-matrix row X1).
fn without_key_fragments(text: &str, key: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        // The longest run from `i` that the key contains.
        let mut end = i;
        let mut piece = String::new();
        while end < chars.len() {
            piece.push(chars[end]);
            if !key.contains(piece.as_str()) {
                break;
            }
            end += 1;
        }
        if end - i >= KEY_FRAGMENT {
            out.push_str("[redacted]");
            i = end;
        } else {
            out.push(chars[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> ProviderConfig {
        toml::from_str(text).unwrap()
    }

    /// What a preflight answer means: a 404 (a compatible server without a
    /// models list) is a provider that is there; a 401 is a key refused,
    /// and the key is never shown; a closed port is no answer.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_preflight_fails_only_for_a_refused_key_or_no_answer() {
        use docket_mock::{MockConfig, MockServer};
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        let normal = MockServer::start(MockConfig::default(), addr)
            .await
            .unwrap();
        let openai = |base: &str| {
            build_with_key(
                "main",
                &cfg("kind = \"openai\"\nmodel = \"gpt-4o-mini\""),
                Some(base),
                Some(ApiKey::new("canaryKEY0451preflight")),
            )
            .unwrap()
        };
        let listed = openai(&normal.base_url())
            .preflight()
            .await
            .expect("a models list")
            .expect("the list read");
        assert!(listed.iter().any(|m| m == "gpt-4o-mini"), "{listed:?}");
        // No models route under this prefix: 404, and still there (with
        // nothing listed).
        let root = normal.base_url().trim_end_matches("/v1").to_string();
        let none = openai(&format!("{root}/elsewhere"))
            .preflight()
            .await
            .expect("404 is there");
        assert_eq!(none, None);
        let refusing = MockServer::start(
            MockConfig {
                mode: "unauthorized".into(),
                ..Default::default()
            },
            addr,
        )
        .await
        .unwrap();
        let e = openai(&refusing.base_url()).preflight().await.unwrap_err();
        assert_eq!(
            (e.class, e.http_status),
            (ErrorClass::Auth, Some(401)),
            "{e}"
        );
        assert!(!e.to_string().contains("canaryKEY0451preflight"), "{e}");
        let closed = std::net::TcpListener::bind(addr).unwrap();
        let gone = format!("http://{}/v1", closed.local_addr().unwrap());
        drop(closed);
        let e = openai(&gone).preflight().await.unwrap_err();
        assert_eq!(e.class, ErrorClass::Transient, "{e}");
        normal.shutdown().await;
        refusing.shutdown().await;
    }

    #[test]
    fn the_registry_builds_one_adapter_per_kind() {
        let key = || Some(ApiKey::new("k-test"));
        for (kind, extra, label) in [
            ("openai", "", "openai"),
            (
                "openai_compatible",
                "base_url = \"http://x/v1\"",
                "openai_compatible",
            ),
            ("mock", "", "mock"),
            (
                "azure",
                "base_url = \"https://r.openai.azure.com\"\napi_version = \"2024-10-21\"",
                "azure",
            ),
            ("anthropic", "", "anthropic"),
            ("gemini", "", "gemini"),
            ("ollama", "", "ollama"),
            ("openrouter", "", "openrouter"),
        ] {
            let c = cfg(&format!("kind = \"{kind}\"\nmodel = \"m\"\n{extra}\n"));
            let p = build_with_key("p", &c, None, key()).unwrap();
            assert_eq!(p.name(), label);
        }
        let ollama = cfg("kind = \"ollama\"\nmodel = \"llama3.2\"\n");
        assert_eq!(
            build_with_key("p", &ollama, None, None).unwrap().name(),
            "ollama"
        );
        let anthropic = cfg("kind = \"anthropic\"\nmodel = \"claude-haiku-4-5\"\n");
        let e = build_with_key("p", &anthropic, None, None)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("api_key_env"), "{e}");
        let azure = cfg("kind = \"azure\"\nmodel = \"dep\"\napi_version = \"2024-10-21\"\n");
        let e = build_with_key("p", &azure, None, key())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("base_url"), "{e}");
    }

    #[test]
    fn secret_headers_are_sensitive_and_never_show_the_key() {
        let v = secret_header("AIzaCanary123").unwrap();
        assert!(v.is_sensitive());
        assert_eq!(v.to_str().unwrap(), "AIzaCanary123");
        assert!(!format!("{v:?}").contains("Canary"));
        let e = secret_header("AIzaCanary123\n").unwrap_err();
        assert_eq!(e.class, ErrorClass::Auth);
        assert!(!format!("{e} {e:?}").contains("Canary"));
    }

    #[test]
    fn scrub_removes_pieces_of_the_key_whatever_its_shape() {
        let key = ApiKey::new("plainCANARYsecret0123887766");
        let e = ProviderError {
            class: ErrorClass::Auth,
            http_status: Some(401),
            message: "Incorrect API key provided: plainCANARYs*************887766. See docs."
                .into(),
            headers: RateHeaders::default(),
        };
        let e = scrub(e, Some(&key));
        assert_eq!(
            e.message,
            "Incorrect API key provided: [redacted]*************[redacted]. See docs."
        );
        // Fewer than six characters in a row from the key stay ("plain").
        assert_eq!(
            without_key_fragments("plain text, 0123 and CANAR", key.expose()),
            "plain text, 0123 and CANAR"
        );
    }

    #[test]
    fn scrub_removes_the_exact_key() {
        let e = ProviderError {
            class: ErrorClass::Auth,
            http_status: Some(401),
            message: "bad key AIzaCanary123 given".into(),
            headers: RateHeaders::default(),
        };
        let e = scrub(e, Some(&ApiKey::new("AIzaCanary123")));
        assert_eq!(e.message, "bad key [redacted] given");
    }
}
