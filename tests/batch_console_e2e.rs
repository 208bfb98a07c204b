//! Provider batches on a terminal, end to end: the real binary runs
//! `batch-adjudicate` in tmux against `docket mock-provider` (its own
//! process, batches kept `in_progress` for a long while) and is stopped by
//! keys: Ctrl-C on a headless run answered `y` (the batch is cancelled at the
//! provider) or `n` (it is left there, resumable), and the console's `b`
//! overlay then `c` + confirm (the session and its batch are cancelled).
//! Checked on the screen, in the ledger and in the mock's stats.
//!
//! Every test has its own tmux server (`tmux -L`), its own mock, workspace
//! and home; guards kill only those, whatever happens.

use docket_testkit as support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rusqlite::Connection;
use serde_json::Value;
use support::tmux::{Pane, env_line, exit_code, poll, sh_quote};

const KEY_ENV: &str = "DOCKET_TEST_KEY";
/// How long to wait for a screen, ledger or mock state before failing.
const WAIT: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------- helpers

/// A child process killed and reaped when dropped.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// `docket mock-provider --port 0` with batches that stay `in_progress`
/// for 15 s, steered and read over HTTP.
struct Mock {
    _child: ChildGuard,
    port: u16,
}

impl Mock {
    fn start() -> Mock {
        let mut child = Command::new(support::procs::bin())
            .args(["mock-provider", "--port", "0"])
            .args(["--batch-validating-ms", "100"])
            .args(["--batch-running-ms", "15000"])
            .args(["--batch-finalizing-ms", "100"])
            .args(["--batch-cancelling-ms", "500"])
            .env_remove("DOCKET_WORKSPACE")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn mock-provider");
        let stdout = child.stdout.take().expect("mock stdout");
        let guard = ChildGuard(child);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            let mut line = String::new();
            let _ = r.read_line(&mut line);
            let _ = tx.send(line);
            // Keep draining so the mock never blocks on a full pipe.
            let _ = std::io::copy(&mut r, &mut std::io::sink());
        });
        let line = rx.recv_timeout(WAIT).expect("the mock's 'listening' line");
        // "mock provider listening on http://127.0.0.1:PORT/v1"
        let port = line
            .trim()
            .rsplit(':')
            .next()
            .and_then(|p| p.split('/').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {line:?}"));
        Mock {
            _child: guard,
            port,
        }
    }

    fn http(&self, method: &str, path: &str, body: &str) -> Result<Value, String> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .map_err(|e| e.to_string())?;
        let mut resp = Vec::new();
        s.read_to_end(&mut resp).map_err(|e| e.to_string())?;
        let resp = String::from_utf8_lossy(&resp);
        let (head, body) = resp.split_once("\r\n\r\n").ok_or("not HTTP")?;
        if !head.starts_with("HTTP/1.1 200") {
            return Err(format!("{method} {path}: {head}\n{body}"));
        }
        serde_json::from_str(body).map_err(|e| format!("{path}: {e}: {body}"))
    }

    fn stat(&self, name: &str) -> u64 {
        let stats = self
            .http("GET", "/_mock/stats", "")
            .expect("the mock's stats");
        stats[name]
            .as_u64()
            .unwrap_or_else(|| panic!("no {name} in the stats: {stats}"))
    }
}

