//! Several workers on one session, printed as figures (run:
//! `cargo bench --bench workers`; one scenario: `-- scale`, `-- limit`,
//! `-- pg-scale`, `-- pg-throughput`, `-- pg-export` or `-- c1`).
//!
//! The real binary against `docket mock-provider` as its own process; the
//! `pg-` scenarios on a PostgreSQL ledger the bench starts itself. Every
//! figure is a ratio inside this run: one worker against several on the
//! same machine, or the rate held against the limit the mock itself
//! enforces, or PostgreSQL's throughput beside SQLite's.

use docket_testkit as support;

use std::process::Command;
use std::time::{Duration, Instant};

use docket::ledger::work::RunSessions;
use support::procs::{Mock, Proc, bin};
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
    spawn_on(ws, None, name, args)
}

/// `docket ARGS` in `ws`, on the PostgreSQL ledger at `pg` when given.
fn spawn_on(ws: &Workspace, pg: Option<&str>, name: &str, args: &[&str]) -> Proc {
    let mut command = Command::new(bin());
    command
        .arg("--workspace")
        .arg(ws.path())
        .args(args)
        .env("NO_COLOR", "1")
        .env_remove("DOCKET_WORKSPACE")
        .env_remove("DOCKET_LEDGER_URL");
    if let Some(url) = pg {
        command.env("DOCKET_LEDGER_URL", url);
    }
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
    run_on(ws, None, workers)
}

/// The same on the PostgreSQL ledger at `pg` when given.
fn run_on(ws: &Workspace, pg: Option<&str>, workers: usize) -> (String, f64) {
    let mut procs = vec![spawn_on(
        ws,
        pg,
        "w0",
        &["batch-adjudicate", "--yes", "--headless"],
    )];
    let deadline = Instant::now() + Duration::from_secs(60);
    let sid = loop {
        let newest: Option<String> = match pg {
            None => docket::ledger::store::latest_session(&support::db(&ws.conn()))
                .ok()
                .flatten(),
            Some(url) => docket::ledger::Ledger::open_read_only(
                docket::ledger::LedgerLocation::parse(url).unwrap(),
            )
            .ok()
            .and_then(|l| l.latest_session().ok().flatten()),
        };
        if let Some(s) = newest {
            break s;
        }
        assert!(Instant::now() < deadline, "no session");
        std::thread::sleep(Duration::from_millis(20));
    };
    for k in 1..workers {
        procs.push(spawn_on(
            ws,
            pg,
            &format!("w{k}"),
            &["worker", "--session", &sid],
        ));
    }
    for mut p in procs {
        let (code, out) = p.wait(Duration::from_secs(900));
        assert_eq!(code, Some(0), "{out}");
    }
    let conn = match pg {
        None => ws.conn(),
        Some(url) => snapshot(ws, url),
    };
    check_complete(&conn, &sid);
    let row = docket::ledger::store::load_session(&support::db(&conn), &sid)
        .unwrap()
        .unwrap();
    (sid, row.completed_at.unwrap_or(f64::NAN) - row.started_at)
}

/// A workspace whose items were imported, then copied to a fresh database
/// of `pg`; the SQLite file moved away. Its URL.
fn on_postgres(ws: &Workspace, pg: &support::pg::PgServer) -> String {
    let url = pg.fresh_database();
    let mut copy = spawn(ws, "copy", &["ledger", "copy", "--to", &url]);
    let (code, out) = copy.wait(Duration::from_secs(600));
    assert_eq!(code, Some(0), "{out}");
    std::fs::rename(ws.ledger(), ws.ledger().with_extension("imported")).unwrap();
    url
}

