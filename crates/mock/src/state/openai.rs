//! In-memory state of the Files and Batches APIs (OpenAI and Azure), and the
//! exact JSON objects they answer with.
//!
//! Contract: one `Store` behind a mutex in `Shared`, holding every uploaded or
//! generated file (input, output, error) and every batch. Each file and batch
//! belongs to the API it was made through (`Api`): OpenAI's routes never see
//! Azure's objects and the other way round. The lifecycle task of a batch
//! (`batch::openai::run`) and the HTTP handlers (`files::openai`,
//! `batch::openai::routes`) both change a batch only under the lock. Objects serialize with the field names and order of
//! the OpenAI spec (`OpenAIFile`, `Batch`; reference section 2).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use serde::{Serialize, Serializer};
use tokio::sync::Notify;

use crate::wire::Route;

/// Files expire 30 days after upload (OpenAI's default for batch files).
const FILE_TTL_SECS: u64 = 30 * 86_400;
/// `completion_window: "24h"`.
pub(crate) const WINDOW_SECS: u64 = 86_400;

/// Which provider's Files/Batches routes an object was made through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Api {
    OpenAi,
    Azure,
}

impl Api {
    /// Azure's routes all start with `/openai/`.
    pub(crate) fn of_path(path: &str) -> Api {
        if path.starts_with("/openai/") {
            Api::Azure
        } else {
            Api::OpenAi
        }
    }

    pub(crate) fn route(self) -> Route {
        match self {
            Api::OpenAi => Route::OpenAi,
            Api::Azure => Route::Azure,
        }
    }

    pub(crate) fn provider(self) -> &'static str {
        self.route().provider()
    }

    /// Log route of a batch's lines in the billing log (`batch_line_log`).
    pub(crate) fn line_route(self) -> &'static str {
        match self {
            Api::OpenAi => "/v1/batches/{batch_id}",
            Api::Azure => "/openai/batches/{batch_id}",
        }
    }

    /// Accepted batch `endpoint` values (the mock runs chat completions only).
    pub(crate) fn endpoints(self) -> &'static [&'static str] {
        match self {
            Api::OpenAi => &["/v1/chat/completions"],
            Api::Azure => &["/chat/completions", "/v1/chat/completions"],
        }
    }

    /// Requests allowed in one batch input file.
    pub(crate) fn max_requests(self) -> usize {
        match self {
            Api::OpenAi => 50_000,
            Api::Azure => 100_000,
        }
    }
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub(crate) struct StoredFile {
    pub api: Api,
    pub id: String,
    pub filename: String,
    pub purpose: String,
    pub created_at: u64,
    pub bytes: Bytes,
    /// content downloads so far (the cut-results fault cuts the first N)
    pub downloads: u32,
    /// a results file whose download answers 404 until then (`batch_results_404_ms`)
    pub hidden_until: Option<std::time::Instant>,
}

/// The `OpenAIFile` object.
#[derive(Serialize)]
pub(crate) struct FileObject<'a> {
    id: &'a str,
    object: &'static str,
    bytes: usize,
    created_at: u64,
    expires_at: u64,
    filename: &'a str,
    purpose: &'a str,
    status: &'static str,
}

impl StoredFile {
    pub(crate) fn object(&self) -> FileObject<'_> {
        FileObject {
            id: &self.id,
            object: "file",
            bytes: self.bytes.len(),
            created_at: self.created_at,
            expires_at: self.created_at + FILE_TTL_SECS,
            filename: &self.filename,
            purpose: &self.purpose,
            status: "processed",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    Validating,
    Failed,
    InProgress,
    Finalizing,
    Completed,
    Expired,
    Cancelling,
    Cancelled,
}

impl Status {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Status::Validating => "validating",
            Status::Failed => "failed",
            Status::InProgress => "in_progress",
            Status::Finalizing => "finalizing",
            Status::Completed => "completed",
            Status::Expired => "expired",
            Status::Cancelling => "cancelling",
            Status::Cancelled => "cancelled",
        }
    }
}

/// One entry of `errors.data[]`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub(crate) struct BatchError {
    pub code: String,
    pub message: String,
    pub param: Option<String>,
    /// 1-based line of the input file, when the error is about one line
    pub line: Option<u64>,
}

/// Unix-second timestamps of the lifecycle.
#[derive(Debug, Clone, Default)]
pub(crate) struct Stamps {
    pub in_progress: Option<u64>,
    pub finalizing: Option<u64>,
    pub completed: Option<u64>,
    pub failed: Option<u64>,
    pub expired: Option<u64>,
    pub cancelling: Option<u64>,
    pub cancelled: Option<u64>,
}

pub(crate) struct Batch {
    pub api: Api,
    pub id: String,
    pub endpoint: String,
    pub input_file_id: String,
    pub metadata: Option<Vec<(String, String)>>,
    pub status: Status,
    pub model: Option<String>,
    pub errors: Vec<BatchError>,
    pub created_at: u64,
    pub at: Stamps,
    pub total: u64,
    pub completed: u64,
    pub failed: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// estimated prompt tokens, counted against the enqueued limit while open
    pub queued_tokens: u64,
    pub output_file_id: Option<String>,
    pub error_file_id: Option<String>,
    pub cancel_requested: bool,
    /// wakes the lifecycle task on cancel
    pub cancel: Arc<Notify>,
}

