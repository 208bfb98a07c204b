//! Server lifecycle, the router and the admin routes.
//!
//! Contract: `MockServer::start` binds, spawns `axum::serve` in a tokio task and
//! returns at once. All request handlers share one `Shared` (see `state`).
//! The router maps every route to its handler in `chat`, `files` and `batch`;
//! the models lists and `/_mock/*` are answered here.
//! Shutdown flips the flag, which ends axum's accept loop and wakes every
//! latency and hang sleep, so graceful shutdown is quick even with hung
//! requests; the server task is aborted if it still has not ended after a grace.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{Method, StatusCode, Uri, header};
use axum::response::Response;
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::batch;
use crate::chat::{anthropic, ollama, openai as chat};
use crate::files::openai as files;
use crate::state::{Shared, json_response, lock};
use crate::wire::{self, error_body};
use crate::{MockConfig, MockLogEntry, MockStats};

/// How long `shutdown` waits for in-flight requests before aborting the server task.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// Bodies up to this size are accepted (long prompts are a legitimate load test).
const MAX_BODY: usize = 64 * 1024 * 1024;

/// A running mock provider. Dropping it starts a graceful stop in the background.
pub struct MockServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: Option<JoinHandle<io::Result<()>>>,
}

impl MockServer {
    /// Bind `addr` (use 127.0.0.1:0 for a free port) and serve in a tokio task.
    /// An invalid config (see `MockConfig::validate`) is an `InvalidInput` error.
    pub async fn start(config: MockConfig, addr: SocketAddr) -> io::Result<MockServer> {
        config
            .validate()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::new(config));
        let app = router(Arc::clone(&shared));
        // Small request/response pairs: never let Nagle hold a write back.
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let stop = Arc::clone(&shared);
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move { stop.stopping().await })
                .await
        });
        Ok(MockServer {
            addr,
            shared,
            task: Some(task),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// "http://127.0.0.1:PORT/v1" (an unspecified bind address is shown as loopback).
    pub fn base_url(&self) -> String {
        let mut addr = self.addr;
        if addr.ip().is_unspecified() {
            addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        format!("http://{addr}/v1")
    }

    /// Snapshot of counters (same as GET /_mock/stats).
    pub fn stats(&self) -> MockStats {
        self.shared.stats.snapshot()
    }

    /// The request log (same as GET /_mock/log).
    /// The bytes of file `id` (an OpenAI/Azure file id, a Gemini `files/…`
    /// name) as they were when a client deleted it through the API; None
    /// for a file never deleted. The API itself answers 404 for it.
    pub fn deleted_file(&self, id: &str) -> Option<Vec<u8>> {
        lock(&self.shared.deleted_files).get(id).map(|b| b.to_vec())
    }

    pub fn log(&self) -> Vec<MockLogEntry> {
        self.shared.stats.log()
    }

    /// The config in force.
    pub fn config(&self) -> MockConfig {
        self.shared.live().config.clone()
    }

    /// Replace the config live (rate buckets keep their fill ratio, the fault RNG
    /// is reseeded if the seed changed). An unknown mode behaves like "normal".
    pub fn set_config(&self, config: MockConfig) {
        self.shared.set_config(config);
    }

    /// Graceful stop: no new connections, sleeping requests woken, in-flight
    /// requests given a short grace, then the server task is aborted.
    pub async fn shutdown(mut self) {
        self.shared.shutdown.send_replace(true);
        if let Some(mut task) = self.task.take()
            && tokio::time::timeout(SHUTDOWN_GRACE, &mut task)
                .await
                .is_err()
        {
            task.abort();
        }
    }
}

impl Drop for MockServer {
    fn drop(&mut self) {
        // Without this a dropped server would keep its port and sleeping tasks alive.
        self.shared.shutdown.send_replace(true);
    }
}

fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat::handle))
        .route(
            "/openai/deployments/{deployment}/chat/completions",
            post(chat::azure),
        )
        .route("/api/v1/chat/completions", post(chat::openrouter))
        .route("/v1/messages", post(anthropic::handle))
        .merge(batch::anthropic::routes::router())
        .merge(batch::gemini::routes::routes())
        .route("/api/chat", post(ollama::handle))
        // The models lists docket's preflight asks for: OpenAI's and
        // Anthropic's, Gemini's, Ollama's tags, OpenRouter's key and models,
        // Azure's.
        .route("/v1/models", get(models))
        .route("/v1beta/models", get(models))
        .route("/api/tags", get(models))
        .route("/api/v1/models", get(models))
        .route("/api/v1/key", get(models))
        .route("/openai/models", get(models))
        .route("/v1/files", post(files::upload).layer(upload_limit()))
        .route("/openai/files", post(files::upload).layer(upload_limit()))
        .route("/v1/files/{id}", get(files::get).delete(files::delete))
        .route("/openai/files/{id}", get(files::get).delete(files::delete))
        .route("/v1/files/{id}/content", get(files::content))
        .route("/openai/files/{id}/content", get(files::content))
        .route(
            "/v1/batches",
            post(batch::openai::routes::create).get(batch::openai::routes::list),
        )
        .route(
            "/openai/batches",
            post(batch::openai::routes::create).get(batch::openai::routes::list),
        )
        .route("/v1/batches/{id}", get(batch::openai::routes::get))
        .route("/openai/batches/{id}", get(batch::openai::routes::get))
        .route(
            "/v1/batches/{id}/cancel",
            post(batch::openai::routes::cancel),
        )
        .route(
            "/openai/batches/{id}/cancel",
            post(batch::openai::routes::cancel),
        )
        .route("/_mock/stats", get(stats))
        .route("/_mock/log", get(log))
        .route("/_mock/config", get(get_config).post(post_config))
        .route("/_mock/reset", post(reset))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(shared)
}

