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
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rusqlite::Connection;

use super::Workspace;
use super::procs::{Mock, Proc, bin};

mod checks;
use checks::*;

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
        let mut cmd = round_command(&ws, home.path(), &key, sid.as_deref(), &cut);
        let sync_log = home.path().join("sync.log");
        if power_loss {
            super::power_loss::arm(&mut cmd, &sync_log, &ws.ledger());
        }
        let mut proc = Proc::start(
            cmd,
            format!("round {round}: docket batch-adjudicate ({cut:?})"),
            home.path().join(format!("round{round}.out")),
        );
        let code = wait_or_kill(&mut proc, &cut);
        let output = proc.output();
        count_the_cut(code, power_loss, &sync_log, &ws, &mut report);
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
        check_exit(round, round == last, &cut, code, &output)?;
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

/// One round's `docket batch-adjudicate`: the trial's workspace and home,
/// its key, the session to resume, the failpoint the cut arms.
fn round_command(ws: &Workspace, home: &Path, key: &str, sid: Option<&str>, cut: &Cut) -> Command {
    let mut cmd = Command::new(bin());
    cmd.arg("--workspace")
        .arg(ws.path())
        .args(["batch-adjudicate", "--yes", "--headless"])
        .env("HOME", home)
        .env("XDG_DATA_HOME", home.join("data"))
        .env("XDG_STATE_HOME", home.join("state"))
        .env(KEY_ENV, key)
        .env("NO_COLOR", "1")
        .env_remove(docket::failpoint::ENV)
        .env_remove("DOCKET_WORKSPACE");
    if let Some(s) = sid {
        cmd.args(["--resume", s]);
    }
    if let Cut::Failpoint(name, n) = cut {
        cmd.env(docket::failpoint::ENV, format!("{name}:{n}"));
    }
    cmd
}

/// The round's exit code; None when it was killed (by the cut's SIGKILL
/// after its delay, or by a failpoint).
fn wait_or_kill(proc: &mut Proc, cut: &Cut) -> Option<i32> {
    match cut {
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
    }
}

/// A killed round is counted; with power loss on, the writes it had not
/// synced are lost as a power cut would lose them.
fn count_the_cut(
    code: Option<i32>,
    power_loss: bool,
    sync_log: &Path,
    ws: &Workspace,
    report: &mut TrialReport,
) {
    if code.is_none() {
        report.kills += 1;
        if power_loss {
            let loss = super::power_loss::lose_unsynced(sync_log, &ws.ledger());
            report.power_losses += 1;
            report.wal_bytes_lost += loss.wal_bytes_lost;
            report.checkpointed_losses += usize::from(loss.checkpointed);
        }
    } else {
        let _ = std::fs::remove_file(sync_log);
    }
}

/// A round that ended by itself exits 0; the last one (nothing cut) must.
fn check_exit(
    round: usize,
    last: bool,
    cut: &Cut,
    code: Option<i32>,
    output: &str,
) -> Result<(), String> {
    if last && code != Some(0) {
        return Err(format!(
            "the last run (nothing cut) exited {code:?}, not 0:\n{output}"
        ));
    }
    if matches!(code, Some(c) if c != 0) {
        return Err(format!(
            "round {round} ({cut:?}) exited {code:?}:\n{output}"
        ));
    }
    Ok(())
}
