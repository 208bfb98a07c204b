//! The crash soak's short version (the long one: `cargo bench --bench
//! soak`): per mode, trials with fixed seeds, each interrupted by SIGKILL at
//! a random moment or at a named failpoint one to three times, resumed to
//! the end, with the ledger and the mock's billing log checked after every
//! run (fault-matrix rows P3, P4; invariants I1–I6).

mod support;

use support::soak::{Cut, Mode, plan, power_loss_trial, trial};

const ITEMS: usize = 40;

fn soak(mode: Mode, seeds: &[u64]) {
    let _serial = support::serial();
    for &seed in seeds {
        if let Err(e) = trial(mode, seed, ITEMS) {
            panic!(
                "{} trial with seed {seed} failed (replay: cargo bench --bench soak -- --mode {} --seed {seed}): {e}",
                mode.name(),
                mode.name()
            );
        }
    }
}

#[test]
fn soak_sync() {
    soak(Mode::Sync, &[1, 2, 3]);
}

#[test]
fn soak_batch_openai() {
    soak(Mode::BatchOpenai, &[1, 4]);
}

#[test]
fn soak_batch_anthropic() {
    soak(Mode::BatchAnthropic, &[1, 4]);
}

#[test]
fn soak_batch_gemini() {
    soak(Mode::BatchGemini, &[1, 4]);
}

/// Row P7: each kill is also a power loss that drops every WAL byte the
/// killed run had not synced. The intents are synced, so the oracle still
/// finds every billed request on record (the answers committed with
/// `synchronous = NORMAL` may be lost: their requests are on record as
/// sent, become ambiguous and go again). With intents unsynced this fails
/// ("billed but is not in the ledger"). The seeds' plans kill at
/// `after_answer` and `after_intent` and at random moments.
#[test]
fn p7_a_power_loss_after_a_kill_loses_no_intent() {
    let _serial = support::serial();
    let (mut losses, mut lost) = (0, 0);
    for (mode, seed) in [
        (Mode::Sync, 1),
        (Mode::Sync, 6),
        (Mode::Sync, 12),
        (Mode::BatchOpenai, 1),
    ] {
        let r = power_loss_trial(mode, seed, ITEMS).unwrap_or_else(|e| {
            panic!(
                "{} power-loss trial with seed {seed} failed (replay: cargo bench --bench soak -- --power-loss --mode {} --seed {seed}): {e}",
                mode.name(),
                mode.name()
            )
        });
        losses += r.power_losses;
        lost += r.wal_bytes_lost;
    }
    // A simulation that lost nothing would prove nothing.
    assert!(
        losses > 0 && lost > 0,
        "{losses} power losses dropped {lost} WAL bytes"
    );
}

/// Row P4 in each mode: every failpoint the mode passes is armed at least
/// once by the seeds of `cargo test` and the bench's first seeds.
#[test]
fn the_short_soak_reaches_failpoints_in_every_mode() {
    for mode in Mode::ALL {
        let armed = (1..=20u64)
            .flat_map(|seed| plan(mode, seed))
            .filter(|c| matches!(c, Cut::Failpoint(..)))
            .count();
        assert!(armed > 0, "{}: no failpoint in 20 seeds", mode.name());
    }
}

fn docket(ws: &support::Workspace, home: &std::path::Path) -> std::process::Command {
    let mut c = std::process::Command::new(support::procs::BIN);
    c.arg("--workspace")
        .arg(ws.path())
        .env("HOME", home)
        .env("XDG_DATA_HOME", home.join("data"))
        .env_remove("DOCKET_WORKSPACE")
        .env_remove(docket::failpoint::ENV);
    c
}

/// Row P4, `mid_migration`: killed inside the migration's transaction (a
/// fresh ledger: every migration in one), the ledger is left as it was and
/// the next command migrates it cleanly.
#[test]
fn p4_mid_migration_leaves_the_ledger_as_it_was_and_re_runs_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::Workspace {
        dir: tempfile::tempdir_in(dir.path()).unwrap(),
    };
    docket::workspace::init(ws.path(), false).unwrap();
    let home = tempfile::tempdir().unwrap();
    let items = ws.path().join("items/few.jsonl");
    std::fs::write(&items, "{\"id\":\"a\",\"x\":1}\n{\"id\":\"b\",\"x\":2}\n").unwrap();
    for pass in 1..=3 {
        let out = docket(&ws, home.path())
            .arg("import")
            .arg(&items)
            .env(docket::failpoint::ENV, format!("mid_migration:{pass}"))
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            None,
            "killed at migration {pass}: {out:?}"
        );
        let conn = rusqlite::Connection::open(ws.ledger()).unwrap();
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, 0, "nothing of the migration stayed");
        let ok: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(ok, "ok");
    }
    let out = docket(&ws, home.path())
        .arg("import")
        .arg(&items)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        support::count(&ws.conn(), "SELECT COUNT(*) FROM decision", []),
        2
    );
}

