//! What a mock served for one provider batch: its lines, its files, what it
//! still stores.

use super::*;

/// A batch's results as the provider serves them, read here over HTTP and
/// parsed apart from docket's adapters.
#[derive(Debug, Default)]
pub struct Served {
    /// (input, output) tokens of the first result line answering each id.
    pub usage: HashMap<String, (u64, u64)>,
    /// Result lines per id (answered or not).
    pub lines: HashMap<String, usize>,
    /// OpenAI's own count for the whole batch (`usage` on the batch object).
    pub batch_usage: Option<(u64, u64)>,
}

pub(super) fn n(v: &Value, ptr: &str) -> u64 {
    v.pointer(ptr).and_then(Value::as_u64).unwrap_or(0)
}

/// A results file's text as the mock served it: over HTTP, or, once docket
/// deleted it after ingesting it (row B2), the bytes the mock kept of it.
pub(super) async fn file_text(m: &MockServer, req: reqwest::RequestBuilder, id: &str) -> String {
    let r = req.send().await.expect("a GET to the mock");
    if r.status().as_u16() == 404
        && let Some(bytes) = m.deleted_file(id)
    {
        return String::from_utf8(bytes).expect("a UTF-8 results file");
    }
    assert!(r.status().is_success(), "{id}: {}", r.status());
    r.text().await.unwrap()
}

pub(super) async fn get(req: reqwest::RequestBuilder) -> reqwest::Response {
    let r = req.send().await.expect("a GET to the mock");
    assert!(r.status().is_success(), "{}", r.status());
    r
}

pub(super) fn jsonl(text: &str) -> impl Iterator<Item = Value> + '_ {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
}

/// What the mock serves as the results of `provider_batch_id`.
pub async fn served(m: &MockServer, wire: Wire, provider_batch_id: &str) -> Served {
    let http = reqwest::Client::new();
    let mut s = Served::default();
    match wire {
        Wire::OpenAi => served_openai(m, &http, provider_batch_id, &mut s).await,
        Wire::Anthropic => served_anthropic(m, &http, provider_batch_id, &mut s).await,
        Wire::Gemini => served_gemini(m, &http, provider_batch_id, &mut s).await,
    }
    s
}

/// OpenAI's batch: its usage, then its output and error files' lines.
async fn served_openai(
    m: &MockServer,
    http: &reqwest::Client,
    provider_batch_id: &str,
    s: &mut Served,
) {
    let root = root(m);
    let auth = format!("Bearer {KEY}");
    let b: Value = get(http
        .get(format!("{root}/v1/batches/{provider_batch_id}"))
        .header("authorization", &auth))
    .await
    .json()
    .await
    .unwrap();
    s.batch_usage = b
        .get("usage")
        .filter(|u| u.is_object())
        .map(|u| (n(u, "/input_tokens"), n(u, "/output_tokens")));
    for file in ["output_file_id", "error_file_id"] {
        let Some(id) = b[file].as_str() else { continue };
        let req = http
            .get(format!("{root}/v1/files/{id}/content"))
            .header("authorization", &auth);
        let text = file_text(m, req, id).await;
        for l in jsonl(&text) {
            let usage =
                (l.pointer("/response/status_code") == Some(&Value::from(200))).then(|| {
                    let u = &l["response"]["body"]["usage"];
                    (n(u, "/prompt_tokens"), n(u, "/completion_tokens"))
                });
            s.line(l["custom_id"].as_str(), usage);
        }
    }
}

/// Anthropic's batch: its results stream.
async fn served_anthropic(
    m: &MockServer,
    http: &reqwest::Client,
    provider_batch_id: &str,
    s: &mut Served,
) {
    let root = root(m);
    let text = get(http
        .get(format!(
            "{root}/v1/messages/batches/{provider_batch_id}/results"
        ))
        .header("x-api-key", KEY)
        .header("anthropic-version", "2023-06-01"))
    .await
    .text()
    .await
    .unwrap();
    for l in jsonl(&text) {
        let usage = (l.pointer("/result/type") == Some(&Value::from("succeeded"))).then(|| {
            let u = &l["result"]["message"]["usage"];
            (n(u, "/input_tokens"), n(u, "/output_tokens"))
        });
        s.line(l["custom_id"].as_str(), usage);
    }
}

