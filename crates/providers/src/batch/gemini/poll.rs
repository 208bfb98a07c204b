//! Reading where a batch is (its Operation as a `BatchStatus`), and
//! cancelling one.

use super::operation::{OpStatus, Output};
use super::{CALL_TIMEOUT, GeminiBatch, INLINE_REF};
use crate::ProviderError;
use crate::batch::http::{self, not_understood};
use crate::batch::{BatchState, BatchStatus};
use crate::limiter::RateHeaders;

impl GeminiBatch {
    pub(super) fn status_of(&self, o: &OpStatus) -> Result<BatchStatus, ProviderError> {
        let name = o.name().unwrap_or_default();
        let state = match o.state().as_deref() {
            Some("PENDING" | "QUEUED") => BatchState::Validating,
            Some("RUNNING" | "UPDATING" | "PAUSED") => BatchState::InProgress,
            Some("CANCELLING") => BatchState::Cancelling,
            Some("SUCCEEDED" | "PARTIALLY_SUCCEEDED") => BatchState::Completed,
            Some("FAILED") => BatchState::Failed(self.clean(&o.failure())),
            Some("CANCELLED") => BatchState::Cancelled,
            Some("EXPIRED") => BatchState::Expired,
            // No state: the operation's own `done` / `error` say it.
            None | Some("UNSPECIFIED") if o.done() => match o.error() {
                Some(_) => BatchState::Failed(self.clean(&o.failure())),
                None => BatchState::Completed,
            },
            None | Some("UNSPECIFIED") => BatchState::Validating,
            Some(other) => {
                return Err(not_understood(
                    200,
                    format!(
                        "batch {name} has an unknown state {:?}",
                        docket_model::sanitize::for_terminal(other)
                    ),
                    RateHeaders::default(),
                ));
            }
        };
        let counts = o.counts();
        let output_ref = match o.output() {
            Output::Inline => Some(format!("{INLINE_REF}{name}")),
            Output::File(f) => Some(f),
            Output::None => None,
        };
        // Succeeded with no results to be found yet: they arrive after the
        // state changes. Poll again rather than ingest nothing, unless the
        // counts are there and say there is nothing (`batchStats` is
        // optional). (Expired jobs may have no results at all: never waited on.)
        let counted = o
            .has_counts()
            .then(|| counts.completed.saturating_add(counts.failed));
        let results_pending =
            state == BatchState::Completed && output_ref.is_none() && counted != Some(0);
        Ok(BatchStatus {
            provider_batch_id: name,
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
        self.get_status(provider_batch_id)
            .await
            .and_then(|op| self.status_of(&op))
    }

    pub(super) async fn cancel_inner(&self, name: &str) -> Result<BatchStatus, ProviderError> {
        let sent = self
            .call(
                self.client
                    .post(self.batch_url(name, ":cancel"))
                    .timeout(CALL_TIMEOUT)
                    .header(reqwest::header::CONTENT_LENGTH, 0),
            )
            .await;
        match sent {
            Ok(_) => {
                let mut s = self.status_of(&self.get_status(name).await?)?;
                // Accepted; the Developer API has no cancelling state, so a
                // batch still running is reported as on its way out.
                if !s.state.is_terminal() {
                    s.state = BatchState::Cancelling;
                }
                Ok(s)
            }
            // Already finished: the answer is where the batch is now.
            Err(e) => http::cancel_refused(e, self.poll_inner(name), BatchState::is_terminal).await,
        }
    }
}
