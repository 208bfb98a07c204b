//! Fault-matrix rows P1 (one Ctrl-C while many requests are in flight),
//! X4 (hostile text on its way into docket's own log) and D1 (another
//! process holding the ledger's write lock past the busy timeout), each
//! end to end: the real binary, a real SQLite ledger file, the built-in
//! mock provider over HTTP on loopback.

use docket_testkit as support;

use std::path::Path;
use std::time::{Duration, Instant};

use support::procs::{Proc, docket_at, log_file};
use support::*;

/// `SELECT COUNT(*)`-style query on a fresh connection to the ledger.
fn n(ws: &Workspace, sql: &str, p: impl rusqlite::Params) -> i64 {
    count(&ws.conn(), sql, p)
}

fn processed(ws: &Workspace) -> i64 {
    n(
        ws,
        "SELECT COALESCE(MAX(processed_count), 0) FROM llm_batch_session",
        [],
    )
}

fn latest_session(ws: &Workspace) -> String {
    docket::ledger::store::latest_session(&db(&ws.conn()))
        .unwrap()
        .expect("a session")
}

/// Wait (off the async runtime) for `child` to exit; its code and output.
async fn exit_of(mut child: Proc, timeout: Duration) -> (Option<i32>, String) {
    tokio::task::spawn_blocking(move || child.wait(timeout))
        .await
        .unwrap()
}

// ------------------------------------------------------------------ P1

