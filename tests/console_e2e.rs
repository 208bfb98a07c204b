//! The console end to end: the real binary in tmux, driven by keys, checked
//! on the screen and in the ledger after every step.
//!
//! Every test has its own tmux server (`tmux -L`, named after this process
//! and the test) and its own data, config and workspace folders; a guard
//! kills only that tmux server, whatever happens.

use docket_testkit as support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::Connection;
use support::tmux::{Pane, env_line, poll, sh_quote};

/// How long to wait for a screen or ledger state before failing.
const WAIT: Duration = Duration::from_secs(15);

// ---------------------------------------------------------------- helpers

/// A per-test home: data, config and keymap dirs all inside one tempdir.
struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new() -> Home {
        Home {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn data(&self) -> PathBuf {
        self.path().join("data")
    }

    /// The variables every docket started by these tests gets.
    fn vars(&self, user: &str) -> Vec<(String, String)> {
        let p = |s: &str| self.path().join(s).display().to_string();
        vec![
            ("HOME".into(), p("home")),
            ("XDG_DATA_HOME".into(), p("data")),
            ("XDG_STATE_HOME".into(), p("state")),
            ("XDG_CONFIG_HOME".into(), p("config")),
            ("DOCKET_CONFIG_DIR".into(), p("config/docket")),
            ("USER".into(), user.into()),
        ]
    }

    /// `env -u ... VAR=... ` for a command run by tmux.
    fn env_prefix(&self, user: &str, extra: &[(&str, &str)]) -> String {
        let extra = extra.iter().map(|&(k, v)| (k.to_string(), v.to_string()));
        env_line(self.vars(user).into_iter().chain(extra))
    }

    /// docket as a plain child process (no terminal), with this home.
    fn docket(&self, user: &str) -> Command {
        let mut c = Command::new(support::procs::bin());
        c.env_remove("NO_COLOR")
            .env_remove("DOCKET_WORKSPACE")
            .env_remove("DOCKET_LOG");
        for (k, v) in self.vars(user) {
            c.env(k, v);
        }
        c
    }

    /// Run docket to completion; panic unless it exits with `code`.
    fn run(&self, args: &[&str], code: i32) -> String {
        let out = self.docket("alice").args(args).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert_eq!(
            out.status.code(),
            Some(code),
            "docket {args:?}\nstdout:\n{stdout}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// A workspace from `docket init`, the built-in mock made quick.
    fn init_workspace(&self) -> PathBuf {
        let ws = self.path().join("ws");
        self.run(&["init", &ws.display().to_string()], 0);
        let toml_path = ws.join("docket.toml");
        let toml = std::fs::read_to_string(&toml_path).unwrap();
        let quick = toml
            .replace("latency_median_ms = 150.0", "latency_median_ms = 20.0")
            .replace("latency_p99_ms = 600.0", "latency_p99_ms = 60.0");
        assert_ne!(toml, quick, "the scaffold's mock latency moved");
        std::fs::write(&toml_path, quick).unwrap();
        ws
    }

    /// Write `n` demo chart items into the workspace and `docket import` them.
    fn import_items(&self, ws: &Path, n: usize) {
        let items = ws.join("items/e2e.jsonl");
        let mut f = std::fs::File::create(&items).unwrap();
        docket::demo::write_chart_items(&mut f, n, 7).unwrap();
        drop(f);
        let ws_s = ws.display().to_string();
        self.run(
            &["--workspace", &ws_s, "import", &items.display().to_string()],
            0,
        );
    }

    /// A workspace with one completed session that left at least 3 pending
    /// review items. Returns the workspace and the session id.
    fn completed_workspace(&self) -> (PathBuf, String) {
        let ws = self.init_workspace();
        self.import_items(&ws, 60);
        let ws_s = ws.display().to_string();
        let out = self.run(
            &[
                "--workspace",
                &ws_s,
                "batch-adjudicate",
                "--headless",
                "--yes",
            ],
            0,
        );
        assert!(out.contains("Results: docket batch-results"), "{out}");
        let conn = docket::ledger::open(&ws.join("docket.sqlite")).unwrap();
        let session = docket::ledger::store::latest_session(&support::db(&conn))
            .unwrap()
            .expect("a session");
        let pending = count(
            &conn,
            "SELECT COUNT(*) FROM review_item WHERE status = 'pending'",
        );
        assert!(pending >= 3, "only {pending} pending review items");
        (ws, session)
    }
}

fn count(conn: &Connection, sql: &str) -> i64 {
    conn.query_row(sql, [], |r| r.get(0))
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// A read-only view of a ledger, opened once it exists.
fn ledger_ro(path: &Path) -> Connection {
    poll("the ledger to exist", Duration::from_secs(30), || {
        if !path.exists() {
            return Err(format!("{} missing", path.display()));
        }
        docket::ledger::open_read_only(path).map_err(|e| e.to_string())
    })
}

fn query_string(conn: &Connection, sql: &str, p: impl rusqlite::Params) -> Option<String> {
    use rusqlite::OptionalExtension;
    conn.query_row(sql, p, |r| r.get::<_, Option<String>>(0))
        .optional()
        .unwrap()
        .flatten()
}

fn session_state(conn: &Connection, sid: &str) -> (String, String) {
    conn.query_row(
        "SELECT state, desired_state FROM llm_batch_session WHERE session_id = ?1",
        [sid],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .unwrap()
}

fn messages(conn: &Connection) -> i64 {
    count(conn, "SELECT COUNT(*) FROM llm_messages")
}

/// The llm_messages count stays still: nothing new is sent.
fn assert_not_dispatching(conn: &Connection, what: &str) {
    // In-flight requests finish and their rows land within a second.
    std::thread::sleep(Duration::from_millis(1200));
    let a = messages(conn);
    std::thread::sleep(Duration::from_millis(1500));
    let b = messages(conn);
    assert_eq!(
        a, b,
        "{what}: llm_messages grew from {a} to {b} while paused"
    );
}

fn assert_dispatching(conn: &Connection, what: &str) {
    let a = messages(conn);
    poll(what, WAIT, || {
        let b = messages(conn);
        if b > a {
            Ok(())
        } else {
            Err(format!("llm_messages still {b}"))
        }
    });
}

/// A child process killed (only it) if the test ends before it does.
struct ChildGuard(Option<Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The number after `✓ accepted` in the outcomes pane.
fn accepted_on_screen(screen: &str) -> Option<u64> {
    let rest = screen.split("✓ accepted").nth(1)?;
    rest.split_whitespace().next()?.parse().ok()
}

/// `(cursor, total)` from the review pane title `5 Review queue CUR/TOTAL`.
fn review_title(screen: &str) -> Option<(u64, u64)> {
    let re = regex::Regex::new(r"5 Review queue (\d+)/(\d+)").unwrap();
    let c = re.captures(screen)?;
    Some((c[1].parse().ok()?, c[2].parse().ok()?))
}

fn header(screen: &str) -> &str {
    screen.lines().next().unwrap_or("")
}

/// The footer: the last non-blank line.
fn footer(screen: &str) -> &str {
    screen
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
}

// ---------------------------------------------------------------- 1. demo

/// The demo in the console, step by step: counters move, open the review
/// queue, accept one, undo, reject one, pause, resume, cancel, quit; after
/// each step the screen and the ledger agree.
#[test]
fn demo_console_review_pause_resume_cancel_quit() {
    let home = Home::new();
    let cmd = format!(
        "{} {} demo --items 4000",
        home.env_prefix("alice", &[]),
        sh_quote(support::procs::bin())
    );
    let pane = Pane::start("demo", &cmd, 120, 40);
    let ledger_path = home.data().join("docket/demo/docket.sqlite");

    // Demo starts; counters move.
    let first = pane.wait(
        "the demo running with counters",
        Duration::from_secs(40),
        |s| {
            header(s).contains("▶ RUNNING")
                && accepted_on_screen(s).is_some()
                && footer(s).starts_with(" NORMAL ")
        },
    );
    let conn = ledger_ro(&ledger_path);
    let sid = docket::ledger::store::latest_session(&support::db(&conn))
        .unwrap()
        .expect("the demo's session");
    assert!(header(&first).contains(&sid), "{first}");
    let a0 = accepted_on_screen(&first).unwrap();
    pane.wait("the accepted counter to grow", WAIT, |s| {
        accepted_on_screen(s).is_some_and(|a| a > a0) && s.contains("/4000 done")
    });
    assert_eq!(
        session_state(&conn, &sid),
        ("running".into(), "running".into())
    );
    assert_eq!(
        count(&conn, "SELECT COUNT(*) FROM review_log"),
        0,
        "no human decision yet"
    );

    // 5: the review queue, once it has an item.
    pane.keys(&["5"]);
    pane.wait("the review queue focused with items", WAIT, |s| {
        s.contains("▶ 5 Review queue")
            && review_title(s).is_some_and(|(_, t)| t >= 1)
            && footer(s).contains("a accept")
    });
    // The cursor item is claimed by this console.
    poll("alice's claim on the cursor item", WAIT, || {
        let n = count(
            &conn,
            "SELECT COUNT(*) FROM review_item WHERE status = 'pending' AND claimed_by LIKE 'alice@%'",
        );
        if n == 1 {
            Ok(())
        } else {
            Err(format!("{n} claims"))
        }
    });
    // The claimed item's decision before the accept: the undo restores it
    // (an audit item was auto-decided; the demo has an audit sample).
    let before_accept = conn
        .query_row(
            "SELECT d.state, d.decided_by FROM decision d JOIN review_item r ON r.item_id = d.item_id
             WHERE r.status = 'pending' AND r.claimed_by LIKE 'alice@%'",
            [],
            |r| Ok((r.get::<_, String>(0)?, r.get::<_, Option<String>>(1)?)),
        )
        .unwrap();

    // a: accept one.
    pane.keys(&["a"]);
    pane.wait_for("Accepted 1 item (u undoes)", WAIT);
    let (accepted_rid, accepted_item, by) = poll("the accept in the ledger", WAIT, || {
        conn.query_row(
            "SELECT review_id, item_id, decided_by FROM review_item WHERE status = 'accepted'",
            [],
            |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                ))
            },
        )
        .map_err(|e| e.to_string())
    });
    assert_eq!(by, "review:alice");
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM review_item WHERE status != 'pending'"
        ),
        1
    );
    let decision = |item: &str| -> (String, Option<String>) {
        conn.query_row(
            "SELECT state, decided_by FROM decision WHERE item_id = ?1",
            [item],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap()
    };
    assert_eq!(
        decision(&accepted_item),
        ("decided".into(), Some("review:alice".into()))
    );
    assert_eq!(
        query_string(
            &conn,
            "SELECT action || ' ' || actor || ' ' || item_id FROM review_log WHERE review_id = ?1",
            [accepted_rid]
        ),
        Some(format!("accept review:alice {accepted_item}"))
    );

    // u: undo it.
    pane.keys(&["u"]);
    pane.wait_for(&format!("Undid accept of {accepted_item}"), WAIT);
    poll("the undo in the ledger", WAIT, || {
        let status = query_string(
            &conn,
            "SELECT status FROM review_item WHERE review_id = ?1",
            [accepted_rid],
        );
        if status.as_deref() == Some("pending") {
            Ok(())
        } else {
            Err(format!("{status:?}"))
        }
    });
    assert_eq!(decision(&accepted_item), before_accept);
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM review_log WHERE action = 'undo' AND actor = 'review:alice'"
        ),
        1
    );
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM review_log a JOIN review_log u ON u.log_id = a.undone_by_log_id
             WHERE a.action = 'accept' AND u.undoes_log_id = a.log_id"
        ),
        1,
        "the accept is marked undone by the undo"
    );

    // r: reject one.
    pane.keys(&["r"]);
    pane.wait_for("Rejected 1 item (u undoes)", WAIT);
    let (rejected_item, by) = poll("the reject in the ledger", WAIT, || {
        conn.query_row(
            "SELECT item_id, decided_by FROM review_item WHERE status = 'rejected'",
            [],
            |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)),
        )
        .map_err(|e| e.to_string())
    });
    assert_eq!(by, "review:alice");
    assert_eq!(decision(&rejected_item), ("indeterminate".into(), None));
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM review_item WHERE status != 'pending'"
        ),
        1,
        "only the rejected one is decided"
    );
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM review_log WHERE action = 'reject' AND actor = 'review:alice'"
        ),
        1
    );

    // p: pause. Dispatch stops.
    pane.keys(&["p"]);
    pane.wait("the paused badges", WAIT, |s| {
        header(s).contains("⏸ PAUSED")
            && footer(s).starts_with(" NORMAL ")
            && footer(s).contains(" PAUSED ")
    });
    poll("the session paused in the ledger", WAIT, || {
        let st = session_state(&conn, &sid);
        if st == ("paused".into(), "paused".into()) {
            Ok(())
        } else {
            Err(format!("{st:?}"))
        }
    });
    assert_not_dispatching(&conn, "after p");

    // p again: resume. Dispatch goes on.
    pane.keys(&["p"]);
    pane.wait("RUNNING again", WAIT, |s| {
        header(s).contains("▶ RUNNING")
            && footer(s).starts_with(" NORMAL ")
            && !footer(s).contains(" PAUSED ")
    });
    poll("the session running in the ledger", WAIT, || {
        let st = session_state(&conn, &sid);
        if st == ("running".into(), "running".into()) {
            Ok(())
        } else {
            Err(format!("{st:?}"))
        }
    });
    assert_dispatching(&conn, "llm_messages to grow after resume");

    // c: the cancel dialog (default No), y confirms.
    pane.keys(&["c"]);
    pane.wait("the cancel dialog", WAIT, |s| {
        s.contains(&format!("Cancel session {sid}?")) && footer(s).starts_with(" CONFIRM")
    });
    pane.keys(&["y"]);
    poll(
        "the session cancelled in the ledger",
        Duration::from_secs(30),
        || {
            let st = session_state(&conn, &sid);
            if st.0 == "cancelled" {
                Ok(())
            } else {
                Err(format!("{st:?}"))
            }
        },
    );
    pane.wait("■ CANCELLED in the header", WAIT, |s| {
        header(s).contains("■ CANCELLED")
    });
    assert_eq!(session_state(&conn, &sid).1, "cancelled");
    let cancel_events = count(
        &conn,
        "SELECT COUNT(*) FROM session_event WHERE kind = 'control' AND actor = 'review:alice'
           AND message LIKE 'cancel requested%'",
    );
    assert_eq!(cancel_events, 1);

    // q: the run has ended, so the console just closes; the process prints
    // the summary and exits 130 (the session was cancelled).
    let exited = poll("the console to exit on q", Duration::from_secs(20), || {
        let s = pane.screen();
        if s.contains("EXIT=") {
            return Ok(s);
        }
        if s.contains("Quit while the run is live?") {
            // The engine had not let go yet: say no and ask again.
            pane.keys(&["Escape"]);
            return Err(s);
        }
        pane.keys(&["q"]);
        std::thread::sleep(Duration::from_millis(400));
        Err(s)
    });
    assert!(exited.contains("Session saved. Resume with"), "{exited}");
    assert!(
        exited.contains(&format!("docket batch-adjudicate --resume {sid}")),
        "{exited}"
    );
    assert!(
        exited.contains(&format!("Session {sid}: cancelled")),
        "{exited}"
    );
    assert!(exited.contains("EXIT=130"), "{exited}");
    assert_eq!(pane.display("#{alternate_on}"), "0");
    drop(conn);

    let conn = docket::ledger::open(&ledger_path).unwrap();
    let ok: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok");
    support::check_invariants(&conn, &sid);
    let (state, _) = session_state(&conn, &sid);
    assert_eq!(state, "cancelled");
}

