//! Anthropic's Message Batches routes (reference section 4).
//!
//! Contract:
//! - `POST /v1/messages/batches` with `{"requests":[{"custom_id","params"}]}`:
//!   1..=100,000 requests, each `custom_id` matching `^[a-zA-Z0-9_-]{1,64}$`
//!   and unique, `params` an object (else 400 `invalid_request_error` naming
//!   `requests.N.…`; a body over 256 MB is refused with a plain 413 before
//!   the API, as Anthropic's edge does). `params` themselves are checked only
//!   when they run (an `errored` result). `mode = "quota"` is the 400
//!   credit-balance error. With `batch_enqueued_token_limit`, a batch whose
//!   prompt tokens would take the open batches past it is refused with a 429
//!   `rate_limit_error` (Anthropic limits what waits in the processing queue)
//!   and is not made. With `batch_lose_create = N` the next N creates (of any
//!   API) make the batch but answer a 500 with an empty body; with
//!   `batch_drop_create = N` the next N answer the same and make none.
//! - `GET /v1/messages/batches/{id}` the batch; `POST …/{id}/cancel` moves an
//!   `in_progress` batch to `canceling` (idempotent on a canceling batch, or
//!   one that ended after a cancel; a 400 on a batch that ended otherwise —
//!   not documented, a guess); `DELETE …/{id}` once ended.
//! - `GET /v1/messages/batches?limit=&after_id=&before_id=` newest first
//!   (`limit` 1..=1000, default 20) with `first_id`, `last_id`, `has_more`.
//! - `GET …/{id}/results`: the JSONL (`application/binary`), once ended with
//!   results; the first `batch_cut_results` downloads of each batch send the
//!   first half (never ending on a line break), then drop the connection.
//!   For `batch_results_404_ms` after the results are made, a 404
//!   `not_found_error` (logged `results_not_found`).
//!
//! Every route passes `gate::anthropic::gate` first; creates, cancels
//! and lifecycle transitions go into the log (provider "anthropic") and the
//! shared batch counters.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Serialize;
use serde_json::Value;

use super::lines::{parse, prompt_tokens};
use super::run::{self, Plan};
use crate::chat::pipeline::Event;
use crate::gate::anthropic::{Gate, event, gate, host};
use crate::state::anthropic::{Batch, BatchObject, Counts, Phase, ROUTE, ROUTE_ONE};
use crate::state::{Mode, Shared, lock};
use crate::stats::BatchCount;
use crate::wire::id_hex;

/// The whole create body (256 MB, the smaller reading).
const MAX_CREATE: usize = 256_000_000;

pub(crate) fn router() -> Router<Arc<Shared>> {
    Router::new()
        .route(
            ROUTE,
            post(create)
                .layer(DefaultBodyLimit::max(MAX_CREATE))
                .get(list),
        )
        .route(ROUTE_ONE, get(get_one).delete(delete))
        .route(
            "/v1/messages/batches/{message_batch_id}/cancel",
            post(cancel),
        )
        .route(
            "/v1/messages/batches/{message_batch_id}/results",
            get(results),
        )
}

