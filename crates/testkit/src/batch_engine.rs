//! Batch runs through the whole engine, for the fault-matrix rows on batch
//! results (B4, B6, B7): the real `docket batch-adjudicate` against the
//! in-process mock (so a test reads its billing log and steers it live), on
//! the OpenAI, Anthropic or Gemini Batch API; the ledger's lines and
//! batches; and the billing oracle, which holds every line the mock billed
//! against what the ledger recorded for it.

use std::collections::{HashMap, HashSet};
use std::process::Command;
use std::time::Duration;

use docket::mock::{MockConfig, MockServer};
use rusqlite::Connection;
use serde_json::Value;

use super::procs::{Proc, bin};
use super::{Workspace, count};

pub const KEY_ENV: &str = "DOCKET_FAULT_BATCH_KEY";
pub const KEY: &str = "faultBatchKey7c1d02";
/// The longest one `docket batch-adjudicate` may take.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// Whose Batch API a run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    OpenAi,
    Anthropic,
    Gemini,
}

impl Wire {
    pub fn kind(self) -> &'static str {
        match self {
            Wire::OpenAi => "openai",
            Wire::Anthropic => "anthropic",
            Wire::Gemini => "gemini",
        }
    }

    pub fn model(self) -> &'static str {
        match self {
            Wire::OpenAi => "gpt-4o-mini",
            Wire::Anthropic => "claude-haiku-4-5",
            Wire::Gemini => "gemini-2.5-flash",
        }
    }
}

/// The mock with batches through their lifecycle in well under a second
/// and its billing log on (`batch_line_log`); `tweak` adjusts it.
pub async fn mock(tweak: impl FnOnce(&mut MockConfig)) -> MockServer {
    let mut cfg = MockConfig {
        batch_validating_ms: 100,
        batch_running_ms: 500,
        batch_finalizing_ms: 100,
        batch_cancelling_ms: 100,
        batch_line_log: true,
        ..Default::default()
    };
    tweak(&mut cfg);
    super::mock(cfg).await
}

/// "http://127.0.0.1:PORT".
pub fn root(m: &MockServer) -> String {
    format!("http://{}", m.addr())
}

/// A workspace in batch mode on `wire`'s Batch API at the mock, with
/// `items` demo items, and a private HOME for the runs.
pub struct BatchWs {
    pub ws: Workspace,
    pub home: tempfile::TempDir,
    pub wire: Wire,
    /// More environment for the runs (`with_env`).
    pub env: Vec<(String, String)>,
}

pub fn workspace(wire: Wire, m: &MockServer, items: usize) -> BatchWs {
    let dir = tempfile::tempdir().expect("tempdir");
    docket::workspace::init(dir.path(), false).expect("init");
    let url = match wire {
        Wire::OpenAi => m.base_url(),
        _ => root(m),
    };
    let toml = format!(
        r#"[job]
name = "fault-batches"

[providers.main]
kind = "{kind}"
model = "{model}"
base_url = "{url}"
api_key_env = "{KEY_ENV}"
requests_per_minute = 0
tokens_per_minute = 0
max_concurrency = 8
request_timeout_secs = 30
max_transport_attempts = 4

[[stages]]
name = "adjudicate"
provider = "main"
template = "prompts/adjudicate.j2"
system_prompt = "prompts/system.txt"
max_tokens = 200
max_attempts = 3

[stages.batch]
mode = "batch"
max_wait_secs = 0.3
poll_interval_secs = 0.1

[stages.gate]
kind = "json_schema"
schema = "schemas/adjudicate.schema.json"

[routing]
auto_accept_threshold = 0.85
review_threshold = 0.60
"#,
        kind = wire.kind(),
        model = wire.model(),
    );
    std::fs::write(dir.path().join("docket.toml"), toml).unwrap();
    let ws = Workspace { dir };
    super::import_demo_items(&ws, items);
    BatchWs {
        ws,
        home: tempfile::tempdir().expect("home"),
        wire,
        env: Vec::new(),
    }
}

