//! Every provider end to end: the real binary runs a job whose provider is
//! Azure, Anthropic, Gemini, Ollama, OpenRouter or OpenAI, against the mock
//! speaking that provider's wire format over loopback, with server-side rate
//! limits and 500s on. Each run completes with every item processed once,
//! only that provider's route was used, and the API key (a canary) is found
//! nowhere: not in the ledger, its WAL, the logs, the exports or the output.

use docket_testkit as support;

use std::path::Path;
use std::process::Command;

use docket::mock::{MockConfig, MockServer};
use support::*;

// Not `sk-` shaped: the generic redaction of key-like words must not be
// what keeps it out; it must never be written at all.
const CANARY: &str = "canaryKEY5e8b21f0c9d7a4";
const ITEMS: usize = 24;

/// The `[providers.main]` block for `kind` against the mock at `base`.
fn provider_block(kind: &str, base: &str) -> String {
    let (model, url, extra, key) = match kind {
        "openai" => ("gpt-4o-mini", format!("{base}/v1"), "", true),
        "azure" => (
            "gpt-4o-mini-deploy",
            base.to_string(),
            "api_version = \"2024-10-21\"\n",
            true,
        ),
        "anthropic" => ("claude-haiku-4-5", base.to_string(), "", true),
        "gemini" => ("gemini-2.5-flash", base.to_string(), "", true),
        "ollama" => ("llama3.2", base.to_string(), "", false),
        "openrouter" => ("openai/gpt-4o-mini", format!("{base}/api/v1"), "", true),
        other => panic!("no block for {other}"),
    };
    let key = if key {
        "api_key_env = \"DOCKET_PROVIDER_KEY\"\n"
    } else {
        ""
    };
    format!(
        "[providers.main]\nkind = \"{kind}\"\nmodel = \"{model}\"\nbase_url = \"{url}\"\n{extra}{key}\
         requests_per_minute = 0\ntokens_per_minute = 0\nmax_concurrency = 8\n\
         request_timeout_secs = 10\nmax_transport_attempts = 6\n"
    )
}