// ------------------------------------------------- 2. headless + console

/// A headless run in one process, a console in another: pausing from the
/// console stops the headless run's dispatch; resuming restarts it; a
/// `docket cancel` ends it with 130.
#[test]
fn console_pauses_and_resumes_a_headless_run() {
    let home = Home::new();
    let ws = home.init_workspace();
    home.import_items(&ws, 1000);
    let ws_s = ws.display().to_string();
    let ledger_path = ws.join("docket.sqlite");

    // The headless run: 4 requests/s, so it lasts minutes.
    let mut child = home
        .docket("alice")
        .args([
            "--workspace",
            &ws_s,
            "batch-adjudicate",
            "--headless",
            "--yes",
            "--rate-limit",
            "240",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = Arc::new(Mutex::new(String::new()));
    let reader = {
        let out = out.clone();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let mut o = out.lock().unwrap();
                o.push_str(&line);
                o.push('\n');
            }
        })
    };
    let mut child = ChildGuard(Some(child));
    let headless_said = |text: &str| out.lock().unwrap().contains(text);

    let conn = ledger_ro(&ledger_path);
    let sid = poll("the headless session", Duration::from_secs(30), || {
        docket::ledger::store::latest_session(&support::db(&conn))
            .map_err(|e| e.to_string())?
            .ok_or("no session yet".to_string())
    });
    assert_dispatching(&conn, "the headless run to send");

    // The console, in another tmux session (another process, another user).
    let cmd = format!(
        "{} {} --workspace {}",
        home.env_prefix("bob", &[]),
        sh_quote(support::procs::bin()),
        sh_quote(&ws_s)
    );
    let pane = Pane::start("headless", &cmd, 120, 40);
    pane.wait("the console on the live run", WAIT, |s| {
        header(s).contains(&sid)
            && header(s).contains("▶ RUNNING")
            && accepted_on_screen(s).is_some()
            && s.contains("/1000 done")
    });

    // p in the console pauses the headless run.
    pane.keys(&["p"]);
    pane.wait("the paused badges", WAIT, |s| {
        header(s).contains("⏸ PAUSED") && footer(s).contains(" PAUSED ")
    });
    poll("desired_state paused, state paused", WAIT, || {
        let st = session_state(&conn, &sid);
        if st == ("paused".into(), "paused".into()) {
            Ok(())
        } else {
            Err(format!("{st:?}"))
        }
    });
    poll("the headless run to say Paused", WAIT, || {
        if headless_said("Paused") {
            Ok(())
        } else {
            Err(out.lock().unwrap().clone())
        }
    });
    assert_not_dispatching(&conn, "headless run paused from the console");
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM session_event WHERE kind = 'control' AND actor = 'review:bob'
               AND message = 'pause requested by review:bob'"
        ),
        1
    );
    assert!(
        child.0.as_mut().unwrap().try_wait().unwrap().is_none(),
        "still running"
    );

    // p again resumes it.
    pane.keys(&["p"]);
    pane.wait("RUNNING again", WAIT, |s| header(s).contains("▶ RUNNING"));
    poll("the headless run to say Resumed", WAIT, || {
        if headless_said("Resumed.") {
            Ok(())
        } else {
            Err(out.lock().unwrap().clone())
        }
    });
    assert_eq!(
        session_state(&conn, &sid),
        ("running".into(), "running".into())
    );
    assert_dispatching(&conn, "llm_messages to grow after resume");

    // `:retune` in the console changes the headless run's limits: its
    // gauges (written by that engine) show them within about a second.
    pane.keys(&[":"]);
    pane.wait("the command line", WAIT, |s| footer(s).starts_with(" CMD "));
    pane.keys(&["retune rpm=120 concurrency=3"]);
    pane.keys(&["Enter"]);
    let s = pane.wait("the retuned gauges", WAIT, |s| {
        s.contains("/ 120") && s.contains("/3 AIMD")
    });
    assert!(footer(&s).contains("Retune asked"), "{s}");
    poll("the engine's own gauges to follow", WAIT, || {
        let live = query_string(
            &conn,
            "SELECT live_json FROM llm_batch_session WHERE session_id = ?1",
            [&sid],
        )
        .unwrap_or_default();
        let g: docket::watch::LiveGauges = serde_json::from_str(&live).unwrap_or_default();
        if g.max_concurrency == 3 && g.rpm_limit == 120 {
            Ok(())
        } else {
            Err(live)
        }
    });
    poll("the headless run to say it retuned", WAIT, || {
        if headless_said("Retuned") {
            Ok(())
        } else {
            Err(out.lock().unwrap().clone())
        }
    });

    // docket cancel from a third process ends the headless run with 130.
    let said = home.run(&["--workspace", &ws_s, "cancel", &sid], 0);
    assert!(said.contains("asked to cancel"), "{said}");
    let mut c = child.0.take().unwrap();
    let status = poll("the headless run to exit", Duration::from_secs(30), || {
        c.try_wait()
            .map_err(|e| e.to_string())?
            .ok_or("still running".to_string())
    });
    reader.join().unwrap();
    let text = out.lock().unwrap().clone();
    assert_eq!(status.code(), Some(130), "{text}");
    assert!(text.contains("Cancelled from the ledger"), "{text}");
    assert!(text.contains("Session saved. Resume with"), "{text}");
    pane.wait("■ CANCELLED in the console", WAIT, |s| {
        header(s).contains("■ CANCELLED")
    });

    // The watching console just closes.
    pane.keys(&["q"]);
    let s = pane.wait_for("EXIT=", WAIT);
    assert!(s.contains("EXIT=0"), "{s}");
    drop(conn);
    let conn = docket::ledger::open(&ledger_path).unwrap();
    support::check_invariants(&conn, &sid);
    assert_eq!(session_state(&conn, &sid).0, "cancelled");
}