impl BatchWs {
    /// Every run gets `var` = `value` in its environment.
    pub fn with_env(mut self, var: &str, value: &str) -> Self {
        self.env.push((var.to_string(), value.to_string()));
        self
    }

    /// Add `lines` (TOML) to the stage's `[stages.batch]` table.
    pub fn batch_settings(&self, lines: &str) {
        let path = self.ws.path().join("docket.toml");
        let toml = std::fs::read_to_string(&path).unwrap();
        let toml = toml.replacen("[stages.batch]\n", &format!("[stages.batch]\n{lines}\n"), 1);
        std::fs::write(&path, toml).unwrap();
    }

    /// Add `lines` (TOML) to the provider's table.
    pub fn provider_settings(&self, lines: &str) {
        let path = self.ws.path().join("docket.toml");
        let toml = std::fs::read_to_string(&path).unwrap();
        let toml = toml.replacen(
            "[providers.main]\n",
            &format!("[providers.main]\n{lines}\n"),
            1,
        );
        std::fs::write(&path, toml).unwrap();
    }

    /// `docket batch-adjudicate --yes --headless`, started.
    pub fn spawn(&self) -> Proc {
        let mut c = Command::new(bin());
        c.envs(self.env.iter().map(|(k, v)| (k, v)));
        c.arg("--workspace")
            .arg(self.ws.path())
            .args(["batch-adjudicate", "--yes", "--headless"])
            .env("HOME", self.home.path())
            .env("XDG_DATA_HOME", self.home.path().join("data"))
            .env(KEY_ENV, KEY)
            .env("NO_COLOR", "1")
            .env_remove("DOCKET_WORKSPACE");
        Proc::start(
            c,
            format!("docket batch-adjudicate ({})", self.wire.kind()),
            self.home.path().join("run.out"),
        )
    }

    /// The run to its end (within `RUN_TIMEOUT`), off the async threads
    /// (the mock serves on them meanwhile): its exit code and output.
    pub async fn finish(mut run: Proc) -> (Option<i32>, String) {
        tokio::task::spawn_blocking(move || run.wait(RUN_TIMEOUT))
            .await
            .expect("the wait")
    }

    /// A whole run that must end with exit `code` (0: done; 5: done with
    /// items in error); the session's id.
    pub async fn run_to(&self, code: i32) -> String {
        let (got, out) = Self::finish(self.spawn()).await;
        assert_eq!(got, Some(code), "{}:\n{out}", self.wire.kind());
        self.session()
    }

    pub fn conn(&self) -> Connection {
        self.ws.conn()
    }

    pub fn session(&self) -> String {
        docket::ledger::store::latest_session(&super::db(&self.conn()))
            .unwrap()
            .expect("a session")
    }
}

/// One entry of the mock's billing log (`batch_line_log`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineEntry {
    pub batch: String,
    pub custom_id: String,
    /// 200: billed
    pub status: u16,
    /// `batch_line_ok`, `_failed`, `_expired`, `_canceled`
    pub outcome: String,
}

/// The mock's billing log: every batch line it ran or closed unrun.
pub fn line_log(m: &MockServer) -> Vec<LineEntry> {
    m.log()
        .into_iter()
        .filter(|e| e.outcome.starts_with("batch_line_"))
        .map(|e| LineEntry {
            batch: e.batch_id.clone().unwrap_or_default(),
            custom_id: e.client_request_id.clone().unwrap_or_default(),
            status: e.status,
            outcome: e.outcome,
        })
        .collect()
}

/// Mock log entries with `outcome`.
pub fn mock_events(m: &MockServer, outcome: &str) -> usize {
    m.log().iter().filter(|e| e.outcome == outcome).count()
}

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

impl Served {
    fn line(&mut self, id: Option<&str>, usage: Option<(u64, u64)>) {
        let Some(id) = id else { return };
        *self.lines.entry(id.to_string()).or_default() += 1;
        if let Some(u) = usage {
            self.usage.entry(id.to_string()).or_insert(u);
        }
    }
}

