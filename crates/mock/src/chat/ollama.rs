//! Ollama native chat: `POST /api/chat` (reference section 6.1).
//!
//! Contract: no key. Body `{model, messages:[{role, content}], stream?,
//! format?, options?:{num_predict, temperature}}`; `model` and a non-empty
//! `messages` are required (400 otherwise). `stream: false` gives one JSON
//! object; `stream` absent or `true` gives what Ollama gives by default, an
//! NDJSON body (`application/x-ndjson`): a few `"done": false` chunks carrying
//! pieces of the content, then a final `"done": true` line with `done_reason`
//! and the counts (the pieces concatenate to the same content as the
//! non-streamed answer). `format` as a JSON schema object or `"json"` steers
//! the answer (see `infer`); `options.num_predict` is the max-tokens limit and
//! the truncated fault gives `done_reason: "length"` with `eval_count ==
//! num_predict`. Durations are nanoseconds. Errors are `{"error":"…"}`: 400 bad
//! body, 401 (unauthorized mode), 429 (quota mode: a usage-limit message; rate
//! limits: a retry message plus `retry-after`), 500, 503 (fail-503: Ollama's
//! "server busy" queue-full answer).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::chat::infer;
use crate::chat::pipeline::{self, Answer, Event, Rendered, Request, Wire};
use crate::json::Json;
use crate::limits::{ceil_ms, go_duration};
use crate::state::Shared;
use crate::wire::Route;
use crate::wire::{MessageText, Prompt};

#[derive(Debug, Deserialize)]
struct ChatRequest {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    messages: Option<Vec<Message>>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    format: Option<Json>,
    #[serde(default)]
    options: Option<Options>,
}

#[derive(Debug, Deserialize)]
struct Message {
    #[serde(default)]
    content: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Options {
    #[serde(default)]
    num_predict: Option<i64>,
}

/// `POST /api/chat`
pub(crate) async fn handle(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    shared.stats.request_received();
    let live = shared.live();
    let parsed: Result<ChatRequest, String> =
        serde_json::from_slice(&body).map_err(|e| e.to_string());
    let (explicit, json_mode) = match parsed.as_ref().ok().and_then(|r| r.format.as_ref()) {
        Some(Json::Str(s)) if s == "json" => (None, true),
        Some(schema @ Json::Obj(_)) => (Some(schema), false),
        _ => (None, false),
    };
    let texts: Vec<MessageText<'_>> = match &parsed {
        Ok(req) => req
            .messages
            .iter()
            .flatten()
            .map(|m| MessageText::Whole(m.content.as_deref().unwrap_or("")))
            .collect(),
        Err(_) => Vec::new(),
    };
    let pieces = || texts.iter().flat_map(MessageText::pieces);
    let found = if explicit.is_none() {
        infer::schema_in_text(pieces())
    } else {
        None
    };
    let format = infer::format(
        explicit,
        found.as_ref(),
        json_mode,
        infer::mentions_json(pieces()),
    );
    let prompt = match &parsed {
        Err(msg) => Err(msg.clone()),
        Ok(req) => match (req.model.as_deref(), &req.messages) {
            (None | Some(""), _) => Err("model is required".to_string()),
            (_, None) => Err("messages is required".to_string()),
            (_, Some(m)) if m.is_empty() => Err("messages must not be empty".to_string()),
            (Some(model), Some(_)) => Ok(Prompt {
                model,
                messages: texts,
                format,
                max_tokens: req
                    .options
                    .as_ref()
                    .and_then(|o| o.num_predict)
                    .filter(|n| *n > 0)
                    .map(|n| n as u64),
                thinking_tokens: 0,
            }),
        },
    };
    let model = parsed
        .as_ref()
        .ok()
        .and_then(|r| r.model.as_deref())
        .unwrap_or("");
    let stream = parsed.as_ref().is_ok_and(|r| r.stream != Some(false));
    let req = Request {
        route: Route::Ollama,
        wire: WIRE,
        client_request_id: headers
            .get("x-client-request-id")
            .and_then(|v| v.to_str().ok()),
        reject: None,
        prompt,
        model,
        stream,
    };
    pipeline::run(&shared, &live, started, req).await
}

/// How the pipeline renders Ollama's wire (no extra per-response headers).
const WIRE: Wire = Wire {
    render_error: |_route, ev, _model, _request_id| render_error(ev),
    render_answer: |_route, a| render_answer(a),
    common_headers: |_route, _h, _request_id, _ms, _rate| {},
};

