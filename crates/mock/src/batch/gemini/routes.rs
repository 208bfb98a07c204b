//! Gemini batch mode routes (reference 5.2), registered with `routes()`.
//!
//! Contract:
//! - `POST /v1beta/models/{model}:batchGenerateContent` with `{"batch":
//!   {"displayName"|"display_name", "inputConfig"|"input_config":
//!   {"requests": {"requests": [{"request", "metadata": {"key"}}]}} or
//!   {"fileName"|"file_name": "files/…"}}}`. Inline bodies over 20 MiB, an
//!   empty request list or a malformed entry are 400 INVALID_ARGUMENT; an
//!   unknown file 404. A file's lines (`{"key","request"}`) are read at
//!   create; a bad line fails the batch after PENDING. `mode = "quota"` is a
//!   429 RESOURCE_EXHAUSTED; the enqueued-token limit (open batches of the
//!   model plus this one, prompt tokens estimated as the sync route does) is
//!   a 429 RESOURCE_EXHAUSTED with a QuotaFailure, and no batch is made.
//!   Else the batch is made (PENDING) and its lifecycle started; the answer
//!   is its Operation. `batch_lose_create = N`: the next N creates make the
//!   batch but answer a 500 with an empty body. Every other
//!   `/v1beta/models/{…}` POST goes to the sync route.
//! - `GET /v1beta/batches/{id}` the Operation; `POST /v1beta/batches/{id}:cancel`
//!   answers `{}` for a batch pending or running (cancel requested) or already
//!   cancelled, 400 FAILED_PRECONDITION for one that succeeded, failed or
//!   expired; `DELETE /v1beta/batches/{id}` answers `{}`.
//! - `GET /v1beta/batches?pageSize=&pageToken=` lists newest first (pageSize
//!   default 50, at most 100) as `{"operations": [...], "nextPageToken"}`,
//!   without inline results (as the real list).
//! - Files: see `files::gemini` (its routes are registered here, to share the store).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Extension, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use super::answer;
use super::run::{self, Plan, Req};
use crate::chat::gemini::{self, MSG_QUOTA};
use crate::chat::pipeline::Event;
use crate::files::gemini as files;
use crate::gate::gemini::{event, gate, not_found, ok, rpc};
use crate::state::gemini::{GBatch, GState, GemState, now_rfc3339};
use crate::state::{Mode, Shared, json_response, lock};
use crate::stats::BatchCount;
use crate::wire::id_hex;

const CREATE_ROUTE: &str = "/v1beta/models/{model}:batchGenerateContent";
const BATCH_ROUTE: &str = "/v1beta/batches/{batch}";
/// Inline create bodies above this are refused (20 MiB).
const INLINE_MAX: usize = 20 * 1024 * 1024;

/// The Gemini batch and file routes, with their own state.
pub(crate) fn routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/v1beta/models/{target}", post(model_action))
        .route("/v1beta/batches", get(list))
        .route(
            "/v1beta/batches/{id}",
            get(get_batch).post(cancel).delete(delete),
        )
        .route(
            "/upload/v1beta/files",
            post(files::upload).layer(DefaultBodyLimit::max(files::MAX_UPLOAD)),
        )
        .route("/v1beta/files/{id}", get(files::get).delete(files::delete))
        .route("/download/v1beta/files/{id}", get(files::download))
        .layer(Extension(GemState::default()))
}

/// `POST /v1beta/models/{target}`: batch create, else the sync route.
async fn model_action(
    State(shared): State<Arc<Shared>>,
    Extension(store): Extension<GemState>,
    Path(target): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match target.rsplit_once(':') {
        Some((model, "batchGenerateContent")) => {
            create(&shared, store, model.to_string(), &query, &headers, &body)
        }
        _ => gemini::handle(State(shared), Path(target), Query(query), headers, body).await,
    }
}

