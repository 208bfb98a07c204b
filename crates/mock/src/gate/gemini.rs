//! The gate every Gemini batch/file route passes first, Gemini's
//! google.rpc error shape and answers, and the batch event log entry.
//!
//! Gate, in order: a `key` query parameter is a 400 INVALID_ARGUMENT (and a
//! `key_in_url` log entry), no `x-goog-api-key` a 403, `mode = unauthorized`
//! a 403, the shared rpm bucket at a cost of 0 tokens a 429
//! RESOURCE_EXHAUSTED with RetryInfo (counted as `batch_rate_limited`).

use std::collections::HashMap;
use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::chat::gemini::{MSG_KEY_IN_URL, render_error};
use crate::chat::openai::has_value;
use crate::chat::pipeline::{Event, Limited};
use crate::limits::Decision;
use crate::state::{Live, Mode, Shared, json_response, lock};
use crate::stats::{BatchCount, BatchEvent};

/// `{"error":{"code","message","status","details"}}`.
pub(crate) fn rpc(status: StatusCode, rpc_status: &str, message: &str) -> Response {
    let body = json!({"error": {"code": status.as_u16(), "message": message, "status": rpc_status, "details": []}});
    json_response(status, serde_json::to_vec(&body).unwrap_or_default())
}

pub(crate) fn not_found(what: &str) -> Response {
    rpc(
        StatusCode::NOT_FOUND,
        "NOT_FOUND",
        &format!("Requested entity was not found: {what}"),
    )
}

pub(crate) fn ok(value: &Value) -> Response {
    json_response(
        StatusCode::OK,
        serde_json::to_vec(value).unwrap_or_default(),
    )
}

pub(crate) fn event(
    shared: &Shared,
    route: &str,
    id: &str,
    model: &str,
    status: u16,
    outcome: &str,
) {
    let e = BatchEvent {
        provider: "gemini",
        route,
        batch_id: id,
        client_request_id: None,
        model,
        status,
        outcome,
    };
    shared.stats.event(&e, shared.live().config.log_capacity);
}

/// Auth, mode and the rpm bucket for every Gemini batch/file route.
pub(crate) fn gate(
    shared: &Shared,
    route: &str,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
) -> Result<Arc<Live>, Box<Response>> {
    let live = shared.live();
    let render = |ev: &Event| {
        let r = render_error(ev, "batch");
        Box::new(json_response(r.status, r.body))
    };
    if query.contains_key("key") {
        event(shared, route, "", "", 400, "key_in_url");
        return Err(render(&Event::BadRequest(MSG_KEY_IN_URL.to_string())));
    }
    if !has_value(headers, "x-goog-api-key") {
        return Err(render(&Event::NoAuth(
            "Method doesn't allow unregistered callers (callers without established identity). Please use API Key or other form of API consumer identity to call this API.".to_string(),
        )));
    }
    if live.mode == Mode::Unauthorized {
        return Err(render(&Event::Unauthorized));
    }
    if live.limits_on
        && let Decision::Limited {
            kind,
            limit,
            used,
            requested,
            wait,
            ..
        } = lock(&shared.limits).check(0, Instant::now())
    {
        shared.stats.count(BatchCount::RateLimited);
        return Err(render(&Event::RateLimited(Limited {
            kind,
            limit,
            used,
            requested,
            wait,
        })));
    }
    Ok(live)
}
