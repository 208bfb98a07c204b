//! The real binary: signals, kill -9 and resume, and the errors a user sees.

use docket_testkit as support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use docket::mock::MockConfig;
use support::*;

fn docket(ws: &Workspace, home: &std::path::Path) -> Command {
    support::procs::docket_at(ws.path(), home)
}

fn processed(ws: &Workspace) -> i64 {
    let conn = ws.conn();
    conn.query_row(
        "SELECT COALESCE(MAX(processed_count), 0) FROM llm_batch_session",
        [],
        |r| r.get(0),
    )
    .unwrap_or(0)
}

async fn wait_for_progress(ws: &Workspace, at_least: i64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while processed(ws) < at_least {
        assert!(Instant::now() < deadline, "no progress");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn latest_session(ws: &Workspace) -> String {
    docket::ledger::store::latest_session(&support::db(&ws.conn()))
        .unwrap()
        .expect("a session")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_saves_the_session_and_resume_completes_it() {
    interrupt_then_resume("-INT").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_saves_the_session_like_ctrl_c() {
    interrupt_then_resume("-TERM").await;
}

async fn interrupt_then_resume(signal: &str) {
    let (m, ws) = mocked(latency(40.0, 100.0), 150, |job| {
        job.concurrency = 4;
    })
    .await;
    let home = tempfile::tempdir().unwrap();
    let child = docket(&ws, home.path())
        .args(["batch-adjudicate", "--yes", "--headless"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_progress(&ws, 10).await;
    Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .unwrap();
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(130),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The grace let every in-flight request finish: no attempt is left open.
    assert_eq!(
        0,
        count(
            &ws.conn(),
            "SELECT COUNT(*) FROM llm_messages WHERE state IN ('sent', 'ambiguous')",
            []
        )
    );
    let sid = latest_session(&ws);
    assert!(stdout.contains("Session saved. Resume with:"), "{stdout}");
    assert!(
        stdout.contains(&format!("docket batch-adjudicate --resume {sid}")),
        "{stdout}"
    );
    let conn = ws.conn();
    let state: String = conn
        .query_row("SELECT state FROM llm_batch_session", [], |r| r.get(0))
        .unwrap();
    assert_eq!(state, "cancelled");
    check_invariants(&conn, &sid);
    // Row P1: every item it held is let go at once, not left to its lease.
    assert_eq!(
        0,
        count(
            &conn,
            "SELECT COUNT(*) FROM session_item WHERE lease_until IS NOT NULL",
            []
        ),
        "items still leased after the signal"
    );
    let before = processed(&ws);
    assert!(before < 150);

    let out = docket(&ws, home.path())
        .args(["run", "--yes", "--resume", &sid])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    check_complete(&ws.conn(), &sid);
    // No answered request was sent again.
    let answered_twice = count(
        &ws.conn(),
        "SELECT COUNT(*) FROM (SELECT request_id FROM llm_messages WHERE state = 'answered' GROUP BY request_id HAVING COUNT(*) > 1)",
        [],
    );
    assert_eq!(answered_twice, 0);
    assert_eq!(m.stats().ok, 150);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_run_then_resume_processes_every_item_exactly_once() {
    let (m, ws) = mocked(latency(30.0, 200.0), 200, |job| {
        job.concurrency = 8;
    })
    .await;
    let home = tempfile::tempdir().unwrap();
    let mut child = docket(&ws, home.path())
        .args(["batch-adjudicate", "--yes", "--headless"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_progress(&ws, 40).await;
    child.kill().unwrap(); // SIGKILL: no chance to clean up
    child.wait().unwrap();
    let sid = latest_session(&ws);
    let conn = ws.conn();
    let ok: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok");
    check_invariants(&conn, &sid);
    // Attempts that were in flight at the kill are still 'sent' in the ledger.
    let in_flight_at_kill = count(
        &conn,
        "SELECT COUNT(*) FROM llm_messages WHERE state = 'sent'",
        [],
    );
    drop(conn);

    let out = docket(&ws, home.path())
        .args(["batch-adjudicate", "--yes", "--headless", "--resume", &sid])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    let conn = ws.conn();
    check_complete(&conn, &sid);
    assert_eq!(
        200,
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_batch_result WHERE session_id = ?1",
            [&sid]
        )
    );
    let ambiguous: i64 = conn
        .query_row("SELECT ambiguous_count FROM llm_batch_session", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(
        ambiguous, in_flight_at_kill,
        "every re-sent attempt is counted as ambiguous"
    );

    // The mock's request log against the ledger: every request the mock saw
    // was recorded before it was sent (intent before side effect) ...
    let log = m.log();
    let mut stmt = conn
        .prepare("SELECT state FROM llm_messages WHERE client_request_id = ?1")
        .unwrap();
    let mut sent_per_request = std::collections::HashMap::<i64, i64>::new();
    for entry in &log {
        let id = entry.client_request_id.clone().expect("client request id");
        let state: String = stmt
            .query_row([&id], |r| r.get(0))
            .unwrap_or_else(|_| panic!("{id} sent but not in the ledger"));
        let request_id: i64 = id.rsplit('-').nth(1).unwrap().parse().unwrap();
        if entry.status == 200 {
            *sent_per_request.entry(request_id).or_default() += 1;
            assert!(state == "answered" || state == "ambiguous", "{id}: {state}");
        }
    }
    // ... and a request answered twice by the mock was re-sent only because
    // its first answer never reached the ledger (an ambiguous attempt).
    for (request_id, n) in sent_per_request {
        if n > 1 {
            let amb = count(
                &conn,
                "SELECT COUNT(*) FROM llm_messages WHERE request_id = ?1 AND state = 'ambiguous'",
                [request_id],
            );
            assert_eq!(
                n - 1,
                amb,
                "request {request_id} answered {n} times with {amb} ambiguous attempts"
            );
        }
    }
}

fn run_err(ws: &Workspace, home: &std::path::Path, args: &[&str]) -> (Option<i32>, String) {
    let out = docket(ws, home).args(args).output().unwrap();
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_config_key_missing_template_and_undefined_variable_are_named() {
    let (m, ws) = mocked(MockConfig::default(), 3, |_| {}).await;
    let home = tempfile::tempdir().unwrap();
    let toml_path = ws.path().join("docket.toml");
    let good = std::fs::read_to_string(&toml_path).unwrap();

    // An unknown key: file, line and key.
    std::fs::write(
        &toml_path,
        good.replace("max_attempts = 3", "max_attempts = 3\nmax_atempts = 4"),
    )
    .unwrap();
    let line = good
        .lines()
        .position(|l| l.starts_with("max_attempts"))
        .unwrap()
        + 2;
    let (code, text) = run_err(&ws, home.path(), &["run", "--yes"]);
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("docket.toml")
            && text.contains(&format!("docket.toml:{line}:"))
            && text.contains("max_atempts"),
        "{text}"
    );

    // A value out of range.
    std::fs::write(
        &toml_path,
        good.replace("review_threshold = 0.60", "review_threshold = 1.5"),
    )
    .unwrap();
    let (code, text) = run_err(&ws, home.path(), &["run", "--yes"]);
    assert_eq!(code, Some(2));
    assert!(
        text.contains("routing.review_threshold") && text.contains("out of range"),
        "{text}"
    );
    let line = good
        .lines()
        .position(|l| l.starts_with("review_threshold"))
        .unwrap()
        + 1;
    assert!(text.contains(&format!("docket.toml:{line}")), "{text}");

    // A wrong type.
    std::fs::write(
        &toml_path,
        good.replace("max_concurrency = 16", "max_concurrency = \"lots\""),
    )
    .unwrap();
    let (code, text) = run_err(&ws, home.path(), &["run", "--yes"]);
    assert_eq!(code, Some(2));
    let line = good
        .lines()
        .position(|l| l.starts_with("max_concurrency"))
        .unwrap()
        + 1;
    assert!(
        text.contains(&format!("docket.toml:{line}:"))
            && text.contains("max_concurrency = \"lots\"")
            && text.contains("invalid type"),
        "{text}"
    );

    // A missing template file.
    std::fs::write(
        &toml_path,
        good.replace("prompts/adjudicate.j2", "prompts/nope.j2"),
    )
    .unwrap();
    let (code, text) = run_err(&ws, home.path(), &["run", "--yes"]);
    assert_eq!(code, Some(2));
    assert!(
        text.contains("prompts/nope.j2") && text.contains("cannot be read"),
        "{text}"
    );

    // An undefined template variable: caught before any request is sent.
    std::fs::write(&toml_path, &good).unwrap();
    std::fs::write(
        ws.path().join("prompts/adjudicate.j2"),
        "Entry {{ item.title }}\nby {{ item.singer }}\n",
    )
    .unwrap();
    let (code, text) = run_err(&ws, home.path(), &["run", "--yes"]);
    assert_eq!(code, Some(2));
    assert!(
        text.contains("adjudicate.j2:2")
            && text.contains("undefined")
            && text.contains("chart-000001"),
        "{text}"
    );
    assert_eq!(m.stats().requests, 0);
    assert_eq!(
        count(&ws.conn(), "SELECT COUNT(*) FROM llm_batch_session", []),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_import_rows_are_reported_and_good_rows_kept() {
    let ws = workspace(&Job::new("http://127.0.0.1:9/v1"));
    let home = tempfile::tempdir().unwrap();
    let file = ws.path().join("items/mixed.jsonl");
    std::fs::write(
        &file,
        "{\"id\":\"a\",\"x\":1}\n{\"id\":\"b\",\n{\"x\":2}\n{\"id\":\"c\"}\n",
    )
    .unwrap();
    let (code, text) = run_err(&ws, home.path(), &["import", file.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("mixed.jsonl:2"), "{text}");
    assert!(text.contains("mixed.jsonl:3"), "{text}");
    assert_eq!(count(&ws.conn(), "SELECT COUNT(*) FROM decision", []), 2);
    // Importing again changes nothing.
    let (_, text) = run_err(&ws, home.path(), &["import", file.to_str().unwrap()]);
    assert!(
        text.contains("2 already present") || text.contains("already present"),
        "{text}"
    );
    assert_eq!(count(&ws.conn(), "SELECT COUNT(*) FROM decision", []), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_reaches_no_ledger_log_or_export() {
    let (_m, ws) = mocked(
        MockConfig {
            mode: "normal".into(),
            fail_500: 0.2,
            ..Default::default()
        },
        20,
        |job| {
            job.api_key_env = Some("DOCKET_TEST_KEY");
        },
    )
    .await;
    let home = tempfile::tempdir().unwrap();
    let canary = "sk-canary-7f3a9c2e1d";
    // Without the variable the run refuses before sending.
    let (code, text) = run_err(&ws, home.path(), &["run", "--yes"]);
    assert_eq!(code, Some(2));
    assert!(
        text.contains("DOCKET_TEST_KEY") && text.contains("not set"),
        "{text}"
    );
    assert_eq!(
        count(&ws.conn(), "SELECT COUNT(*) FROM llm_batch_session", []),
        0,
        "refused before a session exists"
    );
    let out = docket(&ws, home.path())
        .env("DOCKET_TEST_KEY", canary)
        .env("DOCKET_LOG", "trace")
        .args(["run", "--yes"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    let sid = latest_session(&ws);
    let mut haystack = stdout + &String::from_utf8_lossy(&out.stderr);
    for what in ["decisions", "results", "requests"] {
        let o = docket(&ws, home.path())
            .args(["export", "--what", what, "--format", "jsonl"])
            .output()
            .unwrap();
        haystack.push_str(&String::from_utf8_lossy(&o.stdout));
    }
    let o = docket(&ws, home.path())
        .args(["batch-results", &sid, "--format", "json"])
        .output()
        .unwrap();
    haystack.push_str(&String::from_utf8_lossy(&o.stdout));
    assert!(!haystack.contains(canary));
    // The ledger file (and its WAL) byte for byte, and every log file.
    let mut files = vec![
        ws.ledger(),
        ws.path().join("docket.sqlite-wal"),
        ws.path().join("docket.sqlite-shm"),
    ];
    for entry in support::files_under(home.path()) {
        files.push(entry);
    }
    for f in files {
        if let Ok(bytes) = std::fs::read(&f) {
            assert!(
                !bytes.windows(canary.len()).any(|w| w == canary.as_bytes()),
                "key found in {}",
                f.display()
            );
        }
    }
    // The snapshot names the variable.
    let snap: String = ws
        .conn()
        .query_row(
            "SELECT config_snapshot_json FROM llm_batch_session",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(snap.contains("DOCKET_TEST_KEY"));
}

#[test]
fn init_then_dry_run_works_in_a_fresh_folder() {
    let dir = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let ws_dir = dir.path().join("ws");
    let out = Command::new(support::procs::bin())
        .env("HOME", home.path())
        .args(["init", ws_dir.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("wrote") && text.contains("docket.toml"),
        "{text}"
    );
    let out = Command::new(support::procs::bin())
        .env("HOME", home.path())
        .env("DOCKET_WORKSPACE", &ws_dir)
        .args([
            "import",
            ws_dir.join("items/sample.jsonl").to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(support::procs::bin())
        .env("HOME", home.path())
        .env("DOCKET_WORKSPACE", &ws_dir)
        .args(["run", "--dry-run"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("50 found") && text.contains("Dry run: nothing was sent"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_session_is_joined_not_run_twice_and_not_planned_twice() {
    let (_m, ws) = mocked(latency(200.0, 300.0), 100, |job| {
        job.concurrency = 2;
    })
    .await;
    let home = tempfile::tempdir().unwrap();
    let child = docket(&ws, home.path())
        .args(["run", "--yes", "--headless", "--limit", "60"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_progress(&ws, 2).await;
    let sid = latest_session(&ws);
    // A new session leaves the live one's items alone. (Items the live
    // session already answered but left undecided may be taken again; the
    // ones it still has to answer may not.)
    let (code, text) = run_err(&ws, home.path(), &["run", "--dry-run"]);
    let done_after = processed(&ws) as u64;
    assert_eq!(code, Some(0), "{text}");
    let found: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("Querying INDETERMINATE decisions... "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("a count");
    assert!(
        (40..=40 + done_after).contains(&found),
        "{found} found, {done_after} done: {text}"
    );
    assert!(
        done_after < 55,
        "the live run must still be going for this check to mean anything"
    );
    // A second process resuming the live session joins it: the two claim
    // items from the ledger and finish the session together, each item
    // answered once.
    let (code, text) = run_err(&ws, home.path(), &["run", "--yes", "--resume", &sid]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("joining them"), "{text}");
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let conn = ws.conn();
    check_complete(&conn, &sid);
    let twice: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM (SELECT request_id FROM llm_messages WHERE state = 'answered'
               GROUP BY request_id HAVING COUNT(*) > 1)",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(twice, 0, "a request answered twice");
}

#[test]
fn mock_provider_command_serves_openai_routes() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new(support::procs::bin())
        .args([
            "mock-provider",
            "--port",
            &port.to_string(),
            "--mode",
            "unauthorized",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut first,
    )
    .unwrap();
    assert!(
        first.contains(&format!("http://127.0.0.1:{port}/v1")),
        "{first}"
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (models, chat) = rt.block_on(async {
        let c = reqwest::Client::new();
        let models = c.get(format!("http://127.0.0.1:{port}/v1/models")).send().await.unwrap().text().await.unwrap();
        let chat = c
            .post(format!("http://127.0.0.1:{port}/v1/chat/completions"))
            .json(&serde_json::json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .unwrap();
        (models, chat.status().as_u16())
    });
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        models.contains("invalid_api_key"),
        "the models list refuses the key too: {models}"
    );
    assert_eq!(chat, 401, "the --mode switch reached the server");
}

/// The estimate and "Continue? [y/N]" on a real terminal (tmux), answered no
/// then yes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_terminal_it_asks_before_spending() {
    let (m, ws) = mocked(MockConfig::default(), 12, |_| {}).await;
    let home = tempfile::tempdir().unwrap();
    let cmd = format!(
        "{} {} --workspace {} batch-adjudicate",
        tmux::env_line([("HOME", home.path().display().to_string())]),
        tmux::sh_quote(support::procs::bin()),
        tmux::sh_quote(&ws.path().display().to_string())
    );
    // Open docket in a fresh terminal and wait for its question.
    let start_at_question = || {
        let pane = tmux::Pane::start("confirm", &cmd, 200, 50);
        let screen = pane.wait_for("Continue? [y/N]", Duration::from_secs(20));
        (pane, screen)
    };
    // Ctrl-C at the question ends docket: nothing created, nothing sent.
    let (pane, _) = start_at_question();
    pane.keys(&["C-c"]);
    pane.wait_text("docket to end after Ctrl-C", Duration::from_secs(10), |s| {
        tmux::exit_code(s).is_some()
    });
    drop(pane);
    assert_eq!(
        count(&ws.conn(), "SELECT COUNT(*) FROM llm_batch_session", []),
        0
    );
    assert_eq!(m.stats().requests, 0);

    for (answer, expect) in [
        ("n", "Not started."),
        ("y", "Results: docket batch-results"),
    ] {
        let (pane, screen) = start_at_question();
        assert!(screen.contains("Estimating cost: ~$"), "{screen}");
        let sessions_before = count(&ws.conn(), "SELECT COUNT(*) FROM llm_batch_session", []);
        assert_eq!(m.stats().requests, 0, "nothing is sent before the answer");
        pane.keys(&[answer, "Enter"]);
        if answer == "y" {
            // On a terminal the run opens the console; once it is done, `q`
            // closes it and the summary follows on the normal screen.
            pane.wait_for("✓ COMPLETED", Duration::from_secs(20));
            pane.keys(&["q"]);
        }
        pane.wait_for(expect, Duration::from_secs(20));
        drop(pane);
        let sessions_after = count(&ws.conn(), "SELECT COUNT(*) FROM llm_batch_session", []);
        if answer == "n" {
            assert_eq!(sessions_after, sessions_before, "declined: no session");
            assert_eq!(m.stats().requests, 0, "declined: nothing sent");
        } else {
            assert_eq!(sessions_after, sessions_before + 1);
            assert_eq!(m.stats().ok, 12);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_controls_from_the_command_line_say_who_asked() {
    let (_m, ws) = mocked(MockConfig::default(), 6, |_| {}).await;
    let home = tempfile::tempdir().unwrap();
    let out = docket(&ws, home.path())
        .args(["run", "--yes", "--headless"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let sid = latest_session(&ws);
    // A completed session takes no controls.
    let (code, text) = run_err(&ws, home.path(), &["pause", &sid]);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("completed"), "{text}");
    // As if its engine had been stopped midway: every control is recorded.
    ws.conn()
        .execute(
            "UPDATE llm_batch_session SET state = 'paused' WHERE session_id = ?1",
            [&sid],
        )
        .unwrap();
    for (args, said, desired) in [
        (vec!["pause", &sid], "asked to pause", "paused"),
        (vec!["resume", &sid], "asked to resume", "running"),
        (
            vec!["stop-at-stage", &sid],
            "asked to stop after stage",
            "running",
        ),
        (vec!["cancel", &sid], "asked to cancel", "cancelled"),
    ] {
        let out = docket(&ws, home.path())
            .args(&args)
            .env("USER", "carol")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {text}");
        assert!(text.contains(said), "{args:?}: {text}");
        let now: String = ws
            .conn()
            .query_row(
                "SELECT desired_state FROM llm_batch_session WHERE session_id = ?1",
                [&sid],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(now, desired, "{args:?}");
    }
    let stop: Option<String> = ws
        .conn()
        .query_row(
            "SELECT stop_after_stage FROM llm_batch_session WHERE session_id = ?1",
            [&sid],
            |r| r.get(0),
        )
        .unwrap();
    assert!(stop.is_some(), "stop-at-stage is in the ledger");
    let by_carol = count(
        &ws.conn(),
        "SELECT COUNT(*) FROM session_event WHERE session_id = ?1 AND actor = 'cli:carol'",
        [&sid],
    );
    assert_eq!(by_carol, 4, "each control is an event naming who asked");
}

#[test]
fn the_console_without_a_terminal_says_what_to_use_instead() {
    let home = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(support::procs::bin())
        .arg("--workspace")
        .arg(dir.path())
        .env("HOME", home.path())
        .env_remove("DOCKET_WORKSPACE")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("needs a terminal"), "{err}");
    assert!(err.contains("--headless"), "{err}");
}

/// A developer's exported `DOCKET_LEDGER_URL` (or `PGPASSWORD`) never reaches
/// the tests: this test binary, started again with both set, finds them
/// cleared before any test runs.
#[test]
fn tests_never_see_the_developers_ledger_settings() {
    const PROBE: &str = "DOCKET_ISOLATION_PROBE";
    if std::env::var_os(PROBE).is_some() {
        assert!(
            support::isolation::ledger_env_cleared(),
            "DOCKET_LEDGER_URL or PGPASSWORD reached a test"
        );
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "tests_never_see_the_developers_ledger_settings",
            "--nocapture",
        ])
        .env(PROBE, "1")
        .env(
            "DOCKET_LEDGER_URL",
            "postgres://someone:secret@127.0.0.1:1/elsewhere",
        )
        .env("PGPASSWORD", "secret")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "the probe run failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The preflight (fault-matrix rows S3 and S5, before a run): a provider that cannot be
/// reached, or that refuses the key, stops `batch-adjudicate` before a
/// session is created or anything sent, with exit 3 and a message that
/// names the provider, what went wrong and `--no-preflight`; the key itself
/// is never shown. `--no-preflight` goes ahead as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_unreachable_or_refusing_the_key_stops_before_a_session() {
    let sessions = |ws: &Workspace| count(&ws.conn(), "SELECT COUNT(*) FROM llm_batch_session", []);
    let home = tempfile::tempdir().unwrap();
    // `batch-adjudicate --yes --headless EXTRA` with the key set: exit code
    // and everything it said.
    let run_keyed = |ws: &Workspace, extra: &[&str]| {
        let out = docket(ws, home.path())
            .args(["batch-adjudicate", "--yes", "--headless"])
            .args(extra)
            .env("DOCKET_TEST_KEY", "canaryKEYpreflight0042")
            .output()
            .unwrap();
        let text = said(&out);
        (out.status.code(), text)
    };

    // Nothing listens at the provider's address.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let mut job = Job::new(&format!("http://127.0.0.1:{port}/v1"));
    job.api_key_env = Some("DOCKET_TEST_KEY");
    let ws = workspace(&job);
    import_demo_items(&ws, 5);
    let started = Instant::now();
    let (code, text) = run_keyed(&ws, &[]);
    assert_eq!(code, Some(3), "{text}");
    assert!(started.elapsed() < Duration::from_secs(15), "{text}");
    for said in [
        "provider main",
        "could not be reached",
        &format!("127.0.0.1:{port}"),
        "--no-preflight",
    ] {
        assert!(text.contains(said), "{said:?} missing from:\n{text}");
    }
    assert_eq!(
        sessions(&ws),
        0,
        "no session for a provider that is not there"
    );

    // Row S5's other two: a name that does not resolve (`.invalid` never
    // does), and TLS to a server that speaks plain HTTP (the mock).
    let plain = support::mock(MockConfig::default()).await;
    for (url, what) in [
        (
            "http://docket-test.invalid/v1".to_string(),
            "docket-test.invalid".to_string(),
        ),
        (
            plain.base_url().replace("http://", "https://"),
            plain.addr().to_string(),
        ),
    ] {
        let mut job = Job::new(&url);
        job.api_key_env = Some("DOCKET_TEST_KEY");
        let ws = workspace(&job);
        import_demo_items(&ws, 5);
        let (code, text) = run_keyed(&ws, &[]);
        assert_eq!(code, Some(3), "{url}: {text}");
        assert!(
            text.contains("could not be reached") && text.contains(&what),
            "{url}: {text}"
        );
        assert_eq!(sessions(&ws), 0, "{url}");
    }
    assert_eq!(plain.stats().ok, 0, "nothing was answered over TLS");

    // The key refused (the mock answers 401 to everything).
    let (_m, ws) = mocked(mode("unauthorized"), 5, |job| {
        job.api_key_env = Some("DOCKET_TEST_KEY");
    })
    .await;
    let run = |extra: &[&str]| run_keyed(&ws, extra);
    let (code, text) = run(&[]);
    assert_eq!(code, Some(3), "{text}");
    assert!(
        text.contains("refused its key") && text.contains("401"),
        "{text}"
    );
    // The mock echoes the key's first 12 and last 6 characters, as OpenAI
    // does (row X1): neither piece is shown.
    for piece in ["canaryKEYpreflight0042", "canaryKEYpre", "ht0042"] {
        assert!(!text.contains(piece), "{piece:?} in:\n{text}");
    }
    assert!(text.contains("[redacted]*****[redacted]"), "{text}");
    assert_eq!(sessions(&ws), 0);
    assert_eq!(
        count(&ws.conn(), "SELECT COUNT(*) FROM llm_messages", []),
        0
    );

    // Skipped: the session is made and the run stops on the first refusal,
    // as it did before the preflight.
    let (code, text) = run(&["--no-preflight"]);
    assert_eq!(code, Some(3), "{text}");
    assert_eq!(sessions(&ws), 1, "{text}");
}

/// Model text in data output (fault-matrix row I2): to a terminal, CSV and
/// JSON from `batch-results` and `export` carry no escape sequence, one-byte
/// CSI or bidi override (an OSC 52 clipboard write and a clear-screen are
/// planted in an answer's rationale); to a pipe or a file the data stays
/// exact, except that a CSV cell a spreadsheet would run as a formula gets
/// a leading `'`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_text_reaches_a_terminal_as_text_and_csv_formulas_are_neutralised() {
    let (_m, ws) = mocked(MockConfig::default(), 4, |_| {}).await;
    let (report, _) = run(options(&ws)).await;
    let sid = report.session_id.expect("a session");
    let hostile = "x\u{1b}]52;c;ZXZpbA==\u{7}y\u{1b}[2J\u{9b}31m\u{202e}z";
    {
        let conn = ws.conn();
        let ids: Vec<String> = conn
            .prepare("SELECT item_id FROM llm_batch_result WHERE session_id = ?1 ORDER BY item_id")
            .unwrap()
            .query_map([&sid], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        conn.execute(
            "UPDATE llm_batch_result SET rationale = ?1 WHERE item_id = ?2",
            [hostile, &ids[0]],
        )
        .unwrap();
        conn.execute(
            "UPDATE llm_batch_result SET rationale = '=HYPERLINK(\"http://evil\")' WHERE item_id = ?1",
            [&ids[1]],
        )
        .unwrap();
    }
    let home = tempfile::tempdir().unwrap();
    let ws_s = ws.path().display().to_string();
    let raw_bytes = |bytes: &[u8]| {
        let text = String::from_utf8_lossy(bytes);
        text.contains('\u{1b}') || text.contains('\u{9b}') || text.contains('\u{202e}')
    };
    for args in [
        format!("batch-results {sid} --format csv"),
        format!("batch-results {sid} --format json"),
        format!("export --what results --format csv --session {sid}"),
        format!("export --what results --format jsonl --session {sid}"),
    ] {
        // On a terminal: `script` gives docket a pseudo-terminal as stdout.
        let line = format!("{} --workspace {ws_s} {args}", support::procs::bin());
        let on_tty = Command::new("script")
            .args(["-qec", &line, "/dev/null"])
            .env("HOME", home.path())
            .env_remove("DOCKET_WORKSPACE")
            .output()
            .expect("script (util-linux) runs docket on a pseudo-terminal");
        assert!(
            on_tty.status.success(),
            "{args}: {}",
            String::from_utf8_lossy(&on_tty.stderr)
        );
        assert!(
            !raw_bytes(&on_tty.stdout),
            "{args} on a terminal: {:?}",
            String::from_utf8_lossy(&on_tty.stdout)
        );
        assert!(
            String::from_utf8_lossy(&on_tty.stdout).contains("HYPERLINK"),
            "{args}"
        );
        // To a pipe: exact.
        let piped = docket(&ws, home.path())
            .args(args.split(' '))
            .output()
            .unwrap();
        assert!(piped.status.success(), "{args}");
        let text = String::from_utf8_lossy(&piped.stdout);
        assert!(
            text.contains('\u{202e}'),
            "{args} to a pipe keeps the data exact: {text:?}"
        );
        if args.contains("csv") {
            assert!(text.contains("'=HYPERLINK"), "{args}: {text}");
        }
    }
    // To a file: exact, the formula neutralised.
    let file = ws.path().join("results.csv");
    let out = docket(&ws, home.path())
        .args([
            "export",
            "--what",
            "results",
            "--format",
            "csv",
            "--session",
            &sid,
            "-o",
        ])
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains(hostile), "the file keeps the data exact");
    assert!(
        text.contains("'=HYPERLINK") && !text.contains(",=HYPERLINK"),
        "{text}"
    );
    // An argument with control characters comes back in an error as text.
    let out = docket(&ws, home.path())
        .args(["batch-results", "no-such\u{1b}[2Jsession"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && !err.contains('\u{1b}') && err.contains("no-such"),
        "{err:?}"
    );
}

/// An item whose request needs more tokens than the provider's
/// tokens/min allows can never be sent: the dry run names it with the limit,
/// and the run ends it in error at once, with no request and without
/// holding up the others (it used to wait for tokens/min with the ETA
/// climbing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_larger_than_tokens_per_minute_fails_alone_and_at_once() {
    let (m, ws) = mocked(MockConfig::default(), 3, |_| {}).await;
    let toml_path = ws.path().join("docket.toml");
    let toml = std::fs::read_to_string(&toml_path).unwrap();
    std::fs::write(
        &toml_path,
        toml.replace("tokens_per_minute = 0", "tokens_per_minute = 60000"),
    )
    .unwrap();
    let big = ws.path().join("items/big.jsonl");
    let huge_title = "lorem ipsum dolor ".repeat(20_000);
    std::fs::write(
        &big,
        serde_json::json!({"id": "huge-one", "artist": "A", "title": huge_title, "chart": "C",
                           "week": "2020-01-01", "position": 1, "candidates": []})
        .to_string()
            + "\n",
    )
    .unwrap();
    import(&ws, &big);
    let home = tempfile::tempdir().unwrap();
    let (code, text) = run_err(&ws, home.path(), &["batch-adjudicate", "--dry-run"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("1 item(s) can never be sent")
            && text.contains("item huge-one")
            && text.contains("tokens_per_minute = 60000"),
        "{text}"
    );
    let started = Instant::now();
    let (code, text) = run_err(
        &ws,
        home.path(),
        &["batch-adjudicate", "--yes", "--headless"],
    );
    // Completed with an item in error: exit 5, not 0 (scripts notice).
    assert_eq!(code, Some(5), "{text}");
    assert!(started.elapsed() < Duration::from_secs(20), "{text}");
    let conn = ws.conn();
    let error: String = conn
        .query_row(
            "SELECT error_message FROM llm_batch_result WHERE item_id = 'huge-one' AND outcome = 'error'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(
        error.contains("tokens_per_minute = 60000") && error.contains("can never be sent"),
        "{error}"
    );
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_batch_result WHERE outcome != 'error'",
            []
        ),
        3,
        "the others are answered"
    );
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_messages m JOIN llm_requests q ON q.request_id = m.request_id WHERE q.item_id = 'huge-one'",
            []
        ),
        0,
        "no request for it"
    );
    assert_eq!(m.stats().requests, 3, "the mock saw only the three others");
}

/// Workspace files that are not files: a FIFO where docket.toml should be
/// (it hung docket, waiting for a writer), and a ledger that is a link to
/// /dev/null (SQLite's bare "disk I/O error" named nothing). Each is an
/// error at once that names the file and what it is.
#[test]
fn a_fifo_config_or_a_device_ledger_is_named_not_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let run = |ws: &std::path::Path, args: &[&str], name: &str| {
        let mut c = Command::new(support::procs::bin());
        c.arg("--workspace")
            .arg(ws)
            .args(args)
            .env("HOME", home.path());
        support::procs::Proc::start(c, format!("docket {args:?}"), home.path().join(name))
            .wait(Duration::from_secs(10))
    };

    let fifo_ws = dir.path().join("fifo");
    std::fs::create_dir_all(&fifo_ws).unwrap();
    let made = Command::new("mkfifo")
        .arg(fifo_ws.join("docket.toml"))
        .status()
        .unwrap();
    assert!(made.success());
    let (code, out) = run(&fifo_ws, &["batch-adjudicate", "--dry-run"], "fifo.out");
    assert_ne!(code, Some(0), "{out}");
    assert!(out.contains("docket.toml") && out.contains("FIFO"), "{out}");
    // A command that needs no config does not wait on it either.
    let (code, out) = run(&fifo_ws, &["sessions"], "fifo2.out");
    assert_ne!(code, Some(0), "{out}");

    let ws = dir.path().join("devnull");
    docket::workspace::init(&ws, false).unwrap();
    std::os::unix::fs::symlink("/dev/null", ws.join("docket.sqlite")).unwrap();
    for args in [&["sessions"][..], &["import", "items/sample.jsonl"][..]] {
        let (code, out) = run(&ws, args, "devnull.out");
        assert_ne!(code, Some(0), "{out}");
        assert!(
            out.contains("docket.sqlite") && out.contains("a device"),
            "{args:?}: {out}"
        );
    }
}

/// The ledger cannot be written any more mid-run (a disk that fills up:
/// here the file-size limit, `ulimit -f`, with SIGXFSZ ignored, so the
/// writes fail as on a full disk). The run stops with exit 6, not 3 (the
/// provider's code), naming the ledger and the likely cause; nothing of the
/// failed write is kept, and once it can be written the resume finishes
/// every item once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_that_cannot_be_written_stops_with_its_own_code_and_resumes() {
    const ITEMS: usize = 600;
    let (_m, ws) = mocked(latency(5.0, 20.0), ITEMS, |job| job.concurrency = 16).await;
    let home = tempfile::tempdir().unwrap();
    let ledger_kb = std::fs::metadata(ws.ledger()).unwrap().len() / 1024;
    let line = format!(
        "ulimit -f {}; trap '' XFSZ; exec '{}' --workspace '{}' batch-adjudicate --yes --headless",
        ledger_kb + 1_000,
        support::procs::bin(),
        ws.path().display()
    );
    let out = Command::new("bash")
        .args(["-c", &line])
        .env("HOME", home.path())
        .env_remove("DOCKET_WORKSPACE")
        .output()
        .unwrap();
    let text = said(&out);
    assert_eq!(out.status.code(), Some(6), "{text}");
    assert!(
        text.contains(&ws.ledger().display().to_string())
            && text.contains("Free space, then resume"),
        "{text}"
    );
    let sid = latest_session(&ws);
    let (code, text) = run_err(
        &ws,
        home.path(),
        &["batch-adjudicate", "--resume", &sid, "--yes", "--headless"],
    );
    assert_eq!(code, Some(0), "{text}");
    let conn = ws.conn();
    check_complete(&conn, &sid);
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_batch_result WHERE session_id = ?1",
            [&sid]
        ),
        ITEMS as i64
    );
}

/// Issue 12: a workspace docket cannot write (a read-only folder and
/// ledger, run as an unprivileged user: root ignores permissions) still
/// answers the commands that only read; one that writes says the place is
/// read-only and which commands still work. Needs root to drop to `nobody`
/// with setpriv; says so and does nothing otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_workspace_still_answers_read_commands() {
    use std::os::unix::fs::PermissionsExt;
    let root = std::process::Command::new("id").arg("-u").output().unwrap();
    let setpriv = std::path::Path::new("/usr/bin/setpriv");
    if String::from_utf8_lossy(&root.stdout).trim() != "0" || !setpriv.exists() {
        eprintln!("skipped: needs root and /usr/bin/setpriv to run docket as nobody");
        return;
    }
    let (_m, ws) = mocked(MockConfig::default(), 10, |_| {}).await;
    let (report, _) = run(options(&ws)).await;
    let sid = report.session.unwrap().session_id;
    {
        let conn = ws.conn();
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
    }
    let home = tempfile::tempdir().unwrap();
    let mode = |p: &std::path::Path, m: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
    };
    mode(home.path(), 0o777);
    for entry in std::fs::read_dir(ws.path()).unwrap() {
        let p = entry.unwrap().path();
        mode(&p, if p.is_dir() { 0o555 } else { 0o444 });
    }
    mode(ws.path(), 0o555);
    let as_nobody = |args: &[&str]| {
        let out = Command::new(setpriv)
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(support::procs::bin())
            .arg("--workspace")
            .arg(ws.path())
            .args(args)
            .env("HOME", home.path())
            .env("XDG_DATA_HOME", home.path().join("data"))
            .env("XDG_STATE_HOME", home.path().join("state"))
            .env_remove("DOCKET_WORKSPACE")
            .output()
            .unwrap();
        let text = said(&out);
        (out.status.code(), text)
    };
    let (code, text) = as_nobody(&["sessions"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains(&sid), "{text}");
    let (code, text) = as_nobody(&["export", "--session", &sid, "--what", "items"]);
    assert_eq!(code, Some(0), "{text}");
    assert_eq!(text.lines().count(), 11, "a header and 10 items:\n{text}");
    let (code, text) = as_nobody(&["batch-results", &sid]);
    assert_eq!(code, Some(0), "{text}");
    let (code, text) = as_nobody(&["pause", &sid]);
    assert_ne!(code, Some(0), "{text}");
    assert!(
        text.contains("is read-only") && text.contains("still work"),
        "{text}"
    );
    // Writable again, for the temporary directory's removal.
    mode(ws.path(), 0o755);
}

/// Row D3: a damaged ledger (a page overwritten, the header garbled, the
/// file cut short) is refused before a run writes to it or sends anything,
/// with how to recover; the file is left byte for byte as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_ledger_is_refused_with_recovery_hints_and_left_as_it_is() {
    let (m, ws) = mocked(MockConfig::default(), 20, |_| {}).await;
    let (report, _) = run(options(&ws)).await;
    assert!(report.session.is_some());
    {
        let conn = ws.conn();
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
    }
    let good = std::fs::read(ws.ledger()).unwrap();
    assert!(good.len() > 8 * 4096, "a ledger of several pages");
    let home = tempfile::tempdir().unwrap();
    let sent_before = m.stats().requests;
    type Damage = Box<dyn Fn(&mut Vec<u8>)>;
    let damages: [(&str, Damage); 3] = [
        (
            "a page overwritten",
            Box::new(|b: &mut Vec<u8>| {
                for (i, x) in b[5 * 4096..6 * 4096].iter_mut().enumerate() {
                    *x = (i as u8).wrapping_mul(31).wrapping_add(7);
                }
            }),
        ),
        (
            "the header garbled",
            Box::new(|b: &mut Vec<u8>| b[..16].copy_from_slice(b"garbage garbage!")),
        ),
        (
            "the file cut short",
            Box::new(|b: &mut Vec<u8>| b.truncate(3 * 4096 + 100)),
        ),
    ];
    for (what, damage) in &damages {
        let mut bytes = good.clone();
        damage(&mut bytes);
        std::fs::write(ws.ledger(), &bytes).unwrap();
        for f in ["docket.sqlite-wal", "docket.sqlite-shm"] {
            let _ = std::fs::remove_file(ws.path().join(f));
        }
        let out = docket(&ws, home.path())
            .args(["batch-adjudicate", "--yes", "--headless", "--no-preflight"])
            .output()
            .unwrap();
        let text = said(&out);
        assert_ne!(out.status.code(), Some(0), "{what}: {text}");
        assert!(
            text.contains("is damaged") && text.contains(".recover") && text.contains("backup"),
            "{what}: {text}"
        );
        assert_eq!(
            std::fs::read(ws.ledger()).unwrap(),
            bytes,
            "{what}: the damaged ledger was changed"
        );
    }
    assert_eq!(m.stats().requests, sent_before, "nothing was sent");
}

/// Row P2: a second signal during the grace (here 100 ms after the first,
/// with every request in flight for 20 s, longer than the 10 s grace) ends
/// docket at once: exit 130, the ledger consistent, the abandoned requests
/// on record as ambiguous, and a resume finishes every item once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_in_the_grace_exits_at_once_and_loses_nothing() {
    let (m, ws) = mocked(latency(20_000.0, 20_000.0), 30, |job| {
        job.concurrency = 4;
    })
    .await;
    let home = tempfile::tempdir().unwrap();
    let child = docket(&ws, home.path())
        .args(["batch-adjudicate", "--yes", "--headless"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while count(
        &ws.conn(),
        "SELECT COUNT(*) FROM llm_messages WHERE state = 'sent'",
        [],
    ) < 4
    {
        assert!(Instant::now() < deadline, "no request went out");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pid = child.id().to_string();
    Command::new("kill").args(["-INT", &pid]).status().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    let second = Instant::now();
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let took = second.elapsed();
    let text = said(&out);
    assert_eq!(out.status.code(), Some(130), "{text}");
    // The grace (10 s) and the answers (20 s) were not waited for.
    assert!(
        took < Duration::from_secs(8),
        "{took:?} after the second signal\n{text}"
    );
    let sid = latest_session(&ws);
    let conn = ws.conn();
    check_invariants(&conn, &sid);
    let abandoned = count(
        &conn,
        "SELECT COUNT(*) FROM llm_messages WHERE state = 'ambiguous'",
        [],
    );
    assert!(
        abandoned >= 4,
        "the requests in flight are on record as ambiguous"
    );
    assert_eq!(
        0,
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_messages WHERE state = 'sent'",
            []
        )
    );
    drop(conn);
    m.set_config(MockConfig::default());
    let out = docket(&ws, home.path())
        .args(["batch-adjudicate", "--yes", "--headless", "--resume", &sid])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    check_complete(&ws.conn(), &sid);
}

/// Row X2: whatever the umask (here 000), what docket creates is the
/// user's alone: a new workspace's folders 0700 and files 0600, the ledger,
/// the log and an export 0600. A run in a workspace others may write to
/// starts with a warning saying so.
#[test]
fn files_docket_creates_are_private_whatever_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    let home = tmp.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let sh = |args: &str| {
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!("umask 000; exec \"$0\" {args}"))
            .arg(support::procs::bin())
            .env("HOME", &home)
            .env("XDG_DATA_HOME", home.join("data"))
            .env("XDG_STATE_HOME", home.join("state"))
            .env_remove("DOCKET_WORKSPACE")
            .current_dir(tmp.path())
            .output()
            .unwrap();
        (
            out.status.code(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let mode = |p: &std::path::Path| {
        std::fs::metadata(p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .permissions()
            .mode()
            & 0o777
    };
    let (code, text) = sh("init ws");
    assert_eq!(code, Some(0), "{text}");
    std::fs::write(ws.join("items/few.jsonl"), "{\"id\":\"a\",\"x\":1}\n").unwrap();
    let (code, text) = sh("--workspace ws import ws/items/few.jsonl");
    assert_eq!(code, Some(0), "{text}");
    let (code, text) = sh("--workspace ws export --what decisions -o out.csv");
    assert_eq!(code, Some(0), "{text}");
    let log_dir = home.join("state/docket/logs");
    let log = std::fs::read_dir(&log_dir)
        .unwrap_or_else(|e| panic!("{}: {e}", log_dir.display()))
        .next()
        .expect("a log file")
        .unwrap()
        .path();
    for (path, want) in [
        (ws.clone(), 0o700),
        (ws.join("prompts"), 0o700),
        (ws.join("docket.toml"), 0o600),
        (ws.join("docket.sqlite"), 0o600),
        (tmp.path().join("out.csv"), 0o600),
        (log_dir.clone(), 0o700),
        (log, 0o600),
    ] {
        assert_eq!(mode(&path), want, "{}: {:o}", path.display(), mode(&path));
    }
    std::fs::set_permissions(&ws, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (_, text) = sh("--workspace ws batch-adjudicate --dry-run --headless");
    assert!(
        text.contains("warning: others can write to") && text.contains("(mode 0777)"),
        "{text}"
    );
}

/// Row D5 on SQLite: a ledger written by a newer docket (a schema version
/// this build does not know) is refused by reads and runs alike, naming
/// both versions, and left as it is.
#[test]
fn a_ledger_from_a_newer_docket_is_refused_and_left_as_it_is() {
    let ws = support::Workspace {
        dir: tempfile::tempdir().unwrap(),
    };
    docket::workspace::init(ws.path(), false).unwrap();
    import_demo_items(&ws, 3);
    ws.conn().pragma_update(None, "user_version", 999).unwrap();
    let before = std::fs::read(ws.ledger()).unwrap();
    let home = tempfile::tempdir().unwrap();
    for args in [
        vec!["sessions"],
        vec!["batch-adjudicate", "--yes", "--headless"],
    ] {
        let out = docket(&ws, home.path()).args(&args).output().unwrap();
        let text = said(&out);
        assert_ne!(out.status.code(), Some(0), "{args:?}: {text}");
        assert!(
            text.contains("written by a newer docket") && text.contains("999"),
            "{args:?}: {text}"
        );
    }
    assert_eq!(std::fs::read(ws.ledger()).unwrap(), before);
}

/// Row D4: an export pointed at the ledger itself (or its -wal, -shm; by
/// any path that leads there) is refused before a byte is written, and the
/// ledger stays whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_over_the_ledger_is_refused_and_the_ledger_kept() {
    let (_m, ws) = mocked(MockConfig::default(), 10, |_| {}).await;
    let home = tempfile::tempdir().unwrap();
    let out = docket(&ws, home.path())
        .args(["run", "--yes"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let before = std::fs::read(ws.ledger()).unwrap();
    let link = home.path().join("looks-harmless.csv");
    std::os::unix::fs::symlink(ws.ledger(), &link).unwrap();
    let via_dots = ws.path().join("items/../docket.sqlite");
    // A link to a -wal that does not exist now: written through, it would
    // become the ledger's WAL.
    let dangling = home.path().join("report.jsonl");
    std::os::unix::fs::symlink(ws.path().join("docket.sqlite-wal"), &dangling).unwrap();
    for target in [
        ws.ledger(),
        ws.path().join("docket.sqlite-wal"),
        via_dots,
        link,
        dangling,
    ] {
        let t = target.to_string_lossy().to_string();
        let (code, text) = run_err(
            &ws,
            home.path(),
            &[
                "export", "--what", "results", "--format", "csv", "--output", &t,
            ],
        );
        assert_ne!(code, Some(0), "{t}: {text}");
        assert!(
            text.contains("is the ledger") && text.contains(&t),
            "{t}: {text}"
        );
    }
    assert_eq!(std::fs::read(ws.ledger()).unwrap(), before);
    let ok: String = ws
        .conn()
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok");
    assert_eq!(processed(&ws), 10);
}

/// Row D5 on SQLite: four processes open a ledger that does not exist yet
/// at the same moment (each importing its own file). Migrations serialise
/// under `BEGIN IMMEDIATE`: one applies them, the others wait and find
/// them done. Every process succeeds and every item is there once.
#[test]
fn d5_processes_starting_together_migrate_a_new_ledger_once() {
    let ws = support::Workspace {
        dir: tempfile::tempdir().unwrap(),
    };
    docket::workspace::init(ws.path(), false).unwrap();
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", ws.ledger().display()));
    }
    let home = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for n in 0..4 {
        let path = ws.path().join(format!("items/part{n}.jsonl"));
        let mut text = String::new();
        for i in 0..50 {
            text.push_str(&format!("{{\"id\":\"p{n}-{i}\",\"title\":\"t{i}\"}}\n"));
        }
        std::fs::write(&path, text).unwrap();
        files.push(path);
    }
    let children: Vec<_> = files
        .iter()
        .map(|f| {
            docket(&ws, home.path())
                .arg("import")
                .arg(f)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", support::said(&out));
    }
    let conn = ws.conn();
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version, docket::ledger::MIGRATIONS.last().unwrap().0);
    assert_eq!(count(&conn, "SELECT COUNT(*) FROM decision", []), 200);
    let ok: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok");
}

/// Runs `docket batch-adjudicate` on a copy of `ws` in a small tmpfs of its
/// own (a mount namespace: root only), filled up to `free_kb` free with a
/// filler file that is removed once the output says `wait_for`. Returns
/// the exit code, the output, and the ledger copied back out.
fn run_on_a_small_disk(
    ws: &support::Workspace,
    free_kb: u64,
    min_free_mb: u64,
    wait_for: &str,
) -> Option<(Option<i32>, String, std::path::PathBuf)> {
    let root = Command::new("id").arg("-u").output().ok()?;
    let unshare = Command::new("unshare").arg("--help").output();
    if String::from_utf8_lossy(&root.stdout).trim() != "0" || unshare.is_err() {
        eprintln!("skipped: needs root and unshare(1) to mount a small tmpfs");
        return None;
    }
    let scratch = tempfile::tempdir().unwrap();
    let disk = scratch.path().join("disk");
    let out_dir = scratch.path().join("out");
    std::fs::create_dir_all(&disk).unwrap();
    std::fs::create_dir_all(&out_dir).unwrap();
    let script = format!(
        r#"set -u
mount -t tmpfs -o size=48m tmpfs '{disk}' || exit 97
cp -a '{ws}' '{disk}/ws'
avail=$(df --output=avail -B1024 '{disk}' | tail -1)
head -c $(( (avail - {free_kb}) * 1024 )) /dev/zero > '{disk}/filler'
(
  for i in $(seq 1 600); do
    grep -q '{wait_for}' '{out}/run.out' 2>/dev/null && break
    sleep 0.1
  done
  sleep 1
  rm -f '{disk}/filler'
) &
DOCKET_MIN_FREE_MB={min_free_mb} '{bin}' --workspace '{disk}/ws' batch-adjudicate --yes --headless > '{out}/run.out' 2>&1
code=$?
wait
cp '{disk}/ws/docket.sqlite' '{out}/'
exit $code
"#,
        disk = disk.display(),
        ws = ws.path().display(),
        out = out_dir.display(),
        bin = support::procs::bin(),
    );
    let status = Command::new("unshare")
        .args(["-m", "bash", "-c", &script])
        .env_remove("DOCKET_WORKSPACE")
        .status()
        .unwrap();
    if status.code() == Some(97) {
        eprintln!("skipped: tmpfs could not be mounted here");
        return None;
    }
    let text = std::fs::read_to_string(out_dir.join("run.out")).unwrap_or_default();
    let ledger = out_dir.join("docket.sqlite");
    // Kept past the scratch folder's end.
    let kept =
        std::env::temp_dir().join(format!("docket-d2-{}-{free_kb}.sqlite", std::process::id()));
    std::fs::copy(&ledger, &kept).unwrap();
    Some((status.code(), text, kept))
}

fn check_every_item_once(ledger: &std::path::Path, items: i64) {
    let conn = docket::ledger::open(ledger).unwrap();
    let ok: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok");
    let sid: String = conn
        .query_row("SELECT session_id FROM llm_batch_session", [], |r| r.get(0))
        .unwrap();
    check_complete(&conn, &sid);
    assert_eq!(
        count(&conn, "SELECT COUNT(*) FROM llm_batch_result", []),
        items
    );
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_messages WHERE state = 'answered'",
            []
        ),
        items,
        "no request answered twice"
    );
}

/// Row D2, the guard: with less than `DOCKET_MIN_FREE_MB` free under the
/// ledger, nothing new is sent and the session shows paused with the
/// reason; once space is freed the run goes on by itself and ends with
/// every item once. (A real small disk: a tmpfs in a mount namespace.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d2_a_disk_almost_full_holds_sending_until_space_is_freed() {
    const ITEMS: i64 = 200;
    let (_m, ws) = mocked(latency(10.0, 30.0), ITEMS as usize, |job| {
        job.concurrency = 8
    })
    .await;
    let Some((code, text, ledger)) = run_on_a_small_disk(&ws, 3 * 1024, 8, "Paused: the ledger")
    else {
        return;
    };
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("Paused: the ledger's disk"), "{text}");
    assert!(text.contains("Resumed: the ledger's disk has"), "{text}");
    check_every_item_once(&ledger, ITEMS);
    let _ = std::fs::remove_file(ledger);
}

/// Row D2, the disk fills: with the guard off, the ledger's writes fail
/// with "database or disk is full". The writer holds them in memory and
/// tries again; nothing new is sent meanwhile. Once space is freed the
/// run goes on by itself: exit 0, every item once, no answer lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d2_a_full_disk_holds_the_writes_until_space_is_freed() {
    const ITEMS: i64 = 300;
    let (_m, ws) = mocked(latency(10.0, 30.0), ITEMS as usize, |job| {
        job.concurrency = 8
    })
    .await;
    let Some((code, text, ledger)) =
        run_on_a_small_disk(&ws, 600, 0, "The ledger cannot be written")
    else {
        return;
    };
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("The ledger cannot be written") && text.contains("database or disk is full"),
        "{text}"
    );
    assert!(text.contains("The ledger is written again"), "{text}");
    check_every_item_once(&ledger, ITEMS);
    let _ = std::fs::remove_file(ledger);
}

/// Row D4, a `-wal` deleted after a crash: killed mid-run (a failpoint at
/// the 10th answer), the ledger's committed transactions since its last
/// checkpoint are in its `-wal`. Deleted, SQLite would open the file as of
/// that checkpoint without a word. docket refuses it instead, for a read
/// command and for a resume alike, naming the missing file and what the
/// `-shm` says was in it, and leaves every file as it is; once the `-shm`
/// is deleted too (the operator's choice to go on without them), it opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d4_a_wal_deleted_after_a_crash_is_refused_not_silently_lost() {
    let (m, ws) = mocked(MockConfig::default(), 30, |job| job.concurrency = 2).await;
    let home = tempfile::tempdir().unwrap();
    let out = docket(&ws, home.path())
        .args(["batch-adjudicate", "--yes", "--headless"])
        .env(docket::failpoint::ENV, "after_answer:10")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), None, "killed: {}", said(&out));
    let wal = ws.path().join("docket.sqlite-wal");
    let shm = ws.path().join("docket.sqlite-shm");
    assert!(wal.exists() && shm.exists(), "a crash leaves both");
    std::fs::remove_file(&wal).unwrap();
    let ledger_before = std::fs::read(ws.ledger()).unwrap();
    let shm_before = std::fs::read(&shm).unwrap();
    let sent_before = m.stats().requests;
    for args in [
        &["sessions"][..],
        &[
            "batch-adjudicate",
            "--yes",
            "--headless",
            "--resume",
            "latest",
        ][..],
    ] {
        let (code, text) = run_err(&ws, home.path(), args);
        assert_ne!(code, Some(0), "{args:?}: {text}");
        assert!(
            text.contains("docket.sqlite-wal is missing")
                && text.contains("committed")
                && text.contains("delete")
                && text.contains("docket.sqlite-shm"),
            "{args:?}: {text}"
        );
        assert!(!text.contains("panicked"), "{text}");
    }
    assert_eq!(std::fs::read(ws.ledger()).unwrap(), ledger_before);
    assert_eq!(std::fs::read(&shm).unwrap(), shm_before);
    assert!(!wal.exists());
    assert_eq!(m.stats().requests, sent_before, "nothing was sent");
    // The operator's call: go on from the last checkpoint.
    std::fs::remove_file(&shm).unwrap();
    let (code, text) = run_err(&ws, home.path(), &["sessions"]);
    assert_eq!(code, Some(0), "{text}");
}

/// Row D4, a ledger on a network filesystem: with statfs(2) made to say NFS
/// for the workspace (a preloaded shim, `crates/testkit/src/fake_statfs.c`: no
/// network mount is needed), a run warns before it starts, naming the
/// folder, the filesystem and what to do instead; the same run on the real
/// (local) answer says nothing of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d4_a_ledger_on_a_network_filesystem_is_warned_about() {
    let (_m, ws) = mocked(MockConfig::default(), 5, |_| {}).await;
    let home = tempfile::tempdir().unwrap();
    let shim = support::power_loss::preload_library(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/crates/testkit/src/fake_statfs.c"
        ),
        "fake-statfs",
    );
    let root = ws.path().canonicalize().unwrap();
    let out = docket(&ws, home.path())
        .args(["batch-adjudicate", "--yes", "--headless", "--limit", "2"])
        .env("LD_PRELOAD", &shim)
        .env("DOCKET_FAKE_NFS", &root)
        .output()
        .unwrap();
    let text = said(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("warning:")
            && text.contains("is on a NFS filesystem")
            && text.contains(&root.display().to_string())
            && text.contains("local disk")
            && text.contains("PostgreSQL"),
        "{text}"
    );
    let out = docket(&ws, home.path())
        .args(["batch-adjudicate", "--yes", "--headless", "--limit", "2"])
        .output()
        .unwrap();
    let text = said(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(!text.contains("filesystem"), "{text}");
}