pub(crate) fn render_error(ev: &Event) -> Rendered {
    let (status, msg) = match ev {
        Event::NoAuth(_) | Event::Unauthorized => {
            (StatusCode::UNAUTHORIZED, "unauthorized".to_string())
        }
        Event::BadRequest(msg) => (StatusCode::BAD_REQUEST, msg.clone()),
        Event::Forbidden => (StatusCode::FORBIDDEN, "forbidden".to_string()),
        Event::ModelNotFound(m) => (
            StatusCode::NOT_FOUND,
            format!("model '{m}' not found, try pulling it first"),
        ),
        Event::Quota => (
            StatusCode::TOO_MANY_REQUESTS,
            "you have reached your usage limit, please upgrade or wait for the limit to reset"
                .to_string(),
        ),
        Event::RateLimited(l) => (
            StatusCode::TOO_MANY_REQUESTS,
            format!("too many requests, please retry in {}", go_duration(l.wait)),
        ),
        Event::TooLarge { limit, requested } => (
            StatusCode::BAD_REQUEST,
            format!(
                "request needs {requested} tokens, more than the {limit} tokens per minute allowed"
            ),
        ),
        Event::ServerError => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "llama runner process has terminated: exit status 2".to_string(),
        ),
        Event::Overloaded => (
            StatusCode::SERVICE_UNAVAILABLE,
            "server busy, please try again.  maximum pending requests exceeded".to_string(),
        ),
    };
    #[derive(Serialize)]
    struct Body {
        error: String,
    }
    let r = Rendered::json(
        status,
        serde_json::to_vec(&Body { error: msg }).unwrap_or_default(),
    );
    match ev {
        Event::RateLimited(l) => r.with(
            "retry-after",
            ceil_ms(l.wait).max(1).div_ceil(1000).to_string(),
        ),
        _ => r,
    }
}

#[derive(Serialize)]
struct Reply<'a> {
    model: &'a str,
    created_at: &'a str,
    message: Msg<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    done_reason: Option<&'static str>,
    done: bool,
    #[serde(flatten)]
    counts: Option<Counts>,
}

#[derive(Serialize)]
struct Msg<'a> {
    role: &'static str,
    content: &'a str,
}

#[derive(Serialize)]
struct Counts {
    total_duration: u64,
    load_duration: u64,
    prompt_eval_count: u64,
    prompt_eval_duration: u64,
    eval_count: u64,
    eval_duration: u64,
}

/// Stream pieces: about this many chars each.
const CHUNK: usize = 24;

pub(crate) fn render_answer(a: &Answer<'_>) -> Result<Rendered, String> {
    let created_at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true);
    // Synthetic model timings: 0.2 ms per prompt token, 10 ms per generated token.
    let prompt_eval = a.prompt_tokens * 200_000;
    let eval = a.completion_tokens * 10_000_000;
    let load = 1_000_000;
    let elapsed =
        u64::try_from(a.elapsed.max(Duration::from_nanos(1)).as_nanos()).unwrap_or(u64::MAX);
    let counts = Counts {
        total_duration: elapsed.max(load + prompt_eval + eval),
        load_duration: load,
        prompt_eval_count: a.prompt_tokens,
        prompt_eval_duration: prompt_eval,
        eval_count: a.completion_tokens,
        eval_duration: eval,
    };
    let done_reason = if a.truncated { "length" } else { "stop" };
    let line = |content: &str, last: Option<Counts>| {
        let done = last.is_some();
        serde_json::to_vec(&Reply {
            model: a.model,
            created_at: &created_at,
            message: Msg {
                role: "assistant",
                content,
            },
            done_reason: done.then_some(done_reason),
            done,
            counts: last,
        })
        .map_err(|e| e.to_string())
    };
    if !a.stream {
        return Ok(Rendered::json(
            StatusCode::OK,
            line(a.content, Some(counts))?,
        ));
    }
    let mut body = Vec::with_capacity(a.content.len() * 4 + 512);
    let mut rest = a.content;
    while !rest.is_empty() {
        let mut at = rest.len().min(CHUNK);
        while !rest.is_char_boundary(at) {
            at += 1;
        }
        let (piece, tail) = rest.split_at(at);
        body.extend(line(piece, None)?);
        body.push(b'\n');
        rest = tail;
    }
    body.extend(line("", Some(counts))?);
    body.push(b'\n');
    let mut r = Rendered::json(StatusCode::OK, body);
    r.content_type = "application/x-ndjson";
    Ok(r)
}
