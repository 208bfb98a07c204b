//! Anthropic Message Batches (`/v1/messages/batches`).
//!
//! - submit: `POST {base}/v1/messages/batches` with
//!   `{"requests":[{"custom_id","params"}]}`; no file upload, the whole body
//!   is the input, streamed a piece at a time as it is encoded. Each
//!   `params` is exactly the synchronous Messages body
//!   (`anthropic::request_body`): structured output (`output_config.format`
//!   or the schema in the system prompt) is decided there, once for both.
//! - poll: `GET {base}/v1/messages/batches/{id}`; `processing_status`
//!   `in_progress` → InProgress, `canceling` → Cancelling, `ended` →
//!   Cancelled when a cancel was initiated, else Expired when some requests
//!   expired, else Completed. `request_counts` stay in `processing` until the
//!   whole batch ends. `ended` with a null `results_url` (and not archived)
//!   is `results_pending`.
//! - results: `GET results_url` (JSONL, any order), with the same auth
//!   headers; only a URL on the configured API origin is followed (the key
//!   is never sent elsewhere): otherwise `{base}/v1/messages/batches/{id}/results`.
//!   `succeeded` → the sync answer parser, `errored` → the sync error
//!   classifier (`result.error.error.type`), `canceled` / `expired` → NotRun.
//!   Every request has a line, so one with none is `missing` (its fate
//!   unknown) even in an expired or cancelled batch.
//! - cancel: `POST {base}/v1/messages/batches/{id}/cancel`, idempotent.
//! - find: Anthropic keeps no metadata on a batch, so a tag cannot be
//!   checked: the candidates are the batches created at or after
//!   `created_after` whose request count is `request_count`, listed newest
//!   first (`GET …/batches?limit=100`, paged by `after_id`). One is ours;
//!   several (another submission of the same size in the window) are
//!   Ambiguous and wait for the operator.
//!
//! Headers `x-api-key` and `anthropic-version: 2023-06-01`.
//!
//! This module holds the adapter, its settings, the create and the calls
//! every part shares; `poll` reads and cancels, `results` reads the
//! results file, and `find` looks for a batch whose create answer was
//! lost.

#![allow(clippy::result_large_err)]

mod find;
mod poll;
mod results;
#[cfg(test)]
mod tests;

use std::time::Duration;

use chrono::Utc;
use serde_json::json;

use super::http::{Framing, Wire, measure, request_error, streamed_body};
use super::jsonl::{self, Chunk, LineError};
use super::openai::PollCadence;
use super::{
    BatchLimits, BatchLine, BatchProvider, BatchState, LineSource, SubmitSpec, Submitted,
    with_key_header,
};
use crate::anthropic::{ANTHROPIC_VERSION, classify_error, rate_headers_at, wire_body};
use crate::batch::jsonl::EncodeError;
use crate::{ApiKey, ProviderError, RawAnswer};
use poll::MessageBatch;

/// `{"requests":[` + `]}`: what the body adds to its lines (each line's
/// separating comma is counted as the newline `jsonl::split` adds).
const ENVELOPE: u64 = 16;

/// 100,000 requests and 256 MB per batch (the whole create body, counted
/// as 256,000,000 bytes, the smaller reading of "MB").
pub const ANTHROPIC_LIMITS: BatchLimits = BatchLimits {
    max_requests: 100_000,
    max_bytes: 256_000_000 - ENVELOPE,
    max_custom_id: 64,
};

/// The seed's cadence for Anthropic (4.1A): 30 s, 120 s once a batch has
/// run for 10 minutes. Counts do not move until the batch ends, so there is
/// no tightening near the window's end. Canceling polls at 30 s.
pub const CADENCE: PollCadence = PollCadence {
    quick: Duration::from_secs(30),
    slow: Duration::from_secs(120),
    slow_after: Duration::from_secs(10 * 60),
    window: Duration::from_secs(24 * 3600),
    window_tail: Duration::ZERO,
};

/// `CADENCE` compressed 1,000-fold (30 ms, 120 ms after 600 ms).
pub fn fast() -> PollCadence {
    PollCadence {
        quick: CADENCE.quick / 1000,
        slow: CADENCE.slow / 1000,
        slow_after: CADENCE.slow_after / 1000,
        window: CADENCE.window / 1000,
        window_tail: Duration::ZERO,
    }
}

const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Sending a create body, or reading results, of up to 256 MB.
const BODY_TIMEOUT: Duration = Duration::from_secs(30 * 60);
const MAX_LIST_PAGES: usize = 100;

