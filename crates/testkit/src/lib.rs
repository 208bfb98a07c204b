//! The test kit: what every integration test and bench of docket shares.
//! Throwaway workspaces pointed at a provider on loopback, item files, and
//! the ledger invariants every run must keep; `procs`: the real binary and
//! the mock as child processes; `tmux`: driving the console in a real
//! terminal; `pg`: a PostgreSQL server of the test's own; `power_loss` and
//! `soak`: the crash soak's parts. `batch`: the Batch API adapter tests' mock, request lines,
//! polling and results helpers; `batch_engine`: whole batch runs on each
//! provider's Batch API and the billing oracle of their lines.

pub mod batch;
pub mod batch_engine;
pub mod isolation;
pub mod pg;
pub mod power_loss;
pub mod procs;
pub mod soak;
pub mod tmux;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use docket::engine::Reporter;
use rusqlite::Connection;

/// Held by each test of a file whose tests start several processes (the
/// workers, batch crashes): they run one at a time, as alone. Side by side
/// on two cores their waits for a takeover or a state ran out now and
/// then, though each passes alone every time.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

pub struct Workspace {
    pub dir: tempfile::TempDir,
}

impl Workspace {
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
    pub fn ledger(&self) -> PathBuf {
        self.dir.path().join("docket.sqlite")
    }
    pub fn conn(&self) -> Connection {
        docket::ledger::open(&self.ledger()).expect("open ledger")
    }
    /// The ledger handle the CLI and the console use.
    pub fn handle(&self) -> docket::ledger::Ledger {
        docket::ledger::Ledger::open(self.ledger()).expect("open ledger")
    }
}

/// Provider knobs for a test job.
pub struct Job {
    pub base_url: String,
    pub rpm: u64,
    pub concurrency: u64,
    pub timeout_secs: f64,
    pub max_attempts: u64,
    pub transport_attempts: u64,
    pub template: Option<&'static str>,
    pub api_key_env: Option<&'static str>,
}

impl Job {
    pub fn new(base_url: &str) -> Self {
        Job {
            base_url: base_url.to_string(),
            rpm: 0,
            concurrency: 16,
            timeout_secs: 10.0,
            max_attempts: 3,
            transport_attempts: 5,
            template: None,
            api_key_env: None,
        }
    }
}

/// A workspace from `docket init`, with its provider pointed at `job.base_url`.
pub fn workspace(job: &Job) -> Workspace {
    let dir = tempfile::tempdir().expect("tempdir");
    docket::workspace::init(dir.path(), false).expect("init");
    if let Some(t) = job.template {
        std::fs::write(dir.path().join("prompts/adjudicate.j2"), t).unwrap();
    }
    let key = job
        .api_key_env
        .map(|k| format!("api_key_env = \"{k}\"\n"))
        .unwrap_or_default();
    let toml = format!(
        r#"[job]
name = "test"

[providers.main]
kind = "openai_compatible"
model = "gpt-4o-mini"
base_url = "{base}"
{key}requests_per_minute = {rpm}
tokens_per_minute = 0
max_concurrency = {conc}
request_timeout_secs = {timeout}
max_transport_attempts = {transport}

[[stages]]
name = "adjudicate"
provider = "main"
template = "prompts/adjudicate.j2"
system_prompt = "prompts/system.txt"
max_tokens = 200
max_attempts = {attempts}

[stages.gate]
kind = "json_schema"
schema = "schemas/adjudicate.schema.json"

[routing]
auto_accept_threshold = 0.85
review_threshold = 0.60
"#,
        base = job.base_url,
        rpm = job.rpm,
        conc = job.concurrency,
        timeout = job.timeout_secs,
        transport = job.transport_attempts,
        attempts = job.max_attempts,
    );
    std::fs::write(dir.path().join("docket.toml"), toml).unwrap();
    Workspace { dir }
}

/// A mock that answers every request the same non-retryable way
/// ("unauthorized" or "quota").
pub fn mode(name: &str) -> docket::mock::MockConfig {
    docket::mock::MockConfig {
        mode: name.into(),
        ..Default::default()
    }
}

/// A mock with a log-normal latency (median and p99, in ms).
pub fn latency(median_ms: f64, p99_ms: f64) -> docket::mock::MockConfig {
    docket::mock::MockConfig {
        latency_median_ms: median_ms,
        latency_p99_ms: p99_ms,
        ..Default::default()
    }
}

