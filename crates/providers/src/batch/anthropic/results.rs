//! A finished batch's results file, followed only on the API's own
//! origin, each line matched by `custom_id` and read as the synchronous
//! adapter reads an answer or an error.

use std::collections::HashSet;

use serde::Deserialize;
use serde_json::Value;

use super::{AnthropicBatch, BODY_TIMEOUT, WIRE};
use crate::ProviderError;
use crate::anthropic::{classify_error, parse_success};
use crate::batch::http::{self};
use crate::batch::results::{Matcher, StreamEnd, parse_line};
use crate::batch::{BatchStatus, LineOutcome, ResultSink, ResultsSummary};
use crate::limiter::RateHeaders;

impl AnthropicBatch {
    /// The results URL to fetch: the given one when it is on the API's own
    /// origin, else the documented path for the batch.
    pub(super) fn results_url(&self, status: &BatchStatus) -> String {
        let own = self.batch_url(&status.provider_batch_id, "/results");
        match &status.output_ref {
            Some(u) if same_origin(u, &self.base) => u.clone(),
            Some(u) => {
                tracing::warn!(
                    batch = %status.provider_batch_id,
                    "results_url {} is not on {}; fetching {own}",
                    docket_model::sanitize::for_terminal(u),
                    self.base
                );
                own
            }
            None => own,
        }
    }

    pub(super) async fn results_inner(
        &self,
        status: &BatchStatus,
        expected: &HashSet<String>,
        sink: &mut dyn ResultSink,
    ) -> Result<ResultsSummary, ProviderError> {
        // Every request has a line (`expired`, `canceled` included): one
        // with none may have run, and is not taken as never run.
        let mut m = Matcher::new(expected, sink, "custom_id").one_line_per_request();
        if status.output_ref.is_some() {
            let end = self.stream_results(status, &mut m).await;
            http::settle(&mut m, end, &status.provider_batch_id, |e| self.scrub(e))?;
        }
        // No results URL (archived, or not ended): nothing to read, and
        // `finish` accounts for every request.
        Ok(m.finish(&status.state))
    }

    pub(super) async fn stream_results<'a>(
        &self,
        status: &BatchStatus,
        m: &mut Matcher<'a>,
    ) -> Result<StreamEnd, ProviderError> {
        let authed = self.authed(
            self.client
                .get(self.results_url(status))
                .timeout(BODY_TIMEOUT),
        )?;
        WIRE.stream(authed, "results line", m, |m, raw, at| {
            self.line(m, raw, at)
        })
        .await
    }

    /// One line of the results JSONL.
    pub(crate) fn line(&self, m: &mut Matcher<'_>, raw: &[u8], at: &str) {
        let Some(parsed) = parse_line::<ResultEntry>(m, raw, at, Some(&self.key)) else {
            return;
        };
        m.entry(at, parsed.custom_id, || {
            parsed
                .result
                .and_then(|r| self.outcome(r))
                .ok_or_else(|| "no result of a known type".into())
        });
    }

    pub(super) fn outcome(&self, r: ResultBody) -> Option<LineOutcome> {
        Some(match r.kind.as_str() {
            "succeeded" => {
                let bytes = serde_json::to_vec(&r.message?).unwrap_or_default();
                match parse_success(&bytes, RateHeaders::default(), None, 200) {
                    // Kept as a chat completion when it translates (a request
                    // sent as written is answered with it).
                    Ok(mut a) => {
                        let _ = crate::anthropic::with_chat_body(&mut a, &bytes);
                        LineOutcome::Answer(a)
                    }
                    Err(e) => LineOutcome::Error(self.scrub(e)),
                }
            }
            "errored" => {
                let error = r.error.unwrap_or(Value::Null);
                let kind = error
                    .pointer("/error/type")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let bytes = serde_json::to_vec(&error).unwrap_or_default();
                let mut e = classify_error(status_for(kind), &bytes, RateHeaders::default());
                // No HTTP exchange of its own: the status was only a reading aid.
                e.http_status = None;
                LineOutcome::Error(self.scrub(e))
            }
            "canceled" => LineOutcome::NotRun("canceled before it ran (batch canceled)".into()),
            "expired" => {
                LineOutcome::NotRun("expired: the batch ended (24 h) before it ran".into())
            }
            _ => return None,
        })
    }
}

/// Scheme, host and port of `url` are those of `base`.
pub(super) fn same_origin(url: &str, base: &str) -> bool {
    let origin = |u: &str| -> Option<String> {
        let (scheme, rest) = u.split_once("://")?;
        let host = rest.split(['/', '?', '#']).next()?;
        Some(format!(
            "{}://{}",
            scheme.to_ascii_lowercase(),
            host.to_ascii_lowercase()
        ))
    };
    origin(url).is_some() && origin(url) == origin(base)
}

/// A synthetic HTTP status for an errored line's `error.type`, so the
/// sync classifier reads it as it would the same error over HTTP. Unknown
/// types are taken as server errors (retryable), as the reference advises.
pub(super) fn status_for(kind: &str) -> u16 {
    match kind {
        "invalid_request_error" => 400,
        "authentication_error" => 401,
        "billing_error" => 402,
        "permission_error" => 403,
        "not_found_error" => 404,
        "request_too_large" => 413,
        "rate_limit_error" => 429,
        "timeout_error" => 504,
        "overloaded_error" => 529,
        _ => 500,
    }
}

#[derive(Deserialize)]
pub(super) struct ResultEntry {
    #[serde(default)]
    pub(super) custom_id: Option<String>,
    #[serde(default)]
    pub(super) result: Option<ResultBody>,
}

#[derive(Deserialize)]
pub(super) struct ResultBody {
    #[serde(rename = "type")]
    pub(super) kind: String,
    #[serde(default)]
    pub(super) message: Option<Value>,
    #[serde(default)]
    pub(super) error: Option<Value>,
}
