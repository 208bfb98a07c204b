//! The built-in mock provider: an HTTP server on loopback that speaks the
//! synchronous chat wire formats of OpenAI, Azure OpenAI, OpenRouter,
//! Anthropic, Gemini and Ollama.
//!
//! Contract:
//! - `POST /v1/chat/completions` answers deterministically (same model + messages
//!   give the same content), honours `response_format` (text, `json_object`,
//!   `json_schema`), enforces optional per-second RPM/TPM buckets the way OpenAI
//!   does, and injects faults drawn from a seeded RNG (not from the prompt, so a
//!   retry of a failed request can succeed).
//! - The same pipeline (latency, the one pair of rate buckets, faults, modes,
//!   determinism, stats and log) serves, each in its provider's exact shape:
//!   `POST /openai/deployments/{deployment}/chat/completions?api-version=…`
//!   (Azure), `POST /api/v1/chat/completions` (OpenRouter), `POST /v1/messages`
//!   (Anthropic), `POST /v1beta/models/{model}:generateContent` (Gemini) and
//!   `POST /api/chat` (Ollama). Each log entry names its provider and route.
//! - The models lists (`GET /v1/models`, Anthropic's with its
//!   `anthropic-version` header, `/v1beta/models`, `/api/tags`) name what it
//!   serves in each one's shape: the `models` set, or, serving any model,
//!   a few ids of that provider.
//! - The OpenAI Files + Batches APIs (`/v1/files…`, `/v1/batches…`) and
//!   Azure's (`/openai/files…`, `/openai/batches…` with `api-version` and
//!   `api-key`) in their exact wire format, with a lifecycle compressed to
//!   seconds and faults by switch (the `batch_*` config fields); batch lines
//!   are answered like the sync route. Uploads, creates and lifecycle
//!   transitions go into the log (with `batch_id`) and the stats.
//! - `GET /_mock/stats`, `GET /_mock/log`, `GET|POST /_mock/config` and
//!   `POST /_mock/reset` let tests and the demo observe and steer the server live.
//!
//! This crate is the only one that serves HTTP (axum lives here only). It
//! depends on no docket crate but `docket-model` (for its settings,
//! `MockConfig`): the engine never depends on it; the binary starts it for
//! `kind = "mock"` and for `docket mock-provider`.
//!
//! Layout, from the bottom up (each module uses only those above it, and
//! no two modules import each other, in any folder):
//! - `json` (an order-preserving JSON value used for schemas), `limits`
//!   (token buckets and Go duration strings), `faults` (seeded fault and
//!   latency draws), `wire` (OpenAI request/response/error bodies and what
//!   every wire shares: `Route`, `Prompt`, `Format`, ids), `stats` (atomic
//!   counters and the bounded request log);
//! - `answer` (deterministic content: `answer::material` is the seeded
//!   generator state, `answer::schema` makes values valid against a schema);
//! - `state`: the shared state in one place (`Shared`, the live config,
//!   `lock`, `json_response`) and the stores of the Files/Batches APIs
//!   (`state::openai`, `state::anthropic`, `state::gemini`);
//! - `steer` (the staged-pipeline switches `verdict`, `verdict_disagree_rate`,
//!   `omit_optional_rate`, `omit_optional_first`, applied on every route and
//!   batch path alike);
//! - `chat`: the synchronous routes, one file per wire (`chat::openai` for
//!   OpenAI, Azure and OpenRouter, `chat::anthropic`, `chat::gemini`,
//!   `chat::ollama`), the request `chat::pipeline` they share (each wire hands
//!   it its renderers; `chat::pipeline::reply` builds, records and damages the
//!   response) and `chat::infer` (the answer format when a request has no
//!   schema field);
//! - `gate`: the door of the Files/Batches APIs per wire (auth, limits, error
//!   and event shapes): `gate::openai`, `gate::anthropic`, `gate::gemini`;
//! - `files`: the Files APIs, `files::openai` (OpenAI and Azure) and
//!   `files::gemini`;
//! - `batch`: the Batch APIs, one folder per wire (`batch::openai` with
//!   `routes`, `input` (JSONL validation) and `run` (the lifecycle task, its
//!   lines answered and published by `run::answering`); `batch::anthropic`
//!   with `routes`, `run`, `lines`; `batch::gemini` with `routes` (the create
//!   in `routes::create`), `run`, `answer`), plus `batch::clock` (the lifecycle schedule)
//!   and `batch::lines` (result lines and files, and the result anomalies all
//!   three share);
//! - `server` (lifecycle, router, models lists and admin routes), on top.