/// A tempdir holding the workspace (`ws`) and a private home for docket.
struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn ws(&self) -> PathBuf {
        self.path().join("ws")
    }

    fn ledger(&self) -> PathBuf {
        self.ws().join("docket.sqlite")
    }

    fn vars(&self) -> Vec<(String, String)> {
        let p = |s: &str| self.path().join(s).display().to_string();
        vec![
            ("HOME".into(), p("home")),
            ("XDG_DATA_HOME".into(), p("data")),
            ("XDG_STATE_HOME".into(), p("state")),
            ("XDG_CONFIG_HOME".into(), p("config")),
            ("DOCKET_CONFIG_DIR".into(), p("config/docket")),
            ("USER".into(), "alice".into()),
            (KEY_ENV.into(), "test-key-not-real".into()),
        ]
    }

    fn run(&self, args: &[&str]) -> String {
        let mut c = Command::new(support::procs::bin());
        c.env_remove("NO_COLOR")
            .env_remove("DOCKET_WORKSPACE")
            .env_remove("DOCKET_LOG")
            .args(args)
            .stdin(Stdio::null());
        for (k, v) in self.vars() {
            c.env(k, v);
        }
        let out = c.output().expect("run docket");
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "docket {args:?}: {:?}\nstdout:\n{stdout}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// `docket init`, the provider pointed at the mock in batch mode, and
    /// the scaffold's sample items imported.
    fn new(mock: &Mock) -> Home {
        let home = Home {
            dir: tempfile::tempdir().expect("tempdir"),
        };
        let ws = home.ws();
        let ws_s = ws.display().to_string();
        home.run(&["init", &ws_s]);
        let toml_path = ws.join("docket.toml");
        let toml = std::fs::read_to_string(&toml_path).unwrap();
        let provider = format!(
            "[providers.main]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:{}/v1\"\n\
             api_key_env = \"{KEY_ENV}\"\n",
            mock.port
        );
        let mut edited = toml.replacen("[providers.main]\nkind = \"mock\"\n", &provider, 1);
        // The mock's own knobs are for kind = "mock" only.
        let start = edited
            .find("# How the built-in mock behaves")
            .expect("the scaffold's mock block");
        let end = edited.find("# Stages run in order").expect("the stages");
        edited.replace_range(start..end, "");
        let edited = edited.replacen(
            "[stages.gate]",
            "[stages.batch]\nmode = \"batch\"\nmax_wait_secs = 1\npoll_interval_secs = 0.2\n\n[stages.gate]",
            1,
        );
        assert!(
            edited.contains("kind = \"openai\"") && edited.contains("mode = \"batch\""),
            "the scaffold moved:\n{edited}"
        );
        std::fs::write(&toml_path, edited).unwrap();
        let items = ws.join("items/sample.jsonl").display().to_string();
        home.run(&["--workspace", &ws_s, "import", &items]);
        home
    }

    /// The shell line tmux runs: docket with this home.
    fn command_line(&self, args: &str) -> String {
        format!(
            "{} {} --workspace {} {args}",
            env_line(self.vars()),
            sh_quote(support::procs::bin()),
            sh_quote(&self.ws().display().to_string())
        )
    }
}

/// One provider_batch row.
#[derive(Debug, Clone)]
struct BatchRow {
    session_id: String,
    state: String,
    provider_batch_id: Option<String>,
    cancel_requested_at: Option<f64>,
}

fn batch_rows(conn: &Connection) -> Vec<BatchRow> {
    let Ok(mut st) = conn.prepare(
        "SELECT session_id, state, provider_batch_id, cancel_requested_at
         FROM provider_batch ORDER BY batch_id",
    ) else {
        return Vec::new();
    };
    st.query_map([], |r| {
        Ok(BatchRow {
            session_id: r.get(0)?,
            state: r.get(1)?,
            provider_batch_id: r.get(2)?,
            cancel_requested_at: r.get(3)?,
        })
    })
    .map(|rows| rows.filter_map(Result::ok).collect())
    .unwrap_or_default()
}

fn ledger_batches(path: &Path) -> Vec<BatchRow> {
    docket::ledger::open_read_only(path)
        .map(|c| batch_rows(&c))
        .unwrap_or_default()
}

