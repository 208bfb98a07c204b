//! Review → correct → calibrate, end to end: the real binary in tmux. A
//! finished session of the critic example with an audit sample; in the
//! console the calibration page first says there is no human decision, then
//! an item is corrected with `e`, two accepted and one rejected, and the
//! page counts them; `docket calibrate --format json` gives the same
//! figures. The critic's confidences are charted apart from the generator's.

use docket_testkit as support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use docket::ledger::console::ConsoleReads;
use rusqlite::Connection;
use support::tmux::{Pane, env_line, poll, sh_quote};

const WAIT: Duration = Duration::from_secs(15);

/// The environment every docket of this test gets: its own home.
fn vars(home: &Path) -> Vec<(String, String)> {
    let p = |s: &str| home.join(s).display().to_string();
    vec![
        ("HOME".into(), p("home")),
        ("XDG_DATA_HOME".into(), p("data")),
        ("XDG_STATE_HOME".into(), p("state")),
        ("XDG_CONFIG_HOME".into(), p("config")),
        ("DOCKET_CONFIG_DIR".into(), p("config/docket")),
        ("USER".into(), "alice".into()),
    ]
}

/// Run docket to completion; panic unless it exits 0. Its stdout.
fn run(home: &Path, args: &[&str]) -> String {
    let mut c = Command::new(support::procs::bin());
    c.env_remove("NO_COLOR")
        .env_remove("DOCKET_WORKSPACE")
        .env_remove("DOCKET_LOG");
    let out = c.envs(vars(home)).args(args).output().expect("docket runs");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "docket {args:?}\nstdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The critic example, its mock quick, a third of the would-be accepts
/// audited; 30 demo items run to the end. The workspace and the session.
fn finished_session(home: &Path) -> (PathBuf, String) {
    let ws = home.join("ws");
    let ws_s = ws.display().to_string();
    run(home, &["init", &ws_s, "--example", "critic"]);
    let toml_path = ws.join("docket.toml");
    let toml = std::fs::read_to_string(&toml_path).expect("docket.toml");
    let quick = toml
        .replace("latency_median_ms = 80.0", "latency_median_ms = 5.0")
        .replace("latency_p99_ms = 300.0", "latency_p99_ms = 20.0")
        .replace(
            "review_threshold = 0.60\n",
            "review_threshold = 0.60\naudit_accept_share = 0.3\n",
        );
    assert!(
        quick.contains("latency_median_ms = 5.0") && quick.contains("audit_accept_share"),
        "the example moved"
    );
    std::fs::write(&toml_path, quick).expect("write docket.toml");
    let items = ws.join("items/e2e.jsonl");
    let mut f = std::fs::File::create(&items).expect("items");
    docket::demo::write_chart_items(&mut f, 30, 7).expect("write items");
    drop(f);
    run(
        home,
        &["--workspace", &ws_s, "import", &items.display().to_string()],
    );
    let out = run(
        home,
        &[
            "--workspace",
            &ws_s,
            "batch-adjudicate",
            "--headless",
            "--yes",
        ],
    );
    assert!(out.contains("Results: docket batch-results"), "{out}");
    let conn = docket::ledger::open(&ws.join("docket.sqlite")).expect("ledger");
    let session = docket::ledger::store::latest_session(&support::db(&conn))
        .expect("read")
        .expect("a session");
    (ws, session)
}

fn count(conn: &Connection, sql: &str) -> i64 {
    conn.query_row(sql, [], |r| r.get(0))
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Wait until the ledger holds `n` decided review items.
fn decided(conn: &Connection, n: i64) {
    poll("the decision in the ledger", WAIT, || {
        let got = count(
            conn,
            "SELECT COUNT(*) FROM review_item WHERE status IN ('accepted', 'rejected')",
        );
        if got == n {
            Ok(())
        } else {
            Err(format!("{got} decided"))
        }
    });
}

#[test]
fn review_correct_then_calibrate_in_the_console_and_on_the_command_line() {
    let home = tempfile::tempdir().expect("tempdir");
    let (ws, session) = finished_session(home.path());
    let ws_s = ws.display().to_string();
    let ledger = ws.join("docket.sqlite");
    let conn = docket::ledger::open_read_only(&ledger).expect("read-only ledger");
    let pending = count(
        &conn,
        "SELECT COUNT(*) FROM review_item WHERE status = 'pending'",
    );
    assert!(pending >= 4, "only {pending} pending review items");
    let audited = count(&conn, "SELECT COUNT(*) FROM review_item WHERE audit = 1");
    assert!(audited >= 1, "the audit sample sent nothing to review");

    // The critic's own confidences are a histogram of their own.
    let charts = docket::ledger::Ledger::open_read_only(&ledger)
        .expect("console handle")
        .charts(&session)
        .expect("charts");
    let stages: Vec<&str> = charts.confidence.iter().map(|h| h.stage.as_str()).collect();
    assert_eq!(stages, ["adjudicate", "critic"], "{charts:?}");
    let nobody = charts.calibration.as_ref().map(|c| c.overall.reviewed);
    assert_eq!(nobody, Some(0), "no human decision yet");

    let cmd = format!(
        "{} {} --workspace {} review",
        env_line(vars(home.path())),
        sh_quote(support::procs::bin()),
        sh_quote(&ws_s)
    );
    let pane = Pane::start("calibrate", &cmd, 120, 40);
    pane.wait("the review queue", WAIT, |s| s.contains("a accept"));

    // Before any decision: the calibration page says so.
    pane.keys(&["v"]);
    pane.wait_for("tab: calibration", WAIT);
    pane.keys(&["Tab"]);
    pane.wait_for("No human decisions yet in this session.", WAIT);
    pane.keys(&["Escape"]);

    // Correct the first item: its card, `e`, the first field edited, Enter.
    pane.keys(&["Enter"]);
    // The card shows the critic's verdict beside the generator's answer.
    pane.wait("the card with the critic's verdict", WAIT, |s| {
        s.contains("Evidence") && s.contains("VERDICT: ")
    });
    pane.keys(&["e"]);
    pane.wait_for("Correct the answer", WAIT);
    pane.keys(&["Down"]);
    pane.keys(&["x"]);
    pane.keys(&["Enter"]);
    pane.wait_for("Corrected 1 item (u undoes)", WAIT);
    decided(&conn, 1);
    let corrected = count(
        &conn,
        "SELECT COUNT(*) FROM review_log WHERE corrected_answer_json IS NOT NULL",
    );
    assert_eq!(corrected, 1, "the correction is in the review log");

    // Two accepts and a reject.
    pane.keys(&["a"]);
    decided(&conn, 2);
    pane.keys(&["a"]);
    decided(&conn, 3);
    pane.keys(&["r"]);
    decided(&conn, 4);

    // The calibration page counts them, as `docket calibrate` does.
    let json = run(
        home.path(),
        &["--workspace", &ws_s, "calibrate", "--format", "json"],
    );
    let cal: serde_json::Value = serde_json::from_str(&json).expect("calibrate json");
    assert_eq!(cal["session_id"], session.as_str());
    assert_eq!(cal["reviewed"], 4, "{cal}");
    assert_eq!(
        cal["agreed"], 2,
        "the correction and the reject disagree: {cal}"
    );
    let want = format!(
        "4 reviewed ({} from the audit sample) · agreed 50.0%",
        cal["audited"]
    );
    let accept = cal["thresholds"]["auto_accept"]
        .as_f64()
        .expect("threshold");
    let current = format!("auto-accept ≥ {accept:.2} now: precision");
    pane.keys(&["v"]);
    pane.keys(&["Tab"]);
    let screen = pane.wait(&want, WAIT, |s| s.contains(&want));
    assert!(screen.contains(&current), "{screen}");
    assert!(
        screen.contains("at least 10 reviewed items are needed"),
        "{screen}"
    );

    // Undo names the correction when it is what is undone: back in the
    // queue, three undos walk back the reject, the accepts, then it.
    pane.keys(&["Escape"]);
    for _ in 0..3 {
        pane.keys(&["u"]);
    }
    decided(&conn, 1);
    pane.keys(&["u"]);
    pane.wait_for("Undid correction of", WAIT);
    decided(&conn, 0);
    pane.keys(&["q"]);
    let s = pane.wait_for("EXIT=", WAIT);
    assert!(s.contains("EXIT=0"), "{s}");
}
