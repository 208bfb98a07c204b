//! `POST /v1beta/models/{model}:batchGenerateContent`: the create body read
//! (inline requests or an uploaded file), the enqueued-token limit, and the
//! new batch stored in PENDING with its lifecycle started.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::Notify;

use super::super::answer;
use super::super::run::{self, Plan, Req};
use super::{BATCH_ROUTE, CREATE_ROUTE, INLINE_MAX, bad};
use crate::chat::gemini::{self, MSG_QUOTA};
use crate::chat::pipeline::Event;
use crate::gate::gemini::{event, gate, not_found, ok};
use crate::state::gemini::{GBatch, GState, GemState, now_rfc3339};
use crate::state::{Live, Mode, Shared, json_response, lock};
use crate::stats::BatchCount;
use crate::wire::id_hex;

pub(super) fn create(
    shared: &Arc<Shared>,
    store: GemState,
    model: String,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let live = match gate(shared, CREATE_ROUTE, query, headers) {
        Ok(l) => l,
        Err(r) => return *r,
    };
    if live.mode == Mode::Quota {
        let r = gemini::render_error(&Event::Quota, &model);
        return json_response(r.status, r.body);
    }
    let parsed = match parse_create(&store, &model, body) {
        Ok(p) => p,
        Err(resp) => return *resp,
    };
    let tokens: u64 = parsed
        .reqs
        .iter()
        .flatten()
        .map(|r| answer::prompt_tokens(&r.request))
        .sum();
    if let Err(resp) = check_enqueued_tokens(shared, &store, &live, &parsed.model, tokens) {
        return *resp;
    }
    let cfg = &live.config;
    let made = make_batch(shared, &store, &live, &parsed, tokens);
    shared.stats.count(BatchCount::Created);
    event(
        shared,
        CREATE_ROUTE,
        &made.name,
        &parsed.model,
        if made.lost { 500 } else { 200 },
        "batch_created",
    );
    if cfg.batch_cancel_after_ms > 0 {
        schedule_provider_cancel(shared, &store, &live, &made.name);
    }
    let plan = Plan::from_config(cfg, parsed.file.is_none(), made.seq);
    run::spawn(
        Arc::clone(shared),
        store,
        made.name,
        parsed.reqs,
        plan,
        made.cancel,
    );
    if made.lost {
        return (StatusCode::INTERNAL_SERVER_ERROR, Vec::<u8>::new()).into_response();
    }
    ok(&made.op)
}

/// A create body read: its model, name, input file and requests (`Err`: a
/// bad line of the file, which fails the batch after PENDING).
struct ParsedCreate {
    model: String,
    display_name: String,
    file: Option<String>,
    reqs: Result<Vec<Req>, String>,
}

/// Read the create body; a 400 (or a 404 for an unknown file) on the first fault.
fn parse_create(store: &GemState, model: &str, body: &[u8]) -> Result<ParsedCreate, Box<Response>> {
    let model = model.strip_prefix("models/").unwrap_or(model).to_string();
    if model.is_empty() {
        return Err(Box::new(bad(
            "* BatchGenerateContentRequest.model: unexpected model name format\n",
        )));
    }
    if body.len() > INLINE_MAX {
        return Err(Box::new(bad(&format!(
            "Request payload size exceeds the limit: {INLINE_MAX} bytes."
        ))));
    }
    let v: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return Err(Box::new(bad(&format!(
                "Invalid JSON payload received. {e}"
            ))));
        }
    };
    let Some(batch) = pick(&v, &["batch"]) else {
        return Err(Box::new(bad(
            "* BatchGenerateContentRequest.batch: batch is not specified\n",
        )));
    };
    let display_name = pick(batch, &["displayName", "display_name"])
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let Some(input) = pick(batch, &["inputConfig", "input_config"]) else {
        return Err(Box::new(bad(
            "* GenerateContentBatch.input_config: input_config is not specified\n",
        )));
    };
    let file = pick(input, &["fileName", "file_name"])
        .and_then(Value::as_str)
        .map(str::to_string);
    let reqs: Result<Vec<Req>, String> = match (&file, pick(input, &["requests"])) {
        (Some(f), _) => match lock(store).files.get(f) {
            Some(stored) => file_requests(&stored.bytes),
            None => return Err(Box::new(not_found(f))),
        },
        (None, Some(r)) => Ok(inline_requests(r)?),
        (None, None) => {
            return Err(Box::new(bad(
                "* GenerateContentBatch.input_config: requests or file_name is required\n",
            )));
        }
    };
    Ok(ParsedCreate {
        model,
        display_name,
        file,
        reqs,
    })
}

/// The inline `requests.requests` list: each entry's request and metadata key.
fn inline_requests(r: &Value) -> Result<Vec<Req>, Box<Response>> {
    let list = pick(r, &["requests"]).and_then(Value::as_array);
    let Some(list) = list.filter(|l| !l.is_empty()) else {
        return Err(Box::new(bad(
            "* GenerateContentBatch.input_config.requests: requests is empty\n",
        )));
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, item) in list.iter().enumerate() {
        let Some(request) = pick(item, &["request"]).filter(|r| r.is_object()) else {
            return Err(Box::new(bad(&format!(
                "* GenerateContentBatch.input_config.requests.requests[{i}].request: request is not specified\n"
            ))));
        };
        let key = pick(item, &["metadata"])
            .and_then(|m| m.get("key"))
            .and_then(Value::as_str)
            .map(str::to_string);
        out.push(Req {
            key,
            request: request.clone(),
        });
    }
    Ok(out)
}

