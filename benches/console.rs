//! Console benchmarks, printed as figures (run: `cargo bench --bench console`;
//! some of them: `cargo bench --bench console -- idle keys`; names: idle,
//! bandwidth, keys, start, queries).
//!
//! The console is the real release binary in a private tmux server (its own
//! socket, no config file) at 120x40, with isolated XDG dirs. The process
//! writes its own figures to `DOCKET_CONSOLE_STATS` when the console closes
//! (frames, bytes written to the terminal, key latencies, first loaded frame).
//! The 1,000,000-item ledger is generated once and cached under
//! `target/bench-console/` (keyed by `LEDGER_VERSION` and the schema version).
//! Every tmux session and console process is ended on the way out, also when
//! a step fails.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use docket::ledger::console::ConsoleReads;
use docket::watch::ReviewQuery;

const BIN: &str = env!("CARGO_BIN_EXE_docket");
const COLS: &str = "120";
const ROWS: &str = "40";
/// Bump when the generated ledger's shape changes (the cache is keyed by it).
const LEDGER_VERSION: u32 = 1;
const BIG_ITEMS: i64 = 1_000_000;
const BIG_SESSION: &str = "batch_20250101_bench1";

fn verdict(ok: bool) -> &'static str {
    if ok { "PASS" } else { "FAIL" }
}

// ---------------------------------------------------------------- tmux

fn tmux(socket: &str) -> Command {
    let mut c = Command::new("tmux");
    c.args(["-L", socket, "-f", "/dev/null"]);
    c.stdin(Stdio::null());
    c
}

/// One console in its own tmux session; ended (session and process) on drop.
struct Console {
    socket: String,
    /// The server's socket file, removed once the server is gone.
    socket_path: String,
    name: String,
    pid: u32,
}

impl Console {
    fn start(tag: &str, env: &[(&str, String)], args: &[&str]) -> Console {
        let socket = format!("docket-bench-{}", std::process::id());
        let name = format!("{tag}-{}", std::process::id());
        let mut cmd = tmux(&socket);
        cmd.args([
            "new-session",
            "-d",
            "-s",
            &name,
            "-x",
            COLS,
            "-y",
            ROWS,
            "--",
            "env",
        ]);
        for (k, v) in env {
            cmd.arg(format!("{k}={v}"));
        }
        cmd.arg(BIN).args(args);
        let ok = cmd.status().expect("tmux").success();
        assert!(ok, "tmux new-session failed");
        let out = tmux(&socket)
            .args([
                "display-message",
                "-p",
                "-t",
                &name,
                "#{pane_pid} #{socket_path}",
            ])
            .output()
            .expect("tmux");
        let out = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let (pid, socket_path) = out.split_once(' ').expect("pane pid and socket");
        Console {
            pid: pid.parse().expect("pane pid"),
            socket_path: socket_path.to_string(),
            socket,
            name,
        }
    }

    /// Keys as tmux names them ("j", "Enter").
    fn send(&self, key: &str) {
        let _ = tmux(&self.socket)
            .args(["send-keys", "-t", &self.name, key])
            .status();
    }

    /// Text typed as it is (no key names).
    fn type_text(&self, text: &str) {
        let _ = tmux(&self.socket)
            .args(["send-keys", "-l", "-t", &self.name, text])
            .status();
    }