#[derive(Serialize)]
struct Counts {
    total: u64,
    completed: u64,
    failed: u64,
}

#[derive(Serialize)]
struct Errors<'a> {
    object: &'static str,
    data: &'a [BatchError],
}

#[derive(Serialize)]
struct Usage {
    input_tokens: u64,
    input_tokens_details: Cached,
    output_tokens: u64,
    output_tokens_details: Reasoning,
    total_tokens: u64,
}

#[derive(Serialize)]
struct Cached {
    cached_tokens: u64,
}

#[derive(Serialize)]
struct Reasoning {
    reasoning_tokens: u64,
}

/// Metadata pairs in the order they were given.
struct Meta<'a>(&'a [(String, String)]);

impl Serialize for Meta<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

/// The `Batch` object.
#[derive(Serialize)]
pub(crate) struct BatchObject<'a> {
    id: &'a str,
    object: &'static str,
    endpoint: &'a str,
    model: Option<&'a str>,
    errors: Option<Errors<'a>>,
    input_file_id: &'a str,
    completion_window: &'static str,
    status: &'static str,
    output_file_id: Option<&'a str>,
    error_file_id: Option<&'a str>,
    created_at: u64,
    in_progress_at: Option<u64>,
    expires_at: u64,
    finalizing_at: Option<u64>,
    completed_at: Option<u64>,
    failed_at: Option<u64>,
    expired_at: Option<u64>,
    cancelling_at: Option<u64>,
    cancelled_at: Option<u64>,
    request_counts: Counts,
    usage: Usage,
    metadata: Option<Meta<'a>>,
}

impl Batch {
    pub(crate) fn object(&self) -> BatchObject<'_> {
        BatchObject {
            id: &self.id,
            object: "batch",
            endpoint: &self.endpoint,
            model: self.model.as_deref(),
            errors: (!self.errors.is_empty()).then_some(Errors {
                object: "list",
                data: &self.errors,
            }),
            input_file_id: &self.input_file_id,
            completion_window: "24h",
            status: self.status.as_str(),
            output_file_id: self.output_file_id.as_deref(),
            error_file_id: self.error_file_id.as_deref(),
            created_at: self.created_at,
            in_progress_at: self.at.in_progress,
            expires_at: self.created_at + WINDOW_SECS,
            finalizing_at: self.at.finalizing,
            completed_at: self.at.completed,
            failed_at: self.at.failed,
            expired_at: self.at.expired,
            cancelling_at: self.at.cancelling,
            cancelled_at: self.at.cancelled,
            request_counts: Counts {
                total: self.total,
                completed: self.completed,
                failed: self.failed,
            },
            usage: Usage {
                input_tokens: self.input_tokens,
                input_tokens_details: Cached { cached_tokens: 0 },
                output_tokens: self.output_tokens,
                output_tokens_details: Reasoning {
                    reasoning_tokens: 0,
                },
                total_tokens: self.input_tokens + self.output_tokens,
            },
            metadata: self.metadata.as_deref().map(Meta),
        }
    }

    /// Log route of the batch resource.
    pub(crate) fn route(&self) -> &'static str {
        match self.api {
            Api::OpenAi => "/v1/batches/{batch_id}",
            Api::Azure => "/openai/batches/{batch_id}",
        }
    }
}

#[derive(Default)]
pub(crate) struct Store {
    pub files: HashMap<String, StoredFile>,
    pub batches: HashMap<String, Batch>,
    /// batch ids in creation order
    pub order: Vec<String>,
    pub next_seq: u64,
    /// creates whose answer was lost since the last config change or reset
    pub lost_creates: u32,
    pub refused_creates: u32,
    /// batches failed by `batch_reject_input` since the last config change or reset
    pub rejected_inputs: u32,
    /// creates dropped by `batch_drop_create` since the last config change or reset
    pub dropped_creates: u32,
}

impl Store {
    pub(crate) fn file(&self, api: Api, id: &str) -> Option<&StoredFile> {
        self.files.get(id).filter(|f| f.api == api)
    }

    pub(crate) fn batch(&self, api: Api, id: &str) -> Option<&Batch> {
        self.batches.get(id).filter(|b| b.api == api)
    }

    pub(crate) fn batch_mut(&mut self, api: Api, id: &str) -> Option<&mut Batch> {
        self.batches.get_mut(id).filter(|b| b.api == api)
    }

    /// Prompt tokens queued in the open (in_progress, finalizing) batches of `model`.
    pub(crate) fn enqueued_tokens(&self, api: Api, model: &str) -> u64 {
        self.batches
            .values()
            .filter(|b| {
                b.api == api
                    && b.model.as_deref() == Some(model)
                    && matches!(b.status, Status::InProgress | Status::Finalizing)
            })
            .map(|b| b.queued_tokens)
            .sum()
    }
}
