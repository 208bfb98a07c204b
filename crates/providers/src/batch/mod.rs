//! Provider Batch APIs behind one trait: submit a file of requests, poll it,
//! stream its results, cancel it, and find a submission whose create answer
//! was lost. One folder per provider; orchestration never names a provider.
//!
//! Crash safety is the caller's: it records a batch (and each line's
//! `custom_id`) in the ledger before `submit`, stores the provider id the
//! moment `submit` returns, and on resume calls `find` for a batch with no
//! provider id before anything is submitted again.
//!
//! Besides the providers' folders, `lines` holds what a batch is made of,
//! `status` what a provider says about one, `window` how long one may
//! take, `uploads` the uploads kept across a create asked again, and
//! `registry` which adapter a config names; this module holds the trait
//! and the key handling every adapter shares.

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
mod lines;
pub mod openai;
mod registry;
pub mod results;
mod status;
#[cfg(test)]
mod tests;
mod uploads;
mod window;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use super::{ApiKey, ProviderError};

pub use lines::{
    BatchLimits, BatchLine, LinePage, LineReadError, LineSlice, LineSource, SubmitSpec, Submitted,
};
pub use registry::{build_batch, has_batch_api};
pub(crate) use status::verdict;
pub use status::{
    BatchCounts, BatchState, BatchStatus, Found, LineOutcome, Quarantined, ResultLine,
    ResultsSummary,
};
pub use uploads::is_token_limit;
pub(crate) use uploads::{KeptUploads, keep_upload_after};
pub use window::{FIND_CLOCK_MARGIN, USUAL_WINDOW, human_duration, stalled_for};

pub type BatchFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, ProviderError>> + Send + 'a>>;

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

/// The batch price against the synchronous one: every Batch API docket
/// speaks (OpenAI, Azure global batch, Anthropic, Gemini) bills 50%.
pub const BATCH_PRICE_FACTOR: f64 = 0.5;