/// Row P1: one SIGINT while ~24 requests are in flight. From the ledger:
/// no attempt is started after the signal (plus 200 ms), and nothing new
/// reaches the provider after it; answers that land within the grace are
/// committed; what is still open when the grace ends is ambiguous, none
/// left `sent`; every lease is let go; exit 130; and `--resume` finishes
/// every item exactly once, paying again at most the ambiguous ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p1_one_ctrl_c_stops_sending_at_once_and_resume_finishes_every_item_once() {
    const ITEMS: usize = 160;
    const GRACE: f64 = 0.6;
    const SLACK: f64 = 0.2;
    let mut cfg = latency(450.0, 900.0);
    // Some requests are never answered: they are surely still in flight
    // when the grace ends. Some fail with a 500: no retry of theirs may
    // go out after the signal either.
    cfg.hang = 0.05;
    cfg.fail_500 = 0.1;
    let (m, ws) = mocked(cfg, ITEMS, |job| {
        job.concurrency = 24;
        job.transport_attempts = 10;
    })
    .await;
    let home = tempfile::tempdir().unwrap();
    let mut run = docket_at(ws.path(), home.path());
    run.args([
        "batch-adjudicate",
        "--yes",
        "--headless",
        "--grace",
        &GRACE.to_string(),
    ]);
    let child = Proc::start(run, "docket run".into(), home.path().join("run.out"));
    // Under way, with many requests out and at least two of them hung.
    poll(
        "a run with many requests in flight",
        Duration::from_secs(30),
        || {
            let open = n(
                &ws,
                "SELECT COUNT(*) FROM llm_messages WHERE state = 'sent'",
                [],
            );
            (processed(&ws) >= 20 && open >= 12 && m.stats().hangs >= 2).then_some(())
        },
    )
    .await;
    let signal_at = docket::ledger::now_ts();
    // SAFETY: kill(2) on the pid of our own child, not yet reaped.
    assert_eq!(0, unsafe {
        libc::kill(child.pid() as libc::pid_t, libc::SIGINT)
    });
    let signal_clock = Instant::now();
    let open_at_signal = n(
        &ws,
        "SELECT COUNT(*) FROM llm_messages WHERE state = 'sent'",
        [],
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let reached_mock = m.stats().requests;
    let (code, out) = exit_of(child, Duration::from_secs(30)).await;
    let took = signal_clock.elapsed();
    assert_eq!(code, Some(130), "{out}");
    assert!(out.contains("Session saved. Resume with:"), "{out}");
    assert!(
        took < Duration::from_secs_f64(GRACE + 5.0),
        "the stop took {took:?}"
    );
    let sid = latest_session(&ws);
    let conn = ws.conn();
    let state: String = conn
        .query_row(
            "SELECT state FROM llm_batch_session WHERE session_id = ?1",
            [&sid],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(state, "cancelled");
    check_invariants(&conn, &sid);

    // Stop claiming at once: no attempt recorded after the signal + slack.
    let late: Vec<(i64, i64, f64)> = conn
        .prepare(
            "SELECT request_id, attempt, sent_at - ?1 FROM llm_messages
             WHERE sent_at > ?1 + ?2 ORDER BY sent_at",
        )
        .unwrap()
        .query_map(rusqlite::params![signal_at, SLACK], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert!(
        late.is_empty(),
        "attempts started after the signal (request, attempt, seconds after): {late:?}"
    );
    // ... and nothing reached the provider once the signal was half a
    // second old.
    assert_eq!(
        m.stats().requests,
        reached_mock,
        "requests reached the provider after the signal"
    );
    // Answers that landed within the grace were committed.
    let answered_in_grace = count(
        &conn,
        "SELECT COUNT(*) FROM llm_messages WHERE state = 'answered' AND finished_at > ?1",
        [signal_at],
    );
    assert!(
        answered_in_grace >= 1,
        "no answer was committed after the signal ({open_at_signal} were in flight)"
    );
    let answered_after_grace = count(
        &conn,
        "SELECT COUNT(*) FROM llm_messages WHERE state = 'answered' AND finished_at > ?1",
        [signal_at + GRACE + 1.0],
    );
    assert_eq!(
        answered_after_grace, 0,
        "answers committed long after the grace"
    );
    // What was still out when the grace ended is ambiguous; nothing stays open.
    assert_eq!(
        0,
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_messages WHERE state = 'sent'",
            []
        )
    );
    let ambiguous = count(
        &conn,
        "SELECT COUNT(*) FROM llm_messages WHERE state = 'ambiguous'",
        [],
    );
    assert!(
        ambiguous >= 2,
        "the hung requests are ambiguous after the grace ({ambiguous})"
    );
    let counted: i64 = conn
        .query_row(
            "SELECT ambiguous_count FROM llm_batch_session WHERE session_id = ?1",
            [&sid],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(
        counted, ambiguous,
        "the session counts its ambiguous attempts"
    );
    // Every lease let go at once, and the worker has left.
    assert_eq!(
        0,
        count(
            &conn,
            "SELECT COUNT(*) FROM session_item WHERE session_id = ?1 AND lease_until IS NOT NULL",
            [&sid]
        ),
        "items still leased after the stop"
    );
    assert_eq!(
        0,
        count(
            &conn,
            "SELECT COUNT(*) FROM session_worker WHERE session_id = ?1 AND (ended_at IS NULL OR claims != 0)",
            [&sid]
        ),
        "a worker row still holds claims"
    );
    // For a failure's report: how close to the signal the last send was.
    let last_sent: f64 = conn
        .query_row(
            "SELECT MAX(sent_at) - ?1 FROM llm_messages",
            [signal_at],
            |r| r.get(0),
        )
        .unwrap();
    eprintln!(
        "P1: {open_at_signal} in flight at the signal, {answered_in_grace} answered in the grace, \
         {ambiguous} ambiguous, last send {last_sent:+.3} s from the signal, stopped in {took:?}"
    );
    let before = processed(&ws);
    assert!((before as usize) < ITEMS, "the run ended before the signal");
    drop(conn);

    // Resume, with the provider healthy: every item once.
    let mut plain = latency(20.0, 40.0);
    plain.seed = 7;
    m.set_config(plain);
    let out = docket_at(ws.path(), home.path())
        .args(["batch-adjudicate", "--yes", "--headless", "--resume", &sid])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let conn = ws.conn();
    check_complete(&conn, &sid);
    assert_eq!(
        ITEMS as i64,
        count(
            &conn,
            "SELECT COUNT(DISTINCT item_id) FROM llm_batch_result WHERE session_id = ?1",
            [&sid]
        )
    );
    assert_eq!(
        ITEMS as i64,
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_batch_result WHERE session_id = ?1",
            [&sid]
        )
    );
    assert_eq!(
        0,
        count(
            &conn,
            "SELECT COUNT(*) FROM (SELECT request_id FROM llm_messages WHERE state = 'answered'
             GROUP BY request_id HAVING COUNT(*) > 1)",
            []
        ),
        "a request answered twice"
    );
    let ambiguous_total: i64 = conn
        .query_row(
            "SELECT ambiguous_count FROM llm_batch_session WHERE session_id = ?1",
            [&sid],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(
        ambiguous_total, ambiguous,
        "counted once, not again on resume"
    );
    // Paid executions: one per item, plus at most one per ambiguous attempt.
    let paid = m.stats().ok as i64;
    assert!(
        paid >= ITEMS as i64 && paid <= ITEMS as i64 + ambiguous,
        "{paid} answers paid for {ITEMS} items and {ambiguous} ambiguous attempts"
    );
}

// ------------------------------------------------------------------ X4

/// The forged record hostile text tries to start a line of the log with.
const FORGED: &str = "2026-01-01T00:00:00Z ERROR forged";

/// Every line of docket's log file is one well-formed record: tracing's
/// timestamp and level first, no control character but the line end, no
/// bidi override, bounded length, and no line that the hostile text began.
fn assert_log_is_clean(log: &[u8]) -> String {
    let text = String::from_utf8(log.to_vec()).expect("the log is UTF-8");
    assert!(text.ends_with('\n'), "the log ends mid-record");
    let record = regex::Regex::new(
        r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3,9}Z +(TRACE|DEBUG|INFO|WARN|ERROR) \S",
    )
    .unwrap();
    for (i, line) in text.lines().enumerate() {
        let shown: String = line.chars().take(300).collect();
        assert!(
            record.is_match(line),
            "log line {} is not a record of its own: {shown:?}",
            i + 1
        );
        assert!(
            !line.starts_with(FORGED),
            "log line {} is forged: {shown:?}",
            i + 1
        );
        if let Some(c) = line.chars().find(|c| {
            c.is_control()
                || ('\u{202A}'..='\u{202E}').contains(c)
                || ('\u{2066}'..='\u{2069}').contains(c)
        }) {
            panic!("log line {} holds U+{:04X} raw: {shown:?}", i + 1, c as u32);
        }
        assert!(
            line.len() <= docket::sanitize::LOG_RECORD_MAX + 64,
            "log line {} is {} bytes long",
            i + 1,
            line.len()
        );
    }
    text
}

