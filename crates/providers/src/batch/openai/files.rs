//! The Files API: uploading a batch's input, and deleting uploads and
//! results files docket is done with.

use serde::Deserialize;

use super::{CALL_TIMEOUT, FILE_TIMEOUT, OpenAiBatch, parse_json};
use crate::ProviderError;
use crate::batch::BatchStatus;
use crate::batch::LineSource;
use crate::batch::http::{JSONL, request_error, streamed_body};

impl OpenAiBatch {
    /// Delete an input file no batch uses; a failure is logged, not raised
    /// (the create's own error is what the caller needs).
    pub(super) async fn delete_unused(&self, file_id: &str) {
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
    pub(super) async fn delete_file(&self, file_id: &str) -> Result<bool, ProviderError> {
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
    pub(super) async fn delete_files_inner(
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
    pub(super) async fn upload(
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
}

#[derive(Deserialize)]
pub(super) struct FileObject {
    pub(super) id: String,
}