// ----------------------------------------------------- 3. two operators

/// Two consoles on one queue: bob cannot decide the item alice holds; when
/// alice accepts it, it leaves bob's list within about a second.
#[test]
fn two_operators_share_the_review_queue() {
    let home = Home::new();
    let (ws, _sid) = home.completed_workspace();
    let ws_s = ws.display().to_string();
    let conn = ledger_ro(&ws.join("docket.sqlite"));
    let (top_rid, top_item): (i64, String) = conn
        .query_row(
            "SELECT review_id, item_id FROM review_item WHERE status = 'pending'
             ORDER BY confidence DESC, review_id LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    let pending0 = count(
        &conn,
        "SELECT COUNT(*) FROM review_item WHERE status = 'pending'",
    ) as u64;

    // 200 columns: at 120 the footer's key hints leave the toast only ~30
    // columns, too few for "Accepted nothing; skipped 1: held by ...".
    let console = |user: &str| {
        let cmd = format!(
            "{} {} --workspace {}",
            home.env_prefix(user, &[]),
            sh_quote(support::procs::bin()),
            sh_quote(&ws_s)
        );
        let pane = Pane::start(&format!("op-{user}"), &cmd, 200, 40);
        pane.wait("the console loaded", WAIT, |s| {
            header(s).contains("✓ COMPLETED")
        });
        pane
    };
    let alice = console("alice");
    let bob = console("bob");

    // Alice opens the queue first and holds its first item.
    alice.keys(&["5"]);
    alice.wait("alice's queue", WAIT, |s| {
        review_title(s) == Some((1, pending0))
    });
    let claimant = poll("alice's claim", WAIT, || {
        query_string(
            &conn,
            "SELECT claimed_by FROM review_item WHERE review_id = ?1",
            [top_rid],
        )
        .filter(|c| c.starts_with("alice@"))
        .ok_or("not claimed by alice".to_string())
    });

    // Bob opens it too: the same first item, held by alice.
    bob.keys(&["5"]);
    // His cursor row says who holds it, and so does the toast of his claim.
    bob.wait("bob told the item is held", WAIT, |s| {
        footer(s).contains(&format!("held by {claimant}"))
            && review_title(s) == Some((1, pending0))
            && s.lines()
                .any(|l| l.contains('›') && l.contains(&top_item) && l.contains("[held: alice@"))
    });
    // Off the cursor, the row says who holds it.
    bob.keys(&["j"]);
    let s = bob.wait("the held row", WAIT, |s| {
        review_title(s) == Some((2, pending0))
            && s.lines()
                .any(|l| l.contains(&top_item) && l.contains("[held: alice@"))
    });
    assert!(!s.contains("[held: bob@"), "{s}");
    bob.keys(&["k"]);
    bob.wait("bob back on the first item", WAIT, |s| {
        review_title(s) == Some((1, pending0))
    });
    bob.keys(&["a"]);
    let s = bob.wait("bob's accept refused", WAIT, |s| {
        let f = footer(s);
        f.contains(&format!("held by {claimant}")) && !f.contains("another operator")
    });
    // Refused in the console ("<item> is held by ...") or by the ledger
    // ("Accepted nothing; skipped 1: held by ...").
    let f = footer(&s);
    assert!(
        f.contains(&format!("{top_item} is held by {claimant}"))
            || f.contains("Accepted nothing; skipped 1: held by"),
        "{s}"
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM review_log WHERE actor = 'review:bob'"
        ),
        0,
        "bob decided nothing"
    );
    assert_eq!(
        query_string(
            &conn,
            "SELECT status FROM review_item WHERE review_id = ?1",
            [top_rid]
        )
        .as_deref(),
        Some("pending")
    );
    assert_eq!(
        query_string(
            &conn,
            "SELECT state FROM decision WHERE item_id = ?1",
            [&top_item]
        )
        .as_deref(),
        Some("indeterminate")
    );
    assert_eq!(
        query_string(
            &conn,
            "SELECT claimed_by FROM review_item WHERE review_id = ?1",
            [top_rid]
        ),
        Some(claimant.clone()),
        "bob did not take alice's claim"
    );

    // Alice accepts it: it leaves bob's list within about a second.
    // (Alice's toast may be replaced at once: both consoles move on to the
    // next item and race for its claim, so the screen check is the count.)
    alice.keys(&["a"]);
    alice.wait("the item to leave alice's list", WAIT, |s| {
        review_title(s).is_some_and(|(_, t)| t == pending0 - 1)
    });
    poll("alice's accept in the ledger", WAIT, || {
        let by = query_string(
            &conn,
            "SELECT status || ' ' || decided_by FROM review_item WHERE review_id = ?1",
            [top_rid],
        );
        if by.as_deref() == Some("accepted review:alice") {
            Ok(())
        } else {
            Err(format!("{by:?}"))
        }
    });
    let accepted_at = Instant::now();
    bob.wait(
        "the item to leave bob's list",
        Duration::from_secs(3),
        |s| review_title(s).is_some_and(|(_, t)| t == pending0 - 1),
    );
    let lag = accepted_at.elapsed();
    assert!(lag < Duration::from_millis(2500), "took {lag:?}");
    assert_eq!(
        query_string(
            &conn,
            "SELECT state || ' ' || decided_by FROM decision WHERE item_id = ?1",
            [&top_item]
        )
        .as_deref(),
        Some("decided review:alice")
    );
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM review_log WHERE actor = 'review:bob'"
        ),
        0
    );
}

