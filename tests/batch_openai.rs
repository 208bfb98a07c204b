//! The OpenAI / Azure Batch API adapter over real loopback HTTP against a
//! small axum fake defined here: it records every request and serves a
//! scripted lifecycle, results files (shuffled, with an unknown and a
//! duplicate line, or cut mid-line), cancel answers and batch lists.
//!
//! Every adapter gets a canary key, and the fake echoes it in its error
//! messages: no error's Display may show it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use docket::provider::batch::openai::{OpenAiBatch, PollCadence};
use docket::provider::batch::{
    BatchLimits, BatchLine, BatchProvider, BatchState, BatchStatus, Found, LineOutcome, ResultLine,
    ResultsSummary, SubmitSpec,
};
use docket::provider::{ApiKey, ChatProvider, ChatRequest, ErrorClass, OpenAiChat};
use serde_json::{Value, json};

const CANARY: &str = "canary-BATCH-KEY-5d1e77";

#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    query: Option<String>,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

impl Seen {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

#[derive(Clone)]
struct Reply {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: String,
}

fn reply(status: u16, body: Value) -> Reply {
    Reply {
        status,
        headers: vec![("content-type", "application/json".into())],
        body: body.to_string(),
    }
}

enum FileBody {
    /// Served whole, with a Content-Length.
    Whole(String),
    /// Served chunked; the connection is broken after these bytes.
    CutAfter(String),
}

#[derive(Default)]
struct Fake {
    seen: Vec<Seen>,
    /// Scripted answers to `GET /batches/{id}`: popped in order, the last one repeats.
    polls: HashMap<String, VecDeque<Reply>>,
    cancels: HashMap<String, Reply>,
    files: HashMap<String, FileBody>,
    /// `GET /batches`, newest first, served `page` at a time.
    list: Vec<Value>,
    page: usize,
    uploads: usize,
}

type Shared = Arc<Mutex<Fake>>;

fn batch_obj(
    id: &str,
    status: &str,
    files: (Option<&str>, Option<&str>),
    counts: (u64, u64, u64),
    metadata: Value,
    created_at: u64,
) -> Value {
    json!({
        "id": id, "object": "batch", "endpoint": "/v1/chat/completions", "model": "gpt-4o-mini-2024-07-18",
        "errors": null, "input_file_id": "file-up-1", "completion_window": "24h", "status": status,
        "output_file_id": files.0, "error_file_id": files.1, "created_at": created_at,
        "in_progress_at": null, "expires_at": created_at + 86400, "finalizing_at": null, "completed_at": null,
        "failed_at": null, "expired_at": null, "cancelling_at": null, "cancelled_at": null,
        "request_counts": {"total": counts.0, "completed": counts.1, "failed": counts.2},
        "metadata": metadata,
    })
}

fn completion(content: &str) -> Value {
    json!({"id": "chatcmpl-x", "object": "chat.completion", "created": 1711652795, "model": "gpt-4o-mini-2024-07-18",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content, "refusal": null},
                     "logprobs": null, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25}})
}

fn ok_line(custom_id: &str, content: &str) -> String {
    json!({"id": format!("batch_req_{custom_id}"), "custom_id": custom_id,
           "response": {"status_code": 200, "request_id": format!("req_{custom_id}"), "body": completion(content)},
           "error": null})
    .to_string()
}

fn http_error_line(custom_id: &str) -> String {
    json!({"id": "batch_req_e", "custom_id": custom_id,
           "response": {"status_code": 400, "request_id": "req_e",
                        "body": {"error": {"message": format!("maximum context length (key {CANARY})"),
                                           "type": "invalid_request_error", "param": null,
                                           "code": "context_length_exceeded"}}},
           "error": null})
    .to_string()
}

fn expired_line(custom_id: &str) -> String {
    json!({"id": "batch_req_x", "custom_id": custom_id, "response": null,
           "error": {"code": "batch_expired",
                     "message": "This request could not be executed before the completion window expired."}})
    .to_string()
}

