//! The mock provider's OpenAI and Azure Files + Batches APIs over real
//! loopback HTTP (raw reqwest, multipart built by hand): exact object shapes,
//! the compressed lifecycle, and every fault switch.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use docket::mock::{MockConfig, MockServer};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// Fast lifecycle; tests override what they need.
fn fast() -> MockConfig {
    MockConfig {
        batch_validating_ms: 150,
        batch_running_ms: 800,
        batch_finalizing_ms: 150,
        batch_cancelling_ms: 150,
        ..MockConfig::default()
    }
}

async fn start(config: MockConfig) -> MockServer {
    MockServer::start(config, "127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("mock server starts")
}

/// One provider's Files/Batches API on a server.
struct Api {
    root: String,
    azure: bool,
    http: reqwest::Client,
}

impl Api {
    fn openai(server: &MockServer) -> Api {
        Api::new(server, false)
    }

    fn azure(server: &MockServer) -> Api {
        Api::new(server, true)
    }

    fn new(server: &MockServer, azure: bool) -> Api {
        Api {
            root: server.base_url().trim_end_matches("/v1").to_string(),
            azure,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .expect("client"),
        }
    }

    fn url(&self, path: &str) -> String {
        if self.azure {
            let sep = if path.contains('?') { '&' } else { '?' };
            format!("{}/openai{path}{sep}api-version=2024-10-21", self.root)
        } else {
            format!("{}/v1{path}", self.root)
        }
    }

    fn endpoint(&self) -> &'static str {
        if self.azure {
            "/chat/completions"
        } else {
            "/v1/chat/completions"
        }
    }

    fn auth(&self, rb: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        if self.azure {
            rb.header("api-key", "azure-test-key")
        } else {
            rb.bearer_auth("sk-test")
        }
    }

    async fn send(&self, rb: reqwest::RequestBuilder) -> (StatusCode, Value) {
        let resp = self.auth(rb).send().await.expect("send");
        let status = resp.status();
        let text = resp.text().await.expect("body");
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, value)
    }

    async fn upload_as(&self, purpose: &str, filename: &str, data: &[u8]) -> (StatusCode, Value) {
        let b = "----docketTestBoundary7MA4YWxk";
        let mut body = format!(
            "--{b}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n{purpose}\r\n--{b}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
        )
        .into_bytes();
        body.extend_from_slice(data);
        body.extend_from_slice(format!("\r\n--{b}--\r\n").as_bytes());
        let rb = self
            .http
            .post(self.url("/files"))
            .header("content-type", format!("multipart/form-data; boundary={b}"))
            .body(body);
        self.send(rb).await
    }

    async fn upload(&self, data: &str) -> String {
        let (status, file) = self
            .upload_as("batch", "input.jsonl", data.as_bytes())
            .await;
        assert_eq!(status, StatusCode::OK, "{file}");
        file["id"].as_str().expect("file id").to_string()
    }

    async fn create(&self, file_id: &str, metadata: Value) -> (StatusCode, Value) {
        let body = json!({"input_file_id": file_id, "endpoint": self.endpoint(),
                          "completion_window": "24h", "metadata": metadata});
        self.send(self.http.post(self.url("/batches")).json(&body))
            .await
    }

    async fn submit(&self, data: &str) -> Value {
        let file = self.upload(data).await;
        let (status, batch) = self.create(&file, json!({"job": "test"})).await;
        assert_eq!(status, StatusCode::OK, "{batch}");
        batch
    }

    async fn get(&self, id: &str) -> Value {
        let (status, batch) = self
            .send(self.http.get(self.url(&format!("/batches/{id}"))))
            .await;
        assert_eq!(status, StatusCode::OK, "{batch}");
        batch
    }

    async fn cancel(&self, id: &str) -> (StatusCode, Value) {
        self.send(self.http.post(self.url(&format!("/batches/{id}/cancel"))))
            .await
    }

    async fn list(&self, query: &str) -> (StatusCode, Value) {
        self.send(self.http.get(self.url(&format!("/batches{query}"))))
            .await
    }

    /// Poll every 20 ms until `done` holds; returns every status seen, in order (deduplicated).
    async fn poll_until(&self, id: &str, done: impl Fn(&Value) -> bool) -> (Value, Vec<String>) {
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut seen: Vec<String> = Vec::new();
        loop {
            let b = self.get(id).await;
            let status = b["status"].as_str().expect("status").to_string();
            if seen.last() != Some(&status) {
                seen.push(status);
            }
            if done(&b) {
                return (b, seen);
            }
            assert!(Instant::now() < deadline, "batch {id} stuck: {b}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn finish(&self, id: &str) -> (Value, Vec<String>) {
        self.poll_until(id, |b| {
            matches!(
                b["status"].as_str(),
                Some("completed" | "failed" | "expired" | "cancelled")
            ) && (b["status"] != "completed"
                || !b["output_file_id"].is_null()
                || !b["error_file_id"].is_null())
        })
        .await
    }

    /// A 200 body as text.
    async fn raw(&self, path: &str) -> String {
        let resp = self
            .auth(self.http.get(self.url(path)))
            .send()
            .await
            .expect("send");
        assert_eq!(resp.status(), StatusCode::OK);
        resp.text().await.expect("body")
    }

    async fn content(&self, file_id: &str) -> Vec<Value> {
        let resp = self
            .auth(
                self.http
                    .get(self.url(&format!("/files/{file_id}/content"))),
            )
            .send()
            .await
            .expect("send");
        assert_eq!(resp.status(), StatusCode::OK);
        let text = resp.text().await.expect("whole body");
        assert!(text.ends_with('\n'), "JSONL ends with a newline");
        text.lines()
            .map(|l| serde_json::from_str(l).expect("JSON line"))
            .collect()
    }
}

fn line(api: &Api, id: &str, text: &str) -> String {
    let body = json!({"model": "gpt-4o-mini", "messages": [
        {"role": "system", "content": "You adjudicate record pairs."},
        {"role": "user", "content": text}]});
    json!({"custom_id": id, "method": "POST", "url": api.endpoint(), "body": body}).to_string()
}

fn jsonl(api: &Api, n: usize) -> String {
    (0..n)
        .map(|i| line(api, &format!("item-{i}"), &format!("question {i}")) + "\n")
        .collect()
}

/// The object's keys, sorted (serde_json's map does not keep the wire order).
fn keys(v: &Value) -> Vec<&str> {
    let mut k: Vec<&str> = v
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    k.sort_unstable();
    k
}

const BATCH_KEYS: [&str; 22] = [
    "id",
    "object",
    "endpoint",
    "model",
    "errors",
    "input_file_id",
    "completion_window",
    "status",
    "output_file_id",
    "error_file_id",
    "created_at",
    "in_progress_at",
    "expires_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
    "request_counts",
    "usage",
    "metadata",
];

fn counts(b: &Value) -> (u64, u64, u64) {
    let c = &b["request_counts"];
    let n = |k: &str| c[k].as_u64().expect("count");
    (n("total"), n("completed"), n("failed"))
}

fn by_custom_id(lines: &[Value]) -> HashMap<String, Value> {
    let map: HashMap<String, Value> = lines
        .iter()
        .map(|l| {
            (
                l["custom_id"].as_str().expect("custom_id").to_string(),
                l.clone(),
            )
        })
        .collect();
    assert_eq!(map.len(), lines.len(), "a custom_id appears twice");
    map
}

#[tokio::test]
async fn normal_lifecycle_end_to_end() {
    let server = start(fast()).await;
    let api = Api::openai(&server);
    let data = jsonl(&api, 20);
    let (status, file) = api.upload_as("batch", "input.jsonl", data.as_bytes()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        keys(&file),
        [
            "bytes",
            "created_at",
            "expires_at",
            "filename",
            "id",
            "object",
            "purpose",
            "status"
        ]
    );
    assert_eq!(
        (
            &file["object"],
            &file["bytes"],
            &file["filename"],
            &file["purpose"],
            &file["status"]
        ),
        (
            &json!("file"),
            &json!(data.len()),
            &json!("input.jsonl"),
            &json!("batch"),
            &json!("processed")
        )
    );
    assert!(file["id"].as_str().expect("id").starts_with("file-"));
    let file_id = file["id"].as_str().expect("id");
    let (_, meta) = api
        .send(api.http.get(api.url(&format!("/files/{file_id}"))))
        .await;
    assert_eq!(meta, file);

    let (status, created) = api
        .create(file_id, json!({"job": "adjudication-42", "b": "2"}))
        .await;
    assert_eq!(status, StatusCode::OK, "{created}");
    let mut want = BATCH_KEYS.to_vec();
    want.sort_unstable();
    assert_eq!(keys(&created), want);
    assert_eq!(created["object"], "batch");
    assert_eq!(created["status"], "validating");
    assert_eq!(created["endpoint"], "/v1/chat/completions");
    assert_eq!(created["completion_window"], "24h");
    assert_eq!(created["input_file_id"], file_id);
    assert!(created["output_file_id"].is_null() && created["error_file_id"].is_null());
    assert!(created["errors"].is_null() && created["in_progress_at"].is_null());
    assert_eq!(
        created["expires_at"].as_u64(),
        Some(created["created_at"].as_u64().expect("created_at") + 86_400)
    );
    assert_eq!(
        created["metadata"],
        json!({"job": "adjudication-42", "b": "2"})
    );
    let id = created["id"].as_str().expect("id").to_string();
    assert!(id.starts_with("batch_"));

    // Poll through every state; counts grow while in_progress.
    let mut partial = false;
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(15);
    let done = loop {
        let b = api.get(&id).await;
        let s = b["status"].as_str().expect("status").to_string();
        if seen.last() != Some(&s) {
            seen.push(s.clone());
        }
        let (total, completed, _) = counts(&b);
        if s == "in_progress" {
            assert_eq!(total, 20);
            assert!(b["output_file_id"].is_null());
            partial |= completed > 0 && completed < 20;
        }
        if s == "completed" {
            break b;
        }
        assert!(Instant::now() < deadline, "{b}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        seen,
        ["validating", "in_progress", "finalizing", "completed"]
    );
    assert!(partial, "request_counts never showed partial progress");
    assert_eq!(counts(&done), (20, 20, 0));
    assert_eq!(done["model"], "gpt-4o-mini");
    assert!(done["error_file_id"].is_null());
    for k in ["in_progress_at", "finalizing_at", "completed_at"] {
        assert!(done[k].is_u64(), "{k}");
    }
    for k in ["failed_at", "expired_at", "cancelling_at", "cancelled_at"] {
        assert!(done[k].is_null(), "{k}");
    }

    let out_id = done["output_file_id"].as_str().expect("output file");
    let (_, out_meta) = api
        .send(api.http.get(api.url(&format!("/files/{out_id}"))))
        .await;
    assert_eq!(out_meta["purpose"], "batch_output");
    let lines = api.content(out_id).await;
    assert_eq!(lines.len(), 20);
    // Wire order of the fields, checked on the raw text.
    let raw = api.raw(&format!("/files/{out_id}/content")).await;
    let first = raw.lines().next().expect("a line");
    assert!(first.starts_with(r#"{"id":"batch_req_"#), "{first}");
    let at = |k: &str| first.find(k).unwrap_or_else(|| panic!("{k} in {first}"));
    assert!(at(r#","custom_id":""#) < at(r#","response":{"status_code":200,"request_id":"req_"#));
    assert!(first.ends_with(r#"},"error":null}"#), "{first}");
    let raw = api.raw(&format!("/batches/{id}")).await;
    let at = |k: &str| raw.find(k).unwrap_or_else(|| panic!("{k} in {raw}"));
    assert!(raw.starts_with(r#"{"id":"batch_"#));
    let order: Vec<usize> = BATCH_KEYS
        .iter()
        .map(|k| at(&format!("\"{k}\":")))
        .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{raw}");
    let order: Vec<&str> = lines
        .iter()
        .map(|l| l["custom_id"].as_str().expect("id"))
        .collect();
    let input_order: Vec<String> = (0..20).map(|i| format!("item-{i}")).collect();
    assert_ne!(order, input_order, "output lines are shuffled");
    let results = by_custom_id(&lines);
    let (mut prompt, mut completion) = (0, 0);
    for (i, id) in input_order.iter().enumerate() {
        let l = &results[id];
        assert_eq!(keys(l), ["custom_id", "error", "id", "response"]);
        assert!(l["id"].as_str().expect("id").starts_with("batch_req_"));
        assert!(l["error"].is_null());
        assert_eq!(l["response"]["status_code"], 200);
        assert!(
            l["response"]["request_id"]
                .as_str()
                .expect("rid")
                .starts_with("req_")
        );
        let body = &l["response"]["body"];
        assert_eq!(body["object"], "chat.completion");
        assert_eq!(body["model"], "gpt-4o-mini");
        assert_eq!(body["choices"][0]["finish_reason"], "stop");
        prompt += body["usage"]["prompt_tokens"].as_u64().expect("usage");
        completion += body["usage"]["completion_tokens"].as_u64().expect("usage");
        // The same deterministic answer as the synchronous route.
        if i < 3 {
            let req: Value =
                serde_json::from_str(&line(&api, id, &format!("question {i}"))).expect("line");
            let (_, sync) = api
                .send(
                    api.http
                        .post(api.url("/chat/completions"))
                        .json(&req["body"]),
                )
                .await;
            assert_eq!(
                body["choices"][0]["message"]["content"],
                sync["choices"][0]["message"]["content"]
            );
        }
    }
    assert_eq!(done["usage"]["input_tokens"], prompt);
    assert_eq!(done["usage"]["output_tokens"], completion);
    assert_eq!(done["usage"]["total_tokens"], prompt + completion);

    let stats = server.stats();
    assert_eq!(
        (
            stats.files_uploaded,
            stats.batches_created,
            stats.batches_completed
        ),
        (1, 1, 1)
    );
    assert_eq!((stats.batch_lines_ok, stats.batch_lines_failed), (20, 0));
    let events: Vec<(String, u16, String)> = server
        .log()
        .into_iter()
        .filter(|e| e.batch_id.as_deref() == Some(id.as_str()))
        .map(|e| (e.outcome, e.status, e.route))
        .collect();
    let names: Vec<&str> = events.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(
        names,
        [
            "batch_created",
            "batch_in_progress",
            "batch_finalizing",
            "batch_completed"
        ]
    );
    assert_eq!((events[0].1, events[0].2.as_str()), (200, "/v1/batches"));
    assert_eq!(events[1].1, 0);

    // Delete the input file; it is gone afterwards.
    let (status, deleted) = api
        .send(api.http.delete(api.url(&format!("/files/{file_id}"))))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        deleted,
        json!({"id": file_id, "object": "file", "deleted": true})
    );
    let (status, missing) = api
        .send(api.http.get(api.url(&format!("/files/{file_id}"))))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(missing["error"]["type"], "invalid_request_error");
    server.shutdown().await;
}

#[tokio::test]
async fn invalid_input_fails_with_the_line_number() {
    let server = start(fast()).await;
    let api = Api::openai(&server);
    let good = line(&api, "a", "x");
    let dup = line(&api, "a", "y");
    let streamed = line(&api, "c", "z").replace(r#""model":"#, r#""stream":true,"model":"#);
    let data = format!("{good}\n{dup}\n{{not json\n{streamed}\n");
    let batch = api.submit(&data).await;
    let (done, seen) = api.finish(batch["id"].as_str().expect("id")).await;
    assert_eq!(seen, ["validating", "failed"]);
    assert!(done["failed_at"].is_u64() && done["in_progress_at"].is_null());
    assert_eq!(done["errors"]["object"], "list");
    let errs: Vec<(u64, &str)> = done["errors"]["data"]
        .as_array()
        .expect("errors")
        .iter()
        .map(|e| {
            assert_eq!(keys(e), ["code", "line", "message", "param"]);
            (
                e["line"].as_u64().expect("line"),
                e["code"].as_str().expect("code"),
            )
        })
        .collect();
    assert_eq!(
        errs,
        [
            (2, "duplicate_custom_id"),
            (3, "invalid_json_line"),
            (4, "invalid_value")
        ]
    );
    assert_eq!(counts(&done), (0, 0, 0));
    assert!(done["output_file_id"].is_null() && done["error_file_id"].is_null());
    assert_eq!(server.stats().batches_failed, 1);
    server.shutdown().await;
}

#[tokio::test]
async fn partial_failures_go_to_the_error_file() {
    let server = start(MockConfig {
        batch_fail_rate: 0.3,
        ..fast()
    })
    .await;
    let api = Api::openai(&server);
    // One body the chat route refuses (no messages): its line is a 400.
    let refused = json!({"custom_id": "no-messages", "method": "POST", "url": api.endpoint(),
                         "body": {"model": "gpt-4o-mini"}});
    let data = format!("{}{refused}\n", jsonl(&api, 30));
    let batch = api.submit(&data).await;
    let (done, _) = api.finish(batch["id"].as_str().expect("id")).await;
    assert_eq!(done["status"], "completed");
    let (total, completed, failed) = counts(&done);
    assert_eq!(total, 31);
    assert!(failed >= 2 && completed >= 1, "{done}");
    let out = api
        .content(done["output_file_id"].as_str().expect("out"))
        .await;
    let err = api
        .content(done["error_file_id"].as_str().expect("err"))
        .await;
    assert_eq!((out.len() as u64, err.len() as u64), (completed, failed));
    let mut all: HashSet<String> = by_custom_id(&out).into_keys().collect();
    for (id, l) in by_custom_id(&err) {
        assert!(all.insert(id.clone()), "{id} in both files");
        assert!(l["error"].is_null(), "an HTTP failure has a response");
        let code = l["response"]["status_code"].as_u64().expect("status");
        let e = &l["response"]["body"]["error"];
        assert_eq!(keys(e), ["code", "message", "param", "type"]);
        if id == "no-messages" {
            assert_eq!(
                (code, e["type"].as_str()),
                (400, Some("invalid_request_error"))
            );
        } else {
            assert_eq!((code, e["type"].as_str()), (500, Some("server_error")));
        }
    }
    assert_eq!(all.len(), 31);
    assert!(err.iter().any(|l| l["custom_id"] == "no-messages"));
    let stats = server.stats();
    assert_eq!(
        (stats.batch_lines_ok, stats.batch_lines_failed),
        (completed, failed)
    );
    server.shutdown().await;
}

#[tokio::test]
async fn expiry_keeps_finished_lines_and_expires_the_rest() {
    let server = start(MockConfig {
        batch_expire: 0.5,
        ..fast()
    })
    .await;
    let api = Api::openai(&server);
    let batch = api.submit(&jsonl(&api, 20)).await;
    let (done, seen) = api.finish(batch["id"].as_str().expect("id")).await;
    assert_eq!(seen, ["validating", "in_progress", "expired"]);
    assert!(done["expired_at"].is_u64() && done["completed_at"].is_null());
    assert_eq!(counts(&done), (20, 10, 10));
    let out = by_custom_id(
        &api.content(done["output_file_id"].as_str().expect("out"))
            .await,
    );
    let err = by_custom_id(
        &api.content(done["error_file_id"].as_str().expect("err"))
            .await,
    );
    assert_eq!((out.len(), err.len()), (10, 10));
    for l in err.values() {
        assert!(l["response"].is_null());
        assert_eq!(l["error"]["code"], "batch_expired");
        assert!(
            l["error"]["message"]
                .as_str()
                .expect("msg")
                .contains("completion window")
        );
    }
    for i in 0..20 {
        let id = format!("item-{i}");
        assert!(
            out.contains_key(&id) != err.contains_key(&id),
            "{id} in exactly one file"
        );
    }
    assert_eq!(server.stats().batches_expired, 1);
    server.shutdown().await;
}

#[tokio::test]
async fn cancel_goes_through_cancelling_and_keeps_partial_output() {
    let server = start(MockConfig {
        batch_running_ms: 2000,
        batch_cancelling_ms: 500,
        ..fast()
    })
    .await;
    let api = Api::openai(&server);
    let batch = api.submit(&jsonl(&api, 40)).await;
    let id = batch["id"].as_str().expect("id");
    api.poll_until(id, |b| b["request_counts"]["completed"].as_u64() >= Some(5))
        .await;
    let (status, cancelling) = api.cancel(id).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(cancelling["status"], "cancelling");
    assert!(cancelling["cancelling_at"].is_u64() && cancelling["cancelled_at"].is_null());
    // Idempotent while cancelling.
    let (status, again) = api.cancel(id).await;
    assert_eq!(
        (status, &again["status"]),
        (StatusCode::OK, &json!("cancelling"))
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(api.get(id).await["status"], "cancelling");
    let (done, seen) = api.finish(id).await;
    assert_eq!(seen, ["cancelling", "cancelled"]);
    let (total, completed, failed) = counts(&done);
    assert_eq!((total, failed), (40, 0));
    assert!((5..40).contains(&completed), "{done}");
    assert!(done["cancelled_at"].is_u64() && done["completed_at"].is_null());
    let out = api
        .content(done["output_file_id"].as_str().expect("out"))
        .await;
    assert_eq!(out.len() as u64, completed);
    assert!(done["error_file_id"].is_null());
    assert_eq!(server.stats().batches_cancelled, 1);

    // A finished batch cannot be cancelled.
    let other = api.submit(&jsonl(&api, 2)).await;
    let other_id = other["id"].as_str().expect("id");
    api.finish(other_id).await;
    let (status, err) = api.cancel(other_id).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        err["error"]["message"],
        "Cannot cancel a batch with status 'completed'."
    );
    server.shutdown().await;
}

#[tokio::test]
async fn output_file_appears_late_after_completed() {
    let server = start(MockConfig {
        batch_output_late_ms: 600,
        ..fast()
    })
    .await;
    let api = Api::openai(&server);
    let batch = api.submit(&jsonl(&api, 4)).await;
    let id = batch["id"].as_str().expect("id");
    let (early, _) = api.poll_until(id, |b| b["status"] == "completed").await;
    assert!(early["output_file_id"].is_null() && early["error_file_id"].is_null());
    assert_eq!(counts(&early), (4, 4, 0));
    let since = Instant::now();
    let (late, seen) = api.poll_until(id, |b| !b["output_file_id"].is_null()).await;
    assert_eq!(seen, ["completed"]);
    assert!(
        since.elapsed() >= Duration::from_millis(100),
        "{:?}",
        since.elapsed()
    );
    assert_eq!(
        api.content(late["output_file_id"].as_str().expect("out"))
            .await
            .len(),
        4
    );
    let outcomes: Vec<String> = server.log().into_iter().map(|e| e.outcome).collect();
    assert!(outcomes.ends_with(&["batch_completed".into(), "batch_output_ready".into()]));
    server.shutdown().await;
}

#[tokio::test]
async fn cut_results_stream_ends_mid_line() {
    let server = start(fast()).await;
    let api = Api::openai(&server);
    // Switched on live, through the admin endpoint.
    let resp = api
        .http
        .post(format!("{}/_mock/config", api.root))
        .json(&json!({"batch_validating_ms": 100, "batch_running_ms": 300, "batch_cut_results": 1}))
        .send()
        .await
        .expect("config");
    assert_eq!(resp.status(), StatusCode::OK);
    let batch = api.submit(&jsonl(&api, 10)).await;
    let (done, _) = api.finish(batch["id"].as_str().expect("id")).await;
    let url = api.url(&format!(
        "/files/{}/content",
        done["output_file_id"].as_str().expect("out")
    ));
    let mut resp = api.http.get(&url).send().await.expect("send");
    assert_eq!(resp.status(), StatusCode::OK);
    let announced = resp.content_length().expect("content-length");
    let mut got = Vec::new();
    let cut = loop {
        match resp.chunk().await {
            Ok(Some(c)) => got.extend_from_slice(&c),
            Ok(None) => break false,
            Err(_) => break true,
        }
    };
    assert!(cut, "the stream must end in an error, not a clean EOF");
    assert!(!got.is_empty() && (got.len() as u64) < announced);
    assert_ne!(got.last(), Some(&b'\n'), "cut mid-line");
    // The next download is whole, and the cut one was its prefix.
    let whole = api
        .http
        .get(&url)
        .send()
        .await
        .expect("send")
        .bytes()
        .await
        .expect("whole");
    assert_eq!(whole.len() as u64, announced);
    assert!(whole.starts_with(&got));
    assert_eq!(whole.iter().filter(|&&b| b == b'\n').count(), 10);
    server.shutdown().await;
}

#[tokio::test]
async fn lost_create_makes_exactly_one_batch_found_by_metadata() {
    let server = start(MockConfig {
        batch_lose_create: 1,
        ..fast()
    })
    .await;
    let api = Api::openai(&server);
    let file = api.upload(&jsonl(&api, 3)).await;
    let resp = api
        .auth(api.http.post(api.url("/batches")))
        .json(
            &json!({"input_file_id": file, "endpoint": "/v1/chat/completions",
                      "completion_window": "24h", "metadata": {"docket_batch": "b-17"}}),
        )
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(resp.bytes().await.expect("body").is_empty(), "no id leaks");
    let (status, list) = api.list("").await;
    assert_eq!(status, StatusCode::OK);
    let data = list["data"].as_array().expect("data");
    assert_eq!(data.len(), 1);
    assert_eq!(data[0]["metadata"], json!({"docket_batch": "b-17"}));
    assert_eq!(data[0]["input_file_id"], file.as_str());
    let id = data[0]["id"].as_str().expect("id");
    assert_eq!(api.finish(id).await.0["status"], "completed");
    let stats = server.stats();
    assert_eq!(stats.batches_created, 1);
    let creates: Vec<u16> = server
        .log()
        .into_iter()
        .filter(|e| e.outcome == "batch_created")
        .map(|e| e.status)
        .collect();
    assert_eq!(creates, [500]);
    // Only the first create was lost.
    let (status, _) = api.create(&file, json!({})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(server.stats().batches_created, 2);
    server.shutdown().await;
}

#[tokio::test]
async fn enqueued_token_limit_fails_the_batch_at_create() {
    let server = start(MockConfig {
        batch_running_ms: 3000,
        // 3 lines of 3 + (4 + 7) + (4 + 3) = 21 tokens each: one batch fits, two do not.
        batch_enqueued_token_limit: 100,
        ..fast()
    })
    .await;
    let api = Api::openai(&server);
    let data: String = (0..3)
        .map(|i| line(&api, &format!("i{i}"), "abcdefghi") + "\n")
        .collect();
    let first = api.submit(&data).await;
    let first_id = first["id"].as_str().expect("id");
    api.poll_until(first_id, |b| b["status"] == "in_progress")
        .await;
    let second = api.submit(&data).await;
    let (done, seen) = api.finish(second["id"].as_str().expect("id")).await;
    assert_eq!(seen, ["validating", "failed"]);
    let e = &done["errors"]["data"][0];
    assert_eq!(e["code"], "token_limit_exceeded");
    assert!(e["line"].is_null());
    assert!(
        e["message"]
            .as_str()
            .expect("msg")
            .contains("Enqueued token limit")
    );
    assert_eq!(api.get(first_id).await["status"], "in_progress");
    server.shutdown().await;
}

#[tokio::test]
async fn azure_paths_need_api_version_and_api_key() {
    let server = start(fast()).await;
    let api = Api::azure(&server);
    let bare = format!("{}/openai/batches", api.root);
    let no_key = api
        .http
        .get(format!("{bare}?api-version=2024-10-21"))
        .send()
        .await
        .expect("send");
    assert_eq!(no_key.status(), StatusCode::UNAUTHORIZED);
    let body: Value = no_key.json().await.expect("json");
    assert_eq!(body["error"]["code"], "401");
    let no_version = api
        .http
        .get(&bare)
        .header("api-key", "k")
        .send()
        .await
        .expect("send");
    assert_eq!(no_version.status(), StatusCode::BAD_REQUEST);
    let body: Value = no_version.json().await.expect("json");
    assert!(
        body["error"]["message"]
            .as_str()
            .expect("msg")
            .contains("api-version")
    );

    // A whole lifecycle with Azure's endpoint value.
    let batch = api.submit(&jsonl(&api, 5)).await;
    assert_eq!(batch["endpoint"], "/chat/completions");
    let id = batch["id"].as_str().expect("id");
    let (done, _) = api.finish(id).await;
    assert_eq!(counts(&done), (5, 5, 0));
    assert_eq!(
        api.content(done["output_file_id"].as_str().expect("out"))
            .await
            .len(),
        5
    );
    // Lines must use the batch's endpoint.
    let wrong = jsonl(&api, 1).replace("\"/chat/completions\"", "\"/v1/chat/completions\"");
    let failed = api.submit(&wrong).await;
    let (failed, _) = api.finish(failed["id"].as_str().expect("id")).await;
    assert_eq!(failed["errors"]["data"][0]["code"], "invalid_url");
    // OpenAI's routes do not see Azure's objects.
    let openai = Api::openai(&server);
    let (status, _) = openai
        .send(openai.http.get(openai.url(&format!("/batches/{id}"))))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(openai.list("").await.1["data"], json!([]));
    let log = server.log();
    let created = log
        .iter()
        .find(|e| e.outcome == "batch_created")
        .expect("logged");
    assert_eq!(
        (created.provider.as_str(), created.route.as_str()),
        ("azure", "/openai/batches")
    );
    server.shutdown().await;
}

#[tokio::test]
async fn list_pages_newest_first() {
    let server = start(MockConfig {
        batch_validating_ms: 60_000,
        ..fast()
    })
    .await;
    let api = Api::openai(&server);
    let file = api.upload(&jsonl(&api, 1)).await;
    let mut ids = Vec::new();
    for n in 0..5 {
        let (status, b) = api.create(&file, json!({"n": n.to_string()})).await;
        assert_eq!(status, StatusCode::OK);
        ids.push(b["id"].as_str().expect("id").to_string());
    }
    ids.reverse();
    let page = |v: &Value| -> Vec<String> {
        v["data"]
            .as_array()
            .expect("data")
            .iter()
            .map(|b| b["id"].as_str().expect("id").to_string())
            .collect()
    };
    let (_, p1) = api.list("?limit=2").await;
    assert_eq!(
        keys(&p1),
        ["data", "first_id", "has_more", "last_id", "object"]
    );
    assert_eq!(
        (page(&p1), &p1["has_more"]),
        (ids[0..2].to_vec(), &json!(true))
    );
    assert_eq!(
        (&p1["first_id"], &p1["last_id"]),
        (&json!(ids[0]), &json!(ids[1]))
    );
    let (_, p2) = api.list(&format!("?limit=2&after={}", ids[1])).await;
    assert_eq!(
        (page(&p2), &p2["has_more"]),
        (ids[2..4].to_vec(), &json!(true))
    );
    let (_, p3) = api.list(&format!("?limit=2&after={}", ids[3])).await;
    assert_eq!(
        (page(&p3), &p3["has_more"]),
        (ids[4..].to_vec(), &json!(false))
    );
    let (_, all) = api.list("").await;
    assert_eq!(page(&all), ids);
    let (_, empty) = api.list(&format!("?after={}", ids[4])).await;
    assert_eq!(
        empty,
        json!({"object": "list", "data": [], "first_id": null, "last_id": null, "has_more": false})
    );
    let (status, _) = api.list("?limit=0").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    server.shutdown().await;
}

#[tokio::test]
async fn create_and_upload_are_validated() {
    let server = start(fast()).await;
    let api = Api::openai(&server);
    let file = api.upload(&jsonl(&api, 1)).await;
    let post = |body: Value| api.send(api.http.post(api.url("/batches")).json(&body));
    let base = json!({"input_file_id": file, "endpoint": "/v1/chat/completions", "completion_window": "24h"});
    let with = |k: &str, v: Value| {
        let mut b = base.clone();
        b[k] = v;
        b
    };
    let (s, e) = post(with("completion_window", json!("48h"))).await;
    assert_eq!(
        (s, &e["error"]["param"]),
        (StatusCode::BAD_REQUEST, &json!("completion_window"))
    );
    let (s, e) = post(with("endpoint", json!("/v1/embeddings"))).await;
    assert_eq!(
        (s, &e["error"]["param"]),
        (StatusCode::BAD_REQUEST, &json!("endpoint"))
    );
    let many: serde_json::Map<String, Value> =
        (0..17).map(|i| (format!("k{i}"), json!("v"))).collect();
    let (s, e) = post(with("metadata", Value::Object(many))).await;
    assert_eq!(
        (s, &e["error"]["param"]),
        (StatusCode::BAD_REQUEST, &json!("metadata"))
    );
    let (s, _) = post(with("input_file_id", json!("file-nope"))).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, other) = api.upload_as("user_data", "notes.txt", b"hello").await;
    assert_eq!(s, StatusCode::OK);
    let (s, e) = post(with("input_file_id", other["id"].clone())).await;
    assert_eq!(
        (s, &e["error"]["param"]),
        (StatusCode::BAD_REQUEST, &json!("input_file_id"))
    );
    let (s, _) = api.upload_as("batch", "input.csv", b"x").await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let (s, _) = api.upload_as("nonsense", "input.jsonl", b"x").await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(server.stats().batches_created, 0);
    server.shutdown().await;
}

#[tokio::test]
async fn polls_get_429_with_retry_after_when_the_rpm_bucket_is_empty() {
    let server = start(MockConfig {
        rpm_limit: 60,
        ..fast()
    })
    .await;
    let api = Api::openai(&server);
    let first = api
        .auth(api.http.get(api.url("/batches")))
        .send()
        .await
        .expect("send");
    assert_eq!(first.status(), StatusCode::OK);
    let second = api
        .auth(api.http.get(api.url("/batches")))
        .send()
        .await
        .expect("send");
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = second.headers()["retry-after"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("secs");
    assert!(retry >= 1);
    assert!(
        second
            .headers()
            .contains_key("x-ratelimit-remaining-requests")
    );
    let body: Value = second.json().await.expect("json");
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    let stats = server.stats();
    assert_eq!((stats.batch_polls, stats.batch_rate_limited), (2, 1));
    server.shutdown().await;
}
