//! Batch mode survives crashes and stops, end to end: the real binary runs
//! `batch-adjudicate` with `[stages.batch] mode = "batch"` against
//! `docket mock-provider` running as its own process, and is killed with
//! SIGKILL (between the batch create and its record, and after the record),
//! interrupted with SIGINT off a terminal, or cancelled from another process.
//! Every resume collects the open batch without paying for it twice: one
//! batch at the provider, every item processed once, nothing ambiguous.
//! Providers without a Batch API fall back to synchronous requests, the
//! Anthropic and Gemini Batch APIs run through the whole engine, and the API
//! key (a canary) is written nowhere.

use docket_testkit as support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rusqlite::Connection;
use serde_json::Value;
use support::procs::{Mock, Proc, bin};
use support::{Workspace, check_complete, count, events_of};

// Not `sk-` shaped: the generic redaction of key-like words must not be
// what keeps it out; it must never be written at all.
const CANARY: &str = "canaryKEYb47c19e2d05f83";
const KEY_ENV: &str = "DOCKET_TEST_KEY";
const ITEMS: usize = 12;
/// The longest any one docket child may take.
const RUN_TIMEOUT: Duration = Duration::from_secs(40);
/// The longest the test waits for a state it is about to act on.
const STATE_TIMEOUT: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------- workspace

/// A workspace from `docket init` with ITEMS demo items, its provider block
/// and batch settings replaced, and a private HOME for the logs.
struct Ws {
    ws: Workspace,
    home: tempfile::TempDir,
}

/// Lifecycle of a batch at the mock: quick unless the test needs it long.
const QUICK: [&str; 6] = [
    "--batch-validating-ms",
    "100",
    "--batch-running-ms",
    "400",
    "--batch-finalizing-ms",
    "100",
];

fn provider_block(kind: &str, mock: &Mock) -> String {
    let base = mock.base();
    let (model, url) = match kind {
        "openai" => ("gpt-4o-mini", format!("{base}/v1")),
        "anthropic" => ("claude-haiku-4-5", base.clone()),
        "gemini" => ("gemini-2.5-flash", base.clone()),
        "openrouter" => ("openai/gpt-4o-mini", format!("{base}/api/v1")),
        other => panic!("no block for {other}"),
    };
    format!(
        "[providers.main]\nkind = \"{kind}\"\nmodel = \"{model}\"\nbase_url = \"{url}\"\n\
         api_key_env = \"{KEY_ENV}\"\nrequests_per_minute = 0\ntokens_per_minute = 0\n\
         max_concurrency = 8\nrequest_timeout_secs = 30\nmax_transport_attempts = 3\n"
    )
}

impl Ws {
    fn new(kind: &str, mock: &Mock) -> Ws {
        Ws::with_items(kind, mock, ITEMS, 1.0)
    }

