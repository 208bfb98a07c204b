//! The HTTP plumbing every Batch API adapter shares: a control call whose
//! non-2xx answer is classified as the provider's synchronous adapter would
//! classify it, a results download streamed into a `Matcher`, a JSON answer
//! read or turned into an error, a request body encoded a piece at a time
//! as it is sent, and the checks made before a batch is sent. What differs
//! between providers (how an error is classified, how rate headers are
//! read, how a body is framed) is a parameter.

#![allow(clippy::result_large_err)] // `ProviderError`, as everywhere in `provider`

use std::future::Future;

use futures::SinkExt;
use reqwest::header::HeaderMap;
use serde::de::DeserializeOwned;

use super::jsonl::{Chunk, LineError};
use super::results::{Matcher, StreamEnd, stream_lines};
use super::{BatchLimits, BatchLine, SubmitSpec};
use crate::limiter::RateHeaders;
use crate::provider::openai::{preview, transport_error};
use crate::provider::{ErrorClass, ProviderError, RawAnswer};

/// A streamed body is sent in pieces of about this size.
pub(super) const PIECE: usize = 256 * 1024;

/// How one provider's answers are read.
#[derive(Clone, Copy)]
pub(super) struct Wire {
    /// The rate headers kept on an answer that is not understood.
    pub rate_headers: fn(&HeaderMap) -> RateHeaders,
    /// A non-2xx answer as an error, classified like a synchronous one.
    pub error_of: fn(&RawAnswer) -> ProviderError,
}

impl Wire {
    /// Send `authed`; a non-2xx answer is an error (`error_of`).
    pub(super) async fn call(
        &self,
        authed: reqwest::RequestBuilder,
    ) -> Result<RawAnswer, ProviderError> {
        let raw = crate::provider::exchange(authed).await?;
        if (200..300).contains(&raw.status) {
            Ok(raw)
        } else {
            Err((self.error_of)(&raw))
        }
    }

    /// Send `authed` for a results download and stream its 200 answer, line
    /// by line (each `"{label} {n}"`), into `m` through `on_line`; any other
    /// status is an error (`error_of`).
    pub(super) async fn stream<'a>(
        &self,
        authed: reqwest::RequestBuilder,
        label: &str,
        m: &mut Matcher<'a>,
        on_line: impl Fn(&mut Matcher<'a>, &[u8], &str),
    ) -> Result<StreamEnd, ProviderError> {
        let response = authed.send().await.map_err(|e| transport_error(&e))?;
        let status = response.status().as_u16();
        if status != 200 {
            let headers = response.headers().clone();
            let bytes = response
                .bytes()
                .await
                .map(|b| b.to_vec())
                .unwrap_or_default();
            return Err((self.error_of)(&RawAnswer {
                status,
                headers,
                bytes,
            }));
        }
        Ok(stream_lines(response, label, m, on_line).await)
    }

    /// `raw`'s body as `T`, or a transient error saying `what` answer was
    /// not understood.
    pub(super) fn parse_json<T: DeserializeOwned>(
        &self,
        raw: &RawAnswer,
        what: &str,
    ) -> Result<T, ProviderError> {
        serde_json::from_slice(&raw.bytes).map_err(|e| {
            not_understood(
                raw.status,
                format!(
                    "{what} answer is not understood: {e}; body starts {}",
                    preview(&raw.bytes)
                ),
                (self.rate_headers)(&raw.headers),
            )
        })
    }
}

/// A request docket will not send (or cannot go on with).
pub(super) fn request_error(message: String) -> ProviderError {
    ProviderError {
        class: ErrorClass::Request,
        http_status: None,
        message,
        headers: RateHeaders::default(),
    }
}

/// An answer with `status` that could not be used: transient (asking again
/// may do).
pub(super) fn not_understood(status: u16, message: String, headers: RateHeaders) -> ProviderError {
    ProviderError {
        class: ErrorClass::Transient,
        http_status: Some(status),
        message,
        headers,
    }
}

/// A line of the batch whose model is not `spec.model`, as an error (its
/// reason ends with `note`): one model per batch.
pub(super) fn one_model(spec: &SubmitSpec<'_>, note: &str) -> Result<(), ProviderError> {
    match spec
        .lines
        .iter()
        .enumerate()
        .find(|(_, l)| l.request.model != spec.model)
    {
        None => Ok(()),
        Some((i, line)) => Err(request_error(
            LineError {
                index: i,
                custom_id: line.custom_id.clone(),
                reason: format!(
                    "model {:?} differs from the batch's model {:?}{note}",
                    line.request.model, spec.model
                ),
            }
            .to_string(),
        )),
    }
}