/// The built-in mock on a free loopback port.
pub async fn mock(cfg: docket::mock::MockConfig) -> docket::mock::MockServer {
    docket::mock::MockServer::start(cfg, std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("mock")
}

/// A mock, and a workspace pointed at it holding `items` demo items; `tweak`
/// adjusts the job first.
pub async fn mocked(
    cfg: docket::mock::MockConfig,
    items: usize,
    tweak: impl FnOnce(&mut Job),
) -> (docket::mock::MockServer, Workspace) {
    let m = mock(cfg).await;
    let mut job = Job::new(&m.base_url());
    tweak(&mut job);
    let ws = workspace(&job);
    import_demo_items(&ws, items);
    (m, ws)
}

/// Import `n` demo chart items.
pub fn import_demo_items(ws: &Workspace, n: usize) {
    let path = ws.path().join("items/test.jsonl");
    let mut f = std::fs::File::create(&path).unwrap();
    docket::demo::write_chart_items(&mut f, n, 99).unwrap();
    import(ws, &path);
}

pub fn import(ws: &Workspace, path: &Path) {
    let mut ledger = ws.handle();
    let opts = docket::items::ImportOptions {
        id_field: "id".into(),
        format: None,
        strict: true,
        update: false,
    };
    let r = docket::items::import_file(&mut ledger, path, &opts).expect("import");
    assert_eq!(r.bad_count, 0);
}

/// Collects the engine's lines.
#[derive(Default)]
pub struct Lines(pub Mutex<Vec<String>>);

impl Reporter for Lines {
    fn line(&self, text: &str) {
        self.0.lock().unwrap().push(text.to_string());
    }
}

impl Lines {
    pub fn text(&self) -> String {
        self.0.lock().unwrap().join("\n")
    }
}

pub fn options(ws: &Workspace) -> docket::engine::RunOptions {
    docket::engine::RunOptions {
        workspace: ws.path().to_path_buf(),
        mock: Some(docket::local_mock::starter()),
        ..Default::default()
    }
}

pub async fn run(opts: docket::engine::RunOptions) -> (docket::engine::RunReport, Arc<Lines>) {
    let lines = Arc::new(Lines::default());
    let report = docket::engine::run(opts, lines.clone(), |_| true, Default::default())
        .await
        .unwrap_or_else(|e| panic!("run failed: {e}"));
    (report, lines)
}

pub fn count(conn: &Connection, sql: &str, p: impl rusqlite::Params) -> i64 {
    conn.query_row(sql, p, |r| r.get(0))
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// The invariants of DESIGN.md that every run keeps, checked on the ledger.
pub fn check_invariants(conn: &Connection, session_id: &str) {
    // On a connection of its own: SQLite's check of an FTS5 table trusts
    // the index layout the connection cached when it last read it, and a
    // long-lived connection (this one saw the ledger before the run) can
    // report a segment the run has since merged away as missing.
    let fresh = Connection::open(conn.path().expect("a ledger file")).expect("open the ledger");
    let ok: String = fresh
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok");
    let (total, processed, acc, rev, rej, err): (i64, i64, i64, i64, i64, i64) = conn
        .query_row(
            "SELECT total_count, processed_count, accepted_count, reviewed_count, rejected_count, error_count
             FROM llm_batch_session WHERE session_id = ?1",
            [session_id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?)),
        )
        .unwrap();
    let by = |o: &str| {
        count(
            conn,
            "SELECT COUNT(*) FROM llm_batch_result WHERE session_id = ?1 AND outcome = ?2",
            rusqlite::params![session_id, o],
        )
    };
    assert_eq!(acc, by("accepted"), "accepted counter vs results");
    assert_eq!(rev, by("review"), "review counter vs results");
    assert_eq!(rej, by("rejected"), "rejected counter vs results");
    assert_eq!(err, by("error"), "error counter vs results");
    assert_eq!(processed, acc + rev + rej + err);
    assert_eq!(
        total,
        count(
            conn,
            "SELECT COUNT(*) FROM session_item WHERE session_id = ?1",
            [session_id]
        )
    );
    // Every result belongs to an item of the session; none is lost or extra.
    assert_eq!(
        0,
        count(
            conn,
            "SELECT COUNT(*) FROM llm_batch_result b WHERE b.session_id = ?1
               AND NOT EXISTS (SELECT 1 FROM session_item s WHERE s.session_id = b.session_id AND s.item_id = b.item_id)",
            [session_id]
        )
    );
    // Accepted items are decided (unless a rejected audit review took the
    // auto-accept back); review items have a review row.
    assert_eq!(
        0,
        count(
            conn,
            "SELECT COUNT(*) FROM llm_batch_result b JOIN decision d ON d.item_id = b.item_id
             WHERE b.session_id = ?1 AND b.outcome = 'accepted' AND d.state != 'decided'
               AND NOT EXISTS (SELECT 1 FROM review_item r WHERE r.session_id = b.session_id
                               AND r.item_id = b.item_id AND r.audit = 1 AND r.status = 'rejected')",
            [session_id]
        )
    );
    assert_eq!(
        rev,
        count(
            conn,
            "SELECT COUNT(*) FROM review_item WHERE session_id = ?1 AND source = 'LLM_REVIEW' AND audit = 0",
            [session_id]
        )
    );
    check_audit_marks(conn, session_id);
    assert_eq!(
        0,
        count(
            conn,
            "SELECT COUNT(*) FROM llm_batch_result b JOIN decision d ON d.item_id = b.item_id
             WHERE b.session_id = ?1 AND b.outcome IN ('review', 'rejected', 'error') AND d.state != 'indeterminate'",
            [session_id]
        )
    );
}

/// A finished session: every item has exactly one outcome.
/// An audit sample's review items are of accepted or rejected items.
fn check_audit_marks(conn: &Connection, session_id: &str) {
    assert_eq!(
        0,
        count(
            conn,
            "SELECT COUNT(*) FROM review_item r JOIN llm_batch_result b
                 ON b.session_id = r.session_id AND b.item_id = r.item_id
             WHERE r.session_id = ?1 AND r.audit = 1 AND b.outcome NOT IN ('accepted', 'rejected')",
            [session_id]
        )
    );
}

pub fn check_complete(conn: &Connection, session_id: &str) {
    check_invariants(conn, session_id);
    let (total, processed, state): (i64, i64, String) = conn
        .query_row(
            "SELECT total_count, processed_count, state FROM llm_batch_session WHERE session_id = ?1",
            [session_id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!(total, processed, "every item processed");
    assert_eq!(state, "completed");
}

/// Poll `f` every 25 ms until it gives a value; panic naming `what` after
/// `timeout`.
pub async fn poll<T>(
    what: &str,
    timeout: std::time::Duration,
    mut f: impl FnMut() -> Option<T>,
) -> T {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if std::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
}

/// The id of the newest session, once one exists.
pub async fn session_created(ws: &Workspace) -> String {
    let conn = ws.conn();
    poll(
        "the session to be created",
        std::time::Duration::from_secs(20),
        || {
            docket::ledger::store::latest_session(&db(&conn))
                .ok()
                .flatten()
        },
    )
    .await
}

/// The `stop_reason` of the paused session, once a session is paused with
/// one; a panic naming `what` after `timeout`.
pub async fn paused_reason(conn: &Connection, what: &str, timeout: std::time::Duration) -> String {
    poll(what, timeout, || {
        conn.query_row(
            "SELECT stop_reason FROM llm_batch_session WHERE state = 'paused'",
            [],
            |r| r.get::<_, Option<String>>(0),
        )
        .ok()
        .flatten()
    })
    .await
}

/// The engine's gauges as last written with its heartbeat.
pub fn live_gauges(conn: &Connection, session_id: &str) -> Option<docket::watch::LiveGauges> {
    let json: Option<String> = conn
        .query_row(
            "SELECT live_json FROM llm_batch_session WHERE session_id = ?1",
            [session_id],
            |r| r.get(0),
        )
        .ok()
        .flatten();
    json.map(|j| serde_json::from_str(&j).unwrap_or_else(|e| panic!("live_json {j}: {e}")))
}

/// One row of session_event.
#[derive(Debug, Clone, PartialEq)]
pub struct EventRow {
    pub level: String,
    pub kind: String,
    pub message: String,
    pub actor: Option<String>,
    pub at: f64,
}

/// A session's events, oldest first.
pub fn events(conn: &Connection, session_id: &str) -> Vec<EventRow> {
    conn.prepare("SELECT level, kind, message, actor, at FROM session_event WHERE session_id = ?1 ORDER BY event_id")
        .unwrap()
        .query_map([session_id], |r| {
            Ok(EventRow {
                level: r.get(0)?,
                kind: r.get(1)?,
                message: r.get(2)?,
                actor: r.get(3)?,
                at: r.get(4)?,
            })
        })
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// Events of one kind.
pub fn events_of(conn: &Connection, session_id: &str, kind: &str) -> Vec<EventRow> {
    events(conn, session_id)
        .into_iter()
        .filter(|e| e.kind == kind)
        .collect()
}

/// A reporter that keeps the engine's lines and the session ids it was told
/// about (with how many lines had been printed by then).
#[derive(Default)]
pub struct Recorder {
    pub lines: Lines,
    pub sessions: Mutex<Vec<(String, usize)>>,
}

impl Reporter for Recorder {
    fn line(&self, text: &str) {
        self.lines.line(text);
    }
    fn session_started(&self, session_id: &str) {
        let n = self.lines.0.lock().unwrap().len();
        self.sessions
            .lock()
            .unwrap()
            .push((session_id.to_string(), n));
    }
}

/// The same ledger file through docket's own connection type (for calling
/// `docket::ledger::store` functions beside a test's rusqlite connection).
pub fn db(conn: &Connection) -> docket::ledger::db::Connection {
    let path = conn.path().expect("a ledger file");
    docket::ledger::db::Connection::Sqlite(Connection::open(path).expect("reopen the ledger"))
}

/// Everything a finished command printed, standard output then error.
pub fn said(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Every file under `dir`, at any depth (none for a folder that is not there).
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(files_under(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}
