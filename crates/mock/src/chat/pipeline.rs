//! The request pipeline shared by every chat route, whatever its wire format.
//!
//! Contract, in order: the route's own rejection decided before the pipeline
//! (missing key, key in the URL, missing api-version or anthropic-version);
//! mode (`unauthorized`, `quota`); body validation (400); rate buckets,
//! requests then tokens (429, answered at once without latency); early faults
//! 500 / 503 / hang; the latency sleep; late faults malformed / truncated /
//! wrong_schema; the answer. Every step is the same for all routes: only the
//! rendering of an error, an answer and the per-response headers differs, and
//! that is delegated to the route's module (`openai`, `anthropic`, `gemini`,
//! `ollama`). Each request ends in exactly one stats outcome and one log
//! entry naming its route.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::time::Instant;

use crate::answer::Damage;
use crate::faults::{Draw, EarlyFault, LateFault};
use crate::limits::{Decision, LimitKind, RateHeaders};
use crate::state::{Live, Mode, Shared, lock};
use crate::stats::{Outcome, RequestFacts};
use crate::wire::{self, Prompt, Route, id_hex};

/// A hung request is held this long (the client's timeout ends it first).
const HANG: Duration = Duration::from_secs(3600);

/// A refused rate-limit check.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limited {
    pub kind: LimitKind,
    pub limit: u64,
    pub used: u64,
    pub requested: u64,
    pub wait: Duration,
}

/// Every way a request ends without an answer. Routes render these in their own shape.
#[derive(Debug, Clone)]
pub(crate) enum Event {
    /// credentials missing (decided by the route)
    NoAuth(String),
    /// a 400 decided by the route (api-version, key in URL, ...) or by body validation
    BadRequest(String),
    /// `mode = "unauthorized"`
    Unauthorized,
    /// `mode = "forbidden"`: a valid key that may not use the model (403)
    Forbidden,
    /// a model the mock does not serve (`models`): 404
    ModelNotFound(String),
    /// `mode = "quota"`
    Quota,
    RateLimited(Limited),
    /// one request above the whole per-minute token limit: never passes
    TooLarge {
        limit: u64,
        requested: u64,
    },
    ServerError,
    Overloaded,
}

impl Event {
    fn outcome(&self) -> Outcome {
        match self {
            Event::NoAuth(_) | Event::Unauthorized | Event::Forbidden => Outcome::Unauthorized,
            Event::BadRequest(_) | Event::ModelNotFound(_) => Outcome::BadRequest,
            Event::Quota => Outcome::Quota,
            Event::RateLimited(_) | Event::TooLarge { .. } => Outcome::RateLimited,
            Event::ServerError => Outcome::ServerError,
            Event::Overloaded => Outcome::Overloaded,
        }
    }
}

/// What a refusing model says (OpenAI puts it in `message.refusal`).
pub(crate) const REFUSAL: &str = "I'm sorry, but I can't help with that request.";

/// A generated answer, for the route to wrap in its success body.
pub(crate) struct Answer<'a> {
    /// 32 hex digits, unique per server; routes add their own prefix
    pub id: String,
    pub model: &'a str,
    pub content: &'a str,
    /// cut by the max-tokens limit (the truncated fault)
    pub truncated: bool,
    /// the model declined (the refusal fault): `content` is empty and each
    /// wire sets its own refusal marker
    pub refused: bool,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// time spent so far (Ollama reports durations)
    pub elapsed: Duration,
    /// Ollama: answer as an NDJSON stream
    pub stream: bool,
}

/// What a route renders: status (errors only), body and extra headers.
pub(crate) struct Rendered {
    pub status: StatusCode,
    pub body: Vec<u8>,
    pub headers: Vec<(&'static str, String)>,
    pub content_type: &'static str,
}

impl Rendered {
    pub(crate) fn json(status: StatusCode, body: Vec<u8>) -> Rendered {
        Rendered {
            status,
            body,
            headers: Vec::new(),
            content_type: "application/json",
        }
    }

    pub(crate) fn with(mut self, name: &'static str, value: String) -> Rendered {
        self.headers.push((name, value));
        self
    }
}

/// One chat request as a route hands it to the pipeline.
pub(crate) struct Request<'a> {
    pub route: Route,
    /// how the route's wire renders errors, answers and headers
    pub wire: Wire,
    pub client_request_id: Option<&'a str>,
    /// a rejection the route decided before the pipeline (auth, query, headers)
    pub reject: Option<Event>,
    /// the validated prompt, or the 400 message
    pub prompt: Result<Prompt<'a>, String>,
    /// model for the log when the prompt is invalid
    pub model: &'a str,
    pub stream: bool,
}