/// `POST /v1/messages/batches`
async fn create(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let g = match gate(&shared, &headers) {
        Ok(g) => g,
        Err(r) => return *r,
    };
    if g.live.mode == Mode::Quota {
        return g.event(&Event::Quota);
    }
    let requests = match parse(&body) {
        Ok(r) => r,
        Err(msg) => return g.bad(&msg),
    };
    drop(body);
    let cfg = &g.live.config;
    if take_switch(&shared, |s| &mut s.dropped_creates, cfg.batch_drop_create) {
        // Lost before the provider acted on it: no batch.
        event(&shared, ROUTE, "", "", 500, "batch_create_dropped");
        return (StatusCode::INTERNAL_SERVER_ERROR, Vec::<u8>::new()).into_response();
    }
    let model = requests
        .iter()
        .find_map(|(_, p)| p.get("model").and_then(Value::as_str))
        .unwrap_or("")
        .to_string();
    let stored = match store_batch(&shared, &g, &headers, &requests, &model) {
        Ok(s) => s,
        Err(resp) => return *resp,
    };
    let lost = take_switch(&shared, |s| &mut s.lost_creates, cfg.batch_lose_create);
    shared.stats.count(BatchCount::Created);
    let status = if lost { 500 } else { 200 };
    event(&shared, ROUTE, &stored.id, &model, status, "batch_created");
    if cfg.batch_cancel_after_ms > 0 {
        schedule_provider_cancel(&shared, cfg.batch_cancel_after_ms, &stored.id);
    }
    run::spawn(
        Arc::clone(&shared),
        stored.id,
        requests,
        Plan::from_config(cfg, stored.seq),
        stored.cancel,
    );
    if lost {
        // The batch exists, but the client never learns its id.
        let mut resp = (StatusCode::INTERNAL_SERVER_ERROR, Vec::<u8>::new()).into_response();
        g.headers(resp.headers_mut());
        return resp;
    }
    let mut resp = (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        stored.object,
    )
        .into_response();
    g.headers(resp.headers_mut());
    resp
}

/// A create switch counted in the shared store (`batch_drop_create`,
/// `batch_lose_create`): true, and counted, while fewer than `limit` were taken.
fn take_switch(
    shared: &Shared,
    counter: impl FnOnce(&mut crate::state::openai::Store) -> &mut u32,
    limit: u32,
) -> bool {
    let mut store = lock(&shared.store);
    let taken = counter(&mut store);
    let hit = *taken < limit;
    if hit {
        *taken += 1;
    }
    hit
}

/// A batch just stored in progress.
struct Stored {
    id: String,
    /// the batch object as created, serialized
    object: Vec<u8>,
    seq: u64,
    cancel: Arc<tokio::sync::Notify>,
}

