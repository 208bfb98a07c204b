//! Several workers on one session, printed as figures (run:
//! `cargo bench --bench workers`; one scenario: `-- scale` or `-- limit`).
//!
//! The real binary against `docket mock-provider` as its own process. Every
//! figure is a ratio inside this run: one worker against two on the same
//! machine, or the rate held against the limit the mock itself enforces.

#[path = "../tests/support/mod.rs"]
mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use support::procs::{BIN, Mock, Proc};
use support::{Job, Workspace, check_complete, count};

fn verdict(ok: bool) -> &'static str {
    if ok { "PASS" } else { "FAIL" }
}

/// A workspace on the mock with `items` demo items.
fn workspace(mock: &Mock, items: usize, tweak: impl FnOnce(&mut Job)) -> Workspace {
    let mut job = Job::new(&format!("{}/v1", mock.base()));
    tweak(&mut job);
    let ws = support::workspace(&job);
    support::import_demo_items(&ws, items);
    ws
}

fn spawn(ws: &Workspace, name: &str, args: &[&str]) -> Proc {
    let mut command = Command::new(BIN);
    command
        .arg("--workspace")
        .arg(ws.path())
        .args(args)
        .env("NO_COLOR", "1")
        .env_remove("DOCKET_WORKSPACE");
    Proc::start(
        command,
        format!("docket {}", args.join(" ")),
        ws.path().join(format!("{name}.out")),
    )
}

/// Run the session with `workers` processes: the first creates it, the
/// others join with `docket worker` as soon as it exists. Returns the
/// session's id and its seconds from start to completion.
fn run(ws: &Workspace, workers: usize) -> (String, f64) {
    let mut procs = vec![spawn(
        ws,
        "w0",
        &["batch-adjudicate", "--yes", "--headless"],
    )];
    let deadline = Instant::now() + Duration::from_secs(30);
    let sid = loop {
        if let Some(s) = docket::ledger::store::latest_session(&support::db(&ws.conn()))
            .ok()
            .flatten()
        {
            break s;
        }
        assert!(Instant::now() < deadline, "no session");
        std::thread::sleep(Duration::from_millis(20));
    };
    for k in 1..workers {
        procs.push(spawn(ws, &format!("w{k}"), &["worker", "--session", &sid]));
    }
    for mut p in procs {
        let (code, out) = p.wait(Duration::from_secs(600));
        assert_eq!(code, Some(0), "{out}");
    }
    let conn = ws.conn();
    check_complete(&conn, &sid);
    let row = docket::ledger::store::load_session(&support::db(&conn), &sid)
        .unwrap()
        .unwrap();
    (sid, row.completed_at.unwrap_or(f64::NAN) - row.started_at)
}

/// Throughput of two workers against one on a latency-bound provider: each
/// worker runs at concurrency 16 (the session's limit is 16 for one worker
/// and 32 for two, split equally between them).
fn scale() {
    const ITEMS: usize = 2_000;
    let mock = Mock::start(&["--latency-median-ms", "300", "--latency-p99-ms", "330"]);
    let one = workspace(&mock, ITEMS, |j| j.concurrency = 16);
    let (_, t1) = run(&one, 1);
    let two = workspace(&mock, ITEMS, |j| j.concurrency = 32);
    let (sid, t2) = run(&two, 2);
    let workers = count(
        &two.conn(),
        "SELECT COUNT(*) FROM session_worker WHERE session_id = ?1 AND sent > 0",
        [&sid],
    );
    let ratio = t1 / t2;
    println!(
        "W1 latency-bound (300 ms), {ITEMS} items, concurrency 16 per worker: one worker {:.1} req/s ({t1:.1} s), \
         two workers {:.1} req/s ({t2:.1} s; {workers} sent): {ratio:.2}x  [{}: >= 1.8x]",
        ITEMS as f64 / t1,
        ITEMS as f64 / t2,
        verdict(ratio >= 1.8 && workers == 2)
    );
}

/// Two workers under a server limit equal to the configured one: the rate
/// they hold together against the limit, and the 429s it costs.
fn limit() {
    const ITEMS: usize = 1_500;
    const RPM: u64 = 3_000;
    let mock = Mock::start(&[
        "--latency-median-ms",
        "300",
        "--latency-p99-ms",
        "330",
        "--rpm-limit",
        &RPM.to_string(),
    ]);
    let ws = workspace(&mock, ITEMS, |j| {
        j.concurrency = 64;
        j.rpm = RPM;
    });
    let (sid, _) = run(&ws, 2);
    let log = mock.log();
    let oks: Vec<u64> = log
        .iter()
        .filter(|e| e["status"].as_u64() == Some(200))
        .filter_map(|e| e["at_ms"].as_u64())
        .collect();
    let refused = log
        .iter()
        .filter(|e| e["status"].as_u64() == Some(429))
        .count();
    let span = (oks.iter().max().unwrap_or(&0) - oks.iter().min().unwrap_or(&0)) as f64 / 1000.0;
    let per_min = (oks.len() as f64 - 1.0) / span * 60.0;
    let held = per_min / RPM as f64;
    let share_429 = refused as f64 / log.len().max(1) as f64;
    let workers = count(
        &ws.conn(),
        "SELECT COUNT(*) FROM session_worker WHERE session_id = ?1 AND sent > 0",
        [&sid],
    );
    println!(
        "W2 two workers ({workers} sent), server limit = configured limit = {RPM}/min, {ITEMS} items: \
         together {per_min:.0}/min = {:.1}% of the limit, 429s {refused} of {} requests ({:.2}%)  [{}: >= 95%, 429s <= 1%]",
        held * 100.0,
        log.len(),
        share_429 * 100.0,
        verdict(held >= 0.95 && share_429 <= 0.01 && workers == 2)
    );
}

fn main() {
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let want = |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()));
    println!("docket worker benchmarks (release build, 2-core machine)");
    if want("scale") {
        scale();
    }
    if want("limit") {
        limit();
    }
}
