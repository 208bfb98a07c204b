//! Named rate-limit profiles, end to end with the real binary: `docket
//! profile set` twice makes two versions, `list` and `show` say so (table
//! and JSON), bad numbers are clap's errors, an unknown profile or one for
//! another provider stops a run with exit 2 naming both sides, and a run
//! with `--profile` is paced by the profile's concurrency (seen by the mock
//! as answers one at a time) and records the profile and version, shown by
//! `docket sessions` and `docket batch-results`.

use docket_testkit as support;

use std::process::Output;

use serde_json::Value;
use support::procs::{Mock, docket_at};
use support::{Job, Workspace};

/// A workspace whose provider `main` is the mock process, with `items` demo
/// items, and a private HOME.
fn workspace(mock: &Mock, items: usize) -> (Workspace, tempfile::TempDir) {
    let ws = support::workspace(&Job::new(&format!("{}/v1", mock.base())));
    support::import_demo_items(&ws, items);
    (ws, tempfile::tempdir().expect("home"))
}

fn docket(ws: &Workspace, home: &tempfile::TempDir, args: &[&str]) -> Output {
    docket_at(ws.path(), home.path())
        .args(args)
        .output()
        .expect("run docket")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json(o: &Output) -> Value {
    assert_eq!(o.status.code(), Some(0), "{}", stderr(o));
    serde_json::from_str(&stdout(o)).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
}

#[test]
fn set_twice_makes_two_versions_that_list_and_show_tell() {
    let mock = Mock::start(&[]);
    let (ws, home) = workspace(&mock, 1);
    let first = docket(
        &ws,
        &home,
        &[
            "profile",
            "set",
            "night",
            "--provider",
            "main",
            "--rpm",
            "100",
        ],
    );
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    assert!(stdout(&first).contains("night@1"), "{}", stdout(&first));
    let second = docket(
        &ws,
        &home,
        &[
            "profile",
            "set",
            "night",
            "--provider",
            "main",
            "--model",
            "gpt-4o-mini",
            "--rpm",
            "200",
            "--concurrency",
            "2",
            "--format",
            "json",
        ],
    );
    let saved = json(&second);
    assert_eq!(saved["version"], 2);
    assert_eq!(saved["limits"]["requests_per_minute"], 200);

    let list = docket(&ws, &home, &["profile", "list"]);
    assert_eq!(list.status.code(), Some(0), "{}", stderr(&list));
    let text = stdout(&list);
    let row = text
        .lines()
        .find(|l| l.starts_with("night"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        row.contains(" 2 ")
            && row.contains("gpt-4o-mini")
            && row.ends_with("rpm=200 concurrency=2"),
        "{row}"
    );

    let listed = json(&docket(
        &ws,
        &home,
        &["profile", "list", "--format", "json"],
    ));
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    assert_eq!(listed[0]["version"], 2);

    let history = json(&docket(
        &ws,
        &home,
        &["profile", "show", "night", "--format", "json"],
    ));
    let versions: Vec<i64> = history
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["version"].as_i64().unwrap())
        .collect();
    assert_eq!(versions, vec![1, 2]);
    assert_eq!(
        history[0]["limits"],
        serde_json::json!({"requests_per_minute": 100})
    );
    assert_eq!(history[0]["model"], Value::Null);
    let shown = stdout(&docket(&ws, &home, &["profile", "show", "night"]));
    assert_eq!(
        shown.lines().filter(|l| l.starts_with("night")).count(),
        2,
        "{shown}"
    );

    let ghost = docket(&ws, &home, &["profile", "show", "ghost"]);
    assert_eq!(ghost.status.code(), Some(2));
    assert!(
        stderr(&ghost).contains("ghost") && stderr(&ghost).contains("known: night"),
        "{}",
        stderr(&ghost)
    );
}

#[test]
fn bad_limits_are_refused_before_anything_is_stored() {
    let mock = Mock::start(&[]);
    let (ws, home) = workspace(&mock, 1);
    for (args, says) in [
        (&["--concurrency", "0"][..], "--concurrency"),
        (&["--rpm", "lots"][..], "--rpm"),
        (&["--rpm=-5"][..], "--rpm"),
        (&["--timeout-secs", "0"][..], "request_timeout_secs"),
        (&[][..], "at least one limit"),
    ] {
        let mut all = vec!["profile", "set", "p", "--provider", "main"];
        all.extend_from_slice(args);
        let o = docket(&ws, &home, &all);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
    }
    let bad_name = docket(
        &ws,
        &home,
        &["profile", "set", "a b", "--provider", "main", "--rpm", "1"],
    );
    assert_eq!(bad_name.status.code(), Some(2));
    let listed = json(&docket(
        &ws,
        &home,
        &["profile", "list", "--format", "json"],
    ));
    assert_eq!(listed, serde_json::json!([]));
}

#[test]
fn a_run_refuses_an_unknown_profile_or_one_for_another_provider() {
    let mock = Mock::start(&[]);
    let (ws, home) = workspace(&mock, 2);
    let set = docket(
        &ws,
        &home,
        &[
            "profile",
            "set",
            "elsewhere",
            "--provider",
            "azure_eu",
            "--rpm",
            "5",
        ],
    );
    assert_eq!(set.status.code(), Some(0), "{}", stderr(&set));
    assert!(
        stderr(&set).contains("no [providers.azure_eu]"),
        "{}",
        stderr(&set)
    );

    let run = |profile: &str| {
        docket(
            &ws,
            &home,
            &[
                "batch-adjudicate",
                "--yes",
                "--headless",
                "--profile",
                profile,
            ],
        )
    };
    let ghost = run("ghost");
    assert_eq!(ghost.status.code(), Some(2), "{}", stderr(&ghost));
    assert!(
        stderr(&ghost).contains("ghost") && stderr(&ghost).contains("known: elsewhere"),
        "{}",
        stderr(&ghost)
    );
    let other = run("elsewhere");
    assert_eq!(other.status.code(), Some(2), "{}", stderr(&other));
    let said = stderr(&other);
    assert!(
        said.contains("provider azure_eu") && said.contains("provider main"),
        "{said}"
    );

    let model = docket(
        &ws,
        &home,
        &[
            "profile",
            "set",
            "wrong-model",
            "--provider",
            "main",
            "--model",
            "gpt-9",
            "--rpm",
            "5",
        ],
    );
    assert_eq!(model.status.code(), Some(0), "{}", stderr(&model));
    let refused = run("wrong-model");
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("model gpt-9") && stderr(&refused).contains("model gpt-4o-mini"),
        "{}",
        stderr(&refused)
    );
    // Nothing was sent and no session made.
    assert_eq!(
        json(&docket(&ws, &home, &["sessions", "--format", "json"])),
        serde_json::json!([])
    );
}

