//! Gemini batch mode in the mock: state, the exact JSON it answers with, and
//! the gate every Gemini batch/file route passes first (reference 5.2).
//!
//! Contract: one `GStore` behind a mutex, shared by the routes
//! (`gemini_batches`, `gemini_files`, as an axum `Extension`) and each
//! batch's lifecycle task (`gemini_batch_run`). A batch answers as a
//! long-running Operation: `name: "batches/…"`, `metadata` (`@type`
//! GenerateContentBatch, `name`, `model`, `displayName`, `state`
//! `BATCH_STATE_*`, `createTime`, `updateTime`, `endTime`, `batchStats` with
//! int64 counts as strings, `output` once results exist), and once terminal
//! `done: true` with `response` (`@type` GenerateContentBatchOutput and the
//! same results as `metadata.output`) or `error` (a google.rpc.Status).
//! Inline input gives inline results (`inlinedResponses.inlinedResponses[]`,
//! input order), file input a `responsesFile`.
//!
//! Gate, in order: a `key` query parameter is a 400 INVALID_ARGUMENT (and a
//! `key_in_url` log entry), no `x-goog-api-key` a 403, `mode = unauthorized`
//! a 403, the shared rpm bucket at a cost of 0 tokens a 429
//! RESOURCE_EXHAUSTED with RetryInfo (counted as `batch_rate_limited`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::chat::has_value;
use super::gemini::{MSG_KEY_IN_URL, render_error};
use super::limits::Decision;
use super::pipeline::{Event, Limited};
use super::server::{Live, Mode, Shared, json_response, lock};
use super::stats::{BatchCount, BatchEvent};

pub(crate) const BATCH_TYPE: &str =
    "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch";
pub(crate) const OUTPUT_TYPE: &str =
    "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatchOutput";

pub(crate) type GemState = Arc<Mutex<GStore>>;

pub(crate) fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GState {
    Pending,
    Running,
    Succeeded,
    Failed,
    Cancelled,
    Expired,
}

impl GState {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            GState::Pending => "BATCH_STATE_PENDING",
            GState::Running => "BATCH_STATE_RUNNING",
            GState::Succeeded => "BATCH_STATE_SUCCEEDED",
            GState::Failed => "BATCH_STATE_FAILED",
            GState::Cancelled => "BATCH_STATE_CANCELLED",
            GState::Expired => "BATCH_STATE_EXPIRED",
        }
    }

    pub(crate) fn is_open(self) -> bool {
        matches!(self, GState::Pending | GState::Running)
    }
}

pub(crate) struct GFile {
    pub name: String,
    pub display_name: String,
    pub mime: String,
    pub bytes: Bytes,
    pub create_time: String,
    /// a batch's responses file (the cut-results fault applies)
    pub output: bool,
    pub downloads: u32,
    /// its download answers 404 until then (`batch_results_404_ms`)
    pub hidden_until: Option<std::time::Instant>,
}

impl GFile {
    pub(crate) fn object(&self) -> Value {
        let id = self.name.trim_start_matches("files/");
        json!({
            "name": self.name,
            "displayName": self.display_name,
            "mimeType": self.mime,
            "sizeBytes": self.bytes.len().to_string(),
            "createTime": self.create_time,
            "updateTime": self.create_time,
            "expirationTime": self.create_time,
            "uri": format!("https://generativelanguage.googleapis.com/v1beta/files/{id}"),
            "state": "ACTIVE",
            "source": if self.output { "GENERATED" } else { "UPLOADED" },
        })
    }
}

/// A resumable upload between `start` and `upload, finalize`.
pub(crate) struct Upload {
    pub display_name: String,
    pub mime: String,
    pub size: Option<usize>,
}

pub(crate) enum Results {
    Inline(Vec<Value>),
    File(String),
}

pub(crate) struct GBatch {
    pub name: String,
    pub model: String,
    pub display_name: String,
    pub input_file: Option<String>,
    pub state: GState,
    pub done: bool,
    pub create_time: String,
    pub update_time: String,
    pub end_time: Option<String>,
    pub total: u64,
    pub ok: u64,
    pub failed: u64,
    pub queued_tokens: u64,
    pub results: Option<Results>,
    pub error: Option<Value>,
    pub cancel_requested: bool,
    pub cancel: Arc<Notify>,
}

