//! Gemini batch mode (Gemini Developer API, reference section 5.2).
//!
//! - submit: `POST {base}/v1beta/models/{model}:batchGenerateContent` with
//!   `{"batch":{"displayName": tag, "inputConfig": {"requests": {"requests":
//!   [{"request": {...}, "metadata": {"key": custom_id}}]}}}}` when the whole
//!   body fits the inline limit (20 MB), encoded an item at a time as it is
//!   sent; else the requests go up as a JSONL
//!   file (`{"key", "request"}` per line) through the Files API's resumable
//!   upload (`POST {base}/upload/v1beta/files`, `X-Goog-Upload-Command:
//!   start`, then `upload, finalize` to the URL it answers, the bytes
//!   streamed from the lines) and the create names `inputConfig.fileName`.
//!   The display name is docket's tag, so `find` can recognise a batch whose
//!   create answer was lost (creation is not idempotent).
//! - poll: `GET {base}/v1beta/batches/{id}`, an Operation: `metadata.state`
//!   (`BATCH_STATE_*`, `JOB_STATE_*` accepted too), `metadata.batchStats`
//!   (int64 counts as strings or numbers), `done`, `error`, and where the
//!   results are: `response` or `metadata.output` (both read, in the
//!   reference's order). Only these are read; the results themselves (all
//!   of them, for an inline batch) are skipped unread.
//! - results: inline (`…inlinedResponses.inlinedResponses[]`, each
//!   `{"metadata":{"key"}, "response"|"error"}`), read from a fresh GET; or a
//!   responses file (`GET {base}/download/v1beta/files/{id}:download?alt=media`,
//!   JSONL `{"key", "response"|"error"}`), streamed and split on newlines.
//!   Either way matched by key, unknown and duplicate keys quarantined.
//! - cancel: `POST {base}/v1beta/batches/{id}:cancel` (empty body, answers
//!   `{}`), then a GET for where the batch is now.
//! - find: `GET {base}/v1beta/batches?pageSize=100[&pageToken=..]`, every
//!   page, matching `displayName == tag`.
//!
//! The key goes in `x-goog-api-key` only, never a URL. A request is the
//! synchronous `generateContent` body (`gemini::request_body`, thinking
//! budget and all) and a result's
//! `response` is read by the synchronous parser, its `error` by the
//! synchronous classifier.
//!
//! This module holds the adapter, its settings and the calls every part
//! shares; `submit` builds and sends a create (inline or from a file),
//! `files` owns the Files API (upload, delete), `poll` reads and cancels,
//! `results` turns result items into outcomes, `find` looks for a batch
//! whose create answer was lost, and `operation` reads the Operation a
//! poll answers, leniently and without its inline results.

#![allow(clippy::result_large_err)]

mod files;
mod find;
mod operation;
mod poll;
mod results;
mod submit;
#[cfg(test)]
mod tests;

use std::time::Duration;

use serde_json::Value;

use super::http::{Framing, Wire};
use super::jsonl::{self, Chunk, LineError};
use super::{BatchLimits, BatchLine, BatchProvider, BatchState, with_key_header};
use crate::gemini::classify_error;
use crate::limiter::RateHeaders;
use crate::openai::rate_headers;
use crate::{ApiKey, ProviderError, RawAnswer};
use operation::OpStatus;

/// Gemini: a results file of up to 2 GB (counted as 2,000,000,000 bytes).
/// No request count per batch is documented; 100,000 keeps one batch's
/// results (and an inline answer) a sane size [unsure: not a published
/// limit].
pub const GEMINI_LIMITS: BatchLimits = BatchLimits {
    max_requests: 100_000,
    max_bytes: 2_000_000_000,
    max_custom_id: 64,
};

/// An inline create body may be at most 20 MB (counted as 20,000,000 bytes).
pub const INLINE_LIMIT: u64 = 20_000_000;

/// `output_ref` of a batch whose results are inline in the batch resource:
/// this prefix and the batch's name.
pub const INLINE_REF: &str = "inline:";

/// The inline create body: `{"batch":{"displayName":` + the tag +
/// `,"inputConfig":{"requests":{"requests":[` (together, `inline_open`),
/// the items comma-separated, `]}}}}`.
const INLINE_FRAMING: Framing = Framing {
    open: b"",
    between: b",",
    after: b"",
    close: b"]}}}}",
};

/// How much longer an inline item is than its file line: the line is
/// `{"key":K,"request":R}` (19 bytes besides K and R), the item
/// `{"metadata":{"key":K},"request":R}` (32 bytes besides them), K and R
/// encoded alike in both.
const ITEM_EXTRA: u64 = 13;

const CALL_TIMEOUT: Duration = Duration::from_secs(60);
const FILE_TIMEOUT: Duration = Duration::from_secs(30 * 60);
const MAX_LIST_PAGES: usize = 100;
const MAX_TAG: usize = 512;

/// How long to wait between polls (the staged-batching plan, 4.1A, for
/// Gemini): 120 s at first, 300 s once a batch is 20 minutes old. The caller
/// adds jitter. Tests and the mock compress it with `fast()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollCadence {
    pub quick: Duration,
    pub slow: Duration,
    /// This old: poll at `slow`.
    pub slow_after: Duration,
}

impl PollCadence {
    pub const STANDARD: PollCadence = PollCadence {
        quick: Duration::from_secs(120),
        slow: Duration::from_secs(300),
        slow_after: Duration::from_secs(20 * 60),
    };

