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

use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use tokio::time::Instant;

use crate::answer::Damage;
use crate::faults::{Draw, EarlyFault, LateFault};
use crate::limits::{Decision, LimitKind, RateHeaders};
use crate::state::{Live, Mode, Shared, lock};
use crate::stats::{Outcome, RequestFacts};
use crate::wire::{self, Prompt, Route, id_hex};

mod reply;

pub(crate) use reply::put;
use reply::{Reply, malformed, reset_mid_body};

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
    /// thinking before the answer, billed as output (Gemini 2.5)
    pub thinking_tokens: u64,
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
    match serve(&mut reply, req, seed).await {
        Ok(resp) => resp,
        Err(resp) => *resp,
    }
}

/// The pipeline's steps in contract order; `Err` is a response that ends
/// the request early.
async fn serve(
    reply: &mut Reply<'_>,
    req: Request<'_>,
    seed: [u8; 32],
) -> Result<Response, Box<Response>> {
    let prompt = admit(reply, req.reject.as_ref(), req.prompt)?;
    let prompt_tokens = prompt.prompt_tokens();
    check_model_and_context(reply, &prompt, prompt_tokens)?;
    refuse_by_switch(reply, &prompt)?;
    take_rate_limits(reply, &prompt, prompt_tokens)?;

    let draw = draw_faults(reply);
    early_fault(reply, draw.early).await?;
    if !draw.latency.is_zero() {
        reply.sleep_or_stop(draw.latency).await;
    }

    let generated = generate(reply, &prompt, seed, draw.late);
    let answer = Answer {
        id: id_hex(reply.shared.ids.fetch_add(1, Relaxed), reply.shared.salt),
        model: prompt.model,
        content: &generated.content,
        truncated: generated.damage == Damage::Truncated,
        refused: draw.late == Some(LateFault::Refused),
        prompt_tokens,
        completion_tokens: generated.completion_tokens,
        thinking_tokens: prompt.thinking_tokens,
        elapsed: reply.started.elapsed(),
        stream: req.stream,
    };
    // Serializing our own structs cannot fail in practice; a 500 if it ever does.
    let Ok(rendered) = (reply.wire.render_answer)(reply.route, &answer) else {
        return Err(Box::new(reply.fail(&Event::ServerError)));
    };
    let usage = (
        prompt_tokens,
        generated.completion_tokens + prompt.thinking_tokens,
    );
    let late = draw.early == Some(EarlyFault::Late);
    Ok(deliver(reply, rendered, draw.late, generated.outcome, usage, late).await)
}

/// The route's own rejection, the server's mode, then the body's validity.
fn admit<'a>(
    reply: &Reply<'_>,
    reject: Option<&Event>,
    prompt: Result<Prompt<'a>, String>,
) -> Result<Prompt<'a>, Box<Response>> {
    if let Some(ev) = reject {
        return Err(Box::new(reply.fail(ev)));
    }
    match reply.live.mode {
        Mode::Normal => {}
        Mode::Unauthorized => return Err(Box::new(reply.fail(&Event::Unauthorized))),
        Mode::Forbidden => return Err(Box::new(reply.fail(&Event::Forbidden))),
        Mode::Quota => return Err(Box::new(reply.fail(&Event::Quota))),
    }
    prompt.map_err(|msg| Box::new(reply.fail(&Event::BadRequest(msg))))
}

/// A model the mock serves (`models`), and a prompt within its context window.
fn check_model_and_context(
    reply: &Reply<'_>,
    prompt: &Prompt<'_>,
    prompt_tokens: u64,
) -> Result<(), Box<Response>> {
    let served = &reply.live.config.models;
    if !served.trim().is_empty() && !served.split(',').any(|m| m.trim() == prompt.model) {
        return Err(Box::new(
            reply.fail(&Event::ModelNotFound(prompt.model.to_string())),
        ));
    }
    let context = reply.live.config.context_tokens;
    if context > 0 && prompt_tokens > context {
        return Err(Box::new(reply.fail(&Event::BadRequest(format!(
            "This model's maximum context length is {context} tokens. However, your messages resulted in {prompt_tokens} tokens. Please reduce the length of the messages."
        )))));
    }
    Ok(())
}

/// The switches that refuse a request whatever the draw: the poison prompt
/// (500), the 429 storm and the first sends of each prompt (429).
fn refuse_by_switch(reply: &Reply<'_>, prompt: &Prompt<'_>) -> Result<(), Box<Response>> {
    let (shared, live) = (reply.shared, reply.live);
    let poison = live.config.poison.as_str();
    if !poison.is_empty()
        && prompt
            .messages
            .iter()
            .any(|m| m.pieces().any(|t| t.contains(poison)))
    {
        // The same request fails the same way however often it is sent
        // (row S4); nothing is drawn, so the others' faults stay put.
        return Err(Box::new(reply.fail(&Event::ServerError)));
    }
    let storm = live.set_at.elapsed() < Duration::from_millis(live.config.storm_429_ms);
    // The first sends of each prompt refused: every request meets that
    // many 429s in a row, whatever the client's pacing (row S2's caps).
    let refused_first = live.config.rate_limit_first > 0 && {
        let mut seen = lock(&shared.refused_first);
        let n = seen
            .entry(reply.facts.prompt_sha256.to_string())
            .or_default();
        *n += 1;
        *n <= live.config.rate_limit_first
    };
    if storm || refused_first {
        return Err(Box::new(reply.unhinted_429()));
    }
    Ok(())
}

