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
//! synchronous `generateContent` body (`gemini::request_body`) and a result's
//! `response` is read by the synchronous parser, its `error` by the
//! synchronous classifier.

#![allow(clippy::result_large_err)]

use std::collections::HashSet;
use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use serde::Deserialize;
use serde::de::value::MapAccessDeserializer;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Value, json};

use super::http::{
    self, Framing, JSONL, Measured, Wire, measure, not_understood, request_error, streamed_body,
    streamed_body_opening,
};
use super::jsonl::{self, Chunk, LineError};
use super::results::{Matcher, StreamEnd, parse_line};
use super::{
    BatchCounts, BatchLimits, BatchLine, BatchProvider, BatchState, BatchStatus, FIND_CLOCK_MARGIN,
    Found, LineOutcome, LineSource, ResultSink, ResultsSummary, SubmitSpec, Submitted,
    with_key_header,
};
use crate::gemini::{classify_error, parse_success, request_body};
use crate::limiter::RateHeaders;
use crate::openai::{preview, rate_headers};
use crate::{ApiKey, ProviderError, RawAnswer};

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
    pub fn new(base_url: &str, key: ApiKey) -> Result<Self, String> {
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

    /// One JSONL line of an input file, without its newline.
    pub fn encode_line(&self, line: &BatchLine) -> Result<Vec<u8>, String> {
        serde_json::to_vec(&json!({
            "key": line.custom_id,
            "request": request_body(&line.request),
        }))
        .map_err(|e| format!("cannot encode the request: {e}"))
    }

    /// One entry of `inputConfig.requests.requests`.
    fn inline_item(line: &BatchLine) -> Value {
        json!({
            "request": request_body(&line.request),
            "metadata": {"key": line.custom_id},
        })
    }

    /// One entry of `inputConfig.requests.requests`, encoded.
    fn encode_item(line: &BatchLine) -> Result<Vec<u8>, String> {
        serde_json::to_vec(&Self::inline_item(line))
            .map_err(|e| format!("cannot encode the request: {e}"))
    }

    /// The inline create body's length, its opening `open_len` bytes long,
    /// counted without encoding it; None when it would pass the limit.
    fn inline_len(&self, open_len: usize, measured: Measured) -> Option<u64> {
        // `measured.bytes` counts each file line and its newline; an item is
        // `ITEM_EXTRA` longer than its line, and a comma stands between two.
        let n = measured.lines;
        let len = (open_len as u64 + INLINE_FRAMING.close.len() as u64)
            .saturating_add(measured.bytes)
            .saturating_add(n.saturating_mul(ITEM_EXTRA))
            .saturating_sub(1);
        (len <= self.inline_limit).then_some(len)
    }

    /// The whole inline create body, or None when it would pass the limit
    /// (what `create_inline` streams, put together at once).
    #[cfg(test)]
    fn inline_body(&self, tag: &str, chunk: &Chunk<'_>) -> Option<Vec<u8>> {
        let mut body = inline_open(tag);
        let measured = Measured {
            lines: chunk.lines.len() as u64,
            bytes: chunk.bytes,
        };
        let len = self.inline_len(body.len(), measured)?;
        for (i, line) in chunk.lines.iter().enumerate() {
            if i > 0 {
                body.extend_from_slice(INLINE_FRAMING.between);
            }
            body.extend_from_slice(&Self::encode_item(line).ok()?);
        }
        body.extend_from_slice(INLINE_FRAMING.close);
        assert_eq!(body.len() as u64, len, "the inline body's counted length");
        Some(body)
    }

    /// `POST …:batchGenerateContent` with the requests inline, the body
    /// (`open`, the items, the close; `len` bytes in all) encoded an item at
    /// a time as it is sent.
    async fn create_inline(
        &self,
        model: &str,
        open: &[u8],
        lines: &dyn LineSource,
        len: u64,
    ) -> Result<RawAnswer, ProviderError> {
        let (body, produce) =
            streamed_body_opening(lines, open, &INLINE_FRAMING, Self::encode_item);
        let send = self.call(
            self.client
                .post(self.model_url(model))
                .timeout(CALL_TIMEOUT)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .header(reqwest::header::CONTENT_LENGTH, len)
                .body(body),
        );
        let (answer, ()) = futures::join!(send, produce);
        answer
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

    async fn submit_inner(&self, spec: &SubmitSpec<'_>) -> Result<Submitted, ProviderError> {
        if spec.lines.is_empty() {
            return Err(request_error("a batch needs at least one request".into()));
        }
        if spec.tag.is_empty() || spec.tag.chars().count() > MAX_TAG {
            return Err(request_error(format!(
                "the batch tag must be 1 to {MAX_TAG} characters (a Gemini display name)"
            )));
        }
        let measured = measure(
            spec,
            self.limits,
            |l| self.encode_line(l),
            " (one model per batch)",
            " per file",
            "file",
        )
        .await?;
        let open = inline_open(spec.tag);
        let (raw, file) = match self.inline_len(open.len(), measured) {
            Some(len) => (
                self.create_inline(spec.model, &open, spec.lines, len)
                    .await?,
                None,
            ),
            None => {
                // The same create asked again (its last made no batch): its
                // upload is reused, or deleted if the lines changed.
                let (reuse, stale) = self.kept.take(spec.tag, measured.bytes);
                if let Some(old) = stale {
                    self.delete_unused(&old).await;
                }
                let file = match reuse {
                    Some(f) => f,
                    None => self.upload(spec.tag, spec.lines, measured.bytes).await?,
                };
                let body = json!({"batch": {
                    "displayName": spec.tag,
                    "inputConfig": {"fileName": file},
                }});
                let created = self
                    .call(
                        self.client
                            .post(self.model_url(spec.model))
                            .timeout(CALL_TIMEOUT)
                            .header(reqwest::header::CONTENT_TYPE, "application/json")
                            .body(body.to_string()),
                    )
                    .await;
                match created {
                    Ok(raw) => (raw, Some(file)),
                    Err(e) => {
                        // Refused (a 4xx: the enqueued-token quota, a bad
                        // request): no batch reads the upload, which would
                        // sit in the project's storage for 48 hours. After
                        // a rate limit, a 5xx or no answer the create is
                        // asked again (or a batch may read it): kept.
                        if super::keep_upload_after(&e) {
                            self.kept.keep(spec.tag, file, measured.bytes);
                        } else {
                            self.delete_unused(&file).await;
                        }
                        return Err(e);
                    }
                }
            }
        };
        let op: Value = parse_json(&raw, "batch create")?;
        let name = op_name(&op).ok_or_else(|| {
            not_understood(
                raw.status,
                format!(
                    "batch create answer has no name; body starts {}",
                    preview(&raw.bytes)
                ),
                RateHeaders::default(),
            )
        })?;
        Ok(Submitted {
            provider_batch_id: name,
            input_file_id: file,
        })
    }

    /// `DELETE {base}/v1beta/files/{id}`: true when deleted, false when it
    /// was already gone (a 404: deleted before, or expired).
    async fn delete_file(&self, file: &str) -> Result<bool, ProviderError> {
        let id = file.strip_prefix("files/").unwrap_or(file);
        let url = format!("{}/v1beta/files/{}", self.base, crate::path_segment(id));
        match self
            .call(self.client.delete(url).timeout(CALL_TIMEOUT))
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.http_status == Some(404) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Delete an upload no batch reads; a failure is logged, not raised.
    async fn delete_unused(&self, file: &str) {
        if let Err(e) = self.delete_file(file).await {
            tracing::warn!(
                "could not delete the unused batch input file {}: {}",
                self.clean(file),
                self.scrub(e)
            );
        }
    }

    /// The input file of batch `name` (when not known, read from the batch:
    /// none for an inline batch) and, with `results`, its responses file
    /// (inline results are part of the batch: nothing to delete).
    async fn delete_files_inner(
        &self,
        name: &str,
        input: Option<&str>,
        results: Option<&BatchStatus>,
    ) -> Result<usize, ProviderError> {
        let input = match input {
            Some(f) => Some(f.to_string()),
            None => self.get_status(name).await?.input_file(),
        };
        let mut files: Vec<String> = input.into_iter().collect();
        if let Some(o) = results.and_then(|s| s.output_ref.as_ref())
            && !o.starts_with(INLINE_REF)
        {
            files.push(o.clone());
        }
        let mut n = 0;
        for f in files {
            if !f.is_empty() && self.delete_file(&f).await? {
                n += 1;
            }
        }
        Ok(n)
    }

    /// The Files API's resumable upload of `lines` (`bytes` long) as JSONL: `start`
    /// answers an upload URL, then `upload, finalize` sends the bytes,
    /// encoded a piece at a time as they are sent.
    async fn upload(
        &self,
        tag: &str,
        lines: &dyn LineSource,
        bytes: u64,
    ) -> Result<String, ProviderError> {
        let start = self
            .call(
                self.client
                    .post(format!("{}/upload/v1beta/files", self.base))
                    .timeout(CALL_TIMEOUT)
                    .header("X-Goog-Upload-Protocol", "resumable")
                    .header("X-Goog-Upload-Command", "start")
                    .header("X-Goog-Upload-Header-Content-Length", bytes)
                    .header("X-Goog-Upload-Header-Content-Type", "application/jsonl")
                    .json(&json!({"file": {"displayName": format!("docket-{tag}")}})),
            )
            .await?;
        let upload_url = start
            .headers
            .get("x-goog-upload-url")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        // The key goes with the bytes: only ever to the API's own host.
        if !upload_url.starts_with(&format!("{}/", self.base)) {
            return Err(not_understood(
                start.status,
                format!(
                    "file upload start gave no upload URL on {} (got {:?})",
                    self.base,
                    preview(upload_url.as_bytes())
                ),
                RateHeaders::default(),
            ));
        }
        let (body, produce) = streamed_body(lines, &JSONL, |l| self.encode_line(l));
        let send = self.call(
            self.client
                .post(&upload_url)
                .timeout(FILE_TIMEOUT)
                .header("X-Goog-Upload-Command", "upload, finalize")
                .header("X-Goog-Upload-Offset", "0")
                .header(reqwest::header::CONTENT_LENGTH, bytes)
                .body(body),
        );
        let (answer, ()) = futures::join!(send, produce);
        let raw = answer?;
        let v: Value = parse_json(&raw, "file upload")?;
        let file = v.get("file").unwrap_or(&v);
        file.get("name")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .ok_or_else(|| {
                not_understood(
                    raw.status,
                    format!(
                        "file upload answer has no file name; body starts {}",
                        preview(&raw.bytes)
                    ),
                    RateHeaders::default(),
                )
            })
    }

    fn status_of(&self, o: &OpStatus) -> Result<BatchStatus, ProviderError> {
        let name = o.name().unwrap_or_default();
        let state = match o.state().as_deref() {
            Some("PENDING" | "QUEUED") => BatchState::Validating,
            Some("RUNNING" | "UPDATING" | "PAUSED") => BatchState::InProgress,
            Some("CANCELLING") => BatchState::Cancelling,
            Some("SUCCEEDED" | "PARTIALLY_SUCCEEDED") => BatchState::Completed,
            Some("FAILED") => BatchState::Failed(self.clean(&o.failure())),
            Some("CANCELLED") => BatchState::Cancelled,
            Some("EXPIRED") => BatchState::Expired,
            // No state: the operation's own `done` / `error` say it.
            None | Some("UNSPECIFIED") if o.done() => match o.error() {
                Some(_) => BatchState::Failed(self.clean(&o.failure())),
                None => BatchState::Completed,
            },
            None | Some("UNSPECIFIED") => BatchState::Validating,
            Some(other) => {
                return Err(not_understood(
                    200,
                    format!(
                        "batch {name} has an unknown state {:?}",
                        docket_model::sanitize::for_terminal(other)
                    ),
                    RateHeaders::default(),
                ));
            }
        };
        let counts = o.counts();
        let output_ref = match o.output() {
            Output::Inline => Some(format!("{INLINE_REF}{name}")),
            Output::File(f) => Some(f),
            Output::None => None,
        };
        // Succeeded with no results to be found yet: they arrive after the
        // state changes. Poll again rather than ingest nothing, unless the
        // counts are there and say there is nothing (`batchStats` is
        // optional). (Expired jobs may have no results at all: never waited on.)
        let counted = o
            .has_counts()
            .then(|| counts.completed.saturating_add(counts.failed));
        let results_pending =
            state == BatchState::Completed && output_ref.is_none() && counted != Some(0);
        Ok(BatchStatus {
            provider_batch_id: name,
            state,
            counts,
            output_ref,
            error_ref: None,
            results_pending,
        })
    }

    async fn results_inner(
        &self,
        status: &BatchStatus,
        expected: &HashSet<String>,
        sink: &mut dyn ResultSink,
    ) -> Result<ResultsSummary, ProviderError> {
        let mut m = Matcher::new(expected, sink, "key");
        match &status.output_ref {
            // No results (an expired or cancelled job may have none):
            // `finish` accounts for every request.
            None => {}
            Some(output) => match output.strip_prefix(INLINE_REF) {
                Some(name) => {
                    let op = self.get_op(name).await?;
                    for (i, item) in OpView::new(&op).inline_items().iter().enumerate() {
                        self.item(&mut m, item, &format!("inline result {}", i + 1));
                    }
                }
                None => {
                    let end = self.stream_file(output, &mut m).await;
                    http::settle(&mut m, end, &status.provider_batch_id, |e| self.scrub(e))?;
                }
            },
        }
        Ok(m.finish(&status.state))
    }

    /// Stream the responses file into `m`.
    async fn stream_file<'a>(
        &self,
        file: &str,
        m: &mut Matcher<'a>,
    ) -> Result<StreamEnd, ProviderError> {
        let authed = self.authed(
            self.client
                .get(self.download_url(file))
                .timeout(FILE_TIMEOUT),
        )?;
        WIRE.stream(authed, "responses file line", m, |m, raw, at| {
            self.raw_line(m, raw, at)
        })
        .await
    }

    /// A line of the responses file.
    pub(crate) fn raw_line(&self, m: &mut Matcher<'_>, raw: &[u8], at: &str) {
        if let Some(item) = parse_line::<ResultItem>(m, raw, at, Some(&self.key)) {
            self.apply(m, item, at);
        }
    }

    /// An entry of `inlinedResponses`.
    fn item(&self, m: &mut Matcher<'_>, v: &Value, at: &str) {
        match ResultItem::deserialize(v) {
            Ok(item) => self.apply(m, item, at),
            Err(e) => m.unreadable(format!("{at}: not a result ({e})")),
        }
    }

    fn apply(&self, m: &mut Matcher<'_>, item: ResultItem, at: &str) {
        let key = item.key.clone().or_else(|| {
            item.metadata
                .as_ref()
                .and_then(|m| m.get("key"))
                .and_then(Value::as_str)
                .map(str::to_string)
        });
        m.entry(at, key, || match (item.response, item.error) {
            (Some(r), _) => Ok(self.response_outcome(&r)),
            (None, Some(e)) => Ok(self.error_outcome(&e)),
            (None, None) => Err("neither response nor error".into()),
        });
    }

    fn response_outcome(&self, r: &Value) -> LineOutcome {
        let bytes = serde_json::to_vec(r).unwrap_or_default();
        match parse_success(&bytes, RateHeaders::default(), 200) {
            Ok(answer) => LineOutcome::Answer(answer),
            Err(e) => LineOutcome::Error(self.scrub(e)),
        }
    }

    fn error_outcome(&self, e: &Value) -> LineOutcome {
        let code = e.get("code").and_then(Value::as_i64).unwrap_or(13);
        let http = http_of_code(code);
        let status = e
            .get("status")
            .and_then(Value::as_str)
            .unwrap_or_else(|| rpc_status_name(http));
        let message = e.get("message").and_then(Value::as_str).unwrap_or("");
        let body = json!({"error": {
            "code": http,
            "message": message,
            "status": status,
            "details": e.get("details").cloned().unwrap_or(json!([])),
        }});
        let err = classify_error(http, body.to_string().as_bytes(), RateHeaders::default());
        // Never run: cancelled or expired before its turn.
        if status == "CANCELLED" || message.to_ascii_lowercase().contains("expired") {
            return LineOutcome::NotRun(self.clean(&err.message));
        }
        LineOutcome::Error(self.scrub(err))
    }

    async fn poll_inner(&self, provider_batch_id: &str) -> Result<BatchStatus, ProviderError> {
        self.get_status(provider_batch_id)
            .await
            .and_then(|op| self.status_of(&op))
    }

    async fn cancel_inner(&self, name: &str) -> Result<BatchStatus, ProviderError> {
        let sent = self
            .call(
                self.client
                    .post(self.batch_url(name, ":cancel"))
                    .timeout(CALL_TIMEOUT)
                    .header(reqwest::header::CONTENT_LENGTH, 0),
            )
            .await;
        match sent {
            Ok(_) => {
                let mut s = self.status_of(&self.get_status(name).await?)?;
                // Accepted; the Developer API has no cancelling state, so a
                // batch still running is reported as on its way out.
                if !s.state.is_terminal() {
                    s.state = BatchState::Cancelling;
                }
                Ok(s)
            }
            // Already finished: the answer is where the batch is now.
            Err(e) => http::cancel_refused(e, self.poll_inner(name), BatchState::is_terminal).await,
        }
    }

    async fn find_inner(
        &self,
        tag: &str,
        created_after: f64,
        request_count: usize,
    ) -> Result<Found, ProviderError> {
        let since = created_after - FIND_CLOCK_MARGIN;
        let (mut exact, mut tag_only) = (Vec::new(), Vec::new());
        let mut token: Option<String> = None;
        for _ in 0..MAX_LIST_PAGES {
            let mut url = format!("{}/v1beta/batches?pageSize=100", self.base);
            if let Some(t) = &token {
                url.push_str("&pageToken=");
                url.push_str(&crate::path_segment(t));
            }
            let raw = self
                .call(self.client.get(url).timeout(CALL_TIMEOUT))
                .await?;
            let page: Value = parse_json(&raw, "batch list")?;
            let ops = page
                .get("operations")
                .or_else(|| page.get("batches"))
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or_default();
            matches(ops, tag, since, request_count, &mut exact, &mut tag_only);
            token = page
                .get("nextPageToken")
                .and_then(Value::as_str)
                .filter(|t| !t.is_empty())
                .map(str::to_string);
            if token.is_none() {
                return Ok(verdict(exact, tag_only));
            }
        }
        Err(request_error(format!(
            "listed {MAX_LIST_PAGES} pages of batches without reaching the end; \
             cannot tell whether {tag:?} was created"
        )))
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

/// The first of `keys` present (camelCase, then the proto snake_case).
fn field<'v>(v: &'v Value, keys: &[&str]) -> Option<&'v Value> {
    keys.iter().find_map(|k| v.get(*k)).filter(|x| !x.is_null())
}

/// An int64 in proto JSON: a string, or a number.
fn int64(v: Option<&Value>) -> u64 {
    match v {
        Some(Value::String(s)) => s.trim().parse().unwrap_or(0),
        Some(Value::Number(n)) => n.as_u64().unwrap_or(0),
        _ => 0,
    }
}

fn op_name(op: &Value) -> Option<String> {
    op.get("name")
        .and_then(Value::as_str)
        .or_else(|| {
            op.get("metadata")
                .and_then(|m| m.get("name"))
                .and_then(Value::as_str)
        })
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

enum Output {
    None,
    Inline,
    File(String),
}

/// An Operation (or a bare GenerateContentBatch) read leniently.
struct OpView<'v> {
    op: &'v Value,
    /// `metadata` of an Operation, or the batch resource itself.
    batch: &'v Value,
}

impl<'v> OpView<'v> {
    fn new(op: &'v Value) -> Self {
        let batch = op.get("metadata").filter(|m| m.is_object()).unwrap_or(op);
        OpView { op, batch }
    }

    /// Where the results are, in the reference's order: `response` inline,
    /// `metadata.output` inline, `response` file, `metadata.output` file.
    fn places(&self) -> [Option<&'v Value>; 2] {
        [
            field(self.op, &["response"]),
            field(self.batch, &["output"]),
        ]
    }

    fn inline(place: &'v Value) -> Option<&'v Vec<Value>> {
        let outer = field(place, &["inlinedResponses", "inlined_responses"])?;
        match outer {
            Value::Array(a) => Some(a),
            o => field(o, &["inlinedResponses", "inlined_responses"])?.as_array(),
        }
    }

    fn inline_items(&self) -> &'v [Value] {
        self.places()
            .into_iter()
            .flatten()
            .find_map(Self::inline)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }
}

/// What a poll reads of an Operation, of its `metadata` (the batch
/// resource), or of a bare batch resource. Every other field is skipped
/// unread (serde builds nothing of it), above all the inline results, which
/// are read only by `results`. Each field is read as leniently as
/// `field` reads a `Value`.
#[derive(Deserialize, Default)]
#[serde(default)]
struct OpStatus {
    name: Loose<IgnoredAny>,
    done: Loose<IgnoredAny>,
    error: Option<Value>,
    state: Loose<IgnoredAny>,
    #[serde(rename = "batchStats")]
    stats: Loose<Stats>,
    #[serde(rename = "batch_stats")]
    stats_snake: Loose<Stats>,
    response: Loose<Place>,
    output: Loose<Place>,
    metadata: Loose<Box<OpStatus>>,
    #[serde(rename = "inputConfig")]
    input: Loose<InputConfig>,
    #[serde(rename = "input_config")]
    input_snake: Loose<InputConfig>,
}

/// `inputConfig`: the uploaded file a batch reads, when it reads one.
#[derive(Deserialize, Default)]
#[serde(default)]
struct InputConfig {
    #[serde(rename = "fileName")]
    file: Loose<IgnoredAny>,
    #[serde(rename = "file_name")]
    file_snake: Loose<IgnoredAny>,
}

/// `batchStats`, its int64 counts as strings or numbers.
#[derive(Deserialize, Default)]
#[serde(default)]
struct Stats {
    #[serde(rename = "requestCount")]
    total: Loose<IgnoredAny>,
    #[serde(rename = "request_count")]
    total_snake: Loose<IgnoredAny>,
    #[serde(rename = "successfulRequestCount")]
    completed: Loose<IgnoredAny>,
    #[serde(rename = "successful_request_count")]
    completed_snake: Loose<IgnoredAny>,
    #[serde(rename = "failedRequestCount")]
    failed: Loose<IgnoredAny>,
    #[serde(rename = "failed_request_count")]
    failed_snake: Loose<IgnoredAny>,
}

/// Where results may be (`response`, `metadata.output`): whether there are
/// inline results (never what they are), or the responses file's name.
#[derive(Deserialize, Default)]
#[serde(default)]
struct Place {
    #[serde(rename = "inlinedResponses")]
    inlined: Loose<Inlined>,
    #[serde(rename = "inlined_responses")]
    inlined_snake: Loose<Inlined>,
    #[serde(rename = "responsesFile")]
    file: Loose<IgnoredAny>,
    #[serde(rename = "responses_file")]
    file_snake: Loose<IgnoredAny>,
}

/// `inlinedResponses` as an object holding the array.
#[derive(Deserialize, Default)]
#[serde(default)]
struct Inlined {
    #[serde(rename = "inlinedResponses")]
    inlined: Loose<IgnoredAny>,
    #[serde(rename = "inlined_responses")]
    inlined_snake: Loose<IgnoredAny>,
}

impl OpStatus {
    /// `metadata` of an Operation, or the batch resource itself.
    fn batch(&self) -> &OpStatus {
        match &self.metadata {
            Loose::Obj(m) => m,
            _ => self,
        }
    }

    /// `name`, or `metadata.name` (as `op_name` reads them).
    fn name(&self) -> Option<String> {
        self.name
            .as_str()
            .or_else(|| self.metadata.as_obj().and_then(|m| m.name.as_str()))
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    }

    /// The state without its `BATCH_STATE_` / `JOB_STATE_` prefix.
    fn state(&self) -> Option<String> {
        let s = first(&[&self.batch().state])?.as_str()?;
        let s = s
            .strip_prefix("BATCH_STATE_")
            .or_else(|| s.strip_prefix("JOB_STATE_"))
            .unwrap_or(s);
        Some(s.to_ascii_uppercase())
    }

    fn done(&self) -> bool {
        matches!(self.done, Loose::Bool(true))
    }

    fn error(&self) -> Option<&Value> {
        self.error.as_ref().or(self.batch().error.as_ref())
    }

    fn failure(&self) -> String {
        match self.error() {
            Some(e) => {
                let msg = e
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("(no message)");
                let code = e.get("code").map(Value::to_string).unwrap_or_default();
                docket_model::sanitize::for_terminal(&format!("{msg} [code {code}]"))
            }
            None => "the batch failed (no error given)".into(),
        }
    }

    /// The input file the batch reads (None: its requests were inline).
    fn input_file(&self) -> Option<String> {
        let b = self.batch();
        let Some(Loose::Obj(c)) = first(&[&b.input, &b.input_snake]) else {
            return None;
        };
        first(&[&c.file, &c.file_snake])
            .and_then(Loose::as_str)
            .filter(|f| !f.is_empty())
            .map(str::to_string)
    }

    fn stats(&self) -> Option<&Loose<Stats>> {
        let b = self.batch();
        first(&[&b.stats, &b.stats_snake])
    }

    /// `batchStats` is there (proto JSON leaves out zero counts inside it).
    fn has_counts(&self) -> bool {
        matches!(self.stats(), Some(Loose::Obj(_)))
    }

    fn counts(&self) -> BatchCounts {
        let Some(Loose::Obj(s)) = self.stats() else {
            return BatchCounts::default();
        };
        BatchCounts {
            total: count(first(&[&s.total, &s.total_snake])),
            completed: count(first(&[&s.completed, &s.completed_snake])),
            failed: count(first(&[&s.failed, &s.failed_snake])),
        }
    }

    /// Where the results are, in the reference's order: `response` inline,
    /// `metadata.output` inline, `response` file, `metadata.output` file.
    fn output(&self) -> Output {
        let places = [self.response.as_obj(), self.batch().output.as_obj()];
        if places.iter().flatten().any(|p| p.inline()) {
            return Output::Inline;
        }
        for p in places.iter().flatten() {
            if let Some(f) = first(&[&p.file, &p.file_snake])
                .and_then(Loose::as_str)
                .filter(|f| !f.is_empty())
            {
                return Output::File(f.to_string());
            }
        }
        Output::None
    }
}

impl Place {
    /// `inlinedResponses` is an array, or an object holding one.
    fn inline(&self) -> bool {
        match first(&[&self.inlined, &self.inlined_snake]) {
            Some(Loose::Array) => true,
            Some(Loose::Obj(o)) => {
                matches!(first(&[&o.inlined, &o.inlined_snake]), Some(Loose::Array))
            }
            _ => false,
        }
    }
}

/// An int64 in proto JSON: a string, or a number (as `int64` reads it).
fn count(v: Option<&Loose<IgnoredAny>>) -> u64 {
    match v {
        Some(Loose::Str(s)) => s.trim().parse().unwrap_or(0),
        Some(Loose::Num(n)) => n.unwrap_or(0),
        _ => 0,
    }
}

/// The first of `keys` present, unless it is null (as `field` reads a
/// `Value`).
fn first<'l, T>(keys: &[&'l Loose<T>]) -> Option<&'l Loose<T>> {
    keys.iter()
        .copied()
        .find(|k| !matches!(k, Loose::Absent))
        .filter(|k| !matches!(k, Loose::Null))
}

