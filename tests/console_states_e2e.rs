//! One truth about a run, end to end: the real binary in tmux watching a
//! headless run in another process, and `docket sessions` from a third.
//! After a pause, a cancel, a stop at a stage and a `kill -9` of the
//! engine, the header, the stage rows, the sessions pane and `docket
//! sessions` all say the same word; during a run the gauges and the stage
//! row say the same "in flight", and req/min never reads above its limit.
//!
//! Every test has its own tmux server and its own data, config and
//! workspace folders; guards kill only what the test started.

use docket_testkit as support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::tmux::{Pane, env_line, poll, sh_quote};

/// How long to wait for a screen or ledger state before failing.
const WAIT: Duration = Duration::from_secs(20);

/// The rate limit of the runs: 4 requests a second, so they last minutes.
const RPM: u64 = 240;

/// A per-test home: data, config and the workspace inside one tempdir.
struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new() -> Home {
        Home {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn vars(&self, user: &str) -> Vec<(String, String)> {
        let p = |s: &str| self.dir.path().join(s).display().to_string();
        vec![
            ("HOME".into(), p("home")),
            ("XDG_DATA_HOME".into(), p("data")),
            ("XDG_STATE_HOME".into(), p("state")),
            ("XDG_CONFIG_HOME".into(), p("config")),
            ("DOCKET_CONFIG_DIR".into(), p("config/docket")),
            ("USER".into(), user.into()),
        ]
    }

    fn docket(&self) -> Command {
        let mut c = Command::new(support::procs::bin());
        c.env_remove("NO_COLOR")
            .env_remove("DOCKET_WORKSPACE")
            .env_remove("DOCKET_LOG")
            .env_remove("DOCKET_LEDGER_URL");
        for (k, v) in self.vars("alice") {
            c.env(k, v);
        }
        c
    }

    /// Run docket to completion; panic unless it exits with 0.
    fn run(&self, args: &[&str]) -> String {
        let out = self.docket().args(args).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "docket {args:?}\nstdout:\n{stdout}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// A workspace (`docket init`, with `example` when given) whose mock
    /// answers in about 1.5 s, with `n` items imported.
    fn workspace(&self, example: Option<&str>, n: usize) -> PathBuf {
        let ws = self.dir.path().join("ws");
        let ws_s = ws.display().to_string();
        let mut init = vec!["init", ws_s.as_str()];
        if let Some(e) = example {
            init.extend(["--example", e]);
        }
        self.run(&init);
        let toml_path = ws.join("docket.toml");
        let toml = std::fs::read_to_string(&toml_path).unwrap();
        let slow: String = toml
            .lines()
            .map(|l| match l.split('=').next().map(str::trim) {
                Some("latency_median_ms") => "latency_median_ms = 1500.0".to_string(),
                Some("latency_p99_ms") => "latency_p99_ms = 2500.0".to_string(),
                _ => l.to_string(),
            })
            .collect::<Vec<_>>()
            .join("\n");
        assert_ne!(toml, slow, "the scaffold's mock latency moved");
        std::fs::write(&toml_path, slow).unwrap();
        let items = ws.join("items/e2e.jsonl");
        let mut f = std::fs::File::create(&items).unwrap();
        docket::demo::write_chart_items(&mut f, n, 7).unwrap();
        drop(f);
        self.run(&["--workspace", &ws_s, "import", &items.display().to_string()]);
        ws
    }

    /// A headless run of the workspace at `RPM` requests a minute.
    fn headless(&self, ws: &Path) -> ChildGuard {
        let child = self
            .docket()
            .args(["--workspace", &ws.display().to_string()])
            .args(["batch-adjudicate", "--headless", "--yes"])
            .args(["--rate-limit", &RPM.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        ChildGuard(Some(child))
    }

    /// The console on the workspace, as another user, in a wide tmux pane.
    fn console(&self, ws: &Path, tag: &str) -> Pane {
        let cmd = format!(
            "{} {} --workspace {}",
            env_line(self.vars("bob")),
            sh_quote(support::procs::bin()),
            sh_quote(&ws.display().to_string())
        );
        Pane::start(tag, &cmd, 140, 44)
    }

    /// The session's line of `docket sessions`.
    fn sessions_line(&self, ws: &Path, sid: &str) -> String {
        let out = self.run(&["--workspace", &ws.display().to_string(), "sessions"]);
        out.lines()
            .find(|l| l.starts_with(sid))
            .unwrap_or_else(|| panic!("{sid} not in:\n{out}"))
            .to_string()
    }
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

impl ChildGuard {
    fn wait_exit(&mut self) {
        let c = self.0.as_mut().expect("still ours");
        poll("the headless run to exit", Duration::from_secs(60), || {
            c.try_wait()
                .map_err(|e| e.to_string())?
                .ok_or("still running".to_string())
        });
        self.0 = None;
    }
}

/// The newest session's id, once there is one.
fn session_id(ws: &Path) -> String {
    let path = ws.join("docket.sqlite");
    poll("the headless session", Duration::from_secs(30), || {
        if !path.exists() {
            return Err("no ledger yet".into());
        }
        let conn = docket::ledger::open_read_only(&path).map_err(|e| e.to_string())?;
        docket::ledger::store::latest_session(&support::db(&conn))
            .map_err(|e| e.to_string())?
            .ok_or("no session yet".to_string())
    })
}

/// What the console's screen says about a session.
struct Screen<'a> {
    text: &'a str,
    sid: &'a str,
}

impl Screen<'_> {
    fn header(&self) -> &str {
        self.text.lines().next().unwrap_or("")
    }

    /// The session's row in the sessions pane (the header names it too).
    fn sessions_row(&self) -> Option<&str> {
        self.text.lines().skip(1).find(|l| l.contains(self.sid))
    }

    /// The pane contents of the left and right panes on each line
    /// (`│stages│┌gauges│`; a left pane's bottom border `╚═╝` has no
    /// content, its right neighbour does).
    fn panes(&self) -> impl Iterator<Item = (String, String)> + '_ {
        self.text.lines().map(|l| {
            let parts: Vec<&str> = l.split(['│', '║']).map(str::trim).collect();
            let left = if l.starts_with(['│', '║']) {
                parts.get(1).copied().unwrap_or("")
            } else {
                ""
            };
            let right = parts.iter().rev().find(|p| !p.is_empty()).copied();
            (left.to_string(), right.unwrap_or("").to_string())
        })
    }

    /// Each stage's counts line (`N/T done · ...`).
    fn stage_rows(&self) -> Vec<String> {
        self.panes()
            .map(|(left, _)| left)
            .filter(|l| l.contains(" done · ") || l.contains(" · ") && l.contains('/'))
            .filter(|l| l.chars().next().is_some_and(|c| c.is_ascii_digit()))
            .collect()
    }

    /// The gauges pane's line that starts with `prefix`.
    fn gauge(&self, prefix: &str) -> Option<String> {
        self.panes()
            .map(|(_, right)| right)
            .find(|r| r.starts_with(prefix))
    }
}

/// The number before `in flight` in `text`.
fn in_flight(text: &str) -> Option<u64> {
    let before = text.split(" in flight").next()?;
    before.rsplit(' ').next()?.parse().ok()
}

/// Wait until the header, the session's row in the sessions pane, every
/// stage row that is not done, and `docket sessions` all say `word`
/// (`glyph` before it on the screen), and none of them says another state.
/// Returns the screen.
fn all_say(home: &Home, ws: &Path, pane: &Pane, sid: &str, glyph: &str, word: &str) -> String {
    let upper = word.to_uppercase();
    let on_screen = format!("{glyph} {upper}");
    poll(
        &format!("every view to say {word}"),
        WAIT,
        || -> Result<String, String> {
            let text = pane.screen();
            let s = Screen { text: &text, sid };
            let why = |what: &str| Err(format!("{what} does not say {on_screen}:\n{text}"));
            if !s.header().contains(&on_screen) {
                return why("the header");
            }
            if !s.sessions_row().is_some_and(|r| r.contains(&on_screen)) {
                return why("the sessions pane");
            }
            // A stage done or not started says so; the others carry the
            // session's word (a critic's row ends with what it judges).
            let rows = s.stage_rows();
            let working: Vec<&String> = rows
                .iter()
                .filter(|r| !r.contains("· DONE") && !r.contains("· PENDING"))
                .collect();
            let says = format!("· {upper}");
            if working.is_empty() || !working.iter().all(|r| r.contains(&says)) {
                return why("a stage row");
            }
            if word != "running" && rows.iter().any(|r| r.contains("RUNNING")) {
                return why("a stage row (RUNNING)");
            }
            let line = home.sessions_line(ws, sid);
            let state = line.split("  ").map(str::trim).nth(1).unwrap_or("");
            if state != word {
                return Err(format!("docket sessions says {state:?}: {line}"));
            }
            Ok(text)
        },
    )
}

/// During a run the gauges and the stage row say the same "in flight"
/// (requests sent and not answered, never the engine's slots held while
/// waiting for the rate limit), and req/min never reads above its limit.
fn check_gauges_while_running(pane: &Pane, sid: &str) {
    let started = Instant::now();
    let mut seen_in_flight = 0;
    let mut disagreed = 0;
    let mut text = String::new();
    while started.elapsed() < Duration::from_secs(8) || seen_in_flight == 0 {
        assert!(
            started.elapsed() < WAIT,
            "nothing was ever in flight:\n{text}"
        );
        text = pane.screen();
        let s = Screen { text: &text, sid };
        let (Some(conc), Some(rate)) = (s.gauge("concurrency"), s.gauge("req/min")) else {
            std::thread::sleep(Duration::from_millis(200));
            continue;
        };
        let gauge = in_flight(&conc).unwrap_or_else(|| panic!("{conc}"));
        let rows = s.stage_rows();
        let stage = rows.first().and_then(|r| in_flight(r));
        // A capture can catch a frame half drawn: only a disagreement that
        // lasts three captures is one (the old one lasted the whole run).
        if Some(gauge) != stage {
            disagreed += 1;
            assert!(disagreed < 3, "gauge and stage row disagree:\n{text}");
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        disagreed = 0;
        // `req/min  N / 240`: the limiter's own count of the last minute.
        let used: f64 = rate
            .trim_start_matches("req/min")
            .split('/')
            .next()
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("{rate}"));
        assert!(used <= RPM as f64, "req/min above its limit:\n{text}");
        assert!(rate.ends_with(&format!("/ {RPM}")), "{rate}");
        seen_in_flight = seen_in_flight.max(gauge);
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// `p`, then a cancel: every view says paused, then cancelled; while it
/// runs, in flight agrees between the gauges and the stage row.
#[test]
fn pause_and_cancel_read_the_same_everywhere() {
    let home = Home::new();
    let ws = home.workspace(None, 1000);
    let mut run = home.headless(&ws);
    let sid = session_id(&ws);
    let pane = home.console(&ws, "pause");
    all_say(&home, &ws, &pane, &sid, "▶", "running");
    check_gauges_while_running(&pane, &sid);

    pane.keys(&["p"]);
    let text = all_say(&home, &ws, &pane, &sid, "⏸", "paused");
    let s = Screen {
        text: &text,
        sid: &sid,
    };
    assert!(!s.header().contains("asked"), "{text}");

    let ws_s = ws.display().to_string();
    let said = home.run(&["--workspace", &ws_s, "cancel", &sid]);
    assert!(said.contains("cancel"), "{said}");
    run.wait_exit();
    all_say(&home, &ws, &pane, &sid, "■", "cancelled");
}

/// `S` on a two-stage job: every view says stopping at stage while the
/// stage finishes, then paused once the run stopped after it (and no
/// stage row says RUNNING).
#[test]
fn stop_at_stage_reads_the_same_everywhere() {
    let home = Home::new();
    let ws = home.workspace(Some("critic"), 80);
    let mut run = home.headless(&ws);
    let sid = session_id(&ws);
    let pane = home.console(&ws, "stop");
    all_say(&home, &ws, &pane, &sid, "▶", "running");

    pane.keys(&["S"]);
    all_say(&home, &ws, &pane, &sid, "⏹", "stopping at stage");
    run.wait_exit();
    let text = all_say(&home, &ws, &pane, &sid, "⏸", "paused");
    assert!(text.contains("DONE"), "the stage it stopped after: {text}");
}

/// `kill -9` of the engine: within seconds every view says interrupted,
/// never running.
#[test]
fn a_killed_engine_reads_interrupted_everywhere_within_seconds() {
    let home = Home::new();
    let ws = home.workspace(None, 1000);
    let mut run = home.headless(&ws);
    let sid = session_id(&ws);
    let pane = home.console(&ws, "kill");
    all_say(&home, &ws, &pane, &sid, "▶", "running");

    let killed = Instant::now();
    // `Child::kill` is SIGKILL: nothing of the engine runs after it.
    let mut child = run.0.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let text = all_say(&home, &ws, &pane, &sid, "◌", "interrupted");
    assert!(
        killed.elapsed() < Duration::from_secs(12),
        "interrupted only after {:?}",
        killed.elapsed()
    );
    assert!(text.contains("resumable"), "{text}");
}

/// The ETA of a four-stage run (judge-gym) is on the gauges from its first
/// seconds, before any item has been through every stage (it read `--:--`
/// from start to end): every stage's remaining requests at the binding
/// `RPM`, then at the session's measured pace. 40 items, 160 requests at 4
/// a second: the ETA reads at least half a minute at first.
#[test]
fn a_multi_stage_run_shows_its_eta_from_the_start() {
    let home = Home::new();
    let ws = home.workspace(Some("judge-gym"), 40);
    let _run = home.headless(&ws);
    let sid = session_id(&ws);
    let pane = home.console(&ws, "eta");
    let ledger = ws.join("docket.sqlite");
    let (eta, processed) = poll("an ETA on the gauges", WAIT, || {
        let text = pane.text();
        let s = Screen {
            text: &text,
            sid: &sid,
        };
        let line = s
            .gauge("elapsed")
            .ok_or_else(|| format!("no elapsed line:\n{text}"))?;
        let eta = line
            .split("ETA ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .filter(|e| e.contains(':') && !e.contains('-'))
            .ok_or_else(|| format!("no ETA yet: {line}"))?
            .to_string();
        let conn = docket::ledger::open_read_only(&ledger).map_err(|e| e.to_string())?;
        let processed: i64 = conn
            .query_row(
                "SELECT processed_count FROM llm_batch_session WHERE session_id = ?1",
                [&sid],
                |r| r.get(0),
            )
            .map_err(|e| e.to_string())?;
        Ok((eta, processed))
    });
    assert_eq!(processed, 0, "no item through every stage yet; ETA {eta}");
    let (m, s) = eta.split_once(':').unwrap();
    let secs = m.parse::<u64>().unwrap() * 60 + s.parse::<u64>().unwrap();
    assert!(secs >= 30, "160 requests at 4 a second: ETA {eta}");
}