/// Row P4, `mid_export`: killed halfway through writing an export, no
/// file that looks complete is left under the name asked for, and an
/// earlier export of that name is untouched; the next export is whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p4_mid_export_never_leaves_a_partial_file_under_its_name() {
    let (_m, ws) = support::mocked(docket::mock::MockConfig::default(), 30, |_| {}).await;
    let (report, _) = support::run(support::options(&ws)).await;
    let sid = report.session.unwrap().session_id;
    let home = tempfile::tempdir().unwrap();
    let out = ws.path().join("items.csv");
    let export = |failpoint: Option<&str>| {
        let mut c = docket(&ws, home.path());
        c.args(["export", "--session", &sid, "--what", "items", "-o"])
            .arg(&out);
        if let Some(f) = failpoint {
            c.env(docket::failpoint::ENV, f);
        }
        c.output().unwrap()
    };
    let killed = export(Some("mid_export:10"));
    assert_eq!(killed.status.code(), None, "killed mid-export: {killed:?}");
    assert!(!out.exists(), "a partial export under the name asked for");
    let whole = export(None);
    assert!(whole.status.success(), "{whole:?}");
    let first = std::fs::read_to_string(&out).unwrap();
    assert_eq!(first.lines().count(), 31, "a header and 30 items");
    // Written over, an export keeps the mode it had (shared stays shared).
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(export(None).status.success());
    let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o644);
    let killed = export(Some("mid_export:10"));
    assert_eq!(killed.status.code(), None);
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        first,
        "the earlier export is untouched"
    );
}

/// A 20-item run at concurrency 4 with the failpoint `spec` armed, ended
/// with exit `code`; its ledger checked for the invariants.
async fn run_with_panics(
    spec: &str,
    code: i32,
) -> (support::Workspace, rusqlite::Connection, String) {
    let (_m, ws) = support::mocked(docket::mock::MockConfig::default(), 20, |job| {
        job.concurrency = 4;
    })
    .await;
    let home = tempfile::tempdir().unwrap();
    let out = docket(&ws, home.path())
        .args(["batch-adjudicate", "--yes", "--headless"])
        .env(docket::failpoint::ENV, spec)
        .output()
        .unwrap();
    let text = support::said(&out);
    assert_eq!(out.status.code(), Some(code), "{text}");
    let conn = ws.conn();
    let sid: String = conn
        .query_row("SELECT session_id FROM llm_batch_session", [], |r| r.get(0))
        .unwrap();
    support::check_invariants(&conn, &sid);
    (ws, conn, sid)
}

/// Row P6: a panic in one request's handling (armed at its answer, as a
/// bug in a parser would) is confined to it: its attempt, answered but
/// never recorded, is closed as ambiguous (it was billed), the request goes
/// again and the item gets its result like every other; the process goes
/// on and the run exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p6_a_panic_in_one_request_is_retried_with_its_attempt_ambiguous() {
    let (_ws, conn, sid) = run_with_panics("after_answer:5:panic", 0).await;
    assert_eq!(
        support::count(
            &conn,
            "SELECT COUNT(*) FROM llm_batch_result WHERE outcome != 'error'",
            []
        ),
        20
    );
    let ambiguous: Vec<(i64, String)> = conn
        .prepare("SELECT request_id, error_message FROM llm_messages WHERE state = 'ambiguous'")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(ambiguous.len(), 1, "{ambiguous:?}");
    let (request, message) = &ambiguous[0];
    assert!(
        message.contains("internal error")
            && message.contains("failpoint after_answer")
            && message.contains("may have been billed"),
        "{message}"
    );
    // Sent again under the next attempt number, and answered.
    assert_eq!(
        support::count(
            &conn,
            "SELECT COUNT(*) FROM llm_messages WHERE request_id = ?1 AND state = 'answered'",
            [request]
        ),
        1
    );
    assert_eq!(
        support::count(
            &conn,
            "SELECT ambiguous_count FROM llm_batch_session WHERE session_id = ?1",
            [&sid]
        ),
        1
    );
}

/// Row P6, a bug that never goes away: from the 15th answer on, every
/// answer's handling panics. Each item hit is tried `max_attempts` (3)
/// times, each attempt closed as ambiguous, then fails with the panic's
/// message; the process lives on, every item has its one result, and the
/// run exits 5 (completed with items in error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p6_a_panic_every_time_fails_the_item_after_its_attempts() {
    let (_ws, conn, _sid) = run_with_panics("after_answer:15+:panic", 5).await;
    assert_eq!(
        support::count(&conn, "SELECT COUNT(*) FROM llm_batch_result", []),
        20
    );
    let failed: Vec<(i64, String)> = conn
        .prepare("SELECT request_id, error_message FROM llm_batch_result WHERE outcome = 'error'")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    // Answers 1-14 pass; every item whose answer came after fails.
    assert!(failed.len() >= 6, "{failed:?}");
    for (request, message) in &failed {
        assert!(
            message.contains("failpoint after_answer") && message.contains("(3 times)"),
            "{message}"
        );
        assert_eq!(
            support::count(
                &conn,
                "SELECT COUNT(*) FROM llm_messages WHERE request_id = ?1 AND state = 'ambiguous'",
                [request]
            ),
            3,
            "request {request}"
        );
    }
}