fn upload_limit() -> DefaultBodyLimit {
    DefaultBodyLimit::max(files::MAX_UPLOAD)
}

fn to_json<T: serde::Serialize>(value: &T) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => json_response(StatusCode::OK, body),
        Err(e) => json_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            error_body(&e.to_string(), Some("server_error"), None),
        ),
    }
}

async fn models(
    State(shared): State<Arc<Shared>>,
    uri: Uri,
    headers: header::HeaderMap,
) -> Response {
    shared.stats.models_request();
    // A key refused everywhere is refused here too, as by the real APIs,
    // which echo the key's start and end (OpenAI: "Incorrect API key
    // provided: sk-abc***...xyz"): a client must not store or show them.
    if shared.live().config.mode == "unauthorized" {
        let message = match presented_key(&headers) {
            Some(k) if k.chars().count() > 18 => {
                let chars: Vec<char> = k.chars().collect();
                let start: String = chars[..12].iter().collect();
                let end: String = chars[chars.len() - 6..].iter().collect();
                format!("Incorrect API key provided: {start}*****{end}.")
            }
            _ => "Incorrect API key provided.".to_string(),
        };
        return json_response(
            StatusCode::UNAUTHORIZED,
            error_body(
                &message,
                Some("invalid_request_error"),
                Some("invalid_api_key"),
            ),
        );
    }
    // The list of what it serves, in the shape of the wire asked.
    let list = match uri.path() {
        "/v1beta/models" => wire::ModelsWire::Gemini,
        "/api/tags" => wire::ModelsWire::Ollama,
        "/v1/models" if headers.contains_key("anthropic-version") => wire::ModelsWire::Anthropic,
        _ => wire::ModelsWire::OpenAi,
    };
    let served = shared.live().config.models.clone();
    json_response(StatusCode::OK, wire::models_body(&served, list))
}

/// The key a request carries, in whichever header its wire uses.
fn presented_key(headers: &header::HeaderMap) -> Option<String> {
    let value = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    value("authorization")
        .and_then(|v| v.strip_prefix("Bearer "))
        .or_else(|| value("x-api-key"))
        .or_else(|| value("x-goog-api-key"))
        .or_else(|| value("api-key"))
        .map(str::to_string)
}

async fn stats(State(shared): State<Arc<Shared>>) -> Response {
    to_json(&shared.stats.snapshot())
}

async fn log(State(shared): State<Arc<Shared>>) -> Response {
    to_json(&shared.stats.log())
}

async fn get_config(State(shared): State<Arc<Shared>>) -> Response {
    to_json(&shared.live().config)
}

async fn post_config(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let invalid = |msg: &str| {
        json_response(
            StatusCode::BAD_REQUEST,
            error_body(msg, Some("invalid_request_error"), None),
        )
    };
    let config: MockConfig = match serde_json::from_slice(&body) {
        Ok(c) => c,
        Err(e) => return invalid(&format!("invalid mock config: {e}")),
    };
    if let Err(e) = config.validate() {
        return invalid(&format!("invalid mock config: {e}"));
    }
    shared.set_config(config);
    to_json(&shared.live().config)
}

async fn reset(State(shared): State<Arc<Shared>>) -> Response {
    shared.stats.reset();
    {
        let mut store = lock(&shared.store);
        store.lost_creates = 0;
        store.refused_creates = 0;
        store.rejected_inputs = 0;
        store.dropped_creates = 0;
    }
    shared.omit_first_used.store(0, Relaxed);
    shared.poll_failures.store(0, Relaxed);
    to_json(&shared.stats.snapshot())
}

async fn not_found(method: Method, uri: Uri) -> Response {
    let msg = format!("Invalid URL ({method} {})", uri.path());
    json_response(
        StatusCode::NOT_FOUND,
        error_body(&msg, Some("invalid_request_error"), None),
    )
}