/// Store the new batch, unless its tokens would take the queue over
/// `batch_enqueued_token_limit` (a 429, counted and logged): the check and
/// the insert under one lock, so two creates cannot both squeeze in.
fn store_batch(
    shared: &Shared,
    g: &Gate,
    headers: &HeaderMap,
    requests: &[(String, Value)],
    model: &str,
) -> Result<Stored, Box<Response>> {
    let cfg = &g.live.config;
    let tokens: u64 = requests.iter().map(|(_, p)| prompt_tokens(p)).sum();
    let hex = id_hex(shared.ids.fetch_add(1, Relaxed), shared.salt);
    let id = format!("msgbatch_01{}", &hex[..24]);
    let mut store = lock(&shared.anthropic_batches);
    let limit = cfg.batch_enqueued_token_limit;
    let queued = store.enqueued_tokens();
    if limit > 0 && queued + tokens > limit {
        drop(store);
        let wait = Plan::from_config(cfg, 0).length();
        let msg = format!(
            "Number of queued batch tokens would exceed your rate limit of {limit} for the Message Batches API ({queued} queued, {tokens} in this batch). Please wait until some batches have ended and try again."
        );
        shared.stats.count(BatchCount::RateLimited);
        event(shared, ROUTE, "", model, 429, "rate_limited");
        let mut resp = g.error(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", &msg);
        let secs = wait.as_millis().div_ceil(1000).max(1) as u64;
        resp.headers_mut()
            .insert("retry-after", HeaderValue::from(secs));
        return Err(Box::new(resp));
    }
    let seq = store.next_seq;
    store.next_seq += 1;
    let batch = Batch {
        id: id.clone(),
        model: model.to_string(),
        phase: Phase::InProgress,
        counts: Counts {
            processing: requests.len() as u64,
            ..Counts::default()
        },
        created_at: chrono::Utc::now(),
        ended_at: None,
        cancel_initiated_at: None,
        results: None,
        downloads: 0,
        results_hidden_until: None,
        queued_tokens: tokens,
        cancel: Arc::default(),
    };
    let object = serde_json::to_vec(&batch.object(&host(headers))).unwrap_or_default();
    let cancel = Arc::clone(&batch.cancel);
    store.order.push(id.clone());
    store.batches.insert(id.clone(), batch);
    Ok(Stored {
        id,
        object,
        seq,
        cancel,
    })
}

/// `batch_cancel_after_ms`: the provider cancels the batch that long after
/// its create, unless the server stops first.
fn schedule_provider_cancel(shared: &Arc<Shared>, after_ms: u64, id: &str) {
    let after = std::time::Duration::from_millis(after_ms);
    let (shared, id) = (Arc::clone(shared), id.to_string());
    tokio::spawn(async move {
        tokio::select! {
            _ = tokio::time::sleep(after) => {}
            _ = shared.stopping() => return,
        }
        // The provider cancels it on its own, as the cancel route does.
        let mut store = lock(&shared.anthropic_batches);
        let Some(b) = store.batches.get_mut(&id) else {
            return;
        };
        if b.phase == Phase::InProgress {
            b.phase = Phase::Canceling;
            b.cancel_initiated_at = Some(chrono::Utc::now());
            b.cancel.notify_one();
            event(&shared, ROUTE_ONE, &b.id, &b.model, 0, "batch_cancelling");
        }
    });
}

/// `GET /v1/messages/batches/{id}`
async fn get_one(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    shared.stats.count(BatchCount::Poll);
    let g = match gate(&shared, &headers) {
        Ok(g) => g,
        Err(r) => return *r,
    };
    let store = lock(&shared.anthropic_batches);
    match store.batches.get(&id) {
        Some(b) => g.ok(&b.object(&host(&headers))),
        None => g.not_found(&id),
    }
}

/// `DELETE /v1/messages/batches/{id}` (only once ended)
async fn delete(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let g = match gate(&shared, &headers) {
        Ok(g) => g,
        Err(r) => return *r,
    };
    let mut store = lock(&shared.anthropic_batches);
    match store.batches.get(&id).map(|b| b.phase) {
        None => g.not_found(&id),
        Some(Phase::Ended) => {
            store.batches.remove(&id);
            store.order.retain(|x| *x != id);
            g.ok(&serde_json::json!({"id": id, "type": "message_batch_deleted"}))
        }
        Some(_) => g.bad(&format!(
            "Batch {id} cannot be deleted while it is still processing; cancel it first."
        )),
    }
}

/// `POST /v1/messages/batches/{id}/cancel`
async fn cancel(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let g = match gate(&shared, &headers) {
        Ok(g) => g,
        Err(r) => return *r,
    };
    let mut store = lock(&shared.anthropic_batches);
    let Some(b) = store.batches.get_mut(&id) else {
        return g.not_found(&id);
    };
    match b.phase {
        Phase::Canceling => {}
        Phase::Ended if b.cancel_initiated_at.is_some() => {}
        Phase::Ended => {
            return g.bad(&format!(
                "Batch {id} has already ended and cannot be canceled."
            ));
        }
        Phase::InProgress => {
            b.phase = Phase::Canceling;
            b.cancel_initiated_at = Some(chrono::Utc::now());
            b.cancel.notify_one();
            event(&shared, ROUTE_ONE, &b.id, &b.model, 200, "batch_cancelling");
        }
    }
    g.ok(&b.object(&host(&headers)))
}

#[derive(Serialize)]
struct List<'a> {
    data: Vec<BatchObject<'a>>,
    has_more: bool,
    first_id: Option<&'a str>,
    last_id: Option<&'a str>,
}