pub struct AnthropicBatch {
    /// `https://api.anthropic.com`, no `/v1`.
    base: String,
    key: ApiKey,
    client: reqwest::Client,
    limits: BatchLimits,
    cadence: PollCadence,
}

impl AnthropicBatch {
    /// `base_url` as for the sync adapter (`https://api.anthropic.com`, a
    /// trailing `/v1` accepted).
    pub fn new(base_url: &str, key: ApiKey) -> Result<Self, crate::ClientError> {
        let base = base_url.trim_end_matches('/');
        let base = base.strip_suffix("/v1").unwrap_or(base).to_string();
        Ok(Self {
            base,
            key,
            client: crate::http_client()?,
            limits: ANTHROPIC_LIMITS,
            cadence: CADENCE,
        })
    }

    pub fn with_cadence(mut self, cadence: PollCadence) -> Self {
        self.cadence = cadence;
        self
    }

    pub fn with_limits(mut self, limits: BatchLimits) -> Self {
        self.limits = limits;
        self
    }

    /// One request of the create body: `{"custom_id","params"}`.
    pub fn encode_line(&self, line: &BatchLine) -> Result<Vec<u8>, EncodeError> {
        serde_json::to_vec(&json!({
            "custom_id": line.custom_id,
            "params": wire_body(&line.request)?,
        }))
        .map_err(EncodeError::Request)
    }

    fn url(&self, path: &str) -> String {
        format!("{}/v1/messages/batches{path}", self.base)
    }

    fn batch_url(&self, id: &str, tail: &str) -> String {
        self.url(&format!("/{}{tail}", crate::path_segment(id)))
    }

    fn authed(&self, b: reqwest::RequestBuilder) -> Result<reqwest::RequestBuilder, ProviderError> {
        with_key_header(b, "x-api-key", &self.key)
            .map(|b| b.header("anthropic-version", ANTHROPIC_VERSION))
    }

    fn scrub(&self, e: ProviderError) -> ProviderError {
        crate::scrub(e, Some(&self.key))
    }

    async fn call(&self, builder: reqwest::RequestBuilder) -> Result<RawAnswer, ProviderError> {
        WIRE.call(self.authed(builder)?).await
    }

    async fn get_batch(&self, id: &str) -> Result<MessageBatch, ProviderError> {
        let raw = self
            .call(
                self.client
                    .get(self.batch_url(id, ""))
                    .timeout(CALL_TIMEOUT),
            )
            .await?;
        parse_json(&raw, "message batch")
    }

    async fn submit_inner(&self, spec: &SubmitSpec<'_>) -> Result<Submitted, ProviderError> {
        if spec.lines.is_empty() {
            return Err(request_error("a batch needs at least one request".into()));
        }
        // Anthropic batches may mix models; docket's are one model each.
        let measured = measure(spec, self.limits, |l| self.encode_line(l), "", "", "batch").await?;
        let raw = self.create(spec.lines, measured.bytes).await?;
        let batch: MessageBatch = parse_json(&raw, "batch create")?;
        Ok(Submitted {
            provider_batch_id: batch.id,
            input_file_id: None,
        })
    }

    /// `POST /v1/messages/batches`, the body encoded as it is sent.
    async fn create(&self, lines: &dyn LineSource, bytes: u64) -> Result<RawAnswer, ProviderError> {
        let (body, produce) = streamed_body(lines, &FRAMING, |l| self.encode_line(l));
        let send = self.call(
            self.client
                .post(self.url(""))
                .timeout(BODY_TIMEOUT)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .header(reqwest::header::CONTENT_LENGTH, bytes + 14)
                .body(body),
        );
        let (answer, ()) = futures::join!(send, produce);
        answer
    }
}

impl BatchProvider for AnthropicBatch {
    fn name(&self) -> &str {
        "anthropic"
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
}

/// The create body: `{"requests":[` + the lines, comma-separated + `]}`.
const FRAMING: Framing = Framing {
    open: b"{\"requests\":[",
    between: b",",
    after: b"",
    close: b"]}",
};

/// Anthropic's answers: rate headers read at the time of reading, errors
/// by the sync adapter's classifier.
const WIRE: Wire = Wire {
    rate_headers: |h| rate_headers_at(h, Utc::now()),
    error_of: |raw| {
        classify_error(
            raw.status,
            &raw.bytes,
            rate_headers_at(&raw.headers, Utc::now()),
        )
    },
};

fn parse_json<T: serde::de::DeserializeOwned>(
    raw: &RawAnswer,
    what: &str,
) -> Result<T, ProviderError> {
    WIRE.parse_json(raw, what)
}