/// The same two operators on a PostgreSQL ledger, each console its own
/// process and connection as on two laptops: the job imported and run on
/// the server (no docket.sqlite is ever written), alice's hold seen by bob,
/// bob's accept refused, alice's accept recorded on the server and gone
/// from bob's list within a second or two (LISTEN/NOTIFY), and the
/// password, given only in PGPASSWORD, never on either screen.
#[test]
fn two_operators_on_postgres_share_the_review_queue() {
    let server = support::pg::PgServer::start_own();
    let full_url = server.fresh_database();
    let url = support::pg::without_password(&full_url);
    let sql = |q: &str| server.psql(&full_url, q);
    let home = Home::new();
    let ws = home.init_workspace();
    let ws_s = ws.display().to_string();
    let on_pg = |args: &[&str]| {
        let out = home
            .docket("alice")
            .args(["--workspace", &ws_s, "--ledger", &url])
            .args(args)
            .env("PGPASSWORD", server.password())
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "docket {args:?}:\n{said}");
        assert!(!said.contains(server.password()), "{said}");
        said
    };
    let items = ws.join("items/e2e.jsonl");
    let mut f = std::fs::File::create(&items).unwrap();
    docket::demo::write_chart_items(&mut f, 60, 7).unwrap();
    drop(f);
    on_pg(&["import", &items.display().to_string()]);
    let out = on_pg(&["batch-adjudicate", "--headless", "--yes"]);
    assert!(out.contains("Results: docket batch-results"), "{out}");
    let pending0: u64 = sql("SELECT COUNT(*) FROM review_item WHERE status = 'pending'")
        .parse()
        .unwrap();
    assert!(pending0 >= 3, "only {pending0} pending review items");
    let top = sql(
        "SELECT review_id || ' ' || item_id FROM review_item WHERE status = 'pending'
         ORDER BY confidence DESC, review_id LIMIT 1",
    );
    let (top_rid, top_item) = top.split_once(' ').unwrap();
    let (top_rid, top_item) = (top_rid.to_string(), top_item.to_string());
    let of_top = |what: &str| {
        sql(&format!(
            "SELECT {what} FROM review_item WHERE review_id = {top_rid}"
        ))
    };

    let console = |user: &str| {
        let cmd = format!(
            "{} {} --workspace {} --ledger {}",
            home.env_prefix(user, &[("PGPASSWORD", server.password())]),
            sh_quote(support::procs::bin()),
            sh_quote(&ws_s),
            sh_quote(&url)
        );
        let pane = Pane::start(&format!("pg-{user}"), &cmd, 200, 40);
        pane.wait("the console loaded", WAIT, |s| {
            header(s).contains("✓ COMPLETED")
        });
        pane
    };
    let alice = console("alice");
    let bob = console("bob");

    alice.keys(&["5"]);
    // At 200 columns the queue previews its item: the card read from PostgreSQL.
    alice.wait("alice's queue and its preview", WAIT, |s| {
        review_title(s) == Some((1, pending0))
            && s.contains("Preview (Enter opens it)")
            && s.contains("── Evidence")
    });
    let claimant = poll("alice's claim", WAIT, || {
        let by = of_top("COALESCE(claimed_by, '')");
        if by.starts_with("alice@") {
            Ok(by)
        } else {
            Err(by)
        }
    });

    bob.keys(&["5"]);
    bob.wait("bob told the item is held", WAIT, |s| {
        review_title(s) == Some((1, pending0))
            && s.lines()
                .any(|l| l.contains('›') && l.contains(&top_item) && l.contains("[held: alice@"))
    });
    bob.keys(&["a"]);
    bob.wait("bob's accept refused", WAIT, |s| {
        footer(s).contains(&format!("held by {claimant}"))
    });
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        sql("SELECT COUNT(*) FROM review_log WHERE actor = 'review:bob'"),
        "0"
    );
    assert_eq!(of_top("status"), "pending");
    assert_eq!(
        of_top("claimed_by"),
        claimant,
        "bob did not take alice's claim"
    );

    alice.keys(&["a"]);
    poll("alice's accept on the server", WAIT, || {
        let by = of_top("status || ' ' || COALESCE(decided_by, '')");
        if by == "accepted review:alice" {
            Ok(())
        } else {
            Err(by)
        }
    });
    let accepted_at = Instant::now();
    bob.wait(
        "the item to leave bob's list",
        Duration::from_secs(3),
        |s| review_title(s).is_some_and(|(_, t)| t == pending0 - 1),
    );
    let lag = accepted_at.elapsed();
    assert!(lag < Duration::from_millis(2500), "took {lag:?}");
    assert_eq!(
        sql(&format!(
            "SELECT state || ' ' || decided_by FROM decision WHERE item_id = '{top_item}'"
        )),
        "decided review:alice"
    );

    // u: alice undoes it, on the server too.
    alice.keys(&["u"]);
    alice.wait_for(&format!("Undid accept of {top_item}"), WAIT);
    poll("the undo on the server", WAIT, || {
        let status = of_top("status");
        if status == "pending" {
            Ok(())
        } else {
            Err(status)
        }
    });
    assert_eq!(
        sql(&format!(
            "SELECT state FROM decision WHERE item_id = '{top_item}'"
        )),
        "indeterminate"
    );
    assert_eq!(
        sql("SELECT COUNT(*) FROM review_log WHERE action = 'undo' AND actor = 'review:alice'"),
        "1"
    );

    // The search (pg_trgm or a scan) finds the item by its id.
    alice.keys(&["/"]);
    alice.keys(&[&top_item]);
    alice.wait("the queue filtered to the item", WAIT, |s| {
        review_title(s).is_some_and(|(_, t)| t >= 1 && t < pending0)
            && s.lines().any(|l| l.contains('›') && l.contains(&top_item))
    });
    alice.keys(&["Escape"]);
    alice.wait("the filter cleared", WAIT, |s| {
        review_title(s).is_some_and(|(_, t)| t == pending0)
    });
    // A bulk reject of three marked items is one decision on the server
    // too: one u takes all of it back (an item Bob holds is skipped).
    alice.keys(&["Space", "Space", "Space"]);
    alice.wait("three marked", WAIT, |s| footer(s).contains("3 marked"));
    alice.keys(&["r"]);
    alice.wait_for("Rejected ", WAIT);
    let rejected = || -> u64 {
        sql("SELECT COUNT(*) FROM review_item WHERE status = 'rejected' AND decided_by = 'review:alice'")
            .parse()
            .unwrap()
    };
    let n = poll("the bulk reject on the server", WAIT, || match rejected() {
        n if n >= 2 => Ok(n),
        n => Err(format!("{n} rejected")),
    });
    alice.keys(&["u"]);
    alice.wait_for(&format!("Undid reject of {n} items"), WAIT);
    poll(
        "every rejected item pending again",
        WAIT,
        || match rejected() {
            0 => Ok(()),
            n => Err(format!("{n} still rejected")),
        },
    );
    assert_eq!(
        sql("SELECT COUNT(*) FROM review_log WHERE action = 'undo' AND actor = 'review:alice'"),
        (1 + n).to_string()
    );
    alice.wait("the queue whole again", WAIT, |s| {
        review_title(s).is_some_and(|(_, t)| t == pending0)
    });

    // The workers and provider batches overlays read the server too.
    for (key, title) in [("w", " Workers · "), ("b", " Provider batches · ")] {
        alice.keys(&[key]);
        alice.wait(&format!("the {key} overlay"), WAIT, |s| s.contains(title));
        alice.keys(&["Escape"]);
        // Closed before the next key: an Escape followed at once by a
        // letter reads as Alt and that letter.
        alice.wait(&format!("the {key} overlay closed"), WAIT, |s| {
            !s.contains(title)
        });
    }
    for (who, pane) in [("alice", &alice), ("bob", &bob)] {
        let screen = pane.screen();
        assert!(
            !footer(&screen).contains("failed"),
            "{who}'s console failed a read:\n{screen}"
        );
    }

    for (who, pane) in [("alice", &alice), ("bob", &bob)] {
        assert!(
            !pane.screen().contains(server.password()),
            "{who}'s screen shows the password"
        );
    }
    assert!(
        !ws.join("docket.sqlite").exists(),
        "a PostgreSQL ledger writes no docket.sqlite"
    );

    // The server goes away: the console says so and keeps trying; once it
    // is back, the console reads again and the queue is whole.
    server.stop();
    alice.wait("the console to say the ledger is unreachable", WAIT, |s| {
        footer(s).contains("unreachable") && footer(s).contains("retrying")
    });
    server.start_again();
    alice.wait("the console to read again", Duration::from_secs(30), |s| {
        !s.contains("unreachable") && review_title(s).is_some_and(|(_, t)| t == pending0)
    });
}