/// How a wire renders what the pipeline decided. Each wire's module hands
/// its own (`WIRE`) in the `Request`, so the pipeline calls back into the
/// route's module without importing any of them.
#[derive(Clone, Copy)]
pub(crate) struct Wire {
    /// an error: status, body and headers (route, event, model, request id)
    pub render_error: fn(Route, &Event, &str, &str) -> Rendered,
    /// a 200 answer (Err: the body could not be built)
    pub render_answer: fn(Route, &Answer<'_>) -> Result<Rendered, String>,
    /// per-response headers every answer of the route carries (ids, timing,
    /// rate state): route, headers, request id, ms, rate
    pub common_headers: fn(Route, &mut HeaderMap, &str, u64, Option<&RateHeaders>),
}

/// Run one request through the pipeline. The caller has already counted it
/// (`stats.request_received`) and parsed its body.
pub(crate) async fn run(
    shared: &Shared,
    live: &Live,
    started: Instant,
    req: Request<'_>,
) -> Response {
    let (prompt_sha256, seed) = match &req.prompt {
        Ok(p) => p.hashes(),
        Err(_) => (String::new(), [0; 32]),
    };
    let model = match &req.prompt {
        Ok(p) => p.model,
        Err(_) => req.model,
    };
    let mut reply = Reply {
        shared,
        live,
        route: req.route,
        wire: req.wire,
        facts: RequestFacts {
            route: req.route,
            client_request_id: req.client_request_id,
            prompt_sha256: &prompt_sha256,
            model,
        },
        started,
        rate: None,
        request_id: id_hex(shared.ids.fetch_add(1, Relaxed), !shared.salt),
    };

    if let Some(ev) = &req.reject {
        return reply.fail(ev);
    }
    match live.mode {
        Mode::Normal => {}
        Mode::Unauthorized => return reply.fail(&Event::Unauthorized),
        Mode::Forbidden => return reply.fail(&Event::Forbidden),
        Mode::Quota => return reply.fail(&Event::Quota),
    }
    let prompt = match req.prompt {
        Ok(p) => p,
        Err(msg) => return reply.fail(&Event::BadRequest(msg)),
    };
    let served = &live.config.models;
    if !served.trim().is_empty() && !served.split(',').any(|m| m.trim() == prompt.model) {
        return reply.fail(&Event::ModelNotFound(prompt.model.to_string()));
    }
    let prompt_tokens = prompt.prompt_tokens();
    let context = live.config.context_tokens;
    if context > 0 && prompt_tokens > context {
        return reply.fail(&Event::BadRequest(format!(
            "This model's maximum context length is {context} tokens. However, your messages resulted in {prompt_tokens} tokens. Please reduce the length of the messages."
        )));
    }

    let poison = live.config.poison.as_str();
    if !poison.is_empty()
        && prompt
            .messages
            .iter()
            .any(|m| m.pieces().any(|t| t.contains(poison)))
    {
        // The same request fails the same way however often it is sent
        // (row S4); nothing is drawn, so the others' faults stay put.
        return reply.fail(&Event::ServerError);
    }
    let storm = live.set_at.elapsed() < Duration::from_millis(live.config.storm_429_ms);
    // The first sends of each prompt refused: every request meets that
    // many 429s in a row, whatever the client's pacing (row S2's caps).
    let refused_first = live.config.rate_limit_first > 0 && {
        let mut seen = lock(&shared.refused_first);
        let n = seen.entry(prompt_sha256.clone()).or_default();
        *n += 1;
        *n <= live.config.rate_limit_first
    };
    if storm || refused_first {
        // A 429 with no hint: the client must find its own pace (row S2).
        let l = Limited {
            kind: crate::limits::LimitKind::Requests,
            limit: 0,
            used: 0,
            requested: 1,
            wait: Duration::ZERO,
        };
        let mut rendered = (req.wire.render_error)(
            req.route,
            &Event::RateLimited(l),
            prompt.model,
            &reply.request_id,
        );
        rendered.headers.retain(|(name, _)| {
            !(name.starts_with("retry-after")
                || name.starts_with("x-ratelimit")
                || name.starts_with("anthropic-ratelimit"))
        });
        reply.record(Outcome::RateLimited, 429, None);
        return reply.build(rendered);
    }
    if live.limits_on {
        let cost = prompt_tokens.saturating_add(prompt.max_tokens.unwrap_or(256));
        let decision = lock(&shared.limits).check(cost, Instant::now());
        match decision {
            Decision::Allowed(h) => reply.rate = Some(h),
            Decision::Limited {
                kind,
                limit,
                used,
                requested,
                wait,
                headers,
            } => {
                reply.rate = Some(headers);
                let l = Limited {
                    kind,
                    limit,
                    used,
                    requested,
                    wait,
                };
                return reply.fail(&Event::RateLimited(l));
            }
            Decision::TooLarge {
                limit,
                requested,
                headers,
            } => {
                reply.rate = Some(headers);
                return reply.fail(&Event::TooLarge { limit, requested });
            }
        }
    }

    let draw = if live.quiet {
        Draw {
            early: None,
            late: None,
            latency: Duration::ZERO,
        }
    } else {
        lock(&shared.rng).draw(&live.plan)
    };
    let late = draw.early == Some(EarlyFault::Late);
    match draw.early {
        None | Some(EarlyFault::Late) => {}
        Some(EarlyFault::ServerError) => return reply.fail(&Event::ServerError),
        Some(EarlyFault::Overloaded) => return reply.fail(&Event::Overloaded),
        Some(EarlyFault::Hang) => {
            // Recorded now: the request never finishes from the client's point of view.
            reply.record(Outcome::Hang, 0, None);
            tokio::select! {
                _ = tokio::time::sleep(HANG) => {}
                _ = shared.stopping() => {}
            }
            return reply.build((req.wire.render_error)(
                req.route,
                &Event::Overloaded,
                model,
                &reply.request_id,
            ));
        }
    }
    if !draw.latency.is_zero() {
        tokio::select! {
            _ = tokio::time::sleep(draw.latency) => {}
            _ = shared.stopping() => {}
        }
    }

    let damage = match draw.late {
        Some(LateFault::Malformed | LateFault::ResetMidBody) => Damage::None,
        Some(LateFault::Truncated) => Damage::Truncated,
        Some(LateFault::WrongSchema) => Damage::WrongSchema,
        Some(LateFault::Refused | LateFault::Empty) | None => Damage::None,
    };
    let refused = draw.late == Some(LateFault::Refused);
    let blank = refused || draw.late == Some(LateFault::Empty);
    let content = if blank {
        String::new()
    } else {
        crate::steer::answer(shared, live, &prompt, seed, damage)
    };
    let full_tokens = wire::completion_tokens(&content);
    let (completion_tokens, outcome) = match (draw.late, damage) {
        // A refusal is a few words, billed like any answer.
        (Some(LateFault::Refused), _) => (wire::completion_tokens(REFUSAL), Outcome::Refused),
        (Some(LateFault::Empty), _) => (0, Outcome::Empty),
        (_, Damage::Truncated) => (prompt.max_tokens.unwrap_or(full_tokens), Outcome::Truncated),
        (_, Damage::WrongSchema) => (full_tokens, Outcome::WrongSchema),
        (_, Damage::None) => (full_tokens, Outcome::Ok),
    };
    let answer = Answer {
        id: id_hex(shared.ids.fetch_add(1, Relaxed), shared.salt),
        model: prompt.model,
        content: &content,
        truncated: damage == Damage::Truncated,
        refused,
        prompt_tokens,
        completion_tokens,
        elapsed: started.elapsed(),
        stream: req.stream,
    };
    // Serializing our own structs cannot fail in practice; a 500 if it ever does.
    let Ok(mut rendered) = (req.wire.render_answer)(req.route, &answer) else {
        return reply.fail(&Event::ServerError);
    };
    if draw.late == Some(LateFault::Malformed) {
        rendered.body = malformed(req.route, rendered.body);
        reply.record(Outcome::Malformed, 200, None);
        return reply.build(rendered);
    }
    if draw.late == Some(LateFault::ResetMidBody) {
        // Generated, so billed; the client gets half the bytes it was promised.
        reply.record(
            Outcome::ResetMidBody,
            200,
            Some((prompt_tokens, completion_tokens)),
        );
        return reset_mid_body(reply.build(rendered)).await;
    }
    reply.record(outcome, 200, Some((prompt_tokens, completion_tokens)));
    if late {
        // Billed above, whether or not the client waits for it (row S6).
        let hold = Duration::from_millis(live.config.late_ms);
        tokio::select! {
            _ = tokio::time::sleep(hold) => {}
            _ = shared.stopping() => {}
        }
    }
    reply.build(rendered)
}

/// The same response, its Content-Length kept, but its body stream ends in
/// an error halfway: the server drops the connection mid-body.
async fn reset_mid_body(resp: Response) -> Response {
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
fn malformed(route: Route, body: Vec<u8>) -> Vec<u8> {
    if route == Route::OpenAi {
        return br#"{"id":"chatcmpl-x","object":"chat.compl"#.to_vec();
    }
    let mut body = body;
    body.truncate(body.len() / 2);
    body
}

struct Reply<'a> {
    shared: &'a Shared,
    live: &'a Live,
    route: Route,
    wire: Wire,
    facts: RequestFacts<'a>,
    started: Instant,
    rate: Option<RateHeaders>,
    /// 32 hex digits; routes add their prefix (`req_`)
    request_id: String,
}

impl Reply<'_> {
    fn record(&self, outcome: Outcome, status: u16, usage: Option<(u64, u64)>) {
        let cap = self.live.config.log_capacity;
        self.shared
            .stats
            .record(outcome, status, usage, &self.facts, cap);
    }

    fn fail(&self, ev: &Event) -> Response {
        let rendered = (self.wire.render_error)(self.route, ev, self.facts.model, &self.request_id);
        self.record(ev.outcome(), rendered.status.as_u16(), None);
        self.build(rendered)
    }

    fn build(&self, r: Rendered) -> Response {
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