/// The requests and tokens buckets, when limits are on; the rate state
/// they report goes into every later response's headers.
fn take_rate_limits(
    reply: &mut Reply<'_>,
    prompt: &Prompt<'_>,
    prompt_tokens: u64,
) -> Result<(), Box<Response>> {
    if !reply.live.limits_on {
        return Ok(());
    }
    let cost = prompt_tokens.saturating_add(prompt.max_tokens.unwrap_or(256));
    let decision = lock(&reply.shared.limits).check(cost, Instant::now());
    match decision {
        Decision::Allowed(h) => {
            reply.rate = Some(h);
            Ok(())
        }
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
            Err(Box::new(reply.fail(&Event::RateLimited(l))))
        }
        Decision::TooLarge {
            limit,
            requested,
            headers,
        } => {
            reply.rate = Some(headers);
            Err(Box::new(reply.fail(&Event::TooLarge { limit, requested })))
        }
    }
}

/// This request's faults and latency; none in quiet mode.
fn draw_faults(reply: &Reply<'_>) -> Draw {
    if reply.live.quiet {
        Draw {
            early: None,
            late: None,
            latency: Duration::ZERO,
        }
    } else {
        lock(&reply.shared.rng).draw(&reply.live.plan)
    }
}

/// The faults that strike before any latency: 500, 503 or a hang.
async fn early_fault(reply: &Reply<'_>, early: Option<EarlyFault>) -> Result<(), Box<Response>> {
    match early {
        None | Some(EarlyFault::Late) => Ok(()),
        Some(EarlyFault::ServerError) => Err(Box::new(reply.fail(&Event::ServerError))),
        Some(EarlyFault::Overloaded) => Err(Box::new(reply.fail(&Event::Overloaded))),
        Some(EarlyFault::Hang) => {
            // Recorded now: the request never finishes from the client's point of view.
            reply.record(Outcome::Hang, 0, None);
            reply.sleep_or_stop(HANG).await;
            Err(Box::new(reply.build((reply.wire.render_error)(
                reply.route,
                &Event::Overloaded,
                reply.facts.model,
                &reply.request_id,
            ))))
        }
    }
}

/// The answer's content, as the late fault shapes it, with its billing.
struct Generated {
    content: String,
    damage: Damage,
    completion_tokens: u64,
    outcome: Outcome,
}

fn generate(
    reply: &Reply<'_>,
    prompt: &Prompt<'_>,
    seed: [u8; 32],
    late: Option<LateFault>,
) -> Generated {
    let damage = match late {
        Some(LateFault::Malformed | LateFault::ResetMidBody) => Damage::None,
        Some(LateFault::Truncated) => Damage::Truncated,
        Some(LateFault::WrongSchema) => Damage::WrongSchema,
        Some(LateFault::Refused | LateFault::Empty) | None => Damage::None,
    };
    let blank = matches!(late, Some(LateFault::Refused | LateFault::Empty));
    let mut damage = damage;
    let mut content = if blank {
        String::new()
    } else {
        crate::steer::answer(reply.shared, reply.live, prompt, seed, damage)
    };
    let full_tokens = wire::completion_tokens(&content);
    // Thinking came first and shares the output limit: an answer with too
    // little room left is cut off there.
    let room = prompt
        .max_tokens
        .map(|m| m.saturating_sub(prompt.thinking_tokens));
    if let Some(room) = room.filter(|r| prompt.thinking_tokens > 0 && full_tokens > *r)
        && damage == Damage::None
        && !blank
    {
        damage = Damage::Truncated;
        content = if room == 0 {
            String::new()
        } else {
            crate::steer::answer(reply.shared, reply.live, prompt, seed, damage)
        };
        return Generated {
            content,
            damage,
            completion_tokens: room,
            outcome: Outcome::Truncated,
        };
    }
    let (completion_tokens, outcome) = match (late, damage) {
        // A refusal is a few words, billed like any answer.
        (Some(LateFault::Refused), _) => (wire::completion_tokens(REFUSAL), Outcome::Refused),
        (Some(LateFault::Empty), _) => (0, Outcome::Empty),
        (_, Damage::Truncated) => (prompt.max_tokens.unwrap_or(full_tokens), Outcome::Truncated),
        (_, Damage::WrongSchema) => (full_tokens, Outcome::WrongSchema),
        (_, Damage::None) => (full_tokens, Outcome::Ok),
    };
    Generated {
        content,
        damage,
        completion_tokens,
        outcome,
    }
}

/// Send the rendered answer, damaged by the late fault that strikes after
/// rendering (malformed, reset mid-body) or held back (the late fault).
async fn deliver(
    reply: &Reply<'_>,
    mut rendered: Rendered,
    late_fault: Option<LateFault>,
    outcome: Outcome,
    usage: (u64, u64),
    late: bool,
) -> Response {
    if late_fault == Some(LateFault::Malformed) {
        rendered.body = malformed(reply.route, rendered.body);
        reply.record(Outcome::Malformed, 200, None);
        return reply.build(rendered);
    }
    if late_fault == Some(LateFault::ResetMidBody) {
        // Generated, so billed; the client gets half the bytes it was promised.
        reply.record(Outcome::ResetMidBody, 200, Some(usage));
        return reset_mid_body(reply.build(rendered)).await;
    }
    reply.record(outcome, 200, Some(usage));
    if late {
        // Billed above, whether or not the client waits for it (row S6).
        reply
            .sleep_or_stop(Duration::from_millis(reply.live.config.late_ms))
            .await;
    }
    reply.build(rendered)
}