/// `batch_enqueued_token_limit`: the open batches of the model plus this one
/// over the limit is a 429 RESOURCE_EXHAUSTED with a QuotaFailure, counted
/// and logged, and no batch is made.
fn check_enqueued_tokens(
    shared: &Shared,
    store: &GemState,
    live: &Live,
    model: &str,
    tokens: u64,
) -> Result<(), Box<Response>> {
    let limit = live.config.batch_enqueued_token_limit;
    if limit == 0 || lock(store).enqueued_tokens(model) + tokens <= limit {
        return Ok(());
    }
    shared.stats.count(BatchCount::RateLimited);
    event(shared, CREATE_ROUTE, "", model, 429, "rate_limited");
    let body = json!({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED",
        "message": format!("{MSG_QUOTA}\n* Quota exceeded for metric: generativelanguage.googleapis.com/batch_enqueued_tokens, limit: {limit}, model: {model}\nEnqueued token limit reached; try again once some batches have finished."),
        "details": [{"@type": "type.googleapis.com/google.rpc.QuotaFailure",
            "violations": [{"quotaMetric": "generativelanguage.googleapis.com/batch_enqueued_tokens",
                "quotaId": "BatchEnqueuedTokensPerModelPerProject",
                "quotaDimensions": {"location": "global", "model": model},
                "quotaValue": limit.to_string()}]}]}});
    Err(Box::new(json_response(
        StatusCode::TOO_MANY_REQUESTS,
        serde_json::to_vec(&body).unwrap_or_default(),
    )))
}

/// A batch just stored in PENDING.
struct Made {
    name: String,
    /// its Operation as created
    op: Value,
    cancel: Arc<Notify>,
    seq: u64,
    /// `batch_lose_create`: made, but answered with a 500
    lost: bool,
}

/// Draw the lost-create switch and store the new batch in PENDING.
fn make_batch(
    shared: &Shared,
    store: &GemState,
    live: &Live,
    parsed: &ParsedCreate,
    tokens: u64,
) -> Made {
    let hex = id_hex(shared.ids.fetch_add(1, Relaxed), shared.salt);
    let name = format!("batches/{}", &hex[..24]);
    let lost = {
        let mut s = lock(&shared.store);
        let lost = s.lost_creates < live.config.batch_lose_create;
        if lost {
            s.lost_creates += 1;
        }
        lost
    };
    let now = now_rfc3339();
    let b = GBatch {
        name: name.clone(),
        model: parsed.model.clone(),
        display_name: parsed.display_name.clone(),
        input_file: parsed.file.clone(),
        state: GState::Pending,
        done: false,
        create_time: now.clone(),
        update_time: now,
        end_time: None,
        total: parsed.reqs.as_ref().map_or(0, |r| r.len() as u64),
        ok: 0,
        failed: 0,
        queued_tokens: tokens,
        results: None,
        error: None,
        cancel_requested: false,
        cancel: Arc::default(),
    };
    let op = b.operation(true);
    let cancel = Arc::clone(&b.cancel);
    let seq = {
        let mut s = lock(store);
        let seq = s.next_seq;
        s.next_seq += 1;
        s.order.push(name.clone());
        s.batches.insert(name.clone(), b);
        seq
    };
    Made {
        name,
        op,
        cancel,
        seq,
        lost,
    }
}

/// `batch_cancel_after_ms`: the provider cancels a running batch that long
/// after validation starts, unless the server stops first.
fn schedule_provider_cancel(shared: &Arc<Shared>, store: &GemState, live: &Live, name: &str) {
    let after = live.config.batch_validating_ms + live.config.batch_cancel_after_ms;
    let (shared, store, name) = (Arc::clone(shared), store.clone(), name.to_string());
    tokio::spawn(async move {
        tokio::select! {
            _ = tokio::time::sleep(std::time::Duration::from_millis(after)) => {}
            _ = shared.stopping() => return,
        }
        // The provider cancels it on its own, as the cancel route does.
        let mut s = lock(&store);
        let Some(b) = s.batches.get_mut(&name) else {
            return;
        };
        if b.state == GState::Running && !b.cancel_requested {
            b.cancel_requested = true;
            b.cancel.notify_one();
            let model = b.model.clone();
            drop(s);
            event(&shared, BATCH_ROUTE, &name, &model, 0, "batch_cancelling");
        }
    });
}

fn pick<'v>(v: &'v Value, keys: &[&str]) -> Option<&'v Value> {
    keys.iter().find_map(|k| v.get(*k)).filter(|x| !x.is_null())
}

/// The requests of a file: `{"key", "request"}` per line, or the first bad line.
fn file_requests(bytes: &[u8]) -> Result<Vec<Req>, String> {
    let mut out = Vec::new();
    for (i, line) in bytes.split(|&b| b == b'\n').enumerate() {
        let line = line.trim_ascii();
        if line.is_empty() {
            continue;
        }
        let v: Value = serde_json::from_slice(line)
            .map_err(|e| format!("Invalid JSON in input file at line {}: {e}", i + 1))?;
        let Some(request) = pick(&v, &["request"]).filter(|r| r.is_object()) else {
            return Err(format!("Input file line {} has no request.", i + 1));
        };
        let key = pick(&v, &["key"])
            .and_then(Value::as_str)
            .map(str::to_string);
        out.push(Req {
            key,
            request: request.clone(),
        });
    }
    if out.is_empty() {
        return Err("The input file has no requests.".into());
    }
    Ok(out)
}
