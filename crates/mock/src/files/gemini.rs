//! Gemini Files API routes the batch adapter uses (reference 5.2).
//!
//! Contract:
//! - `POST /upload/v1beta/files` with `X-Goog-Upload-Protocol: resumable`
//!   and `X-Goog-Upload-Command: start` (JSON body `{"file": {"displayName"}}`,
//!   optional; `X-Goog-Upload-Header-Content-Length` / `-Content-Type`)
//!   answers 200 with an empty body, `X-Goog-Upload-Status: active` and
//!   `X-Goog-Upload-URL: http://{host}/upload/v1beta/files?upload_id=…&upload_protocol=resumable`.
//!   `X-Goog-Upload-Command: upload, finalize` to that URL with
//!   `X-Goog-Upload-Offset: 0` and the bytes answers `{"file": {...}}` and
//!   `X-Goog-Upload-Status: final`; a size other than the declared one, an
//!   unknown upload id or another command is a 400.
//! - `GET /v1beta/files/{id}` answers the File, `DELETE /v1beta/files/{id}`
//!   deletes it (`{}`; counted in `files_deleted`); `GET
//!   /download/v1beta/files/{id}:download?alt=media` the raw bytes.
//! - Cut results (`batch_cut_results = N`): the first N downloads of each
//!   responses file send the first half of the bytes (never ending on a line
//!   break), then drop the connection.
//! - For `batch_results_404_ms` after a responses file is made, its download
//!   is a 404 `NOT_FOUND` (logged `results_not_found`).
//! - Every route passes `gate::gemini::gate` first.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Extension, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::gate::gemini::{event, gate, not_found, ok, rpc};
use crate::state::gemini::{GFile, GemState, Upload, now_rfc3339};
use crate::state::{Shared, lock};
use crate::stats::BatchCount;
use crate::wire::id_hex;

/// Upload size limit (the Files API takes up to 2 GB; the mock holds files in memory).
pub(crate) const MAX_UPLOAD: usize = 512 * 1024 * 1024;
const ROUTE: &str = "/upload/v1beta/files";

fn bad(msg: &str) -> Response {
    rpc(StatusCode::BAD_REQUEST, "INVALID_ARGUMENT", msg)
}

fn header_str<'h>(h: &'h HeaderMap, name: &str) -> Option<&'h str> {
    h.get(name).and_then(|v| v.to_str().ok()).map(str::trim)
}

