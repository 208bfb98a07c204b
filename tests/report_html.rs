//! `docket report SESSION`: the run report of a real run against the mock,
//! read back and held against `batch-results --format json`, `sessions
//! --format json` and `export --what attempts`; self-contained, escaped,
//! well formed, and refused for an unknown session.

use docket_testkit as support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use docket::mock::MockConfig;
use serde_json::Value;
use support::*;

/// An item id and a job name that would run as script if not escaped.
const EVIL_ITEM: &str = "<script>alert('item')</script>";
const EVIL_JOB: &str = "<script>alert(\"job\")</script> & co";

fn docket(ws: &Workspace, home: &Path) -> Command {
    support::procs::docket_at(ws.path(), home)
}

fn run_ok(ws: &Workspace, home: &Path, args: &[&str]) -> String {
    let out = docket(ws, home).args(args).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{args:?}: {}", said(&out));
    String::from_utf8(out.stdout).unwrap()
}

/// Every `data-key` / `data-value` pair of the page.
fn numbers(html: &str) -> BTreeMap<String, String> {
    let re = regex::Regex::new(r#"data-key="([^"]*)" data-value="([^"]*)""#).unwrap();
    re.captures_iter(html)
        .map(|c| (c[1].to_string(), c[2].to_string()))
        .collect()
}

fn int(n: &BTreeMap<String, String>, key: &str) -> i64 {
    n.get(key)
        .unwrap_or_else(|| panic!("no {key} in the report"))
        .parse()
        .unwrap()
}

fn float(n: &BTreeMap<String, String>, key: &str) -> f64 {
    n.get(key)
        .unwrap_or_else(|| panic!("no {key} in the report"))
        .parse()
        .unwrap()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

/// The page's tags open and close in order (void elements and `/>` aside),
/// and no raw `<` starts anything but a tag.
fn assert_well_formed(html: &str) {
    const VOID: &[&str] = &["meta", "br", "hr", "img", "link", "input", "!doctype"];
    let mut stack: Vec<String> = Vec::new();
    let mut rest = html;
    while let Some(i) = rest.find('<') {
        rest = &rest[i + 1..];
        let end = rest.find('>').expect("a tag that never ends");
        let tag = &rest[..end];
        rest = &rest[end + 1..];
        let closing = tag.starts_with('/');
        let name: String = tag
            .trim_start_matches('/')
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '!')
            .collect::<String>()
            .to_ascii_lowercase();
        assert!(!name.is_empty(), "a bare '<' in the page: <{tag}>");
        if closing {
            assert_eq!(stack.pop().as_deref(), Some(name.as_str()), "</{name}>");
        } else if !tag.ends_with('/') && !VOID.contains(&name.as_str()) {
            stack.push(name);
        }
    }
    assert!(stack.is_empty(), "never closed: {stack:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_is_self_contained_escaped_and_its_numbers_are_batch_results() {
    let (_m, ws) = mocked(latency(5.0, 20.0), 5, |_| {}).await;
    // An item too large for tokens_per_minute fails alone and at once: one
    // item in error, its id markup.
    let toml_path = ws.path().join("docket.toml");
    let toml = std::fs::read_to_string(&toml_path).unwrap();
    let toml = toml
        .replace("tokens_per_minute = 0", "tokens_per_minute = 60000")
        .replace(
            "name = \"test\"",
            &format!("name = {}", toml_quote(EVIL_JOB)),
        );
    std::fs::write(&toml_path, toml).unwrap();
    let big = ws.path().join("items/big.jsonl");
    let item = serde_json::json!({"id": EVIL_ITEM, "artist": "A", "chart": "C",
        "title": "lorem ipsum ".repeat(30_000), "week": "2020-01-01", "position": 1,
        "candidates": []});
    std::fs::write(&big, format!("{item}\n")).unwrap();
    import(&ws, &big);
    let home = tempfile::tempdir().unwrap();
    let out = docket(&ws, home.path())
        .args(["batch-adjudicate", "--yes", "--headless"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(5),
        "one item in error: {}",
        said(&out)
    );
    let sid = docket::ledger::store::latest_session(&support::db(&ws.conn()))
        .unwrap()
        .expect("a session");

    let file = ws.path().join("run report.html");
    let said_ = run_ok(
        &ws,
        home.path(),
        &["report", &sid, "-o", file.to_str().unwrap()],
    );
    assert!(said_.contains("Wrote the report"), "{said_}");
    let html = std::fs::read_to_string(&file).unwrap();
    let n = numbers(&html);

    // Outcomes and their totals: the rows of batch-results --format json.
    let rows: Value = serde_json::from_str(&run_ok(
        &ws,
        home.path(),
        &["batch-results", &sid, "--format", "json"],
    ))
    .unwrap();
    let rows = rows.as_array().unwrap();
    for outcome in ["accepted", "review", "rejected", "error"] {
        let want = rows.iter().filter(|r| r["outcome"] == outcome).count() as i64;
        assert_eq!(int(&n, &format!("outcome.{outcome}")), want, "{outcome}");
        assert_eq!(int(&n, &format!("stage.adjudicate.{outcome}")), want);
    }
    assert_eq!(int(&n, "outcome.error"), 1);
    assert_eq!(int(&n, "outcome.results"), rows.len() as i64);
    assert_eq!(rows.len(), 6);
    let sum = |k: &str| {
        rows.iter()
            .map(|r| r[k].as_f64().unwrap_or(0.0))
            .sum::<f64>()
    };
    assert!(close(float(&n, "outcome.cost_usd"), sum("cost_usd")));
    assert!(sum("cost_usd") > 0.0);
    assert_eq!(float(&n, "outcome.input_tokens"), sum("input_tokens"));
    assert_eq!(float(&n, "outcome.output_tokens"), sum("output_tokens"));

    // The header: the session's row of `sessions --format json`.
    let sessions: Value =
        serde_json::from_str(&run_ok(&ws, home.path(), &["sessions", "--format", "json"])).unwrap();
    let s = &sessions[0];
    assert_eq!(s["session_id"], sid.as_str());
    for (key, col) in [
        ("head.total", "total"),
        ("head.processed", "processed"),
        ("head.retries", "retries"),
        ("head.rate_limited", "rate_limited"),
        ("head.ambiguous", "ambiguous"),
        ("outcome.accepted", "accepted"),
        ("outcome.review", "review"),
        ("outcome.rejected", "rejected"),
        ("outcome.error", "errors"),
        ("head.input_tokens", "input_tokens"),
        ("head.output_tokens", "output_tokens"),
    ] {
        assert_eq!(
            int(&n, key),
            s[col].as_i64().unwrap(),
            "{key} vs {col}: {s}"
        );
    }
    assert!(close(
        float(&n, "head.cost_usd"),
        s["cost_usd"].as_f64().unwrap()
    ));
    assert_eq!(n["head.state"], s["state"].as_str().unwrap());

    // Attempts, their cost and their errors: the attempts export.
    let attempts = run_ok(
        &ws,
        home.path(),
        &[
            "export",
            "--what",
            "attempts",
            "--session",
            &sid,
            "--format",
            "jsonl",
        ],
    );
    let attempts: Vec<Value> = attempts
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(int(&n, "stage.adjudicate.attempts"), attempts.len() as i64);
    let cost: f64 = attempts
        .iter()
        .map(|a| a["cost_usd"].as_f64().unwrap_or(0.0))
        .sum();
    assert!(close(float(&n, "stage.adjudicate.cost_usd"), cost));
    let failed = attempts
        .iter()
        .filter(|a| a["state"] == "failed" || a["state"] == "ambiguous")
        .count() as i64;
    let shown: i64 = n
        .iter()
        .filter(|(k, _)| k.starts_with("errors."))
        .map(|(_, v)| v.parse::<i64>().unwrap())
        .sum();
    assert_eq!(shown, failed);
    assert_eq!(int(&n, "stage.adjudicate.items"), 6);

    // Self-contained: nothing fetched, nothing run. The only URL is the
    // provider's base_url quoted in the recorded docket.toml.
    let lower = html.to_ascii_lowercase();
    for banned in [
        "<script", "<link", "<img", "<iframe", "src=", "href=", "url(", "@import",
    ] {
        assert!(!lower.contains(banned), "{banned} in the report");
    }
    let pre = lower.find("<pre>").expect("the config");
    let pre_end = lower[pre..].find("</pre>").unwrap() + pre;
    let outside = format!("{}{}", &lower[..pre], &lower[pre_end..]);
    assert!(!outside.contains("http://") && !outside.contains("https://"));
    assert!(
        lower[pre..pre_end].contains("base_url"),
        "the config is shown"
    );
    // Escaped: the job name and the failed item's id read as text.
    assert!(html.contains("&lt;script&gt;alert(&#39;item&#39;)&lt;/script&gt;"));
    assert!(html.contains("&lt;script&gt;alert(&quot;job&quot;)&lt;/script&gt; &amp; co"));
    assert!(
        html.contains("can never be sent"),
        "the item's error is listed"
    );
    // Charts: a histogram with both thresholds, throughput and cost.
    assert!(html.matches("<svg").count() >= 3);
    assert!(html.contains("review 0.60") && html.contains("accept 0.85"));
    assert_well_formed(&html);

    // `-o -`: the same report on standard output.
    let piped = run_ok(&ws, home.path(), &["report", &sid, "-o", "-"]);
    assert_eq!(numbers(&piped), n);
}

#[test]
fn an_unknown_session_is_refused_and_writes_nothing() {
    let ws = workspace(&Job::new("http://127.0.0.1:9"));
    import_demo_items(&ws, 2);
    let home = tempfile::tempdir().unwrap();
    let out = docket(&ws, home.path())
        .current_dir(home.path())
        .args(["report", "batch_nope", "-o", "r.html"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let text = said(&out);
    assert!(
        text.contains("unknown session") && text.contains("batch_nope"),
        "{text}"
    );
    assert!(!home.path().join("r.html").exists());
}

/// The critic example (two stages) on a PostgreSQL ledger: the report's
/// outcomes are those of its `batch-results`, its header that of
/// `sessions`, and each stage's attempts and cost those of the attempts
/// export, all read from PostgreSQL.
#[test]
fn a_staged_run_on_postgres_reports_what_its_reads_say() {
    let server = support::pg::PgServer::start();
    let url = server.fresh_database();
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    docket::workspace::init_example(ws, false, Some(docket::workspace::Example::Critic)).unwrap();
    quiet_mock(ws);
    let mut f = std::fs::File::create(ws.join("items/test.jsonl")).unwrap();
    docket::demo::write_chart_items(&mut f, 10, 99).unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(support::procs::bin())
            .current_dir(ws)
            .arg("--workspace")
            .arg(ws)
            .args(args)
            .env("HOME", ws)
            .env("XDG_DATA_HOME", ws.join("data"))
            .env("XDG_STATE_HOME", ws.join("state"))
            .env_remove("DOCKET_WORKSPACE")
            .env("DOCKET_LEDGER_URL", &url)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", said(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    run(&["import", "items/test.jsonl"]);
    run(&["batch-adjudicate", "--yes", "--headless"]);
    assert!(
        !ws.join("docket.sqlite").exists(),
        "the ledger is PostgreSQL"
    );
    let sessions: Value = serde_json::from_str(&run(&["sessions", "--format", "json"])).unwrap();
    let s = &sessions[0];
    let sid = s["session_id"].as_str().unwrap().to_string();
    let html = run(&["report", &sid, "-o", "-"]);
    assert_well_formed(&html);
    let n = numbers(&html);
    let rows: Value =
        serde_json::from_str(&run(&["batch-results", &sid, "--format", "json"])).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 10);
    for (outcome, col) in [
        ("accepted", "accepted"),
        ("review", "review"),
        ("rejected", "rejected"),
        ("error", "errors"),
    ] {
        let want = rows.iter().filter(|r| r["outcome"] == outcome).count() as i64;
        assert_eq!(int(&n, &format!("outcome.{outcome}")), want, "{outcome}");
        assert_eq!(want, s[col].as_i64().unwrap(), "{outcome}");
    }
    let cost: f64 = rows.iter().map(|r| r["cost_usd"].as_f64().unwrap()).sum();
    assert!(close(float(&n, "outcome.cost_usd"), cost));
    assert!(close(
        float(&n, "head.cost_usd"),
        s["cost_usd"].as_f64().unwrap()
    ));
    let attempts = run(&[
        "export",
        "--what",
        "attempts",
        "--session",
        &sid,
        "--format",
        "jsonl",
    ]);
    let attempts: Vec<Value> = attempts
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for stage in ["adjudicate", "critic"] {
        let mine: Vec<&Value> = attempts.iter().filter(|a| a["stage"] == stage).collect();
        assert!(mine.len() >= 10, "{stage}");
        assert_eq!(
            int(&n, &format!("stage.{stage}.attempts")),
            mine.len() as i64
        );
        assert_eq!(int(&n, &format!("stage.{stage}.items")), 10, "{stage}");
        let cost: f64 = mine
            .iter()
            .map(|a| a["cost_usd"].as_f64().unwrap_or(0.0))
            .sum();
        assert!(
            close(float(&n, &format!("stage.{stage}.cost_usd")), cost),
            "{stage}"
        );
    }
}

/// A run on the Batch API: the provider batches section lists each batch
/// with the lines and cost the ledger recorded for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_run_lists_its_provider_batches_with_their_cost() {
    let cfg = MockConfig {
        batch_validating_ms: 50,
        batch_running_ms: 200,
        batch_finalizing_ms: 50,
        ..Default::default()
    };
    let (_m, ws) = mocked(cfg, 8, |_| {}).await;
    let toml_path = ws.path().join("docket.toml");
    let toml = std::fs::read_to_string(&toml_path).unwrap().replacen(
        "[stages.gate]",
        "[stages.batch]\nmode = \"batch\"\npoll_interval_secs = 0.1\n\n[stages.gate]",
        1,
    );
    std::fs::write(&toml_path, toml).unwrap();
    let home = tempfile::tempdir().unwrap();
    run_ok(
        &ws,
        home.path(),
        &["batch-adjudicate", "--yes", "--headless"],
    );
    let sid = docket::ledger::store::latest_session(&support::db(&ws.conn()))
        .unwrap()
        .expect("a session");
    let n = numbers(&run_ok(&ws, home.path(), &["report", &sid, "-o", "-"]));
    let conn = ws.conn();
    let mut stmt = conn
        .prepare(
            "SELECT b.batch_id, b.request_count, \
             (SELECT TOTAL(m.cost_usd) FROM provider_batch_item i JOIN llm_messages m \
              ON m.request_id = i.request_id AND m.attempt = i.attempt \
              WHERE i.batch_id = b.batch_id) \
             FROM provider_batch b WHERE b.session_id = ?1",
        )
        .unwrap();
    let batches: Vec<(i64, i64, f64)> = stmt
        .query_map([&sid], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert!(!batches.is_empty(), "the run used the Batch API");
    let mut billed = 0.0;
    for (id, lines, cost) in &batches {
        assert_eq!(int(&n, &format!("batch.{id}.lines")), *lines);
        assert!(close(float(&n, &format!("batch.{id}.cost_usd")), *cost));
        billed += cost;
    }
    assert!(billed > 0.0);
    assert!(
        close(billed, float(&n, "head.cost_usd")),
        "every attempt went in a batch"
    );
    assert_eq!(int(&n, "outcome.results"), 8);
}

/// The example workspace's mock with its injected faults off, so two runs
/// give the same answers, retries and cost, and quick.
fn quiet_mock(ws: &Path) {
    let toml = ws.join("docket.toml");
    let text = std::fs::read_to_string(&toml).unwrap();
    let quiet: Vec<String> = text
        .lines()
        .map(|line| {
            let key = line.split('=').next().unwrap_or("").trim();
            if ["fail_500", "malformed", "truncated", "wrong_schema"].contains(&key) {
                format!("{key} = 0.0")
            } else if ["latency_median_ms", "latency_p99_ms"].contains(&key) {
                format!("{key} = 5.0")
            } else {
                line.to_string()
            }
        })
        .collect();
    std::fs::write(&toml, quiet.join("\n") + "\n").unwrap();
}

/// `s` as a TOML basic string.
fn toml_quote(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}