fn session_state(path: &Path, sid: &str) -> Option<(String, String)> {
    let conn = docket::ledger::open_read_only(path).ok()?;
    conn.query_row(
        "SELECT state, desired_state FROM llm_batch_session WHERE session_id = ?1",
        [sid],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .ok()
}

/// Wait until the ledger shows a batch the provider knows (an id recorded)
/// and is still working on; fail with the pane on timeout.
fn wait_running_batch(home: &Home, pane: &Pane) -> BatchRow {
    poll("a provider batch validating or in progress", WAIT, || {
        let rows = ledger_batches(&home.ledger());
        rows.iter()
            .find(|r| {
                r.provider_batch_id.is_some()
                    && matches!(r.state.as_str(), "validating" | "in_progress")
            })
            .cloned()
            .ok_or_else(|| format!("batches {rows:?}\npane:\n{}", pane.text()))
    })
}

/// Wait until the mock's `name` stat is `want`.
fn wait_stat(mock: &Mock, pane: &Pane, name: &str, want: u64) {
    poll(&format!("the mock's {name} == {want}"), WAIT, || {
        let got = mock.stat(name);
        if got == want {
            Ok(())
        } else {
            Err(format!("{name} = {got}\npane:\n{}", pane.text()))
        }
    });
}

const QUESTION: &str = "Cancel them too, collecting what they finished? [y/N]";

/// Start a headless run in tmux, wait for its batch at the provider, press
/// Ctrl-C and wait for the question. Returns the pane and the batch.
fn headless_until_question(home: &Home, tag: &str) -> (Pane, BatchRow) {
    let pane = Pane::start(
        tag,
        &home.command_line("batch-adjudicate --yes --headless"),
        120,
        40,
    );
    let batch = wait_running_batch(home, &pane);
    assert_eq!(exit_code(&pane.text()), None, "still running");
    pane.keys(&["C-c"]);
    let s = pane.wait_text("the Ctrl-C question", WAIT, |s| s.contains(QUESTION));
    assert!(
        s.contains("1 provider batch(es) of this session are still open"),
        "{s}"
    );
    (pane, batch)
}

// ---------------------------------------------------------------- tests

/// Ctrl-C at a headless run with a batch open, answered `y`: the batch is
/// cancelled at the provider (what it finished collected), the run ends
/// cancelled with 130.
#[test]
fn headless_ctrl_c_yes_cancels_the_provider_batch() {
    let mock = Mock::start();
    let home = Home::new(&mock);
    let (pane, batch) = headless_until_question(&home, "yes");
    assert_eq!(mock.stat("batches_cancelled"), 0, "nothing cancelled yet");
    pane.keys(&["y", "Enter"]);
    let (code, text) = pane.wait_exit(WAIT);
    assert_eq!(code, 130, "{text}");
    assert!(
        text.contains("Cancelling 1 provider batch(es)") && text.contains("cancelled: "),
        "{text}"
    );
    assert_eq!(mock.stat("batches_cancelled"), 1, "{text}");
    assert_eq!(mock.stat("batches_created"), 1, "{text}");
    let rows = ledger_batches(&home.ledger());
    let row = rows
        .iter()
        .find(|r| r.provider_batch_id == batch.provider_batch_id)
        .unwrap_or_else(|| panic!("{rows:?}"));
    assert!(row.cancel_requested_at.is_some(), "{rows:?}\n{text}");
    assert!(
        !text.contains("The provider keeps working on"),
        "nothing left at the provider: {text}"
    );
    let (state, _) = session_state(&home.ledger(), &batch.session_id).expect("the session");
    assert_eq!(state, "cancelled", "{text}");
}

/// Ctrl-C answered `n`: the batch stays at the provider, the run says so
/// and how to resume, and ends with 130.
#[test]
fn headless_ctrl_c_no_leaves_the_provider_batch() {
    let mock = Mock::start();
    let home = Home::new(&mock);
    let (pane, batch) = headless_until_question(&home, "no");
    pane.keys(&["n", "Enter"]);
    let (code, text) = pane.wait_exit(WAIT);
    assert_eq!(code, 130, "{text}");
    assert!(
        text.contains("The provider keeps working on it"),
        "says the batch goes on: {text}"
    );
    let resume = format!(
        "Resume with `docket batch-adjudicate --resume {}` to collect the results",
        batch.session_id
    );
    assert!(text.contains(&resume), "shows {resume:?}: {text}");
    assert!(!text.contains("Cancelling 1 provider batch"), "{text}");
    // Give a stray cancel time to arrive before counting.
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(mock.stat("batches_cancelled"), 0, "{text}");
    let rows = ledger_batches(&home.ledger());
    assert!(
        rows.iter().all(|r| r.cancel_requested_at.is_none()),
        "{rows:?}"
    );
    assert!(
        rows.iter()
            .any(|r| r.provider_batch_id == batch.provider_batch_id
                && matches!(r.state.as_str(), "validating" | "in_progress")),
        "the batch is still open in the ledger: {rows:?}"
    );
}

/// The console on a live batch run: `b` lists the batch with its provider
/// id and state, Esc closes it, `c` + `y` cancels the session, and the
/// engine cancels its provider batch.
#[test]
fn console_batches_overlay_then_cancel_cancels_the_batch() {
    let mock = Mock::start();
    let home = Home::new(&mock);
    let pane = Pane::start(
        "console",
        &home.command_line("batch-adjudicate --yes"),
        120,
        40,
    );
    let batch = wait_running_batch(&home, &pane);
    let sid = batch.session_id.clone();
    let id = batch.provider_batch_id.clone().unwrap();
    pane.wait("the console on the session", WAIT, |s| {
        s.lines().next().is_some_and(|h| h.contains(&sid))
            && s.lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .is_some_and(|f| f.starts_with(" NORMAL "))
    });

    // Lines waiting in the provider's batch are not in flight: the gauges
    // and the stage row count them apart, as waiting at the provider.
    pane.wait("the lines counted at the provider", WAIT, |s| {
        s.contains("· 0 in flight · 50 at provider")
            && s.contains("0/50 · 50 at provider · RUNNING")
    });

    pane.keys(&["b"]);
    let s = pane.wait("the batches overlay with the batch", WAIT, |s| {
        s.contains("Provider batches") && s.contains(&format!("id {id}"))
    });
    let row = s
        .lines()
        .find(|l| l.contains("▶ in_progress") || l.contains("▶ validating"))
        .unwrap_or_else(|| panic!("no running batch row: {s}"));
    assert!(row.contains("/50"), "ingested/all of 50 items: {row}\n{s}");
    assert_eq!(mock.stat("batches_cancelled"), 0);

    pane.keys(&["Escape"]);
    pane.wait("the overlay closed", WAIT, |s| {
        !s.contains("Provider batches")
    });

    pane.keys(&["c"]);
    // Waits for the whole dialog: a capture can catch a frame half drawn.
    let s = pane.wait("the cancel dialog", WAIT, |s| {
        s.contains("Cancel the run?") && s.contains("y yes   n no (default)")
    });
    assert!(s.contains(&format!("Cancel session {sid}?")), "{s}");
    pane.keys(&["y"]);

    wait_stat(&mock, &pane, "batches_cancelled", 1);
    poll(
        "the session cancelled in the ledger",
        WAIT,
        || match session_state(&home.ledger(), &sid) {
            Some((state, desired)) if state == "cancelled" && desired == "cancelled" => Ok(()),
            other => Err(format!("{other:?}\npane:\n{}", pane.screen())),
        },
    );
    let rows = ledger_batches(&home.ledger());
    let row = rows
        .iter()
        .find(|r| r.provider_batch_id.as_deref() == Some(id.as_str()))
        .unwrap_or_else(|| panic!("{rows:?}"));
    assert!(row.cancel_requested_at.is_some(), "{rows:?}");
    assert_eq!(mock.stat("batches_created"), 1);
    pane.wait("the console showing the session cancelled", WAIT, |s| {
        s.lines().next().is_some_and(|h| h.contains("■ CANCELLED"))
    });

    // The ledger says cancelled before this process's engine has finished
    // (it waits for the provider to close the batch and ingests what
    // finished). A q in that window asks how to quit a live run; the
    // question goes away with a hint once the run ends (a capture can miss
    // the question, never the hint), and q then quits.
    pane.keys(&["q"]);
    let seen = pane.wait_text("docket to exit or ask how to quit", WAIT, |s| {
        exit_code(s).is_some()
            || s.contains("Quit while the run is live?")
            || s.contains("The run has ended; q quits.")
    });
    if exit_code(&seen).is_none() {
        pane.wait("the question gone once the run ended", WAIT, |s| {
            s.contains("The run has ended; q quits.") && !s.contains("Quit while the run is live?")
        });
        pane.keys(&["q"]);
    }
    let (code, text) = pane.wait_exit(WAIT);
    assert_eq!(code, 130, "{text}");
}

/// While the provider works on a batch, the overlay shows the provider's own
/// count of the requests it has finished (the mock answers the 50 lines
/// evenly over 15 s) and how long ago that count last moved, not `0/50`
/// until the batch ends; the ledger keeps when the counts moved.
#[test]
fn console_batches_overlay_shows_the_providers_progress() {
    let mock = Mock::start();
    let home = Home::new(&mock);
    let pane = Pane::start(
        "progress",
        &home.command_line("batch-adjudicate --yes"),
        120,
        40,
    );
    let batch = wait_running_batch(&home, &pane);
    let sid = batch.session_id.clone();
    pane.wait("the console on the session", WAIT, |s| {
        s.lines().next().is_some_and(|h| h.contains(&sid))
    });
    pane.keys(&["b"]);
    let row = poll("the provider's progress in the overlay", WAIT, || {
        let s = pane.text();
        let row = s
            .lines()
            .find(|l| l.contains("▶ in_progress"))
            .map(str::to_string);
        let done = row.as_deref().and_then(|r| {
            r.split_whitespace()
                .find_map(|w| w.strip_suffix("/50"))
                .and_then(|n| n.parse::<u64>().ok())
        });
        match (row, done) {
            (Some(r), Some(n)) if n > 0 && n < 50 && r.contains("s ago") => Ok(r),
            _ => Err(format!("no batch part done yet:\n{s}")),
        }
    });
    assert_eq!(mock.stat("batches_created"), 1, "{row}");
    let conn = Connection::open(home.ledger()).unwrap();
    let (completed, changed, submitted): (i64, Option<f64>, Option<f64>) = conn
        .query_row(
            "SELECT completed_count, counts_changed_at, submitted_at FROM provider_batch",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert!(completed > 0, "the provider's count in the ledger");
    assert!(
        changed.zip(submitted).is_some_and(|(c, s)| c > s),
        "counts_changed_at {changed:?} after submission {submitted:?}"
    );
}
