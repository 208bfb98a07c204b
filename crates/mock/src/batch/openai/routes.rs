//! The Batches API routes (OpenAI `/v1/batches`, Azure `/openai/batches`).
//!
//! Contract:
//! - `POST …/batches` checks the request (input file of this API with purpose
//!   `batch`, an accepted `endpoint`, `completion_window: "24h"`, metadata of
//!   at most 16 string pairs with keys ≤ 64 and values ≤ 512 chars; else 400,
//!   or 404 for an unknown file; `mode = "quota"` is a 429 `insufficient_quota`),
//!   then makes the batch in `validating`, starts its lifecycle (`run`),
//!   counts it and logs it. With `batch_lose_create = N` the next N creates make
//!   the batch but answer a 500 with an empty body; with `batch_reject_input =
//!   N` the next N batches fail validation naming an input line.
//! - `GET …/batches/{id}` answers the Batch object (the next `batch_poll_fail`
//!   polls a 503 instead); `POST …/batches/{id}/cancel`
//!   moves a non-terminal batch to `cancelling` (idempotent on a cancelling or
//!   cancelled batch; 400 `invalid_request_error` on completed, failed or
//!   expired — the status code is not documented, 400 is a guess).
//! - `GET …/batches?after=&limit=` lists newest first (`limit` 1..=100, default
//!   20) with `first_id`, `last_id`, `has_more`.
//!
//! Every route goes through `gate::openai::gate` (auth, api-version, mode, rpm bucket).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde::Serialize;
use serde_json::Value;

use super::run::{self, Plan};
use crate::chat::pipeline::Event;
use crate::gate::openai::{Gate, gate};
use crate::state::openai::{Batch, BatchObject, Stamps, Status, unix_now};
use crate::state::{Mode, Shared, lock};
use crate::stats::{BatchCount, BatchEvent};
use crate::wire::id_hex;

#[derive(Deserialize)]
struct CreateBody {
    #[serde(default)]
    input_file_id: Option<String>,
    #[serde(default)]
    endpoint: Option<String>,
    #[serde(default)]
    completion_window: Option<String>,
    #[serde(default)]
    metadata: Option<Value>,
}

/// `POST /v1/batches`, `POST /openai/batches`
pub(crate) async fn create(
    State(shared): State<Arc<Shared>>,
    uri: Uri,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let g = match gate(&shared, &uri, &query, &headers) {
        Ok(g) => g,
        Err(r) => return *r,
    };
    if g.live.mode == Mode::Quota {
        return g.event(&Event::Quota);
    }
    let valid = match validate_create(&g, &body) {
        Ok(v) => v,
        Err(resp) => return *resp,
    };
    let input = match input_bytes(&shared, &g, &valid.input_file_id) {
        Ok(bytes) => bytes,
        Err(resp) => return *resp,
    };
    if let Err(resp) = refuse_by_switch(&shared, &g) {
        return *resp;
    }
    let endpoint = valid.endpoint.clone();
    let made = make_batch(&shared, &g, valid);
    log_created(&shared, &g, &headers, &made);
    let cfg = &g.live.config;
    if cfg.batch_cancel_after_ms > 0 {
        schedule_provider_cancel(&shared, &g, &made.id);
    }
    let mut plan = Plan::from_config(cfg, g.api, endpoint, made.seq);
    plan.reject_input = made.reject;
    run::spawn(Arc::clone(&shared), made.id, input, plan, made.cancel);
    if cfg.batch_create_delay_ms > 0 {
        // Made, but the answer is slow: a client that dies meanwhile has a
        // batch it never heard of.
        tokio::time::sleep(std::time::Duration::from_millis(cfg.batch_create_delay_ms)).await;
    }
    if made.lost {
        // The batch exists, but the client never learns its id.
        let mut resp = (StatusCode::INTERNAL_SERVER_ERROR, Vec::<u8>::new()).into_response();
        g.headers(resp.headers_mut());
        return resp;
    }
    let mut resp = (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        made.object,
    )
        .into_response();
    g.headers(resp.headers_mut());
    resp
}

/// A create body that passed validation.
struct ValidCreate {
    input_file_id: String,
    endpoint: String,
    metadata: Option<Vec<(String, String)>>,
}

