//! Provider Batch APIs behind one trait: submit a file of requests, poll it,
//! stream its results, cancel it, and find a submission whose create answer
//! was lost. One file per provider; orchestration never names a provider.
//!
//! Crash safety is the caller's: it records a batch (and each line's
//! `custom_id`) in the ledger before `submit`, stores the provider id the
//! moment `submit` returns, and on resume calls `find` for a batch with no
//! provider id before anything is submitted again.

/// The boxing and key scrubbing every adapter's trait methods share. An
/// adapter has async `submit_inner`, `poll_inner`, `results_inner`,
/// `cancel_inner` and `find_inner` plus `scrub`; this writes the trait's
/// five calls over them, so no error leaves an adapter unscrubbed.
macro_rules! scrubbed_batch_calls {
    () => {
        fn submit<'a>(
            &'a self,
            spec: $crate::batch::SubmitSpec<'a>,
        ) -> $crate::batch::BatchFuture<'a, $crate::batch::Submitted> {
            Box::pin(async move { self.submit_inner(&spec).await.map_err(|e| self.scrub(e)) })
        }

        fn poll<'a>(
            &'a self,
            provider_batch_id: &'a str,
        ) -> $crate::batch::BatchFuture<'a, $crate::batch::BatchStatus> {
            Box::pin(async move {
                self.poll_inner(provider_batch_id)
                    .await
                    .map_err(|e| self.scrub(e))
            })
        }

        fn results<'a>(
            &'a self,
            status: &'a $crate::batch::BatchStatus,
            expected: &'a std::collections::HashSet<String>,
            sink: &'a mut dyn $crate::batch::ResultSink,
        ) -> $crate::batch::BatchFuture<'a, $crate::batch::ResultsSummary> {
            Box::pin(async move {
                self.results_inner(status, expected, sink)
                    .await
                    .map_err(|e| self.scrub(e))
            })
        }

        fn cancel<'a>(
            &'a self,
            provider_batch_id: &'a str,
        ) -> $crate::batch::BatchFuture<'a, $crate::batch::BatchStatus> {
            Box::pin(async move {
                self.cancel_inner(provider_batch_id)
                    .await
                    .map_err(|e| self.scrub(e))
            })
        }

        fn find<'a>(
            &'a self,
            tag: &'a str,
            created_after: f64,
            request_count: usize,
        ) -> $crate::batch::BatchFuture<'a, $crate::batch::Found> {
            Box::pin(async move {
                self.find_inner(tag, created_after, request_count)
                    .await
                    .map_err(|e| self.scrub(e))
            })
        }
    };
}

/// The file calls of an adapter that uploads its batches' input (OpenAI,
/// Azure, Gemini): each an `_inner` method, or the `kept` uploads of
/// creates not yet confirmed, with its errors scrubbed of the key.
macro_rules! uploaded_file_calls {
    () => {
        fn delete_files<'a>(
            &'a self,
            provider_batch_id: &'a str,
            input_file: Option<&'a str>,
            results: Option<&'a $crate::batch::BatchStatus>,
        ) -> $crate::batch::BatchFuture<'a, usize> {
            Box::pin(async move {
                self.delete_files_inner(provider_batch_id, input_file, results)
                    .await
                    .map_err(|e| self.scrub(e))
            })
        }

        fn abandon<'a>(&'a self, tag: &'a str) -> $crate::batch::BatchFuture<'a, ()> {
            Box::pin(async move {
                if let Some(f) = self.kept.forget(tag) {
                    self.delete_unused(&f).await;
                }
                Ok(())
            })
        }
    };
}

pub mod anthropic;
pub mod gemini;
mod http;
pub mod jsonl;
pub mod openai;
pub mod results;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use super::{ApiKey, ChatAnswer, ChatRequest, ProviderError, ProviderSetupError};
use docket_model::config::{ProviderConfig, ProviderKind};

pub type BatchFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, ProviderError>> + Send + 'a>>;