async fn handle(
    State(fake): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_string();
    let norm = path
        .strip_prefix("/v1")
        .or_else(|| path.strip_prefix("/openai"))
        .unwrap_or(&path)
        .to_string();
    let query = uri.query().map(str::to_string);
    let mut f = fake.lock().unwrap();
    f.seen.push(Seen {
        method: method.to_string(),
        path: path.clone(),
        query: query.clone(),
        headers: headers
            .iter()
            .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
            .collect(),
        body: body.to_vec(),
    });
    let parts: Vec<&str> = norm.trim_matches('/').split('/').collect();
    let r = match (method.as_str(), parts.as_slice()) {
        ("POST", ["chat", "completions"]) => reply(200, completion("sync")),
        ("POST", ["files"]) => {
            f.uploads += 1;
            reply(
                200,
                json!({"id": format!("file-up-{}", f.uploads), "object": "file", "bytes": body.len(),
                       "created_at": 1711471533, "expires_at": 1714063533, "filename": "batchinput.jsonl",
                       "purpose": "batch", "status": "processed"}),
            )
        }
        ("POST", ["batches"]) => {
            let sent: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            reply(
                200,
                batch_obj(
                    "batch_new",
                    "validating",
                    (None, None),
                    (0, 0, 0),
                    sent["metadata"].clone(),
                    1711471533,
                ),
            )
        }
        ("GET", ["batches"]) => {
            let after = query.as_deref().and_then(|q| {
                q.split('&')
                    .find_map(|kv| kv.strip_prefix("after="))
                    .map(str::to_string)
            });
            let start = match after {
                Some(a) => f.list.iter().position(|b| b["id"] == a.as_str()).unwrap() + 1,
                None => 0,
            };
            let page = f.page.max(1);
            let data: Vec<Value> = f.list.iter().skip(start).take(page).cloned().collect();
            let has_more = start + data.len() < f.list.len();
            reply(
                200,
                json!({"object": "list", "first_id": data.first().map(|b| b["id"].clone()),
                       "last_id": data.last().map(|b| b["id"].clone()), "has_more": has_more, "data": data}),
            )
        }
        ("GET", ["batches", id]) => match f.polls.get_mut(*id) {
            Some(q) if q.len() > 1 => q.pop_front().unwrap(),
            Some(q) if !q.is_empty() => q[0].clone(),
            _ => not_found(),
        },
        ("POST", ["batches", id, "cancel"]) => {
            f.cancels.get(*id).cloned().unwrap_or_else(not_found)
        }
        ("GET", ["files", id, "content"]) => match f.files.get(*id) {
            Some(FileBody::Whole(text)) => Reply {
                status: 200,
                headers: vec![("content-type", "application/octet-stream".into())],
                body: text.clone(),
            },
            Some(FileBody::CutAfter(text)) => {
                let first = Bytes::from(text.clone());
                let stream = futures::stream::iter(vec![Ok::<_, std::io::Error>(first)]).chain(
                    futures::stream::once(async {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Err(std::io::Error::other("connection cut by the fake"))
                    }),
                );
                return Response::new(Body::from_stream(stream));
            }
            None => not_found(),
        },
        _ => not_found(),
    };
    drop(f);
    let mut response = (StatusCode::from_u16(r.status).unwrap(), r.body).into_response();
    for (k, v) in &r.headers {
        response.headers_mut().insert(*k, v.parse().unwrap());
    }
    response
}

use futures::StreamExt;

fn not_found() -> Reply {
    reply(
        404,
        json!({"error": {"message": format!("No such object (key {CANARY})"), "type": "invalid_request_error",
                         "param": null, "code": null}}),
    )
}

struct Server {
    addr: String,
    fake: Shared,
}

impl Server {
    async fn start() -> Self {
        let fake: Shared = Arc::new(Mutex::new(Fake::default()));
        let app = Router::new().fallback(handle).with_state(fake.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            axum::serve(listener, app).await.ok();
        });
        Self {
            addr: format!("http://{addr}"),
            fake,
        }
    }

    fn openai(&self) -> OpenAiBatch {
        OpenAiBatch::openai(
            "openai",
            &format!("{}/v1", self.addr),
            Some(ApiKey::new(CANARY)),
        )
        .unwrap()
        .with_cadence(PollCadence::fast())
    }

    fn azure(&self) -> OpenAiBatch {
        OpenAiBatch::azure(&self.addr, "2024-10-21", ApiKey::new(CANARY))
            .unwrap()
            .with_cadence(PollCadence::fast())
    }

    fn with<T>(&self, f: impl FnOnce(&mut Fake) -> T) -> T {
        f(&mut self.fake.lock().unwrap())
    }

    fn seen(&self) -> Vec<Seen> {
        self.with(|f| f.seen.clone())
    }

    fn script(&self, id: &str, replies: Vec<Reply>) {
        self.with(|f| f.polls.insert(id.into(), replies.into()));
    }
}

