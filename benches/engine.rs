//! Benchmarks of issue 2, printed as figures (run: `cargo bench --bench engine`;
//! one scenario: `cargo bench --bench engine -- limit`).
//!
//! Every figure is measured in this run on this machine; targets are checked
//! as ratios against the limit the mock enforces, not against wall clocks of
//! other runs.

use docket_testkit as support;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use docket::mock::{MockConfig, MockServer};
use support::*;

const BIN: &str = env!("CARGO_BIN_EXE_docket");

struct Figures {
    wall_s: f64,
    accepted_rate: f64,
    rate_limited: u64,
    requests: u64,
    errors: u64,
    hangs: u64,
    ambiguous: u64,
}

async fn scenario(
    cfg: MockConfig,
    client_rpm: u64,
    n: usize,
    timeout_secs: f64,
    concurrency: u64,
) -> Figures {
    let m = MockServer::start(cfg, SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("mock");
    let mut job = Job::new(&m.base_url());
    job.rpm = client_rpm;
    job.concurrency = concurrency;
    job.timeout_secs = timeout_secs;
    let ws = workspace(&job);
    import_demo_items(&ws, n);
    let started = Instant::now();
    let (report, _lines) = run(options(&ws)).await;
    let wall_s = started.elapsed().as_secs_f64();
    let s = report.session.expect("session");
    let stats = m.stats();
    let oks: Vec<u64> = m
        .log()
        .iter()
        .filter(|e| e.status == 200)
        .map(|e| e.at_ms)
        .collect();
    let span = (oks.iter().max().unwrap_or(&0) - oks.iter().min().unwrap_or(&0)) as f64 / 1000.0;
    let accepted_rate = if span > 0.0 {
        (oks.len() as f64 - 1.0) / span
    } else {
        0.0
    };
    check_complete(&ws.conn(), &s.session_id);
    m.shutdown().await;
    Figures {
        wall_s,
        accepted_rate,
        rate_limited: stats.rate_limited,
        requests: stats.requests,
        errors: s.error_count,
        hangs: stats.hangs,
        ambiguous: s.ambiguous_count,
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok { "PASS" } else { "FAIL" }
}

fn latency_limited() -> MockConfig {
    MockConfig {
        latency_median_ms: 300.0,
        latency_p99_ms: 1200.0,
        rpm_limit: 6000,
        ..Default::default()
    }
}

async fn limits() {
    let limit_rps = 6000.0 / 60.0;
    let a = scenario(latency_limited(), 6000, 3000, 10.0, 256).await;
    println!(
        "A  client 6000/min vs server 6000/min, 3000 req, 300 ms median: accepted {:.1} req/s = {:.1}% of the limit; \
         429s {}; failed items {}; wall {:.1} s  [{}: >= 98%, 0 429s, 0 failed]",
        a.accepted_rate,
        a.accepted_rate * 100.0 / limit_rps,
        a.rate_limited,
        a.errors,
        a.wall_s,
        verdict(a.accepted_rate >= 0.98 * limit_rps && a.rate_limited == 0 && a.errors == 0)
    );
    let b = scenario(latency_limited(), 12_000, 3000, 10.0, 256).await;
    let share = b.rate_limited as f64 * 100.0 / b.requests as f64;
    println!(
        "B  client 12000/min vs server 6000/min: accepted {:.1} req/s = {:.1}% of the server's limit; 429s {} = {:.2}% of {} requests; \
         failed items {}; wall {:.1} s  [{}: >= 90%, < 2%, 0 failed]",
        b.accepted_rate,
        b.accepted_rate * 100.0 / limit_rps,
        b.rate_limited,
        share,
        b.requests,
        b.errors,
        b.wall_s,
        verdict(b.accepted_rate >= 0.90 * limit_rps && share < 2.0 && b.errors == 0)
    );
    let c = scenario(
        MockConfig {
            fail_500: 0.05,
            hang: 0.005,
            ..latency_limited()
        },
        6000,
        3000,
        5.0,
        256,
    )
    .await;
    println!(
        "C  as A with 5% 500s and 0.5% hangs (timeout 5 s): failed items {}; hangs {} (ambiguous {}); wall {:.1} s = {:.2}x A's wall \
         [{}: 0 failed, hangs cut by the timeout]",
        c.errors,
        c.hangs,
        c.ambiguous,
        c.wall_s,
        c.wall_s / a.wall_s,
        verdict(c.errors == 0 && c.wall_s / a.wall_s < 1.3)
    );
}

/// Issue 12's hang figure: 3,000 requests at 6,000/min with 300 ms median
/// latency, once clean and once with 0.5% of requests never answered, both
/// at the default 120 s `request_timeout_secs`. The learned deadline must
/// keep the hanging run within 1.1× the clean one, with every extra send
/// on record as ambiguous.
async fn hangs() {
    let clean = scenario(latency_limited(), 6000, 3000, 120.0, 256).await;
    let hung = scenario(
        MockConfig {
            hang: 0.005,
            ..latency_limited()
        },
        6000,
        3000,
        120.0,
        256,
    )
    .await;
    let ratio = hung.wall_s / clean.wall_s;
    let extra = hung.requests.saturating_sub(clean.requests);
    println!(
        "H  0.5% of 3000 requests hang, timeout 120 s: wall {:.1} s vs {:.1} s clean = {ratio:.2}x; failed items {}; hangs {}; extra sends {extra}, on record as ambiguous {}  [{}: <= 1.1x, 0 failed, every hang on record]",
        hung.wall_s,
        clean.wall_s,
        hung.errors,
        hung.hangs,
        hung.ambiguous,
        verdict(ratio <= 1.1 && hung.errors == 0 && hung.ambiguous >= hung.hangs && hung.hangs > 0)
    );
}

/// The real binary against the mock provider in its own process, as against
/// a real provider: returns (session row, wall seconds, peak RSS in MB).
fn process_run(n: usize, concurrency: u64) -> (docket::ledger::store::SessionRow, f64, f64) {
    let (row, wall, mb, _cpu) = process_run_with(n, concurrency, &[]);
    (row, wall, mb)
}

/// `process_run` with mock flags; also the run's CPU-seconds.
fn process_run_with(
    n: usize,
    concurrency: u64,
    mock_flags: &[&str],
) -> (docket::ledger::store::SessionRow, f64, f64, f64) {
    let home = tempfile::tempdir().expect("tmp");
    let port = free_port();
    let mut mock = Command::new(BIN)
        .env("HOME", home.path())
        .args([
            "mock-provider",
            "--port",
            &port.to_string(),
            "--log-capacity",
            "1000",
        ])
        .args(mock_flags)
        .stdout(Stdio::null())
        .spawn()
        .expect("mock-provider");
    let mut job = Job::new(&format!("http://127.0.0.1:{port}/v1"));
    job.concurrency = concurrency;
    let ws = workspace(&job);
    import_demo_items(&ws, n);
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    let out = Command::new(BIN)
        .env("HOME", home.path())
        .env("DOCKET_REPORT_PEAK_RSS", "1")
        .arg("--workspace")
        .arg(ws.path())
        .args(["run", "--yes", "--headless"])
        .output()
        .expect("docket run");
    let wall = t.elapsed().as_secs_f64();
    let _ = mock.kill();
    let _ = mock.wait();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let kb: f64 = stderr
        .lines()
        .find_map(|l| l.strip_prefix("peak_rss_kb="))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(f64::NAN);
    let sid = docket::ledger::store::latest_session(&support::db(&ws.conn()))
        .unwrap()
        .unwrap();
    let row = docket::ledger::store::load_session(&support::db(&ws.conn()), &sid)
        .unwrap()
        .unwrap();
    check_complete(&ws.conn(), &sid);
    let cpu: f64 = stderr
        .lines()
        .find_map(|l| l.strip_prefix("cpu_secs="))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(f64::NAN);
    (row, wall, kb / 1024.0, cpu)
}

fn raw_speed() {
    let n = 30_000;
    let (s, wall, _) = process_run(n, 64);
    let dispatch = s.completed_at.unwrap_or(f64::NAN) - s.started_at;
    let rate = s.processed_count as f64 / dispatch;
    println!(
        "D  no latency, no limit, {n} items, `docket run` and `docket mock-provider` as two processes: \
         {rate:.0} requests/s from session start to completion (every attempt and result committed to the ledger); \
         {:.0}/s for the whole command, planning (rendering + tokenizing every prompt) included  [{}: >= 8000/s]",
        s.processed_count as f64 / wall,
        verdict(rate >= 8000.0)
    );
}

fn import_and_memory() {
    let dir = tempfile::tempdir().expect("tmp");
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    // 1,000,000 items for the import figure.
    let big = dir.path().join("big.jsonl");
    {
        use std::io::Write;
        let mut f = std::io::BufWriter::new(std::fs::File::create(&big).unwrap());
        for i in 0..1_000_000u32 {
            writeln!(f, "{{\"id\":\"item-{i:07}\",\"artist\":\"Artist {}\",\"title\":\"Title {}\",\"chart\":\"UK Singles\",\"position\":{}}}", i % 977, i % 10_007, i % 100 + 1).unwrap();
        }
    }
    let ws1 = dir.path().join("ws1");
    docket::workspace::init(&ws1, false).unwrap();
    let t = Instant::now();
    let out = Command::new(BIN)
        .env("HOME", &home)
        .arg("--workspace")
        .arg(&ws1)
        .arg("import")
        .arg(&big)
        .output()
        .unwrap();
    let import_s = t.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!(
        "E1 docket import of 1,000,000 JSONL items: {import_s:.2} s  [{}: <= 5 s]",
        verdict(import_s <= 5.0)
    );

    let (s, wall, mb) = process_run(100_000, 64);
    println!(
        "E2 peak memory (VmHWM) of `docket run` over a 100,000-item session: {mb:.1} MB; {} items in {wall:.1} s  [{}: < 150 MB]",
        s.processed_count,
        verdict(mb < 150.0 && s.processed_count == 100_000)
    );
}

/// Client CPU per request: `docket run` (its CPU-seconds from /proc at exit,
/// planning and set-up included) over 20,000 requests against the mock as
/// its own process, 50 ms latency, concurrency 100.
fn cpu_per_request() {
    let n = 20_000;
    let (s, wall, _mb, cpu) = process_run_with(
        n,
        100,
        &["--latency-median-ms", "50", "--latency-p99-ms", "60"],
    );
    let ms = cpu / s.processed_count as f64 * 1000.0;
    println!(
        "C  client CPU per request, {n} requests, 50 ms latency, concurrency 100: {cpu:.2} CPU-s in {wall:.1} s = {ms:.3} ms/request  [{}: <= 0.25 ms]",
        verdict(ms <= 0.25)
    );
}

/// The figure: a 1,000,000-item session in sync mode against the
/// no-latency mock as its own process (several minutes; opt-in).
fn million() {
    let (s, wall, mb) = process_run(1_000_000, 64);
    println!(
        "E3 peak memory (VmHWM) of `docket run` over a 1,000,000-item session (sync, no latency, mock as its own process): \
         {mb:.1} MB; {} items in {wall:.1} s  [{}: <= 150 MB]",
        s.processed_count,
        verdict(mb <= 150.0 && s.processed_count == 1_000_000)
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn main() {
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let want = |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!("docket benchmarks (release build, 2-core machine)");
    if want("limits") {
        rt.block_on(limits());
    }
    if want("hangs") {
        rt.block_on(hangs());
    }
    if want("speed") {
        raw_speed();
    }
    if want("cpu") {
        cpu_per_request();
    }
    if want("import-memory") {
        import_and_memory();
    }
    // Opt-in only (about ten minutes): `cargo bench --bench engine -- million`.
    if filter.iter().any(|f| f == "million") {
        million();
    }
}