/// One request attempt in a batch. `custom_id` is stable per attempt and
/// matches `BatchLimits::custom_id_ok`.
#[derive(Debug, Clone)]
pub struct BatchLine {
    pub custom_id: String,
    pub request: ChatRequest,
}

/// What one provider accepts in one batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    pub max_requests: usize,
    /// The whole input file (or inline body), in bytes.
    pub max_bytes: u64,
    /// Longest `custom_id` accepted.
    pub max_custom_id: usize,
}

impl BatchLimits {
    /// `[A-Za-z0-9_-]{1,max}`: the strictest pattern (Anthropic's), used for
    /// every provider so ids never need translating.
    pub fn custom_id_ok(&self, id: &str) -> bool {
        !id.is_empty()
            && id.len() <= self.max_custom_id
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    }
}

/// A batch to create. `tag` is docket's own id for it, sent where the
/// provider keeps one (OpenAI/Azure metadata, Gemini display name) so a
/// submission whose create answer was lost can be found again.
pub struct SubmitSpec<'a> {
    pub tag: &'a str,
    pub model: &'a str,
    /// Read a page at a time: checked and measured once, then read again
    /// as the body is sent.
    pub lines: &'a dyn LineSource,
}

/// A batch's lines, read a page at a time, so that a batch of 50,000 is
/// never held whole (the engine's come from the ledger, where they were
/// recorded before the upload).
pub trait LineSource: Send + Sync {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Up to `max` lines from position `from`, in order; fewer only at the
    /// end. The same positions give the same lines every time.
    fn read(&self, from: usize, max: usize) -> LinePage<'_>;
}

/// A page of a `LineSource`; an error says why the lines cannot be read.
pub type LinePage<'a> = Pin<Box<dyn Future<Output = Result<Vec<BatchLine>, String>> + Send + 'a>>;

/// Lines already in memory (tests, tools).
impl LineSource for Vec<BatchLine> {
    fn len(&self) -> usize {
        Vec::len(self)
    }

    fn read(&self, from: usize, max: usize) -> LinePage<'_> {
        page_of(self, from, max)
    }
}

/// Borrowed lines already in memory, as a `LineSource`.
pub struct LineSlice<'a>(pub &'a [BatchLine]);

impl LineSource for LineSlice<'_> {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn read(&self, from: usize, max: usize) -> LinePage<'_> {
        page_of(self.0, from, max)
    }
}

/// Up to `max` of `lines` from `from`, copied.
fn page_of(lines: &[BatchLine], from: usize, max: usize) -> LinePage<'static> {
    let end = from.saturating_add(max).min(lines.len());
    let page = lines.get(from..end).map(<[BatchLine]>::to_vec);
    Box::pin(async move { Ok(page.unwrap_or_default()) })
}

/// The provider's handle on a created batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    pub provider_batch_id: String,
    /// The uploaded input file, when the provider takes one.
    pub input_file_id: Option<String>,
}

/// Where a batch is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchState {
    Validating,
    InProgress,
    /// Done running; results are being prepared. Not 100% yet.
    Finalizing,
    Completed,
    /// Rejected as a whole (its input failed validation, a limit at create).
    Failed(String),
    /// The window ran out: finished requests have results, the rest do not.
    Expired,
    Cancelling,
    Cancelled,
}

