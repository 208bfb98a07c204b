//! The crash soak (issue 12, fault-matrix rows P3, P4 and the invariants
//! I1–I6): one trial runs a job against the mock provider as its own
//! process, with faults on, and interrupts it one to three times, each time
//! with SIGKILL at a random moment or at a named failpoint
//! (`docket::failpoint`), resuming after each, then lets the last resume
//! finish. After every interruption and at the end it checks the ledger and
//! the mock's billing log. One seed decides everything a trial does, so a
//! failing seed replays exactly (up to the machine's timing).
//!
//! Used by `tests/soak.rs` (a few trials in `cargo test`) and by
//! `cargo bench --bench soak` (the long run).

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rusqlite::Connection;

use super::Workspace;
use super::procs::{Mock, Proc, bin};

const KEY_ENV: &str = "DOCKET_SOAK_KEY";
/// The longest one run of docket may take before the trial fails.
const RUN_TIMEOUT: Duration = Duration::from_secs(180);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Synchronous requests (OpenAI's wire), with 3% 500s.
    Sync,
    /// Batch mode on each provider's Batch API; the first create's answer
    /// is lost (a 500 after the batch was made).
    BatchOpenai,
    BatchAnthropic,
    BatchGemini,
}

impl Mode {
    pub const ALL: [Mode; 4] = [
        Mode::Sync,
        Mode::BatchOpenai,
        Mode::BatchAnthropic,
        Mode::BatchGemini,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Sync => "sync",
            Mode::BatchOpenai => "batch-openai",
            Mode::BatchAnthropic => "batch-anthropic",
            Mode::BatchGemini => "batch-gemini",
        }
    }

    pub fn from_name(s: &str) -> Option<Mode> {
        Mode::ALL.into_iter().find(|m| m.name() == s)
    }

    fn kind(self) -> &'static str {
        match self {
            Mode::Sync | Mode::BatchOpenai => "openai",
            Mode::BatchAnthropic => "anthropic",
            Mode::BatchGemini => "gemini",
        }
    }

    fn batch(self) -> bool {
        self != Mode::Sync
    }

    /// The failpoints this mode passes, with the largest pass number worth
    /// arming (a larger one may simply never fire: the run then ends).
    pub fn failpoints(self) -> &'static [(&'static str, u64)] {
        match self {
            Mode::Sync => &[
                ("after_claim", 3),
                ("after_intent", 60),
                ("after_answer", 60),
            ],
            Mode::BatchOpenai => &[
                ("after_claim", 2),
                ("after_upload", 2),
                ("after_create", 2),
                ("mid_ingest", 40),
            ],
            Mode::BatchAnthropic | Mode::BatchGemini => {
                &[("after_claim", 2), ("after_create", 2), ("mid_ingest", 40)]
            }
        }
    }

    fn mock_flags(self) -> Vec<&'static str> {
        let mut flags = vec!["--log-capacity", "200000", "--seed"];
        flags.push("7");
        if self.batch() {
            flags.extend([
                "--batch-validating-ms",
                "100",
                "--batch-running-ms",
                "300",
                "--batch-finalizing-ms",
                "100",
                "--batch-lose-create",
                "1",
            ]);
        } else {
            flags.extend([
                "--latency-median-ms",
                "20",
                "--latency-p99-ms",
                "80",
                "--fail-500",
                "0.03",
            ]);
        }
        flags
    }
}

