//! Reading where a batch is (the batch object as a `BatchStatus`), and
//! cancelling one.

use serde::Deserialize;
use serde_json::{Map, Value};

use super::{CALL_TIMEOUT, OpenAiBatch, null_as_default, parse_json};
use crate::ProviderError;
use crate::batch::http::{self, not_understood};
use crate::batch::{BatchCounts, BatchState, BatchStatus};
use crate::limiter::RateHeaders;

impl OpenAiBatch {
    pub(super) fn status_of(&self, b: BatchObject) -> Result<BatchStatus, ProviderError> {
        let state = match b.status.as_str() {
            "validating" => BatchState::Validating,
            "in_progress" => BatchState::InProgress,
            "finalizing" => BatchState::Finalizing,
            "completed" => BatchState::Completed,
            "failed" => BatchState::Failed(self.clean(&failure_summary(b.errors.as_ref()))),
            "expired" => BatchState::Expired,
            "cancelling" => BatchState::Cancelling,
            "cancelled" => BatchState::Cancelled,
            other => {
                return Err(not_understood(
                    200,
                    format!(
                        "batch {} has an unknown status {:?}",
                        b.id,
                        docket_model::sanitize::for_terminal(other)
                    ),
                    RateHeaders::default(),
                ));
            }
        };
        // `request_counts` is optional: None when the batch has none.
        let counted = b
            .request_counts
            .as_ref()
            .map(|c| c.completed.saturating_add(c.failed));
        let counts = b.request_counts.unwrap_or_default();
        let counts = BatchCounts {
            total: counts.total,
            completed: counts.completed,
            failed: counts.failed,
        };
        let output_ref = b.output_file_id.filter(|s| !s.is_empty());
        let error_ref = b.error_file_id.filter(|s| !s.is_empty());
        // Terminal with no file yet: the output file arrives after
        // `completed`. Poll again rather than ingest nothing: a completed
        // batch unless its counts say there is nothing (both present and
        // zero), an expired or cancelled one when its counts say there is
        // something.
        let no_files = output_ref.is_none() && error_ref.is_none();
        let results_pending = no_files
            && match state {
                BatchState::Completed => counted != Some(0),
                BatchState::Expired | BatchState::Cancelled => counted.is_some_and(|n| n > 0),
                _ => false,
            };
        Ok(BatchStatus {
            provider_batch_id: b.id,
            state,
            counts,
            output_ref,
            error_ref,
            results_pending,
        })
    }

    pub(super) async fn poll_inner(
        &self,
        provider_batch_id: &str,
    ) -> Result<BatchStatus, ProviderError> {
        self.get_batch(provider_batch_id)
            .await
            .and_then(|b| self.status_of(b))
    }

    pub(super) async fn cancel_inner(&self, id: &str) -> Result<BatchStatus, ProviderError> {
        let url = self.url(&format!("batches/{}/cancel", crate::path_segment(id)), &[]);
        match self.call(self.client.post(url).timeout(CALL_TIMEOUT)).await {
            Ok(raw) => self.status_of(parse_json(&raw, "batch cancel")?),
            // Already finished (or already cancelling): where the batch is now.
            Err(e) => {
                http::cancel_refused(e, self.poll_inner(id), |s| {
                    s.is_terminal() || *s == BatchState::Cancelling
                })
                .await
            }
        }
    }
}

/// `errors.data[]` of a failed batch, one entry per problem, with the
/// input line where the provider gives one.
pub(super) fn failure_summary(errors: Option<&ErrorList>) -> String {
    let data = errors.map(|e| e.data.as_slice()).unwrap_or_default();
    if data.is_empty() {
        return "the batch failed (no errors listed)".into();
    }
    const SHOWN: usize = 5;
    let mut parts: Vec<String> = data
        .iter()
        .take(SHOWN)
        .map(|e| {
            let mut s = String::new();
            if let Some(line) = e.line {
                s.push_str(&format!("line {line}: "));
            }
            s.push_str(e.message.as_deref().unwrap_or("(no message)"));
            if let Some(code) = e.code.as_deref().filter(|c| !c.is_empty()) {
                s.push_str(&format!(" [{code}]"));
            }
            if let Some(param) = e.param.as_deref().filter(|c| !c.is_empty()) {
                s.push_str(&format!(" (param {param})"));
            }
            docket_model::sanitize::for_terminal(&s)
        })
        .collect();
    if data.len() > SHOWN {
        parts.push(format!("and {} more", data.len() - SHOWN));
    }
    parts.join("; ")
}

#[derive(Deserialize)]
pub(super) struct BatchObject {
    pub(super) id: String,
    pub(super) status: String,
    #[serde(default)]
    pub(super) input_file_id: Option<String>,
    #[serde(default)]
    pub(super) output_file_id: Option<String>,
    #[serde(default)]
    pub(super) error_file_id: Option<String>,
    #[serde(default)]
    pub(super) request_counts: Option<RequestCounts>,
    #[serde(default)]
    pub(super) errors: Option<ErrorList>,
    #[serde(default)]
    pub(super) created_at: Option<f64>,
    #[serde(default)]
    pub(super) metadata: Option<Map<String, Value>>,
}

#[derive(Deserialize, Default)]
pub(super) struct RequestCounts {
    #[serde(default)]
    pub(super) total: u64,
    #[serde(default)]
    pub(super) completed: u64,
    #[serde(default)]
    pub(super) failed: u64,
}

#[derive(Deserialize, Default)]
pub(super) struct ErrorList {
    #[serde(default, deserialize_with = "null_as_default")]
    pub(super) data: Vec<BatchErrorEntry>,
}

#[derive(Deserialize)]
pub(super) struct BatchErrorEntry {
    #[serde(default)]
    pub(super) code: Option<String>,
    #[serde(default)]
    pub(super) message: Option<String>,
    #[serde(default)]
    pub(super) param: Option<String>,
    #[serde(default)]
    pub(super) line: Option<u64>,
}