// ---------------------------------------------------------- 4. read-only

/// Everything a decision or a control would change, as text.
fn ledger_dump(conn: &Connection) -> String {
    let mut out = String::new();
    for sql in [
        "SELECT review_id, status, decided_by, claimed_by, claim_expires_at FROM review_item ORDER BY review_id",
        "SELECT item_id, state, decided_by, decided_at FROM decision ORDER BY item_id",
        "SELECT session_id, state, desired_state, stop_after_stage, updated_at FROM llm_batch_session",
        "SELECT log_id FROM review_log",
        "SELECT event_id, kind, message FROM session_event ORDER BY event_id",
    ] {
        let mut stmt = conn.prepare(sql).unwrap();
        let n = stmt.column_count();
        let rows = stmt
            .query_map([], |r| {
                let mut line = Vec::new();
                for i in 0..n {
                    let v: rusqlite::types::Value = r.get(i)?;
                    line.push(format!("{v:?}"));
                }
                Ok(line.join("|"))
            })
            .unwrap();
        for row in rows {
            out.push_str(&row.unwrap());
            out.push('\n');
        }
    }
    out
}

/// `--read-only`: decisions and run controls are refused with a toast, the
/// footer says READ-ONLY, and the ledger is byte-for-byte unchanged.
#[test]
fn read_only_console_changes_nothing() {
    let home = Home::new();
    let (ws, sid) = home.completed_workspace();
    let ws_s = ws.display().to_string();
    // Make the session controllable, so only read-only can refuse `p`.
    let rw = docket::ledger::open(&ws.join("docket.sqlite")).unwrap();
    rw.execute(
        "UPDATE llm_batch_session SET state = 'paused', desired_state = 'paused' WHERE session_id = ?1",
        [&sid],
    )
    .unwrap();
    drop(rw);
    let conn = ledger_ro(&ws.join("docket.sqlite"));
    let before = ledger_dump(&conn);

    let cmd = format!(
        "{} {} --workspace {} --read-only",
        home.env_prefix("alice", &[]),
        sh_quote(support::procs::bin()),
        sh_quote(&ws_s)
    );
    let pane = Pane::start("readonly", &cmd, 120, 40);
    pane.wait("the read-only console loaded", WAIT, |s| {
        header(s).contains(&sid)
            && footer(s).starts_with(" NORMAL ")
            && footer(s).contains(" READ-ONLY ")
    });

    pane.keys(&["5"]);
    pane.wait("the review queue focused", WAIT, |s| {
        s.contains("▶ 5 Review queue") && review_title(s).is_some()
    });
    // Each key's refusal differs from the one before, so each is seen.
    for (key, said) in [
        ("a", "Read-only console: decisions are off."),
        ("p", "Read-only console: run controls are off."),
        ("r", "Read-only console: decisions are off."),
        ("u", "Read-only console: undo is off."),
        ("c", "Read-only console: run controls are off."),
    ] {
        pane.keys(&[key]);
        let s = pane.wait(&format!("{key} refused"), WAIT, |s| {
            footer(s).contains(said) && footer(s).contains(" READ-ONLY ")
        });
        assert!(!s.contains("Cancel session"), "no dialog: {s}");
    }
    // Give any stray write time to land, then compare.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(ledger_dump(&conn), before, "the read-only console wrote");
    pane.keys(&["q"]);
    let s = pane.wait_for("EXIT=", WAIT);
    assert!(s.contains("EXIT=0"), "{s}");
    assert_eq!(
        ledger_dump(&conn),
        before,
        "the read-only console wrote on exit"
    );
}

// -------------------------------------------------------------- 5. resize

/// Below 80x24 the console says so instead of drawing; resized back, the
/// layout returns.
#[test]
fn too_small_a_terminal_says_so_and_the_layout_returns() {
    let home = Home::new();
    let ws = home.init_workspace();
    home.import_items(&ws, 5);
    let cmd = format!(
        "{} {} --workspace {}",
        home.env_prefix("alice", &[]),
        sh_quote(support::procs::bin()),
        sh_quote(&ws.display().to_string())
    );
    let pane = Pane::start("resize", &cmd, 120, 40);
    let layout = |s: &str| {
        header(s).starts_with(" docket ")
            && s.contains("1 Stages")
            && s.contains("2 Outcomes")
            && s.contains("Review queue")
            && footer(s).starts_with(" NORMAL ")
    };
    pane.wait("the layout", WAIT, layout);

    pane.resize(70, 20);
    let s = pane.wait("the too-small notice", WAIT, |s| {
        s.contains("terminal too small")
            && s.contains("need 80x24, have 70x20")
            && !s.contains("Stages")
    });
    assert!(s.contains("enlarge the window"), "{s}");

    pane.resize(120, 40);
    pane.wait("the layout back", WAIT, |s| {
        layout(s) && !s.contains("terminal too small") && s.contains("6 Sessions")
    });

    // Just under the minimum is still too small; the minimum itself fits.
    pane.resize(79, 24);
    pane.wait_for("need 80x24, have 79x24", WAIT);
    pane.resize(80, 24);
    pane.wait("the small layout", WAIT, |s| {
        layout(s) && !s.contains("too small")
    });
    pane.keys(&["q"]);
    let s = pane.wait_for("EXIT=", WAIT);
    assert!(s.contains("EXIT=0"), "{s}");
}

// ------------------------------------------------------------- 6. SIGTERM

/// SIGTERM closes a watching console like `q`: the shell after it runs on the
/// normal screen with the cursor shown.
#[test]
fn sigterm_restores_the_terminal() {
    let home = Home::new();
    let ws = home.init_workspace();
    home.import_items(&ws, 5);
    let cmd = format!(
        "{} {} --workspace {} --mouse; echo AFTER rc=$?",
        home.env_prefix("alice", &[]),
        sh_quote(support::procs::bin()),
        sh_quote(&ws.display().to_string())
    );
    let pane = Pane::start("sigterm", &cmd, 120, 40);
    pane.wait("the console", WAIT, |s| footer(s).starts_with(" NORMAL "));
    assert_eq!(
        pane.display("#{mouse_standard_flag}"),
        "1",
        "--mouse asks for the mouse"
    );
    assert_eq!(
        pane.display("#{alternate_on}"),
        "1",
        "the console uses the alternate screen"
    );
    let pid = pane.command_pid(WAIT);
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let s = pane.wait_for("AFTER", WAIT);
    assert!(s.contains("AFTER rc=0"), "SIGTERM closes like q: {s}");
    assert_eq!(
        pane.display("#{alternate_on}"),
        "0",
        "back on the normal screen"
    );
    assert_eq!(
        pane.display("#{cursor_flag}"),
        "1",
        "the cursor is shown again"
    );
    assert_eq!(
        pane.display("#{mouse_any_flag}"),
        "0",
        "the mouse is given back to the terminal"
    );
    assert!(
        !s.contains("NORMAL"),
        "the console is gone from the screen: {s}"
    );
}

// ------------------------------------------------------------ 7. NO_COLOR

/// The colour parameters among the SGR sequences of `text` (30-38, 40-48,
/// 90-97, 100-107); 39/49 (default colour) are not colours.
fn colour_codes(text: &str) -> Vec<String> {
    let re = regex::Regex::new(r"\x1b\[([0-9;:]*)m").unwrap();
    let mut found = Vec::new();
    for c in re.captures_iter(text) {
        let params = &c[1];
        let colour = params.split([';', ':']).any(|p| {
            p.parse::<u32>().is_ok_and(|n| {
                (30..=38).contains(&n)
                    || (40..=48).contains(&n)
                    || (90..=97).contains(&n)
                    || (100..=107).contains(&n)
            })
        });
        if colour {
            found.push(c[0].escape_debug().to_string());
        }
    }
    found
}

fn has_attr(text: &str, attr: u32) -> bool {
    let re = regex::Regex::new(r"\x1b\[([0-9;]*)m").unwrap();
    re.captures_iter(text)
        .any(|c| c[1].split(';').any(|p| p.parse::<u32>() == Ok(attr)))
}