    /// The same shape compressed 1,000-fold (120 ms, 300 ms after 1.2 s).
    pub fn fast() -> Self {
        let s = Self::STANDARD;
        PollCadence {
            quick: s.quick / 1000,
            slow: s.slow / 1000,
            slow_after: s.slow_after / 1000,
        }
    }

    pub fn after(&self, state: &BatchState, age: Duration) -> Duration {
        match state {
            // Asked to stop: it ends soon, and what finished is wanted.
            BatchState::Cancelling => self.quick,
            _ if age >= self.slow_after => self.slow,
            _ => self.quick,
        }
    }
}

impl Default for PollCadence {
    fn default() -> Self {
        Self::STANDARD
    }
}

/// Gemini's batch mode, against `https://generativelanguage.googleapis.com`
/// or any server speaking it (the built-in mock).
pub struct GeminiBatch {
    base: String,
    key: ApiKey,
    client: reqwest::Client,
    limits: BatchLimits,
    inline_limit: u64,
    cadence: PollCadence,
    /// Uploads of creates that made no batch but may be asked again.
    kept: super::KeptUploads,
}

impl GeminiBatch {
    /// `base_url` as for the sync adapter (a trailing `/v1beta` is accepted).
    pub fn new(base_url: &str, key: ApiKey) -> Result<Self, crate::ClientError> {
        let base = base_url.trim_end_matches('/');
        let base = base.strip_suffix("/v1beta").unwrap_or(base).to_string();
        Ok(Self {
            base,
            key,
            client: crate::http_client()?,
            limits: GEMINI_LIMITS,
            inline_limit: INLINE_LIMIT,
            cadence: PollCadence::STANDARD,
            kept: Default::default(),
        })
    }

    pub fn with_cadence(mut self, cadence: PollCadence) -> Self {
        self.cadence = cadence;
        self
    }

    /// Smaller limits than the provider's (tests; a cautious config).
    pub fn with_limits(mut self, limits: BatchLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Bodies above this many bytes go through a file instead of inline.
    pub fn with_inline_limit(mut self, bytes: u64) -> Self {
        self.inline_limit = bytes;
        self
    }

    /// `{base}/v1beta/batches/{id}` for a name `batches/{id}` (or a bare id).
    fn batch_url(&self, name: &str, suffix: &str) -> String {
        let id = name.strip_prefix("batches/").unwrap_or(name);
        format!(
            "{}/v1beta/batches/{}{suffix}",
            self.base,
            crate::path_segment(id)
        )
    }

    fn model_url(&self, model: &str) -> String {
        let id = model.strip_prefix("models/").unwrap_or(model);
        format!(
            "{}/v1beta/models/{}:batchGenerateContent",
            self.base,
            crate::path_segment(id)
        )
    }

    fn download_url(&self, file: &str) -> String {
        let id = file.strip_prefix("files/").unwrap_or(file);
        format!(
            "{}/download/v1beta/files/{}:download?alt=media",
            self.base,
            crate::path_segment(id)
        )
    }

    fn authed(
        &self,
        builder: reqwest::RequestBuilder,
    ) -> Result<reqwest::RequestBuilder, ProviderError> {
        with_key_header(builder, "x-goog-api-key", &self.key)
    }

    fn scrub(&self, e: ProviderError) -> ProviderError {
        crate::scrub(e, Some(&self.key))
    }

    fn clean(&self, text: &str) -> String {
        super::clean(text, Some(&self.key))
    }

    /// Send; a non-2xx answer is classified like a synchronous one.
    async fn call(&self, builder: reqwest::RequestBuilder) -> Result<RawAnswer, ProviderError> {
        WIRE.call(self.authed(builder)?).await
    }

    async fn get_batch(&self, name: &str) -> Result<RawAnswer, ProviderError> {
        self.call(
            self.client
                .get(self.batch_url(name, ""))
                .timeout(CALL_TIMEOUT),
        )
        .await
    }

    /// The whole batch resource, inline results and all (for `results`).
    async fn get_op(&self, name: &str) -> Result<Value, ProviderError> {
        parse_json(&self.get_batch(name).await?, "batch")
    }

    /// What a poll reads of the batch resource; the rest is skipped unread.
    async fn get_status(&self, name: &str) -> Result<OpStatus, ProviderError> {
        WIRE.parse_json(&self.get_batch(name).await?, "batch")
    }
}

impl BatchProvider for GeminiBatch {
    fn name(&self) -> &str {
        "gemini"
    }

    fn limits(&self) -> BatchLimits {
        self.limits
    }

    fn poll_after(&self, state: &BatchState, age: Duration) -> Duration {
        self.cadence.after(state, age)
    }

    fn split<'l>(&self, lines: &'l [BatchLine]) -> Result<Vec<Chunk<'l>>, LineError> {
        jsonl::split(lines, self.limits, |l| self.encode_line(l))
    }

    scrubbed_batch_calls!();

    uploaded_file_calls!();
}

/// Gemini's answers: rate headers as the OpenAI adapter reads them; an
/// error classified by the sync adapter's classifier with only the
/// `retry-after` of its headers.
const WIRE: Wire = Wire {
    rate_headers,
    error_of: |raw| {
        let headers = RateHeaders {
            retry_after: rate_headers(&raw.headers).retry_after,
            ..RateHeaders::default()
        };
        classify_error(raw.status, &raw.bytes, headers)
    },
};

fn parse_json(raw: &RawAnswer, what: &str) -> Result<Value, ProviderError> {
    WIRE.parse_json(raw, what)
}