/// `GET /v1/messages/batches?limit=&after_id=&before_id=`
async fn list(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    shared.stats.count(BatchCount::Poll);
    let g = match gate(&shared, &headers) {
        Ok(g) => g,
        Err(r) => return *r,
    };
    let limit = match query.get("limit").map(|l| l.parse::<usize>()) {
        None => 20,
        Some(Ok(n)) if (1..=1000).contains(&n) => n,
        Some(_) => return g.bad("limit: Input should be an integer between 1 and 1000"),
    };
    let store = lock(&shared.anthropic_batches);
    let host = host(&headers);
    page(&g, &store, &query, limit, &host)
}

fn page(
    g: &Gate,
    store: &crate::state::anthropic::Store,
    query: &HashMap<String, String>,
    limit: usize,
    host: &str,
) -> Response {
    let newest_first: Vec<&Batch> = store
        .order
        .iter()
        .rev()
        .filter_map(|id| store.batches.get(id))
        .collect();
    let (mut rest, has_more): (Vec<&Batch>, bool) =
        match (query.get("after_id"), query.get("before_id")) {
            // Older than `after_id`.
            (Some(after), _) => {
                let at = newest_first.iter().position(|b| &b.id == after);
                let rest = at.map_or(Vec::new(), |i| newest_first[i + 1..].to_vec());
                let more = rest.len() > limit;
                (rest, more)
            }
            // Newer than `before_id`: the `limit` closest to it.
            (None, Some(before)) => {
                let at = newest_first.iter().position(|b| &b.id == before);
                let newer = at.map_or(&[][..], |i| &newest_first[..i]);
                let skip = newer.len().saturating_sub(limit);
                (newer[skip..].to_vec(), skip > 0)
            }
            (None, None) => {
                let more = newest_first.len() > limit;
                (newest_first, more)
            }
        };
    rest.truncate(limit);
    let list = List {
        first_id: rest.first().map(|b| b.id.as_str()),
        last_id: rest.last().map(|b| b.id.as_str()),
        data: rest.iter().map(|b| b.object(host)).collect(),
        has_more,
    };
    g.ok(&list)
}

/// `GET /v1/messages/batches/{id}/results`
async fn results(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let g = match gate(&shared, &headers) {
        Ok(g) => g,
        Err(r) => return *r,
    };
    let (bytes, cut) = {
        let mut store = lock(&shared.anthropic_batches);
        let Some(b) = store.batches.get_mut(&id) else {
            return g.not_found(&id);
        };
        let Some(bytes) = b.results.clone().filter(|_| b.phase == Phase::Ended) else {
            return g.bad(&format!(
                "Batch {id} has not finished processing; its results are not available yet."
            ));
        };
        if b.results_hidden_until
            .is_some_and(|t| std::time::Instant::now() < t)
        {
            let model = b.model.clone();
            drop(store);
            let route = "/v1/messages/batches/{message_batch_id}/results";
            event(&shared, route, &id, &model, 404, "results_not_found");
            return g.not_found(&id);
        }
        let cut = b.downloads < g.live.config.batch_cut_results;
        b.downloads = b.downloads.saturating_add(1);
        (bytes, cut)
    };
    let len = bytes.len();
    let body = if cut && len > 1 {
        Body::from_stream(cut_stream(bytes))
    } else {
        Body::from(bytes)
    };
    let mut resp = (StatusCode::OK, body).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/binary"),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    g.headers(h);
    resp
}

/// The first half of `bytes` (moved off a line break), a pause so it is
/// flushed, then an error: the server drops the connection mid-line.
fn cut_stream(
    bytes: Bytes,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    let mut at = bytes.len() / 2;
    while at > 1 && matches!(bytes[at - 1], b'\n' | b'\r') {
        at -= 1;
    }
    let head = bytes.slice(..at.max(1));
    futures::stream::unfold(Some(head), |state| async move {
        match state {
            Some(head) => Some((Ok(head), None)),
            None => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                let err = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "results cut");
                Some((Err(err), None))
            }
        }
    })
}
