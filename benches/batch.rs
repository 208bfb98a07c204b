//! The Batch API figures of issue 4 (run: `cargo bench --bench batch`):
//! a 100,000-request batch built, streamed up and created; then 100,000
//! result lines streamed down and matched by `custom_id`. The mock runs as
//! its own process (`docket mock-provider`), so this process's peak memory
//! is the client's alone.

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use docket::provider::batch::openai::{OpenAiBatch, PollCadence};
use docket::provider::batch::{BatchLine, BatchProvider, LineOutcome, SubmitSpec};
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
    (0..N)
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
                client_request_id: format!("bench-{i}-1"),
                timeout: Duration::from_secs(60),
            },
        })
        .collect()
}

fn shrunk(mut s: String) -> String {
    s.shrink_to_fit();
    s
}

fn main() {
    let port = free_port();
    let mut mock = Command::new(BIN)
        .args([
            "mock-provider",
            "--port",
            &port.to_string(),
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
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}/v1");
    rt.block_on(async {
        // Wait for the mock to listen.
        let client = reqwest::Client::new();
        for _ in 0..100 {
            if client.get(format!("{base}/models")).send().await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let b = OpenAiBatch::openai("openai", &base, Some(ApiKey::new("sk-bench")))
            .unwrap()
            .with_cadence(PollCadence::fast());
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
            let sub = b
                .submit(SubmitSpec {
                    tag: &tag,
                    model: "gpt-4o-mini",
                    lines: c.lines,
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
                .results(status, &expected, &mut |l| {
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
    whole_job();
}

/// The same job through the whole engine: `docket run` over 100,000
/// imported items with `mode = "batch"`, against the mock in its own
/// process: render, record, cut (two batches at OpenAI's 50,000), upload,
/// poll, ingest, gate and route, every row in the ledger.
fn whole_job() {
    let port = free_port();
    let home = tempfile::tempdir().expect("tmp");
    let mut mock = Command::new(BIN)
        .env("HOME", home.path())
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
    let job = support::Job::new(&format!("http://127.0.0.1:{port}/v1"));
    let ws = support::workspace(&job);
    let toml = std::fs::read_to_string(ws.path().join("docket.toml")).unwrap();
    let toml = toml.replace(
        "[stages.gate]",
        "[stages.batch]\nmode = \"batch\"\nmax_wait_secs = 5\npoll_interval_secs = 0.5\n\n[stages.gate]",
    );
    std::fs::write(ws.path().join("docket.toml"), toml).unwrap();
    support::import_demo_items(&ws, N);
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
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let kb: f64 = String::from_utf8_lossy(&out.stderr)
        .lines()
        .find_map(|l| l.strip_prefix("peak_rss_kb="))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(f64::NAN);
    let conn = ws.conn();
    let sid = docket::ledger::store::latest_session(&conn)
        .unwrap()
        .unwrap();
    support::check_complete(&conn, &sid);
    let row = docket::ledger::store::load_session(&conn, &sid)
        .unwrap()
        .unwrap();
    let batches = support::count(
        &conn,
        "SELECT COUNT(*) FROM provider_batch WHERE session_id = ?1 AND state = 'ingested'",
        [&sid],
    );
    let dispatch = row.completed_at.unwrap_or(f64::NAN) - row.started_at;
    println!(
        "D  the whole job through the engine, `docket run` over {} items in batch mode ({batches} provider batches, the mock's run time 1.2 s each): \
         {dispatch:.1} s from session start to the last result (planning included in the command's {wall:.1} s); peak memory {:.0} MB (VmHWM of `docket run`)",
        row.processed_count,
        kb / 1024.0
    );
}