    fn capture(&self) -> String {
        tmux(&self.socket)
            .args(["capture-pane", "-p", "-t", &self.name])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// Poll the screen until `pred` holds; the time it took, or None.
    fn wait_screen(&self, timeout: Duration, pred: impl Fn(&str) -> bool) -> Option<Duration> {
        self.poll_screen(timeout, Duration::from_millis(25), pred)
    }

    /// As `wait_screen`, polling every `every`.
    fn poll_screen(
        &self,
        timeout: Duration,
        every: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> Option<Duration> {
        let t = Instant::now();
        while t.elapsed() < timeout {
            if pred(&self.capture()) {
                return Some(t.elapsed());
            }
            std::thread::sleep(every);
        }
        None
    }

    fn alive(&self) -> bool {
        alive(self.pid)
    }

    /// Wait for the process to end by itself.
    fn wait_exit(&self, timeout: Duration) -> bool {
        let t = Instant::now();
        while t.elapsed() < timeout {
            if !self.alive() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// CPU seconds (user + system, all threads) used so far.
    fn cpu_secs(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).expect("stat");
        let rest = &stat[stat.rfind(')').expect("stat") + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        // Fields 14 and 15 of stat(5); `rest` starts at field 3.
        let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
        ticks as f64 / clock_ticks()
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        let _ = tmux(&self.socket)
            .args(["kill-session", "-t", &self.name])
            .stderr(Stdio::null())
            .status();
        // The pane's process gets SIGHUP with the session; make sure.
        if !self.wait_exit(Duration::from_secs(3)) {
            let _ = Command::new("kill")
                .args(["-KILL", &self.pid.to_string()])
                .status();
        }
        let server_up = tmux(&self.socket)
            .arg("has-session")
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !server_up {
            let _ = std::fs::remove_file(&self.socket_path);
        }
    }
}

fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s.rfind(')').is_some_and(|i| s[i + 2..].starts_with('Z')),
        Err(_) => false,
    }
}

fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// The review pane's cursor and total from its title (" 5 Review queue 3/120 ").
fn review_cursor(screen: &str) -> Option<(u64, u64)> {
    let at = screen.find("Review queue ")? + "Review queue ".len();
    let rest = &screen[at..];
    let end = rest.find(|c: char| !(c.is_ascii_digit() || c == '/'))?;
    let (a, b) = rest[..end].split_once('/')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

// ---------------------------------------------------------------- env, stats

/// Isolated XDG dirs (logs, keymap, the demo workspace) for one console.
struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        Env {
            dir: tempfile::tempdir().expect("tmp"),
        }
    }
    fn stats(&self) -> PathBuf {
        self.dir.path().join("stats.txt")
    }
    fn vars(&self) -> Vec<(&'static str, String)> {
        let p = self.dir.path();
        vec![
            ("XDG_DATA_HOME", p.join("data").display().to_string()),
            ("XDG_STATE_HOME", p.join("state").display().to_string()),
            ("XDG_CONFIG_HOME", p.join("config").display().to_string()),
            ("XDG_CACHE_HOME", p.join("cache").display().to_string()),
            ("DOCKET_CONSOLE_STATS", self.stats().display().to_string()),
        ]
    }
    fn docket(&self, args: &[&str]) {
        let out = Command::new(BIN)
            .envs(self.vars())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("docket");
        assert!(
            out.status.success(),
            "docket {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    /// The console's figures, once it has written them.
    fn read_stats(&self, timeout: Duration) -> HashMap<String, i64> {
        let t = Instant::now();
        loop {
            if let Ok(text) = std::fs::read_to_string(self.stats())
                && text.contains("first_loaded_frame_ms=")
            {
                return text
                    .lines()
                    .filter_map(|l| l.split_once('='))
                    .filter_map(|(k, v)| Some((k.to_string(), v.trim().parse().ok()?)))
                    .collect();
            }
            assert!(t.elapsed() < timeout, "no console figures in {timeout:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn stat(s: &HashMap<String, i64>, k: &str) -> i64 {
    *s.get(k).unwrap_or(&-1)
}

// ---------------------------------------------------------------- 1. idle

fn idle() {
    let env = Env::new();
    let ws = env.dir.path().join("ws");
    let w = ws.display().to_string();
    env.docket(&["init", &w]);
    let sample = ws
        .join(docket::workspace::SAMPLE_ITEMS)
        .display()
        .to_string();
    env.docket(&["--workspace", &w, "import", &sample]);
    env.docket(&["--workspace", &w, "batch-adjudicate", "--headless", "--yes"]);
    idle_cpu(&env, &w, "a completed 50-item session", true, None);
}

/// Open the console on `ws`, wait for the first loaded frame plus 2 s, then
/// read its CPU time over 20 s.
fn idle_cpu(env: &Env, ws: &str, what: &str, target_line: bool, filter: Option<&str>) {
    let c = Console::start("idle", &env.vars(), &["--workspace", ws]);
    c.wait_screen(Duration::from_secs(30), |s| s.contains("batch_"))
        .expect("the console never showed the session");
    if let Some(f) = filter {
        // The review pane, `/`, the text, Enter: the queue stays filtered.
        c.send("5");
        c.send("/");
        c.type_text(f);
        c.send("Enter");
        c.wait_screen(Duration::from_secs(30), |s| s.contains(&format!("/{f}")))
            .expect("the filter never showed");
    }
    std::thread::sleep(Duration::from_secs(2));
    let window = 20.0;
    let t0 = Instant::now();
    let cpu0 = c.cpu_secs();
    std::thread::sleep(Duration::from_secs_f64(window));
    let cpu1 = c.cpu_secs();
    let wall = t0.elapsed().as_secs_f64();
    c.send("q");
    let s = env.read_stats(Duration::from_secs(10));
    c.wait_exit(Duration::from_secs(5));
    let pct = (cpu1 - cpu0) * 100.0 / wall;
    let secs = stat(&s, "elapsed_ms") as f64 / 1000.0;
    let label = if target_line {
        format!("  [{}: < 1%]", verdict(pct < 1.0))
    } else {
        "  (extra, no target)".to_string()
    };
    println!(
        "1. idle console CPU ({what}): {pct:.2}% of a core over {wall:.0} s (target < 1%){label}; \
         whole life: {:.2} frames/s, {:.0} B/s",
        stat(&s, "frames") as f64 / secs,
        stat(&s, "bytes") as f64 / secs,
    );
}

// ---------------------------------------------------------------- 2. bytes/s

fn live_demo(env: &Env) -> Console {
    let c = Console::start("demo", &env.vars(), &["demo", "--items", "3000"]);
    c.wait_screen(Duration::from_secs(60), |s| s.contains("batch_"))
        .expect("the demo's console never showed its session");
    c
}

/// Quit a live run's console: `q`, then `c` in the dialog (cancel the run).
fn quit_live(env: &Env, c: &Console) -> HashMap<String, i64> {
    c.send("q");
    c.wait_screen(Duration::from_secs(5), |s| {
        s.contains("Quit while the run is live")
    });
    c.send("c");
    let s = env.read_stats(Duration::from_secs(30));
    c.wait_exit(Duration::from_secs(30));
    s
}

fn bandwidth() {
    let env = Env::new();
    let c = live_demo(&env);
    std::thread::sleep(Duration::from_secs(15));
    let s = quit_live(&env, &c);
    let secs = stat(&s, "elapsed_ms") as f64 / 1000.0;
    let bps = stat(&s, "bytes") as f64 / secs;
    println!(
        "2. terminal output during a live run (demo --items 3000, 120x40, {secs:.1} s): {:.0} B/s = {:.2} KB/s (target < 8 KB/s)  [{}]; \
         {:.2} frames/s, {:.0} B/frame",
        bps,
        bps / 1024.0,
        verdict(bps < 8.0 * 1024.0),
        stat(&s, "frames") as f64 / secs,
        stat(&s, "bytes") as f64 / stat(&s, "frames").max(1) as f64,
    );
}

// ---------------------------------------------------------------- 3. keys

fn keys() {
    let env = Env::new();
    let c = live_demo(&env);
    c.send("5");
    let ready = c.wait_screen(Duration::from_secs(60), |s| {
        review_cursor(s).is_some_and(|(_, total)| total >= 3)
    });
    assert!(ready.is_some(), "no review items after 60 s");
    for i in 0..60 {
        c.send(if i % 2 == 0 { "j" } else { "k" });
        std::thread::sleep(Duration::from_millis(150));
    }
    // End to end: send-keys until capture-pane shows the moved cursor.
    let mut e2e = Vec::new();
    let mut missed = 0;
    for i in 0..12 {
        std::thread::sleep(Duration::from_millis(150));
        let Some((before, _)) = review_cursor(&c.capture()) else {
            missed += 1;
            continue;
        };
        let (key, want) = if i % 2 == 0 || before == 1 {
            ("j", before + 1)
        } else {
            ("k", before - 1)
        };
        let t = Instant::now();
        c.send(key);
        let seen = c.poll_screen(Duration::from_secs(1), Duration::from_millis(2), |s| {
            review_cursor(s).is_some_and(|(cur, _)| cur == want)
        });
        match seen {
            Some(_) => e2e.push(t.elapsed().as_secs_f64() * 1000.0),
            None => missed += 1,
        }
    }
    let s = quit_live(&env, &c);
    let p50 = stat(&s, "key_latency_p50_us") as f64 / 1000.0;
    let max = stat(&s, "key_latency_max_us") as f64 / 1000.0;
    println!(
        "3. key to flushed frame in the process (live run, review pane, {} keys): p50 {p50:.2} ms, max {max:.2} ms (target < 30 ms)  [{}]",
        stat(&s, "keys"),
        verdict(max < 30.0),
    );
    e2e.sort_by(f64::total_cmp);
    println!(
        "3. key to changed screen through tmux (send-keys .. capture-pane polled every ~2 ms, {} keys, {} missed): \
         median {:.1} ms, max {:.1} ms (includes tmux: one tmux client per poll)",
        e2e.len(),
        missed,
        pct(&e2e, 0.5),
        pct(&e2e, 1.0),
    );
}

fn pct(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

// ---------------------------------------------------------------- the 1M ledger

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
}

/// A workspace whose ledger holds 1,000,000 decided items, one completed
/// session over all of them (requests, messages, results) and 100,000
/// pending review items. Generated once, then reused.
fn big_workspace() -> PathBuf {
    let schema = docket::ledger::MIGRATIONS.last().map_or(0, |m| m.0);
    let root = target_dir()
        .join("bench-console")
        .join(format!("ledger-v{LEDGER_VERSION}-s{schema}"));
    let ws = root.join("ws");
    if ws.join(docket::ledger::LEDGER_FILE).exists() {
        return ws;
    }
    let gen_dir = root.join("gen");
    let _ = std::fs::remove_dir_all(&gen_dir);
    std::fs::create_dir_all(&gen_dir).expect("mkdir");
    let t = Instant::now();
    eprintln!(
        "generating the 1,000,000-item ledger (once; cached in {})...",
        root.display()
    );
    generate(&gen_dir.join(docket::ledger::LEDGER_FILE));
    std::fs::rename(&gen_dir, &ws).expect("rename");
    eprintln!("  generated in {:.1} s", t.elapsed().as_secs_f64());
    ws
}

fn generate(path: &Path) {
    let conn = docket::ledger::open(path).expect("ledger");
    conn.execute_batch(
        "PRAGMA foreign_keys = OFF; PRAGMA synchronous = OFF; PRAGMA cache_size = -500000;",
    )
    .unwrap();
    let t0: f64 = 1_735_700_000.0;
    let sql = format!(
        "
BEGIN;
CREATE TEMP TABLE n AS
  WITH RECURSIVE seq(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM seq WHERE i < {BIG_ITEMS})
  SELECT i,
         printf('chart-%07d', i) AS item,
         CASE WHEN i % 10 = 0 THEN 'review' WHEN i % 1000 = 999 THEN 'error'
              WHEN i % 10 = 9 THEN 'rejected' ELSE 'accepted' END AS outcome,
         CASE WHEN i % 10 = 0 THEN 0.6 + (i * 7919 % 250) / 1000.0
              WHEN i % 1000 = 999 THEN NULL
              WHEN i % 10 = 9 THEN 0.2 + (i % 40) / 100.0
              ELSE 0.85 + (i % 15) / 100.0 END AS conf,
         printf('{{\"crg_mbid\":\"%08x-0000-4000-a000-%012x\",\"rr_mbid\":\"%08x-1111-4111-a111-%012x\"}}',
                i, i * 31, i, i * 37) AS answer,
         {t0} + i * 0.01 AS at
  FROM seq;
INSERT INTO llm_batch_session (session_id, started_at, completed_at, total_count, config_snapshot_json,
                               state, desired_state, stop_reason, updated_at, heartbeat_at)
  VALUES ('{BIG_SESSION}', {t0}, {t0} + {BIG_ITEMS} * 0.01 + 1,  {BIG_ITEMS},
          '{{\"config\":{{\"stages\":[{{\"name\":\"adjudicate\"}}]}}}}', 'completed', 'running',
          'completed', {t0} + {BIG_ITEMS} * 0.01 + 1, {t0} + {BIG_ITEMS} * 0.01 + 1);
INSERT INTO decision (item_id, state, evidence_json, decided_answer_json, decided_by, decided_at,
                      confidence, model_id, adjudication_id, source_file, source_line, imported_at, updated_at)
  SELECT item, CASE WHEN outcome = 'accepted' THEN 'decided' ELSE 'indeterminate' END,
         printf('{{\"id\":\"%s\",\"chart\":\"UK Singles\",\"week\":\"2024-%02d-%02d\",\"position\":%d,\"artist\":\"Kestrel\",\"title\":\"Neon Heart %d\"}}',
                item, i % 12 + 1, i % 28 + 1, i % 100 + 1, i),
         CASE WHEN outcome = 'accepted' THEN answer END,
         CASE WHEN outcome = 'accepted' THEN 'llm_auto_accept' END,
         CASE WHEN outcome = 'accepted' THEN at END,
         CASE WHEN outcome = 'accepted' THEN conf END,
         CASE WHEN outcome = 'accepted' THEN 'gpt-4o-mini' END,
         CASE WHEN outcome = 'accepted' THEN CAST(i AS TEXT) END,
         'items/big.jsonl', i, {t0} - 60, at
  FROM n ORDER BY i;
INSERT INTO llm_requests (request_id, item_id, stage, provider, model, status, attempt, last_error,
                          template_hash, params_hash, parsed_output_json, result_message_id, created_at, updated_at)
  SELECT i, item, 'adjudicate', 'main', 'gpt-4o-mini',
         CASE WHEN outcome = 'error' THEN 'error' ELSE 'completed' END, 1,
         CASE WHEN outcome = 'error' THEN 'http 500: server error' END,
         'tpl-0001', 'par-0001',
         CASE WHEN outcome <> 'error' THEN answer END,
         CASE WHEN outcome <> 'error' THEN i END, at - 0.3, at
  FROM n ORDER BY i;
INSERT INTO llm_messages (message_id, request_id, attempt, session_id, client_request_id, state, user_prompt,
                          assistant_output, finish_reason, http_status, error_kind, error_message, model_reported,
                          input_tokens, output_tokens, total_tokens, cost_usd, latency_ms, sent_at, finished_at)
  SELECT i, i, 1, '{BIG_SESSION}', '{BIG_SESSION}-' || i || '-1',
         CASE WHEN outcome = 'error' THEN 'failed' ELSE 'answered' END,
         'Chart entry ' || item || ': Kestrel - Neon Heart ' || i || '. Pick the release group and recording.',
         CASE WHEN outcome <> 'error' THEN answer END, 'stop',
         CASE WHEN outcome = 'error' THEN 500 ELSE 200 END,
         CASE WHEN outcome = 'error' THEN 'http_5xx' END,
         CASE WHEN outcome = 'error' THEN 'server error' END,
         'gpt-4o-mini', 420, 60, 480, 0.0001, 150 + i % 300, at - 0.3, at
  FROM n ORDER BY i;
INSERT INTO session_item (session_id, position, item_id, request_id)
  SELECT '{BIG_SESSION}', i, item, i FROM n ORDER BY i;
INSERT INTO llm_batch_result (session_id, item_id, processed_at, outcome, answer_json, confidence, rationale,
                              model_id, error_message, adjudication_id, stage, request_id, attempts,
                              input_tokens, output_tokens, cost_usd)
  SELECT '{BIG_SESSION}', item, at, outcome, CASE WHEN outcome <> 'error' THEN answer END, conf,
         CASE WHEN outcome <> 'error' THEN 'Title and artist match; the first release year agrees.' END,
         'gpt-4o-mini', CASE WHEN outcome = 'error' THEN 'http 500: server error' END,
         CAST(i AS TEXT), 'adjudicate', i, 1, 420, 60, 0.0001
  FROM n ORDER BY i;
INSERT INTO review_item (review_id, item_id, session_id, source, status, llm_suggestion_json, confidence,
                         rationale, model_id, request_id, created_at)
  SELECT i / 10, item, '{BIG_SESSION}', 'LLM_REVIEW', 'pending', answer, conf,
         'Title and artist match; the first release year agrees.', 'gpt-4o-mini', i, at
  FROM n WHERE outcome = 'review' ORDER BY i;
INSERT INTO session_event (session_id, at, level, kind, message, actor) VALUES
  ('{BIG_SESSION}', {t0}, 'info', 'started', 'session started', 'engine'),
  ('{BIG_SESSION}', {t0} + {BIG_ITEMS} * 0.01 + 1, 'info', 'completed', 'session completed', 'engine');
UPDATE llm_batch_session SET
  processed_count = (SELECT COUNT(*) FROM temp.n),
  accepted_count = (SELECT COUNT(*) FROM temp.n WHERE outcome = 'accepted'),
  reviewed_count = (SELECT COUNT(*) FROM temp.n WHERE outcome = 'review'),
  rejected_count = (SELECT COUNT(*) FROM temp.n WHERE outcome = 'rejected'),
  error_count = (SELECT COUNT(*) FROM temp.n WHERE outcome = 'error'),
  attempt_count = {BIG_ITEMS}, input_tokens = 420 * {BIG_ITEMS}, output_tokens = 60 * {BIG_ITEMS},
  cost_usd = 0.0001 * {BIG_ITEMS}, estimated_tokens = 480 * {BIG_ITEMS}, estimated_cost_usd = 0.0001 * {BIG_ITEMS}
  WHERE session_id = '{BIG_SESSION}';
DROP TABLE temp.n;
COMMIT;
PRAGMA wal_checkpoint(TRUNCATE);
"
    );
    conn.execute_batch(&sql).expect("generate the ledger");
    // As the ledger writer does after a run: index the new review items.
    let db = docket::ledger::db::Connection::Sqlite(conn);
    db.execute_batch("BEGIN IMMEDIATE").unwrap();
    docket::ledger::search_index::catch_up(&db).expect("index the review items");
    let docket::ledger::db::Connection::Sqlite(conn) = db else {
        unreachable!("made from a SQLite connection")
    };
    conn.execute_batch("COMMIT; PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
    let review: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM review_item WHERE status = 'pending'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(review, BIG_ITEMS / 10);
}

// ---------------------------------------------------------------- 4. start

fn start() {
    let ws = big_workspace();
    let w = ws.display().to_string();
    let mut loaded = Vec::new();
    let mut seen = Vec::new();
    for _ in 0..3 {
        let env = Env::new();
        let t = Instant::now();
        let c = Console::start("start", &env.vars(), &["--workspace", &w]);
        c.wait_screen(Duration::from_secs(60), |s| s.contains(BIG_SESSION))
            .expect("the console never showed the session");
        seen.push(t.elapsed().as_secs_f64() * 1000.0);
        c.send("q");
        let s = env.read_stats(Duration::from_secs(10));
        c.wait_exit(Duration::from_secs(5));
        loaded.push(stat(&s, "first_loaded_frame_ms") as f64);
    }
    loaded.sort_by(f64::total_cmp);
    seen.sort_by(f64::total_cmp);
    println!(
        "4. console start on 1,000,000 items / 100,000 pending reviews, first loaded frame: min {:.0} ms, median {:.0} ms of 3 (target < 300 ms)  [{}]; \
         from spawn to the session on the tmux screen: min {:.0} ms, median {:.0} ms",
        loaded[0],
        loaded[1],
        verdict(loaded[1] < 300.0),
        seen[0],
        seen[1],
    );
    let env = Env::new();
    idle_cpu(
        &env,
        &w,
        "1,000,000 items, 100,000 pending reviews",
        false,
        None,
    );
    let env = Env::new();
    idle_cpu(
        &env,
        &w,
        "1,000,000 items, review queue filtered by \"chart-00042\"",
        false,
        Some("chart-00042"),
    );
}

// ---------------------------------------------------------------- 5. queries

/// Median and p95 of `n` timed calls (after one untimed warm-up), in ms.
fn time_it<T>(n: usize, mut f: impl FnMut() -> T) -> (f64, f64) {
    std::hint::black_box(f());
    let mut ms: Vec<f64> = (0..n)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(f());
            t.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    (pct(&ms, 0.5), pct(&ms, 0.95))
}

fn queries() {
    let ws = big_workspace();
    // What the console's ledger worker does first, cold in this process:
    // open (and migrate) the ledger, then one snapshot.
    let t = Instant::now();
    let db = docket::ledger::Ledger::open(ws.join(docket::ledger::LEDGER_FILE)).expect("ledger");
    let opened = t.elapsed().as_secs_f64() * 1000.0;
    let _ = db.sessions().unwrap();
    let _ = db.session_view(BIG_SESSION).unwrap();
    let _ = db.events(BIG_SESSION, 200).unwrap();
    let _ = db
        .review_page(&ReviewQuery {
            limit: 200,
            ..Default::default()
        })
        .unwrap();
    println!(
        "5. the console worker's first read, cold in a new process: Ledger::open {opened:.1} ms, open + first snapshot {:.1} ms",
        t.elapsed().as_secs_f64() * 1000.0
    );
    let page = |q: ReviewQuery| {
        let db = &db;
        move || db.review_page(&q).expect("review_page")
    };
    let cases = [
        (
            "offset 0, limit 50",
            ReviewQuery {
                limit: 50,
                ..Default::default()
            },
        ),
        (
            "offset 50,000, limit 50",
            ReviewQuery {
                limit: 50,
                offset: 50_000,
                ..Default::default()
            },
        ),
        (
            "filter \"chart-00042\" (10 matches), limit 50",
            ReviewQuery {
                limit: 50,
                filter: Some("chart-00042".into()),
                ..Default::default()
            },
        ),
        (
            "the console's window: offset 0, limit 200",
            ReviewQuery {
                limit: 200,
                ..Default::default()
            },
        ),
    ];
    let mut refresh = 0.0;
    for (i, (what, q)) in cases.into_iter().enumerate() {
        let t = Instant::now();
        let got = db.review_page(&q).expect("review_page");
        let first = t.elapsed().as_secs_f64() * 1000.0;
        let (p50, p95) = time_it(50, page(q));
        if i == 3 {
            refresh += p50;
        }
        println!(
            "5. review_page at 100,000 pending, {what}: median {p50:.2} ms, p95 {p95:.2} ms of 50 (first call {first:.2} ms; {} rows of {}) (target < 5 ms)  [{}]",
            got.rows.len(),
            got.total,
            verdict(p95 < 5.0),
        );
    }
    let (p50, p95) = time_it(50, || db.session_view(BIG_SESSION).unwrap());
    refresh += p50;
    println!("5. session_view on the 1M-item session: median {p50:.2} ms, p95 {p95:.2} ms");
    let (p50, p95) = time_it(50, || db.sessions().unwrap());
    refresh += p50;
    println!("5. sessions (1 session, 1M items): median {p50:.2} ms, p95 {p95:.2} ms");
    let (p50, p95) = time_it(50, || db.events(BIG_SESSION, 200).unwrap());
    refresh += p50;
    println!(
        "5. events (limit 200, 1,000 failed attempts + 1,000 errored items): median {p50:.2} ms, p95 {p95:.2} ms"
    );
    println!(
        "5. the console's refresh (sessions + session_view + events + review window of 200), run at least once a second: {refresh:.2} ms"
    );
}

fn main() {
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let want = |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()));
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "docket console benchmarks (release build, {} cores, load average {})",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
    );
    if want("idle") {
        idle();
    }
    if want("bandwidth") {
        bandwidth();
    }
    if want("keys") {
        keys();
    }
    if want("start") {
        start();
    }
    if want("queries") {
        queries();
    }
}
