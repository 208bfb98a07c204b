//! The Batch API figures of issue 4 (run: `cargo bench --bench batch`):
//! a 100,000-request batch built, streamed up and created; then 100,000
//! result lines streamed down and matched by `custom_id`. The mock runs as
//! its own process (`docket mock-provider`), so this process's peak memory
//! is the client's alone.

use docket_testkit as support;

use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use docket::provider::batch::openai::{OpenAiBatch, PollCadence};
use docket::provider::batch::{BatchLine, BatchProvider, LineOutcome, LineSlice, SubmitSpec};
use docket::provider::{ApiKey, ChatRequest};

// The allocator of the `docket` binary, so the figures are docket's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BIN: &str = env!("CARGO_BIN_EXE_docket");
const N: usize = 100_000;

fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Prompts like the demo's: a chart entry and its candidates, ~600 bytes.
fn lines() -> Vec<BatchLine> {
    lines_of(N)
}

/// `n` such prompts.
fn lines_of(n: usize) -> Vec<BatchLine> {
    // One schema shared by every request, as the engine does.
    let schema = std::sync::Arc::new((
        "adjudicate".to_string(),
        serde_json::json!({
            "type": "object",
            "properties": {
                "crg_mbid": {"type": "string"}, "rr_mbid": {"type": "string"},
                "confidence": {"type": "number"}, "rationale": {"type": "string"}
            },
            "required": ["crg_mbid", "rr_mbid", "confidence", "rationale"],
            "additionalProperties": false
        }),
    ));
    (0..n)
        .map(|i| BatchLine {
            custom_id: format!("bench-{i}-1"),
            request: ChatRequest {
                model: "gpt-4o-mini".into(),
                system: Some("You match chart entries to MusicBrainz releases. Answer in JSON.".into()),
                // Rendered prompts are kept at their length, as the
                // engine's template does.
                user: shrunk(format!(
                    "Chart entry {i}: \"Midnight Echoes\" by The Night Owls, UK Singles, week {w}.\n\
                     Candidates:\n1. release group 4f1c-{i:06} \"Midnight Echoes\" (Single, 2024)\n\
                     2. release group 9a2b-{i:06} \"Midnight Echoes (Remix)\" (EP, 2024)\n\
                     3. release group 77de-{i:06} \"Echoes at Midnight\" (Album, 2023)\n\
                     Pick the release group and recording; give your confidence and why.",
                    w = i % 52
                )),
                max_tokens: 200,
                temperature: Some(0.0),
                response_schema: Some(schema.clone()),
                structured_output: Default::default(),
                thinking_budget: None,
                client_request_id: format!("bench-{i}-1"),
                timeout: Duration::from_secs(60),
                body: None,
            },
        })
        .collect()
}

fn shrunk(mut s: String) -> String {
    s.shrink_to_fit();
    s
}

fn main() {
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let want = |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()));
    if want("client") {
        client();
    }
    if want("job") {
        whole_job(N);
    }
    // Opt-in only: `cargo bench --bench batch -- results`.
    if filter.iter().any(|f| f == "results") {
        results_memory();
    }
    // Opt-in only (several minutes each): `cargo bench --bench batch -- million`.
    if filter.iter().any(|f| f == "million") {
        whole_job(1_000_000);
        million_killed_and_resumed();
    }
}

