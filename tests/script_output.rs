//! What scripts read from the real binary: every attempt with its raw
//! answer in an export, `--format json` from the commands that do something
//! (one JSON document on stdout, nothing else), and a dry run that needs no
//! API key.

use docket_testkit as support;

use std::process::{Command, Output, Stdio};

use docket::mock::MockConfig;
use serde_json::Value;
use support::*;

fn docket(ws: &Workspace, home: &std::path::Path) -> Command {
    let mut c = support::procs::docket_at(ws.path(), home);
    c.stdin(Stdio::null());
    c
}

/// Standard output as exactly one JSON document.
fn json_of(out: &Output) -> Value {
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "not one JSON document ({e}): {text:?}; stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Each attempt's raw answer in the ledger, in send order.
fn ledger_outputs(ws: &Workspace, session: &str) -> Vec<Option<String>> {
    let conn = ws.conn();
    let mut stmt = conn
        .prepare(
            "SELECT assistant_output FROM llm_messages WHERE session_id = ?1 ORDER BY message_id",
        )
        .unwrap();
    stmt.query_map([session], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn latest_session(ws: &Workspace) -> String {
    docket::ledger::store::latest_session(&support::db(&ws.conn()))
        .unwrap()
        .expect("a session")
}

/// `export --what attempts`: one row per attempt, read back by python3's
/// csv module (CSV) and serde_json (JSONL); an attempt the gate rejected
/// keeps its raw answer, exactly as the ledger has it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attempts_export_has_every_attempt_and_its_raw_answer() {
    let (_m, ws) = mocked(
        MockConfig {
            wrong_schema: 1.0,
            ..Default::default()
        },
        3,
        |job| job.max_attempts = 2,
    )
    .await;
    let home = tempfile::tempdir().unwrap();
    let run = docket(&ws, home.path())
        .args(["batch-adjudicate", "--yes", "--headless"])
        .output()
        .unwrap();
    // Each item's last answer, failing the gate too, goes to review.
    assert_eq!(run.status.code(), Some(0), "{}", said(&run));
    let sid = latest_session(&ws);
    let outputs = ledger_outputs(&ws, &sid);
    assert_eq!(outputs.len(), 6, "3 items x 2 attempts");
    assert!(
        outputs
            .iter()
            .all(|o| o.as_deref().is_some_and(|t| !t.is_empty()))
    );

    let csv_path = ws.path().join("attempts.csv");
    let out = docket(&ws, home.path())
        .args(["export", "--what", "attempts", "--session", &sid, "-o"])
        .arg(&csv_path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let py = Command::new("python3")
        .args([
            "-c",
            "import csv, json, sys\n\
             with open(sys.argv[1], newline='') as f:\n\
             \x20   r = csv.DictReader(f)\n\
             \x20   rows = list(r)\n\
             print(json.dumps({'columns': r.fieldnames, 'rows': rows}))",
        ])
        .arg(&csv_path)
        .output()
        .expect("python3");
    assert!(py.status.success(), "{}", said(&py));
    let read: Value = serde_json::from_slice(&py.stdout).unwrap();
    let columns: Vec<&str> = read["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert_eq!(columns, docket::report::ATTEMPT_COLUMNS);
    let rows = read["rows"].as_array().unwrap();
    assert_eq!(rows.len(), outputs.len());
    // The HTTP call answered (`answered`); the gate rejected the answer
    // (`error_kind` gate): its raw text is kept all the same.
    for (row, raw) in rows.iter().zip(&outputs) {
        assert_eq!(row["session_id"], sid.as_str());
        assert_eq!(row["state"], "answered", "{row}");
        assert_eq!(row["error_kind"], "gate", "{row}");
        assert!(
            row["error_message"]
                .as_str()
                .unwrap()
                .contains("required property"),
            "{row}"
        );
        assert_eq!(row["raw_output"].as_str(), raw.as_deref(), "{row}");
        assert!(row["attempt"] == "1" || row["attempt"] == "2", "{row}");
        assert_eq!(row["http_status"], "200", "{row}");
        assert!(!row["item_id"].as_str().unwrap().is_empty());
        assert_eq!(row["stage"], "adjudicate");
        let latency: f64 = row["latency_secs"].as_str().unwrap().parse().unwrap();
        assert!(latency >= 0.0, "{row}");
        assert!(row["finished_at"].as_str().unwrap().ends_with('Z'), "{row}");
    }

    // JSONL on a pipe: exact, one object per attempt, keys in column order.
    let out = docket(&ws, home.path())
        .args(["export", "--what", "attempts", "--format", "jsonl"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), outputs.len());
    for (obj, raw) in lines.iter().zip(&outputs) {
        let keys: Vec<&String> = obj.as_object().unwrap().keys().collect();
        assert_eq!(keys, docket::report::ATTEMPT_COLUMNS);
        assert_eq!(obj["raw_output"].as_str(), raw.as_deref());
        assert_eq!(obj["attempt"].as_i64().map(|a| a >= 1), Some(true));
        assert!(obj["latency_secs"].is_f64(), "{obj}");
    }
    // No key or header is ever among what is exported.
    let text = String::from_utf8_lossy(&out.stdout).to_lowercase();
    assert!(!text.contains("authorization") && !text.contains("bearer"));
}

/// `batch-adjudicate --format json`: the summary is the whole of stdout,
/// the progress lines went to standard error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_says_its_summary_as_one_json_document() {
    let (_m, ws) = mocked(MockConfig::default(), 5, |_| {}).await;
    let home = tempfile::tempdir().unwrap();
    let out = docket(&ws, home.path())
        .args([
            "batch-adjudicate",
            "--yes",
            "--headless",
            "--format",
            "json",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let doc = json_of(&out);
    let sid = latest_session(&ws);
    assert_eq!(doc["session_id"], sid.as_str());
    assert_eq!(doc["end"], "completed");
    assert_eq!(doc["exit_code"], 0);
    assert_eq!(doc["exit_meaning"], "ok");
    let s = &doc["session"];
    assert_eq!(s["state"], "completed");
    assert_eq!(s["counters"]["total"], 5);
    assert_eq!(s["counters"]["processed"], 5);
    let c = &s["counters"];
    let routed = c["accepted"].as_u64().unwrap()
        + c["review"].as_u64().unwrap()
        + c["rejected"].as_u64().unwrap()
        + c["error"].as_u64().unwrap();
    assert_eq!(routed, 5, "{doc}");
    assert!(s["tokens"]["input"].as_u64().unwrap() > 0);
    assert!(s["estimate"]["cost_usd"].is_number());
    assert!(doc["dry_run"].is_null());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Batch LLM Adjudication"), "{err}");
}

/// A dry run sends nothing, so it needs no key: it says the key is missing
/// (as a warning line, and in the JSON) and exits 0; the real run still
/// refuses without it. The mock sees no request either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_needs_no_key_and_says_it_is_missing() {
    const VAR: &str = "DOCKET_SCRIPT_OUTPUT_TEST_KEY";
    let (m, ws) = mocked(MockConfig::default(), 4, |job| job.api_key_env = Some(VAR)).await;
    let home = tempfile::tempdir().unwrap();
    let out = docket(&ws, home.path())
        .args(["batch-adjudicate", "--dry-run"])
        .env_remove(VAR)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "Warning: providers.main.api_key_env names {VAR}, which is not set"
        )) && text.contains(&format!("export {VAR}=")),
        "{text}"
    );
    assert!(text.contains("Dry run: nothing was sent"), "{text}");

    let out = docket(&ws, home.path())
        .args(["batch-adjudicate", "--dry-run", "--format", "json"])
        .env_remove(VAR)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let doc = json_of(&out);
    assert_eq!(doc["end"], "dry_run");
    assert!(doc["session_id"].is_null());
    let dry = &doc["dry_run"];
    assert_eq!(dry["items"], 4);
    assert!(dry["cost_usd"].as_f64().unwrap() > 0.0, "{dry}");
    assert!(
        dry["worst_cost_usd"].as_f64().unwrap() >= dry["cost_usd"].as_f64().unwrap(),
        "{dry}"
    );
    assert!(dry["duration"]["kind"].is_string(), "{dry}");
    assert_eq!(dry["unrenderable_count"], 0);
    assert_eq!(dry["awaiting_review_left_out"], 0);
    assert!(!dry["first_prompt"]["user"].as_str().unwrap().is_empty());
    let missing = dry["missing_keys"].as_array().unwrap();
    assert_eq!(missing.len(), 1, "{dry}");
    assert!(missing[0].as_str().unwrap().contains(VAR));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Warning:"));

    let out = docket(&ws, home.path())
        .args(["batch-adjudicate", "--yes", "--headless"])
        .env_remove(VAR)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains(VAR));
    assert_eq!(m.stats().requests, 0, "nothing may reach the provider");
}

