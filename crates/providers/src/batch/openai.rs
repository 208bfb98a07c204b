//! OpenAI's Batch API (Files + `/batches`), and Azure OpenAI's, which is the
//! same API under Azure's URLs and auth.
//!
//! - submit: `POST {base}/files` (multipart, `purpose=batch`, the JSONL
//!   streamed from the lines, never held whole), then `POST {base}/batches`
//!   with `completion_window: "24h"` and `metadata.docket_tag` /
//!   `metadata.docket_requests` so `find` can recognise a batch whose create
//!   answer was lost.
//! - poll: `GET {base}/batches/{id}`.
//! - results: `GET {base}/files/{id}/content` for the output file, then the
//!   error file, streamed and split on newlines.
//! - cancel: `POST {base}/batches/{id}/cancel`.
//! - find: `GET {base}/batches?limit=100[&after=..]`, newest first.
//!
//! Azure: `{base}/openai/files?api-version=V`, `{base}/openai/batches?...`,
//! the `api-key` header, endpoint and line `url` `/chat/completions`, and
//! each line's `model` is the (global batch) deployment.
//!
//! A batch line's `body` is exactly the synchronous request body
//! (`openai::request_body`), and a result line's `response.body` is read by
//! the synchronous parser and error classifier, so a batch answer and a sync
//! answer are the same thing to the rest of docket.

#![allow(clippy::result_large_err)]

use std::collections::HashSet;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::http::{self, JSONL, Wire, measure, not_understood, request_error, streamed_body};
use super::jsonl::{self, Chunk, LineError};
use super::results::{Matcher, StreamEnd, parse_line};
use super::{
    BatchCounts, BatchLimits, BatchLine, BatchProvider, BatchState, BatchStatus, FIND_CLOCK_MARGIN,
    Found, LineOutcome, LineSource, ResultSink, ResultsSummary, SubmitSpec, Submitted, verdict,
    with_key_header,
};
use crate::limiter::RateHeaders;
use crate::openai::{classify_error, parse_success, rate_headers, request_body};
use crate::{ApiKey, ErrorClass, ProviderError, RawAnswer};

/// OpenAI: 50,000 requests and 200 MB per input file (counted as
/// 200,000,000 bytes, the smaller reading of "MB").
pub const OPENAI_LIMITS: BatchLimits = BatchLimits {
    max_requests: 50_000,
    max_bytes: 200_000_000,
    max_custom_id: 64,
};

/// Azure OpenAI: 100,000 requests and 200 MB per input file.
pub const AZURE_LIMITS: BatchLimits = BatchLimits {
    max_requests: 100_000,
    max_bytes: 200_000_000,
    max_custom_id: 64,
};

/// The metadata keys docket sets on every batch it creates.
pub const TAG_KEY: &str = "docket_tag";
pub const REQUESTS_KEY: &str = "docket_requests";

/// Control calls (create, poll, cancel, list).
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Uploading or downloading a file of up to 200 MB.
const FILE_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// `find` lists at most this many pages of 100 batches.
const MAX_LIST_PAGES: usize = 100;

/// How long to wait between polls (the staged-batching plan, 4.1A): 30 s
/// at first, 120 s once a batch has run for 10 minutes, 30 s again in the
/// last half hour of its 24 h window; 30 s while it is validating,
/// finalizing or cancelling (cancelling lasts up to 10 minutes). The
/// caller adds jitter. Tests and the mock compress it with `fast()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollCadence {
    pub quick: Duration,
    pub slow: Duration,
    /// In progress for this long: poll at `slow`.
    pub slow_after: Duration,
    /// The completion window (`24h`).
    pub window: Duration,
    /// This close to the window's end: back to `quick`.
    pub window_tail: Duration,
}

impl PollCadence {
    pub const STANDARD: PollCadence = PollCadence {
        quick: Duration::from_secs(30),
        slow: Duration::from_secs(120),
        slow_after: Duration::from_secs(10 * 60),
        window: Duration::from_secs(24 * 3600),
        window_tail: Duration::from_secs(30 * 60),
    };

    /// The same shape compressed 1,000-fold (30 ms, 120 ms after 600 ms).
    pub fn fast() -> Self {
        let s = Self::STANDARD;
        PollCadence {
            quick: s.quick / 1000,
            slow: s.slow / 1000,
            slow_after: s.slow_after / 1000,
            window: s.window / 1000,
            window_tail: s.window_tail / 1000,
        }
    }

    pub fn after(&self, state: &BatchState, age: Duration) -> Duration {
        match state {
            BatchState::InProgress
                if age >= self.slow_after && age + self.window_tail < self.window =>
            {
                self.slow
            }
            _ => self.quick,
        }
    }
}