impl BatchState {
    /// No further change will come; results (if any) can be fetched.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            BatchState::Completed
                | BatchState::Failed(_)
                | BatchState::Expired
                | BatchState::Cancelled
        )
    }

    pub fn as_str(&self) -> &str {
        match self {
            BatchState::Validating => "validating",
            BatchState::InProgress => "in_progress",
            BatchState::Finalizing => "finalizing",
            BatchState::Completed => "completed",
            BatchState::Failed(_) => "failed",
            BatchState::Expired => "expired",
            BatchState::Cancelling => "cancelling",
            BatchState::Cancelled => "cancelled",
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchCounts {
    pub total: u64,
    pub completed: u64,
    pub failed: u64,
}

/// One poll's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchStatus {
    pub provider_batch_id: String,
    pub state: BatchState,
    pub counts: BatchCounts,
    /// Where the results are, once they exist (OpenAI output/error file
    /// ids, an Anthropic results URL, a Gemini file name).
    pub output_ref: Option<String>,
    pub error_ref: Option<String>,
    /// Terminal, but the results are not there yet (an output file that
    /// arrives after `completed`): poll again, do not ingest.
    pub results_pending: bool,
}

/// What one result line says about its request.
#[derive(Debug, Clone)]
pub enum LineOutcome {
    /// The model answered (the gate decides the rest).
    Answer(ChatAnswer),
    /// The request failed at the provider (classified as a sync error would be).
    Error(ProviderError),
    /// Never run (expired or cancelled before its turn): not billed; it
    /// goes back to pending for a new batch or the sync path.
    NotRun(String),
}

#[derive(Debug, Clone)]
pub struct ResultLine {
    pub custom_id: String,
    pub outcome: LineOutcome,
}

pub use docket_model::batch::Quarantined;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResultsSummary {
    pub lines: u64,
    pub delivered: u64,
    pub quarantined: Vec<Quarantined>,
    /// Quarantined lines past the first `results::MAX_QUARANTINE_KEPT`:
    /// counted, their reasons not kept.
    pub quarantined_more: u64,
    /// The stream ended mid-line or early: what was delivered stands; the
    /// rest must be fetched again (and `missing` is not worked out).
    pub cut: bool,
    /// Expected ids with no result line at all after a whole read of a
    /// Completed or Failed batch, sorted. The provider said nothing about
    /// them: the caller decides (run them again, or ask). For an Expired or
    /// Cancelled batch such ids are listed here only by a provider that
    /// writes a line for every request (Anthropic); others deliver each as
    /// `LineOutcome::NotRun` (and count it in `delivered`).
    pub missing: Vec<String>,
}

/// How long a batch may take before it is late: every Batch API docket
/// speaks aims to finish within 24 h (OpenAI's and Azure's
/// `completion_window`, Anthropic's expiry, Gemini's target).
pub const USUAL_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// Row B8: how long a batch in `state` (as the ledger stores it), at the
/// provider since `since` (unix seconds), has been stalled at `now`: the
/// time past `window` (`USUAL_WINDOW` unless configured) while the provider
/// still has not finished it. None when it is not stalled (finished, not
/// at the provider yet, or within its time).
pub fn stalled_for(
    state: &str,
    since: Option<f64>,
    now: f64,
    window: Option<Duration>,
) -> Option<Duration> {
    let running = matches!(
        state,
        "validating" | "in_progress" | "finalizing" | "cancelling"
    );
    let since = since.filter(|s| s.is_finite())?;
    let past = now - since - window.unwrap_or(USUAL_WINDOW).as_secs_f64();
    (running && past.is_finite() && past > 0.0).then(|| Duration::from_secs_f64(past))
}

/// A duration as the console and the run's lines say it: `45s`, `12m`,
/// `3h 5m`, `2d 4h`.
pub fn human_duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86_400 => match (s / 3600, s % 3600 / 60) {
            (h, 0) => format!("{h}h"),
            (h, m) => format!("{h}h {m}m"),
        },
        _ => match (s / 86_400, s % 86_400 / 3600) {
            (d, 0) => format!("{d}d"),
            (d, h) => format!("{d}d {h}h"),
        },
    }
}

/// How far before `created_after` every `find` looks, in seconds:
/// `created_after` is the local clock, compared with the provider's
/// timestamps, and a local clock running a little fast must not hide the
/// batch being looked for. A wider window is the safe side: at worst it
/// makes `Found::Ambiguous` more likely.
pub const FIND_CLOCK_MARGIN: f64 = 600.0;