fn n(v: &Value, ptr: &str) -> u64 {
    v.pointer(ptr).and_then(Value::as_u64).unwrap_or(0)
}

/// A results file's text as the mock served it: over HTTP, or, once docket
/// deleted it after ingesting it (row B2), the bytes the mock kept of it.
async fn file_text(m: &MockServer, req: reqwest::RequestBuilder, id: &str) -> String {
    let r = req.send().await.expect("a GET to the mock");
    if r.status().as_u16() == 404
        && let Some(bytes) = m.deleted_file(id)
    {
        return String::from_utf8(bytes).expect("a UTF-8 results file");
    }
    assert!(r.status().is_success(), "{id}: {}", r.status());
    r.text().await.unwrap()
}

async fn get(req: reqwest::RequestBuilder) -> reqwest::Response {
    let r = req.send().await.expect("a GET to the mock");
    assert!(r.status().is_success(), "{}", r.status());
    r
}

fn jsonl(text: &str) -> impl Iterator<Item = Value> + '_ {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
}

/// What the mock serves as the results of `provider_batch_id`.
pub async fn served(m: &MockServer, wire: Wire, provider_batch_id: &str) -> Served {
    let http = reqwest::Client::new();
    let root = root(m);
    let mut s = Served::default();
    match wire {
        Wire::OpenAi => {
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
                    let usage = (l.pointer("/response/status_code") == Some(&Value::from(200)))
                        .then(|| {
                            let u = &l["response"]["body"]["usage"];
                            (n(u, "/prompt_tokens"), n(u, "/completion_tokens"))
                        });
                    s.line(l["custom_id"].as_str(), usage);
                }
            }
        }
        Wire::Anthropic => {
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
                let usage =
                    (l.pointer("/result/type") == Some(&Value::from("succeeded"))).then(|| {
                        let u = &l["result"]["message"]["usage"];
                        (n(u, "/input_tokens"), n(u, "/output_tokens"))
                    });
                s.line(l["custom_id"].as_str(), usage);
            }
        }
        Wire::Gemini => {
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
    }
    s
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

/// One provider_batch row.
#[derive(Debug, Clone)]
pub struct BatchRow {
    pub batch_id: i64,
    pub state: String,
    pub provider_batch_id: Option<String>,
    pub request_count: i64,
    pub completed_count: i64,
    pub failed_count: i64,
    pub ingested_count: i64,
    pub quarantined_count: i64,
}

/// The session's provider batches, oldest first.
pub fn batch_rows(conn: &Connection, sid: &str) -> Vec<BatchRow> {
    conn.prepare(
        "SELECT batch_id, state, provider_batch_id, request_count, completed_count, failed_count,
                ingested_count, quarantined_count
         FROM provider_batch WHERE session_id = ?1 ORDER BY batch_id",
    )
    .unwrap()
    .query_map([sid], |r| {
        Ok(BatchRow {
            batch_id: r.get(0)?,
            state: r.get(1)?,
            provider_batch_id: r.get(2)?,
            request_count: r.get(3)?,
            completed_count: r.get(4)?,
            failed_count: r.get(5)?,
            ingested_count: r.get(6)?,
            quarantined_count: r.get(7)?,
        })
    })
    .unwrap()
    .map(Result::unwrap)
    .collect()
}

/// One batch line as the ledger recorded it: its attempt's message.
#[derive(Debug, Clone)]
pub struct LineRow {
    pub batch_id: i64,
    pub custom_id: String,
    pub request_id: i64,
    pub attempt: i64,
    pub state: String,
    pub error_kind: Option<String>,
    pub error_message: Option<String>,
    pub input_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
    pub cached_input_tokens: Option<i64>,
    pub cost_usd: Option<f64>,
}