    /// `items` demo items, a batch cut `max_wait` seconds after its first
    /// request waited (or sooner, by another trigger).
    fn with_items(kind: &str, mock: &Mock, items: usize, max_wait: f64) -> Ws {
        let dir = tempfile::tempdir().expect("tempdir");
        docket::workspace::init(dir.path(), false).expect("init");
        let toml = format!(
            r#"[job]
name = "batch-crash"

{provider}
[[stages]]
name = "adjudicate"
provider = "main"
template = "prompts/adjudicate.j2"
system_prompt = "prompts/system.txt"
max_tokens = 200
max_attempts = 3

[stages.batch]
mode = "batch"
max_wait_secs = {max_wait}
poll_interval_secs = 0.2

[stages.gate]
kind = "json_schema"
schema = "schemas/adjudicate.schema.json"

[routing]
auto_accept_threshold = 0.85
review_threshold = 0.60
"#,
            provider = provider_block(kind, mock)
        );
        std::fs::write(dir.path().join("docket.toml"), toml).unwrap();
        let ws = Workspace { dir };
        support::import_demo_items(&ws, items);
        Ws {
            ws,
            home: tempfile::tempdir().expect("home"),
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(bin());
        c.arg("--workspace")
            .arg(self.ws.path())
            .args(args)
            .env("HOME", self.home.path())
            .env("XDG_DATA_HOME", self.home.path().join("data"))
            .env("XDG_STATE_HOME", self.home.path().join("state"))
            .env(KEY_ENV, CANARY)
            .env("DOCKET_LOG", "trace")
            .env("NO_COLOR", "1")
            .env_remove("DOCKET_WORKSPACE")
            .stdin(Stdio::null());
        c
    }

    /// Start `docket ARGS` with stdin not a terminal; output into a file
    /// named `name` in HOME.
    fn spawn(&self, name: &str, args: &[&str]) -> Proc {
        Proc::start(
            self.command(args),
            format!("docket {}", args.join(" ")),
            self.home.path().join(format!("{name}.out")),
        )
    }

    /// Run `docket ARGS` to its end (within RUN_TIMEOUT).
    fn run(&self, name: &str, args: &[&str]) -> (Option<i32>, String) {
        self.spawn(name, args).wait(RUN_TIMEOUT)
    }

    fn ro(&self) -> Option<Connection> {
        docket::ledger::open_read_only(&self.ws.ledger()).ok()
    }

    fn conn(&self) -> Connection {
        self.ws.conn()
    }
}

/// One provider_batch row.
#[derive(Debug, Clone)]
struct BatchRow {
    session_id: String,
    state: String,
    provider_batch_id: Option<String>,
    provider_kind: String,
    cancel_requested_at: Option<f64>,
}

fn batch_rows(conn: &Connection) -> Vec<BatchRow> {
    let Ok(mut st) = conn.prepare(
        "SELECT session_id, state, provider_batch_id, provider_kind, cancel_requested_at
         FROM provider_batch ORDER BY batch_id",
    ) else {
        return Vec::new();
    };
    st.query_map([], |r| {
        Ok(BatchRow {
            session_id: r.get(0)?,
            state: r.get(1)?,
            provider_batch_id: r.get(2)?,
            provider_kind: r.get(3)?,
            cancel_requested_at: r.get(4)?,
        })
    })
    .map(|rows| rows.filter_map(Result::ok).collect())
    .unwrap_or_default()
}

/// Poll the ledger (read-only) every 25 ms until `f` gives a value; fail if
/// the child ends first or after STATE_TIMEOUT.
fn wait_for<T>(
    what: &str,
    ws: &Ws,
    child: &mut Proc,
    mut f: impl FnMut(&[BatchRow]) -> Option<T>,
) -> T {
    let deadline = Instant::now() + STATE_TIMEOUT;
    loop {
        if let Some(conn) = ws.ro()
            && let Some(v) = f(&batch_rows(&conn))
        {
            return v;
        }
        child.assert_running();
        if Instant::now() >= deadline {
            panic!(
                "timed out waiting for {what}; batches {:?}. Output:\n{}",
                ws.ro().map(|c| batch_rows(&c)),
                child.output()
            );
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// A batch row the provider knows (id recorded) and is still working on.
fn running_batch(rows: &[BatchRow]) -> Option<BatchRow> {
    rows.iter()
        .find(|r| {
            r.provider_batch_id.is_some()
                && matches!(r.state.as_str(), "validating" | "in_progress")
        })
        .cloned()
}

/// Every item of the session has exactly one result, every request exactly
/// one answered attempt, and no attempt is ambiguous.
fn check_each_once(conn: &Connection, sid: &str) {
    check_each_once_of(conn, sid, ITEMS);
}

/// `check_each_once` for a session of `items` items.
fn check_each_once_of(conn: &Connection, sid: &str, items: usize) {
    check_complete(conn, sid);
    assert_eq!(
        items as i64,
        count(
            conn,
            "SELECT COUNT(*) FROM session_item WHERE session_id = ?1",
            [sid]
        )
    );
    assert_eq!(
        0,
        count(
            conn,
            "SELECT COUNT(*) FROM session_item s WHERE s.session_id = ?1 AND
               (SELECT COUNT(*) FROM llm_batch_result r
                 WHERE r.session_id = s.session_id AND r.item_id = s.item_id) != 1",
            [sid]
        ),
        "an item without exactly one result"
    );
    assert_eq!(
        0,
        count(
            conn,
            "SELECT COUNT(*) FROM session_item s WHERE s.session_id = ?1 AND
               (SELECT COUNT(*) FROM llm_messages m
                 WHERE m.request_id = s.request_id AND m.state = 'answered') != 1",
            [sid]
        ),
        "a request without exactly one answered attempt"
    );
    assert_eq!(
        0,
        count(
            conn,
            "SELECT COUNT(*) FROM llm_messages WHERE state = 'ambiguous'",
            []
        ),
        "an ambiguous attempt"
    );
    let ambiguous = count(
        conn,
        "SELECT ambiguous_count FROM llm_batch_session WHERE session_id = ?1",
        [sid],
    );
    assert_eq!(ambiguous, 0, "the session counted ambiguous attempts");
}

/// The canary key is in no output, export, ledger byte or log file.
fn check_no_key(ws: &Ws, sid: &str, mut haystack: String) {
    for what in ["decisions", "results", "requests"] {
        let (code, out) = ws.run(
            &format!("export-{what}"),
            &["export", "--what", what, "--format", "jsonl"],
        );
        assert_eq!(code, Some(0), "export {what}:\n{out}");
        assert!(!out.trim().is_empty(), "export {what} is empty");
        haystack.push_str(&out);
    }
    let (code, out) = ws.run("results", &["batch-results", sid, "--format", "json"]);
    assert_eq!(code, Some(0), "batch-results:\n{out}");
    haystack.push_str(&out);
    assert!(!haystack.contains(CANARY), "the key is in the output");
    let mut files = vec![
        ws.ws.ledger(),
        ws.ws.path().join("docket.sqlite-wal"),
        ws.ws.path().join("docket.sqlite-shm"),
    ];
    files.extend(support::files_under(ws.ws.path()));
    files.extend(support::files_under(ws.home.path()));
    let mut logs = 0;
    for f in files {
        if let Ok(bytes) = std::fs::read(&f) {
            if f.extension().is_some_and(|e| e == "log") {
                logs += 1;
            }
            assert!(
                !bytes.windows(CANARY.len()).any(|w| w == CANARY.as_bytes()),
                "the key is in {}",
                f.display()
            );
        }
    }
    assert!(logs > 0, "the log file was searched too");
}

fn session_of(rows: &[BatchRow]) -> String {
    rows.first().expect("a batch row").session_id.clone()
}

// ---------------------------------------------------------------- tests

/// SIGKILL while the create is made at the provider but not yet answered:
/// the resume finds the batch by its tag and adopts it; nothing is sent
/// twice.
#[test]
fn kill_between_create_and_record_adopts_the_batch() {
    let _serial = support::serial();
    let mut flags = vec!["--batch-create-delay-ms", "4000"];
    flags.extend(QUICK);
    let mock = Mock::start(&flags);
    let ws = Ws::new("openai", &mock);
    let mut run = ws.spawn("run", &["batch-adjudicate", "--yes", "--headless"]);
    let sid = wait_for("a batch created but not answered", &ws, &mut run, |rows| {
        (rows.len() == 1 && rows[0].state == "submitting" && mock.stat("batches_created") == 1)
            .then(|| session_of(rows))
    });
    let first = run.kill9();
    let rows = batch_rows(&ws.ro().expect("ledger"));
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].state, "submitting", "{rows:?}");
    assert_eq!(
        rows[0].provider_batch_id, None,
        "the create answer cannot have been recorded yet"
    );
    assert_eq!(
        count(
            &ws.conn(),
            "SELECT COUNT(*) FROM llm_messages WHERE state = 'sent'",
            []
        ),
        ITEMS as i64,
        "every line recorded 'sent' before the upload"
    );

    mock.set("batch_create_delay_ms", Value::from(0));
    let (code, out) = ws.run(
        "resume",
        &["batch-adjudicate", "--resume", &sid, "--yes", "--headless"],
    );
    assert_eq!(code, Some(0), "resume:\n{out}");
    assert_eq!(
        mock.stat("batches_created"),
        1,
        "a second batch was created:\n{out}"
    );
    let conn = ws.conn();
    let rows = batch_rows(&conn);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].state, "ingested", "{rows:?}");
    let created: Vec<String> = mock
        .log()
        .iter()
        .filter(|e| e["outcome"] == "batch_created")
        .filter_map(|e| e["batch_id"].as_str().map(String::from))
        .collect();
    assert_eq!(
        rows[0].provider_batch_id.as_ref(),
        created.first(),
        "the recorded id is the one batch the mock made"
    );
    check_each_once(&conn, &sid);
    assert!(
        !events_of(&conn, &sid, "batch_found").is_empty(),
        "no batch_found event: {:?}",
        support::events(&conn, &sid)
    );
    assert!(
        events_of(&conn, &sid, "batch_resubmitted").is_empty(),
        "resubmitted"
    );
    check_no_key(&ws, &sid, format!("{first}{out}"));
}