/// `builder` with the API key in header `name`, marked sensitive (never
/// indexed by HTTP/2, `Sensitive` in `Debug`). A key that is no valid header
/// value is an `Auth` error whose message never holds it.
#[allow(clippy::result_large_err)] // `ProviderError`, as everywhere in `provider`
pub(crate) fn with_key_header(
    builder: reqwest::RequestBuilder,
    name: &'static str,
    key: &ApiKey,
) -> Result<reqwest::RequestBuilder, ProviderError> {
    let mut value = reqwest::header::HeaderValue::from_str(key.expose()).map_err(|_| {
        ProviderError {
            class: super::ErrorClass::Auth,
            http_status: None,
            message: "the API key is not a valid HTTP header value (check it for stray whitespace, newlines or non-ASCII characters)".into(),
            headers: crate::limiter::RateHeaders::default(),
        }
    })?;
    value.set_sensitive(true);
    Ok(builder.header(name, value))
}

/// Provider text made safe to store: `key` (when it is long enough to
/// tell) and key-shaped words out.
pub(crate) fn clean(text: &str, key: Option<&ApiKey>) -> String {
    let mut s = text.to_string();
    if let Some(k) = key
        && k.expose().len() >= 4
    {
        s = s.replace(k.expose(), "[redacted]");
    }
    super::openai::redact(&s)
}

/// What `find` learned about a submission whose outcome is unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// Exactly one batch is ours: record it, never resubmit.
    One(String),
    /// None of the provider's batches is ours: safe to submit.
    None,
    /// Several could be ours and cannot be told apart: wait and tell the
    /// operator rather than pay twice.
    Ambiguous(Vec<String>),
}

/// One exact match is ours; none at all is safe to submit; anything else
/// (several, or our tag with another count) cannot be told apart. `unknown`
/// are batches with nothing to check them by (an Azure api-version that
/// drops metadata): any of them could be ours, so with no match they are
/// Ambiguous, never None (beside one exact match, metadata is evidently
/// kept, and they are someone else's).
pub(crate) fn verdict(
    mut exact: Vec<String>,
    tag_only: Vec<String>,
    unknown: Vec<String>,
) -> Found {
    match (exact.len(), tag_only.len(), unknown.len()) {
        (0, 0, 0) => Found::None,
        (1, 0, _) => Found::One(exact.remove(0)),
        (0, 0, _) => Found::Ambiguous(unknown),
        _ => Found::Ambiguous(exact.into_iter().chain(tag_only).collect()),
    }
}

/// Where a batch's results go, line by line, as they are read.
pub trait ResultSink: Send {
    fn accept(&mut self, line: ResultLine);
    /// Resolves once the sink can take more lines. The reader waits on it
    /// between pieces of a download, so a consumer slower than the network
    /// slows the read instead of piling results up in memory. A closure is
    /// always ready.
    fn room(&mut self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(std::future::ready(()))
    }
}

impl<F: FnMut(ResultLine) + Send> ResultSink for F {
    fn accept(&mut self, line: ResultLine) {
        self(line)
    }
}