/// `import --output-format json`: counts, and each bad row with its file,
/// line and reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_says_its_report_as_json() {
    let (_m, ws) = mocked(MockConfig::default(), 0, |_| {}).await;
    let home = tempfile::tempdir().unwrap();
    let file = ws.path().join("mixed.jsonl");
    std::fs::write(
        &file,
        "{\"id\": \"a1\", \"title\": \"One\", \"artist\": \"X\", \"year\": 1990}\n\
         {not json\n\
         {\"id\": \"a2\", \"title\": \"Two\", \"artist\": \"Y\", \"year\": 1991}\n",
    )
    .unwrap();
    let out = docket(&ws, home.path())
        .args(["import"])
        .arg(&file)
        .args(["--output-format", "json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    let doc = json_of(&out);
    assert_eq!(doc["rows_read"], 3, "{doc}");
    assert_eq!(doc["imported"], 2, "{doc}");
    assert_eq!(doc["already_present"], 0);
    assert_eq!(doc["bad_count"], 1);
    assert_eq!(doc["committed"], true);
    let bad = &doc["bad_rows"][0];
    assert_eq!(bad["line"], 2, "{doc}");
    assert_eq!(bad["file"], file.display().to_string());
    assert!(!bad["reason"].as_str().unwrap().is_empty());
    assert!(doc["unrenderable"].is_array());
    assert!(doc["templates_checked"].is_boolean());

    // Again: every good row is already there.
    let out = docket(&ws, home.path())
        .args(["import"])
        .arg(&file)
        .args(["--output-format", "json"])
        .output()
        .unwrap();
    let doc = json_of(&out);
    assert_eq!(doc["imported"], 0, "{doc}");
    assert_eq!(doc["already_present"], 2, "{doc}");
}

/// `pause`, `resume`, `cancel` with `--format json`: what was asked, and the
/// session's states before and after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_run_controls_say_what_they_asked_as_json() {
    let (_m, ws) = mocked(MockConfig::default(), 2, |_| {}).await;
    let home = tempfile::tempdir().unwrap();
    // A budget no request fits in: the session pauses (resumable), so it
    // can still be steered.
    let run = docket(&ws, home.path())
        .args([
            "batch-adjudicate",
            "--yes",
            "--headless",
            "--max-cost",
            "0.0000001",
        ])
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(4), "{}", said(&run));
    let sid = latest_session(&ws);
    for (cmd, asked, desired) in [
        ("pause", "pause", "paused"),
        ("resume", "resume", "running"),
        ("stop-at-stage", "stop_at_stage", "running"),
        ("cancel", "cancel", "cancelled"),
    ] {
        let out = docket(&ws, home.path())
            .args([cmd, sid.as_str(), "--format", "json"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{cmd}: {}", said(&out));
        let doc = json_of(&out);
        assert_eq!(doc["session_id"], sid.as_str());
        assert_eq!(doc["asked"], asked);
        assert_eq!(doc["running"], false);
        assert_eq!(doc["after"]["desired_state"], desired, "{doc}");
        assert!(doc["before"]["state"].is_string(), "{doc}");
        let verb = asked.split('_').next().unwrap();
        assert!(doc["message"].as_str().unwrap().contains(verb), "{doc}");
    }
    // Without the flag, the sentence as before.
    let out = docket(&ws, home.path())
        .args(["resume", sid.as_str()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with(&format!("Session {sid}: asked to resume")),
        "{text}"
    );
}

/// The attempts export on a PostgreSQL ledger: the scaffolded mock's
/// injected faults give failed attempts beside answered ones; one row per
/// send (the requests' attempt counts summed), each failed or answered one
/// with its raw answer or its error.
#[test]
fn the_attempts_export_works_on_postgres() {
    let server = support::pg::PgServer::start();
    let url = server.fresh_database();
    let dir = tempfile::tempdir().unwrap();
    docket::workspace::init(dir.path(), false).expect("init");
    let mut f = std::fs::File::create(dir.path().join("items/test.jsonl")).unwrap();
    docket::demo::write_chart_items(&mut f, 30, 7).unwrap();
    let items = dir.path().join("items/test.jsonl");
    let run = |args: &[&str]| {
        let out = support::procs::docket_at(dir.path(), dir.path())
            .args(args)
            .env("DOCKET_LEDGER_URL", &url)
            .env_remove("PGPASSWORD")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.code().is_some_and(|c| c == 0 || c == 5),
            "docket {args:?}: {}",
            said(&out)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    run(&["import", items.to_str().unwrap()]);
    run(&["batch-adjudicate", "--yes", "--headless"]);
    assert!(!dir.path().join("docket.sqlite").exists());
    let requests: Vec<Value> = run(&["export", "--what", "requests", "--format", "jsonl"])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let sends: i64 = requests
        .iter()
        .map(|r| r["attempt"].as_i64().unwrap())
        .sum();
    let attempts: Vec<Value> = run(&["export", "--what", "attempts", "--format", "jsonl"])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(attempts.len() as i64, sends);
    assert!(attempts.iter().any(|a| a["state"] == "answered"));
    for a in &attempts {
        match a["state"].as_str().unwrap() {
            "answered" => {
                assert!(a["raw_output"].is_string(), "{a}");
                assert!(a["latency_secs"].as_f64().is_some_and(|l| l >= 0.0), "{a}");
            }
            "failed" | "ambiguous" => assert!(a["error_kind"].is_string(), "{a}"),
            other => panic!("an attempt still {other} after the run: {a}"),
        }
        assert!(
            a["session_id"].is_string() && a["item_id"].is_string(),
            "{a}"
        );
    }
    let csv = run(&["export", "--what", "attempts"]);
    assert_eq!(
        csv.lines().next().unwrap(),
        docket::report::ATTEMPT_COLUMNS.join(",")
    );
}