/// `NO_COLOR=1`: no colour escape on the screen (checked against a coloured
/// control), bold and reverse remain, and focus shows by a double border.
#[test]
fn no_color_drops_colour_but_keeps_focus_visible() {
    let home = Home::new();
    let (ws, sid) = home.completed_workspace();
    let ws_s = ws.display().to_string();
    let start = |tag: &str, extra: &[(&str, &str)]| {
        let cmd = format!(
            "{} {} --workspace {}",
            home.env_prefix("alice", extra),
            sh_quote(support::procs::bin()),
            sh_quote(&ws_s)
        );
        let pane = Pane::start(tag, &cmd, 120, 40);
        pane.wait("the console loaded", WAIT, |s| {
            header(s).contains(&sid) && footer(s).starts_with(" NORMAL ")
        });
        pane
    };

    // The control: with colour allowed, the screen has colour codes.
    {
        let coloured = start("colour", &[]);
        let esc = coloured.screen_escaped();
        assert!(!colour_codes(&esc).is_empty(), "expected colour: {esc:?}");
    }

    let pane = start("nocolor", &[("NO_COLOR", "1")]);
    let esc = pane.screen_escaped();
    let colours = colour_codes(&esc);
    assert!(colours.is_empty(), "colour under NO_COLOR: {colours:?}");
    assert!(has_attr(&esc, 7), "badges are reversed: {esc:?}");
    assert!(has_attr(&esc, 1), "titles are bold: {esc:?}");
    // Focus shows by its double border: one pane has it.
    pane.wait("the stages pane focused", WAIT, |s| {
        s.contains("╔ ▶ 1 Stages") && s.matches('╔').count() == 1
    });

    // Focus moves: the double border moves with it, still without colour.
    pane.keys(&["5"]);
    pane.wait("the review queue focused", WAIT, |s| {
        s.contains("╔ ▶ 5 Review queue") && s.matches('╔').count() == 1 && s.contains("┌ 1 Stages")
    });
    let esc = pane.screen_escaped();
    let colours = colour_codes(&esc);
    assert!(colours.is_empty(), "colour under NO_COLOR: {colours:?}");
    assert!(has_attr(&esc, 7), "the selected row is reversed: {esc:?}");
}

// ------------------------------------------------------- 8. user keymap

/// A user keymap.toml in the config dir rebinds accept to `y`; its bad entry
/// is named with file and line in the footer, and that binding keeps its
/// default. `?` lists the live (rebound) keys.
#[test]
fn a_user_keymap_rebinds_keys_and_names_its_bad_line() {
    let home = Home::new();
    let (ws, _sid) = home.completed_workspace();
    let ws_s = ws.display().to_string();
    let dir = home.path().join("config/docket");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("keymap.toml"),
        "# mine\n[review]\naccept = [\"y\"]\nreject = [\"ctrl-\"]\n",
    )
    .unwrap();
    let cmd = format!(
        "{} {} --workspace {}",
        home.env_prefix("alice", &[]),
        sh_quote(support::procs::bin()),
        sh_quote(&ws_s)
    );
    let pane = Pane::start("keymap", &cmd, 120, 40);
    // The warning is longer than a row: the footer wraps it, whole.
    let s = pane.wait("the keymap warning", WAIT, |s| {
        footer_rows(s).concat().contains("keymap.toml:4")
    });
    assert!(footer_rows(&s).concat().contains("review.reject"), "{s}");
    assert!(
        footer_rows(&s)
            .concat()
            .contains("the default binding stays"),
        "{s}"
    );
    pane.keys(&["5"]);
    pane.wait("the review queue focused", WAIT, |s| {
        s.contains("▶ 5 Review queue") && footer(s).contains("y accept")
    });
    let conn = ledger_ro(&ws.join("docket.sqlite"));
    let accepted = || {
        count(
            &conn,
            "SELECT COUNT(*) FROM review_item WHERE status = 'accepted'",
        )
    };
    pane.keys(&["a"]);
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(accepted(), 0, "a is no longer accept");
    pane.keys(&["y"]);
    poll("y accepted one", WAIT, || {
        if accepted() == 1 {
            Ok(())
        } else {
            Err(format!("{} accepted", accepted()))
        }
    });
    // reject's bad override left its default, r.
    pane.keys(&["r"]);
    poll("r still rejects", WAIT, || {
        let n = count(
            &conn,
            "SELECT COUNT(*) FROM review_item WHERE status = 'rejected'",
        );
        if n == 1 {
            Ok(())
        } else {
            Err(format!("{n} rejected"))
        }
    });
    pane.keys(&["?"]);
    let s = pane.wait_for("[review]", WAIT);
    assert!(s.contains("accept"), "{s}");
    // Esc then q at once would read as Alt-q: wait for the help to close.
    pane.keys(&["Escape"]);
    pane.wait("the help closed", WAIT, |s| !s.contains("[review]"));
    pane.keys(&["q"]);
    let s = pane.wait_for("EXIT=", WAIT);
    assert!(s.contains("EXIT=0"), "{s}");
}

// ---------------------------------------------- 7. text you can read (issue 16)

/// The review pane's row under the cursor (`›`), if it shows `item`.
fn cursor_on(screen: &str, item: &str) -> bool {
    screen
        .lines()
        .any(|l| l.contains('›') && l.contains(item) && !l.contains("batch_"))
}

/// The footer's rows: from the last row starting with a mode badge down.
fn footer_rows(screen: &str) -> Vec<&str> {
    let lines: Vec<&str> = screen.lines().collect();
    let start = lines
        .iter()
        .rposition(|l| l.starts_with(" NORMAL ") || l.starts_with(" EVENT "))
        .unwrap_or(lines.len().saturating_sub(1));
    lines[start..]
        .iter()
        .copied()
        .filter(|l| !l.trim().is_empty())
        .collect()
}

/// At 80x24: Enter on the events pane opens the newest event in full, its
/// long message wrapped to its last word; `/` filters the events pane;
/// a footer message longer than the screen wraps and keeps the session id
/// whole.
#[test]
fn an_event_opens_in_full_and_a_long_footer_message_wraps() {
    let home = Home::new();
    let (ws, sid) = home.completed_workspace();
    let ws_s = ws.display().to_string();
    let rw = docket::ledger::open(&ws.join("docket.sqlite")).unwrap();
    // No engine runs it: `p` answers with how to resume, a long message.
    rw.execute(
        "UPDATE llm_batch_session SET state = 'paused', desired_state = 'paused' WHERE session_id = ?1",
        [&sid],
    )
    .unwrap();
    let message = format!(
        "attempt 1: http 503 from the provider: {}FINAL-WORD",
        "the upstream model is overloaded, try again later; ".repeat(4)
    );
    rw.execute(
        "INSERT INTO session_event (session_id, at, level, kind, message)
         VALUES (?1, (SELECT MAX(at) + 100 FROM session_event), 'warn', 'attempt_failed', ?2)",
        rusqlite::params![sid, message],
    )
    .unwrap();
    drop(rw);

    let cmd = format!(
        "{} {} --workspace {}",
        home.env_prefix("alice", &[]),
        sh_quote(support::procs::bin()),
        sh_quote(&ws_s)
    );
    let pane = Pane::start("event", &cmd, 80, 24);
    pane.wait("the console loaded", WAIT, |s| {
        header(s).contains(&sid) && footer(s).starts_with(" NORMAL ")
    });
    pane.keys(&["4"]);
    let s = pane.wait("the events pane with the event, cut", WAIT, |s| {
        s.contains("▶ 4 Events") && s.contains("attempt 1: http 503")
    });
    assert!(!s.contains("FINAL-WORD"), "the pane's row is one line: {s}");

    pane.keys(&["Enter"]);
    // Whole frames only: a capture taken while the overlay is still being
    // drawn has FINAL-WORD without the rest of its row (the border after it).
    let s = pane.wait("the event in full", WAIT, |s| {
        s.contains("Event (Esc closes)")
            && s.lines().any(|l| {
                l.split_once("FINAL-WORD")
                    .is_some_and(|(_, rest)| rest.trim_start().starts_with('║'))
            })
    });
    // The message, read back across its wrapped rows, is whole; each
    // continuation row is indented.
    let rows: Vec<String> = s
        .lines()
        .filter_map(|l| {
            let a = l.find('║')?;
            let b = l.rfind('║')?;
            (b > a).then(|| l[a + '║'.len_utf8()..b].trim_end().to_string())
        })
        .collect();
    let first = rows
        .iter()
        .position(|r| r.starts_with("attempt 1: http 503"))
        .unwrap_or_else(|| panic!("{s}"));
    let last = rows
        .iter()
        .position(|r| r.ends_with("FINAL-WORD"))
        .unwrap_or_else(|| panic!("{s}"));
    assert!(last > first, "{s}");
    for r in &rows[first + 1..=last] {
        assert!(r.starts_with("  "), "continuation not indented: {r:?}\n{s}");
    }
    let joined: Vec<&str> = rows[first..=last].iter().map(|r| r.trim()).collect();
    assert_eq!(joined.join(" "), message, "{s}");
    assert!(footer(&s).starts_with(" EVENT "), "{s}");

    pane.keys(&["Escape"]);
    pane.wait("the event closed", WAIT, |s| {
        !s.contains("Event (Esc closes)") && footer(s).starts_with(" NORMAL ")
    });

    // `/` filters the events pane itself: its title says so.
    pane.keys(&["/"]);
    pane.keys(&["FINAL-WORD"]);
    pane.keys(&["Enter"]);
    let s = pane.wait("the events pane filtered", WAIT, |s| {
        s.contains("4 Events 1/") && s.contains("/FINAL-WORD")
    });
    assert!(s.contains("▶ 4 Events"), "the focus stayed on events: {s}");
    pane.keys(&["Escape"]);
    pane.wait("the events filter cleared", WAIT, |s| {
        s.contains("▶ 4 Events") && !s.contains("/FINAL-WORD")
    });

    // p on a session no engine runs: the answer is longer than the screen.
    pane.keys(&["p"]);
    let s = pane.wait("the long message", WAIT, |s| {
        footer_rows(s).concat().contains("No engine runs")
            && footer_rows(s).iter().any(|l| l.contains("`docket"))
    });
    let rows = footer_rows(&s);
    assert!(rows.len() >= 2, "the message wrapped: {rows:?}");
    let whole: usize = rows.iter().map(|l| l.matches(sid.as_str()).count()).sum();
    assert_eq!(whole, 2, "the session id is cut: {rows:?}");
    let text = rows.iter().map(|l| l.trim()).collect::<Vec<_>>().join(" ");
    assert!(
        text.contains(&format!("--resume {sid}`")),
        "the resume command is whole: {text}"
    );
    for l in &rows {
        assert!(l.chars().count() <= 80, "{l:?}");
    }
    // The next key clears it and the footer is one row again.
    pane.keys(&["4"]);
    pane.wait("a one-row footer", WAIT, |s| {
        footer_rows(s).len() == 1 && !s.contains("No engine runs")
    });
    pane.keys(&["q"]);
    let s = pane.wait_for("EXIT=", WAIT);
    assert!(s.contains("EXIT=0"), "{s}");
}

