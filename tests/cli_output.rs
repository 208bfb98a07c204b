//! What scripts and pipes see of the real binary: a reader that goes away
//! early is no error, and an unknown session is said one way everywhere.

use docket_testkit as support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use docket::mock::MockConfig;
use support::*;

fn docket(ws: &Workspace, home: &std::path::Path) -> Command {
    support::procs::docket_at(ws.path(), home)
}

/// A finished session of `items` mock items; its id.
async fn finished_session(items: usize) -> (docket::mock::MockServer, Workspace, String) {
    let (m, ws) = mocked(MockConfig::default(), items, |_| {}).await;
    let home = tempfile::tempdir().unwrap();
    let out = docket(&ws, home.path())
        .args(["batch-adjudicate", "--yes", "--headless"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let sid = docket::ledger::store::latest_session(&support::db(&ws.conn()))
        .unwrap()
        .expect("a session");
    (m, ws, sid)
}

/// `docket batch-results ID | head -1`: the reader closes the pipe after a
/// line, with far more than a pipe's buffer still to write. docket stops
/// quietly with exit 0, as `cat` would, instead of "writing the output
/// failed: Broken pipe".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_goes_away_early_is_no_error() {
    let (_m, ws, sid) = finished_session(400).await;
    let home = tempfile::tempdir().unwrap();
    for args in [
        vec!["batch-results", sid.as_str(), "--format", "csv"],
        vec!["batch-results", sid.as_str(), "--format", "json"],
        vec!["export", "--what", "results", "--format", "jsonl"],
        vec!["export", "--what", "requests", "--format", "csv"],
    ] {
        let mut child = docket(&ws, home.path())
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        assert!(!first.is_empty(), "{args:?}: no first line");
        // The pipe's reading end is dropped with the reader here.
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        assert!(err.is_empty(), "{args:?} said: {err}");
    }
}

/// Every command that takes a session id says the same when there is no
/// such session, with the same way out, and exits 2 (a usage error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_session_is_said_one_way_by_every_command() {
    let (_m, ws, sid) = finished_session(3).await;
    let home = tempfile::tempdir().unwrap();
    let wording =
        "unknown session \"nope\"; list the sessions in this ledger with `docket sessions`";
    for args in [
        vec!["console", "--session", "nope"],
        vec!["pause", "nope"],
        vec!["resume", "nope"],
        vec!["cancel", "nope"],
        vec!["stop-at-stage", "nope"],
        vec!["batch-results", "nope"],
        vec!["workers", "nope"],
        vec!["report", "nope", "-o", "-"],
        vec!["export", "--session", "nope"],
        vec![
            "batch-adjudicate",
            "--resume",
            "nope",
            "--yes",
            "--headless",
        ],
    ] {
        let out = docket(&ws, home.path())
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(wording), "{args:?} said: {err}");
    }
    // The session that is there is still found.
    let out = docket(&ws, home.path())
        .args(["workers", &sid])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

/// `--dry-run` gives the shortest duration beside the cost: the requests
/// under the binding requests/min limit (`--rate-limit` counts), or says the
/// provider's speed decides when it has no limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dry_run_gives_a_duration_beside_the_cost() {
    let (_m, ws) = mocked(MockConfig::default(), 50, |_| {}).await;
    let home = tempfile::tempdir().unwrap();
    let dry = |extra: &[&str]| {
        let out = docket(&ws, home.path())
            .args(["batch-adjudicate", "--dry-run"])
            .args(extra)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let said = dry(&["--rate-limit", "60"]);
    assert!(
        said.contains(
            "duration: at least ~50s (50 requests under provider main's requests_per_minute = 60)"
        ),
        "{said}"
    );
    let said = dry(&["--rate-limit", "6"]);
    assert!(said.contains("duration: at least ~8m"), "{said}");
    // The job's own provider has no limits.
    let said = dry(&[]);
    assert!(
        said.contains(
            "duration: provider main has no requests/min or tokens/min limit, so its speed decides"
        ),
        "{said}"
    );
}