fn with_headers(mut resp: Response, pairs: &[(&'static str, String)]) -> Response {
    for (k, v) in pairs {
        if let Ok(v) = HeaderValue::from_str(v) {
            resp.headers_mut().insert(*k, v);
        }
    }
    resp
}

/// `POST /upload/v1beta/files` (both steps of the resumable protocol).
pub(crate) async fn upload(
    State(shared): State<Arc<Shared>>,
    Extension(store): Extension<GemState>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(r) = gate(&shared, ROUTE, &query, &headers) {
        return *r;
    }
    let command = header_str(&headers, "x-goog-upload-command")
        .unwrap_or("")
        .to_ascii_lowercase();
    let commands: Vec<&str> = command.split(',').map(str::trim).collect();
    if commands == ["start"] {
        return start_upload(&shared, &store, &headers, &body);
    }
    if !commands.contains(&"upload") || !commands.contains(&"finalize") {
        return bad("X-Goog-Upload-Command must be 'start' or 'upload, finalize'.");
    }
    finalize_upload(&shared, &store, &query, &headers, body)
}

/// The start command: the upload's name, type and declared size kept
/// under a new upload id, and the URL to send its bytes to.
fn start_upload(shared: &Shared, store: &GemState, headers: &HeaderMap, body: &[u8]) -> Response {
    if header_str(headers, "x-goog-upload-protocol") != Some("resumable") {
        return bad("X-Goog-Upload-Protocol must be 'resumable' for a start command.");
    }
    let meta: Value = if body.is_empty() {
        Value::Null
    } else {
        match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(e) => return bad(&format!("Invalid JSON payload received. {e}")),
        }
    };
    let file = meta.get("file").unwrap_or(&Value::Null);
    let display_name = ["displayName", "display_name"]
        .iter()
        .find_map(|k| file.get(*k).and_then(Value::as_str))
        .unwrap_or("")
        .to_string();
    let size = match header_str(headers, "x-goog-upload-header-content-length") {
        None => None,
        Some(s) => match s.parse::<usize>() {
            Ok(n) => Some(n),
            Err(_) => return bad("Invalid X-Goog-Upload-Header-Content-Length."),
        },
    };
    let mime = header_str(headers, "x-goog-upload-header-content-type")
        .unwrap_or("application/octet-stream")
        .to_string();
    let id = id_hex(shared.ids.fetch_add(1, Relaxed), !shared.salt);
    lock(store).uploads.insert(
        id.clone(),
        Upload {
            display_name,
            mime,
            size,
        },
    );
    let host = header_str(headers, "host").unwrap_or("127.0.0.1");
    let url = format!("http://{host}/upload/v1beta/files?upload_id={id}&upload_protocol=resumable");
    let resp = (StatusCode::OK, Body::empty()).into_response();
    with_headers(
        resp,
        &[
            ("x-goog-upload-status", "active".into()),
            ("x-goog-upload-url", url),
            ("x-goog-upload-chunk-granularity", "8388608".into()),
        ],
    )
}

/// The `upload, finalize` command: the whole file at offset 0, of the
/// declared size, made a File.
fn finalize_upload(
    shared: &Shared,
    store: &GemState,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
    body: Bytes,
) -> Response {
    let Some(id) = query.get("upload_id") else {
        return bad("Missing upload_id.");
    };
    if header_str(headers, "x-goog-upload-offset").is_some_and(|o| o != "0") {
        return bad("The mock takes the whole file at offset 0.");
    }
    let Some(up) = lock(store).uploads.remove(id) else {
        return rpc(StatusCode::NOT_FOUND, "NOT_FOUND", "Unknown upload id.");
    };
    if up.size.is_some_and(|n| n != body.len()) {
        return bad(&format!(
            "Upload size {} differs from the declared X-Goog-Upload-Header-Content-Length {}.",
            body.len(),
            up.size.unwrap_or(0)
        ));
    }
    let hex = id_hex(shared.ids.fetch_add(1, Relaxed), shared.salt);
    let file = GFile {
        name: format!("files/{}", &hex[..16]),
        display_name: up.display_name,
        mime: up.mime,
        bytes: body,
        create_time: now_rfc3339(),
        output: false,
        downloads: 0,
        hidden_until: None,
    };
    let answer = json!({"file": file.object()});
    shared.stats.count(BatchCount::FileUploaded);
    event(shared, ROUTE, &file.name, "", 200, "file_uploaded");
    lock(store).files.insert(file.name.clone(), file);
    with_headers(ok(&answer), &[("x-goog-upload-status", "final".into())])
}

/// `GET /v1beta/files/{id}`
pub(crate) async fn get(
    State(shared): State<Arc<Shared>>,
    Extension(store): Extension<GemState>,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = gate(&shared, "/v1beta/files/{file}", &query, &headers) {
        return *r;
    }
    let name = format!("files/{id}");
    match lock(&store).files.get(&name) {
        Some(f) => ok(&f.object()),
        None => not_found(&name),
    }
}

/// `DELETE /v1beta/files/{id}`: `{}`; an unknown file is a 404.
pub(crate) async fn delete(
    State(shared): State<Arc<Shared>>,
    Extension(store): Extension<GemState>,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = gate(&shared, "/v1beta/files/{file}", &query, &headers) {
        return *r;
    }
    let name = format!("files/{id}");
    let Some(gone) = lock(&store).files.remove(&name) else {
        return not_found(&name);
    };
    lock(&shared.deleted_files).insert(name, gone.bytes);
    shared.stats.count(BatchCount::FileDeleted);
    ok(&json!({}))
}

/// `GET /download/v1beta/files/{id}:download?alt=media`
pub(crate) async fn download(
    State(shared): State<Arc<Shared>>,
    Extension(store): Extension<GemState>,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = gate(
        &shared,
        "/download/v1beta/files/{file}:download",
        &query,
        &headers,
    ) {
        return *r;
    }
    let Some(id) = id.strip_suffix(":download") else {
        return rpc(StatusCode::NOT_FOUND, "NOT_FOUND", "Method not found.");
    };
    if query.get("alt").map(String::as_str) != Some("media") {
        return bad("Downloads need alt=media.");
    }
    let name = format!("files/{id}");
    let cut_first = shared.live().config.batch_cut_results;
    let (bytes, cut) = {
        let mut s = lock(&store);
        let Some(f) = s.files.get_mut(&name) else {
            drop(s);
            return not_found(&name);
        };
        if f.hidden_until
            .is_some_and(|t| std::time::Instant::now() < t)
        {
            drop(s);
            let route = "/download/v1beta/files/{file}:download";
            event(&shared, route, &name, "", 404, "results_not_found");
            return not_found(&name);
        }
        let cut = f.output && f.downloads < cut_first;
        f.downloads = f.downloads.saturating_add(1);
        (f.bytes.clone(), cut)
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
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
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
