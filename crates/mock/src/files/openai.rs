//! The Files API routes (OpenAI `/v1/files`, Azure `/openai/files`).
//!
//! Contract:
//! - `POST /v1/files` (multipart/form-data: `file` with a filename, `purpose`)
//!   answers the `OpenAIFile` object; `purpose=batch` needs a `.jsonl` name.
//!   `GET /v1/files/{id}` answers the object, `GET /v1/files/{id}/content` the
//!   raw bytes, `DELETE /v1/files/{id}` `{"id","object":"file","deleted":true}`;
//!   an unknown id is a 404. Azure: the same under `/openai/files`.
//! - Every route passes `gate::openai::gate` first.
//! - Cut results (`batch_cut_results = N`): the first N downloads of each
//!   `batch_output` file send the first half of the bytes (never ending on a
//!   line break), then drop the connection.
//! - Results not there yet (`batch_results_404_ms`): a `batch_output` file's
//!   content answers 404 `No such File object` until its `hidden_until`
//!   (logged `results_not_found`, status 404, `batch_id` = the file id).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::gate::openai::gate;
use crate::state::openai::{Api, StoredFile, unix_now};
use crate::state::{Shared, lock};
use crate::stats::{BatchCount, BatchEvent};
use crate::wire::id_hex;

/// Upload size limit (OpenAI's per-file maximum).
pub(crate) const MAX_UPLOAD: usize = 512 * 1024 * 1024;

/// `POST /v1/files`, `POST /openai/files`
pub(crate) async fn upload(
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
    let bad = |msg: &str, param: Option<&str>| g.error(StatusCode::BAD_REQUEST, msg, param, None);
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let parts = match multipart(content_type, &body) {
        Ok(p) => p,
        Err(msg) => return bad(&msg, None),
    };
    let field = |name: &str| parts.iter().find(|p| p.name == name);
    let Some(purpose) = field("purpose") else {
        return bad("Missing required parameter: 'purpose'.", Some("purpose"));
    };
    let purpose = String::from_utf8_lossy(&body[purpose.data.clone()])
        .trim()
        .to_string();
    const PURPOSES: [&str; 5] = ["assistants", "batch", "fine-tune", "vision", "user_data"];
    if !PURPOSES.contains(&purpose.as_str()) {
        let msg = format!("'{purpose}' is not one of {PURPOSES:?} - 'purpose'");
        return bad(&msg, Some("purpose"));
    }
    let Some(file) = field("file") else {
        return bad("Missing required parameter: 'file'.", Some("file"));
    };
    let filename = file.filename.clone().unwrap_or_default();
    if filename.is_empty() {
        return bad("The 'file' part needs a filename.", Some("file"));
    }
    if purpose == "batch" && !filename.ends_with(".jsonl") {
        return bad(
            "Invalid file format for Batch API. Must be .jsonl",
            Some("file"),
        );
    }
    let bytes = body.slice(file.data.clone());
    let stored = StoredFile {
        api: g.api,
        id: new_file_id(&shared),
        filename,
        purpose,
        created_at: unix_now(),
        bytes,
        downloads: 0,
        hidden_until: None,
    };
    let resp = g.ok(&stored.object());
    shared.stats.count(BatchCount::FileUploaded);
    let route = if g.api == Api::Azure {
        "/openai/files"
    } else {
        "/v1/files"
    };
    let event = BatchEvent {
        provider: g.api.provider(),
        route,
        batch_id: &stored.id,
        client_request_id: headers
            .get("x-client-request-id")
            .and_then(|v| v.to_str().ok()),
        model: "",
        status: 200,
        outcome: "file_uploaded",
    };
    shared.stats.event(&event, g.live.config.log_capacity);
    lock(&shared.store).files.insert(stored.id.clone(), stored);
    resp
}

pub(crate) fn new_file_id(shared: &Shared) -> String {
    let hex = id_hex(shared.ids.fetch_add(1, Relaxed), shared.salt);
    format!("file-{}", &hex[..24])
}

/// `GET /v1/files/{id}`, `GET /openai/files/{id}`
pub(crate) async fn get(
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
    let store = lock(&shared.store);
    match store.file(g.api, &id) {
        Some(f) => g.ok(&f.object()),
        None => g.not_found("File", &id),
    }
}

/// `DELETE /v1/files/{id}`, `DELETE /openai/files/{id}`
pub(crate) async fn delete(
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
    if store.file(g.api, &id).is_none() {
        return g.not_found("File", &id);
    }
    let gone = store.files.remove(&id);
    drop(store);
    if let Some(f) = gone {
        lock(&shared.deleted_files).insert(id.clone(), f.bytes);
    }
    shared.stats.count(crate::stats::BatchCount::FileDeleted);
    g.ok(&json!({"id": id, "object": "file", "deleted": true}))
}