/// Check the create body's fields in the order OpenAI reports them (400s).
fn validate_create(g: &Gate, body: &[u8]) -> Result<ValidCreate, Box<Response>> {
    let bad = |msg: &str, param: Option<&str>| g.error(StatusCode::BAD_REQUEST, msg, param, None);
    let req: CreateBody = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => return Err(Box::new(bad(&format!("Invalid request body: {e}"), None))),
    };
    let Some(input_file_id) = req.input_file_id.filter(|s| !s.is_empty()) else {
        return Err(Box::new(bad(
            "Missing required parameter: 'input_file_id'.",
            Some("input_file_id"),
        )));
    };
    let Some(endpoint) = req.endpoint else {
        return Err(Box::new(bad(
            "Missing required parameter: 'endpoint'.",
            Some("endpoint"),
        )));
    };
    if !g.api.endpoints().contains(&endpoint.as_str()) {
        let msg = format!(
            "Invalid value: '{endpoint}'. Supported values are: {:?} (the mock runs chat completions only).",
            g.api.endpoints()
        );
        return Err(Box::new(bad(&msg, Some("endpoint"))));
    }
    match req.completion_window.as_deref() {
        Some("24h") => {}
        None => {
            return Err(Box::new(bad(
                "Missing required parameter: 'completion_window'.",
                Some("completion_window"),
            )));
        }
        Some(other) => {
            let msg = format!("Invalid value: '{other}'. Supported values are: '24h'.");
            return Err(Box::new(bad(&msg, Some("completion_window"))));
        }
    }
    let metadata = metadata(req.metadata).map_err(|msg| Box::new(bad(&msg, Some("metadata"))))?;
    Ok(ValidCreate {
        input_file_id,
        endpoint,
        metadata,
    })
}

/// The input file's bytes: a file of this API (else 404) with purpose `batch` (else 400).
fn input_bytes(shared: &Shared, g: &Gate, input_file_id: &str) -> Result<Bytes, Box<Response>> {
    let store = lock(&shared.store);
    let Some(file) = store.file(g.api, input_file_id) else {
        drop(store);
        return Err(Box::new(g.not_found("File", input_file_id)));
    };
    if file.purpose != "batch" {
        let msg = format!(
            "Invalid 'input_file_id': '{input_file_id}'. The file has purpose '{}'; a batch input needs purpose 'batch'.",
            file.purpose
        );
        drop(store);
        return Err(Box::new(g.error(
            StatusCode::BAD_REQUEST,
            &msg,
            Some("input_file_id"),
            None,
        )));
    }
    Ok(file.bytes.clone())
}

/// `batch_refuse_create`: the next N creates are refused with a 400.
fn refuse_by_switch(shared: &Shared, g: &Gate) -> Result<(), Box<Response>> {
    let mut store = lock(&shared.store);
    if store.refused_creates < g.live.config.batch_refuse_create {
        store.refused_creates += 1;
        drop(store);
        return Err(Box::new(g.error(
            StatusCode::BAD_REQUEST,
            "mock: this batch create is refused (batch_refuse_create)",
            None,
            None,
        )));
    }
    Ok(())
}

/// A batch just stored in `validating`, with the switches drawn for it.
struct Made {
    id: String,
    /// the Batch object as created, serialized
    object: Vec<u8>,
    seq: u64,
    cancel: Arc<tokio::sync::Notify>,
    /// `batch_lose_create`: made, but answered with a 500
    lost: bool,
    /// `batch_reject_input`: fails validation naming an input line
    reject: bool,
}