/// The one chunk `split` made of a batch's lines; more than one is an error
/// (`per` after the byte limit, `unit` what a second chunk would start).
pub(super) fn one_chunk<'l>(
    split: Result<Vec<Chunk<'l>>, LineError>,
    limits: BatchLimits,
    per: &str,
    unit: &str,
) -> Result<Chunk<'l>, ProviderError> {
    let mut chunks = split.map_err(|e| request_error(e.to_string()))?;
    if chunks.len() > 1 {
        let second = &chunks[1];
        return Err(request_error(format!(
            "the requests do not fit one batch ({} requests, {} bytes{per}): \
             line {} (custom_id {:?}) starts a second {unit}; split them first",
            limits.max_requests,
            limits.max_bytes,
            second.first + 1,
            second.lines[0].custom_id
        )));
    }
    Ok(chunks.swap_remove(0))
}

/// How encoded lines are put together into a body.
pub(super) struct Framing {
    /// Before the first line.
    pub open: &'static [u8],
    /// Between two lines.
    pub between: &'static [u8],
    /// After every line.
    pub after: &'static [u8],
    /// After the last line.
    pub close: &'static [u8],
}

/// JSONL: every line ends with a newline.
pub(super) const JSONL: Framing = Framing {
    open: b"",
    between: b"",
    after: b"\n",
    close: b"",
};

/// A body of `chunk`'s lines, encoded by `encode` and framed by `framing` a
/// piece at a time as it is sent: the body to send, and the future that
/// feeds it (to be run beside the send). An encoding error fails the body.
pub(super) fn streamed_body<'c>(
    chunk: &'c Chunk<'_>,
    framing: &'c Framing,
    encode: impl Fn(&BatchLine) -> Result<Vec<u8>, String> + 'c,
) -> (reqwest::Body, impl Future<Output = ()> + 'c) {
    streamed_body_opening(chunk, framing.open, framing, encode)
}

/// As `streamed_body`, but the body opens with `open` (made at run time,
/// say holding a name) in place of `framing.open`.
pub(super) fn streamed_body_opening<'c>(
    chunk: &'c Chunk<'_>,
    open: &'c [u8],
    framing: &'c Framing,
    encode: impl Fn(&BatchLine) -> Result<Vec<u8>, String> + 'c,
) -> (reqwest::Body, impl Future<Output = ()> + 'c) {
    let (mut tx, rx) = futures::channel::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(2);
    let produce = async move {
        let mut piece = Vec::with_capacity(PIECE + 4096);
        piece.extend_from_slice(open);
        for (i, line) in chunk.lines.iter().enumerate() {
            let encoded = match encode(line) {
                Ok(v) => v,
                Err(e) => {
                    let _ = tx.send(Err(std::io::Error::other(e))).await;
                    return;
                }
            };
            if i > 0 {
                piece.extend_from_slice(framing.between);
            }
            piece.extend_from_slice(&encoded);
            piece.extend_from_slice(framing.after);
            if piece.len() >= PIECE {
                let full = std::mem::replace(&mut piece, Vec::with_capacity(PIECE + 4096));
                // A closed channel: the send ended early; its answer says why.
                if tx.send(Ok(full)).await.is_err() {
                    return;
                }
            }
        }
        piece.extend_from_slice(framing.close);
        if !piece.is_empty() {
            let _ = tx.send(Ok(piece)).await;
        }
    };
    (reqwest::Body::wrap_stream(rx), produce)
}

/// Settle how a results read ended on `m`: `Ok(true)` when every line was
/// read; `Ok(false)` when it was cut (what came before stands, `m` is
/// marked cut, a broken stream is logged scrubbed); an error when it broke
/// before any line was read (the caller retries the whole call).
pub(super) fn settle(
    m: &mut Matcher<'_>,
    end: Result<StreamEnd, ProviderError>,
    batch: &str,
    scrub: impl Fn(ProviderError) -> ProviderError,
) -> Result<bool, ProviderError> {
    match end {
        Ok(StreamEnd::Whole) => return Ok(true),
        Ok(StreamEnd::Cut) => {}
        Ok(StreamEnd::Broken(e)) | Err(e) if m.lines() == 0 => return Err(e),
        Ok(StreamEnd::Broken(e)) | Err(e) => {
            let e = scrub(e);
            tracing::warn!(batch = %batch, "results stream cut: {e}");
        }
    }
    m.set_cut();
    Ok(false)
}

/// The answer to a cancel that failed with `e`: cancel is idempotent, so
/// for a 400 or 409 (already finished, or already stopping) it is where the
/// batch is `now`, when `settled` accepts that state; else `e`.
pub(super) async fn cancel_refused(
    e: ProviderError,
    now: impl Future<Output = Result<super::BatchStatus, ProviderError>>,
    settled: impl Fn(&super::BatchState) -> bool,
) -> Result<super::BatchStatus, ProviderError> {
    if !matches!(e.http_status, Some(400 | 409)) {
        return Err(e);
    }
    match now.await {
        Ok(s) if settled(&s.state) => Ok(s),
        _ => Err(e),
    }
}