/// `GET /v1/files/{id}/content`, `GET /openai/files/{id}/content`: the raw bytes.
pub(crate) async fn content(
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
    let (bytes, cut) = {
        let mut store = lock(&shared.store);
        let Some(f) = store.files.get_mut(&id).filter(|f| f.api == g.api) else {
            return g.not_found("File", &id);
        };
        if f.hidden_until
            .is_some_and(|t| std::time::Instant::now() < t)
        {
            drop(store);
            let event = BatchEvent {
                provider: g.api.provider(),
                route: if g.api == Api::Azure {
                    "/openai/files/{file_id}/content"
                } else {
                    "/v1/files/{file_id}/content"
                },
                batch_id: &id,
                client_request_id: None,
                model: "",
                status: 404,
                outcome: "results_not_found",
            };
            shared.stats.event(&event, g.live.config.log_capacity);
            return g.not_found("File", &id);
        }
        let cut = f.purpose == "batch_output" && f.downloads < g.live.config.batch_cut_results;
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
        header::HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(header::CONTENT_LENGTH, header::HeaderValue::from(len));
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
                // After the error the stream is over; hyper aborts the connection.
                Some((Err(err), None))
            }
        }
    })
}

/// One field of a multipart body (`data` is a range of the body).
#[derive(Debug)]
struct Part {
    name: String,
    filename: Option<String>,
    data: std::ops::Range<usize>,
}

/// Parse multipart/form-data (RFC 7578), enough for `file` and `purpose`.
fn multipart(content_type: &str, body: &[u8]) -> Result<Vec<Part>, String> {
    let (mime, params) = content_type.split_once(';').unwrap_or((content_type, ""));
    if !mime.trim().eq_ignore_ascii_case("multipart/form-data") {
        return Err(format!(
            "Invalid Content-Type header ({content_type}), expected multipart/form-data."
        ));
    }
    let boundary = params
        .split(';')
        .filter_map(|p| p.trim().split_once('='))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("boundary"))
        .map(|(_, v)| v.trim().trim_matches('"').to_string())
        .filter(|b| !b.is_empty())
        .ok_or("multipart/form-data without a boundary")?;
    let delim = format!("--{boundary}");
    let next_delim = format!("\r\n--{boundary}");
    let malformed = || "Malformed multipart body.".to_string();
    let mut pos = find(body, delim.as_bytes(), 0).ok_or_else(malformed)? + delim.len();
    let mut parts = Vec::new();
    loop {
        if body[pos..].starts_with(b"--") {
            return Ok(parts);
        }
        pos += if body[pos..].starts_with(b"\r\n") {
            2
        } else {
            return Err(malformed());
        };
        let head_end = find(body, b"\r\n\r\n", pos).ok_or_else(malformed)?;
        let head = String::from_utf8_lossy(&body[pos..head_end]);
        let data_start = head_end + 4;
        let data_end = find(body, next_delim.as_bytes(), data_start).ok_or_else(malformed)?;
        let disposition = head
            .split("\r\n")
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-disposition"))
            .map(|(_, v)| v.to_string())
            .unwrap_or_default();
        let param = |key: &str| {
            disposition
                .split(';')
                .filter_map(|p| p.trim().split_once('='))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case(key))
                .map(|(_, v)| v.trim().trim_matches('"').to_string())
        };
        parts.push(Part {
            name: param("name").unwrap_or_default(),
            filename: param("filename"),
            data: data_start..data_end,
        });
        pos = data_end + next_delim.len();
    }
}

/// First index of `needle` in `hay` at or after `from`.
fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    let first = *needle.first()?;
    let mut i = from;
    while i + needle.len() <= hay.len() {
        let off = hay[i..=hay.len() - needle.len()]
            .iter()
            .position(|&b| b == first)?;
        i += off;
        if &hay[i..i + needle.len()] == needle {
            return Some(i);
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fields_and_files() {
        let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--XyZ\r\ncontent-disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\nContent-Type: application/jsonl\r\n\r\n{\"a\":1}\n{\"b\":2}\n\r\n--XyZ--\r\n";
        let parts = multipart("multipart/form-data; boundary=\"XyZ\"", body).expect("parse");
        assert_eq!(parts.len(), 2);
        assert_eq!(
            (parts[0].name.as_str(), &body[parts[0].data.clone()]),
            ("purpose", &b"batch"[..])
        );
        assert_eq!(parts[1].filename.as_deref(), Some("in.jsonl"));
        assert_eq!(&body[parts[1].data.clone()], b"{\"a\":1}\n{\"b\":2}\n");
        assert!(multipart("application/json", body).is_err());
        assert!(multipart("multipart/form-data; boundary=XyZ", b"--XyZ\r\nbroken").is_err());
        assert_eq!(find(b"abcabd", b"abd", 0), Some(3));
        assert_eq!(find(b"ab", b"abd", 0), None);
    }
}