fn request(id: &str, model: &str) -> ChatRequest {
    ChatRequest {
        model: model.into(),
        system: Some("You are an adjudicator.".into()),
        user: format!("Is {id} the same as B?"),
        max_tokens: 300,
        temperature: Some(0.0),
        response_schema: Some(std::sync::Arc::new((
            "verdict".into(),
            json!({"type":"object","properties":{"same":{"type":"boolean"}},"required":["same"],"additionalProperties":false}),
        ))),
        structured_output: Default::default(),
        thinking_budget: None,
        client_request_id: id.into(),
        timeout: Duration::from_secs(10),
        body: None,
    }
}

fn lines(n: usize, model: &str) -> Vec<BatchLine> {
    (0..n)
        .map(|i| {
            let id = format!("item-{i}");
            BatchLine {
                request: request(&id, model),
                custom_id: id,
            }
        })
        .collect()
}

fn no_canary(e: &impl std::fmt::Display) {
    let s = e.to_string();
    assert!(!s.contains(CANARY), "key in an error: {s}");
}

/// The file part of a multipart body, and the text of the `purpose` field.
fn multipart(seen: &Seen) -> (String, String, String) {
    let ct = &seen.headers["content-type"];
    let boundary = ct.split("boundary=").nth(1).unwrap().trim_matches('"');
    let body = String::from_utf8(seen.body.clone()).unwrap();
    let mut purpose = String::new();
    let mut file = String::new();
    let mut file_head = String::new();
    for part in body.split(&format!("--{boundary}")) {
        let Some((head, content)) = part.split_once("\r\n\r\n") else {
            continue;
        };
        let content = content.strip_suffix("\r\n").unwrap_or(content);
        if head.contains("name=\"purpose\"") {
            purpose = content.to_string();
        } else if head.contains("name=\"file\"") {
            file_head = head.to_string();
            file = content.to_string();
        }
    }
    (purpose, file_head, file)
}

async fn poll_until_ready(p: &OpenAiBatch, id: &str) -> (BatchStatus, Vec<(BatchState, bool)>) {
    let mut states = Vec::new();
    for _ in 0..50 {
        let s = p.poll(id).await.unwrap();
        states.push((s.state.clone(), s.results_pending));
        if s.state.is_terminal() && !s.results_pending {
            return (s, states);
        }
        tokio::time::sleep(p.poll_after(&s.state, Duration::ZERO)).await;
    }
    panic!("never ready: {states:?}");
}

async fn collect(
    p: &OpenAiBatch,
    status: &BatchStatus,
    expected: &[&str],
) -> (Vec<ResultLine>, ResultsSummary) {
    let expected: HashSet<String> = expected.iter().map(|s| s.to_string()).collect();
    let mut got = Vec::new();
    let mut sink = |l: ResultLine| got.push(l);
    let summary = p.results(status, &expected, &mut sink).await.unwrap();
    (got, summary)
}

