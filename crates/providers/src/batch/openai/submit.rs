//! Creating a batch: each line encoded as the Batch API takes it, the
//! lines uploaded as a file (or the upload of the same create asked again
//! reused), and the create that reads it.

use serde_json::json;

use super::poll::BatchObject;
use super::{CALL_TIMEOUT, OpenAiBatch, REQUESTS_KEY, TAG_KEY, parse_json};
use crate::ProviderError;
use crate::batch::http::{measure, request_error};
use crate::batch::jsonl::EncodeError;
use crate::batch::{BatchLine, SubmitSpec, Submitted, keep_upload_after};
use crate::openai::request_body;

impl OpenAiBatch {
    /// One input line, without its newline.
    pub fn encode_line(&self, line: &BatchLine) -> Result<Vec<u8>, EncodeError> {
        serde_json::to_vec(&json!({
            "custom_id": line.custom_id,
            "method": "POST",
            "url": self.endpoint(),
            "body": crate::body_or(&line.request, request_body),
        }))
        .map_err(EncodeError::Request)
    }

    pub(super) async fn submit_inner(
        &self,
        spec: &SubmitSpec<'_>,
    ) -> Result<Submitted, ProviderError> {
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
                if keep_upload_after(&e) {
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
}