/// SIGKILL after the provider id was recorded: the resume re-attaches and
/// polls the batch.
#[test]
fn kill_after_record_reattaches_the_batch() {
    let _serial = support::serial();
    let mock = Mock::start(&[
        "--batch-validating-ms",
        "100",
        "--batch-running-ms",
        "3000",
        "--batch-finalizing-ms",
        "100",
    ]);
    let ws = Ws::new("openai", &mock);
    let mut run = ws.spawn("run", &["batch-adjudicate", "--yes", "--headless"]);
    let batch = wait_for(
        "a batch running at the provider",
        &ws,
        &mut run,
        running_batch,
    );
    let first = run.kill9();
    let sid = batch.session_id.clone();
    assert_eq!(mock.stat("batches_completed"), 0, "killed too late");

    let (code, out) = ws.run(
        "resume",
        &["batch-adjudicate", "--resume", &sid, "--yes", "--headless"],
    );
    assert_eq!(code, Some(0), "resume:\n{out}");
    assert!(
        !out.contains("other worker(s)"),
        "the killed worker is taken for a live one:\n{out}"
    );
    assert!(
        out.contains("Re-attached provider batch"),
        "the resume does not say it re-attached the batch:\n{out}"
    );
    assert!(
        out.contains(batch.provider_batch_id.as_deref().unwrap()),
        "the resume names another batch:\n{out}"
    );
    assert_eq!(mock.stat("batches_created"), 1, "{out}");
    let conn = ws.conn();
    let rows = batch_rows(&conn);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].state, "ingested");
    assert_eq!(rows[0].provider_batch_id, batch.provider_batch_id);
    check_each_once(&conn, &sid);
    check_no_key(&ws, &sid, format!("{first}{out}"));
}