/// A provider's Batch API.
pub trait BatchProvider: Send + Sync {
    fn name(&self) -> &str;
    fn limits(&self) -> BatchLimits;
    /// Discount against the synchronous price (0.5 = half price).
    fn price_factor(&self) -> f64 {
        BATCH_PRICE_FACTOR
    }
    /// How long to wait before polling a batch in `state`, `age` after its
    /// submission (the seed's cadence table; the caller adds jitter).
    fn poll_after(&self, state: &BatchState, age: Duration) -> Duration;
    /// Check `lines` (custom ids, sizes) and cut them into the input files
    /// this provider accepts, each to be one `submit`. Adapters encode
    /// exactly as they upload; the default measures a provider-neutral
    /// encoding of the request.
    fn split<'l>(&self, lines: &'l [BatchLine]) -> Result<Vec<jsonl::Chunk<'l>>, jsonl::LineError> {
        jsonl::split(lines, self.limits(), jsonl::neutral_encoding)
    }
    /// Upload (where the provider takes a file) and create. Input is
    /// validated locally first: a line the provider would reject, or a file
    /// over its limits, is an error before anything is sent.
    fn submit<'a>(&'a self, spec: SubmitSpec<'a>) -> BatchFuture<'a, Submitted>;
    fn poll<'a>(&'a self, provider_batch_id: &'a str) -> BatchFuture<'a, BatchStatus>;
    /// Stream the results of a terminal batch into `sink`, in any order,
    /// matched by `custom_id` against `expected`. Lines for ids not in
    /// `expected`, or seen twice, are quarantined. After a read that was
    /// not cut, every expected id is accounted for: a line, a `NotRun` for
    /// an Expired or Cancelled batch, or `ResultsSummary::missing`.
    fn results<'a>(
        &'a self,
        status: &'a BatchStatus,
        expected: &'a std::collections::HashSet<String>,
        sink: &'a mut dyn ResultSink,
    ) -> BatchFuture<'a, ResultsSummary>;
    /// Ask the provider to stop; idempotent (cancelling a finished batch is
    /// not an error).
    fn cancel<'a>(&'a self, provider_batch_id: &'a str) -> BatchFuture<'a, BatchStatus>;
    /// Look for a batch created for `tag` (with `request_count` requests, at
    /// or after `created_after`, unix seconds by the local clock, less
    /// `FIND_CLOCK_MARGIN`) whose create answer was lost.
    fn find<'a>(
        &'a self,
        tag: &'a str,
        created_after: f64,
        request_count: usize,
    ) -> BatchFuture<'a, Found>;
    /// Delete what batch `provider_batch_id` left in the provider's file
    /// storage once docket is done with it (terminal, every line's outcome
    /// recorded): its uploaded input (`input_file`, as `Submitted` named it;
    /// looked up when None, a batch found again after a lost create) and,
    /// when `results` is given, the results files it names (left alone when
    /// None: something in them could not be used and they are kept to be
    /// looked at). A file already gone counts as deleted: this is safe to
    /// call again. Providers with no files (Anthropic) have nothing to do.
    /// The answer is the files deleted.
    fn delete_files<'a>(
        &'a self,
        provider_batch_id: &'a str,
        input_file: Option<&'a str>,
        results: Option<&'a BatchStatus>,
    ) -> BatchFuture<'a, usize> {
        let _ = (provider_batch_id, input_file, results);
        Box::pin(async { Ok(0) })
    }
    /// The caller gave up on submitting `tag` (no batch was made): an
    /// upload kept for a create asked again is deleted.
    fn abandon<'a>(&'a self, tag: &'a str) -> BatchFuture<'a, ()> {
        let _ = tag;
        Box::pin(async { Ok(()) })
    }
}

/// Uploads kept by tag after a create that made no batch but may be asked
/// again (a rate limit, a timeout, a 5xx): the next `submit` of the same
/// tag with the same bytes reuses the file instead of uploading it again
/// (an upload and a create each take from the provider's request limits);
/// a changed one is deleted, and so is one given up on (`abandon`).
#[derive(Default)]
pub(crate) struct KeptUploads(std::sync::Mutex<std::collections::HashMap<String, (String, u64)>>);

impl KeptUploads {
    /// The upload kept for `tag`: (to reuse, when it has `bytes` bytes; to
    /// delete, when it has not).
    pub(crate) fn take(&self, tag: &str, bytes: u64) -> (Option<String>, Option<String>) {
        let kept = self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(tag);
        match kept {
            Some((file, n)) if n == bytes => (Some(file), None),
            Some((file, _)) => (None, Some(file)),
            None => (None, None),
        }
    }

    pub(crate) fn keep(&self, tag: &str, file: String, bytes: u64) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(tag.to_string(), (file, bytes));
    }

    pub(crate) fn forget(&self, tag: &str) -> Option<String> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(tag)
            .map(|(f, _)| f)
    }
}

/// Whether the upload of a create that failed with `e` is kept (to be
/// reused by the same create asked again, or read by a batch the create
/// may have made after all) rather than deleted at once: a refusal (a 4xx)
/// made no batch and will not be asked again as it was, but a plain rate
/// limit, a timeout, a conflict, a 5xx or no answer will.
pub(crate) fn keep_upload_after(e: &ProviderError) -> bool {
    match e.http_status {
        Some(429) => !is_token_limit(&e.message),
        Some(408 | 409) => true,
        Some(s) => !(400..500).contains(&s),
        None => true,
    }
}

