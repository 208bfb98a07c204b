//! A finished batch's output and error files, streamed and matched by
//! `custom_id`, each line read as the synchronous adapter reads an answer
//! or an error.

use std::collections::HashSet;

use serde::Deserialize;
use serde_json::Value;

use super::{FILE_TIMEOUT, OpenAiBatch, WIRE};
use crate::batch::http::{self};
use crate::batch::results::{Matcher, StreamEnd, parse_line};
use crate::batch::{BatchStatus, LineOutcome, ResultSink, ResultsSummary};
use crate::limiter::RateHeaders;
use crate::openai::{classify_error, parse_success};
use crate::{ErrorClass, ProviderError};

impl OpenAiBatch {
    pub(super) async fn results_inner(
        &self,
        status: &BatchStatus,
        expected: &HashSet<String>,
        sink: &mut dyn ResultSink,
    ) -> Result<ResultsSummary, ProviderError> {
        let mut m = Matcher::new(expected, sink, "custom_id");
        for (which, file) in [("output", &status.output_ref), ("error", &status.error_ref)] {
            let Some(file) = file else { continue };
            let end = self.stream_file(file, which, &mut m).await;
            // Cut: what came before stands; the rest is fetched again.
            if !http::settle(&mut m, end, &status.provider_batch_id, |e| self.scrub(e))? {
                break;
            }
        }
        Ok(m.finish(&status.state))
    }

    /// Stream one results file into `m`.
    pub(super) async fn stream_file<'a>(
        &self,
        file_id: &str,
        which: &'static str,
        m: &mut Matcher<'a>,
    ) -> Result<StreamEnd, ProviderError> {
        let url = self.url(
            &format!("files/{}/content", crate::path_segment(file_id)),
            &[],
        );
        let authed = self.authed(self.client.get(url).timeout(FILE_TIMEOUT))?;
        let label = format!("{which} file line");
        WIRE.stream(authed, &label, m, |m, raw, at| self.line(m, raw, at))
            .await
    }

    /// One line of an output or error file.
    pub(crate) fn line(&self, m: &mut Matcher<'_>, raw: &[u8], at: &str) {
        let Some(parsed) = parse_line::<OutputLine>(m, raw, at, self.key.as_ref()) else {
            return;
        };
        m.entry(at, parsed.custom_id, || {
            match (parsed.response, parsed.error) {
                (Some(r), _) => Ok(self.response_outcome(r)),
                (None, Some(e)) => Ok(self.error_outcome(e)),
                (None, None) => Err("neither response nor error".into()),
            }
        });
    }

    pub(super) fn response_outcome(&self, r: OutputResponse) -> LineOutcome {
        let bytes = serde_json::to_vec(&r.body).unwrap_or_default();
        let result = if r.status_code == 200 {
            // The whole answer kept: a request sent as written is answered
            // with it (`docket run --requests`).
            parse_success(&bytes, RateHeaders::default(), r.request_id, 200).map(|mut a| {
                a.body = Some(r.body.to_string());
                a
            })
        } else {
            Err(classify_error(
                r.status_code,
                &bytes,
                RateHeaders::default(),
            ))
        };
        match result {
            Ok(answer) => LineOutcome::Answer(answer),
            Err(e) => LineOutcome::Error(self.scrub(e)),
        }
    }

    pub(super) fn error_outcome(&self, e: OutputError) -> LineOutcome {
        let code = match &e.code {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Null) | None => String::new(),
            Some(other) => other.to_string(),
        };
        let message = e.message.unwrap_or_default();
        let text = self.clean(&if code.is_empty() {
            message
        } else {
            format!("{message} [{code}]")
        });
        // Never run: the window closed or the batch was cancelled first.
        if code.contains("expired") || code.contains("cancel") {
            LineOutcome::NotRun(text)
        } else {
            LineOutcome::Error(ProviderError {
                class: ErrorClass::Transient,
                http_status: None,
                message: text,
                headers: RateHeaders::default(),
            })
        }
    }
}

#[derive(Deserialize)]
pub(super) struct OutputLine {
    #[serde(default)]
    pub(super) custom_id: Option<String>,
    #[serde(default)]
    pub(super) response: Option<OutputResponse>,
    #[serde(default)]
    pub(super) error: Option<OutputError>,
}

#[derive(Deserialize)]
pub(super) struct OutputResponse {
    pub(super) status_code: u16,
    #[serde(default)]
    pub(super) request_id: Option<String>,
    #[serde(default)]
    pub(super) body: Value,
}

#[derive(Deserialize)]
pub(super) struct OutputError {
    #[serde(default)]
    pub(super) code: Option<Value>,
    #[serde(default)]
    pub(super) message: Option<String>,
}