/// Start a batch run and wait until a batch has lines on record and no
/// provider id: it is forming (or being uploaded). The run, and its session.
fn run_until_a_batch_forms(ws: &Ws) -> (Proc, String) {
    let mut run = ws.spawn("run", &["batch-adjudicate", "--yes", "--headless"]);
    let forming = |_: &[BatchRow]| {
        ws.ro()?
            .query_row(
                "SELECT session_id FROM provider_batch WHERE provider_batch_id IS NULL AND request_count > 0",
                [],
                |r| r.get::<_, String>(0),
            )
            .ok()
    };
    let sid = wait_for("a batch with lines on record", ws, &mut run, forming);
    (run, sid)
}

/// kill -9 while a batch forms (fault-matrix row C1, killed after the
/// intent is on disk and before the upload): lines are recorded a piece at
/// a time as they come, so the ledger holds part of a batch that never
/// reached the provider. The resume finds nothing at the provider, submits
/// those lines (the same custom ids, once) and takes the other items in a
/// new batch: every item one result, no line run twice.
#[test]
fn kill_while_a_batch_forms_submits_its_recorded_lines_on_resume() {
    let _serial = support::serial();
    // More than one piece of lines (2,000) before the cut: the batch is cut
    // only once the feed has handed out every item.
    const MANY: usize = 4_500;
    let mock = Mock::start(&QUICK);
    let ws = Ws::with_items("openai", &mock, MANY, 120.0);
    let (mut run, sid) = run_until_a_batch_forms(&ws);
    let first = run.kill9();
    let conn = ws.conn();
    let recorded = count(&conn, "SELECT COUNT(*) FROM provider_batch_item", []);
    assert!(
        recorded > 0 && recorded < MANY as i64,
        "killed while the batch formed: {recorded} of {MANY} lines on record"
    );
    assert_eq!(
        mock.stat("batches_created"),
        0,
        "nothing reached the provider"
    );
    drop(conn);

    let (code, out) = ws.run(
        "resume",
        &["batch-adjudicate", "--resume", &sid, "--yes", "--headless"],
    );
    assert_eq!(code, Some(0), "resume:\n{out}");
    assert!(
        out.contains(&format!(": {recorded} requests, provider id")),
        "the resume does not say it submits the {recorded} recorded lines:\n{out}"
    );
    let conn = ws.conn();
    let rows = batch_rows(&conn);
    assert!(
        rows.len() >= 2 && rows.iter().all(|r| r.state == "ingested"),
        "{rows:?}"
    );
    check_each_once_of(&conn, &sid, MANY);
    // The mock ran every line once: one line per item, none twice.
    let run_lines = mock.stat("batch_lines_ok") + mock.stat("batch_lines_failed");
    assert_eq!(run_lines, MANY as u64, "lines run at the provider");
    check_no_key(&ws, &sid, format!("{first}{out}"));
}

