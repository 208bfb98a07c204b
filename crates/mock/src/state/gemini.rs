//! Gemini batch mode in the mock: its store and the exact JSON it answers
//! with (reference 5.2).
//!
//! Contract: one `GStore` behind a mutex (`GemState`), shared by the routes
//! (`batch::gemini::routes`, `files::gemini`, as an axum `Extension`) and each
//! batch's lifecycle task (`batch::gemini::run`). A batch answers as a
//! long-running Operation: `name: "batches/…"`, `metadata` (`@type`
//! GenerateContentBatch, `name`, `model`, `displayName`, `state`
//! `BATCH_STATE_*`, `createTime`, `updateTime`, `endTime`, `batchStats` with
//! int64 counts as strings, `output` once results exist), and once terminal
//! `done: true` with `response` (`@type` GenerateContentBatchOutput and the
//! same results as `metadata.output`) or `error` (a google.rpc.Status).
//! Inline input gives inline results (`inlinedResponses.inlinedResponses[]`,
//! input order), file input a `responsesFile`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use serde_json::{Value, json};
use tokio::sync::Notify;

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