/// A JSON value read only as far as a poll needs: a scalar kept, an object
/// read as `T` (which skips the fields it does not name), an array's items
/// skipped unread.
#[derive(Default)]
enum Loose<T> {
    #[default]
    Absent,
    Null,
    Bool(bool),
    Str(String),
    /// A number as `Value::as_u64` reads it.
    Num(Option<u64>),
    Array,
    Obj(T),
}

impl<T> Loose<T> {
    fn as_str(&self) -> Option<&str> {
        match self {
            Loose::Str(s) => Some(s),
            _ => None,
        }
    }

    fn as_obj(&self) -> Option<&T> {
        match self {
            Loose::Obj(o) => Some(o),
            _ => None,
        }
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Loose<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);

        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Loose<T>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }

            fn visit_unit<E>(self) -> Result<Loose<T>, E> {
                Ok(Loose::Null)
            }

            fn visit_none<E>(self) -> Result<Loose<T>, E> {
                Ok(Loose::Null)
            }

            fn visit_bool<E>(self, v: bool) -> Result<Loose<T>, E> {
                Ok(Loose::Bool(v))
            }

            fn visit_u64<E>(self, v: u64) -> Result<Loose<T>, E> {
                Ok(Loose::Num(Some(v)))
            }

            fn visit_i64<E>(self, v: i64) -> Result<Loose<T>, E> {
                Ok(Loose::Num(u64::try_from(v).ok()))
            }

            fn visit_f64<E>(self, _: f64) -> Result<Loose<T>, E> {
                Ok(Loose::Num(None))
            }

            fn visit_str<E>(self, v: &str) -> Result<Loose<T>, E> {
                Ok(Loose::Str(v.to_string()))
            }

            fn visit_string<E>(self, v: String) -> Result<Loose<T>, E> {
                Ok(Loose::Str(v))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Loose<T>, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Loose::Array)
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Loose<T>, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map)).map(Loose::Obj)
            }
        }

        d.deserialize_any(V(PhantomData))
    }
}

