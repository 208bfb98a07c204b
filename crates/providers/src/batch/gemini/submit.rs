//! Creating a batch: each line encoded as Gemini takes it, the body sent
//! inline when it fits the inline limit, else the lines uploaded as a file
//! that the create names.

use serde_json::{Value, json};

use super::operation::op_name;
use super::{CALL_TIMEOUT, GeminiBatch, INLINE_FRAMING, ITEM_EXTRA, MAX_TAG, parse_json};
use crate::ProviderError;
use crate::RawAnswer;
use crate::batch::http::{Measured, measure, not_understood, request_error, streamed_body_opening};
#[cfg(test)]
use crate::batch::jsonl::Chunk;
use crate::batch::jsonl::EncodeError;
use crate::batch::{BatchLine, LineSource, SubmitSpec, Submitted, keep_upload_after};
use crate::gemini::wire_request;
use crate::limiter::RateHeaders;
use crate::openai::preview;

impl GeminiBatch {
    /// One JSONL line of an input file, without its newline.
    pub fn encode_line(&self, line: &BatchLine) -> Result<Vec<u8>, EncodeError> {
        serde_json::to_vec(&json!({
            "key": line.custom_id,
            "request": wire_request(&line.request)?.1,
        }))
        .map_err(EncodeError::Request)
    }

    /// One entry of `inputConfig.requests.requests`.
    pub(super) fn inline_item(line: &BatchLine) -> Result<Value, EncodeError> {
        Ok(json!({
            "request": wire_request(&line.request)?.1,
            "metadata": {"key": line.custom_id},
        }))
    }

    /// One entry of `inputConfig.requests.requests`, encoded.
    fn encode_item(line: &BatchLine) -> Result<Vec<u8>, EncodeError> {
        serde_json::to_vec(&Self::inline_item(line)?).map_err(EncodeError::Request)
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
    pub(super) fn inline_body(&self, tag: &str, chunk: &Chunk<'_>) -> Option<Vec<u8>> {
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

    pub(super) async fn submit_inner(
        &self,
        spec: &SubmitSpec<'_>,
    ) -> Result<Submitted, ProviderError> {
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
                let (raw, file) = self.create_from_file(spec, measured).await?;
                (raw, Some(file))
            }
        };
        submitted(&raw, file)
    }

    /// Upload the lines (or reuse the upload of the same create asked
    /// again) and create a batch that reads them: the create's answer and
    /// the uploaded file.
    async fn create_from_file(
        &self,
        spec: &SubmitSpec<'_>,
        measured: Measured,
    ) -> Result<(RawAnswer, String), ProviderError> {
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
            Ok(raw) => Ok((raw, file)),
            Err(e) => {
                // Refused (a 4xx: the enqueued-token quota, a bad
                // request): no batch reads the upload, which would
                // sit in the project's storage for 48 hours. After
                // a rate limit, a 5xx or no answer the create is
                // asked again (or a batch may read it): kept.
                if keep_upload_after(&e) {
                    self.kept.keep(spec.tag, file, measured.bytes);
                } else {
                    self.delete_unused(&file).await;
                }
                Err(e)
            }
        }
    }
}

/// The handle a create's answer gives: the Operation's name, and the
/// uploaded input `file` when there was one.
fn submitted(raw: &RawAnswer, file: Option<String>) -> Result<Submitted, ProviderError> {
    let op: Value = parse_json(raw, "batch create")?;
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

/// The inline create body up to its first item:
/// `{"batch":{"displayName":` + the tag + `,"inputConfig":{"requests":{"requests":[`.
fn inline_open(tag: &str) -> Vec<u8> {
    let mut open = br#"{"batch":{"displayName":"#.to_vec();
    open.extend_from_slice(Value::from(tag).to_string().as_bytes());
    open.extend_from_slice(br#","inputConfig":{"requests":{"requests":["#);
    open
}