/// Gemini's batch operation: its inlined responses, or its responses file.
async fn served_gemini(
    m: &MockServer,
    http: &reqwest::Client,
    provider_batch_id: &str,
    s: &mut Served,
) {
    let root = root(m);
    let op: Value = get(http
        .get(format!("{root}/v1beta/{provider_batch_id}"))
        .header("x-goog-api-key", KEY))
    .await
    .json()
    .await
    .unwrap();
    let usage = |item: &Value| {
        item.get("response").map(|r| {
            (
                n(r, "/usageMetadata/promptTokenCount"),
                n(r, "/usageMetadata/candidatesTokenCount"),
            )
        })
    };
    let out = &op["response"];
    if let Some(items) = out
        .pointer("/inlinedResponses/inlinedResponses")
        .and_then(Value::as_array)
    {
        for item in items {
            s.line(
                item.pointer("/metadata/key").and_then(Value::as_str),
                usage(item),
            );
        }
    } else if let Some(file) = out["responsesFile"].as_str() {
        let id = file.trim_start_matches("files/");
        let req = http
            .get(format!(
                "{root}/download/v1beta/files/{id}:download?alt=media"
            ))
            .header("x-goog-api-key", KEY);
        let text = file_text(m, req, file).await;
        for item in jsonl(&text) {
            s.line(item["key"].as_str(), usage(&item));
        }
    }
}

/// Whether the mock still stores file `id` (an OpenAI/Azure file id, or a
/// Gemini `files/…` name), asked over HTTP.
pub async fn file_stored(m: &MockServer, wire: Wire, id: &str) -> bool {
    let http = reqwest::Client::new();
    let root = root(m);
    let req = match wire {
        Wire::OpenAi => http
            .get(format!("{root}/v1/files/{id}"))
            .header("authorization", format!("Bearer {KEY}")),
        Wire::Gemini => http
            .get(format!(
                "{root}/v1beta/files/{}",
                id.trim_start_matches("files/")
            ))
            .header("x-goog-api-key", KEY),
        Wire::Anthropic => panic!("Anthropic batches have no files"),
    };
    let status = req.send().await.expect("a GET to the mock").status();
    assert!(
        status.is_success() || status.as_u16() == 404,
        "file {id}: {status}"
    );
    status.is_success()
}

/// The files the provider's batch `provider_batch_id` names, asked over
/// HTTP: (input file, output/error or responses files).
pub async fn batch_files(
    m: &MockServer,
    wire: Wire,
    provider_batch_id: &str,
) -> (Option<String>, Vec<String>) {
    let http = reqwest::Client::new();
    let root = root(m);
    match wire {
        Wire::OpenAi => {
            let b: Value = get(http
                .get(format!("{root}/v1/batches/{provider_batch_id}"))
                .header("authorization", format!("Bearer {KEY}")))
            .await
            .json()
            .await
            .unwrap();
            let results = ["output_file_id", "error_file_id"]
                .iter()
                .filter_map(|f| b[*f].as_str().map(str::to_string))
                .collect();
            (b["input_file_id"].as_str().map(str::to_string), results)
        }
        Wire::Gemini => {
            let op: Value = get(http
                .get(format!("{root}/v1beta/{provider_batch_id}"))
                .header("x-goog-api-key", KEY))
            .await
            .json()
            .await
            .unwrap();
            let input = op
                .pointer("/metadata/inputConfig/fileName")
                .and_then(Value::as_str)
                .map(str::to_string);
            let results = op
                .pointer("/response/responsesFile")
                .and_then(Value::as_str)
                .map(str::to_string)
                .into_iter()
                .collect();
            (input, results)
        }
        Wire::Anthropic => (None, Vec::new()),
    }
}

impl Served {
    fn line(&mut self, id: Option<&str>, usage: Option<(u64, u64)>) {
        let Some(id) = id else { return };
        *self.lines.entry(id.to_string()).or_default() += 1;
        if let Some(u) = usage {
            self.usage.entry(id.to_string()).or_insert(u);
        }
    }
}
