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

mod served;
pub use served::*;

mod billing;
pub use billing::*;

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
        self.spawn_with(&[])
    }

    /// `docket batch-adjudicate --yes --headless` with `more` flags, started.
    pub fn spawn_with(&self, more: &[&str]) -> Proc {
        let mut c = Command::new(bin());
        c.envs(self.env.iter().map(|(k, v)| (k, v)));
        c.arg("--workspace")
            .arg(self.ws.path())
            .args(["batch-adjudicate", "--yes", "--headless"])
            .args(more)
            .env("HOME", self.home.path())
            .env("XDG_DATA_HOME", self.home.path().join("data"))
            .env("XDG_STATE_HOME", self.home.path().join("state"))
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