/// Replace the scaffold's provider block with `block`.
fn use_provider(ws: &Workspace, block: &str) {
    let path = ws.path().join("docket.toml");
    let toml = std::fs::read_to_string(&path).unwrap();
    let start = toml.find("[providers.main]").expect("a provider block");
    let end = toml[start..].find("[[stages]]").expect("stages after it") + start;
    let new = format!("{}{block}\n{}", &toml[..start], &toml[end..]);
    std::fs::write(&path, new).unwrap();
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// A workspace of `ITEMS` items whose provider is `kind`, on the mock run
/// with `cfg`, and a home for docket.
async fn wired(kind: &str, cfg: MockConfig) -> (MockServer, Workspace, tempfile::TempDir) {
    let (m, ws) = mocked(cfg, ITEMS, |_| {}).await;
    let base = m.base_url();
    let base = base.trim_end_matches("/v1").trim_end_matches('/');
    use_provider(&ws, &provider_block(kind, base));
    (m, ws, tempfile::tempdir().unwrap())
}

/// The real docket on `ws` with `home`, the canary as the provider's key.
fn docket(ws: &Workspace, home: &tempfile::TempDir) -> Command {
    let mut c = procs::docket_at(ws.path(), home.path());
    c.env("DOCKET_PROVIDER_KEY", CANARY);
    c
}

async fn run_against(kind: &str) {
    let (m, ws, home) = wired(
        kind,
        MockConfig {
            // Real 429s from the server and a few 500s: every adapter's
            // error mapping and the shared retry path are exercised.
            rpm_limit: 600,
            fail_500: 0.08,
            ..Default::default()
        },
    )
    .await;
    let docket = |args: &[&str]| {
        docket(&ws, &home)
            .args(args)
            .env("DOCKET_LOG", "trace")
            .output()
            .unwrap()
    };
    let out = docket(&["run", "--yes", "--headless"]);
    let mut haystack = String::from_utf8_lossy(&out.stdout).to_string();
    haystack.push_str(&String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{kind}:\n{haystack}");

    let conn = ws.conn();
    let sid = docket::ledger::store::latest_session(&support::db(&conn))
        .unwrap()
        .expect("a session");
    check_complete(&conn, &sid);
    let provider: String = conn
        .query_row("SELECT DISTINCT provider FROM llm_requests", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(provider, "main");
    let answered = count(
        &conn,
        "SELECT COUNT(*) FROM llm_messages WHERE state = 'answered' AND input_tokens > 0 AND output_tokens > 0",
        [],
    );
    assert!(
        answered >= ITEMS as i64,
        "{kind}: usage recorded for every answer ({answered})"
    );

    // The errors really happened, and were retried to success.
    let stats = m.stats();
    // The preflight asked this wire's models list (a route the mock
    // serves, not a 404) once.
    assert_eq!(stats.models_requests, 1, "{kind}: preflight requests");
    assert!(
        stats.server_errors + stats.rate_limited > 0,
        "{kind}: no 500 or 429 was served: {stats:?}"
    );
    let retries = count(
        &conn,
        "SELECT retry_count FROM llm_batch_session WHERE session_id = ?1",
        [&sid],
    );
    assert!(retries > 0, "{kind}: retries recorded");

    // Only this provider's route was used.
    let log = m.log();
    assert!(log.len() >= ITEMS, "{kind}: {} requests", log.len());
    let wire = if kind == "openai" { "openai" } else { kind };
    assert!(
        log.iter().all(|e| e.provider == wire),
        "{kind}: routes {:?}",
        log.iter()
            .map(|e| e.route.as_str())
            .collect::<std::collections::BTreeSet<_>>()
    );

    // The key is nowhere.
    for what in ["decisions", "results", "requests"] {
        let o = docket(&["export", "--what", what, "--format", "jsonl"]);
        haystack.push_str(&String::from_utf8_lossy(&o.stdout));
    }
    let o = docket(&["batch-results", &sid, "--format", "json"]);
    haystack.push_str(&String::from_utf8_lossy(&o.stdout));
    assert!(!haystack.contains(CANARY), "{kind}: key in the output");
    drop(conn);
    let mut files = vec![ws.ledger(), ws.path().join("docket.sqlite-wal")];
    files.extend(walk(home.path()));
    let mut logs = 0;
    for f in files {
        if let Ok(bytes) = std::fs::read(&f) {
            if f.extension().is_some_and(|e| e == "log") {
                logs += 1;
            }
            assert!(
                !bytes.windows(CANARY.len()).any(|w| w == CANARY.as_bytes()),
                "{kind}: key found in {}",
                f.display()
            );
        }
    }
    assert!(logs > 0, "{kind}: the log file was searched too");
    m.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_end_to_end() {
    run_against("openai").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_end_to_end() {
    run_against("azure").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_end_to_end() {
    run_against("anthropic").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_end_to_end() {
    run_against("gemini").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ollama_end_to_end() {
    run_against("ollama").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openrouter_end_to_end() {
    run_against("openrouter").await;
}

/// Row S8 on each wire that has a refusal marker (OpenAI `message.refusal`,
/// Anthropic `stop_reason: "refusal"`, Gemini `finishReason: "SAFETY"`):
/// the refusal is read as one, the item ends `refused` after one paid send,
/// and the run exits 5 (completed, with items in error).
async fn refusals_against(kind: &str) {
    let (m, ws, home) = wired(
        kind,
        MockConfig {
            refusal: 0.2,
            seed: 3,
            ..Default::default()
        },
    )
    .await;
    let out = docket(&ws, &home)
        .args(["run", "--yes", "--headless"])
        .output()
        .unwrap();
    let said = support::said(&out);
    let refused = m.stats().refused;
    assert!(refused > 0, "{kind}: no refusal was served");
    assert_eq!(out.status.code(), Some(5), "{kind}:\n{said}");
    let conn = ws.conn();
    let errors: Vec<String> = conn
        .prepare("SELECT error_message FROM llm_batch_result WHERE outcome = 'error'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(errors.len() as u64, refused, "{kind}: {errors:?}");
    assert!(
        errors.iter().all(|e| e.starts_with("refused: ")),
        "{kind}: {errors:?}"
    );
    assert_eq!(
        count(&conn, "SELECT COUNT(*) FROM llm_messages", []) as u64,
        ITEMS as u64,
        "{kind}: one send per item, no re-ask"
    );
    m.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s8_a_refusal_is_read_as_one_on_every_wire() {
    for kind in ["openai", "anthropic", "gemini"] {
        refusals_against(kind).await;
    }
}
