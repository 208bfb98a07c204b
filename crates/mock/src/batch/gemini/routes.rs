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

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Extension, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::chat::gemini;
use crate::files::gemini as files;
use crate::gate::gemini::{event, gate, not_found, ok, rpc};
use crate::state::gemini::{GBatch, GState, GemState};
use crate::state::{Shared, lock};
use crate::stats::BatchCount;

mod create;

use create::create;

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