mod answer;
mod batch;
mod chat;
mod faults;
mod files;
mod gate;
mod json;
mod limits;
mod server;
mod state;
mod stats;
mod steer;
mod wire;

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

pub use server::MockServer;

pub use docket_model::mock_config::MockConfig;

/// Counters since start (or the last `POST /_mock/reset`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct MockStats {
    /// every chat request received, on any route (OpenAI, Azure, OpenRouter,
    /// Anthropic, Gemini, Ollama)
    pub requests: u64,
    pub ok: u64,
    /// 429 rate_limit_exceeded
    pub rate_limited: u64,
    pub unauthorized: u64,
    pub quota: u64,
    /// 500
    pub server_errors: u64,
    /// 503
    pub overloaded: u64,
    pub hangs: u64,
    pub malformed: u64,
    /// 200s whose connection was reset mid-body
    pub resets: u64,
    pub truncated: u64,
    pub wrong_schema: u64,
    /// 200s where the model refused (the `refusal` fault)
    #[serde(default)]
    pub refused: u64,
    /// 200s with empty content (the `empty` fault)
    #[serde(default)]
    pub empty: u64,
    /// 400
    pub bad_requests: u64,
    /// summed over 200 responses that carried usage (ok, truncated, wrong_schema, refused, empty)
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub models_requests: u64,
    /// Files API uploads (`POST /v1/files`, `/openai/files`)
    #[serde(default)]
    pub files_uploaded: u64,
    /// Files API deletes (`DELETE /v1/files/{id}`, `/openai/files/{id}`)
    #[serde(default)]
    pub files_deleted: u64,
    /// batches made (a create whose answer was lost counts too)
    #[serde(default)]
    pub batches_created: u64,
    #[serde(default)]
    pub batches_completed: u64,
    /// failed validation (bad input, enqueued token limit)
    #[serde(default)]
    pub batches_failed: u64,
    #[serde(default)]
    pub batches_expired: u64,
    #[serde(default)]
    pub batches_cancelled: u64,
    /// batch request lines answered 200 (output file)
    #[serde(default)]
    pub batch_lines_ok: u64,
    /// batch request lines that failed (error file: 400, 500, batch_expired)
    #[serde(default)]
    pub batch_lines_failed: u64,
    /// `GET` of one batch or of the batch list
    #[serde(default)]
    pub batch_polls: u64,
    /// 429s on the Files and Batches endpoints
    #[serde(default)]
    pub batch_rate_limited: u64,
    /// answers (chat routes and batch lines) generated with optional top-level properties left
    /// out (`omit_optional_rate`, `omit_optional_first`)
    #[serde(default)]
    pub partial_answers: u64,
}

/// One chat request as the server saw it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct MockLogEntry {
    pub seq: u64,
    /// ms since server start
    pub at_ms: u64,
    /// whose wire format: "openai", "azure", "openrouter", "anthropic", "gemini", "ollama"
    #[serde(default)]
    pub provider: String,
    /// the route's path template, e.g. "/v1/messages" or
    /// "/v1beta/models/{model}:generateContent"
    #[serde(default)]
    pub route: String,
    /// X-Client-Request-Id header
    pub client_request_id: Option<String>,
    /// hex sha256 of the concatenated message contents ("" when the body was unreadable)
    pub prompt_sha256: String,
    pub model: String,
    /// HTTP status sent; 0 for a hang (nothing is ever sent)
    pub status: u16,
    /// "ok","rate_limited","unauthorized","quota","server_error","overloaded","hang",
    /// "malformed","reset_mid_body","truncated","wrong_schema","bad_request"; Files/Batches events:
    /// "file_uploaded", "batch_created" (status 500 when its answer was lost),
    /// "batch_cancelling" (the cancel request), and the transitions (status 0) "batch_in_progress",
    /// "batch_finalizing", "batch_completed", "batch_output_ready" (late files),
    /// "batch_failed", "batch_expired", "batch_cancelled"
    pub outcome: String,
    /// the batch (or uploaded file) an event is about; None for chat requests
    #[serde(default)]
    pub batch_id: Option<String>,
    /// a billed chat answer's usage as sent (prompt, completion tokens): the
    /// billing oracle's cost per request; None when it carried none
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<(u64, u64)>,
}

/// Blocking entry for `docket mock-provider`: serve until Ctrl-C. Prints one
/// line "mock provider listening on http://127.0.0.1:PORT/v1" to stdout first.
pub async fn serve_forever(config: MockConfig, addr: SocketAddr) -> std::io::Result<()> {
    let server = MockServer::start(config, addr).await?;
    println!("mock provider listening on {}", server.base_url());
    let stopped = tokio::signal::ctrl_c().await;
    server.shutdown().await;
    stopped
}
