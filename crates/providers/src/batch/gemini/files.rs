//! The Files API: the resumable upload of a batch's input file, and the
//! deletion of uploads and results files docket is done with.

use serde_json::{Value, json};

use super::{CALL_TIMEOUT, FILE_TIMEOUT, GeminiBatch, INLINE_REF, parse_json};
use crate::ProviderError;
use crate::batch::http::{JSONL, not_understood, streamed_body};
use crate::batch::{BatchStatus, LineSource};
use crate::limiter::RateHeaders;
use crate::openai::preview;

impl GeminiBatch {
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
    pub(super) async fn delete_unused(&self, file: &str) {
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
    pub(super) async fn delete_files_inner(
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
    pub(super) async fn upload(
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
}
