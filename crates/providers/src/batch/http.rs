//! The HTTP plumbing every Batch API adapter shares: a control call whose
//! non-2xx answer is classified as the provider's synchronous adapter would
//! classify it, a results download streamed into a `Matcher`, a JSON answer
//! read or turned into an error, a request body encoded a piece at a time
//! as it is sent, and the checks made before a batch is sent. What differs
//! between providers (how an error is classified, how rate headers are
//! read, how a body is framed) is a parameter.

#![allow(clippy::result_large_err)] // `ProviderError`, as everywhere in `provider`

use std::fmt;
use std::future::Future;

use futures::SinkExt;
use reqwest::header::HeaderMap;
use serde::de::DeserializeOwned;

use super::jsonl::{LineCheck, LineError};
use super::results::{Matcher, StreamEnd, stream_lines};
use super::{BatchLimits, BatchLine, LineSource, SubmitSpec};
use crate::limiter::RateHeaders;
use crate::openai::{preview, transport_error};
use crate::{ErrorClass, ProviderError, RawAnswer};

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
        let raw = crate::exchange(authed).await?;
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

/// A batch's body as `measure` found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Measured {
    pub lines: u64,
    /// Every encoded line plus its newline.
    pub bytes: u64,
}

/// Lines read from a source at a time, to check, measure or send them.
pub(super) const READ_PAGE: usize = 2_000;

/// Read `spec`'s lines a page at a time and check them before anything is
/// sent: one model per batch (a refusal ends with `model_note`), each line
/// as `jsonl::split` checks it, and all of them in one file of `limits`
/// (`per` after the byte limit, `unit` what a second one would start).
/// What is held is one page and the ids seen, never the whole batch.
pub(super) async fn measure<E: fmt::Display>(
    spec: &SubmitSpec<'_>,
    limits: BatchLimits,
    encode: impl Fn(&BatchLine) -> Result<Vec<u8>, E>,
    model_note: &str,
    per: &str,
    unit: &str,
) -> Result<Measured, ProviderError> {
    let mut check = LineCheck::new(limits);
    let mut total = Measured { lines: 0, bytes: 0 };
    let mut at = 0usize;
    while at < spec.lines.len() {
        let page = spec
            .lines
            .read(at, READ_PAGE)
            .await
            .map_err(|e| request_error(format!("the batch's lines cannot be read: {e}")))?;
        if page.is_empty() {
            return Err(request_error(format!(
                "the batch's lines ended at line {at} of {}",
                spec.lines.len()
            )));
        }
        for (k, line) in page.iter().enumerate() {
            let index = at + k;
            if line.request.model != spec.model {
                return Err(request_error(
                    LineError {
                        index,
                        custom_id: line.custom_id.clone(),
                        reason: format!(
                            "model {:?} differs from the batch's model {:?}{model_note}",
                            line.request.model, spec.model
                        ),
                    }
                    .to_string(),
                ));
            }
            let size = check
                .size(index, line, &encode)
                .map_err(|e| request_error(e.to_string()))?;
            if index >= limits.max_requests.max(1) || total.bytes + size > limits.max_bytes {
                return Err(request_error(format!(
                    "the requests do not fit one batch ({} requests, {} bytes{per}): \
                     line {} (custom_id {:?}) starts a second {unit}; split them first",
                    limits.max_requests,
                    limits.max_bytes,
                    index + 1,
                    line.custom_id
                )));
            }
            total.lines += 1;
            total.bytes += size;
        }
        at += page.len();
    }
    Ok(total)
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

/// A body of `lines`, read a page at a time, encoded by `encode` and framed
/// by `framing` a piece at a time as it is sent: the body to send, and the
/// future that feeds it (to be run beside the send). A line that cannot be
/// read or encoded fails the body.
pub(super) fn streamed_body<'c, E: fmt::Display + Send + 'c>(
    lines: &'c dyn LineSource,
    framing: &'c Framing,
    encode: impl Fn(&BatchLine) -> Result<Vec<u8>, E> + 'c,
) -> (reqwest::Body, impl Future<Output = ()> + 'c) {
    streamed_body_opening(lines, framing.open, framing, encode)
}

/// As `streamed_body`, but the body opens with `open` (made at run time,
/// say holding a name) in place of `framing.open`.
pub(super) fn streamed_body_opening<'c, E: fmt::Display + Send + 'c>(
    lines: &'c dyn LineSource,
    open: &'c [u8],
    framing: &'c Framing,
    encode: impl Fn(&BatchLine) -> Result<Vec<u8>, E> + 'c,
) -> (reqwest::Body, impl Future<Output = ()> + 'c) {
    let (mut tx, rx) = futures::channel::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(2);
    let produce = async move {
        let mut piece = Vec::with_capacity(PIECE + 4096);
        piece.extend_from_slice(open);
        let mut at = 0usize;
        while at < lines.len() {
            let page = match lines.read(at, READ_PAGE).await {
                Ok(page) if !page.is_empty() => page,
                Ok(_) => {
                    let e = format!("the batch's lines ended at line {at}");
                    let _ = tx.send(Err(std::io::Error::other(e))).await;
                    return;
                }
                Err(e) => {
                    let e = format!("the batch's lines cannot be read: {e}");
                    let _ = tx.send(Err(std::io::Error::other(e))).await;
                    return;
                }
            };
            for line in &page {
                let encoded = match encode(line) {
                    Ok(v) => v,
                    Err(e) => {
                        let e = e.to_string();
                        let _ = tx.send(Err(std::io::Error::other(e))).await;
                        return;
                    }
                };
                if at > 0 {
                    piece.extend_from_slice(framing.between);
                }
                at += 1;
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