/// A consistent copy of the PostgreSQL ledger, to check as SQLite.
fn snapshot(ws: &Workspace, url: &str) -> rusqlite::Connection {
    let dir = ws.path().join(format!("snapshot-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    support::pg::snapshot(url, &dir)
}

/// Throughput of 1, 2 and 4 workers on one PostgreSQL ledger, latency-bound
/// (300 ms, concurrency 16 per worker, no server limit).
fn pg_scale() {
    // Long enough that a joining worker's start and the last items' tail
    // (a second or two) do not decide the ratio.
    const ITEMS: usize = 6_000;
    let pg = support::pg::PgServer::start();
    let mock = Mock::start(&["--latency-median-ms", "300", "--latency-p99-ms", "330"]);
    let mut secs = Vec::new();
    for workers in [1usize, 2, 4] {
        let ws = workspace(&mock, ITEMS, |j| j.concurrency = 16 * workers as u64);
        let url = on_postgres(&ws, &pg);
        let (sid, t) = run_on(&ws, Some(&url), workers);
        let sent = count(
            &snapshot(&ws, &url),
            "SELECT COUNT(*) FROM session_worker WHERE session_id = ?1 AND sent > 0",
            [&sid],
        );
        println!(
            "P{workers} PostgreSQL ledger, latency-bound (300 ms), {ITEMS} items, concurrency 16 per worker: \
             {workers} worker(s) ({sent} sent) {:.1} req/s ({t:.1} s)",
            ITEMS as f64 / t
        );
        secs.push(t);
    }
    let (two, four) = (secs[0] / secs[1], secs[0] / secs[2]);
    println!(
        "P  scaling on PostgreSQL: 2 workers {two:.2}x, 4 workers {four:.2}x one worker  [{}: >= 1.9x and >= 3.5x]",
        verdict(two >= 1.9 && four >= 3.5)
    );
}

/// Ledger throughput on PostgreSQL: 4 workers against a no-latency mock,
/// each item a claim, an intent, an attempt and a result committed; beside
/// one process on SQLite on the same job.
fn pg_throughput() {
    const ITEMS: usize = 20_000;
    let pg = support::pg::PgServer::start();
    let mock = Mock::start(&["--latency-median-ms", "0", "--latency-p99-ms", "0"]);
    let lite = workspace(&mock, ITEMS, |j| j.concurrency = 64);
    let (_, t_lite) = run(&lite, 1);
    let ws = workspace(&mock, ITEMS, |j| j.concurrency = 64 * 4);
    let url = on_postgres(&ws, &pg);
    let (_, t_pg) = run_on(&ws, Some(&url), 4);
    println!(
        "T  no latency, {ITEMS} items, every claim, intent, attempt and result committed: \
         PostgreSQL with 4 workers {:.0} items/s ({t_pg:.1} s); SQLite with one process {:.0} items/s ({t_lite:.1} s)",
        ITEMS as f64 / t_pg,
        ITEMS as f64 / t_lite
    );
}

/// `docket export`'s peak memory on a PostgreSQL ledger beside SQLite's,
/// for the same finished session: the large answers come from a
/// server-side cursor a page at a time, so the PostgreSQL export holds
/// about what the SQLite one does, not every row.
fn pg_export() {
    const ITEMS: usize = 50_000;
    let pg = support::pg::PgServer::start();
    let mock = Mock::start(&["--latency-median-ms", "0", "--latency-p99-ms", "0"]);
    let ws = workspace(&mock, ITEMS, |j| j.concurrency = 64);
    let (sid, _) = run(&ws, 1);
    let export = |pg: Option<&str>, what: &str| -> (f64, u64) {
        let out = ws
            .path()
            .join(format!("export-{what}-{}.jsonl", pg.is_some()));
        let mut command = Command::new(bin());
        command
            .arg("--workspace")
            .arg(ws.path())
            .args([
                "export",
                "--what",
                what,
                "--format",
                "jsonl",
                "--session",
                &sid,
                "--output",
            ])
            .arg(&out)
            .env("DOCKET_REPORT_PEAK_RSS", "1")
            .env_remove("DOCKET_LEDGER_URL");
        if let Some(url) = pg {
            command.env("DOCKET_LEDGER_URL", url);
        }
        let done = command.output().expect("docket export");
        let stderr = String::from_utf8_lossy(&done.stderr);
        assert!(done.status.success(), "{stderr}");
        let kb: f64 = stderr
            .lines()
            .find_map(|l| l.strip_prefix("peak_rss_kb="))
            .and_then(|v| v.trim().parse().ok())
            .expect("peak_rss_kb");
        let lines = std::fs::read_to_string(&out).unwrap().lines().count() as u64;
        (kb / 1024.0, lines)
    };
    let lite: Vec<_> = ["items", "requests"]
        .iter()
        .map(|w| export(None, w))
        .collect();
    let url = on_postgres(&ws, &pg);
    for (what, (lite_mb, lite_rows)) in ["items", "requests"].iter().zip(lite) {
        let (pg_mb, pg_rows) = export(Some(&url), what);
        println!(
            "X  docket export --what {what}, {ITEMS} items: PostgreSQL {pg_rows} rows at a peak of {pg_mb:.1} MB; \
             SQLite {lite_rows} rows at {lite_mb:.1} MB  [{}: same rows, <= 1.5x SQLite's memory]",
            verdict(pg_rows == lite_rows && pg_mb <= 1.5 * lite_mb)
        );
    }
}

/// Row C1, the claim race at size: 1, 2 and 4 workers on one session, on
/// SQLite and on PostgreSQL, against a mock with no latency (the ledger
/// and the CPU set the pace: 10,000 items) and one at 50 ms (concurrency
/// sets it: 16 per worker, 4,000 items). The rate is the mock's own: the
/// session's answers over the span from its first to its last. Each run is
/// also checked against the mock's log: every attempt went out once, one
/// answer per item, and the workers that sent.
/// `pg_zero_only` (`-- c1-pg0`): only PostgreSQL at zero latency, the case
/// bound by the ledger rather than the provider.
fn c1(pg_zero_only: bool) {
    let pg = support::pg::PgServer::start();
    let latencies: &[(u64, usize, u64)] = if pg_zero_only {
        &[(0, 10_000, 64)]
    } else {
        &[(0, 10_000, 64), (50, 4_000, 16)]
    };
    let backends: &[bool] = if pg_zero_only {
        &[true]
    } else {
        &[false, true]
    };
    for &(latency_ms, items, per_worker) in latencies {
        for &on_pg in backends {
            let backend = if on_pg { "PostgreSQL" } else { "SQLite" };
            let mut rates = Vec::new();
            for workers in [1usize, 2, 4] {
                let latency = latency_ms.to_string();
                let mock = Mock::start(&[
                    "--latency-median-ms",
                    &latency,
                    "--latency-p99-ms",
                    &latency,
                ]);
                let ws = workspace(&mock, items, |j| {
                    j.concurrency = per_worker * workers as u64
                });
                let url = on_pg.then(|| on_postgres(&ws, &pg));
                let cpu_before = machine_cpu();
                let (sid, secs) = run_on(&ws, url.as_deref(), workers);
                let busy = busy_share(cpu_before, machine_cpu());
                let conn = match &url {
                    None => ws.conn(),
                    Some(url) => snapshot(&ws, url),
                };
                let log = mock.log();
                let prefix = format!("{sid}-");
                let ours: Vec<&serde_json::Value> = log
                    .iter()
                    .filter(|e| {
                        e["client_request_id"]
                            .as_str()
                            .is_some_and(|id| id.starts_with(&prefix))
                    })
                    .collect();
                let distinct: std::collections::HashSet<&str> = ours
                    .iter()
                    .filter_map(|e| e["client_request_id"].as_str())
                    .collect();
                let mut oks: Vec<u64> = ours
                    .iter()
                    .filter(|e| e["status"].as_u64() == Some(200))
                    .filter_map(|e| e["at_ms"].as_u64())
                    .collect();
                oks.sort_unstable();
                let span = (oks.last().unwrap_or(&0) - oks.first().unwrap_or(&0)) as f64 / 1000.0;
                let rate = (oks.len() as f64 - 1.0) / span;
                let senders = count(
                    &conn,
                    "SELECT COUNT(*) FROM session_worker WHERE session_id = ?1 AND sent > 0",
                    [&sid],
                );
                let ok =
                    distinct.len() == ours.len() && oks.len() == items && senders == workers as i64;
                println!(
                    "C1 {backend}, mock latency {latency_ms} ms, {items} items, concurrency {per_worker} per worker: \
                     {workers} worker(s) ({senders} sent) {rate:.0} req/s ({span:.1} s at the mock, {secs:.1} s session), \
                     machine CPU {:.0}% busy  [{}: each attempt sent once, one answer per item]",
                    busy * 100.0,
                    verdict(ok)
                );
                rates.push(rate);
            }
            println!(
                "C1 {backend}, mock latency {latency_ms} ms: 2 workers {:.2}x, 4 workers {:.2}x one worker",
                rates[1] / rates[0],
                rates[2] / rates[0]
            );
        }
    }
}

/// The machine's CPU time so far, from /proc/stat: (busy, total) in ticks.
/// Whether a figure is bound by this machine's two cores or by docket's
/// design shows in how busy they were while it was measured.
fn machine_cpu() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    let total: u64 = ticks.iter().take(8).sum();
    // idle and iowait are the 4th and 5th columns.
    let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

fn busy_share(before: (u64, u64), after: (u64, u64)) -> f64 {
    let total = after.1.saturating_sub(before.1).max(1);
    after.0.saturating_sub(before.0) as f64 / total as f64
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
    if want("pg-scale") {
        pg_scale();
    }
    if want("pg-export") {
        pg_export();
    }
    if want("pg-throughput") {
        pg_throughput();
    }
    let pg_zero_only = filter.iter().any(|f| f == "c1-pg0");
    if want("c1") || pg_zero_only {
        c1(pg_zero_only);
    }
}
