//! A finished batch's results, inline in the batch or in a responses
//! file, matched by key and read as the synchronous adapter reads an
//! answer or an error.

use std::collections::HashSet;

use serde::Deserialize;
use serde_json::{Value, json};

use super::operation::OpView;
use super::{FILE_TIMEOUT, GeminiBatch, INLINE_REF, WIRE};
use crate::ProviderError;
use crate::batch::http;
use crate::batch::results::{Matcher, StreamEnd, parse_line};
use crate::batch::{BatchStatus, LineOutcome, ResultSink, ResultsSummary};
use crate::gemini::{classify_error, parse_success};
use crate::limiter::RateHeaders;

impl GeminiBatch {
    pub(super) async fn results_inner(
        &self,
        status: &BatchStatus,
        expected: &HashSet<String>,
        sink: &mut dyn ResultSink,
    ) -> Result<ResultsSummary, ProviderError> {
        let mut m = Matcher::new(expected, sink, "key");
        match &status.output_ref {
            // No results (an expired or cancelled job may have none):
            // `finish` accounts for every request.
            None => {}
            Some(output) => match output.strip_prefix(INLINE_REF) {
                Some(name) => {
                    let op = self.get_op(name).await?;
                    for (i, item) in OpView::new(&op).inline_items().iter().enumerate() {
                        self.item(&mut m, item, &format!("inline result {}", i + 1));
                    }
                }
                None => {
                    let end = self.stream_file(output, &mut m).await;
                    http::settle(&mut m, end, &status.provider_batch_id, |e| self.scrub(e))?;
                }
            },
        }
        Ok(m.finish(&status.state))
    }

    /// Stream the responses file into `m`.
    async fn stream_file<'a>(
        &self,
        file: &str,
        m: &mut Matcher<'a>,
    ) -> Result<StreamEnd, ProviderError> {
        let authed = self.authed(
            self.client
                .get(self.download_url(file))
                .timeout(FILE_TIMEOUT),
        )?;
        WIRE.stream(authed, "responses file line", m, |m, raw, at| {
            self.raw_line(m, raw, at)
        })
        .await
    }

    /// A line of the responses file.
    pub(crate) fn raw_line(&self, m: &mut Matcher<'_>, raw: &[u8], at: &str) {
        if let Some(item) = parse_line::<ResultItem>(m, raw, at, Some(&self.key)) {
            self.apply(m, item, at);
        }
    }

    /// An entry of `inlinedResponses`.
    fn item(&self, m: &mut Matcher<'_>, v: &Value, at: &str) {
        match ResultItem::deserialize(v) {
            Ok(item) => self.apply(m, item, at),
            Err(e) => m.unreadable(format!("{at}: not a result ({e})")),
        }
    }

    fn apply(&self, m: &mut Matcher<'_>, item: ResultItem, at: &str) {
        let key = item.key.clone().or_else(|| {
            item.metadata
                .as_ref()
                .and_then(|m| m.get("key"))
                .and_then(Value::as_str)
                .map(str::to_string)
        });
        m.entry(at, key, || match (item.response, item.error) {
            (Some(r), _) => Ok(self.response_outcome(&r)),
            (None, Some(e)) => Ok(self.error_outcome(&e)),
            (None, None) => Err("neither response nor error".into()),
        });
    }

    fn response_outcome(&self, r: &Value) -> LineOutcome {
        let bytes = serde_json::to_vec(r).unwrap_or_default();
        match parse_success(&bytes, RateHeaders::default(), 200) {
            // Kept as a chat completion when it translates (a request sent
            // as written is answered with it).
            Ok(mut answer) => {
                let model = answer.model.clone().unwrap_or_default();
                let _ = crate::gemini::with_chat_body(&mut answer, &bytes, &model);
                LineOutcome::Answer(answer)
            }
            Err(e) => LineOutcome::Error(self.scrub(e)),
        }
    }

    fn error_outcome(&self, e: &Value) -> LineOutcome {
        let code = e.get("code").and_then(Value::as_i64).unwrap_or(13);
        let http = http_of_code(code);
        let status = e
            .get("status")
            .and_then(Value::as_str)
            .unwrap_or_else(|| rpc_status_name(http));
        let message = e.get("message").and_then(Value::as_str).unwrap_or("");
        let body = json!({"error": {
            "code": http,
            "message": message,
            "status": status,
            "details": e.get("details").cloned().unwrap_or(json!([])),
        }});
        let err = classify_error(http, body.to_string().as_bytes(), RateHeaders::default());
        // Never run: cancelled or expired before its turn.
        if status == "CANCELLED" || message.to_ascii_lowercase().contains("expired") {
            return LineOutcome::NotRun(self.clean(&err.message));
        }
        LineOutcome::Error(self.scrub(err))
    }
}

/// One result, inline or a file line.
#[derive(Deserialize)]
struct ResultItem {
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    metadata: Option<Value>,
    #[serde(default)]
    response: Option<Value>,
    #[serde(default)]
    error: Option<Value>,
}

/// A google.rpc canonical code as the HTTP status Google maps it to.
fn http_of_code(code: i64) -> u16 {
    match code {
        100..=599 => code as u16,
        1 => 499,
        3 | 9 | 11 => 400,
        4 => 504,
        5 => 404,
        6 | 10 => 409,
        7 => 403,
        8 => 429,
        12 => 501,
        14 => 503,
        16 => 401,
        _ => 500,
    }
}

fn rpc_status_name(http: u16) -> &'static str {
    match http {
        400 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        409 => "ABORTED",
        429 => "RESOURCE_EXHAUSTED",
        499 => "CANCELLED",
        501 => "UNIMPLEMENTED",
        503 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        _ => "INTERNAL",
    }
}