impl GBatch {
    /// The Operation; `results` false leaves the results out (the list does).
    pub(crate) fn operation(&self, results: bool) -> Value {
        let pending = self.total.saturating_sub(self.ok + self.failed);
        let mut meta = json!({
            "@type": BATCH_TYPE,
            "name": self.name,
            "model": format!("models/{}", self.model),
            "displayName": self.display_name,
            "state": self.state.as_str(),
            "createTime": self.create_time,
            "updateTime": self.update_time,
            "batchStats": {
                "requestCount": self.total.to_string(),
                "successfulRequestCount": self.ok.to_string(),
                "failedRequestCount": self.failed.to_string(),
                "pendingRequestCount": pending.to_string(),
            },
        });
        if let Some(f) = &self.input_file {
            meta["inputConfig"] = json!({"fileName": f});
        }
        if let Some(t) = &self.end_time {
            meta["endTime"] = json!(t);
        }
        let output = match (&self.results, results) {
            (Some(Results::Inline(items)), true) => {
                Some(json!({"inlinedResponses": {"inlinedResponses": items}}))
            }
            (Some(Results::File(f)), _) => Some(json!({"responsesFile": f})),
            _ => None,
        };
        if let Some(o) = &output {
            meta["output"] = o.clone();
        }
        let mut op = json!({"name": self.name, "metadata": meta});
        if self.done {
            op["done"] = json!(true);
            if let Some(e) = &self.error {
                op["error"] = e.clone();
            } else if let Some(mut o) = output {
                o["@type"] = json!(OUTPUT_TYPE);
                op["response"] = o;
            }
        }
        op
    }
}

#[derive(Default)]
pub(crate) struct GStore {
    pub batches: HashMap<String, GBatch>,
    /// batch names in creation order
    pub order: Vec<String>,
    pub files: HashMap<String, GFile>,
    pub uploads: HashMap<String, Upload>,
    pub next_seq: u64,
}

impl GStore {
    /// Estimated prompt tokens queued in the open batches of `model`.
    pub(crate) fn enqueued_tokens(&self, model: &str) -> u64 {
        self.batches
            .values()
            .filter(|b| b.model == model && b.state.is_open())
            .map(|b| b.queued_tokens)
            .sum()
    }
}

/// `{"error":{"code","message","status","details"}}`.
pub(crate) fn rpc(status: StatusCode, rpc_status: &str, message: &str) -> Response {
    let body = json!({"error": {"code": status.as_u16(), "message": message, "status": rpc_status, "details": []}});
    json_response(status, serde_json::to_vec(&body).unwrap_or_default())
}

pub(crate) fn not_found(what: &str) -> Response {
    rpc(
        StatusCode::NOT_FOUND,
        "NOT_FOUND",
        &format!("Requested entity was not found: {what}"),
    )
}

pub(crate) fn ok(value: &Value) -> Response {
    json_response(
        StatusCode::OK,
        serde_json::to_vec(value).unwrap_or_default(),
    )
}

pub(crate) fn event(
    shared: &Shared,
    route: &str,
    id: &str,
    model: &str,
    status: u16,
    outcome: &str,
) {
    let e = BatchEvent {
        provider: "gemini",
        route,
        batch_id: id,
        client_request_id: None,
        model,
        status,
        outcome,
    };
    shared.stats.event(&e, shared.live().config.log_capacity);
}

/// Auth, mode and the rpm bucket for every Gemini batch/file route.
pub(crate) fn gate(
    shared: &Shared,
    route: &str,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
) -> Result<Arc<Live>, Box<Response>> {
    let live = shared.live();
    let render = |ev: &Event| {
        let r = render_error(ev, "batch");
        Box::new(json_response(r.status, r.body))
    };
    if query.contains_key("key") {
        event(shared, route, "", "", 400, "key_in_url");
        return Err(render(&Event::BadRequest(MSG_KEY_IN_URL.to_string())));
    }
    if !has_value(headers, "x-goog-api-key") {
        return Err(render(&Event::NoAuth(
            "Method doesn't allow unregistered callers (callers without established identity). Please use API Key or other form of API consumer identity to call this API.".to_string(),
        )));
    }
    if live.mode == Mode::Unauthorized {
        return Err(render(&Event::Unauthorized));
    }
    if live.limits_on
        && let Decision::Limited {
            kind,
            limit,
            used,
            requested,
            wait,
            ..
        } = lock(&shared.limits).check(0, Instant::now())
    {
        shared.stats.count(BatchCount::RateLimited);
        return Err(render(&Event::RateLimited(Limited {
            kind,
            limit,
            used,
            requested,
            wait,
        })));
    }
    Ok(live)
}