/// After `u` the cursor is back on the item the undo restored; a bulk
/// reject of every marked item is undone by one `u`; the footer counts the
/// marks once.
#[test]
fn one_undo_takes_back_a_bulk_reject_and_the_cursor_returns() {
    let home = Home::new();
    let (ws, _sid) = home.completed_workspace();
    let ws_s = ws.display().to_string();
    let conn = ledger_ro(&ws.join("docket.sqlite"));
    let pending = count(
        &conn,
        "SELECT COUNT(*) FROM review_item WHERE status = 'pending'",
    ) as u64;
    // Enough for the bulk reject to ask first (5 or more).
    assert!(pending >= 5, "only {pending} pending review items");
    let cmd = format!(
        "{} {} --workspace {}",
        home.env_prefix("alice", &[]),
        sh_quote(support::procs::bin()),
        sh_quote(&ws_s)
    );
    let pane = Pane::start("undo", &cmd, 120, 40);
    pane.keys(&["5"]);
    pane.wait("the review queue", WAIT, |s| {
        review_title(s) == Some((1, pending))
    });
    pane.keys(&["j"]);
    pane.wait("the cursor on the second item", WAIT, |s| {
        review_title(s) == Some((2, pending))
    });
    pane.keys(&["a"]);
    pane.wait_for("Accepted 1 item (u undoes)", WAIT);
    let accepted = poll("the accept in the ledger", WAIT, || {
        query_string(
            &conn,
            "SELECT item_id FROM review_item WHERE status = 'accepted'",
            [],
        )
        .ok_or_else(|| "not yet".to_string())
    });
    pane.wait("the queue one shorter", WAIT, |s| {
        review_title(s) == Some((2, pending - 1)) && !cursor_on(s, &accepted)
    });
    pane.keys(&["u"]);
    pane.wait("the cursor back on the restored item", WAIT, |s| {
        review_title(s) == Some((2, pending))
            && cursor_on(s, &accepted)
            && s.contains(&format!("Undid accept of {accepted}"))
    });

    // Mark all: the count shows once in the footer.
    pane.keys(&["V"]);
    let s = pane.wait("everything marked", WAIT, |s| {
        footer(s).contains(&format!("{pending} marked"))
    });
    assert_eq!(
        footer(&s).matches("marked").count(),
        1,
        "the count twice: {}",
        footer(&s)
    );
    pane.keys(&["r"]);
    pane.wait_for("Reject many?", WAIT);
    assert!(pane.screen().contains("one u undoes them all"));
    pane.keys(&["y"]);
    pane.wait_for(&format!("Rejected {pending} items"), WAIT);
    poll("the bulk reject in the ledger", WAIT, || {
        let n = count(
            &conn,
            "SELECT COUNT(*) FROM review_item WHERE status = 'rejected'",
        );
        if n as u64 == pending {
            Ok(())
        } else {
            Err(format!("{n} rejected"))
        }
    });

    pane.keys(&["u"]);
    pane.wait_for(&format!("Undid reject of {pending} items"), WAIT);
    poll("every item pending again", WAIT, || {
        let n = count(
            &conn,
            "SELECT COUNT(*) FROM review_item WHERE status = 'pending'",
        );
        if n as u64 == pending {
            Ok(())
        } else {
            Err(format!("{n} pending"))
        }
    });
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM review_log WHERE action = 'undo' AND actor = 'review:alice'"
        ) as u64,
        pending + 1,
        "one undo row per item, from one u (and the accept's)"
    );
    pane.wait("the queue whole again", WAIT, |s| {
        review_title(s).is_some_and(|(_, t)| t == pending)
    });
    // Nothing left to undo: the accept was undone already.
    pane.keys(&["u"]);
    pane.wait_for("Nothing to undo.", WAIT);
    pane.keys(&["q"]);
    let s = pane.wait_for("EXIT=", WAIT);
    assert!(s.contains("EXIT=0"), "{s}");
}

/// Quitting a live run with `p` (pause it) ends with why it paused and how
/// to resume it, and says nothing of --max-cost: the budget did not stop it.
#[test]
fn an_operator_pause_says_how_to_resume_not_to_raise_max_cost() {
    let home = Home::new();
    let cmd = format!(
        "{} {} demo --items 4000",
        home.env_prefix("alice", &[]),
        sh_quote(support::procs::bin())
    );
    let pane = Pane::start("pause-hint", &cmd, 120, 40);
    pane.wait("the demo running", Duration::from_secs(40), |s| {
        header(s).contains("▶ RUNNING") && accepted_on_screen(s).is_some()
    });
    pane.keys(&["q"]);
    pane.wait_for("Quit while the run is live?", WAIT);
    pane.keys(&["p"]);
    let s = pane.wait_text("the run's end", Duration::from_secs(30), |s| {
        s.contains("EXIT=")
    });
    assert!(s.contains("EXIT=4"), "paused is exit 4: {s}");
    assert!(s.contains("Paused: paused by operator"), "{s}");
    assert!(s.contains("Session saved. Resume with:"), "{s}");
    assert!(s.contains("docket batch-adjudicate --resume batch_"), "{s}");
    assert!(
        !s.contains("max-cost"),
        "an operator pause is not the budget: {s}"
    );
}

// ---------------------------------------------------------------- 12. space and mouse

/// Where `needle` starts on the screen: (column, row), 0-based cells.
fn locate(screen: &str, needle: &str) -> Option<(u16, u16)> {
    screen.lines().enumerate().find_map(|(y, line)| {
        let at = line.find(needle)?;
        Some((line[..at].chars().count() as u16, y as u16))
    })
}

/// Send an SGR mouse report for `button` at the 0-based cell (`x`, `y`),
/// as a terminal with mouse reporting on would (press, then release for a
/// click; the wheel only presses).
fn mouse(pane: &Pane, button: u8, x: u16, y: u16) {
    let (x, y) = (x + 1, y + 1);
    pane.keys(&["-l", &format!("\u{1b}[<{button};{x};{y}M")]);
    if button < 64 {
        pane.keys(&["-l", &format!("\u{1b}[<{button};{x};{y}m")]);
    }
}

const LEFT: u8 = 0;
const WHEEL_DOWN: u8 = 65;
const WHEEL_UP: u8 = 64;

/// The item id on screen row `y` of the review queue (left of the preview).
fn queue_item_on_row(screen: &str, y: u16) -> String {
    let line = screen.lines().nth(usize::from(y)).unwrap_or("");
    let re = regex::Regex::new(r"[║│][› ][● ] +(?:\d\.\d\d|--) +(\S+)").unwrap();
    re.captures(line)
        .map(|c| c[1].to_string())
        .unwrap_or_else(|| panic!("no queue row on line {y}: {line:?}\n{screen}"))
}