#[tokio::test]
async fn openai_lifecycle_upload_create_poll_and_results() {
    let server = Server::start().await;
    let p = server.openai();
    let batch = lines(4, "gpt-4o-mini");

    // The synchronous adapter's body for each request, for comparison.
    let chat = OpenAiChat::new(
        "openai",
        &format!("{}/v1", server.addr),
        Some(ApiKey::new(CANARY)),
    )
    .unwrap();
    for l in &batch {
        chat.send(&l.request).await.unwrap();
    }
    let sync_bodies: Vec<Value> = server.seen().iter().map(Seen::json).collect();
    server.with(|f| f.seen.clear());

    let submitted = p
        .submit(SubmitSpec {
            tag: "b-7",
            model: "gpt-4o-mini",
            lines: &batch,
        })
        .await
        .unwrap();
    assert_eq!(submitted.provider_batch_id, "batch_new");
    assert_eq!(submitted.input_file_id.as_deref(), Some("file-up-1"));

    let seen = server.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    let upload = &seen[0];
    assert_eq!(
        (upload.method.as_str(), upload.path.as_str()),
        ("POST", "/v1/files")
    );
    assert_eq!(upload.headers["authorization"], format!("Bearer {CANARY}"));
    assert!(upload.headers["content-type"].starts_with("multipart/form-data"));
    assert_eq!(
        upload.headers["content-length"],
        upload.body.len().to_string(),
        "the upload declares its length"
    );
    let (purpose, file_head, file) = multipart(upload);
    assert_eq!(purpose, "batch");
    assert!(
        file_head.contains("filename=\"batch-b-7.jsonl\""),
        "{file_head}"
    );
    assert!(file.ends_with('\n'));
    let jsonl: Vec<Value> = file
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(jsonl.len(), 4, "one line per request");
    for (i, line) in jsonl.iter().enumerate() {
        assert_eq!(line["custom_id"], format!("item-{i}"));
        assert_eq!(line["method"], "POST");
        assert_eq!(line["url"], "/v1/chat/completions");
        assert_eq!(line["body"], sync_bodies[i], "line {i} is the sync body");
    }
    let create = &seen[1];
    assert_eq!(
        (create.method.as_str(), create.path.as_str()),
        ("POST", "/v1/batches")
    );
    assert_eq!(
        create.json(),
        json!({"input_file_id": "file-up-1", "endpoint": "/v1/chat/completions", "completion_window": "24h",
               "metadata": {"docket_tag": "b-7", "docket_requests": "4"}})
    );

    // validating -> in_progress -> completed without files (late) -> completed with them.
    let meta = json!({"docket_tag": "b-7", "docket_requests": "4"});
    let at = |status: &str, files: (Option<&str>, Option<&str>), counts| {
        reply(
            200,
            batch_obj("batch_new", status, files, counts, meta.clone(), 1711471533),
        )
    };
    server.script(
        "batch_new",
        vec![
            at("validating", (None, None), (4, 0, 0)),
            at("in_progress", (None, None), (4, 2, 0)),
            at("completed", (None, None), (4, 2, 2)),
            at("completed", (Some("file-out"), Some("file-err")), (4, 2, 2)),
        ],
    );
    let output = [
        ok_line("item-2", "{\"same\":true}"),
        ok_line("item-99", "{\"same\":true}"),
        ok_line("item-0", "{\"same\":false}"),
        ok_line("item-2", "{\"same\":false}"),
    ]
    .join("\n")
        + "\n";
    let errors = [http_error_line("item-3"), expired_line("item-1")].join("\n") + "\n";
    server.with(|f| {
        f.files.insert("file-out".into(), FileBody::Whole(output));
        f.files.insert("file-err".into(), FileBody::Whole(errors));
    });
    let (status, states) = poll_until_ready(&p, "batch_new").await;
    assert_eq!(
        states,
        vec![
            (BatchState::Validating, false),
            (BatchState::InProgress, false),
            (BatchState::Completed, true),
            (BatchState::Completed, false),
        ]
    );
    assert_eq!(status.output_ref.as_deref(), Some("file-out"));
    assert_eq!(status.error_ref.as_deref(), Some("file-err"));

    let (got, summary) = collect(&p, &status, &["item-0", "item-1", "item-2", "item-3"]).await;
    assert!(!summary.cut);
    assert_eq!(summary.lines, 6);
    assert_eq!(summary.delivered, 4);
    let q: Vec<(u64, Option<&str>)> = summary
        .quarantined
        .iter()
        .map(|q| (q.line, q.custom_id.as_deref()))
        .collect();
    assert_eq!(q, vec![(2, Some("item-99")), (4, Some("item-2"))]);
    let by_id: HashMap<&str, &LineOutcome> = got
        .iter()
        .map(|l| (l.custom_id.as_str(), &l.outcome))
        .collect();
    match by_id["item-2"] {
        LineOutcome::Answer(a) => {
            assert_eq!(
                a.content.as_deref(),
                Some("{\"same\":true}"),
                "the first line stands"
            )
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(by_id["item-0"], LineOutcome::Answer(_)));
    match by_id["item-3"] {
        LineOutcome::Error(e) => {
            assert_eq!(e.class, ErrorClass::Request);
            assert!(e.message.contains("context_length_exceeded"));
            no_canary(e);
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(by_id["item-1"], LineOutcome::NotRun(_)));
    let fetched: Vec<String> = server
        .seen()
        .iter()
        .filter(|s| s.path.starts_with("/v1/files/"))
        .map(|s| s.path.clone())
        .collect();
    assert_eq!(
        fetched,
        vec!["/v1/files/file-out/content", "/v1/files/file-err/content"]
    );
}

#[tokio::test]
async fn a_results_stream_cut_mid_line_keeps_what_came_before() {
    let server = Server::start().await;
    let p = server.openai();
    let whole = format!("{}\n{}\n", ok_line("item-0", "{}"), ok_line("item-1", "{}"));
    let partial = &ok_line("item-2", "{}")[..40];
    server.with(|f| {
        f.files.insert(
            "file-cut".into(),
            FileBody::CutAfter(format!("{whole}{partial}")),
        );
        // Ends cleanly, but mid-line.
        f.files.insert(
            "file-short".into(),
            FileBody::Whole(format!("{whole}{partial}")),
        );
        // Ends cleanly on a whole line that has no newline: not a cut.
        f.files.insert(
            "file-no-newline".into(),
            FileBody::Whole(format!("{whole}{}", ok_line("item-2", "{}"))),
        );
        f.files.insert(
            "file-err".into(),
            FileBody::Whole(expired_line("item-3") + "\n"),
        );
    });
    let expected = ["item-0", "item-1", "item-2", "item-3"];
    let status = |out: &str| BatchStatus {
        provider_batch_id: "batch_c".into(),
        state: BatchState::Completed,
        counts: Default::default(),
        output_ref: Some(out.into()),
        error_ref: Some("file-err".into()),
        results_pending: false,
    };
    for file in ["file-cut", "file-short"] {
        let (got, summary) = collect(&p, &status(file), &expected).await;
        assert!(summary.cut, "{file}");
        let ids: Vec<&str> = got.iter().map(|l| l.custom_id.as_str()).collect();
        assert_eq!(ids, vec!["item-0", "item-1"], "{file}");
        assert_eq!(summary.delivered, 2);
        assert!(summary.quarantined.is_empty());
    }
    let (got, summary) = collect(&p, &status("file-no-newline"), &expected).await;
    assert!(!summary.cut);
    assert_eq!(got.len(), 4);
    // The error file was not fetched after a cut output file.
    let err_fetches = server
        .seen()
        .iter()
        .filter(|s| s.path.contains("file-err"))
        .count();
    assert_eq!(err_fetches, 1);
}

#[tokio::test]
async fn requests_with_no_result_line_are_accounted_for() {
    let server = Server::start().await;
    let p = server.openai();
    // A line past the 16 MiB cap between two good ones: quarantined, skipped.
    let huge = format!(
        "{{\"custom_id\":\"item-1\",\"pad\":\"{}\"}}",
        "x".repeat(16 << 20)
    );
    server.with(|f| {
        f.files.insert(
            "file-some".into(),
            FileBody::Whole(format!(
                "{}\n{huge}\n{}\n",
                ok_line("item-0", "{}"),
                ok_line("item-2", "{}")
            )),
        );
    });
    let expected = ["item-0", "item-1", "item-2", "item-3"];
    let status = |state: BatchState| BatchStatus {
        provider_batch_id: "batch_m".into(),
        state,
        counts: Default::default(),
        output_ref: Some("file-some".into()),
        error_ref: None,
        results_pending: false,
    };
    // Cancelled: OpenAI writes no line for what never ran.
    let (got, summary) = collect(&p, &status(BatchState::Cancelled), &expected).await;
    let ids: Vec<&str> = got.iter().map(|l| l.custom_id.as_str()).collect();
    assert_eq!(ids, vec!["item-0", "item-2", "item-1", "item-3"]);
    assert!(matches!(got[2].outcome, LineOutcome::NotRun(_)));
    assert!(matches!(got[3].outcome, LineOutcome::NotRun(_)));
    assert_eq!((summary.delivered, summary.lines), (4, 3));
    assert!(summary.missing.is_empty());
    assert_eq!(summary.quarantined.len(), 1);
    assert_eq!(summary.quarantined[0].line, 2);
    assert!(
        summary.quarantined[0]
            .reason
            .contains("over the 16777216 bytes"),
        "{}",
        summary.quarantined[0].reason
    );
    // Completed: the provider said nothing about them; the caller decides.
    let (got, summary) = collect(&p, &status(BatchState::Completed), &expected).await;
    assert_eq!(got.len(), 2);
    assert_eq!(summary.missing, vec!["item-1", "item-3"]);
}

#[tokio::test]
async fn cancel_is_idempotent() {
    let server = Server::start().await;
    let p = server.openai();
    let meta = json!({});
    server.with(|f| {
        f.cancels.insert(
            "batch_run".into(),
            reply(
                200,
                batch_obj(
                    "batch_run",
                    "cancelling",
                    (None, None),
                    (10, 3, 0),
                    meta.clone(),
                    1,
                ),
            ),
        );
        f.cancels.insert(
            "batch_done".into(),
            reply(
                400,
                json!({"error": {"message": "Cannot cancel a batch with status 'completed'.",
                                 "type": "invalid_request_error", "param": null, "code": null}}),
            ),
        );
    });
    server.script(
        "batch_done",
        vec![reply(
            200,
            batch_obj(
                "batch_done",
                "completed",
                (Some("file-o"), None),
                (10, 10, 0),
                meta,
                1,
            ),
        )],
    );
    for _ in 0..2 {
        let s = p.cancel("batch_run").await.unwrap();
        assert_eq!(s.state, BatchState::Cancelling);
    }
    let s = p.cancel("batch_done").await.unwrap();
    assert_eq!(s.state, BatchState::Completed);
    assert_eq!(s.output_ref.as_deref(), Some("file-o"));
    let e = p.cancel("batch_missing").await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Request);
    assert_eq!(e.http_status, Some(404));
    no_canary(&e);
    let seen = server.seen();
    assert_eq!(seen[0].method, "POST");
    assert_eq!(seen[0].path, "/v1/batches/batch_run/cancel");
}

#[tokio::test]
async fn find_tells_none_one_and_ambiguous_apart() {
    let server = Server::start().await;
    let p = server.openai();
    let m = |tag: &str, n: &str| json!({"docket_tag": tag, "docket_requests": n});
    server.with(|f| {
        f.page = 2;
        // Newest first, as the API lists them.
        f.list = vec![
            batch_obj(
                "b9",
                "in_progress",
                (None, None),
                (5, 0, 0),
                m("t-two", "5"),
                1900,
            ),
            batch_obj(
                "b8",
                "validating",
                (None, None),
                (5, 0, 0),
                json!(null),
                1800,
            ),
            batch_obj(
                "b7",
                "completed",
                (None, None),
                (5, 5, 0),
                m("t-one", "5"),
                1700,
            ),
            batch_obj(
                "b6",
                "validating",
                (None, None),
                (5, 0, 0),
                m("t-two", "5"),
                1600,
            ),
            // Five seconds before `created_after` by the provider's clock:
            // a local clock running fast must not hide it.
            batch_obj(
                "b5",
                "completed",
                (None, None),
                (5, 5, 0),
                m("t-skew", "5"),
                995,
            ),
            // Before the window (`created_after` less the 600 s clock
            // margin): never looked at, and the listing stops here.
            batch_obj(
                "b4",
                "completed",
                (None, None),
                (5, 5, 0),
                m("t-old", "5"),
                300,
            ),
            batch_obj(
                "b3",
                "completed",
                (None, None),
                (5, 5, 0),
                m("t-old", "5"),
                200,
            ),
            batch_obj(
                "b2",
                "completed",
                (None, None),
                (5, 5, 0),
                m("t-old", "5"),
                100,
            ),
        ];
    });
    assert_eq!(p.find("t-none", 1000.0, 5).await.unwrap(), Found::None);
    let lists = |s: &Server| {
        s.seen()
            .iter()
            .filter(|r| r.path == "/v1/batches" && r.method == "GET")
            .count()
    };
    assert_eq!(lists(&server), 3, "three pages, stopping at the window");
    let q = server.seen()[1].query.clone().unwrap();
    assert_eq!(q, "limit=100&after=b8");
    assert_eq!(
        p.find("t-one", 1000.0, 5).await.unwrap(),
        Found::One("b7".into())
    );
    assert_eq!(
        p.find("t-two", 1000.0, 5).await.unwrap(),
        Found::Ambiguous(vec!["b9".into(), "b6".into()])
    );
    assert_eq!(p.find("t-old", 1000.0, 5).await.unwrap(), Found::None);
    assert_eq!(
        p.find("t-skew", 1000.0, 5).await.unwrap(),
        Found::One("b5".into()),
        "a provider timestamp a few seconds before created_after is still found"
    );
    assert_eq!(
        p.find("t-one", 1000.0, 6).await.unwrap(),
        Found::Ambiguous(vec!["b7".into()]),
        "our tag with another count is never taken as safe"
    );
}

#[tokio::test]
async fn azure_find_takes_a_batch_without_metadata_as_possibly_ours() {
    let server = Server::start().await;
    server.with(|f| {
        f.list = vec![
            batch_obj(
                "az3",
                "completed",
                (None, None),
                (5, 5, 0),
                json!({"docket_tag": "other", "docket_requests": "5"}),
                1900,
            ),
            // An api-version that drops metadata: this one could be ours.
            batch_obj(
                "az2",
                "in_progress",
                (None, None),
                (5, 0, 0),
                json!(null),
                1800,
            ),
            // Without metadata, but before the window: not a candidate.
            batch_obj(
                "az1",
                "completed",
                (None, None),
                (5, 5, 0),
                json!(null),
                100,
            ),
        ];
    });
    assert_eq!(
        server.azure().find("az-lost", 1000.0, 5).await.unwrap(),
        Found::Ambiguous(vec!["az2".into()]),
        "never None while a batch without metadata could be ours"
    );
    // OpenAI always keeps metadata: a batch without it is someone else's.
    assert_eq!(
        server.openai().find("az-lost", 1000.0, 5).await.unwrap(),
        Found::None
    );
    // Beside our own tagged batch, metadata is evidently kept.
    server.with(|f| {
        f.list.insert(
            0,
            batch_obj(
                "az4",
                "validating",
                (None, None),
                (5, 0, 0),
                json!({"docket_tag": "az-lost", "docket_requests": "5"}),
                1950,
            ),
        )
    });
    assert_eq!(
        server.azure().find("az-lost", 1000.0, 5).await.unwrap(),
        Found::One("az4".into())
    );
}

#[tokio::test]
async fn errors_on_polls_are_classified_and_keyless() {
    let server = Server::start().await;
    let p = server.openai();
    let mut limited = reply(
        429,
        json!({"error": {"message": format!("Rate limit reached for batches (key {CANARY})"),
                         "type": "requests", "param": null, "code": "rate_limit_exceeded"}}),
    );
    limited.headers.push(("retry-after", "7".into()));
    server.script("batch_rl", vec![limited]);
    let e = p.poll("batch_rl").await.unwrap_err();
    assert_eq!(e.class, ErrorClass::RateLimited);
    assert_eq!(e.headers.retry_after, Some(Duration::from_secs(7)));
    no_canary(&e);
    assert!(!format!("{e:?}").contains(CANARY));

    server.script(
        "batch_auth",
        vec![reply(
            401,
            json!({"error": {"message": format!("Incorrect API key provided: {CANARY}."),
                             "type": "invalid_request_error", "param": null, "code": "invalid_api_key"}}),
        )],
    );
    let e = p.poll("batch_auth").await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Auth);
    no_canary(&e);
    server.script(
        "batch_5xx",
        vec![reply(500, json!({"error": {"message": "boom", "type": "server_error", "param": null, "code": null}}))],
    );
    assert_eq!(
        p.poll("batch_5xx").await.unwrap_err().class,
        ErrorClass::Transient
    );
    server.script("batch_garbage", vec![reply(200, json!({"what": 1}))]);
    assert_eq!(
        p.poll("batch_garbage").await.unwrap_err().class,
        ErrorClass::Transient
    );
    // A results file that is not there: an error, nothing delivered.
    let status = BatchStatus {
        provider_batch_id: "b".into(),
        state: BatchState::Completed,
        counts: Default::default(),
        output_ref: Some("file-gone".into()),
        error_ref: None,
        results_pending: false,
    };
    let expected = HashSet::new();
    let mut sink = |_: ResultLine| panic!("nothing to deliver");
    let e = p.results(&status, &expected, &mut sink).await.unwrap_err();
    assert_eq!(e.http_status, Some(404));
    no_canary(&e);
    // Nothing listening: a transport error, classified.
    let dead =
        OpenAiBatch::openai("openai", "http://127.0.0.1:9/v1", Some(ApiKey::new(CANARY))).unwrap();
    let e = dead.poll("b").await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Transient);
    assert_eq!(e.http_status, None);
    no_canary(&e);
}