/// Row X4, docket's own log: item ids, evidence and an input file's name
/// carrying ANSI and OSC escapes, C1 controls, `\r`, bidi overrides, a
/// forged record after a newline, and a 200 KB field, through `docket
/// import` and a run with `DOCKET_LOG=debug` in which another worker
/// takes two hostile items over (so the "lease lost" warning quotes their
/// ids). The log records that quote them are there, escaped, each one
/// line; the run completes every item once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x4_hostile_ids_evidence_and_file_names_cannot_forge_or_poison_the_log() {
    let m = mock(latency(1_500.0, 1_500.0)).await;
    let mut job = Job::new(&m.base_url());
    job.concurrency = 8;
    let ws = workspace(&job);
    let home = tempfile::tempdir().unwrap();

    // Eight chart items; four of them hostile.
    let mut demo = Vec::new();
    docket::demo::write_chart_items(&mut demo, 8, 7).unwrap();
    let mut items: Vec<serde_json::Value> = demo
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    let rtl_id = format!("x4-rtl-\u{202e}{FORGED}");
    let long_id = format!("x4-isolate-\u{2066}hidden\u{2069}-{}", "W".repeat(220));
    assert!(long_id.chars().count() <= 256);
    items[0]["id"] = rtl_id.clone().into();
    items[1]["id"] = long_id.clone().into();
    items[1]["artist"] = format!("\u{1b}[2J\u{1b}]0;pwned\u{7}Artist\r\n{FORGED} evidence").into();
    items[2]["title"] = "T".repeat(200_000).into();
    items[3]["title"] = format!("x\u{9b}31m\rover\u{1b}]52;c;ZXZpbA==\u{7}\n{FORGED}").into();
    let mut lines: Vec<String> = items.iter().map(|v| v.to_string()).collect();
    // The hostile items again, the same: a debug record quotes their ids.
    lines.push(items[0].to_string());
    lines.push(items[1].to_string());
    // Ids docket refuses (control characters): bad rows, never imported.
    let mut bad = items[4].clone();
    bad["id"] = format!("x4-bad\n{FORGED}").into();
    lines.push(bad.to_string());
    bad["id"] = "x4-bad\u{1b}[31mred".into();
    lines.push(bad.to_string());
    let file = ws
        .path()
        .join(format!("items/x4\n{FORGED} \u{1b}[31mname\r.jsonl"));
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();

    let out = docket_at(ws.path(), home.path())
        .env("DOCKET_LOG", "debug")
        .arg("import")
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "two bad rows: {}", said(&out));
    assert_eq!(8, n(&ws, "SELECT COUNT(*) FROM decision", []));
    // The import's own report names the file without its control bytes.
    let report = said(&out);
    assert!(report.contains("Imported 8 new items from"), "{report}");
    assert!(
        !report.chars().any(|c| c.is_control() && c != '\n'),
        "raw control characters in the import's report: {report:?}"
    );

    let mut run = docket_at(ws.path(), home.path());
    run.env("DOCKET_LOG", "debug")
        .args(["batch-adjudicate", "--yes", "--headless"]);
    let child = Proc::start(run, "docket run".into(), home.path().join("run.out"));
    // Both hostile ids in flight (1.5 s each) ...
    let hostile = [rtl_id.as_str(), long_id.as_str()];
    poll("the hostile items' requests in flight", Duration::from_secs(30), || {
        let out = n(
            &ws,
            "SELECT COUNT(DISTINCT r.item_id) FROM llm_messages m JOIN llm_requests r USING (request_id)
             WHERE m.state = 'sent' AND r.item_id IN (?1, ?2)",
            hostile,
        );
        (out == 2).then_some(())
    })
    .await;
    // ... another worker takes them over (a new claim token, its lease
    // running out a moment later, as a worker that then died), so their
    // answers come back to a worker that lost them.
    let taken = ws
        .conn()
        .execute(
            "UPDATE session_item SET claim_token = claim_token + 1, claimed_by = 'x4-intruder',
                 lease_until = ?3
             WHERE item_id IN (?1, ?2)",
            rusqlite::params![rtl_id, long_id, docket::ledger::now_ts() + 1.0],
        )
        .unwrap();
    assert_eq!(taken, 2);
    let (code, run_out) = exit_of(child, Duration::from_secs(60)).await;
    assert_eq!(code, Some(0), "{run_out}");
    let sid = latest_session(&ws);
    let conn = ws.conn();
    check_complete(&conn, &sid);
    assert_eq!(
        8,
        count(
            &conn,
            "SELECT COUNT(DISTINCT item_id) FROM llm_batch_result WHERE session_id = ?1",
            [&sid]
        )
    );
    let orphaned: i64 = conn
        .query_row(
            "SELECT orphaned_count FROM llm_batch_session WHERE session_id = ?1",
            [&sid],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(orphaned, 2, "both taken-over answers refused");

    let log = std::fs::read(log_file(home.path())).expect("docket's log file");
    let text = assert_log_is_clean(&log);
    // The records that quote the hostile text are there, escaped.
    let escaped_rtl = format!("x4-rtl-\\u{{202e}}{FORGED}");
    let escaped_long = "x4-isolate-\\u{2066}hidden\\u{2069}-WWW";
    let lines: Vec<&str> = text.lines().collect();
    let with = |what: &str, quoting: &str| {
        lines
            .iter()
            .filter(|l| l.contains(what) && l.contains(quoting))
            .count()
    };
    assert!(
        with(
            "import finished",
            &format!("x4\\n{FORGED} \\u{{1b}}[31mname\\r.jsonl")
        ) == 1,
        "the import's record with the file's name escaped:\n{text}"
    );
    for id in [escaped_rtl.as_str(), escaped_long] {
        assert!(
            with("a repeated line of the same item", id) >= 1,
            "the repeated line of {id}:\n{text}"
        );
        assert!(
            with("lease lost", id) == 1,
            "the lease-lost warning for {id}:\n{text}"
        );
    }
    // Nothing of the evidence reaches the log (not even escaped).
    assert!(
        !text.contains("pwned") && !text.contains("TTTTTTTTTT"),
        "{text}"
    );
}