/// With `--mouse` at 200x60: the console asks tmux for mouse reports; a
/// click focuses the queue and selects the row it hit (claimed in the
/// ledger, its card in the preview), the wheel moves three rows a notch,
/// clicks focus other panes, and quitting gives the mouse back.
#[test]
fn mouse_clicks_focus_and_select_and_the_wheel_scrolls_with_the_preview_beside() {
    let home = Home::new();
    let (ws, sid) = home.completed_workspace();
    let conn = ledger_ro(&ws.join("docket.sqlite"));
    let cmd = format!(
        "{} {} --workspace {} --mouse",
        home.env_prefix("alice", &[]),
        sh_quote(support::procs::bin()),
        sh_quote(&ws.display().to_string())
    );
    let pane = Pane::start("mouse", &cmd, 200, 60);
    let first = pane.wait("the console loaded", WAIT, |s| {
        header(s).contains(&sid) && footer(s).starts_with(" NORMAL ") && review_title(s).is_some()
    });
    assert_eq!(
        pane.display("#{mouse_sgr_flag}"),
        "1",
        "no SGR mouse reports asked"
    );
    assert_eq!(
        pane.display("#{mouse_standard_flag}"),
        "1",
        "no presses asked"
    );
    // Not every motion: over SSH each move would be a report.
    assert_eq!(pane.display("#{mouse_all_flag}"), "0");
    assert_eq!(pane.display("#{mouse_button_flag}"), "0");
    // The sessions pane uses its width.
    assert!(first.contains("started (UTC)"), "{first}");

    // Click the third row of the queue.
    let (qx, qy) = locate(&first, "5 Review queue").expect("the queue's title");
    let item = queue_item_on_row(&first, qy + 3);
    mouse(&pane, LEFT, qx + 6, qy + 3);
    let s = pane.wait("the queue focused on its third row, previewed", WAIT, |s| {
        s.contains("▶ 5 Review queue")
            && review_title(s).is_some_and(|(c, _)| c == 3)
            && s.contains("Preview (Enter opens it)")
            && s.contains("── Evidence")
    });
    let (px, py) = locate(&s, "Preview (Enter opens it)").unwrap();
    assert!(px > qx + 40, "the preview is beside the queue: {s}");
    let card_top = s.lines().nth(usize::from(py) + 1).unwrap();
    assert!(card_top.contains(&item), "the preview shows {item}: {s}");
    assert!(!s.contains("4 Events"), "the events pane makes way: {s}");
    poll(
        "alice's claim on the clicked item",
        WAIT,
        || match query_string(
            &conn,
            "SELECT item_id FROM review_item WHERE status = 'pending' AND claimed_by LIKE 'alice@%'",
            [],
        ) {
            Some(i) if i == item => Ok(()),
            other => Err(format!("claimed {other:?}")),
        },
    );

    // The wheel: three rows down a notch, then back up.
    let (_, total) = review_title(&s).unwrap();
    mouse(&pane, WHEEL_DOWN, qx + 6, qy + 2);
    let down = (3 + 3).min(total);
    let s = pane.wait("the wheel moved the cursor down", WAIT, |s| {
        review_title(s).is_some_and(|(c, _)| c == down)
    });
    let below = queue_item_on_row(&s, qy + u16::try_from(down).unwrap());
    pane.wait("the preview followed the wheel", WAIT, |s| {
        locate(s, "Preview (Enter opens it)")
            .and_then(|(_, py)| s.lines().nth(usize::from(py) + 1))
            .is_some_and(|l| l.contains(&below))
    });
    mouse(&pane, WHEEL_UP, qx + 6, qy + 2);
    pane.wait("the wheel moved the cursor up", WAIT, |s| {
        review_title(s).is_some_and(|(c, _)| c == down.saturating_sub(3).max(1))
    });

    // A click on the sessions pane focuses it (the preview goes, the events
    // pane returns); one on the stages pane focuses that.
    let (sx, sy) = locate(&s, "6 Sessions").unwrap();
    mouse(&pane, LEFT, sx + 4, sy + 2);
    pane.wait("the sessions pane focused", WAIT, |s| {
        s.contains("▶ 6 Sessions") && s.contains("4 Events") && !s.contains("Preview (")
    });
    let (tx, ty) = locate(&s, "1 Stages").unwrap();
    mouse(&pane, LEFT, tx + 2, ty + 1);
    pane.wait_for("▶ 1 Stages", WAIT);

    // Narrower than 160 columns the queue has no preview; wide again, the
    // preview's card is read anew for the item under the cursor.
    pane.keys(&["5"]);
    pane.wait_for("Preview (Enter opens it)", WAIT);
    pane.resize(120, 40);
    pane.wait("no preview at 120 columns", WAIT, |s| {
        s.contains("▶ 5 Review queue") && s.contains("4 Events") && !s.contains("Preview (")
    });
    pane.resize(200, 60);
    pane.wait("the preview back with its card", WAIT, |s| {
        s.contains("Preview (Enter opens it)") && s.contains("── Evidence")
    });

    pane.keys(&["q"]);
    let s = pane.wait_for("EXIT=", WAIT);
    assert!(s.contains("EXIT=0"), "{s}");
    assert_eq!(
        pane.display("#{mouse_any_flag}"),
        "0",
        "the mouse was not given back"
    );
    assert_eq!(pane.display("#{mouse_sgr_flag}"), "0");
}

/// Without `--mouse` the console leaves the mouse to the terminal (text
/// selection over SSH keeps working): no mouse reporting is asked for, and
/// a mouse report that arrives anyway does nothing. console.toml's
/// `mouse = true` turns it on as the flag does.
#[test]
fn without_mouse_the_console_leaves_the_mouse_alone_and_console_toml_turns_it_on() {
    let home = Home::new();
    let (ws, sid) = home.completed_workspace();
    let cmd = format!(
        "{} {} --workspace {}",
        home.env_prefix("alice", &[]),
        sh_quote(support::procs::bin()),
        sh_quote(&ws.display().to_string())
    );
    let pane = Pane::start("nomouse", &cmd, 200, 60);
    let first = pane.wait("the console loaded", WAIT, |s| {
        header(s).contains(&sid) && footer(s).starts_with(" NORMAL ") && review_title(s).is_some()
    });
    assert_eq!(pane.display("#{mouse_any_flag}"), "0");
    assert_eq!(pane.display("#{mouse_sgr_flag}"), "0");
    assert_eq!(pane.display("#{mouse_standard_flag}"), "0");
    let (qx, qy) = locate(&first, "5 Review queue").unwrap();
    mouse(&pane, LEFT, qx + 6, qy + 3);
    mouse(&pane, WHEEL_DOWN, qx + 6, qy + 3);
    // Keys are read in order: the queue focused by `5` shows the click and
    // the wheel did not move its cursor (nor focus it).
    pane.keys(&["5"]);
    let s = pane.wait("the queue focused by its key", WAIT, |s| {
        s.contains("▶ 5 Review queue") && review_title(s).is_some()
    });
    assert_eq!(review_title(&s).unwrap().0, 1, "{s}");
    pane.keys(&["q"]);
    let s = pane.wait_for("EXIT=", WAIT);
    assert!(s.contains("EXIT=0"), "{s}");

    // The same console with `mouse = true` in console.toml.
    let config = home.path().join("config/docket");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("console.toml"), "mouse = true\n").unwrap();
    let pane = Pane::start("tomlmouse", &cmd, 200, 60);
    let first = pane.wait("the console loaded", WAIT, |s| {
        footer(s).starts_with(" NORMAL ") && review_title(s).is_some()
    });
    assert_eq!(pane.display("#{mouse_sgr_flag}"), "1");
    let (qx, qy) = locate(&first, "5 Review queue").unwrap();
    mouse(&pane, LEFT, qx + 6, qy + 2);
    pane.wait("the click selected the second row", WAIT, |s| {
        s.contains("▶ 5 Review queue") && review_title(s).is_some_and(|(c, _)| c == 2)
    });
    pane.keys(&["q"]);
    pane.wait_for("EXIT=0", WAIT);

    // A bad value is named with its file and line, and the mouse stays off.
    std::fs::write(config.join("console.toml"), "# settings\nmouse = \"yes\"\n").unwrap();
    let pane = Pane::start("badmouse", &cmd, 200, 60);
    let s = pane.wait("the bad setting named", WAIT, |s| {
        s.contains("console.toml:2: mouse must be true or false")
    });
    assert!(s.contains("mouse off"), "{s}");
    assert_eq!(pane.display("#{mouse_sgr_flag}"), "0");
    pane.keys(&["q"]);
    pane.wait_for("EXIT=0", WAIT);
}
