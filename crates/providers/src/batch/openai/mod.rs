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
//!
//! This module holds the adapter, its flavours and settings and the calls
//! every part shares; `submit` creates a batch, `files` owns the Files API
//! (upload, delete), `poll` reads and cancels, `results` reads the output
//! and error files, and `find` looks for a batch whose create answer was
//! lost.

#![allow(clippy::result_large_err)]

mod files;
mod find;
mod poll;
mod results;
mod submit;
#[cfg(test)]
mod tests;

use std::time::Duration;

use serde::Deserialize;

use super::http::Wire;
use super::jsonl::{self, Chunk, LineError};
use super::{BatchLimits, BatchLine, BatchProvider, BatchState, with_key_header};
use crate::openai::{classify_error, rate_headers};
use crate::{ApiKey, ProviderError, RawAnswer};
use poll::BatchObject;

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
    pub fn openai(
        label: &str,
        base_url: &str,
        key: Option<ApiKey>,
    ) -> Result<Self, crate::ClientError> {
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
    pub fn azure(
        base_url: &str,
        api_version: &str,
        key: ApiKey,
    ) -> Result<Self, crate::ClientError> {
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

fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}