/// Store the new batch in `validating` and draw its create switches.
fn make_batch(shared: &Shared, g: &Gate, valid: ValidCreate) -> Made {
    let cfg = &g.live.config;
    let hex = id_hex(shared.ids.fetch_add(1, Relaxed), shared.salt);
    let id = format!("batch_{hex}");
    let mut store = lock(&shared.store);
    let seq = store.next_seq;
    store.next_seq += 1;
    let lost = store.lost_creates < cfg.batch_lose_create;
    if lost {
        store.lost_creates += 1;
    }
    let reject = store.rejected_inputs < cfg.batch_reject_input;
    if reject {
        store.rejected_inputs += 1;
    }
    let batch = Batch {
        api: g.api,
        id: id.clone(),
        endpoint: valid.endpoint,
        input_file_id: valid.input_file_id,
        metadata: valid.metadata,
        status: Status::Validating,
        model: None,
        errors: Vec::new(),
        created_at: unix_now(),
        at: Stamps::default(),
        total: 0,
        completed: 0,
        failed: 0,
        input_tokens: 0,
        output_tokens: 0,
        queued_tokens: 0,
        output_file_id: None,
        error_file_id: None,
        cancel_requested: false,
        cancel: Arc::default(),
    };
    let object = serde_json::to_vec(&batch.object()).unwrap_or_default();
    let cancel = Arc::clone(&batch.cancel);
    store.order.push(id.clone());
    store.batches.insert(id.clone(), batch);
    Made {
        id,
        object,
        seq,
        cancel,
        lost,
        reject,
    }
}

/// Count the create and log it (a lost create logs its 500).
fn log_created(shared: &Shared, g: &Gate, headers: &HeaderMap, made: &Made) {
    shared.stats.count(BatchCount::Created);
    let event = BatchEvent {
        provider: g.api.provider(),
        route: if g.api == crate::state::openai::Api::Azure {
            "/openai/batches"
        } else {
            "/v1/batches"
        },
        batch_id: &made.id,
        client_request_id: headers
            .get("x-client-request-id")
            .and_then(|v| v.to_str().ok()),
        model: "",
        status: if made.lost { 500 } else { 200 },
        outcome: "batch_created",
    };
    shared.stats.event(&event, g.live.config.log_capacity);
}

/// `batch_cancel_after_ms`: the provider cancels the batch that long after
/// validation starts, unless the server stops first.
fn schedule_provider_cancel(shared: &Arc<Shared>, g: &Gate, id: &str) {
    let cfg = &g.live.config;
    let after = cfg.batch_validating_ms + cfg.batch_cancel_after_ms;
    let (shared, api, id) = (Arc::clone(shared), g.api, id.to_string());
    tokio::spawn(async move {
        tokio::select! {
            _ = tokio::time::sleep(std::time::Duration::from_millis(after)) => {}
            _ = shared.stopping() => return,
        }
        provider_cancel(&shared, api, &id);
    });
}

/// `batch_cancel_after_ms`: the provider cancels batch `id` on its own, as
/// the cancel route does, if it is still in progress.
fn provider_cancel(shared: &Shared, api: crate::state::openai::Api, id: &str) {
    let mut store = lock(&shared.store);
    let Some(b) = store.batch_mut(api, id) else {
        return;
    };
    if b.status != Status::InProgress {
        return;
    }
    b.status = Status::Cancelling;
    b.at.cancelling = Some(unix_now());
    b.cancel_requested = true;
    b.cancel.notify_one();
    let event = BatchEvent {
        provider: api.provider(),
        route: b.route(),
        batch_id: &b.id,
        client_request_id: None,
        model: b.model.as_deref().unwrap_or(""),
        status: 0,
        outcome: "batch_cancelling",
    };
    shared
        .stats
        .event(&event, shared.live().config.log_capacity);
}

/// At most 16 pairs of strings, keys ≤ 64 chars, values ≤ 512.
fn metadata(value: Option<Value>) -> Result<Option<Vec<(String, String)>>, String> {
    let map = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(map)) => map,
        Some(_) => return Err("Invalid 'metadata': expected an object.".to_string()),
    };
    if map.len() > 16 {
        return Err(format!(
            "Invalid 'metadata': too many properties. Expected an object with at most 16 properties, but got an object with {} properties instead.",
            map.len()
        ));
    }
    let mut pairs = Vec::with_capacity(map.len());
    for (k, v) in map {
        let Value::String(v) = v else {
            return Err(format!(
                "Invalid 'metadata.{k}': expected a string, but got a different type instead."
            ));
        };
        if k.chars().count() > 64 {
            return Err(format!(
                "Invalid 'metadata': key '{k}' is longer than 64 characters."
            ));
        }
        if v.chars().count() > 512 {
            return Err(format!(
                "Invalid 'metadata.{k}': string too long. Expected a string with maximum length 512."
            ));
        }
        pairs.push((k, v));
    }
    Ok(Some(pairs))
}