/// `docket ARGS` on `ITEMS` items in OpenAI batch mode against a mock whose
/// batches run 3 s, once its batch is running at the provider: the mock,
/// the workspace, the run and its session.
fn a_batch_running(args: &[&str]) -> (Mock, Ws, Proc, String) {
    let mock = Mock::start(&[
        "--batch-validating-ms",
        "100",
        "--batch-running-ms",
        "3000",
        "--batch-finalizing-ms",
        "100",
    ]);
    let ws = Ws::new("openai", &mock);
    let mut run = ws.spawn("run", args);
    let batch = wait_for(
        "a batch running at the provider",
        &ws,
        &mut run,
        running_batch,
    );
    let sid = batch.session_id.clone();
    (mock, ws, run, sid)
}

/// SIGINT off a terminal: the run stops without asking, leaves the batch
/// to the provider, says so with the resume command; a resume collects it.
#[test]
fn sigint_off_terminal_leaves_the_batch_for_a_resume() {
    let _serial = support::serial();
    let (mock, ws, mut run, sid) = a_batch_running(&["batch-adjudicate", "--yes", "--headless"]);
    let st = Command::new("kill")
        .args(["-INT", &run.pid().to_string()])
        .status()
        .expect("kill -INT");
    assert!(st.success());
    let (code, out) = run.wait(Duration::from_secs(20));
    assert_eq!(
        code,
        Some(130),
        "a stopped run ends cancelled (RunEnd::Cancelled):\n{out}"
    );
    assert!(
        out.contains("The provider keeps working on it"),
        "no word that the provider keeps the batch:\n{out}"
    );
    assert!(
        out.contains(&format!("docket batch-adjudicate --resume {sid}")),
        "no resume command:\n{out}"
    );
    assert!(
        !out.contains("Cancel them too"),
        "asked a question off a terminal:\n{out}"
    );
    assert_eq!(mock.stat("batches_cancelled"), 0, "the batch was cancelled");
    let rows = batch_rows(&ws.ro().unwrap());
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_ne!(rows[0].state, "ingested", "{rows:?}");
    assert_eq!(rows[0].cancel_requested_at, None);

    let (code, out2) = ws.run(
        "resume",
        &["batch-adjudicate", "--resume", &sid, "--yes", "--headless"],
    );
    assert_eq!(code, Some(0), "resume:\n{out2}");
    assert_eq!(mock.stat("batches_created"), 1, "{out2}");
    assert_eq!(mock.stat("batches_cancelled"), 0);
    let conn = ws.conn();
    let rows = batch_rows(&conn);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].state, "ingested");
    check_each_once(&conn, &sid);
}

/// `docket cancel SESSION` from another process: the engine cancels the
/// provider batch and the run ends cancelled.
#[test]
fn cancel_from_another_process_cancels_the_provider_batch() {
    let _serial = support::serial();
    let mock = Mock::start(&[
        "--batch-validating-ms",
        "100",
        "--batch-running-ms",
        "4000",
        "--batch-finalizing-ms",
        "100",
        "--batch-cancelling-ms",
        "200",
    ]);
    let ws = Ws::new("openai", &mock);
    let mut run = ws.spawn("run", &["batch-adjudicate", "--yes", "--headless"]);
    let batch = wait_for(
        "a batch running at the provider",
        &ws,
        &mut run,
        running_batch,
    );
    let sid = batch.session_id.clone();
    let (code, out) = ws.run("cancel", &["cancel", &sid]);
    assert_eq!(code, Some(0), "docket cancel:\n{out}");
    let (code, out) = run.wait(Duration::from_secs(20));
    assert_eq!(code, Some(130), "the run ends cancelled:\n{out}");
    assert!(
        out.contains("Cancelling 1 provider batch"),
        "no word of cancelling the batch:\n{out}"
    );
    assert_eq!(
        mock.stat("batches_cancelled"),
        1,
        "the provider batch was not cancelled:\n{out}"
    );
    assert_eq!(mock.stat("batches_created"), 1);
    let conn = ws.conn();
    let rows = batch_rows(&conn);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(
        rows[0].cancel_requested_at.is_some(),
        "no cancel_requested_at: {rows:?}"
    );
    let state: String = conn
        .query_row(
            "SELECT state FROM llm_batch_session WHERE session_id = ?1",
            [&sid],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(state, "cancelled");
    assert_eq!(
        0,
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_messages WHERE state = 'ambiguous'",
            []
        )
    );
    support::check_invariants(&conn, &sid);
}