/// How one run of a trial is interrupted.
#[derive(Debug, Clone)]
pub enum Cut {
    /// SIGKILL this long after the start.
    KillAfter(Duration),
    /// The process kills itself at the Nth pass of a failpoint.
    Failpoint(&'static str, u64),
    /// Left to finish.
    None,
}

impl Cut {
    /// `random kill`, `failpoint NAME`, `none`.
    pub fn label(&self) -> String {
        match self {
            Cut::KillAfter(_) => "random kill".into(),
            Cut::Failpoint(name, _) => format!("failpoint {name}"),
            Cut::None => "none".into(),
        }
    }
}

/// What a trial did and found.
#[derive(Debug, Default)]
pub struct TrialReport {
    /// The cuts planned and run (`Cut::label`).
    pub cuts: Vec<String>,
    /// Runs that ended by SIGKILL (a cut that came before the end).
    pub kills: usize,
    /// Requests the mock answered (billed).
    pub billed: u64,
    /// Of those, the ones the ledger has no answer for: each is recorded
    /// as an ambiguous attempt (the cost the ledger cannot know).
    pub billed_unrecorded: u64,
    pub ambiguous: i64,
    pub batches_created: u64,
    /// Power-loss trials (row P7): kills followed by a simulated power
    /// loss, the unsynced WAL bytes those lost, and the losses whose run
    /// had checkpointed (where the simulation may keep unsynced frames).
    pub power_losses: usize,
    pub wal_bytes_lost: u64,
    pub checkpointed_losses: usize,
}

/// The plan a seed makes: one to three cuts, then a run left to finish.
pub fn plan(mode: Mode, seed: u64) -> Vec<Cut> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut cuts: Vec<Cut> = (0..rng.random_range(1..=3))
        .map(|_| {
            if rng.random_bool(0.5) {
                let ms = if mode.batch() {
                    rng.random_range(200..4_000)
                } else {
                    rng.random_range(100..2_500)
                };
                Cut::KillAfter(Duration::from_millis(ms))
            } else {
                let points = mode.failpoints();
                let (name, most) = points[rng.random_range(0..points.len())];
                Cut::Failpoint(name, rng.random_range(1..=most))
            }
        })
        .collect();
    cuts.push(Cut::None);
    cuts
}

/// A workspace for the mode, pointed at the mock, with `items` items.
fn workspace(mode: Mode, mock: &Mock, items: usize) -> (Workspace, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    docket::workspace::init(dir.path(), false).expect("init");
    let base = mock.base();
    let (model, url) = match mode.kind() {
        "openai" => ("gpt-4o-mini", format!("{base}/v1")),
        "anthropic" => ("claude-haiku-4-5", base.clone()),
        _ => ("gemini-2.5-flash", base.clone()),
    };
    let batch = if mode.batch() {
        "[stages.batch]\nmode = \"batch\"\nmax_wait_secs = 0.5\npoll_interval_secs = 0.2\n"
    } else {
        ""
    };
    let toml = format!(
        r#"[job]
name = "soak"

[providers.main]
kind = "{kind}"
model = "{model}"
base_url = "{url}"
api_key_env = "{KEY_ENV}"
requests_per_minute = 0
tokens_per_minute = 0
max_concurrency = 8
request_timeout_secs = 30
max_transport_attempts = 5

[[stages]]
name = "adjudicate"
provider = "main"
template = "prompts/adjudicate.j2"
system_prompt = "prompts/system.txt"
max_tokens = 200
max_attempts = 3
{batch}
[stages.gate]
kind = "json_schema"
schema = "schemas/adjudicate.schema.json"

[routing]
auto_accept_threshold = 0.85
review_threshold = 0.60
"#,
        kind = mode.kind()
    );
    std::fs::write(dir.path().join("docket.toml"), toml).unwrap();
    let ws = Workspace { dir };
    super::import_demo_items(&ws, items);
    (ws, tempfile::tempdir().expect("home"))
}

fn canary(seed: u64) -> String {
    format!("sk-soakCANARY{seed:016x}")
}

/// Run one trial; Err says what broke (the caller adds the seed).
pub fn trial(mode: Mode, seed: u64, items: usize) -> Result<TrialReport, String> {
    trial_with(mode, seed, plan(mode, seed), items, false)
}

/// A trial with one planned cut (row P4: a failpoint armed on purpose),
/// then a run left to finish; `seed` only names the canary.
pub fn trial_at(mode: Mode, seed: u64, cut: Cut, items: usize) -> Result<TrialReport, String> {
    trial_with(mode, seed, vec![cut, Cut::None], items, false)
}

/// A trial where every kill is also a power loss (row P7): the writes the
/// killed run never synced are lost before anything reads the ledger
/// (`super::power_loss`).
pub fn power_loss_trial(mode: Mode, seed: u64, items: usize) -> Result<TrialReport, String> {
    trial_with(mode, seed, plan(mode, seed), items, true)
}