/// `GET /v1/batches/{id}`, `GET /openai/batches/{id}`
pub(crate) async fn get(
    State(shared): State<Arc<Shared>>,
    uri: Uri,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    shared.stats.count(BatchCount::Poll);
    let g = match gate(&shared, &uri, &query, &headers) {
        Ok(g) => g,
        Err(r) => return *r,
    };
    let fail = g.live.config.batch_poll_fail;
    let failed = shared
        .poll_failures
        .fetch_update(Relaxed, Relaxed, |n| (n < fail).then_some(n + 1))
        .is_ok();
    if failed {
        return g.event(&Event::Overloaded);
    }
    let store = lock(&shared.store);
    match store.batch(g.api, &id) {
        Some(b) => g.ok(&b.object()),
        None => g.not_found("Batch", &id),
    }
}

/// `POST /v1/batches/{id}/cancel`, `POST /openai/batches/{id}/cancel`
pub(crate) async fn cancel(
    State(shared): State<Arc<Shared>>,
    uri: Uri,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let g = match gate(&shared, &uri, &query, &headers) {
        Ok(g) => g,
        Err(r) => return *r,
    };
    let mut store = lock(&shared.store);
    let Some(b) = store.batch_mut(g.api, &id) else {
        drop(store);
        return g.not_found("Batch", &id);
    };
    match b.status {
        Status::Cancelling | Status::Cancelled => {}
        Status::Completed | Status::Failed | Status::Expired => {
            let msg = format!("Cannot cancel a batch with status '{}'.", b.status.as_str());
            drop(store);
            return g.error(StatusCode::BAD_REQUEST, &msg, None, None);
        }
        Status::Validating | Status::InProgress | Status::Finalizing => {
            b.status = Status::Cancelling;
            b.at.cancelling = Some(unix_now());
            b.cancel_requested = true;
            b.cancel.notify_one();
            let event = BatchEvent {
                provider: g.api.provider(),
                route: b.route(),
                batch_id: &b.id,
                client_request_id: None,
                model: b.model.as_deref().unwrap_or(""),
                status: 200,
                outcome: "batch_cancelling",
            };
            shared.stats.event(&event, g.live.config.log_capacity);
        }
    }
    g.ok(&b.object())
}

#[derive(Serialize)]
struct List<'a> {
    object: &'static str,
    data: Vec<BatchObject<'a>>,
    first_id: Option<&'a str>,
    last_id: Option<&'a str>,
    has_more: bool,
}

/// `GET /v1/batches?after=&limit=`, `GET /openai/batches?…`
pub(crate) async fn list(
    State(shared): State<Arc<Shared>>,
    uri: Uri,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    shared.stats.count(BatchCount::Poll);
    let g = match gate(&shared, &uri, &query, &headers) {
        Ok(g) => g,
        Err(r) => return *r,
    };
    let limit = match query.get("limit").map(|l| l.parse::<usize>()) {
        None => 20,
        Some(Ok(n)) if (1..=100).contains(&n) => n,
        Some(_) => {
            let msg = "Invalid 'limit': expected an integer between 1 and 100.";
            return g.error(StatusCode::BAD_REQUEST, msg, Some("limit"), None);
        }
    };
    let store = lock(&shared.store);
    list_page(&g, &store, query.get("after").map(String::as_str), limit)
}

fn list_page(
    g: &Gate,
    store: &crate::state::openai::Store,
    after: Option<&str>,
    limit: usize,
) -> Response {
    let newest_first = store
        .order
        .iter()
        .rev()
        .filter_map(|id| store.batch(g.api, id));
    let mut rest: Vec<&Batch> = match after {
        None => newest_first.collect(),
        Some(after) => newest_first.skip_while(|b| b.id != after).skip(1).collect(),
    };
    let has_more = rest.len() > limit;
    rest.truncate(limit);
    let list = List {
        object: "list",
        first_id: rest.first().map(|b| b.id.as_str()),
        last_id: rest.last().map(|b| b.id.as_str()),
        data: rest.iter().map(|b| b.object()).collect(),
        has_more,
    };
    g.ok(&list)
}