#[tokio::test]
async fn azure_paths_headers_and_api_version() {
    let server = Server::start().await;
    let p = server.azure();
    assert_eq!(p.name(), "azure");
    let batch = lines(2, "gpt-4o-mini-batch");
    let submitted = p
        .submit(SubmitSpec {
            tag: "az-1",
            model: "gpt-4o-mini-batch",
            lines: &batch,
        })
        .await
        .unwrap();
    assert_eq!(submitted.provider_batch_id, "batch_new");
    server.script(
        "batch_new",
        vec![reply(
            200,
            batch_obj(
                "batch_new",
                "completed",
                (Some("file-o"), None),
                (2, 2, 0),
                json!({}),
                1,
            ),
        )],
    );
    server.with(|f| {
        f.files.insert(
            "file-o".into(),
            FileBody::Whole(format!(
                "{}\n{}\n",
                ok_line("item-1", "a"),
                ok_line("item-0", "b")
            )),
        )
    });
    let status = p.poll("batch_new").await.unwrap();
    let (got, summary) = collect(&p, &status, &["item-0", "item-1"]).await;
    assert_eq!((got.len(), summary.cut), (2, false));
    p.cancel("batch_new").await.unwrap_err();
    p.find("az-1", 0.0, 2).await.unwrap();

    let seen = server.seen();
    let routes: Vec<(String, String, Option<String>)> = seen
        .iter()
        .map(|s| (s.method.clone(), s.path.clone(), s.query.clone()))
        .collect();
    let v = Some("api-version=2024-10-21".to_string());
    assert_eq!(
        routes,
        vec![
            ("POST".into(), "/openai/files".into(), v.clone()),
            ("POST".into(), "/openai/batches".into(), v.clone()),
            ("GET".into(), "/openai/batches/batch_new".into(), v.clone()),
            (
                "GET".into(),
                "/openai/files/file-o/content".into(),
                v.clone()
            ),
            (
                "POST".into(),
                "/openai/batches/batch_new/cancel".into(),
                v.clone()
            ),
            (
                "GET".into(),
                "/openai/batches".into(),
                Some("api-version=2024-10-21&limit=100".into())
            ),
        ]
    );
    for s in &seen {
        assert_eq!(s.headers["api-key"], CANARY, "{}", s.path);
        assert!(!s.headers.contains_key("authorization"));
        assert!(!s.query.as_deref().unwrap_or("").contains(CANARY));
    }
    let (purpose, file_head, file) = multipart(&seen[0]);
    assert_eq!(purpose, "batch");
    assert!(file_head.contains("batch-az-1.jsonl"));
    for (i, l) in file.lines().enumerate() {
        let l: Value = serde_json::from_str(l).unwrap();
        assert_eq!(l["url"], "/chat/completions");
        assert_eq!(l["body"]["model"], "gpt-4o-mini-batch", "the deployment");
        assert_eq!(l["custom_id"], format!("item-{i}"));
    }
    let create = seen[1].json();
    assert_eq!(create["endpoint"], "/chat/completions");
    assert_eq!(create["completion_window"], "24h");
    assert_eq!(create["metadata"]["docket_tag"], "az-1");
}

