//! Server lifecycle, shared state and the admin routes.
//!
//! Contract: `MockServer::start` binds, spawns `axum::serve` in a tokio task and
//! returns at once. All request handlers share one `Shared`: the live config
//! (an `Arc` swapped under an `RwLock`, so a handler sees one consistent config
//! for its whole life), the rate buckets and fault RNG (one `Mutex` each, taken
//! only when limits/faults are on), the stats recorder, and a shutdown flag.
//! Shutdown flips the flag, which ends axum's accept loop and wakes every
//! latency and hang sleep, so graceful shutdown is quick even with hung
//! requests; the server task is aborted if it still has not ended after a grace.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::batch_store::Store;
use super::faults::{FaultPlan, FaultRng};
use super::limits::Limits;
use super::stats::Recorder;
use super::wire::{self, error_body, splitmix};
use super::{MockConfig, MockLogEntry, MockStats};
use super::{anthropic, batches, chat, files, ollama};

/// How long `shutdown` waits for in-flight requests before aborting the server task.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// Bodies up to this size are accepted (long prompts are a legitimate load test).
const MAX_BODY: usize = 64 * 1024 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Normal,
    Unauthorized,
    Forbidden,
    Quota,
}

/// A config plus what is derived from it once, instead of per request.
pub(crate) struct Live {
    pub config: MockConfig,
    pub mode: Mode,
    pub plan: FaultPlan,
    pub quiet: bool,
    pub limits_on: bool,
    /// When this config was set (the 429 storm runs from here).
    pub set_at: std::time::Instant,
}

impl Live {
    fn new(config: MockConfig) -> Live {
        let mode = match config.mode.as_str() {
            "unauthorized" => Mode::Unauthorized,
            "forbidden" => Mode::Forbidden,
            "quota" => Mode::Quota,
            // `set_config` cannot report errors; an unknown mode behaves like "normal".
            _ => Mode::Normal,
        };
        let plan = FaultPlan::from_config(&config);
        Live {
            mode,
            quiet: plan.is_quiet(),
            plan,
            limits_on: config.rpm_limit > 0 || config.tpm_limit > 0,
            set_at: std::time::Instant::now(),
            config,
        }
    }
}

pub(crate) struct Shared {
    live: RwLock<Arc<Live>>,
    pub limits: Mutex<Limits>,
    pub rng: Mutex<FaultRng>,
    /// files and batches of the Files/Batches APIs
    pub store: Mutex<Store>,
    /// Anthropic's Message Batches
    pub anthropic_batches: Mutex<super::anthropic_batch_store::Store>,
    pub stats: Recorder,
    /// counter behind response and request ids
    pub ids: AtomicU64,
    /// makes ids differ between server instances
    pub salt: u64,
    /// answers that used up the `omit_optional_first` budget since the last config change or reset
    pub omit_first_used: AtomicU32,
    /// the bytes of every file deleted through the Files APIs (OpenAI/Azure ids, Gemini
    /// `files/…` names), for a test's billing oracle (`MockServer::deleted_file`)
    pub deleted_files: Mutex<std::collections::HashMap<String, axum::body::Bytes>>,
    /// polls failed by `batch_poll_fail` since the last config change or reset
    pub poll_failures: AtomicU32,
    /// 429s given per prompt (its hash) for `rate_limit_first`
    pub refused_first: Mutex<std::collections::HashMap<String, u32>>,
    shutdown: watch::Sender<bool>,
}

impl Shared {
    fn new(config: MockConfig) -> Shared {
        let now = Instant::now();
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Shared {
            limits: Mutex::new(Limits::new(config.rpm_limit, config.tpm_limit, now)),
            rng: Mutex::new(FaultRng::new(config.seed)),
            store: Mutex::new(Store::default()),
            anthropic_batches: Mutex::default(),
            stats: Recorder::new(now),
            ids: AtomicU64::new(0),
            salt: splitmix(nanos ^ config.seed),
            omit_first_used: AtomicU32::new(0),
            deleted_files: Mutex::default(),
            poll_failures: AtomicU32::new(0),
            refused_first: Mutex::new(std::collections::HashMap::new()),
            shutdown: watch::channel(false).0,
            live: RwLock::new(Arc::new(Live::new(config))),
        }
    }

    pub(crate) fn live(&self) -> Arc<Live> {
        Arc::clone(&self.live.read().unwrap_or_else(|e| e.into_inner()))
    }

    fn set_config(&self, config: MockConfig) {
        let now = Instant::now();
        let old_seed = self.live().config.seed;
        lock(&self.limits).reconfigure(config.rpm_limit, config.tpm_limit, now);
        if config.seed != old_seed {
            *lock(&self.rng) = FaultRng::new(config.seed);
        }
        self.stats.trim_log(config.log_capacity);
        {
            let mut store = lock(&self.store);
            store.lost_creates = 0;
            store.refused_creates = 0;
            store.rejected_inputs = 0;
            store.dropped_creates = 0;
        }
        self.omit_first_used.store(0, Relaxed);
        self.poll_failures.store(0, Relaxed);
        *self.live.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(Live::new(config));
    }

    /// Resolves once shutdown has begun; long sleeps race against it.
    pub(crate) async fn stopping(&self) {
        let mut rx = self.shutdown.subscribe();
        // An Err means the sender is gone, which also means we are stopping.
        let _ = rx.wait_for(|stop| *stop).await;
    }
}

/// Lock, ignoring poisoning: the guarded data stays consistent between statements.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

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
        .merge(super::anthropic_batches::router())
        .merge(super::gemini_batches::routes())
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
        .route("/v1/batches", post(batches::create).get(batches::list))
        .route("/openai/batches", post(batches::create).get(batches::list))
        .route("/v1/batches/{id}", get(batches::get))
        .route("/openai/batches/{id}", get(batches::get))
        .route("/v1/batches/{id}/cancel", post(batches::cancel))
        .route("/openai/batches/{id}/cancel", post(batches::cancel))
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

pub(crate) fn json_response(status: StatusCode, body: Vec<u8>) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
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
