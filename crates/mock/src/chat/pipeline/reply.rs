//! How the pipeline answers one request: the response it builds (status,
//! body, the wire's common headers), the stats and log entry it records,
//! and the damaged bodies of the late faults.

use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use tokio::time::Instant;

use super::{Event, Limited, Rendered, Wire};
use crate::limits::{LimitKind, RateHeaders};
use crate::state::{Live, Shared};
use crate::stats::{Outcome, RequestFacts};
use crate::wire::Route;

/// The same response, its Content-Length kept, but its body stream ends in
/// an error halfway: the server drops the connection mid-body.
pub(super) async fn reset_mid_body(resp: Response) -> Response {
    let (mut parts, body) = resp.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    let half = bytes.slice(..bytes.len() / 2);
    put(
        &mut parts.headers,
        "content-length",
        bytes.len().to_string(),
    );
    let chunks: Vec<Result<bytes::Bytes, std::io::Error>> = vec![
        Ok(half),
        Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "mock: reset mid-body",
        )),
    ];
    Response::from_parts(
        parts,
        axum::body::Body::from_stream(futures::stream::iter(chunks)),
    )
}

/// A 200 body that is not JSON: OpenAI's route keeps its historical fixed
/// prefix, the others send the first half of their real answer.
pub(super) fn malformed(route: Route, body: Vec<u8>) -> Vec<u8> {
    if route == Route::OpenAi {
        return br#"{"id":"chatcmpl-x","object":"chat.compl"#.to_vec();
    }
    let mut body = body;
    body.truncate(body.len() / 2);
    body
}

pub(super) struct Reply<'a> {
    pub(super) shared: &'a Shared,
    pub(super) live: &'a Live,
    pub(super) route: Route,
    pub(super) wire: Wire,
    pub(super) facts: RequestFacts<'a>,
    pub(super) started: Instant,
    pub(super) rate: Option<RateHeaders>,
    /// 32 hex digits; routes add their prefix (`req_`)
    pub(super) request_id: String,
}

impl Reply<'_> {
    pub(super) fn record(&self, outcome: Outcome, status: u16, usage: Option<(u64, u64)>) {
        let cap = self.live.config.log_capacity;
        self.shared
            .stats
            .record(outcome, status, usage, &self.facts, cap);
    }

    /// A 429 with no hint: the client must find its own pace (row S2).
    pub(super) fn unhinted_429(&self) -> Response {
        let l = Limited {
            kind: LimitKind::Requests,
            limit: 0,
            used: 0,
            requested: 1,
            wait: Duration::ZERO,
        };
        let mut rendered = (self.wire.render_error)(
            self.route,
            &Event::RateLimited(l),
            self.facts.model,
            &self.request_id,
        );
        rendered.headers.retain(|(name, _)| {
            !(name.starts_with("retry-after")
                || name.starts_with("x-ratelimit")
                || name.starts_with("anthropic-ratelimit"))
        });
        self.record(Outcome::RateLimited, 429, None);
        self.build(rendered)
    }

    /// Wait, unless the server stops first.
    pub(super) async fn sleep_or_stop(&self, wait: Duration) {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = self.shared.stopping() => {}
        }
    }

    pub(super) fn fail(&self, ev: &Event) -> Response {
        let rendered = (self.wire.render_error)(self.route, ev, self.facts.model, &self.request_id);
        self.record(ev.outcome(), rendered.status.as_u16(), None);
        self.build(rendered)
    }

    pub(super) fn build(&self, r: Rendered) -> Response {
        let mut resp = (r.status, [(header::CONTENT_TYPE, r.content_type)], r.body).into_response();
        let h = resp.headers_mut();
        let ms = self.started.elapsed().as_millis() as u64;
        (self.wire.common_headers)(self.route, h, &self.request_id, ms, self.rate.as_ref());
        for (name, value) in r.headers {
            put(h, name, value);
        }
        resp
    }
}

pub(crate) fn put(h: &mut HeaderMap, name: &'static str, value: String) {
    if let Ok(v) = HeaderValue::try_from(value) {
        h.insert(HeaderName::from_static(name), v);
    }
}