fn bad(msg: &str) -> Response {
    rpc(StatusCode::BAD_REQUEST, "INVALID_ARGUMENT", msg)
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

fn create(
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
    let model = model.strip_prefix("models/").unwrap_or(&model).to_string();
    if model.is_empty() {
        return bad("* BatchGenerateContentRequest.model: unexpected model name format\n");
    }
    if body.len() > INLINE_MAX {
        return bad(&format!(
            "Request payload size exceeds the limit: {INLINE_MAX} bytes."
        ));
    }
    let v: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return bad(&format!("Invalid JSON payload received. {e}")),
    };
    let Some(batch) = pick(&v, &["batch"]) else {
        return bad("* BatchGenerateContentRequest.batch: batch is not specified\n");
    };
    let display_name = pick(batch, &["displayName", "display_name"])
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let Some(input) = pick(batch, &["inputConfig", "input_config"]) else {
        return bad("* GenerateContentBatch.input_config: input_config is not specified\n");
    };
    let file = pick(input, &["fileName", "file_name"])
        .and_then(Value::as_str)
        .map(str::to_string);
    let reqs: Result<Vec<Req>, String> = match (&file, pick(input, &["requests"])) {
        (Some(f), _) => match lock(&store).files.get(f) {
            Some(stored) => file_requests(&stored.bytes),
            None => return not_found(f),
        },
        (None, Some(r)) => {
            let list = pick(r, &["requests"]).and_then(Value::as_array);
            let Some(list) = list.filter(|l| !l.is_empty()) else {
                return bad("* GenerateContentBatch.input_config.requests: requests is empty\n");
            };
            let mut out = Vec::with_capacity(list.len());
            for (i, item) in list.iter().enumerate() {
                let Some(request) = pick(item, &["request"]).filter(|r| r.is_object()) else {
                    return bad(&format!(
                        "* GenerateContentBatch.input_config.requests.requests[{i}].request: request is not specified\n"
                    ));
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
        (None, None) => {
            return bad("* GenerateContentBatch.input_config: requests or file_name is required\n");
        }
    };
    let cfg = &live.config;
    let tokens: u64 = reqs
        .iter()
        .flatten()
        .map(|r| answer::prompt_tokens(&r.request))
        .sum();
    let limit = cfg.batch_enqueued_token_limit;
    if limit > 0 && lock(&store).enqueued_tokens(&model) + tokens > limit {
        shared.stats.count(BatchCount::RateLimited);
        event(shared, CREATE_ROUTE, "", &model, 429, "rate_limited");
        let body = json!({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED",
            "message": format!("{MSG_QUOTA}\n* Quota exceeded for metric: generativelanguage.googleapis.com/batch_enqueued_tokens, limit: {limit}, model: {model}\nEnqueued token limit reached; try again once some batches have finished."),
            "details": [{"@type": "type.googleapis.com/google.rpc.QuotaFailure",
                "violations": [{"quotaMetric": "generativelanguage.googleapis.com/batch_enqueued_tokens",
                    "quotaId": "BatchEnqueuedTokensPerModelPerProject",
                    "quotaDimensions": {"location": "global", "model": model},
                    "quotaValue": limit.to_string()}]}]}});
        return json_response(
            StatusCode::TOO_MANY_REQUESTS,
            serde_json::to_vec(&body).unwrap_or_default(),
        );
    }
    let hex = id_hex(shared.ids.fetch_add(1, Relaxed), shared.salt);
    let name = format!("batches/{}", &hex[..24]);
    let lost = {
        let mut s = lock(&shared.store);
        let lost = s.lost_creates < cfg.batch_lose_create;
        if lost {
            s.lost_creates += 1;
        }
        lost
    };
    let now = now_rfc3339();
    let b = GBatch {
        name: name.clone(),
        model: model.clone(),
        display_name,
        input_file: file.clone(),
        state: GState::Pending,
        done: false,
        create_time: now.clone(),
        update_time: now,
        end_time: None,
        total: reqs.as_ref().map_or(0, |r| r.len() as u64),
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
        let mut s = lock(&store);
        let seq = s.next_seq;
        s.next_seq += 1;
        s.order.push(name.clone());
        s.batches.insert(name.clone(), b);
        seq
    };
    shared.stats.count(BatchCount::Created);
    event(
        shared,
        CREATE_ROUTE,
        &name,
        &model,
        if lost { 500 } else { 200 },
        "batch_created",
    );
    if cfg.batch_cancel_after_ms > 0 {
        let after = cfg.batch_validating_ms + cfg.batch_cancel_after_ms;
        let (shared, store, name) = (Arc::clone(shared), store.clone(), name.clone());
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
    let plan = Plan::from_config(cfg, file.is_none(), seq);
    run::spawn(Arc::clone(shared), store, name, reqs, plan, cancel);
    if lost {
        return (StatusCode::INTERNAL_SERVER_ERROR, Vec::<u8>::new()).into_response();
    }
    ok(&op)
}

/// `GET /v1beta/batches/{id}`
async fn get_batch(
    State(shared): State<Arc<Shared>>,
    Extension(store): Extension<GemState>,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    shared.stats.count(BatchCount::Poll);
    if let Err(r) = gate(&shared, BATCH_ROUTE, &query, &headers) {
        return *r;
    }
    let name = format!("batches/{id}");
    match lock(&store).batches.get(&name) {
        Some(b) => ok(&b.operation(true)),
        None => not_found(&name),
    }
}

/// `POST /v1beta/batches/{id}:cancel`
async fn cancel(
    State(shared): State<Arc<Shared>>,
    Extension(store): Extension<GemState>,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let Some(id) = id.strip_suffix(":cancel") else {
        return rpc(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            &format!("Method not found: batches/{id}"),
        );
    };
    if let Err(r) = gate(&shared, BATCH_ROUTE, &query, &headers) {
        return *r;
    }
    let name = format!("batches/{id}");
    let mut s = lock(&store);
    let Some(b) = s.batches.get_mut(&name) else {
        drop(s);
        return not_found(&name);
    };
    match b.state {
        GState::Cancelled => {}
        _ if b.cancel_requested => {}
        GState::Pending | GState::Running => {
            b.cancel_requested = true;
            b.cancel.notify_one();
            let model = b.model.clone();
            drop(s);
            event(&shared, BATCH_ROUTE, &name, &model, 200, "batch_cancelling");
        }
        other => {
            drop(s);
            return rpc(
                StatusCode::BAD_REQUEST,
                "FAILED_PRECONDITION",
                &format!(
                    "Batch {name} is already in a terminal state ({}).",
                    other.as_str()
                ),
            );
        }
    }
    ok(&json!({}))
}

/// `DELETE /v1beta/batches/{id}`
async fn delete(
    State(shared): State<Arc<Shared>>,
    Extension(store): Extension<GemState>,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = gate(&shared, BATCH_ROUTE, &query, &headers) {
        return *r;
    }
    let name = format!("batches/{id}");
    let mut s = lock(&store);
    if s.batches.remove(&name).is_none() {
        return not_found(&name);
    }
    s.order.retain(|n| n != &name);
    ok(&json!({}))
}

/// `GET /v1beta/batches?pageSize=&pageToken=`
async fn list(
    State(shared): State<Arc<Shared>>,
    Extension(store): Extension<GemState>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    shared.stats.count(BatchCount::Poll);
    if let Err(r) = gate(&shared, "/v1beta/batches", &query, &headers) {
        return *r;
    }
    let size = match query.get("pageSize").map(|s| s.parse::<usize>()) {
        None | Some(Ok(0)) => 50,
        Some(Ok(n)) => n.min(100),
        Some(Err(_)) => return bad("Invalid value at 'page_size' (TYPE_INT32)"),
    };
    let start = match query.get("pageToken").filter(|t| !t.is_empty()) {
        None => 0,
        Some(t) => match t.strip_prefix("o").and_then(|n| n.parse::<usize>().ok()) {
            Some(n) => n,
            None => return bad("Invalid page token."),
        },
    };
    let s = lock(&store);
    let newest_first: Vec<&GBatch> = s
        .order
        .iter()
        .rev()
        .filter_map(|n| s.batches.get(n))
        .collect();
    let page: Vec<Value> = newest_first
        .iter()
        .skip(start)
        .take(size)
        .map(|b| b.operation(false))
        .collect();
    let mut out = json!({"operations": page});
    if start + size < newest_first.len() {
        out["nextPageToken"] = json!(format!("o{}", start + size));
    }
    ok(&out)
}