#[test]
fn a_run_with_a_profile_is_paced_by_it_and_records_its_version() {
    // Every answer takes 150 ms; docket.toml allows 16 at once.
    let mock = Mock::start(&["--latency-median-ms", "150", "--latency-p99-ms", "150"]);
    let (ws, home) = workspace(&mock, 4);
    for rpm in ["6000", "3000"] {
        let o = docket(
            &ws,
            &home,
            &[
                "profile",
                "set",
                "single",
                "--provider",
                "main",
                "--rpm",
                rpm,
                "--concurrency",
                "1",
            ],
        );
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    }
    let run = docket(
        &ws,
        &home,
        &[
            "batch-adjudicate",
            "--yes",
            "--headless",
            "--profile",
            "single",
        ],
    );
    assert_eq!(
        run.status.code(),
        Some(0),
        "{}\n{}",
        stdout(&run),
        stderr(&run)
    );

    // One request at a time: the mock's answers at least ~150 ms apart.
    let mut at: Vec<u64> = mock
        .log()
        .iter()
        .filter(|e| {
            e["route"]
                .as_str()
                .is_some_and(|r| r.contains("chat/completions"))
        })
        .map(|e| e["at_ms"].as_u64().unwrap())
        .collect();
    at.sort_unstable();
    assert_eq!(at.len(), 4, "{at:?}");
    let closest = at.windows(2).map(|w| w[1] - w[0]).min().unwrap();
    assert!(
        closest >= 120,
        "answers {closest} ms apart: more than one in flight ({at:?})"
    );

    let sessions = json(&docket(&ws, &home, &["sessions", "--format", "json"]));
    assert_eq!(sessions[0]["profile"], "single@2", "{sessions}");
    let table = stdout(&docket(&ws, &home, &["sessions"]));
    let head: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(head[head.len() - 2..], ["profile", "resumable"], "{table}");
    assert_eq!(row[row.len() - 2..], ["single@2", "no"], "{table}");
    let id = sessions[0]["session_id"].as_str().unwrap();
    let results = stdout(&docket(&ws, &home, &["batch-results", id]));
    assert!(results.contains("Profile:    single@2"), "{results}");
    let (name, version): (String, i64) = ws
        .conn()
        .query_row(
            "SELECT profile_name, profile_version FROM llm_batch_session WHERE session_id = ?1",
            [id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!((name.as_str(), version), ("single", 2));
}

#[test]
fn a_resume_keeps_the_profile_version_the_session_started_with() {
    let mock = Mock::start(&["--latency-median-ms", "150", "--latency-p99-ms", "150"]);
    let (ws, home) = workspace(&mock, 3);
    let set = |concurrency: &str| {
        let o = docket(
            &ws,
            &home,
            &[
                "profile",
                "set",
                "p",
                "--provider",
                "main",
                "--concurrency",
                concurrency,
            ],
        );
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    };
    set("1");
    // A budget too small for one request: the session is made, then pauses.
    let paused = docket(
        &ws,
        &home,
        &[
            "batch-adjudicate",
            "--yes",
            "--headless",
            "--profile",
            "p",
            "--max-cost",
            "0.0000001",
        ],
    );
    assert_eq!(
        paused.status.code(),
        Some(4),
        "{}\n{}",
        stdout(&paused),
        stderr(&paused)
    );
    let sessions = json(&docket(&ws, &home, &["sessions", "--format", "json"]));
    let id = sessions[0]["session_id"].as_str().unwrap().to_string();
    assert_eq!(sessions[0]["profile"], "p@1");
    set("16");
    let resumed = docket(
        &ws,
        &home,
        &[
            "batch-adjudicate",
            "--yes",
            "--headless",
            "--resume",
            &id,
            "--max-cost",
            "10",
        ],
    );
    assert_eq!(
        resumed.status.code(),
        Some(0),
        "{}\n{}",
        stdout(&resumed),
        stderr(&resumed)
    );
    let mut at: Vec<u64> = mock
        .log()
        .iter()
        .filter(|e| {
            e["route"]
                .as_str()
                .is_some_and(|r| r.contains("chat/completions"))
        })
        .map(|e| e["at_ms"].as_u64().unwrap())
        .collect();
    at.sort_unstable();
    assert_eq!(at.len(), 3, "{at:?}");
    let closest = at.windows(2).map(|w| w[1] - w[0]).min().unwrap();
    assert!(closest >= 120, "version 2 (16 at once) was used: {at:?}");
    let sessions = json(&docket(&ws, &home, &["sessions", "--format", "json"]));
    assert_eq!(sessions[0]["profile"], "p@1", "{sessions}");
}

/// The same on a PostgreSQL ledger: profiles are stored, versioned and
/// recorded with the session there (migration 12 in PostgreSQL's dialect).
#[test]
fn profiles_work_on_a_postgres_ledger() {
    let server = support::pg::PgServer::start();
    let url = server.fresh_database();
    let mock = Mock::start(&[]);
    let ws = support::workspace(&Job::new(&format!("{}/v1", mock.base())));
    let home = tempfile::tempdir().expect("home");
    let items = ws.path().join("items/test.jsonl");
    let mut f = std::fs::File::create(&items).unwrap();
    docket::demo::write_chart_items(&mut f, 3, 99).unwrap();
    let on_pg = |args: &[&str]| {
        docket_at(ws.path(), home.path())
            .arg("--ledger")
            .arg(&url)
            .args(args)
            .output()
            .expect("run docket")
    };
    let imported = on_pg(&["import", items.to_str().unwrap()]);
    assert_eq!(imported.status.code(), Some(0), "{}", stderr(&imported));
    for rpm in ["100", "200"] {
        let o = on_pg(&["profile", "set", "pg", "--provider", "main", "--rpm", rpm]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    }
    let history = json(&on_pg(&["profile", "show", "pg", "--format", "json"]));
    assert_eq!(
        history[1]["limits"]["requests_per_minute"], 200,
        "{history}"
    );
    let run = on_pg(&["batch-adjudicate", "--yes", "--headless", "--profile", "pg"]);
    assert_eq!(
        run.status.code(),
        Some(0),
        "{}\n{}",
        stdout(&run),
        stderr(&run)
    );
    assert!(
        stdout(&run).contains("Rate limits: profile pg@2"),
        "{}",
        stdout(&run)
    );
    let sessions = json(&on_pg(&["sessions", "--format", "json"]));
    assert_eq!(sessions[0]["profile"], "pg@2", "{sessions}");
    let id = sessions[0]["session_id"].as_str().unwrap();
    let results = stdout(&on_pg(&["batch-results", id]));
    assert!(results.contains("Profile:    pg@2"), "{results}");
    assert!(
        !ws.ledger().exists(),
        "a SQLite ledger was made beside the PostgreSQL one"
    );
}