// ------------------------------------------------------------------ D1

/// docket's log so far (empty before its first record).
fn log_text(home: &Path) -> String {
    String::from_utf8_lossy(&std::fs::read(log_file(home)).unwrap_or_default()).into_owned()
}

/// Row D1: during a run, another process takes the ledger's write lock
/// (`BEGIN IMMEDIATE`) and holds it for ten times docket's busy timeout
/// (`DOCKET_BUSY_TIMEOUT_MS=300`). docket waits: it does not crash or give
/// up, says "ledger busy" in its log while the lock is held, records and
/// sends nothing new meanwhile, lets a read command (`docket sessions`)
/// answer at once, and once the lock is let go writes what it held,
/// records a `ledger_busy` event and completes every item exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d1_a_write_lock_held_past_the_busy_timeout_is_waited_out_and_loses_nothing() {
    const ITEMS: usize = 120;
    const HOLD: Duration = Duration::from_secs(3);
    let (m, ws) = mocked(latency(100.0, 150.0), ITEMS, |job| {
        job.concurrency = 4;
    })
    .await;
    let home = tempfile::tempdir().unwrap();
    let mut run = docket_at(ws.path(), home.path());
    run.env("DOCKET_BUSY_TIMEOUT_MS", "300")
        .args(["batch-adjudicate", "--yes", "--headless"]);
    let mut child = Proc::start(run, "docket run".into(), home.path().join("run.out"));
    poll("the run under way", Duration::from_secs(30), || {
        (processed(&ws) >= 20).then_some(())
    })
    .await;

    // Another process's write transaction, held.
    let holder = rusqlite::Connection::open(ws.ledger()).unwrap();
    holder.busy_timeout(Duration::from_secs(10)).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let held = Instant::now();
    let processed_at_lock = processed(&ws);
    assert!(
        (processed_at_lock as usize) < ITEMS,
        "the run ended before the lock was taken"
    );
    // Requests whose intent was on disk before the lock may still go out;
    // after that nothing is sent that the ledger could not record.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let sent_then = m.stats().requests;
    // Readers are unaffected: a read command answers while the lock is held.
    let asked = Instant::now();
    let sessions = docket_at(ws.path(), home.path())
        .env("DOCKET_BUSY_TIMEOUT_MS", "300")
        .arg("sessions")
        .output()
        .unwrap();
    let answered_in = asked.elapsed();
    let sid = latest_session(&ws);
    assert_eq!(sessions.status.code(), Some(0), "{}", said(&sessions));
    assert!(said(&sessions).contains(&sid), "{}", said(&sessions));
    assert!(
        answered_in < Duration::from_secs(2),
        "`docket sessions` took {answered_in:?} while the lock was held"
    );
    // A command that writes fails after the busy timeout instead of
    // hanging (only a run waits the lock out), and says why.
    let asked = Instant::now();
    let pause_home = tempfile::tempdir().unwrap();
    let pause = docket_at(ws.path(), pause_home.path())
        .env("DOCKET_BUSY_TIMEOUT_MS", "300")
        .args(["pause", &sid])
        .output()
        .unwrap();
    assert_ne!(pause.status.code(), Some(0), "{}", said(&pause));
    assert!(said(&pause).contains("locked"), "{}", said(&pause));
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "`docket pause` waited {:?}",
        asked.elapsed()
    );
    // The wait is said while it lasts.
    poll("\"ledger busy\" in docket's log", HOLD, || {
        log_text(home.path()).contains("ledger busy:").then_some(())
    })
    .await;
    while held.elapsed() < HOLD {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    child.assert_running();
    assert_eq!(
        processed(&ws),
        processed_at_lock,
        "something was written under another process's lock"
    );
    assert_eq!(
        m.stats().requests,
        sent_then,
        "requests went out that the ledger could not record"
    );
    holder.execute_batch("ROLLBACK").unwrap();
    drop(holder);

    let (code, out) = exit_of(child, Duration::from_secs(60)).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(!out.contains("database is locked"), "{out}");
    // The wait was said on the run's own output too, and its end.
    assert!(
        out.contains("The ledger is busy: another process has held its write lock")
            && out.contains("The ledger's write lock is free again"),
        "{out}"
    );
    let conn = ws.conn();
    check_complete(&conn, &sid);
    assert_eq!(
        ITEMS as i64,
        count(
            &conn,
            "SELECT COUNT(DISTINCT item_id) FROM llm_batch_result WHERE session_id = ?1",
            [&sid]
        )
    );
    // Nothing was lost or sent twice: no attempt ambiguous, one answer each.
    assert_eq!(
        0,
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_messages WHERE state != 'answered'",
            []
        )
    );
    assert_eq!(m.stats().ok, ITEMS as u64, "every item paid for once");
    let busy = events_of(&conn, &sid, "ledger_busy");
    assert!(!busy.is_empty(), "{busy:?}");
    assert_eq!(busy[0].level, "warn");
    assert!(busy[0].message.starts_with("ledger busy for "), "{busy:?}");
    let log = log_text(home.path());
    assert!(
        log.lines()
            .any(|l| l.contains(" WARN ") && l.contains("written again after")),
        "{log}"
    );
    // No write failed on the lock, and none met BUSY_SNAPSHOT (same text).
    assert!(!log.contains("still busy after"), "{log}");
    assert!(!log.contains("database is locked"), "{log}");
    for l in log.lines().filter(|l| l.contains("ledger")) {
        eprintln!("D1 log: {l}");
    }
    eprintln!("D1 event: {}", busy[0].message);
}