/// The client alone (A, B, C): the adapter against the mock, no engine.
fn client() {
    let home = tempfile::tempdir().expect("tmp");
    let (mut mock, port) = batch_mock(home.path());
    let rt = runtime();
    let base = format!("http://127.0.0.1:{port}/v1");
    rt.block_on(async {
        let (_client, b) = connect(&base).await;
        println!("docket batch benchmarks (release build, 2-core machine; the mock is a separate process)");
        let t = Instant::now();
        let batch = lines();
        let built = t.elapsed();
        let after_build = peak_rss_mb();
        let t = Instant::now();
        // OpenAI takes 50,000 requests per batch: the job is two batches.
        let chunks = b.split(&batch).expect("split");
        let bytes: u64 = chunks.iter().map(|c| c.bytes).sum();
        let mut ids = Vec::new();
        for (n, c) in chunks.iter().enumerate() {
            let tag = format!("bench-{n}");
            let lines = LineSlice(c.lines);
            let sub = b
                .submit(SubmitSpec {
                    tag: &tag,
                    model: "gpt-4o-mini",
                    lines: &lines,
                })
                .await
                .expect("submit");
            ids.push(sub.provider_batch_id);
        }
        let uploaded = t.elapsed();
        let after_upload = peak_rss_mb();
        // As the engine does: once uploaded, only the ids are kept (the
        // prompts are in the ledger).
        let expected: HashSet<String> = batch.iter().map(|l| l.custom_id.clone()).collect();
        let files = chunks.len();
        drop(chunks);
        drop(batch);
        println!(
            "A  {N} requests: lines built in {:.2} s; {} JSONL files ({:.1} MB) checked, streamed up and the batches created in {:.2} s (target < 5 s)  [{}]",
            built.as_secs_f64(),
            files,
            bytes as f64 / 1e6,
            uploaded.as_secs_f64(),
            if uploaded < Duration::from_secs(5) { "PASS" } else { "FAIL" }
        );
        let mut statuses = Vec::new();
        for id in &ids {
            statuses.push(loop {
                let s = b.poll(id).await.expect("poll");
                if s.state.is_terminal() && !s.results_pending {
                    break s;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            });
        }
        let mut answered = 0u64;
        let mut tokens = 0u64;
        let mut lines_read = 0u64;
        let mut quarantined = 0usize;
        let t = Instant::now();
        for status in &statuses {
            let summary = b
                .results(status, &expected, &mut |l: docket::provider::batch::ResultLine| {
                    if let LineOutcome::Answer(a) = &l.outcome {
                        answered += 1;
                        tokens += a.usage.map_or(0, |u| u.output_tokens);
                    }
                })
                .await
                .expect("results");
            lines_read += summary.lines;
            quarantined += summary.quarantined.len();
        }
        let ingested = t.elapsed();
        println!(
            "B  {lines_read} result lines streamed down and matched by custom_id in {:.2} s ({answered} answers, {tokens} output tokens, {quarantined} quarantined) (target < 3 s)  [{}]",
            ingested.as_secs_f64(),
            if ingested < Duration::from_secs(3) && answered == N as u64 { "PASS" } else { "FAIL" }
        );
        let peak = peak_rss_mb();
        println!(
            "C  peak memory of the client holding {N} requests: {peak:.0} MB (target < 100 MB)  [{}]; peak after building the requests {after_build:.0} MB, after the upload {after_upload:.0} MB",
            if peak < 100.0 { "PASS" } else { "FAIL" }
        );
    });
    let _ = mock.kill();
    let _ = mock.wait();
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Wait for the mock at `base` to listen; a client, and the OpenAI batch
/// adapter pointed at it.
async fn connect(base: &str) -> (reqwest::Client, OpenAiBatch) {
    let client = reqwest::Client::new();
    for _ in 0..100 {
        if client.get(format!("{base}/models")).send().await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let b = OpenAiBatch::openai("openai", base, Some(ApiKey::new("sk-bench")))
        .unwrap()
        .with_cadence(PollCadence::fast());
    (client, b)
}

fn rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Fault-matrix row B6, "memory stays bounded on a 200 MB file": batches
/// whose output files add up to 200 MB and more (`DOCKET_BENCH_RESULT_LINES`
/// lines, 400,000 by default) are read back and matched by `custom_id`
/// through the adapter. The peak is measured over the read alone (the
/// kernel's high-water mark is reset when it starts, `clear_refs`), so the
/// requests built for the upload do not count.
fn results_memory() {
    let n: usize = std::env::var("DOCKET_BENCH_RESULT_LINES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400_000);
    let home = tempfile::tempdir().expect("tmp");
    let (mut mock, port) = batch_mock(home.path());
    let rt = runtime();
    let base = format!("http://127.0.0.1:{port}/v1");
    rt.block_on(async {
        let (client, b) = connect(&base).await;
        let mut ids = Vec::new();
        let mut expected = HashSet::new();
        // Uploaded a file at a time, so the prompts are never all held.
        for start in (0..n).step_by(50_000) {
            let mut batch = lines_of((n - start).min(50_000));
            for (k, l) in batch.iter_mut().enumerate() {
                l.custom_id = format!("bench-{}-1", start + k);
            }
            expected.extend(batch.iter().map(|l| l.custom_id.clone()));
            let chunks = b.split(&batch).expect("split");
            for (k, c) in chunks.iter().enumerate() {
                let tag = format!("results-{start}-{k}");
                let lines = LineSlice(c.lines);
                let sub = b
                    .submit(SubmitSpec {
                        tag: &tag,
                        model: "gpt-4o-mini",
                        lines: &lines,
                    })
                    .await
                    .expect("submit");
                ids.push(sub.provider_batch_id);
            }
        }
        let mut statuses = Vec::new();
        for id in &ids {
            statuses.push(loop {
                let s = b.poll(id).await.expect("poll");
                if s.state.is_terminal() && !s.results_pending {
                    break s;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            });
        }
        // The size of what is read: each output file, counted as it streams.
        let mut bytes = 0u64;
        for s in &statuses {
            let Some(file) = &s.output_ref else { continue };
            let mut r = client
                .get(format!("{base}/files/{file}/content"))
                .bearer_auth("sk-bench")
                .send()
                .await
                .expect("content");
            while let Some(chunk) = r.chunk().await.expect("chunk") {
                bytes += chunk.len() as u64;
            }
        }
        // SAFETY-free: writing "5" resets this process's peak RSS (Linux).
        let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
        let before = rss_mb();
        let t = Instant::now();
        let (mut answered, mut read) = (0u64, 0u64);
        for status in &statuses {
            let summary = b
                .results(status, &expected, &mut |l: docket::provider::batch::ResultLine| {
                    if let LineOutcome::Answer(_) = &l.outcome {
                        answered += 1;
                    }
                })
                .await
                .expect("results");
            read += summary.lines;
        }
        let took = t.elapsed();
        let peak = peak_rss_mb();
        let ok = reset && answered == n as u64 && peak - before < 100.0 && bytes >= 200_000_000;
        println!(
            "D  {read} result lines in {} output files ({:.0} MB) streamed down and matched in {:.1} s; \
             peak memory during the read {peak:.0} MB, {:.0} MB above the {before:.0} MB held before it \
             (the {n} expected ids) (target: bounded, < 100 MB above, on >= 200 MB of results)  [{}]",
            statuses.len(),
            bytes as f64 / 1e6,
            took.as_secs_f64(),
            peak - before,
            if ok { "PASS" } else { "FAIL" }
        );
    });
    let _ = mock.kill();
    let _ = mock.wait();
}

/// The same job through the whole engine: `docket run` over `n` imported
/// items with `mode = "batch"`, against the mock in its own process:
/// render, record, cut (at OpenAI's 50,000 lines a batch), upload, poll,
/// ingest, gate and route, every row in the ledger.
fn whole_job(n: usize) {
    let home = tempfile::tempdir().expect("tmp");
    let (mut mock, port) = batch_mock(home.path());
    let ws = batch_workspace(port, n);
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
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let kb: f64 = String::from_utf8_lossy(&out.stderr)
        .lines()
        .find_map(|l| l.strip_prefix("peak_rss_kb="))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(f64::NAN);
    let conn = ws.conn();
    let sid = docket::ledger::store::latest_session(&support::db(&conn))
        .unwrap()
        .unwrap();
    support::check_complete(&conn, &sid);
    let row = docket::ledger::store::load_session(&support::db(&conn), &sid)
        .unwrap()
        .unwrap();
    let batches = support::count(
        &conn,
        "SELECT COUNT(*) FROM provider_batch WHERE session_id = ?1 AND state = 'ingested'",
        [&sid],
    );
    let dispatch = row.completed_at.unwrap_or(f64::NAN) - row.started_at;
    let mb = kb / 1024.0;
    let verdict = if n >= 1_000_000 {
        format!(
            "  [{}: <= 200 MB and <= 600 s at 1,000,000]",
            if mb <= 200.0 && dispatch <= 600.0 && row.processed_count as usize == n {
                "PASS"
            } else {
                "FAIL"
            }
        )
    } else {
        String::new()
    };
    println!(
        "D  the whole job through the engine, `docket run` over {} items in batch mode ({batches} provider batches, the mock's run time 1.2 s each): \
         {dispatch:.1} s from session start to the last result (planning included in the command's {wall:.1} s); peak memory {mb:.0} MB (VmHWM of `docket run`){verdict}",
        row.processed_count,
    );
}

/// The 1,000,000-item batch job killed with SIGKILL once some of its
/// batches are in, then resumed: the resume's memory stays in bound and
/// nothing is sent twice (the mock ran each line once; each request has
/// one line).
fn million_killed_and_resumed() {
    const M: usize = 1_000_000;
    let home = tempfile::tempdir().expect("tmp");
    let (mut mock, port) = batch_mock(home.path());
    let ws = batch_workspace(port, M);
    let mut run = Command::new(BIN)
        .env("HOME", home.path())
        .arg("--workspace")
        .arg(ws.path())
        .args(["run", "--yes", "--headless"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("docket run");
    // Kill it mid-run: some batches in, others open or still being cut.
    let conn = ws.conn();
    let mut peak_first = 0.0f64;
    let t = Instant::now();
    loop {
        peak_first = peak_first.max(vm_hwm_mb(run.id()));
        let ingested = support::count(
            &conn,
            "SELECT COUNT(*) FROM provider_batch WHERE state = 'ingested'",
            rusqlite::params![],
        );
        if ingested >= 8 || t.elapsed() > Duration::from_secs(900) {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = run.kill();
    let _ = run.wait();
    let sid = docket::ledger::store::latest_session(&support::db(&conn))
        .unwrap()
        .unwrap();
    let done_at_kill = support::count(
        &conn,
        "SELECT COUNT(*) FROM llm_batch_result WHERE session_id = ?1",
        [&sid],
    );
    let t = Instant::now();
    let out = Command::new(BIN)
        .env("HOME", home.path())
        .env("DOCKET_REPORT_PEAK_RSS", "1")
        .arg("--workspace")
        .arg(ws.path())
        .args(["run", "--yes", "--headless", "--resume", &sid])
        .output()
        .expect("docket run --resume");
    let wall = t.elapsed().as_secs_f64();
    let stats = mock_stats(port);
    let _ = mock.kill();
    let _ = mock.wait();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let kb: f64 = String::from_utf8_lossy(&out.stderr)
        .lines()
        .find_map(|l| l.strip_prefix("peak_rss_kb="))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(f64::NAN);
    support::check_complete(&conn, &sid);
    let lines_run = stats["batch_lines_ok"].as_u64().unwrap_or(0)
        + stats["batch_lines_failed"].as_u64().unwrap_or(0);
    let lines_recorded = support::count(
        &conn,
        "SELECT COUNT(*) FROM provider_batch_item",
        rusqlite::params![],
    );
    let twice = support::count(
        &conn,
        "SELECT COUNT(*) FROM (SELECT request_id FROM llm_messages WHERE state = 'answered' GROUP BY request_id HAVING COUNT(*) > 1)",
        rusqlite::params![],
    );
    let mb = kb / 1024.0;
    let pass = mb <= 200.0 && peak_first <= 200.0 && lines_run == M as u64 && twice == 0;
    println!(
        "D2 the same 1,000,000-item job killed (SIGKILL) with {done_at_kill} results in, then resumed: peak memory {peak_first:.0} MB before the kill, {mb:.0} MB for the resume ({wall:.1} s); \
         the mock ran {lines_run} lines for {lines_recorded} recorded, {twice} requests answered twice  [{}: <= 200 MB, every line run once]",
        if pass { "PASS" } else { "FAIL" }
    );
}

/// The mock's counters (`GET /_mock/stats`), over a plain socket.
fn mock_stats(port: u16) -> serde_json::Value {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return serde_json::Value::Null;
    };
    let _ =
        s.write_all(b"GET /_mock/stats HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.split_once("\r\n\r\n")
        .and_then(|(_, b)| serde_json::from_str(b).ok())
        .unwrap_or_default()
}

/// The peak resident set of process `pid` so far, in MB (0 once gone).
fn vm_hwm_mb(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// The mock as its own process, batches quick (1.2 s each).
fn batch_mock(home: &std::path::Path) -> (std::process::Child, u16) {
    let port = free_port();
    let mock = Command::new(BIN)
        .env("HOME", home)
        .args([
            "mock-provider",
            "--port",
            &port.to_string(),
            "--log-capacity",
            "1000",
            "--batch-validating-ms",
            "100",
            "--batch-running-ms",
            "1000",
            "--batch-finalizing-ms",
            "100",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("docket mock-provider");
    (mock, port)
}

/// A workspace of `n` demo items whose job runs in batch mode.
fn batch_workspace(port: u16, n: usize) -> support::Workspace {
    let job = support::Job::new(&format!("http://127.0.0.1:{port}/v1"));
    let ws = support::workspace(&job);
    let toml = std::fs::read_to_string(ws.path().join("docket.toml")).unwrap();
    // At 1,000,000 items the COUNT trigger cuts the batches (20 of
    // 50,000), not the TIME trigger while the feed fills one.
    let wait = if n >= 1_000_000 { 120 } else { 5 };
    let toml = toml.replace(
        "[stages.gate]",
        &format!(
            "[stages.batch]\nmode = \"batch\"\nmax_wait_secs = {wait}\npoll_interval_secs = 0.5\n\n[stages.gate]"
        ),
    );
    std::fs::write(ws.path().join("docket.toml"), toml).unwrap();
    support::import_demo_items(&ws, n);
    std::thread::sleep(Duration::from_millis(200));
    ws
}