/// A cancel while a batch forms: its lines are on record but it never
/// reached the provider, so nothing is cancelled there; the batch is ended
/// as never run (not billed) and the session ends cancelled.
#[test]
fn cancel_while_a_batch_forms_ends_it_unsent() {
    let _serial = support::serial();
    // Enough items that the batch is still forming when the cancel lands
    // (the run reads controls every 400 ms).
    const MANY: usize = 12_000;
    let mock = Mock::start(&QUICK);
    let ws = Ws::with_items("openai", &mock, MANY, 120.0);
    let (mut run, sid) = run_until_a_batch_forms(&ws);
    let (code, out) = ws.run("cancel", &["cancel", &sid]);
    assert_eq!(code, Some(0), "docket cancel:\n{out}");
    let (code, out) = run.wait(Duration::from_secs(30));
    assert_eq!(code, Some(130), "the run ends cancelled:\n{out}");
    assert_eq!(
        mock.stat("batches_created"),
        0,
        "a batch reached the provider:\n{out}"
    );
    let conn = ws.conn();
    let (state, message, recorded): (String, String, i64) = conn
        .query_row(
            "SELECT state, error_message, request_count FROM provider_batch",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    // Ended (its lines answered as never run), then finished with.
    assert_eq!(state, "ingested");
    assert!(message.contains("never run, not billed"), "{message}");
    assert!(
        recorded > 0 && recorded < MANY as i64,
        "{recorded} lines on record"
    );
    assert_eq!(
        0,
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_messages WHERE state = 'sent'",
            []
        ),
        "a line still waits"
    );
    let session: String = conn
        .query_row(
            "SELECT state FROM llm_batch_session WHERE session_id = ?1",
            [&sid],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(session, "cancelled");
    support::check_invariants(&conn, &sid);
}

/// OpenRouter has no Batch API: `mode = "batch"` runs synchronously, says
/// so, and makes no batch.
#[test]
fn openrouter_batch_mode_is_simulated() {
    let _serial = support::serial();
    let mock = Mock::start(&QUICK);
    let ws = Ws::new("openrouter", &mock);
    let (code, out) = ws.run("run", &["batch-adjudicate", "--yes", "--headless"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("simulated batching"),
        "no note about simulated batching:\n{out}"
    );
    let stats = mock.stats();
    assert_eq!(stats["batches_created"], 0, "{stats}");
    assert_eq!(stats["files_uploaded"], 0, "{stats}");
    assert!(
        stats["ok"].as_u64().unwrap() >= ITEMS as u64,
        "synchronous answers: {stats}"
    );
    assert!(
        mock.log().iter().all(|e| e["provider"] == "openrouter"),
        "a request went elsewhere than the OpenRouter route"
    );
    let conn = ws.conn();
    let sid = docket::ledger::store::latest_session(&support::db(&conn))
        .unwrap()
        .expect("a session");
    assert!(batch_rows(&conn).is_empty(), "a provider_batch row");
    assert_eq!(
        count(&conn, "SELECT COUNT(*) FROM provider_batch", []),
        0,
        "provider_batch rows"
    );
    assert_eq!(events_of(&conn, &sid, "simulated_batching").len(), 1);
    check_each_once(&conn, &sid);
    check_no_key(&ws, &sid, out);
}

/// A whole run through `kind`'s Batch API at the mock: one batch, every
/// item once, the key nowhere.
fn batch_api_end_to_end(kind: &str) {
    let mock = Mock::start(&QUICK);
    let ws = Ws::new(kind, &mock);
    let (code, out) = ws.run("run", &["batch-adjudicate", "--yes", "--headless"]);
    assert_eq!(code, Some(0), "{kind}:\n{out}");
    let stats = mock.stats();
    assert_eq!(stats["batches_created"], 1, "{kind}: {stats}\n{out}");
    assert_eq!(stats["batches_completed"], 1, "{kind}: {stats}");
    assert_eq!(stats["batch_lines_ok"], ITEMS as u64, "{kind}: {stats}");
    assert_eq!(
        stats["requests"], 0,
        "{kind}: synchronous requests: {stats}"
    );
    let log = mock.log();
    let creates: Vec<&Value> = log
        .iter()
        .filter(|e| e["outcome"] == "batch_created")
        .collect();
    assert_eq!(creates.len(), 1, "{kind}: {creates:?}");
    assert_eq!(
        creates[0]["provider"], kind,
        "{kind}: the batch went to another API: {creates:?}"
    );
    let conn = ws.conn();
    let sid = docket::ledger::store::latest_session(&support::db(&conn))
        .unwrap()
        .expect("a session");
    let rows = batch_rows(&conn);
    assert_eq!(rows.len(), 1, "{kind}: {rows:?}");
    assert_eq!(rows[0].state, "ingested", "{kind}: {rows:?}");
    assert_eq!(rows[0].provider_kind, kind, "{kind}: {rows:?}");
    assert!(rows[0].provider_batch_id.is_some());
    check_each_once(&conn, &sid);
    check_no_key(&ws, &sid, out);
}

#[test]
fn anthropic_batch_api_end_to_end() {
    let _serial = support::serial();
    batch_api_end_to_end("anthropic");
}

#[test]
fn gemini_batch_api_end_to_end() {
    let _serial = support::serial();
    batch_api_end_to_end("gemini");
}

/// `docket cancel SESSION` when no process runs the session (it was
/// stopped, its batch left at the provider): the command itself cancels the
/// provider batch, and a resume collects what it finished and sends the
/// rest again.
#[test]
fn cancel_of_an_idle_session_cancels_its_provider_batch() {
    let _serial = support::serial();
    // Long enough that the batch is still running when the cancel comes,
    // even on a loaded machine (else nothing is left to send again).
    let mock = Mock::start(&[
        "--batch-validating-ms",
        "100",
        "--batch-running-ms",
        "12000",
        "--batch-finalizing-ms",
        "100",
        "--batch-cancelling-ms",
        "200",
    ]);
    let ws = Ws::new("openai", &mock);
    let mut run = ws.spawn("run", &["batch-adjudicate", "--yes", "--headless"]);
    let batch = wait_for(
        "a batch running at the provider",
        &ws,
        &mut run,
        running_batch,
    );
    let sid = batch.session_id.clone();
    let st = Command::new("kill")
        .args(["-INT", &run.pid().to_string()])
        .status()
        .expect("kill -INT");
    assert!(st.success());
    let (code, out) = run.wait(Duration::from_secs(20));
    assert_eq!(code, Some(130), "{out}");
    assert_eq!(mock.stat("batches_cancelled"), 0, "stopped, not cancelled");

    let (code, out) = ws.run("cancel", &["cancel", &sid]);
    assert_eq!(code, Some(0), "cancel:\n{out}");
    assert!(
        out.contains("it is not running now"),
        "the cancel should see that nothing runs the session:\n{out}"
    );
    assert!(
        out.contains("cancelled at the provider"),
        "the cancel does not say it cancelled the provider batch:\n{out}"
    );
    // The mock counts a batch cancelled once its cancelling state ends.
    let deadline = Instant::now() + STATE_TIMEOUT;
    while mock.stat("batches_cancelled") == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(mock.stat("batches_cancelled"), 1, "{out}");
    let rows = batch_rows(&ws.ro().unwrap());
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(rows[0].cancel_requested_at.is_some(), "{rows:?}");
    // Cancelling again is harmless: idempotent at the provider.
    let (code, out2) = ws.run("cancel again", &["cancel", &sid]);
    assert_eq!(code, Some(0), "{out2}");
    assert_eq!(mock.stat("batches_cancelled"), 1, "{out2}");
    assert_eq!(mock.stat("batches_created"), 1, "{out2}");

    // The resume collects what the cancelled batch finished; the lines it
    // never ran go to a new batch. Every item once, nothing ambiguous.
    let (code, out3) = ws.run(
        "resume",
        &["batch-adjudicate", "--resume", &sid, "--yes", "--headless"],
    );
    assert_eq!(code, Some(0), "resume:\n{out3}");
    assert_eq!(mock.stat("batches_cancelled"), 1, "{out3}");
    assert_eq!(mock.stat("batches_created"), 2, "{out3}");
    let conn = ws.conn();
    let rows = batch_rows(&conn);
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(rows.iter().all(|r| r.state == "ingested"), "{rows:?}");
    check_each_once(&conn, &sid);
    check_no_key(&ws, &sid, format!("{out}{out2}{out3}"));
}

/// Rows B8 and X1: the session's snapshot keeps the key's fingerprint,
/// never the key. A resume under another key while a provider batch is
/// open is refused, naming the variable and both fingerprints (another key
/// may not see the batch, which would look failed); the batch is left as it
/// is, and the resume with the first key collects it.
#[test]
fn b8_a_resume_with_another_key_while_a_batch_is_open_is_refused() {
    let _serial = support::serial();
    let (mock, ws, mut run, sid) = a_batch_running(&["batch-adjudicate", "--yes", "--headless"]);
    run.kill9();
    let snapshot: String = ws
        .conn()
        .query_row(
            "SELECT config_snapshot_json FROM llm_batch_session WHERE session_id = ?1",
            [&sid],
            |r| r.get(0),
        )
        .unwrap();
    let snap: serde_json::Value = serde_json::from_str(&snapshot).unwrap();
    let fingerprint = format!(
        "sha256:{}",
        &docket::cost::sha256_hex(CANARY.as_bytes())[..8]
    );
    assert_eq!(snap["keys"]["main"]["env"], KEY_ENV, "{snap}");
    assert_eq!(
        snap["keys"]["main"]["fingerprint"],
        fingerprint.as_str(),
        "{snap}"
    );
    assert!(!snapshot.contains(CANARY));

    let other = "sk-another-key-0000";
    let mut cmd = ws.command(&["batch-adjudicate", "--resume", &sid, "--yes", "--headless"]);
    cmd.env(KEY_ENV, other);
    let (code, out) = Proc::start(
        cmd,
        "resume with another key".into(),
        ws.home.path().join("other-key.out"),
    )
    .wait(RUN_TIMEOUT);
    let other_fp = format!(
        "sha256:{}",
        &docket::cost::sha256_hex(other.as_bytes())[..8]
    );
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains(KEY_ENV) && out.contains(&fingerprint) && out.contains(&other_fp),
        "{out}"
    );
    assert!(!out.contains(other) && !out.contains(CANARY), "{out}");
    assert_eq!(mock.stat("batches_created"), 1);
    let rows = batch_rows(&ws.conn());
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_ne!(rows[0].state, "ingested", "{rows:?}");

    let (code, out) = ws.run(
        "resume",
        &["batch-adjudicate", "--resume", &sid, "--yes", "--headless"],
    );
    assert_eq!(code, Some(0), "resume:\n{out}");
    assert_eq!(mock.stat("batches_created"), 1, "{out}");
    let conn = ws.conn();
    assert_eq!(batch_rows(&conn)[0].state, "ingested");
    check_each_once(&conn, &sid);
}

/// Row B5: with `--cancel-remote`, a stop (here SIGINT off a terminal, so
/// nothing could be asked) cancels the session's open provider batch,
/// collecting what it finished; without the flag the same stop leaves it
/// running (`sigint_off_terminal_leaves_the_batch_for_a_resume`). A resume
/// then sends the rest and every item ends with one result.
#[test]
fn b5_cancel_remote_cancels_the_provider_batch_on_a_stop() {
    let _serial = support::serial();
    let (mock, ws, mut run, sid) =
        a_batch_running(&["batch-adjudicate", "--yes", "--headless", "--cancel-remote"]);
    let st = Command::new("kill")
        .args(["-INT", &run.pid().to_string()])
        .status()
        .expect("kill -INT");
    assert!(st.success());
    let (code, out) = run.wait(Duration::from_secs(30));
    assert_eq!(code, Some(130), "{out}");
    assert!(out.contains("Cancelling 1 provider batch"), "{out}");
    assert_eq!(mock.stat("batches_cancelled"), 1, "{out}");
    let rows = batch_rows(&ws.conn());
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(rows[0].cancel_requested_at.is_some(), "{rows:?}");

    let (code, out2) = ws.run(
        "resume",
        &["batch-adjudicate", "--resume", &sid, "--yes", "--headless"],
    );
    assert_eq!(code, Some(0), "resume:\n{out2}");
    check_each_once(&ws.conn(), &sid);
}