/// The inline create body up to its first item:
/// `{"batch":{"displayName":` + the tag + `,"inputConfig":{"requests":{"requests":[`.
fn inline_open(tag: &str) -> Vec<u8> {
    let mut open = br#"{"batch":{"displayName":"#.to_vec();
    open.extend_from_slice(Value::from(tag).to_string().as_bytes());
    open.extend_from_slice(br#","inputConfig":{"requests":{"requests":["#);
    open
}

/// Batches of a list page named `tag` (created at or after `created_after`
/// when their `createTime` says): with `request_count` requests (or no
/// count yet) into `exact`, with another count into `tag_only`.
fn matches(
    ops: &[Value],
    tag: &str,
    created_after: f64,
    request_count: usize,
    exact: &mut Vec<String>,
    tag_only: &mut Vec<String>,
) {
    for op in ops {
        let o = OpView::new(op);
        if field(o.batch, &["displayName", "display_name"]).and_then(Value::as_str) != Some(tag) {
            continue;
        }
        let created = field(o.batch, &["createTime", "create_time"])
            .and_then(Value::as_str)
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.timestamp_micros() as f64 / 1e6);
        if created.is_some_and(|t| t < created_after) {
            continue;
        }
        let Some(name) = op_name(op) else { continue };
        let count = field(o.batch, &["batchStats", "batch_stats"])
            .and_then(|s| field(s, &["requestCount", "request_count"]));
        if count.is_none() || int64(count) == request_count as u64 {
            exact.push(name);
        } else {
            tag_only.push(name);
        }
    }
}

