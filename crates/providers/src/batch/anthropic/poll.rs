//! Reading where a message batch is (as a `BatchStatus`), and cancelling
//! one.

use chrono::DateTime;
use serde::Deserialize;

use super::{AnthropicBatch, CALL_TIMEOUT, parse_json};
use crate::ProviderError;
use crate::batch::http::{self, not_understood};
use crate::batch::{BatchCounts, BatchState, BatchStatus};
use crate::limiter::RateHeaders;

impl AnthropicBatch {
    pub(super) fn status_of(&self, b: MessageBatch) -> Result<BatchStatus, ProviderError> {
        let c = b.request_counts.unwrap_or_default();
        let ended = b.processing_status == "ended";
        let state = match b.processing_status.as_str() {
            "in_progress" => BatchState::InProgress,
            "canceling" => BatchState::Cancelling,
            "ended" if b.cancel_initiated_at.is_some() => BatchState::Cancelled,
            "ended" if c.expired > 0 => BatchState::Expired,
            "ended" => BatchState::Completed,
            other => {
                return Err(not_understood(
                    200,
                    format!(
                        "message batch {} has an unknown processing_status {:?}",
                        b.id,
                        docket_model::sanitize::for_terminal(other)
                    ),
                    RateHeaders::default(),
                ));
            }
        };
        let counts = BatchCounts {
            total: c.total(),
            completed: c.succeeded,
            failed: c
                .errored
                .saturating_add(c.canceled)
                .saturating_add(c.expired),
        };
        let output_ref = b.results_url.filter(|s| !s.is_empty());
        // Ended, not archived, and no results URL yet: poll again.
        let results_pending = ended && output_ref.is_none() && b.archived_at.is_none();
        Ok(BatchStatus {
            provider_batch_id: b.id,
            state,
            counts,
            output_ref,
            error_ref: None,
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
        let url = self.batch_url(id, "/cancel");
        match self.call(self.client.post(url).timeout(CALL_TIMEOUT)).await {
            Ok(raw) => self.status_of(parse_json(&raw, "batch cancel")?),
            // Already ended (or canceling): the answer is where it is now.
            Err(e) => {
                http::cancel_refused(e, self.poll_inner(id), |s| {
                    s.is_terminal() || *s == BatchState::Cancelling
                })
                .await
            }
        }
    }
}

pub(super) fn unix_of(rfc3339: Option<&str>) -> Option<f64> {
    let t = DateTime::parse_from_rfc3339(rfc3339?.trim()).ok()?;
    Some(t.timestamp() as f64 + f64::from(t.timestamp_subsec_micros()) / 1e6)
}

#[derive(Deserialize)]
pub(super) struct MessageBatch {
    pub(super) id: String,
    pub(super) processing_status: String,
    #[serde(default)]
    pub(super) request_counts: Option<RequestCounts>,
    #[serde(default)]
    pub(super) created_at: Option<String>,
    #[serde(default)]
    pub(super) cancel_initiated_at: Option<String>,
    #[serde(default)]
    pub(super) archived_at: Option<String>,
    #[serde(default)]
    pub(super) results_url: Option<String>,
}

#[derive(Deserialize, Default)]
pub(super) struct RequestCounts {
    #[serde(default)]
    pub(super) processing: u64,
    #[serde(default)]
    pub(super) succeeded: u64,
    #[serde(default)]
    pub(super) errored: u64,
    #[serde(default)]
    pub(super) canceled: u64,
    #[serde(default)]
    pub(super) expired: u64,
}

impl RequestCounts {
    /// Provider-sent counts: a sum that would wrap saturates instead.
    pub(super) fn total(&self) -> u64 {
        [self.succeeded, self.errored, self.canceled, self.expired]
            .into_iter()
            .fold(self.processing, u64::saturating_add)
    }
}