/// Whether a provider's refusal is its enqueued-token limit (OpenAI's and
/// Azure's `token_limit_exceeded`, Anthropic's "queued batch tokens",
/// Gemini's `batch_enqueued_tokens` quota), rather than a request rate.
pub fn is_token_limit(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("token_limit_exceeded")
        || m.contains("enqueued token")
        || m.contains("enqueued_token")
        || m.contains("queued batch tokens")
}

/// Whether docket has a Batch API adapter for `kind`. Ollama has no Batch
/// API; OpenRouter documents none (its requests go synchronously:
/// simulated batching).
pub fn has_batch_api(kind: ProviderKind) -> bool {
    matches!(
        kind,
        ProviderKind::Openai
            | ProviderKind::OpenaiCompatible
            | ProviderKind::Mock
            | ProviderKind::Azure
            | ProviderKind::Anthropic
            | ProviderKind::Gemini
    )
}

/// `DOCKET_GEMINI_INLINE_LIMIT_BYTES`: Gemini batch bodies above this many
/// bytes go up as a file (the Files API) instead of inline; the default is
/// the API's 20 MB. For trying the file path on small batches.
const GEMINI_INLINE_LIMIT_ENV: &str = "DOCKET_GEMINI_INLINE_LIMIT_BYTES";

fn gemini_inline_limit() -> Option<u64> {
    std::env::var(GEMINI_INLINE_LIMIT_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|n| n.min(gemini::INLINE_LIMIT))
}

/// The batch price against the synchronous one: every Batch API docket
/// speaks (OpenAI, Azure global batch, Anthropic, Gemini) bills 50%.
pub const BATCH_PRICE_FACTOR: f64 = 0.5;

/// The batch registry: the Batch API adapter for a config, `None` for kinds
/// with no Batch API adapter (yet): those run through the sync path.
/// `base_url_override` as for `provider::build`.
pub fn build_batch(
    name: &str,
    cfg: &ProviderConfig,
    base_url_override: Option<&str>,
) -> Result<Option<Box<dyn BatchProvider>>, ProviderSetupError> {
    let key = super::read_key(name, cfg)?;
    build_batch_with_key(name, cfg, base_url_override, key)
}

