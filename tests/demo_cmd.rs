//! `docket demo`: its job is a generator and its critic with an audit
//! sample, it runs in `--workspace DIR` when given, and it refuses a
//! workspace it did not write (it wipes the ledger of its folder).

use docket_testkit as support;

use std::path::Path;
use std::process::{Command, Output};

fn docket(home: &Path, args: &[&str]) -> Output {
    let p = |s: &str| home.join(s).display().to_string();
    Command::new(support::procs::bin())
        .env_remove("NO_COLOR")
        .env_remove("DOCKET_WORKSPACE")
        .env_remove("DOCKET_LOG")
        .env("HOME", p("home"))
        .env("XDG_DATA_HOME", p("data"))
        .env("XDG_STATE_HOME", p("state"))
        .env("XDG_CONFIG_HOME", p("config"))
        .env("DOCKET_CONFIG_DIR", p("config/docket"))
        .args(args)
        .output()
        .expect("docket runs")
}

#[test]
fn demo_runs_a_critic_with_an_audit_sample_in_the_given_workspace() {
    let home = tempfile::tempdir().expect("tempdir");
    let ws = home.path().join("try");
    let ws_s = ws.display().to_string();
    let out = docket(
        home.path(),
        &["--workspace", &ws_s, "demo", "--headless", "--items", "30"],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(&format!("workspace {ws_s}")), "{stdout}");
    assert!(ws.join(".docket-demo").exists());
    assert!(
        !home.path().join("data/docket/demo").exists(),
        "the data dir's demo folder was not used"
    );
    let conn = docket::ledger::open_read_only(&ws.join("docket.sqlite")).expect("ledger");
    let one = |sql: &str| -> String {
        conn.query_row(sql, [], |r| r.get(0))
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    };
    assert_eq!(
        one(
            "SELECT group_concat(stage || ':' || role, ',') FROM (SELECT stage, role FROM run_stages ORDER BY position)"
        ),
        "adjudicate:generator,critic:critic"
    );
    let judged: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM llm_batch_result WHERE critic_verdict IS NOT NULL",
            [],
            |r| r.get(0),
        )
        .expect("count");
    assert!(judged > 0, "the critic judged no answer");
    let snapshot: serde_json::Value =
        serde_json::from_str(&one("SELECT config_snapshot_json FROM llm_batch_session"))
            .expect("snapshot");
    let routing = &snapshot["config"]["routing"];
    assert_eq!(routing["audit_accept_share"], 0.1, "{routing}");
    assert_eq!(routing["audit_reject_share"], 0.1, "{routing}");

    // A workspace the demo did not write is refused, its files untouched.
    let other = home.path().join("mine");
    let other_s = other.display().to_string();
    assert!(docket(home.path(), &["init", &other_s]).status.success());
    let before = std::fs::read(other.join("docket.toml")).expect("toml");
    let out = docket(
        home.path(),
        &[
            "--workspace",
            &other_s,
            "demo",
            "--headless",
            "--items",
            "5",
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("`docket demo` did not write it"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read(other.join("docket.toml")).expect("toml"),
        before
    );
    assert!(!other.join("docket.sqlite").exists());
}