impl Default for PollCadence {
    fn default() -> Self {
        Self::STANDARD
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Flavour {
    OpenAi,
    Azure { api_version: String },
}

/// The Batch API of OpenAI, of any server speaking it (the built-in mock),
/// and of Azure OpenAI.
pub struct OpenAiBatch {
    label: String,
    flavour: Flavour,
    base: String,
    key: Option<ApiKey>,
    client: reqwest::Client,
    limits: BatchLimits,
    cadence: PollCadence,
    /// Uploads of creates that made no batch but may be asked again.
    kept: super::KeptUploads,
}

impl OpenAiBatch {
    /// `base_url` as for the sync adapter (`https://api.openai.com/v1`).
    pub fn openai(label: &str, base_url: &str, key: Option<ApiKey>) -> Result<Self, String> {
        Ok(Self {
            label: label.to_string(),
            flavour: Flavour::OpenAi,
            base: base_url.trim_end_matches('/').to_string(),
            key,
            client: crate::http_client()?,
            limits: OPENAI_LIMITS,
            cadence: PollCadence::STANDARD,
            kept: Default::default(),
        })
    }

    /// `base_url` is the resource endpoint, `https://RESOURCE.openai.azure.com`
    /// (with or without `/openai`).
    pub fn azure(base_url: &str, api_version: &str, key: ApiKey) -> Result<Self, String> {
        let base = base_url.trim_end_matches('/');
        let base = base.strip_suffix("/openai").unwrap_or(base).to_string();
        Ok(Self {
            label: "azure".into(),
            flavour: Flavour::Azure {
                api_version: api_version.trim().to_string(),
            },
            base,
            key: Some(key),
            client: crate::http_client()?,
            limits: AZURE_LIMITS,
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

    /// The `endpoint` of the batch and the `url` of every line.
    pub fn endpoint(&self) -> &'static str {
        match self.flavour {
            Flavour::OpenAi => "/v1/chat/completions",
            Flavour::Azure { .. } => "/chat/completions",
        }
    }

    /// One input line, without its newline.
    pub fn encode_line(&self, line: &BatchLine) -> Result<Vec<u8>, String> {
        serde_json::to_vec(&json!({
            "custom_id": line.custom_id,
            "method": "POST",
            "url": self.endpoint(),
            "body": request_body(&line.request),
        }))
        .map_err(|e| format!("cannot encode the request: {e}"))
    }

    /// `path` under the API root, with `query` pairs (already safe).
    fn url(&self, path: &str, query: &[(&str, &str)]) -> String {
        let mut url = match &self.flavour {
            Flavour::OpenAi => format!("{}/{path}", self.base),
            Flavour::Azure { api_version } => format!(
                "{}/openai/{path}?api-version={}",
                self.base,
                crate::path_segment(api_version)
            ),
        };
        for (k, v) in query {
            url.push(if url.contains('?') { '&' } else { '?' });
            url.push_str(k);
            url.push('=');
            url.push_str(&crate::path_segment(v));
        }
        url
    }

    fn authed(
        &self,
        builder: reqwest::RequestBuilder,
    ) -> Result<reqwest::RequestBuilder, ProviderError> {
        match (&self.flavour, &self.key) {
            (Flavour::Azure { .. }, Some(k)) => with_key_header(builder, "api-key", k),
            // `bearer_auth` marks the header sensitive itself.
            (Flavour::OpenAi, Some(k)) => Ok(builder.bearer_auth(k.expose())),
            (_, None) => Ok(builder),
        }
    }

    fn scrub(&self, e: ProviderError) -> ProviderError {
        crate::scrub(e, self.key.as_ref())
    }

    /// Provider text made safe to store: the key and key-shaped words out.
    fn clean(&self, text: &str) -> String {
        super::clean(text, self.key.as_ref())
    }

    /// Send; a non-2xx answer is classified like a synchronous one.
    async fn call(&self, builder: reqwest::RequestBuilder) -> Result<RawAnswer, ProviderError> {
        WIRE.call(self.authed(builder)?).await
    }

    async fn get_batch(&self, id: &str) -> Result<BatchObject, ProviderError> {
        let url = self.url(&format!("batches/{}", crate::path_segment(id)), &[]);
        let raw = self
            .call(self.client.get(url).timeout(CALL_TIMEOUT))
            .await?;
        parse_json(&raw, "batch")
    }

    async fn submit_inner(&self, spec: &SubmitSpec<'_>) -> Result<Submitted, ProviderError> {
        if spec.lines.is_empty() {
            return Err(request_error("a batch needs at least one request".into()));
        }
        if spec.tag.is_empty() || spec.tag.chars().count() > 512 {
            return Err(request_error(
                "the batch tag must be 1 to 512 characters (an OpenAI metadata value)".into(),
            ));
        }
        let measured = measure(
            spec,
            self.limits,
            |l| self.encode_line(l),
            " (one model per input file)",
            " per file",
            "file",
        )
        .await?;
        // The same create asked again (its last made no batch): its upload
        // is reused, or deleted if the lines changed (row B2).
        let (reuse, stale) = self.kept.take(spec.tag, measured.bytes);
        if let Some(old) = stale {
            self.delete_unused(&old).await;
        }
        let file_id = match reuse {
            Some(f) => f,
            None => self.upload(spec.tag, spec.lines, measured.bytes).await?,
        };
        docket_model::failpoint::hit("after_upload");
        let body = json!({
            "input_file_id": file_id,
            "endpoint": self.endpoint(),
            "completion_window": "24h",
            "metadata": {TAG_KEY: spec.tag, REQUESTS_KEY: spec.lines.len().to_string()},
        });
        let created = self
            .call(
                self.client
                    .post(self.url("batches", &[]))
                    .timeout(CALL_TIMEOUT)
                    .json(&body),
            )
            .await;
        let raw = match created {
            Ok(raw) => raw,
            Err(e) => {
                // A create the provider refused (a 4xx) made no batch: the
                // file would sit in the account's storage for 30 days (row
                // B2). After a rate limit, a 5xx or no answer the create is
                // asked again (or a batch may exist that reads it): kept.
                if super::keep_upload_after(&e) {
                    self.kept.keep(spec.tag, file_id, measured.bytes);
                } else {
                    self.delete_unused(&file_id).await;
                }
                return Err(e);
            }
        };
        let batch: BatchObject = parse_json(&raw, "batch create")?;
        Ok(Submitted {
            provider_batch_id: batch.id,
            input_file_id: Some(file_id),
        })
    }

    /// Delete an input file no batch uses; a failure is logged, not raised
    /// (the create's own error is what the caller needs).
    async fn delete_unused(&self, file_id: &str) {
        if let Err(e) = self.delete_file(file_id).await {
            tracing::warn!(
                "could not delete the unused batch input file {}: {}",
                self.clean(file_id),
                self.scrub(e)
            );
        }
    }

    /// `DELETE {base}/files/{id}`: true when deleted, false when it was
    /// already gone (a 404: deleted before, or expired).
    async fn delete_file(&self, file_id: &str) -> Result<bool, ProviderError> {
        let url = self.url(&format!("files/{}", crate::path_segment(file_id)), &[]);
        match self
            .call(self.client.delete(url).timeout(CALL_TIMEOUT))
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.http_status == Some(404) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The input file of batch `id` (when not known, read from the batch)
    /// and, with `results`, its output and error files: deleted.
    async fn delete_files_inner(
        &self,
        id: &str,
        input: Option<&str>,
        results: Option<&BatchStatus>,
    ) -> Result<usize, ProviderError> {
        let input = match input {
            Some(f) => Some(f.to_string()),
            None => self.get_batch(id).await?.input_file_id,
        };
        let mut files: Vec<String> = input.into_iter().collect();
        if let Some(s) = results {
            files.extend(s.output_ref.clone());
            files.extend(s.error_ref.clone());
        }
        let mut n = 0;
        for f in files {
            if !f.is_empty() && self.delete_file(&f).await? {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Upload `lines` (`bytes` long) as a JSONL file; the bytes are encoded
    /// as they are sent, a piece at a time.
    async fn upload(
        &self,
        tag: &str,
        lines: &dyn LineSource,
        bytes: u64,
    ) -> Result<String, ProviderError> {
        let (body, produce) = streamed_body(lines, &JSONL, |l| self.encode_line(l));
        let safe_tag: String = tag
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .take(64)
            .collect();
        let part = reqwest::multipart::Part::stream_with_length(body, bytes)
            .file_name(format!("batch-{safe_tag}.jsonl"))
            .mime_str("application/jsonl")
            .map_err(|e| request_error(format!("multipart: {e}")))?;
        let form = reqwest::multipart::Form::new()
            .text("purpose", "batch")
            .part("file", part);
        let send = self.call(
            self.client
                .post(self.url("files", &[]))
                .timeout(FILE_TIMEOUT)
                .multipart(form),
        );
        let (answer, ()) = futures::join!(send, produce);
        let raw = answer?;
        let file: FileObject = parse_json(&raw, "file upload")?;
        Ok(file.id)
    }

    fn status_of(&self, b: BatchObject) -> Result<BatchStatus, ProviderError> {
        let state = match b.status.as_str() {
            "validating" => BatchState::Validating,
            "in_progress" => BatchState::InProgress,
            "finalizing" => BatchState::Finalizing,
            "completed" => BatchState::Completed,
            "failed" => BatchState::Failed(self.clean(&failure_summary(b.errors.as_ref()))),
            "expired" => BatchState::Expired,
            "cancelling" => BatchState::Cancelling,
            "cancelled" => BatchState::Cancelled,
            other => {
                return Err(not_understood(
                    200,
                    format!(
                        "batch {} has an unknown status {:?}",
                        b.id,
                        docket_model::sanitize::for_terminal(other)
                    ),
                    RateHeaders::default(),
                ));
            }
        };
        // `request_counts` is optional: None when the batch has none.
        let counted = b
            .request_counts
            .as_ref()
            .map(|c| c.completed.saturating_add(c.failed));
        let counts = b.request_counts.unwrap_or_default();
        let counts = BatchCounts {
            total: counts.total,
            completed: counts.completed,
            failed: counts.failed,
        };
        let output_ref = b.output_file_id.filter(|s| !s.is_empty());
        let error_ref = b.error_file_id.filter(|s| !s.is_empty());
        // Terminal with no file yet: the output file arrives after
        // `completed`. Poll again rather than ingest nothing: a completed
        // batch unless its counts say there is nothing (both present and
        // zero), an expired or cancelled one when its counts say there is
        // something.
        let no_files = output_ref.is_none() && error_ref.is_none();
        let results_pending = no_files
            && match state {
                BatchState::Completed => counted != Some(0),
                BatchState::Expired | BatchState::Cancelled => counted.is_some_and(|n| n > 0),
                _ => false,
            };
        Ok(BatchStatus {
            provider_batch_id: b.id,
            state,
            counts,
            output_ref,
            error_ref,
            results_pending,
        })
    }

    async fn results_inner(
        &self,
        status: &BatchStatus,
        expected: &HashSet<String>,
        sink: &mut dyn ResultSink,
    ) -> Result<ResultsSummary, ProviderError> {
        let mut m = Matcher::new(expected, sink, "custom_id");
        for (which, file) in [("output", &status.output_ref), ("error", &status.error_ref)] {
            let Some(file) = file else { continue };
            let end = self.stream_file(file, which, &mut m).await;
            // Cut: what came before stands; the rest is fetched again.
            if !http::settle(&mut m, end, &status.provider_batch_id, |e| self.scrub(e))? {
                break;
            }
        }
        Ok(m.finish(&status.state))
    }

    /// Stream one results file into `m`.
    async fn stream_file<'a>(
        &self,
        file_id: &str,
        which: &'static str,
        m: &mut Matcher<'a>,
    ) -> Result<StreamEnd, ProviderError> {
        let url = self.url(
            &format!("files/{}/content", crate::path_segment(file_id)),
            &[],
        );
        let authed = self.authed(self.client.get(url).timeout(FILE_TIMEOUT))?;
        let label = format!("{which} file line");
        WIRE.stream(authed, &label, m, |m, raw, at| self.line(m, raw, at))
            .await
    }

    /// One line of an output or error file.
    pub(crate) fn line(&self, m: &mut Matcher<'_>, raw: &[u8], at: &str) {
        let Some(parsed) = parse_line::<OutputLine>(m, raw, at, self.key.as_ref()) else {
            return;
        };
        m.entry(at, parsed.custom_id, || {
            match (parsed.response, parsed.error) {
                (Some(r), _) => Ok(self.response_outcome(r)),
                (None, Some(e)) => Ok(self.error_outcome(e)),
                (None, None) => Err("neither response nor error".into()),
            }
        });
    }

    fn response_outcome(&self, r: OutputResponse) -> LineOutcome {
        let bytes = serde_json::to_vec(&r.body).unwrap_or_default();
        let result = if r.status_code == 200 {
            parse_success(&bytes, RateHeaders::default(), r.request_id, 200)
        } else {
            Err(classify_error(
                r.status_code,
                &bytes,
                RateHeaders::default(),
            ))
        };
        match result {
            Ok(answer) => LineOutcome::Answer(answer),
            Err(e) => LineOutcome::Error(self.scrub(e)),
        }
    }

    fn error_outcome(&self, e: OutputError) -> LineOutcome {
        let code = match &e.code {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Null) | None => String::new(),
            Some(other) => other.to_string(),
        };
        let message = e.message.unwrap_or_default();
        let text = self.clean(&if code.is_empty() {
            message
        } else {
            format!("{message} [{code}]")
        });
        // Never run: the window closed or the batch was cancelled first.
        if code.contains("expired") || code.contains("cancel") {
            LineOutcome::NotRun(text)
        } else {
            LineOutcome::Error(ProviderError {
                class: ErrorClass::Transient,
                http_status: None,
                message: text,
                headers: RateHeaders::default(),
            })
        }
    }

    async fn poll_inner(&self, provider_batch_id: &str) -> Result<BatchStatus, ProviderError> {
        self.get_batch(provider_batch_id)
            .await
            .and_then(|b| self.status_of(b))
    }

    async fn cancel_inner(&self, id: &str) -> Result<BatchStatus, ProviderError> {
        let url = self.url(&format!("batches/{}/cancel", crate::path_segment(id)), &[]);
        match self.call(self.client.post(url).timeout(CALL_TIMEOUT)).await {
            Ok(raw) => self.status_of(parse_json(&raw, "batch cancel")?),
            // Already finished (or already cancelling): where the batch is now.
            Err(e) => {
                http::cancel_refused(e, self.poll_inner(id), |s| {
                    s.is_terminal() || *s == BatchState::Cancelling
                })
                .await
            }
        }
    }

    async fn find_inner(
        &self,
        tag: &str,
        created_after: f64,
        request_count: usize,
    ) -> Result<Found, ProviderError> {
        let since = created_after - FIND_CLOCK_MARGIN;
        let azure = matches!(self.flavour, Flavour::Azure { .. });
        let (mut exact, mut tag_only, mut unknown) = (Vec::new(), Vec::new(), Vec::new());
        let mut after: Option<String> = None;
        for _ in 0..MAX_LIST_PAGES {
            let mut query = vec![("limit", "100")];
            if let Some(a) = &after {
                query.push(("after", a.as_str()));
            }
            let raw = self
                .call(
                    self.client
                        .get(self.url("batches", &query))
                        .timeout(CALL_TIMEOUT),
                )
                .await?;
            let page: ListObject = parse_json(&raw, "batch list")?;
            page.matches(tag, since, request_count, &mut exact, &mut tag_only);
            if azure {
                page.without_metadata(since, &mut unknown);
            }
            // Listed newest first: once the page's last batch is older than
            // the window, so is everything after it.
            let last = page.data.last();
            let older = last.and_then(|b| b.created_at).is_some_and(|t| t < since);
            if older || !page.has_more || last.is_none() {
                return Ok(verdict(exact, tag_only, unknown));
            }
            after = page.last_id.clone().or_else(|| last.map(|b| b.id.clone()));
        }
        Err(request_error(format!(
            "listed {} batches without reaching the submission time; cannot tell whether {tag:?} was created",
            MAX_LIST_PAGES * 100
        )))
    }
}

impl BatchProvider for OpenAiBatch {
    fn name(&self) -> &str {
        &self.label
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

/// OpenAI's (and Azure's) answers: rate headers as the sync adapter reads
/// them, errors by its classifier.
const WIRE: Wire = Wire {
    rate_headers,
    error_of: |raw| classify_error(raw.status, &raw.bytes, rate_headers(&raw.headers)),
};

fn parse_json<T: serde::de::DeserializeOwned>(
    raw: &RawAnswer,
    what: &str,
) -> Result<T, ProviderError> {
    WIRE.parse_json(raw, what)
}

/// `errors.data[]` of a failed batch, one entry per problem, with the
/// input line where the provider gives one.
fn failure_summary(errors: Option<&ErrorList>) -> String {
    let data = errors.map(|e| e.data.as_slice()).unwrap_or_default();
    if data.is_empty() {
        return "the batch failed (no errors listed)".into();
    }
    const SHOWN: usize = 5;
    let mut parts: Vec<String> = data
        .iter()
        .take(SHOWN)
        .map(|e| {
            let mut s = String::new();
            if let Some(line) = e.line {
                s.push_str(&format!("line {line}: "));
            }
            s.push_str(e.message.as_deref().unwrap_or("(no message)"));
            if let Some(code) = e.code.as_deref().filter(|c| !c.is_empty()) {
                s.push_str(&format!(" [{code}]"));
            }
            if let Some(param) = e.param.as_deref().filter(|c| !c.is_empty()) {
                s.push_str(&format!(" (param {param})"));
            }
            docket_model::sanitize::for_terminal(&s)
        })
        .collect();
    if data.len() > SHOWN {
        parts.push(format!("and {} more", data.len() - SHOWN));
    }
    parts.join("; ")
}

#[derive(Deserialize)]
struct FileObject {
    id: String,
}

#[derive(Deserialize)]
struct BatchObject {
    id: String,
    status: String,
    #[serde(default)]
    input_file_id: Option<String>,
    #[serde(default)]
    output_file_id: Option<String>,
    #[serde(default)]
    error_file_id: Option<String>,
    #[serde(default)]
    request_counts: Option<RequestCounts>,
    #[serde(default)]
    errors: Option<ErrorList>,
    #[serde(default)]
    created_at: Option<f64>,
    #[serde(default)]
    metadata: Option<Map<String, Value>>,
}

#[derive(Deserialize, Default)]
struct RequestCounts {
    #[serde(default)]
    total: u64,
    #[serde(default)]
    completed: u64,
    #[serde(default)]
    failed: u64,
}

#[derive(Deserialize, Default)]
struct ErrorList {
    #[serde(default, deserialize_with = "null_as_default")]
    data: Vec<BatchErrorEntry>,
}

#[derive(Deserialize)]
struct BatchErrorEntry {
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    param: Option<String>,
    #[serde(default)]
    line: Option<u64>,
}

#[derive(Deserialize)]
struct ListObject {
    #[serde(default, deserialize_with = "null_as_default")]
    data: Vec<BatchObject>,
    #[serde(default)]
    last_id: Option<String>,
    #[serde(default)]
    has_more: bool,
}

impl ListObject {
    /// Batches on this page created for `tag` at or after `created_after`:
    /// with `request_count` requests into `exact`, with another count (or
    /// none) into `tag_only`.
    fn matches(
        &self,
        tag: &str,
        created_after: f64,
        request_count: usize,
        exact: &mut Vec<String>,
        tag_only: &mut Vec<String>,
    ) {
        for b in &self.data {
            if b.created_at.is_some_and(|t| t < created_after) {
                continue;
            }
            let meta = b.metadata.as_ref();
            if meta.and_then(|m| m.get(TAG_KEY)).and_then(Value::as_str) != Some(tag) {
                continue;
            }
            let count_matches = match meta.and_then(|m| m.get(REQUESTS_KEY)) {
                Some(Value::String(s)) => s.trim().parse::<usize>().ok() == Some(request_count),
                Some(Value::Number(n)) => n.as_u64() == Some(request_count as u64),
                _ => false,
            };
            if count_matches {
                exact.push(b.id.clone());
            } else {
                tag_only.push(b.id.clone());
            }
        }
    }

    /// Batches on this page at or after `created_after` with no metadata at
    /// all (missing, null or empty): whether one is ours cannot be checked.
    fn without_metadata(&self, created_after: f64, unknown: &mut Vec<String>) {
        for b in &self.data {
            if b.created_at.is_some_and(|t| t < created_after) {
                continue;
            }
            if b.metadata.as_ref().is_none_or(Map::is_empty) {
                unknown.push(b.id.clone());
            }
        }
    }
}

#[derive(Deserialize)]
struct OutputLine {
    #[serde(default)]
    custom_id: Option<String>,
    #[serde(default)]
    response: Option<OutputResponse>,
    #[serde(default)]
    error: Option<OutputError>,
}

#[derive(Deserialize)]
struct OutputResponse {
    status_code: u16,
    #[serde(default)]
    request_id: Option<String>,
    #[serde(default)]
    body: Value,
}

#[derive(Deserialize)]
struct OutputError {
    #[serde(default)]
    code: Option<Value>,
    #[serde(default)]
    message: Option<String>,
}

fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::ResultLine;
    use crate::{ChatRequest, FinishReason};

    fn openai() -> OpenAiBatch {
        OpenAiBatch::openai(
            "openai",
            "https://api.openai.com/v1/",
            Some(ApiKey::new("sk-canary-unit-1")),
        )
        .unwrap()
    }

    fn azure() -> OpenAiBatch {
        OpenAiBatch::azure(
            "https://res.openai.azure.com/openai/",
            "2024-10-21",
            ApiKey::new("azure-canary-unit"),
        )
        .unwrap()
    }

    fn batch(json: &str) -> BatchStatus {
        openai()
            .status_of(serde_json::from_str(json).unwrap())
            .unwrap()
    }

    fn line(id: &str) -> BatchLine {
        BatchLine {
            custom_id: id.into(),
            request: ChatRequest {
                model: "gpt-4o-mini".into(),
                system: Some("sys".into()),
                user: "is it?".into(),
                max_tokens: 50,
                temperature: Some(0.0),
                response_schema: Some(std::sync::Arc::new((
                    "verdict".into(),
                    json!({"type":"object"}),
                ))),
                client_request_id: id.into(),
                timeout: Duration::from_secs(5),
            },
        }
    }

    // The batch object of the reference, in each status.
    fn batch_json(status: &str, extra: &str) -> String {
        let base = format!(
            r#"{{"id":"batch_abc123","object":"batch","endpoint":"/v1/chat/completions","model":"gpt-4o-mini-2024-07-18",
            "errors":null,"input_file_id":"file-abc123","completion_window":"24h","status":"{status}",
            "output_file_id":null,"error_file_id":null,"created_at":1711471533,"in_progress_at":1711471538,
            "expires_at":1711557933,"finalizing_at":null,"completed_at":null,"failed_at":null,"expired_at":null,
            "cancelling_at":null,"cancelled_at":null,"request_counts":{{"total":100,"completed":23,"failed":1}},
            "usage":{{"input_tokens":0,"input_tokens_details":{{"cached_tokens":0}},"output_tokens":0,
            "output_tokens_details":{{"reasoning_tokens":0}},"total_tokens":0}},
            "metadata":{{"job":"adjudication-42"}}}}"#
        );
        // Fields in `extra` replace the example's.
        let mut v: Value = serde_json::from_str(&base).unwrap();
        let extra: Value =
            serde_json::from_str(&format!("{{{}}}", extra.trim_start_matches(','))).unwrap();
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v.to_string()
    }

    #[test]
    fn every_status_maps_to_a_state() {
        for (status, state) in [
            ("validating", BatchState::Validating),
            ("in_progress", BatchState::InProgress),
            ("finalizing", BatchState::Finalizing),
            ("cancelling", BatchState::Cancelling),
        ] {
            let s = batch(&batch_json(status, ""));
            assert_eq!(s.state, state);
            assert!(!s.results_pending, "{status}");
            assert_eq!(
                s.counts,
                BatchCounts {
                    total: 100,
                    completed: 23,
                    failed: 1
                }
            );
            assert_eq!(s.provider_batch_id, "batch_abc123");
        }
        let s = batch(&batch_json(
            "completed",
            r#","output_file_id":"file-out","error_file_id":"file-err""#,
        ));
        assert_eq!(s.state, BatchState::Completed);
        assert_eq!(s.output_ref.as_deref(), Some("file-out"));
        assert_eq!(s.error_ref.as_deref(), Some("file-err"));
        assert!(!s.results_pending);
        let e = openai()
            .status_of(serde_json::from_str(&batch_json("paused", "")).unwrap())
            .unwrap_err();
        assert_eq!(e.class, ErrorClass::Transient);
    }

    #[test]
    fn output_file_late_after_completed_is_results_pending() {
        // completed, counts say 23 + 1 results, no file yet.
        let s = batch(&batch_json("completed", ""));
        assert_eq!(s.state, BatchState::Completed);
        assert!(s.results_pending);
        // Cancelled before anything ran: nothing to wait for.
        let s = batch(&batch_json(
            "cancelled",
            r#","request_counts":{"total":100,"completed":0,"failed":0}"#,
        ));
        assert!(!s.results_pending);
        assert!(s.state.is_terminal());
    }

    #[test]
    fn expired_with_partial_counts_keeps_both_files() {
        let s = batch(&batch_json(
            "expired",
            r#","output_file_id":"file-out","error_file_id":"file-err","request_counts":{"total":100,"completed":60,"failed":0}"#,
        ));
        assert_eq!(s.state, BatchState::Expired);
        assert_eq!(s.counts.completed, 60);
        assert_eq!(s.output_ref.as_deref(), Some("file-out"));
        assert_eq!(s.error_ref.as_deref(), Some("file-err"));
        assert!(!s.results_pending);
    }

    #[test]
    fn failed_names_the_input_line() {
        let s = batch(&batch_json(
            "failed",
            r#","errors":{"object":"list","data":[{"code":"invalid_request","message":"custom_id is duplicated sk-leaked12345","param":"custom_id","line":7},{"code":"token_limit_exceeded","message":"Enqueued token limit reached.","param":null,"line":null}]},"request_counts":{"total":0,"completed":0,"failed":0}"#,
        ));
        let BatchState::Failed(why) = &s.state else {
            panic!("{:?}", s.state)
        };
        assert!(why.contains("line 7: custom_id is duplicated"), "{why}");
        assert!(why.contains("[invalid_request] (param custom_id)"), "{why}");
        assert!(
            why.contains("Enqueued token limit reached. [token_limit_exceeded]"),
            "{why}"
        );
        assert!(!why.contains("sk-leaked"), "{why}");
        assert!(!s.results_pending);
        let s = batch(&batch_json("failed", ""));
        assert_eq!(
            s.state,
            BatchState::Failed("the batch failed (no errors listed)".into())
        );
    }

    #[test]
    fn a_file_object_gives_its_id() {
        let f: FileObject = serde_json::from_str(
            r#"{"id":"file-abc123","object":"file","bytes":120000,"created_at":1711471533,"expires_at":1714063533,"filename":"batchinput.jsonl","purpose":"batch","status":"processed"}"#,
        )
        .unwrap();
        assert_eq!(f.id, "file-abc123");
    }

    fn ingest(lines: &[&str], expected: &[&str]) -> (Vec<ResultLine>, ResultsSummary) {
        let adapter = openai();
        let expected: HashSet<String> = expected.iter().map(|s| s.to_string()).collect();
        let mut got = Vec::new();
        let mut sink = |l: ResultLine| got.push(l);
        let mut m = Matcher::new(&expected, &mut sink, "custom_id");
        for (i, l) in lines.iter().enumerate() {
            if !l.trim().is_empty() {
                adapter.line(&mut m, l.as_bytes(), &format!("output file line {}", i + 1));
            }
        }
        // Not terminal: nothing is made up for ids with no line.
        let summary = m.finish(&BatchState::InProgress);
        (got, summary)
    }

    const OK_LINE: &str = r#"{"id":"batch_req_123","custom_id":"item-2","response":{"status_code":200,"request_id":"req_123","body":{"id":"chatcmpl-1","object":"chat.completion","created":1711652795,"model":"gpt-4o-mini-2024-07-18","choices":[{"index":0,"message":{"role":"assistant","content":"{\"a\":1}","refusal":null},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":24,"completion_tokens":8,"total_tokens":32,"prompt_tokens_details":{"cached_tokens":4},"completion_tokens_details":{"reasoning_tokens":2}}}},"error":null}"#;
    const ERR_LINE: &str = r#"{"id":"batch_req_456","custom_id":"item-7","response":{"status_code":400,"request_id":"req_456","body":{"error":{"message":"maximum context length","type":"invalid_request_error","param":null,"code":"context_length_exceeded"}}},"error":null}"#;
    const EXPIRED_LINE: &str = r#"{"id":"batch_req_789","custom_id":"item-9","response":null,"error":{"code":"batch_expired","message":"This request could not be executed before the completion window expired."}}"#;

    #[test]
    fn output_lines_become_answers_errors_and_not_run() {
        let (got, summary) = ingest(
            &[OK_LINE, "", ERR_LINE, EXPIRED_LINE],
            &["item-2", "item-7", "item-9"],
        );
        assert_eq!(summary.lines, 3);
        assert_eq!(summary.delivered, 3);
        assert!(summary.quarantined.is_empty());
        let LineOutcome::Answer(a) = &got[0].outcome else {
            panic!("{:?}", got[0])
        };
        assert_eq!(got[0].custom_id, "item-2");
        assert_eq!(a.content.as_deref(), Some("{\"a\":1}"));
        assert_eq!(a.finish_reason, FinishReason::Stop);
        assert_eq!(a.usage.unwrap().cached_input_tokens, 4);
        assert_eq!(a.provider_request_id.as_deref(), Some("req_123"));
        let LineOutcome::Error(e) = &got[1].outcome else {
            panic!("{:?}", got[1])
        };
        assert_eq!(e.class, ErrorClass::Request);
        assert_eq!(e.http_status, Some(400));
        assert!(e.message.contains("context_length_exceeded"));
        let LineOutcome::NotRun(why) = &got[2].outcome else {
            panic!("{:?}", got[2])
        };
        assert!(why.contains("batch_expired"), "{why}");
    }

    #[test]
    fn unknown_duplicate_and_garbage_lines_are_quarantined() {
        let (got, summary) = ingest(
            &[
                OK_LINE,
                OK_LINE,
                EXPIRED_LINE,
                "{\"custom_id\":\"item-2\",\"resp",
                r#"{"id":"x","custom_id":"item-7"}"#,
                r#"{"id":"x","response":null,"error":null}"#,
            ],
            &["item-2", "item-7"],
        );
        assert_eq!(got.len(), 1);
        assert_eq!(summary.lines, 6);
        assert_eq!(summary.delivered, 1);
        let q: Vec<(u64, Option<&str>)> = summary
            .quarantined
            .iter()
            .map(|q| (q.line, q.custom_id.as_deref()))
            .collect();
        assert_eq!(
            q,
            vec![
                (2, Some("item-2")),
                (3, Some("item-9")),
                (4, None),
                (5, Some("item-7")),
                (6, None)
            ]
        );
        assert!(summary.quarantined[0].reason.contains("second result"));
        assert!(summary.quarantined[1].reason.contains("unknown custom_id"));
        // item-7's line with neither part did not use up its id.
        let (got, _) = ingest(&[r#"{"custom_id":"item-7"}"#, ERR_LINE], &["item-7"]);
        assert_eq!(got.len(), 1);
    }

    #[test]
    fn find_matches_tag_and_count_newest_first() {
        let list: ListObject = serde_json::from_str(
            r#"{"object":"list","data":[
              {"id":"batch_3","object":"batch","endpoint":"/v1/chat/completions","input_file_id":"f","completion_window":"24h","status":"validating","created_at":1711472000,"metadata":{"docket_tag":"b-42","docket_requests":"10"}},
              {"id":"batch_2","object":"batch","endpoint":"/v1/chat/completions","input_file_id":"f","completion_window":"24h","status":"completed","created_at":1711471600,"metadata":{"docket_tag":"b-41","docket_requests":"10"}},
              {"id":"batch_1","object":"batch","endpoint":"/v1/chat/completions","input_file_id":"f","completion_window":"24h","status":"completed","created_at":1711471000,"metadata":{"docket_tag":"b-42","docket_requests":"10"}},
              {"id":"batch_0","object":"batch","endpoint":"/v1/chat/completions","input_file_id":"f","completion_window":"24h","status":"completed","created_at":1711472100,"metadata":null}
            ],"first_id":"batch_3","last_id":"batch_0","has_more":false}"#
        )
        .unwrap();
        let run = |tag: &str, after: f64, n: usize| {
            let (mut exact, mut tag_only) = (Vec::new(), Vec::new());
            list.matches(tag, after, n, &mut exact, &mut tag_only);
            verdict(exact, tag_only, Vec::new())
        };
        assert_eq!(run("b-42", 1711471500.0, 10), Found::One("batch_3".into()));
        // batch_1 is before the window unless the window reaches back.
        assert_eq!(
            run("b-42", 1711470000.0, 10),
            Found::Ambiguous(vec!["batch_3".into(), "batch_1".into()])
        );
        assert_eq!(run("b-43", 0.0, 10), Found::None);
        // Our tag with another count: never guessed to be safe.
        assert_eq!(
            run("b-42", 1711471500.0, 11),
            Found::Ambiguous(vec!["batch_3".into()])
        );
        // Azure: batch_0 has no metadata and could be ours. Beside no match
        // it is Ambiguous, never None; beside our one match, it is not ours.
        let mut unknown = Vec::new();
        list.without_metadata(1711471500.0, &mut unknown);
        assert_eq!(unknown, vec!["batch_0"]);
        assert_eq!(
            verdict(Vec::new(), Vec::new(), unknown.clone()),
            Found::Ambiguous(vec!["batch_0".into()])
        );
        assert_eq!(
            verdict(vec!["batch_3".into()], Vec::new(), unknown),
            Found::One("batch_3".into())
        );
        let mut unknown = Vec::new();
        list.without_metadata(1711472200.0, &mut unknown);
        assert!(unknown.is_empty(), "outside the window");
    }

    #[test]
    fn a_completed_batch_without_counts_or_files_is_pending() {
        // request_counts is optional: without it, results may still come.
        let s = batch(&batch_json("completed", r#","request_counts":null"#));
        assert!(s.results_pending);
        // Counted and both zero: nothing will come.
        let s = batch(&batch_json(
            "completed",
            r#","request_counts":{"total":0,"completed":0,"failed":0}"#,
        ));
        assert!(!s.results_pending);
        // Counts that would wrap a u64 do not read as zero.
        let s = batch(&batch_json(
            "completed",
            r#","request_counts":{"total":1,"completed":18446744073709551615,"failed":1}"#,
        ));
        assert!(s.results_pending);
        let s = batch(&batch_json(
            "expired",
            r#","request_counts":{"total":2,"completed":18446744073709551615,"failed":1}"#,
        ));
        assert!(s.results_pending);
    }

    #[test]
    fn urls_and_endpoints_per_flavour() {
        let o = openai();
        assert_eq!(o.url("files", &[]), "https://api.openai.com/v1/files");
        assert_eq!(
            o.url("batches", &[("limit", "100"), ("after", "batch_x")]),
            "https://api.openai.com/v1/batches?limit=100&after=batch_x"
        );
        assert_eq!(o.endpoint(), "/v1/chat/completions");
        let a = azure();
        assert_eq!(
            a.url("batches/b1/cancel", &[]),
            "https://res.openai.azure.com/openai/batches/b1/cancel?api-version=2024-10-21"
        );
        assert_eq!(
            a.url("batches", &[("limit", "100")]),
            "https://res.openai.azure.com/openai/batches?api-version=2024-10-21&limit=100"
        );
        assert_eq!(a.endpoint(), "/chat/completions");
        assert_eq!(a.limits().max_requests, 100_000);
        assert_eq!(o.limits().max_requests, 50_000);
    }

    #[test]
    fn a_line_is_the_sync_body_under_the_batch_envelope() {
        let l = line("item-1");
        let v: Value = serde_json::from_slice(&openai().encode_line(&l).unwrap()).unwrap();
        assert_eq!(v["custom_id"], "item-1");
        assert_eq!(v["method"], "POST");
        assert_eq!(v["url"], "/v1/chat/completions");
        assert_eq!(v["body"], request_body(&l.request));
        let v: Value = serde_json::from_slice(&azure().encode_line(&l).unwrap()).unwrap();
        assert_eq!(v["url"], "/chat/completions");
        assert_eq!(v["body"]["model"], "gpt-4o-mini");
    }

    #[test]
    fn cadence_follows_the_plan() {
        let c = PollCadence::STANDARD;
        let min = |m: u64| Duration::from_secs(60 * m);
        assert_eq!(
            c.after(&BatchState::Validating, min(0)),
            Duration::from_secs(30)
        );
        assert_eq!(
            c.after(&BatchState::InProgress, min(5)),
            Duration::from_secs(30)
        );
        assert_eq!(
            c.after(&BatchState::InProgress, min(11)),
            Duration::from_secs(120)
        );
        assert_eq!(
            c.after(&BatchState::Finalizing, min(60)),
            Duration::from_secs(30)
        );
        assert_eq!(
            c.after(&BatchState::Cancelling, min(60)),
            Duration::from_secs(30)
        );
        assert_eq!(
            c.after(&BatchState::InProgress, min(23 * 60 + 45)),
            Duration::from_secs(30)
        );
        let f = PollCadence::fast();
        assert_eq!(
            f.after(&BatchState::InProgress, Duration::ZERO),
            Duration::from_millis(30)
        );
        assert_eq!(
            f.after(&BatchState::InProgress, Duration::from_secs(1)),
            Duration::from_millis(120)
        );
        assert_eq!(
            openai()
                .with_cadence(f)
                .poll_after(&BatchState::Validating, Duration::ZERO),
            f.quick
        );
    }
}