pub(crate) fn build_batch_with_key(
    name: &str,
    cfg: &ProviderConfig,
    base_url_override: Option<&str>,
    key: Option<ApiKey>,
) -> Result<Option<Box<dyn BatchProvider>>, ProviderSetupError> {
    let setup = |message: String| ProviderSetupError::Other {
        provider: name.into(),
        message,
    };
    if !has_batch_api(cfg.kind) {
        return Ok(None);
    }
    let base = base_url_override
        .map(str::to_string)
        .or_else(|| cfg.base_url.clone())
        .or_else(|| cfg.kind.default_base_url().map(str::to_string))
        .ok_or_else(|| {
            setup(format!(
                "base_url is required for kind = \"{}\"",
                cfg.kind.as_str()
            ))
        })?;
    let batch: Box<dyn BatchProvider> = match cfg.kind {
        ProviderKind::Azure => {
            let version = cfg
                .api_version
                .as_ref()
                .map(|v| v.get_ref().clone())
                .ok_or_else(|| setup("api_version is required for kind = \"azure\"".into()))?;
            let key =
                key.ok_or_else(|| setup("api_key_env is required for kind = \"azure\"".into()))?;
            Box::new(openai::OpenAiBatch::azure(&base, &version, key).map_err(setup)?)
        }
        ProviderKind::Anthropic => {
            let key = key
                .ok_or_else(|| setup("api_key_env is required for kind = \"anthropic\"".into()))?;
            Box::new(anthropic::AnthropicBatch::new(&base, key).map_err(setup)?)
        }
        ProviderKind::Gemini => {
            let key =
                key.ok_or_else(|| setup("api_key_env is required for kind = \"gemini\"".into()))?;
            let g = gemini::GeminiBatch::new(&base, key).map_err(setup)?;
            Box::new(match gemini_inline_limit() {
                Some(n) => g.with_inline_limit(n),
                None => g,
            })
        }
        _ => Box::new(openai::OpenAiBatch::openai(cfg.kind.as_str(), &base, key).map_err(setup)?),
    };
    Ok(Some(batch))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_past_its_window_and_not_done_is_stalled() {
        let h = |x: f64| x * 3600.0;
        let now = h(100.0);
        let day = Some(now - h(25.0));
        assert_eq!(
            stalled_for("in_progress", day, now, None),
            Some(Duration::from_secs(3600))
        );
        assert_eq!(
            stalled_for("in_progress", Some(now - h(23.0)), now, None),
            None
        );
        for done in ["completed", "ingested", "failed", "submitting", "unknown"] {
            assert_eq!(stalled_for(done, day, now, None), None, "{done}");
        }
        let short = Some(Duration::from_secs(60));
        assert_eq!(
            stalled_for("validating", Some(now - 90.0), now, short),
            Some(Duration::from_secs(30))
        );
        assert_eq!(stalled_for("in_progress", None, now, short), None);
        assert_eq!(stalled_for("in_progress", Some(f64::NAN), now, short), None);
        assert_eq!(human_duration(Duration::from_secs(45)), "45s");
        assert_eq!(human_duration(Duration::from_secs(12 * 60 + 5)), "12m");
        assert_eq!(human_duration(Duration::from_secs(3 * 3600 + 300)), "3h 5m");
        assert_eq!(
            human_duration(Duration::from_secs(2 * 86_400 + 4 * 3600)),
            "2d 4h"
        );
    }

    #[test]
    fn key_headers_are_marked_sensitive() {
        let client = reqwest::Client::new();
        let key = ApiKey::new("k-sensitive-1");
        for name in ["api-key", "x-api-key", "x-goog-api-key"] {
            let req = with_key_header(client.get("http://127.0.0.1:9/"), name, &key)
                .unwrap()
                .build()
                .unwrap();
            let v = &req.headers()[name];
            assert!(v.is_sensitive(), "{name}");
            assert_eq!(v.to_str().unwrap(), "k-sensitive-1");
            assert!(!format!("{req:?}").contains("k-sensitive-1"), "{name}");
        }
        let bad = ApiKey::new("k-bad\nkey");
        let e = with_key_header(client.get("http://127.0.0.1:9/"), "x-api-key", &bad).unwrap_err();
        assert_eq!(e.class, super::super::ErrorClass::Auth);
        assert!(!e.message.contains("k-bad"), "{e}");
    }

    #[test]
    fn the_batch_registry_knows_openai_and_azure_only_for_now() {
        let key = || Some(ApiKey::new("k-test"));
        for (kind, extra, label) in [
            ("openai", "", Some("openai")),
            (
                "openai_compatible",
                "base_url = \"http://x/v1\"",
                Some("openai_compatible"),
            ),
            ("mock", "", Some("mock")),
            (
                "azure",
                "base_url = \"https://r.openai.azure.com\"\napi_version = \"2024-10-21\"",
                Some("azure"),
            ),
            ("anthropic", "", Some("anthropic")),
            ("gemini", "", Some("gemini")),
            ("ollama", "", None),
            ("openrouter", "", None),
        ] {
            let c: ProviderConfig =
                toml::from_str(&format!("kind = \"{kind}\"\nmodel = \"m\"\n{extra}\n")).unwrap();
            let b = build_batch_with_key("p", &c, None, key()).unwrap();
            assert_eq!(b.as_ref().map(|b| b.name()), label, "{kind}");
        }
        let c: ProviderConfig =
            toml::from_str("kind = \"azure\"\nmodel = \"d\"\nbase_url = \"https://r\"\n").unwrap();
        let e = build_batch_with_key("p", &c, None, key()).err().unwrap();
        assert!(e.to_string().contains("api_version"), "{e}");
    }
}
