//! The crash soak's short version (the long one: `cargo bench --bench
//! soak`): per mode, trials with fixed seeds, each interrupted by SIGKILL at
//! a random moment or at a named failpoint one to three times, resumed to
//! the end, with the ledger and the mock's billing log checked after every
//! run (fault-matrix rows P3, P4; invariants I1–I6).

use docket_testkit as support;

use support::soak::{Cut, Mode, plan, power_loss_trial, trial, trial_at};

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

/// Row P4, every failpoint armed on purpose, not only when a seed's plan
/// draws it: in each mode, each durable step the mode passes kills the
/// process there, the run is resumed to the end, and the trial's checks
/// hold after each run (integrity, one result per item, monotone progress,
/// the billing log against the ledger, no batch created twice, the key
/// nowhere). Then each step's own result: an answer killed before its
/// commit was billed and is on record as an ambiguous attempt (its resend
/// counted); an intent killed before its send is ambiguous too (it might
/// have left); a batch killed between create and record is adopted, not
/// made again; results killed mid-ingest are read again without a second
/// result for any item.
#[test]
fn p4_each_failpoint_armed_in_every_mode_has_its_result() {
    let _serial = support::serial();
    for mode in Mode::ALL {
        for &(name, _) in mode.failpoints() {
            // Mid-run: a step passed once per item at its fifth pass.
            let pass = match name {
                "after_intent" | "after_answer" | "mid_ingest" => 5,
                _ => 1,
            };
            // Fewer items than a soak trial: 13 runs, each killed and resumed.
            let r = trial_at(mode, 1, Cut::Failpoint(name, pass), 16)
                .unwrap_or_else(|e| panic!("{} with {name}:{pass} armed: {e}", mode.name()));
            let what = format!("{} {name}:{pass}: {r:?}", mode.name());
            assert_eq!(r.kills, 1, "the failpoint fired: {what}");
            match name {
                "after_answer" => assert!(
                    r.billed_unrecorded >= 1 && r.ambiguous >= r.billed_unrecorded as i64,
                    "{what}"
                ),
                "after_intent" => assert!(r.ambiguous >= 1, "{what}"),
                "after_create" | "after_upload" | "mid_ingest" => {
                    assert!(r.batches_created >= 1, "{what}")
                }
                _ => {}
            }
        }
    }
}

fn docket(ws: &support::Workspace, home: &std::path::Path) -> std::process::Command {
    let mut c = support::procs::docket_at(ws.path(), home);
    c.env_remove(docket::failpoint::ENV);
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

/// Row C4, concurrent exports: while a run writes the ledger, six exports
/// of the same session to the same file run at once, again and again.
/// Each one succeeds and reads one consistent snapshot (a header, then
/// whole rows, one per item processed by then, never more than the run
/// has); the file under the name is always one whole export, never two
/// interleaved or a partial one; no temporary file is left beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c4_concurrent_exports_to_one_file_each_leave_it_whole() {
    let (_m, ws) = support::mocked(support::latency(150.0, 300.0), 60, |job| {
        job.concurrency = 4;
    })
    .await;
    let home = tempfile::tempdir().unwrap();
    let mut run = docket(&ws, home.path())
        .args(["batch-adjudicate", "--yes", "--headless"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let sid = support::session_created(&ws).await;
    let dir = ws.path().join("out");
    std::fs::create_dir(&dir).unwrap();
    let out = dir.join("items.jsonl");
    let mut rounds = 0;
    let mut sizes = std::collections::BTreeSet::new();
    loop {
        let running = run.try_wait().unwrap().is_none();
        let exports: Vec<_> = (0..6)
            .map(|_| {
                docket(&ws, home.path())
                    .args([
                        "export",
                        "--session",
                        &sid,
                        "--what",
                        "items",
                        "--format",
                        "jsonl",
                        "-o",
                    ])
                    .arg(&out)
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for e in exports {
            let o = e.wait_with_output().unwrap();
            assert!(o.status.success(), "{}", support::said(&o));
        }
        let text = std::fs::read_to_string(&out).unwrap();
        let rows: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("a torn row {l:?}: {e}")))
            .collect();
        let ids: std::collections::BTreeSet<_> =
            rows.iter().map(|r| r["item_id"].to_string()).collect();
        assert_eq!(
            ids.len(),
            rows.len(),
            "a row twice: two exports interleaved"
        );
        assert!(rows.len() <= 60);
        sizes.insert(rows.len());
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            names,
            vec![std::ffi::OsString::from("items.jsonl")],
            "left beside it"
        );
        rounds += 1;
        if !running {
            assert_eq!(rows.len(), 60, "after the run: every item");
            break;
        }
    }
    assert!(run.wait().unwrap().success());
    assert!(
        rounds >= 2,
        "exports ran while the run wrote ({rounds} rounds)"
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

/// Row P6, memory pressure: under an address-space limit (`ulimit -v`),
/// memory runs out in the middle of the run (at the 7th answer the
/// failpoint allocates blocks until the limit refuses one). The
/// process aborts the way Rust does on allocation failure, like a kill -9
/// (row P3): `--resume` then finishes every item once, the answer that
/// was never committed is an ambiguous attempt, and every request the mock
/// answered is on record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p6_memory_exhausted_mid_run_aborts_and_resume_loses_nothing() {
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    let (m, ws) = support::mocked(docket::mock::MockConfig::default(), 20, |job| {
        job.concurrency = 2;
    })
    .await;
    let home = tempfile::tempdir().unwrap();
    const LIMIT: u64 = 2 << 30;
    let mut first = docket(&ws, home.path());
    first
        .args(["batch-adjudicate", "--yes", "--headless"])
        .env(docket::failpoint::ENV, "after_answer:7:oom");
    // SAFETY: setrlimit(2) only, between fork and exec.
    unsafe {
        first.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: LIMIT,
                rlim_max: LIMIT,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = first.output().unwrap();
    let text = support::said(&out);
    assert_eq!(out.status.signal(), Some(libc::SIGABRT), "{text}");
    assert!(text.contains("memory allocation of"), "{text}");
    let conn = ws.conn();
    let sid: String = conn
        .query_row("SELECT session_id FROM llm_batch_session", [], |r| r.get(0))
        .unwrap();
    let done_before = support::count(&conn, "SELECT COUNT(*) FROM llm_batch_result", []);
    assert!(done_before < 20, "it died mid-run ({done_before} done)");

    let out = docket(&ws, home.path())
        .args(["batch-adjudicate", "--yes", "--headless", "--resume", &sid])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", support::said(&out));
    support::check_invariants(&conn, &sid);
    support::check_complete(&conn, &sid);
    let ambiguous = support::count(
        &conn,
        "SELECT COUNT(*) FROM llm_messages WHERE state = 'ambiguous'",
        [],
    );
    assert!(
        ambiguous >= 1,
        "the answer lost with the process is ambiguous"
    );
    // Every request the mock answered is on record: answered, or ambiguous
    // (the one answered as memory ran out among them; a request in flight
    // then may or may not have reached the mock).
    let answered = support::count(
        &conn,
        "SELECT COUNT(*) FROM llm_messages WHERE state = 'answered'",
        [],
    );
    let billed = m.stats().ok as i64;
    assert!(
        billed > answered && billed <= answered + ambiguous,
        "billed {billed}, answered {answered}, ambiguous {ambiguous}"
    );
}