/// Every batch line in the ledger with its message, by custom_id.
pub fn line_rows(conn: &Connection) -> HashMap<String, LineRow> {
    let rows: Vec<LineRow> = conn
        .prepare(
            "SELECT i.batch_id, i.custom_id, i.request_id, i.attempt, m.state, m.error_kind,
                    m.error_message, m.input_tokens, m.output_tokens, m.cached_input_tokens,
                    m.cost_usd
             FROM provider_batch_item i JOIN llm_messages m
               ON m.request_id = i.request_id AND m.attempt = i.attempt",
        )
        .unwrap()
        .query_map([], |r| {
            Ok(LineRow {
                batch_id: r.get(0)?,
                custom_id: r.get(1)?,
                request_id: r.get(2)?,
                attempt: r.get(3)?,
                state: r.get(4)?,
                error_kind: r.get(5)?,
                error_message: r.get(6)?,
                input_tokens: r.get(7)?,
                output_tokens: r.get(8)?,
                cached_input_tokens: r.get(9)?,
                cost_usd: r.get(10)?,
            })
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let n = rows.len();
    let by_id: HashMap<String, LineRow> =
        rows.into_iter().map(|r| (r.custom_id.clone(), r)).collect();
    assert_eq!(by_id.len(), n, "a custom_id on two batch lines");
    by_id
}

/// Every one of the `n` items has exactly one result.
pub fn each_item_once(conn: &Connection, sid: &str, n: i64) {
    let results = count(
        conn,
        "SELECT COUNT(*) FROM llm_batch_result WHERE session_id = ?1",
        [sid],
    );
    let distinct = count(
        conn,
        "SELECT COUNT(DISTINCT item_id) FROM llm_batch_result WHERE session_id = ?1",
        [sid],
    );
    assert_eq!((results, distinct), (n, n), "results, items with a result");
}

/// No request was answered twice.
pub fn no_double_answers(conn: &Connection) {
    assert_eq!(
        0,
        count(
            conn,
            "SELECT COUNT(*) FROM (SELECT request_id FROM llm_messages WHERE state = 'answered'
                GROUP BY request_id HAVING COUNT(*) > 1)",
            []
        ),
        "a request with two answered messages"
    );
}

/// What the billing oracle found.
#[derive(Debug, Default)]
pub struct Billing {
    /// Lines the mock billed (status 200 in its billing log).
    pub billed: HashSet<String>,
    /// Of those, the ones the ledger has as ambiguous: billed, but no
    /// result line ever came for them.
    pub ambiguous: HashSet<String>,
    /// Per provider batch: what it served.
    pub served: HashMap<String, Served>,
    /// The ledger's cost of the answered lines, and the oracle's.
    pub ledger_cost: f64,
    pub oracle_cost: f64,
}

/// The billing oracle, at the end of a run: the mock ran each custom_id at
/// most once and billed it at most once; every billed line is in the ledger,
/// answered with the tokens of its first result line as served (and so their
/// batch price), or ambiguous when the provider served no line for it; the
/// ledger has no answer the mock did not bill, and no line it never ran as
/// billed. OpenAI's own token count of a batch equals the ledger's when
/// every billed line of it was answered.
pub async fn check_billing(m: &MockServer, wire: Wire, conn: &Connection, sid: &str) -> Billing {
    let log = line_log(m);
    assert!(
        !log.is_empty(),
        "the billing log is empty: batch_line_log off?"
    );
    let mut runs: HashMap<&str, usize> = HashMap::new();
    for e in &log {
        *runs.entry(e.custom_id.as_str()).or_default() += 1;
    }
    let twice: Vec<_> = runs.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "lines run or closed twice: {twice:?}");
    let billed: HashSet<String> = log
        .iter()
        .filter(|e| e.status == 200)
        .map(|e| e.custom_id.clone())
        .collect();
    let lines = line_rows(conn);
    let mut out = Billing {
        billed,
        ..Default::default()
    };
    for b in batch_rows(conn, sid) {
        let Some(pid) = b.provider_batch_id else {
            continue;
        };
        let s = served(m, wire, &pid).await;
        out.served.insert(pid, s);
    }
    let usage_of = |id: &str| out.served.values().find_map(|s| s.usage.get(id).copied());
    let served_at_all = |id: &str| out.served.values().any(|s| s.lines.contains_key(id));
    let (price, known) = docket::cost::price_of(wire.model());
    assert!(known, "{} has a price", wire.model());
    for id in &out.billed {
        let row = lines
            .get(id)
            .unwrap_or_else(|| panic!("{id} was billed but the ledger has no such line"));
        match row.state.as_str() {
            "answered" => {
                let (input, output) =
                    usage_of(id).unwrap_or_else(|| panic!("{id}: answered with no result line"));
                assert_eq!(
                    (row.input_tokens, row.output_tokens),
                    (Some(input as i64), Some(output as i64)),
                    "{id}: the ledger's tokens against its first result line"
                );
                let cached = row.cached_input_tokens.unwrap_or(0).max(0) as u64;
                let oracle =
                    price.cost(input, cached, output) * docket::provider::batch::BATCH_PRICE_FACTOR;
                let cost = row.cost_usd.unwrap_or(0.0);
                assert!(
                    (cost - oracle).abs() <= 1e-12 + oracle * 1e-9,
                    "{id}: the ledger's cost {cost} against the oracle's {oracle}"
                );
                out.ledger_cost += cost;
                out.oracle_cost += oracle;
            }
            "ambiguous" => {
                assert!(
                    !served_at_all(id),
                    "{id}: ambiguous, though the provider served a line for it"
                );
                out.ambiguous.insert(id.clone());
            }
            other => panic!("{id} was billed but the ledger says {other}: {row:?}"),
        }
    }
    for row in lines.values() {
        if row.state == "answered" {
            assert!(
                out.billed.contains(&row.custom_id),
                "{}: answered in the ledger, never billed",
                row.custom_id
            );
        }
        if row.error_kind.as_deref() == Some("not_run") {
            assert!(
                !out.billed.contains(&row.custom_id),
                "{}: billed, but the ledger says it never ran",
                row.custom_id
            );
            assert_eq!(row.cost_usd.unwrap_or(0.0), 0.0, "{row:?}");
        }
    }
    if wire == Wire::OpenAi {
        for b in batch_rows(conn, sid) {
            let Some(pid) = &b.provider_batch_id else {
                continue;
            };
            let Some(total) = out.served[pid].batch_usage else {
                continue;
            };
            let of_batch: Vec<&LineRow> = lines
                .values()
                .filter(|l| l.batch_id == b.batch_id)
                .collect();
            if of_batch.iter().any(|l| l.state == "ambiguous") {
                continue;
            }
            let sum = of_batch.iter().filter(|l| l.state == "answered").fold(
                (0u64, 0u64),
                |(i, o), l| {
                    (
                        i + l.input_tokens.unwrap_or(0) as u64,
                        o + l.output_tokens.unwrap_or(0) as u64,
                    )
                },
            );
            assert_eq!(
                sum, total,
                "batch {pid}: the ledger's tokens against the provider's usage"
            );
        }
    }
    assert!(
        (out.ledger_cost - out.oracle_cost).abs() <= 1e-9 * out.oracle_cost.max(1e-9),
        "ledger {} oracle {}",
        out.ledger_cost,
        out.oracle_cost
    );
    out
}

/// Ids of `rows` in `batch_id` whose message is in `state` (and, when
/// given, of `kind`).
pub fn ids_in(
    rows: &HashMap<String, LineRow>,
    batch_id: i64,
    state: &str,
    kind: Option<&str>,
) -> HashSet<String> {
    rows.values()
        .filter(|l| l.batch_id == batch_id && l.state == state)
        .filter(|l| kind.is_none() || l.error_kind.as_deref() == kind)
        .map(|l| l.custom_id.clone())
        .collect()
}

/// The request of line `id` was answered by a later attempt, in another
/// batch.
pub fn answered_later(rows: &HashMap<String, LineRow>, id: &str) -> bool {
    let l = &rows[id];
    rows.values().any(|o| {
        o.request_id == l.request_id
            && o.attempt > l.attempt
            && o.batch_id != l.batch_id
            && o.state == "answered"
    })
}