fn trial_with(
    mode: Mode,
    seed: u64,
    cuts: Vec<Cut>,
    items: usize,
    power_loss: bool,
) -> Result<TrialReport, String> {
    let mock = Mock::start(&mode.mock_flags());
    let (ws, home) = workspace(mode, &mock, items);
    let key = canary(seed);
    let mut report = TrialReport::default();
    let mut sid: Option<String> = None;
    let last = cuts.len() - 1;
    // Row P3: progress is monotone: no run, however it ended, takes back a
    // result an earlier one recorded.
    let mut results_before = 0;
    for (round, cut) in cuts.into_iter().enumerate() {
        // A kill that came as the run ended may leave nothing to resume.
        if let Some(s) = &sid
            && session_state(&ws, s).as_deref() == Some("completed")
        {
            break;
        }
        report.cuts.push(cut.label());
        let mut cmd = Command::new(bin());
        cmd.arg("--workspace")
            .arg(ws.path())
            .args(["batch-adjudicate", "--yes", "--headless"])
            .env("HOME", home.path())
            .env("XDG_DATA_HOME", home.path().join("data"))
            .env(KEY_ENV, &key)
            .env("NO_COLOR", "1")
            .env_remove(docket::failpoint::ENV)
            .env_remove("DOCKET_WORKSPACE");
        if let Some(s) = &sid {
            cmd.args(["--resume", s]);
        }
        if let Cut::Failpoint(name, n) = &cut {
            cmd.env(docket::failpoint::ENV, format!("{name}:{n}"));
        }
        let sync_log = home.path().join("sync.log");
        if power_loss {
            super::power_loss::arm(&mut cmd, &sync_log, &ws.ledger());
        }
        let mut proc = Proc::start(
            cmd,
            format!("round {round}: docket batch-adjudicate ({cut:?})"),
            home.path().join(format!("round{round}.out")),
        );
        let code = match &cut {
            Cut::KillAfter(after) => {
                let until = Instant::now() + *after;
                loop {
                    if let Some(status) = proc.child.try_wait().expect("try_wait") {
                        break status.code();
                    }
                    if Instant::now() >= until {
                        proc.kill9();
                        break None;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            _ => proc.wait(RUN_TIMEOUT).0,
        };
        let output = proc.output();
        if code.is_none() {
            report.kills += 1;
            if power_loss {
                let loss = super::power_loss::lose_unsynced(&sync_log, &ws.ledger());
                report.power_losses += 1;
                report.wal_bytes_lost += loss.wal_bytes_lost;
                report.checkpointed_losses += usize::from(loss.checkpointed);
            }
        } else {
            let _ = std::fs::remove_file(&sync_log);
        }
        if sid.is_none() {
            sid = latest_session(&ws);
        }
        let Some(s) = sid.clone() else {
            // Killed before the session was created: the next run starts it.
            if code.is_some() {
                return Err(format!(
                    "round {round} ({cut:?}) exited {code:?} with no session:\n{output}"
                ));
            }
            continue;
        };
        check_ledger(&ws, &s).map_err(|e| format!("after round {round} ({cut:?}): {e}"))?;
        let results = results_of(&ws, &s)?;
        if results < results_before {
            return Err(format!(
                "P3: after round {round} ({cut:?}) the session has {results} results, {results_before} before"
            ));
        }
        results_before = results;
        check_oracle(mode, &mock, &ws, &mut report, false)
            .map_err(|e| format!("after round {round} ({cut:?}): {e}"))?;
        if round == last && code != Some(0) {
            return Err(format!(
                "the last run (nothing cut) exited {code:?}, not 0:\n{output}"
            ));
        }
        if matches!(code, Some(c) if c != 0) {
            return Err(format!(
                "round {round} ({cut:?}) exited {code:?}:\n{output}"
            ));
        }
        // A cut that came after the end (a failpoint passed fewer times
        // than armed, a kill after the exit): the session is done.
        if code == Some(0) && session_state(&ws, &s).as_deref() == Some("completed") {
            break;
        }
    }
    let s = sid.ok_or("no session was ever created")?;
    check_complete(&ws, &s, items)?;
    check_oracle(mode, &mock, &ws, &mut report, true).map_err(|e| format!("at the end: {e}"))?;
    check_no_canary(&ws, home.path(), &key)?;
    Ok(report)
}

/// The session's results on record.
fn results_of(ws: &Workspace, sid: &str) -> Result<i64, String> {
    let conn = Connection::open(ws.ledger()).map_err(|e| e.to_string())?;
    count(
        &conn,
        "SELECT COUNT(*) FROM llm_batch_result WHERE session_id = ?1",
        sid,
    )
}

fn latest_session(ws: &Workspace) -> Option<String> {
    let conn = docket::ledger::open_read_only(&ws.ledger()).ok()?;
    conn.query_row(
        "SELECT session_id FROM llm_batch_session ORDER BY started_at DESC LIMIT 1",
        [],
        |r| r.get(0),
    )
    .ok()
}

fn session_state(ws: &Workspace, sid: &str) -> Option<String> {
    let conn = docket::ledger::open_read_only(&ws.ledger()).ok()?;
    conn.query_row(
        "SELECT state FROM llm_batch_session WHERE session_id = ?1",
        [sid],
        |r| r.get(0),
    )
    .ok()
}

fn count(conn: &Connection, sql: &str, sid: &str) -> Result<i64, String> {
    conn.query_row(sql, [sid], |r| r.get(0))
        .map_err(|e| format!("{sql}: {e}"))
}

/// I1, I2, I4 after any run: integrity, foreign keys, at most one result
/// per item, every item of the session on record once, the counters equal
/// to the results.
fn check_ledger(ws: &Workspace, sid: &str) -> Result<(), String> {
    let conn = Connection::open(ws.ledger()).map_err(|e| e.to_string())?;
    let ok: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .map_err(|e| e.to_string())?;
    if ok != "ok" {
        return Err(format!("I4: integrity_check: {ok}"));
    }
    let fk = conn
        .prepare("PRAGMA foreign_key_check")
        .and_then(|mut s| s.query_map([], |_| Ok(())).map(|r| r.count()))
        .map_err(|e| e.to_string())?;
    if fk != 0 {
        return Err(format!("I4: {fk} foreign key violations"));
    }
    let doubled = count(
        &conn,
        "SELECT COUNT(*) FROM (SELECT item_id FROM llm_batch_result WHERE session_id = ?1
           GROUP BY item_id HAVING COUNT(*) > 1)",
        sid,
    )?;
    if doubled != 0 {
        return Err(format!("I2: {doubled} items with two results"));
    }
    let answered_twice = count(
        &conn,
        "SELECT COUNT(*) FROM session_item s WHERE s.session_id = ?1 AND
           (SELECT COUNT(*) FROM llm_messages m WHERE m.request_id = s.request_id
              AND m.state = 'answered') > 1",
        sid,
    )?;
    if answered_twice != 0 {
        return Err(format!(
            "I2: {answered_twice} requests with two answered attempts"
        ));
    }
    let stray = count(
        &conn,
        "SELECT COUNT(*) FROM llm_batch_result r WHERE r.session_id = ?1 AND NOT EXISTS
           (SELECT 1 FROM session_item s WHERE s.session_id = r.session_id AND s.item_id = r.item_id)",
        sid,
    )?;
    if stray != 0 {
        return Err(format!("I1: {stray} results of no item of the session"));
    }
    let (processed, by_outcome): (i64, i64) = conn
        .query_row(
            "SELECT processed_count, accepted_count + reviewed_count + rejected_count + error_count
             FROM llm_batch_session WHERE session_id = ?1",
            [sid],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .map_err(|e| e.to_string())?;
    let results = count(
        &conn,
        "SELECT COUNT(*) FROM llm_batch_result WHERE session_id = ?1",
        sid,
    )?;
    if processed != by_outcome || processed != results {
        return Err(format!(
            "counters: processed {processed}, by outcome {by_outcome}, results {results}"
        ));
    }
    Ok(())
}

/// I3 and the billing side of I6, from the mock's log: every request the
/// mock answered was on record before it left (intent before side effect),
/// a request answered n times has at least n-1 ambiguous attempts, and
/// every answer the ledger does not have is an ambiguous attempt. In batch
/// mode: the ledger knows no batch the mock did not create, and at the end
/// the mock ran no line the ledger has no outcome (or ambiguity) for.
fn check_oracle(
    mode: Mode,
    mock: &Mock,
    ws: &Workspace,
    report: &mut TrialReport,
    at_end: bool,
) -> Result<(), String> {
    let conn = Connection::open(ws.ledger()).map_err(|e| e.to_string())?;
    report.ambiguous = conn
        .query_row(
            "SELECT COUNT(*) FROM llm_messages WHERE state = 'ambiguous'",
            [],
            |r| r.get(0),
        )
        .map_err(|e| e.to_string())?;
    if mode.batch() {
        let created = mock.stat("batches_created");
        let known: i64 = conn
            .query_row(
                "SELECT COUNT(*) FROM provider_batch WHERE provider_batch_id IS NOT NULL",
                [],
                |r| r.get(0),
            )
            .map_err(|e| e.to_string())?;
        report.batches_created = created;
        if at_end && created != known as u64 {
            return Err(format!(
                "the mock created {created} batches, the ledger knows {known}: one was made twice or lost"
            ));
        }
        // A create killed before its record is found again by its tag
        // (adopted), never created twice: every batch the provider has is
        // one the ledger knows, once the run that adopts it has run.
        if created < known as u64 {
            return Err(format!(
                "the ledger knows {known} provider batches, the mock created {created}"
            ));
        }
        // Between runs a batch may have run at the provider with its
        // results not yet collected: the lines are compared at the end.
        if !at_end {
            return Ok(());
        }
        let ran = mock.stat("batch_lines_ok") + mock.stat("batch_lines_failed");
        let lines: i64 = conn
            .query_row(
                "SELECT COUNT(*) FROM llm_messages WHERE state IN ('answered', 'failed', 'ambiguous')",
                [],
                |r| r.get(0),
            )
            .map_err(|e| e.to_string())?;
        report.billed = ran;
        let unrecorded = ran.saturating_sub(lines as u64);
        report.billed_unrecorded = unrecorded;
        if unrecorded > 0 && unrecorded > report.ambiguous as u64 {
            return Err(format!(
                "I3: the mock ran {ran} lines, the ledger has {lines} and {} ambiguous",
                report.ambiguous
            ));
        }
        return check_session_totals(&conn);
    }
    let mut state_of = conn
        .prepare(
            "SELECT state, request_id, input_tokens, output_tokens FROM llm_messages WHERE client_request_id = ?1",
        )
        .map_err(|e| e.to_string())?;
    let mut billed_per_request: HashMap<i64, u64> = HashMap::new();
    let mut billed = 0;
    let mut unrecorded = 0;
    for entry in mock.log() {
        if entry["status"].as_u64() != Some(200) {
            continue;
        }
        let Some(id) = entry["client_request_id"].as_str() else {
            return Err(format!("a billed request without a client id: {entry}"));
        };
        billed += 1;
        type Row = (String, i64, Option<i64>, Option<i64>);
        let (state, request_id, tokens_in, tokens_out): Row = state_of
            .query_row([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .map_err(|_| format!("I3: {id} was billed but is not in the ledger"))?;
        let usage = entry["usage"]
            .as_array()
            .map(|u| (u[0].as_i64(), u[1].as_i64()));
        match state.as_str() {
            // I6 per request: what the ledger counts for an answer is what
            // the provider billed for it, token for token.
            "answered" if usage != Some((tokens_in, tokens_out)) => {
                return Err(format!(
                    "I6: {id} billed {usage:?} tokens, the ledger counts ({tokens_in:?}, {tokens_out:?})"
                ));
            }
            "answered" => {}
            // Billed, its answer lost with the process: on record as such.
            "ambiguous" | "sent" => unrecorded += 1,
            other => {
                return Err(format!("I3: {id} was billed but the ledger says {other}"));
            }
        }
        *billed_per_request.entry(request_id).or_default() += 1;
    }
    let mut ambiguous_of = conn
        .prepare(
            "SELECT COUNT(*) FROM llm_messages WHERE request_id = ?1 AND state IN ('ambiguous', 'sent')",
        )
        .map_err(|e| e.to_string())?;
    for (request_id, n) in &billed_per_request {
        if *n > 1 {
            let amb: i64 = ambiguous_of
                .query_row([request_id], |r| r.get(0))
                .map_err(|e| e.to_string())?;
            if *n > 1 + amb as u64 {
                return Err(format!(
                    "I3: request {request_id} billed {n} times with {amb} ambiguous attempts"
                ));
            }
        }
    }
    report.billed = billed;
    report.billed_unrecorded = unrecorded;
    if at_end {
        check_session_totals(&conn)?;
    }
    Ok(())
}

/// I6 for the session: its tokens and cost are its answers', each counted
/// once (the billed answers it has no record of are the ambiguous
/// attempts, reported apart as possible duplicate charges).
fn check_session_totals(conn: &Connection) -> Result<(), String> {
    let (s_in, s_out, s_cost, m_in, m_out, m_cost): (i64, i64, f64, i64, i64, f64) = conn
        .query_row(
            "SELECT SUM(s.input_tokens), SUM(s.output_tokens), SUM(s.cost_usd),
                    (SELECT COALESCE(SUM(input_tokens), 0) FROM llm_messages WHERE state = 'answered'),
                    (SELECT COALESCE(SUM(output_tokens), 0) FROM llm_messages WHERE state = 'answered'),
                    (SELECT COALESCE(SUM(cost_usd), 0) FROM llm_messages WHERE state = 'answered')
             FROM llm_batch_session s",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?)),
        )
        .map_err(|e| e.to_string())?;
    if (s_in, s_out) != (m_in, m_out) || (s_cost - m_cost).abs() > 1e-9 {
        return Err(format!(
            "I6: the session counts {s_in}/{s_out} tokens and ${s_cost}, its answers {m_in}/{m_out} and ${m_cost}"
        ));
    }
    Ok(())
}

/// I1 and I6 at the end: every item has its one result.
fn check_complete(ws: &Workspace, sid: &str, items: usize) -> Result<(), String> {
    let conn = Connection::open(ws.ledger()).map_err(|e| e.to_string())?;
    let (state, total): (String, i64) = conn
        .query_row(
            "SELECT state, total_count FROM llm_batch_session WHERE session_id = ?1",
            [sid],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .map_err(|e| e.to_string())?;
    let without = count(
        &conn,
        "SELECT COUNT(*) FROM session_item s WHERE s.session_id = ?1 AND
           (SELECT COUNT(*) FROM llm_batch_result r
             WHERE r.session_id = s.session_id AND r.item_id = s.item_id) != 1",
        sid,
    )?;
    if state != "completed" || total != items as i64 || without != 0 {
        return Err(format!(
            "I6: session {state}, {total} of {items} items, {without} without exactly one result"
        ));
    }
    Ok(())
}

/// I5: the key is in no byte of the ledger (its -wal and -shm included),
/// the logs or anything else under HOME.
fn check_no_canary(ws: &Workspace, home: &std::path::Path, key: &str) -> Result<(), String> {
    let mut files = vec![ws.ledger()];
    files.push(ws.ledger().with_extension("sqlite-wal"));
    files.push(ws.ledger().with_extension("sqlite-shm"));
    let mut stack = vec![home.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                files.push(p);
            }
        }
    }
    for f in files {
        let Ok(bytes) = std::fs::read(&f) else {
            continue;
        };
        // The round outputs hold docket's own words only; the env var holds
        // the key, never a file.
        if bytes.windows(key.len()).any(|w| w == key.as_bytes()) {
            return Err(format!("I5: the key is in {}", f.display()));
        }
    }
    Ok(())
}