/// One exact match is ours; none at all is safe to submit; anything else
/// cannot be told apart.
fn verdict(exact: Vec<String>, tag_only: Vec<String>) -> Found {
    super::verdict(exact, tag_only, Vec::new())
}

/// One result, inline or a file line.
#[derive(Deserialize)]
struct ResultItem {
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    metadata: Option<Value>,
    #[serde(default)]
    response: Option<Value>,
    #[serde(default)]
    error: Option<Value>,
}

/// A google.rpc canonical code as the HTTP status Google maps it to.
fn http_of_code(code: i64) -> u16 {
    match code {
        100..=599 => code as u16,
        1 => 499,
        3 | 9 | 11 => 400,
        4 => 504,
        5 => 404,
        6 | 10 => 409,
        7 => 403,
        8 => 429,
        12 => 501,
        14 => 503,
        16 => 401,
        _ => 500,
    }
}

fn rpc_status_name(http: u16) -> &'static str {
    match http {
        400 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        409 => "ABORTED",
        429 => "RESOURCE_EXHAUSTED",
        499 => "CANCELLED",
        501 => "UNIMPLEMENTED",
        503 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        _ => "INTERNAL",
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::ResultLine;
    use crate::{ChatRequest, ErrorClass, FinishReason};

    fn adapter() -> GeminiBatch {
        GeminiBatch::new(
            "https://generativelanguage.googleapis.com/v1beta/",
            ApiKey::new("AIzaCanaryUnit"),
        )
        .unwrap()
    }

    fn status(op: &str) -> BatchStatus {
        adapter()
            .status_of(&serde_json::from_str(op).unwrap())
            .unwrap()
    }

    fn line(id: &str) -> BatchLine {
        BatchLine {
            custom_id: id.into(),
            request: ChatRequest {
                model: "gemini-2.5-flash".into(),
                system: None,
                user: "…".into(),
                max_tokens: 50,
                temperature: Some(0.0),
                response_schema: None,
                client_request_id: id.into(),
                timeout: Duration::from_secs(5),
            },
        }
    }

    // The reference's poll response (an Operation), in a given state.
    fn op(state: &str, extra: &str) -> String {
        format!(
            r#"{{"name": "batches/123456789",
             "metadata": {{"@type": "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch",
                          "model": "models/gemini-2.5-flash", "displayName": "job-42", "state": "{state}",
                          "createTime": "2025-07-01T10:00:00.123456Z", "updateTime": "2025-07-01T10:05:00Z",
                          "batchStats": {{"requestCount": "2", "successfulRequestCount": "1", "failedRequestCount": "1", "pendingRequestCount": "0"}}}}
             {extra}}}"#
        )
    }

    #[test]
    fn both_state_prefixes_map_to_states() {
        for (state, want) in [
            ("BATCH_STATE_PENDING", BatchState::Validating),
            ("BATCH_STATE_RUNNING", BatchState::InProgress),
            ("JOB_STATE_RUNNING", BatchState::InProgress),
            ("JOB_STATE_QUEUED", BatchState::Validating),
            ("JOB_STATE_CANCELLING", BatchState::Cancelling),
            ("BATCH_STATE_CANCELLED", BatchState::Cancelled),
            ("JOB_STATE_EXPIRED", BatchState::Expired),
        ] {
            let s = status(&op(state, ""));
            assert_eq!(s.state, want, "{state}");
            assert_eq!(s.provider_batch_id, "batches/123456789");
            assert_eq!(
                s.counts,
                BatchCounts {
                    total: 2,
                    completed: 1,
                    failed: 1
                }
            );
            assert!(!s.results_pending, "{state}");
        }
        let e = adapter()
            .status_of(&serde_json::from_str(&op("BATCH_STATE_WEIRD", "")).unwrap())
            .unwrap_err();
        assert_eq!(e.class, ErrorClass::Transient);
        // Counts as numbers too.
        let s = status(
            r#"{"name":"batches/1","metadata":{"state":"BATCH_STATE_RUNNING","batchStats":{"requestCount":5,"successfulRequestCount":2}}}"#,
        );
        assert_eq!((s.counts.total, s.counts.completed), (5, 2));
    }

    #[test]
    fn results_are_found_where_the_reference_says() {
        let inline = r#","done": true, "response": {"@type": "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatchOutput",
            "inlinedResponses": {"inlinedResponses": [{"metadata": {"key": "item-000123"}, "response": {"candidates": []}}]}}"#;
        let s = status(&op("BATCH_STATE_SUCCEEDED", inline));
        assert_eq!(s.state, BatchState::Completed);
        assert_eq!(s.output_ref.as_deref(), Some("inline:batches/123456789"));
        assert!(!s.results_pending);
        let file = r#","done": true, "response": {"responsesFile": "files/abc123"}"#;
        let s = status(&op("JOB_STATE_SUCCEEDED", file));
        assert_eq!(s.output_ref.as_deref(), Some("files/abc123"));
        // Only under metadata.output (the SDK's reading).
        let s = status(
            r#"{"name":"batches/9","metadata":{"state":"BATCH_STATE_SUCCEEDED","output":{"responsesFile":"files/xyz"}},"done":true}"#,
        );
        assert_eq!(s.output_ref.as_deref(), Some("files/xyz"));
        // Succeeded with counted results and none to be found: wait.
        let s = status(&op("BATCH_STATE_SUCCEEDED", ""));
        assert!(s.results_pending);
        // Expired with nothing: the docs say no results, so nothing to wait for.
        let s = status(&op("BATCH_STATE_EXPIRED", r#","done": true"#));
        assert!(!s.results_pending && s.output_ref.is_none());
        // batchStats is optional: succeeded without it may still have results.
        let s = status(
            r#"{"name":"batches/7","metadata":{"state":"BATCH_STATE_SUCCEEDED"},"done":true}"#,
        );
        assert!(s.results_pending);
        // Present, and zero (proto JSON leaves zero counts out): nothing to wait for.
        let s = status(
            r#"{"name":"batches/7","metadata":{"state":"BATCH_STATE_SUCCEEDED","batchStats":{"requestCount":"0"}},"done":true}"#,
        );
        assert!(!s.results_pending);
        // Counts that would wrap a u64 do not read as zero.
        let s = status(
            r#"{"name":"batches/7","metadata":{"state":"BATCH_STATE_SUCCEEDED","batchStats":{"successfulRequestCount":"18446744073709551615","failedRequestCount":"1"}},"done":true}"#,
        );
        assert!(s.results_pending);
    }

    #[test]
    fn a_failed_operation_says_why_without_the_key() {
        let s = status(&op(
            "BATCH_STATE_FAILED",
            r#","done": true, "error": {"code": 3, "message": "Invalid JSON in input file at line 7 AIzaCanaryUnit"}"#,
        ));
        let BatchState::Failed(why) = &s.state else {
            panic!("{:?}", s.state)
        };
        assert!(why.contains("line 7") && why.contains("code 3"), "{why}");
        assert!(!why.contains("AIzaCanaryUnit"), "{why}");
        let s = status(r#"{"name":"batches/2","done":true,"error":{"code":13,"message":"boom"}}"#);
        assert!(matches!(s.state, BatchState::Failed(_)));
    }

    #[test]
    fn requests_are_the_sync_body_under_the_batch_envelopes() {
        let l = line("item-000123");
        let v: Value = serde_json::from_slice(&adapter().encode_line(&l).unwrap()).unwrap();
        assert_eq!(
            v,
            json!({"key": "item-000123", "request": request_body(&l.request)})
        );
        assert_eq!(
            GeminiBatch::inline_item(&l),
            json!({"request": request_body(&l.request), "metadata": {"key": "item-000123"}})
        );
        let lines = [line("a"), line("b")];
        let chunks = adapter().split(&lines).unwrap();
        let body: Value =
            serde_json::from_slice(&adapter().inline_body("job-42", &chunks[0]).unwrap()).unwrap();
        assert_eq!(body["batch"]["displayName"], "job-42");
        assert_eq!(
            body["batch"]["inputConfig"]["requests"]["requests"][1]["metadata"]["key"],
            "b"
        );
        assert!(
            adapter()
                .with_inline_limit(100)
                .inline_body("job-42", &chunks[0])
                .is_none()
        );
    }

    #[test]
    fn the_streamed_inline_body_is_the_whole_body_it_replaced() {
        let lines = [line("a"), line("b-2"), line("c_3")];
        let chunks = adapter().split(&lines).unwrap();
        for tag in ["job-42", "a \"quoted\" tag \\ é ✓"] {
            let body = adapter().inline_body(tag, &chunks[0]).unwrap();
            let items: Vec<Value> = lines.iter().map(GeminiBatch::inline_item).collect();
            let want = json!({"batch": {
                "displayName": tag,
                "inputConfig": {"requests": {"requests": items}},
            }});
            assert_eq!(serde_json::from_slice::<Value>(&body).unwrap(), want);
            // The limit is the exact length.
            let len = body.len() as u64;
            let a = adapter().with_inline_limit(len);
            assert_eq!(
                a.inline_body(tag, &chunks[0]).map(|b| b.len()),
                Some(body.len())
            );
            assert!(
                adapter()
                    .with_inline_limit(len - 1)
                    .inline_body(tag, &chunks[0])
                    .is_none()
            );
        }
    }

    #[test]
    fn a_poll_reads_as_leniently_as_a_value_and_skips_the_results() {
        // A bare batch resource (no metadata object): its own fields.
        let s = status(
            r#"{"name":"batches/5","metadata":"x","state":"BATCH_STATE_SUCCEEDED","done":"true",
                "batch_stats":{"request_count":3,"successful_request_count":"2","failed_request_count":-1},
                "output":{"responses_file":"files/f"}}"#,
        );
        assert_eq!(s.provider_batch_id, "batches/5");
        assert_eq!(s.state, BatchState::Completed);
        assert_eq!(
            (s.counts.total, s.counts.completed, s.counts.failed),
            (3, 2, 0)
        );
        assert_eq!(s.output_ref.as_deref(), Some("files/f"));
        // A null camelCase field hides its snake_case twin, as `field` does.
        let s = status(
            r#"{"name":"batches/6","metadata":{"state":"SUCCEEDED","batchStats":null,"batch_stats":{"requestCount":"4"}},
                "response":{"responsesFile":null,"responses_file":"files/g","inlinedResponses":{"inlined_responses":[]}}}"#,
        );
        assert!(!s.results_pending);
        assert_eq!(s.output_ref.as_deref(), Some("inline:batches/6"));
        // The name falls back to metadata.name; a wrong-typed field is absent.
        let s = status(
            r#"{"metadata":{"name":"batches/8","state":7,"batchStats":[1]},"done":true,"error":"boom",
                "response":{"inlinedResponses":{"inlinedResponses":[{"metadata":{"key":"k"},"response":{"x":[1,{"y":null}]}}]}}}"#,
        );
        assert_eq!(s.provider_batch_id, "batches/8");
        assert!(matches!(&s.state, BatchState::Failed(w) if w.contains("(no message)")));
        assert_eq!(s.counts, BatchCounts::default());
        assert_eq!(s.output_ref.as_deref(), Some("inline:batches/8"));
    }

    #[test]
    fn urls_never_hold_the_key() {
        let a = adapter();
        let urls = [
            a.model_url("models/gemini-2.5-flash"),
            a.batch_url("batches/123", ""),
            a.batch_url("123", ":cancel"),
            a.download_url("files/abc"),
        ];
        assert_eq!(
            urls,
            [
                "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:batchGenerateContent",
                "https://generativelanguage.googleapis.com/v1beta/batches/123",
                "https://generativelanguage.googleapis.com/v1beta/batches/123:cancel",
                "https://generativelanguage.googleapis.com/download/v1beta/files/abc:download?alt=media",
            ]
        );
        assert!(
            urls.iter()
                .all(|u| !u.contains("key=") && !u.contains("AIza"))
        );
        assert_eq!(a.limits().max_bytes, 2_000_000_000);
        assert_eq!(INLINE_LIMIT, 20_000_000);
    }

    fn ingest(items: &[&str], expected: &[&str]) -> (Vec<ResultLine>, ResultsSummary) {
        let a = adapter();
        let expected: HashSet<String> = expected.iter().map(|s| s.to_string()).collect();
        let mut got = Vec::new();
        let mut sink = |l: ResultLine| got.push(l);
        let mut m = Matcher::new(&expected, &mut sink, "key");
        for (i, l) in items.iter().enumerate() {
            a.raw_line(
                &mut m,
                l.as_bytes(),
                &format!("responses file line {}", i + 1),
            );
        }
        let summary = m.finish(&BatchState::InProgress);
        (got, summary)
    }

    const OK: &str = r#"{"key": "item-1", "response": {"candidates": [{"content": {"role": "model", "parts": [{"text": "{\"a\":1}"}]}, "finishReason": "STOP", "index": 0}], "usageMetadata": {"promptTokenCount": 50, "candidatesTokenCount": 20, "totalTokenCount": 70}, "modelVersion": "gemini-2.5-flash", "responseId": "r1"}}"#;
    const INLINE_OK: &str = r#"{"metadata": {"key": "item-2"}, "response": {"candidates": [{"content": {"role": "model", "parts": [{"text": "x"}]}, "finishReason": "MAX_TOKENS", "index": 0}]}}"#;
    const BAD: &str = r#"{"key": "item-3", "error": {"code": 3, "message": "* GenerateContentRequest.contents: contents is not specified"}}"#;
    const INTERNAL: &str = r#"{"metadata": {"key": "item-4"}, "error": {"code": 500, "message": "internal", "status": "INTERNAL"}}"#;
    const CANCELLED: &str =
        r#"{"key": "item-5", "error": {"code": 1, "message": "cancelled before it ran"}}"#;

    #[test]
    fn result_items_become_answers_errors_and_not_run() {
        let (got, s) = ingest(
            &[OK, INLINE_OK, BAD, INTERNAL, CANCELLED],
            &["item-1", "item-2", "item-3", "item-4", "item-5"],
        );
        assert_eq!((s.lines, s.delivered), (5, 5));
        assert!(s.quarantined.is_empty());
        let LineOutcome::Answer(a) = &got[0].outcome else {
            panic!("{:?}", got[0])
        };
        assert_eq!(a.content.as_deref(), Some("{\"a\":1}"));
        assert_eq!(a.usage.unwrap().input_tokens, 50);
        let LineOutcome::Answer(a) = &got[1].outcome else {
            panic!("{:?}", got[1])
        };
        assert_eq!(a.finish_reason, FinishReason::Length);
        let LineOutcome::Error(e) = &got[2].outcome else {
            panic!("{:?}", got[2])
        };
        assert_eq!((e.class, e.http_status), (ErrorClass::Request, Some(400)));
        assert!(e.message.contains("INVALID_ARGUMENT"), "{e}");
        let LineOutcome::Error(e) = &got[3].outcome else {
            panic!("{:?}", got[3])
        };
        assert_eq!(e.class, ErrorClass::Transient);
        assert!(matches!(got[4].outcome, LineOutcome::NotRun(_)));
    }

    #[test]
    fn unknown_duplicate_and_garbage_are_quarantined() {
        let (got, s) = ingest(
            &[
                OK,
                OK,
                BAD,
                "{\"key\":\"item-1\",\"resp",
                r#"{"response":{}}"#,
                r#"{"key":"item-1"}"#,
            ],
            &["item-1"],
        );
        assert_eq!(got.len(), 1);
        let q: Vec<(u64, Option<&str>)> = s
            .quarantined
            .iter()
            .map(|q| (q.line, q.custom_id.as_deref()))
            .collect();
        assert_eq!(
            q,
            vec![
                (2, Some("item-1")),
                (3, Some("item-3")),
                (4, None),
                (5, None),
                (6, Some("item-1"))
            ]
        );
        assert!(s.quarantined[0].reason.contains("second result"));
        assert!(s.quarantined[1].reason.contains("unknown key"));
    }

    #[test]
    fn find_matches_the_display_name_and_count() {
        let page: Value = serde_json::from_str(
            r#"{"operations": [
              {"name": "batches/3", "metadata": {"displayName": "b-42", "createTime": "2025-07-01T10:00:00Z", "batchStats": {"requestCount": "10"}}},
              {"name": "batches/2", "metadata": {"displayName": "b-41", "createTime": "2025-07-01T10:00:00Z", "batchStats": {"requestCount": "10"}}},
              {"name": "batches/1", "metadata": {"displayName": "b-42", "createTime": "2025-06-01T10:00:00Z", "batchStats": {"requestCount": "10"}}}
            ], "nextPageToken": ""}"#,
        )
        .unwrap();
        let ops = page["operations"].as_array().unwrap();
        let run = |tag: &str, after: f64, n: usize| {
            let (mut exact, mut tag_only) = (Vec::new(), Vec::new());
            matches(ops, tag, after, n, &mut exact, &mut tag_only);
            verdict(exact, tag_only)
        };
        let july = 1_751_000_000.0; // 2025-06-27
        assert_eq!(run("b-42", july, 10), Found::One("batches/3".into()));
        assert_eq!(
            run("b-42", 0.0, 10),
            Found::Ambiguous(vec!["batches/3".into(), "batches/1".into()])
        );
        assert_eq!(run("b-43", 0.0, 10), Found::None);
        assert_eq!(
            run("b-42", july, 11),
            Found::Ambiguous(vec!["batches/3".into()])
        );
    }

    #[test]
    fn cadence_follows_the_plan_for_gemini() {
        let c = PollCadence::STANDARD;
        let min = |m: u64| Duration::from_secs(60 * m);
        assert_eq!(
            c.after(&BatchState::Validating, min(0)),
            Duration::from_secs(120)
        );
        assert_eq!(
            c.after(&BatchState::InProgress, min(19)),
            Duration::from_secs(120)
        );
        assert_eq!(
            c.after(&BatchState::InProgress, min(21)),
            Duration::from_secs(300)
        );
        assert_eq!(
            c.after(&BatchState::Cancelling, min(60)),
            Duration::from_secs(120)
        );
        let f = PollCadence::fast();
        assert_eq!(f.quick, Duration::from_millis(120));
        assert_eq!(
            adapter()
                .with_cadence(f)
                .poll_after(&BatchState::InProgress, Duration::from_secs(2)),
            Duration::from_millis(300)
        );
    }
}