#[tokio::test]
async fn submit_refuses_what_the_provider_would_reject_before_sending() {
    let server = Server::start().await;
    let small = BatchLimits {
        max_requests: 2,
        max_bytes: 1_000_000,
        max_custom_id: 64,
    };
    let p = server.openai().with_limits(small);
    let three = lines(3, "m");
    let e = p
        .submit(SubmitSpec {
            tag: "t",
            model: "m",
            lines: &three,
        })
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::Request);
    assert!(e.message.contains("line 3"), "{e}");
    // The caller splits first, with the adapter's own encoding and limits.
    let chunks = p.split(&three).unwrap();
    assert_eq!(
        chunks.iter().map(|c| c.len()).collect::<Vec<_>>(),
        vec![2, 1]
    );

    let mut dup = lines(3, "m");
    dup[2].custom_id = "item-0".into();
    let e = p
        .submit(SubmitSpec {
            tag: "t",
            model: "m",
            lines: &dup,
        })
        .await
        .unwrap_err();
    assert!(
        e.message.contains("batch line 3") && e.message.contains("duplicate"),
        "{e}"
    );
    let mut bad = lines(2, "m");
    bad[1].custom_id = "no spaces".into();
    let e = p
        .submit(SubmitSpec {
            tag: "t",
            model: "m",
            lines: &bad,
        })
        .await
        .unwrap_err();
    assert!(e.message.contains("batch line 2"), "{e}");
    let mut mixed = lines(2, "m");
    mixed[1].request.model = "other".into();
    let e = p
        .submit(SubmitSpec {
            tag: "t",
            model: "m",
            lines: &mixed,
        })
        .await
        .unwrap_err();
    assert!(e.message.contains("one model per input file"), "{e}");
    let tiny = server.openai().with_limits(BatchLimits {
        max_requests: 10,
        max_bytes: 100,
        max_custom_id: 64,
    });
    let e = tiny
        .submit(SubmitSpec {
            tag: "t",
            model: "m",
            lines: &lines(1, "m"),
        })
        .await
        .unwrap_err();
    assert!(e.message.contains("over the 100 bytes"), "{e}");
    assert!(server.seen().is_empty(), "nothing was sent");
}

#[tokio::test]
async fn the_registry_builds_batch_adapters_by_kind() {
    use docket::config::ProviderConfig;
    use docket::provider::batch::build_batch;
    // Ollama has no Batch API.
    let cfg: ProviderConfig = toml::from_str("kind = \"ollama\"\nmodel = \"m\"\n").unwrap();
    assert!(build_batch("p", &cfg, None).unwrap().is_none());
    let cfg: ProviderConfig = toml::from_str("kind = \"mock\"\nmodel = \"m\"\n").unwrap();
    let server = Server::start().await;
    let b = build_batch("p", &cfg, Some(&format!("{}/v1", server.addr)))
        .unwrap()
        .unwrap();
    assert_eq!(b.name(), "mock");
    assert_eq!(b.limits().max_requests, 50_000);
    server.script(
        "b1",
        vec![reply(
            200,
            batch_obj("b1", "in_progress", (None, None), (1, 0, 0), json!({}), 1),
        )],
    );
    assert_eq!(b.poll("b1").await.unwrap().state, BatchState::InProgress);
}
