//! Anthropic Message Batches (`/v1/messages/batches`).
//!
//! - submit: `POST {base}/v1/messages/batches` with
//!   `{"requests":[{"custom_id","params"}]}`; no file upload, the whole body
//!   is the input, streamed a piece at a time as it is encoded. Each
//!   `params` is exactly the synchronous Messages body
//!   (`anthropic::request_body`).
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

#![allow(clippy::result_large_err)]

use std::collections::HashSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{Value, json};

use super::http::{self, Framing, Wire, measure, not_understood, request_error, streamed_body};
use super::jsonl::{self, Chunk, LineError};
use super::openai::PollCadence;
use super::results::{Matcher, StreamEnd, parse_line};
use super::{
    BatchCounts, BatchLimits, BatchLine, BatchProvider, BatchState, BatchStatus, FIND_CLOCK_MARGIN,
    Found, LineOutcome, LineSource, ResultSink, ResultsSummary, SubmitSpec, Submitted, verdict,
    with_key_header,
};
use crate::anthropic::{
    ANTHROPIC_VERSION, classify_error, parse_success, rate_headers_at, request_body,
};
use crate::limiter::RateHeaders;
use crate::{ApiKey, ProviderError, RawAnswer};

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
    pub fn new(base_url: &str, key: ApiKey) -> Result<Self, String> {
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
    pub fn encode_line(&self, line: &BatchLine) -> Result<Vec<u8>, String> {
        serde_json::to_vec(&json!({
            "custom_id": line.custom_id,
            "params": request_body(&line.request),
        }))
        .map_err(|e| format!("cannot encode the request: {e}"))
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

    fn status_of(&self, b: MessageBatch) -> Result<BatchStatus, ProviderError> {
        let c = b.request_counts.unwrap_or_default();
        let ended = b.processing_status == "ended";
        let state = match b.processing_status.as_str() {
            "in_progress" => BatchState::InProgress,
            "canceling" => BatchState::Cancelling,
            "ended" if b.cancel_initiated_at.is_some() => BatchState::Cancelled,
            "ended" if c.expired > 0 => BatchState::Expired,
            "ended" => BatchState::Completed,
            other => {
                return Err(not_understood(
                    200,
                    format!(
                        "message batch {} has an unknown processing_status {:?}",
                        b.id,
                        docket_model::sanitize::for_terminal(other)
                    ),
                    RateHeaders::default(),
                ));
            }
        };
        let counts = BatchCounts {
            total: c.total(),
            completed: c.succeeded,
            failed: c
                .errored
                .saturating_add(c.canceled)
                .saturating_add(c.expired),
        };
        let output_ref = b.results_url.filter(|s| !s.is_empty());
        // Ended, not archived, and no results URL yet: poll again.
        let results_pending = ended && output_ref.is_none() && b.archived_at.is_none();
        Ok(BatchStatus {
            provider_batch_id: b.id,
            state,
            counts,
            output_ref,
            error_ref: None,
            results_pending,
        })
    }

    /// The results URL to fetch: the given one when it is on the API's own
    /// origin, else the documented path for the batch.
    fn results_url(&self, status: &BatchStatus) -> String {
        let own = self.batch_url(&status.provider_batch_id, "/results");
        match &status.output_ref {
            Some(u) if same_origin(u, &self.base) => u.clone(),
            Some(u) => {
                tracing::warn!(
                    batch = %status.provider_batch_id,
                    "results_url {} is not on {}; fetching {own}",
                    docket_model::sanitize::for_terminal(u),
                    self.base
                );
                own
            }
            None => own,
        }
    }

    async fn results_inner(
        &self,
        status: &BatchStatus,
        expected: &HashSet<String>,
        sink: &mut dyn ResultSink,
    ) -> Result<ResultsSummary, ProviderError> {
        // Every request has a line (`expired`, `canceled` included): one
        // with none may have run, and is not taken as never run.
        let mut m = Matcher::new(expected, sink, "custom_id").one_line_per_request();
        if status.output_ref.is_some() {
            let end = self.stream_results(status, &mut m).await;
            http::settle(&mut m, end, &status.provider_batch_id, |e| self.scrub(e))?;
        }
        // No results URL (archived, or not ended): nothing to read, and
        // `finish` accounts for every request.
        Ok(m.finish(&status.state))
    }

    async fn stream_results<'a>(
        &self,
        status: &BatchStatus,
        m: &mut Matcher<'a>,
    ) -> Result<StreamEnd, ProviderError> {
        let authed = self.authed(
            self.client
                .get(self.results_url(status))
                .timeout(BODY_TIMEOUT),
        )?;
        WIRE.stream(authed, "results line", m, |m, raw, at| {
            self.line(m, raw, at)
        })
        .await
    }

    /// One line of the results JSONL.
    pub(crate) fn line(&self, m: &mut Matcher<'_>, raw: &[u8], at: &str) {
        let Some(parsed) = parse_line::<ResultEntry>(m, raw, at, Some(&self.key)) else {
            return;
        };
        m.entry(at, parsed.custom_id, || {
            parsed
                .result
                .and_then(|r| self.outcome(r))
                .ok_or_else(|| "no result of a known type".into())
        });
    }

    fn outcome(&self, r: ResultBody) -> Option<LineOutcome> {
        Some(match r.kind.as_str() {
            "succeeded" => {
                let bytes = serde_json::to_vec(&r.message?).unwrap_or_default();
                match parse_success(&bytes, RateHeaders::default(), None, 200) {
                    Ok(a) => LineOutcome::Answer(a),
                    Err(e) => LineOutcome::Error(self.scrub(e)),
                }
            }
            "errored" => {
                let error = r.error.unwrap_or(Value::Null);
                let kind = error
                    .pointer("/error/type")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let bytes = serde_json::to_vec(&error).unwrap_or_default();
                let mut e = classify_error(status_for(kind), &bytes, RateHeaders::default());
                // No HTTP exchange of its own: the status was only a reading aid.
                e.http_status = None;
                LineOutcome::Error(self.scrub(e))
            }
            "canceled" => LineOutcome::NotRun("canceled before it ran (batch canceled)".into()),
            "expired" => {
                LineOutcome::NotRun("expired: the batch ended (24 h) before it ran".into())
            }
            _ => return None,
        })
    }

    async fn poll_inner(&self, provider_batch_id: &str) -> Result<BatchStatus, ProviderError> {
        self.get_batch(provider_batch_id)
            .await
            .and_then(|b| self.status_of(b))
    }

    async fn cancel_inner(&self, id: &str) -> Result<BatchStatus, ProviderError> {
        let url = self.batch_url(id, "/cancel");
        match self.call(self.client.post(url).timeout(CALL_TIMEOUT)).await {
            Ok(raw) => self.status_of(parse_json(&raw, "batch cancel")?),
            // Already ended (or canceling): the answer is where it is now.
            Err(e) => {
                http::cancel_refused(e, self.poll_inner(id), |s| {
                    s.is_terminal() || *s == BatchState::Cancelling
                })
                .await
            }
        }
    }

    /// `_tag` cannot be checked: Anthropic keeps no metadata on a batch, so
    /// the window and the request count are all there is to match on.
    async fn find_inner(
        &self,
        _tag: &str,
        created_after: f64,
        request_count: usize,
    ) -> Result<Found, ProviderError> {
        // A wider window is the safe side: at worst more Ambiguous.
        let since = created_after - FIND_CLOCK_MARGIN;
        let mut found = Vec::new();
        let mut after: Option<String> = None;
        for _ in 0..MAX_LIST_PAGES {
            let mut url = self.url("?limit=100");
            if let Some(a) = &after {
                url.push_str("&after_id=");
                url.push_str(&crate::path_segment(a));
            }
            let raw = self
                .call(self.client.get(url).timeout(CALL_TIMEOUT))
                .await?;
            let page: ListPage = parse_json(&raw, "batch list")?;
            page.matches(since, request_count, &mut found);
            // Newest first: once the page's last batch is older than the
            // window, so is everything after it.
            let last = page.data.last();
            let older = last
                .and_then(|b| unix_of(b.created_at.as_deref()))
                .is_some_and(|t| t < since);
            if older || !page.has_more || last.is_none() {
                return Ok(verdict(found, Vec::new(), Vec::new()));
            }
            after = page.last_id.clone().or_else(|| last.map(|b| b.id.clone()));
        }
        Err(request_error(format!(
            "listed {} message batches without reaching the submission time; cannot tell whether the batch was created",
            MAX_LIST_PAGES * 100
        )))
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

/// Scheme, host and port of `url` are those of `base`.
fn same_origin(url: &str, base: &str) -> bool {
    let origin = |u: &str| -> Option<String> {
        let (scheme, rest) = u.split_once("://")?;
        let host = rest.split(['/', '?', '#']).next()?;
        Some(format!(
            "{}://{}",
            scheme.to_ascii_lowercase(),
            host.to_ascii_lowercase()
        ))
    };
    origin(url).is_some() && origin(url) == origin(base)
}

fn unix_of(rfc3339: Option<&str>) -> Option<f64> {
    let t = DateTime::parse_from_rfc3339(rfc3339?.trim()).ok()?;
    Some(t.timestamp() as f64 + f64::from(t.timestamp_subsec_micros()) / 1e6)
}

/// A synthetic HTTP status for an errored line's `error.type`, so the
/// sync classifier reads it as it would the same error over HTTP. Unknown
/// types are taken as server errors (retryable), as the reference advises.
fn status_for(kind: &str) -> u16 {
    match kind {
        "invalid_request_error" => 400,
        "authentication_error" => 401,
        "billing_error" => 402,
        "permission_error" => 403,
        "not_found_error" => 404,
        "request_too_large" => 413,
        "rate_limit_error" => 429,
        "timeout_error" => 504,
        "overloaded_error" => 529,
        _ => 500,
    }
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

#[derive(Deserialize)]
struct MessageBatch {
    id: String,
    processing_status: String,
    #[serde(default)]
    request_counts: Option<RequestCounts>,
    #[serde(default)]
    created_at: Option<String>,
    #[serde(default)]
    cancel_initiated_at: Option<String>,
    #[serde(default)]
    archived_at: Option<String>,
    #[serde(default)]
    results_url: Option<String>,
}

#[derive(Deserialize, Default)]
struct RequestCounts {
    #[serde(default)]
    processing: u64,
    #[serde(default)]
    succeeded: u64,
    #[serde(default)]
    errored: u64,
    #[serde(default)]
    canceled: u64,
    #[serde(default)]
    expired: u64,
}

impl RequestCounts {
    /// Provider-sent counts: a sum that would wrap saturates instead.
    fn total(&self) -> u64 {
        [self.succeeded, self.errored, self.canceled, self.expired]
            .into_iter()
            .fold(self.processing, u64::saturating_add)
    }
}

#[derive(Deserialize)]
struct ListPage {
    #[serde(default)]
    data: Vec<MessageBatch>,
    #[serde(default)]
    last_id: Option<String>,
    #[serde(default)]
    has_more: bool,
}

impl ListPage {
    /// Batches on this page created at or after `created_after` with
    /// `request_count` requests. A batch without a readable `created_at`
    /// is kept: it cannot be ruled out.
    fn matches(&self, created_after: f64, request_count: usize, found: &mut Vec<String>) {
        for b in &self.data {
            if unix_of(b.created_at.as_deref()).is_some_and(|t| t < created_after) {
                continue;
            }
            let total = b.request_counts.as_ref().map_or(0, RequestCounts::total);
            if total == request_count as u64 {
                found.push(b.id.clone());
            }
        }
    }
}

#[derive(Deserialize)]
struct ResultEntry {
    #[serde(default)]
    custom_id: Option<String>,
    #[serde(default)]
    result: Option<ResultBody>,
}

#[derive(Deserialize)]
struct ResultBody {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    message: Option<Value>,
    #[serde(default)]
    error: Option<Value>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::ResultLine;
    use crate::{ChatRequest, ErrorClass, FinishReason};

    fn adapter() -> AnthropicBatch {
        AnthropicBatch::new(
            "https://api.anthropic.com/v1/",
            ApiKey::new("sk-ant-canary-unit"),
        )
        .unwrap()
    }

    fn line(id: &str) -> BatchLine {
        BatchLine {
            custom_id: id.into(),
            request: ChatRequest {
                model: "claude-haiku-4-5".into(),
                system: None,
                user: "…".into(),
                max_tokens: 256,
                temperature: None,
                response_schema: None,
                client_request_id: id.into(),
                timeout: Duration::from_secs(5),
            },
        }
    }

    // The reference's MessageBatch example, with `extra` fields replaced.
    fn batch(extra: Value) -> BatchStatus {
        let mut v = json!({
          "id": "msgbatch_013Zva2CMHLNnXjNJJKqJ2EF", "type": "message_batch",
          "processing_status": "in_progress",
          "request_counts": {"processing": 2, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0},
          "created_at": "2024-09-24T18:37:24.100435Z",
          "expires_at": "2024-09-25T18:37:24.100435Z",
          "ended_at": null, "cancel_initiated_at": null, "archived_at": null,
          "results_url": null
        });
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        adapter()
            .status_of(serde_json::from_value(v).unwrap())
            .unwrap()
    }

    #[test]
    fn the_create_body_is_the_references_example() {
        let b = adapter();
        let v: Value =
            serde_json::from_slice(&b.encode_line(&line("item-000123")).unwrap()).unwrap();
        assert_eq!(
            v,
            json!({"custom_id": "item-000123",
                   "params": {"model": "claude-haiku-4-5", "max_tokens": 256,
                              "messages": [{"role": "user", "content": "…"}]}})
        );
        assert_eq!(b.url(""), "https://api.anthropic.com/v1/messages/batches");
        assert_eq!(
            b.batch_url("msgbatch_1", "/cancel"),
            "https://api.anthropic.com/v1/messages/batches/msgbatch_1/cancel"
        );
        assert_eq!(b.limits().max_requests, 100_000);
        // A whole batch at the byte limit still fits 256 MB with its envelope.
        assert!(b.limits().max_bytes + 14 <= 256_000_000);
    }

    #[test]
    fn processing_status_maps_to_states() {
        let s = batch(json!({}));
        assert_eq!(s.state, BatchState::InProgress);
        assert_eq!(
            s.counts,
            BatchCounts {
                total: 2,
                completed: 0,
                failed: 0
            }
        );
        assert!(!s.results_pending);
        assert_eq!(s.provider_batch_id, "msgbatch_013Zva2CMHLNnXjNJJKqJ2EF");
        let s = batch(json!({"processing_status": "canceling",
                             "cancel_initiated_at": "2024-09-24T18:39:00Z"}));
        assert_eq!(s.state, BatchState::Cancelling);
        let url = "https://api.anthropic.com/v1/messages/batches/msgbatch_013Zva2CMHLNnXjNJJKqJ2EF/results";
        let ended = |counts: Value, extra: Value| {
            let mut e = json!({"processing_status": "ended", "ended_at": "2024-09-24T19:00:00Z",
                               "results_url": url, "request_counts": counts});
            for (k, x) in extra.as_object().unwrap() {
                e[k] = x.clone();
            }
            batch(e)
        };
        let c = |s, e, c, x| json!({"processing": 0, "succeeded": s, "errored": e, "canceled": c, "expired": x});
        let s = ended(c(1, 1, 0, 0), json!({}));
        assert_eq!(s.state, BatchState::Completed);
        assert_eq!(
            s.counts,
            BatchCounts {
                total: 2,
                completed: 1,
                failed: 1
            }
        );
        assert_eq!(s.output_ref.as_deref(), Some(url));
        assert!(!s.results_pending);
        assert_eq!(ended(c(1, 0, 0, 1), json!({})).state, BatchState::Expired);
        let s = ended(
            c(1, 0, 1, 0),
            json!({"cancel_initiated_at": "2024-09-24T18:39:00Z"}),
        );
        assert_eq!(s.state, BatchState::Cancelled);
        // Ended, results not there yet: wait. Archived: nothing to wait for.
        let s = ended(c(2, 0, 0, 0), json!({"results_url": null}));
        assert!(s.results_pending && s.state == BatchState::Completed);
        let s = ended(
            c(2, 0, 0, 0),
            json!({"results_url": null, "archived_at": "2024-10-23T18:37:24Z"}),
        );
        assert!(!s.results_pending);
        // Provider counts that would wrap a u64 saturate.
        let s = ended(c(u64::MAX, 1, 0, 0), json!({}));
        assert_eq!((s.counts.total, s.counts.failed), (u64::MAX, 1));
        let s = ended(c(0, u64::MAX, u64::MAX, 1), json!({}));
        assert_eq!((s.counts.total, s.counts.failed), (u64::MAX, u64::MAX));
        let e = adapter()
            .status_of(
                serde_json::from_value(json!({"id": "m", "processing_status": "paused"})).unwrap(),
            )
            .unwrap_err();
        assert_eq!(e.class, ErrorClass::Transient);
    }

    fn ingest(lines: &[&str], expected: &[&str]) -> (Vec<ResultLine>, ResultsSummary) {
        let a = adapter();
        let expected: HashSet<String> = expected.iter().map(|s| s.to_string()).collect();
        let mut got = Vec::new();
        let mut sink = |l: ResultLine| got.push(l);
        let mut m = Matcher::new(&expected, &mut sink, "custom_id");
        for (i, l) in lines.iter().enumerate() {
            a.line(&mut m, l.as_bytes(), &format!("results line {}", i + 1));
        }
        let summary = m.finish(&BatchState::InProgress);
        (got, summary)
    }

    const SUCCEEDED: &str = r#"{"custom_id":"a","result":{"type":"succeeded","message":{"id":"msg_014VwiXbi91y3JMjcpyGBHX5","type":"message","role":"assistant","model":"claude-haiku-4-5","content":[{"type":"text","text":"{\"same\":true}"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":120,"output_tokens":48,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":0},"service_tier":"batch"}}}}"#;
    const ERRORED: &str = r#"{"custom_id":"b","result":{"type":"errored","error":{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: Field required"},"request_id":"req_011CSHoEeqs5C35K2UUqR7Fy"}}}"#;

    #[test]
    fn result_lines_of_every_type() {
        let (got, summary) = ingest(
            &[
                SUCCEEDED,
                ERRORED,
                r#"{"custom_id":"c","result":{"type":"canceled"}}"#,
                r#"{"custom_id":"d","result":{"type":"expired"}}"#,
                r#"{"custom_id":"e","result":{"type":"errored","error":{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}}}"#,
            ],
            &["a", "b", "c", "d", "e"],
        );
        assert_eq!(summary.delivered, 5);
        assert!(summary.quarantined.is_empty());
        let LineOutcome::Answer(a) = &got[0].outcome else {
            panic!("{:?}", got[0])
        };
        assert_eq!(a.content.as_deref(), Some("{\"same\":true}"));
        assert_eq!(a.finish_reason, FinishReason::Stop);
        assert_eq!(a.usage.unwrap().input_tokens, 120);
        assert_eq!(
            a.provider_request_id.as_deref(),
            Some("msg_014VwiXbi91y3JMjcpyGBHX5")
        );
        let LineOutcome::Error(e) = &got[1].outcome else {
            panic!()
        };
        assert_eq!(e.class, ErrorClass::Request);
        assert_eq!(e.http_status, None);
        assert!(
            e.message
                .contains("max_tokens: Field required [invalid_request_error]")
        );
        assert!(matches!(got[2].outcome, LineOutcome::NotRun(_)));
        assert!(matches!(got[3].outcome, LineOutcome::NotRun(_)));
        let LineOutcome::Error(e) = &got[4].outcome else {
            panic!()
        };
        assert_eq!(e.class, ErrorClass::Overloaded);
    }

    #[test]
    fn unknown_duplicate_and_broken_lines_are_quarantined() {
        let (got, summary) = ingest(
            &[
                SUCCEEDED,
                SUCCEEDED,
                ERRORED,
                r#"{"custom_id":"a2","result":{"type":"mystery"}}"#,
                r#"{"custom_id":"#,
                r#"{"result":{"type":"canceled"}}"#,
            ],
            &["a", "a2"],
        );
        assert_eq!(got.len(), 1);
        let q: Vec<(u64, Option<&str>)> = summary
            .quarantined
            .iter()
            .map(|q| (q.line, q.custom_id.as_deref()))
            .collect();
        assert_eq!(
            q,
            vec![
                (2, Some("a")),
                (3, Some("b")),
                (4, Some("a2")),
                (5, None),
                (6, None)
            ]
        );
        assert!(summary.quarantined[0].reason.contains("second result"));
        assert!(summary.quarantined[1].reason.contains("unknown custom_id"));
    }

    #[test]
    fn find_counts_requests_in_the_window() {
        let page: ListPage = serde_json::from_value(json!({
            "data": [
                {"id": "msgbatch_3", "type": "message_batch", "processing_status": "in_progress",
                 "request_counts": {"processing": 10, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0},
                 "created_at": "2024-09-24T18:40:00.000000Z", "expires_at": "2024-09-25T18:40:00.000000Z",
                 "ended_at": null, "cancel_initiated_at": null, "archived_at": null, "results_url": null},
                {"id": "msgbatch_2", "type": "message_batch", "processing_status": "ended",
                 "request_counts": {"processing": 0, "succeeded": 7, "errored": 1, "canceled": 1, "expired": 1},
                 "created_at": "2024-09-24T18:39:00Z", "expires_at": "2024-09-25T18:39:00Z",
                 "ended_at": "2024-09-24T18:45:00Z", "cancel_initiated_at": null, "archived_at": null,
                 "results_url": "https://api.anthropic.com/v1/messages/batches/msgbatch_2/results"},
                {"id": "msgbatch_1", "type": "message_batch", "processing_status": "ended",
                 "request_counts": {"processing": 0, "succeeded": 10, "errored": 0, "canceled": 0, "expired": 0},
                 "created_at": "2024-09-24T18:00:00Z", "expires_at": "2024-09-25T18:00:00Z",
                 "ended_at": "2024-09-24T18:30:00Z", "cancel_initiated_at": null, "archived_at": null,
                 "results_url": "https://api.anthropic.com/v1/messages/batches/msgbatch_1/results"}
            ],
            "has_more": false, "first_id": "msgbatch_3", "last_id": "msgbatch_1"
        }))
        .unwrap();
        let window = unix_of(Some("2024-09-24T18:38:00Z")).unwrap();
        let run = |after: f64, n: usize| {
            let mut found = Vec::new();
            page.matches(after, n, &mut found);
            found
        };
        assert_eq!(run(window, 10), vec!["msgbatch_3", "msgbatch_2"]);
        assert_eq!(
            run(unix_of(Some("2024-09-24T18:39:30Z")).unwrap(), 10),
            vec!["msgbatch_3"]
        );
        assert_eq!(run(0.0, 10).len(), 3);
        assert!(run(window, 11).is_empty());
        // Microseconds count.
        let t = unix_of(Some("2024-09-24T18:37:24.100435Z")).unwrap();
        assert!((t - 1727203044.100435).abs() < 1e-5, "{t}");
    }

    #[test]
    fn results_url_is_followed_only_on_the_api_origin() {
        let b = adapter();
        let mut s = batch(json!({}));
        let own = "https://api.anthropic.com/v1/messages/batches/msgbatch_013Zva2CMHLNnXjNJJKqJ2EF/results";
        s.output_ref = Some(own.into());
        assert_eq!(b.results_url(&s), own);
        s.output_ref = Some("https://evil.example/v1/x".into());
        assert_eq!(b.results_url(&s), own);
        assert!(same_origin(
            "HTTPS://API.anthropic.com/v1/x",
            "https://api.anthropic.com"
        ));
        assert!(!same_origin(
            "https://api.anthropic.com.evil/v1",
            "https://api.anthropic.com"
        ));
    }

    #[test]
    fn cadence_follows_the_seed() {
        let b = adapter();
        let min = |m: u64| Duration::from_secs(60 * m);
        assert_eq!(
            b.poll_after(&BatchState::InProgress, min(1)),
            Duration::from_secs(30)
        );
        assert_eq!(
            b.poll_after(&BatchState::InProgress, min(11)),
            Duration::from_secs(120)
        );
        assert_eq!(
            b.poll_after(&BatchState::InProgress, min(23 * 60 + 50)),
            Duration::from_secs(120)
        );
        assert_eq!(
            b.poll_after(&BatchState::Cancelling, min(60)),
            Duration::from_secs(30)
        );
        let f = fast();
        assert_eq!(
            f.after(&BatchState::InProgress, Duration::ZERO),
            Duration::from_millis(30)
        );
        assert_eq!(
            f.after(&BatchState::InProgress, Duration::from_secs(1)),
            Duration::from_millis(120)
        );
    }

    #[test]
    fn bad_custom_ids_are_refused_before_sending() {
        let b = adapter();
        let mut lines = vec![line("ok-1"), line("bad id")];
        let e = b.split(&lines).unwrap_err();
        assert_eq!(e.index, 1);
        lines[1].custom_id = "x".repeat(65);
        assert!(b.split(&lines).is_err());
        lines[1].custom_id = "ok-2".into();
        assert_eq!(b.split(&lines).unwrap().len(), 1);
    }
}
