//! `docket run --requests FILE --provider NAME` end to end: the real binary
//! sends a file of OpenAI Batch API lines to `docket mock-provider` (its own
//! process, real HTTP), and writes the answers in the Batch API's output
//! format. A SIGKILL mid-run and the same command again: every line
//! answered, and no answered request sent again. Bad lines are named by
//! FILE:LINE; a dry run and a finished file's re-run send nothing.

use docket_testkit as support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rusqlite::Connection;
use serde_json::{Value, json};
use support::procs::{Mock, Proc, bin};

const KEY_ENV: &str = "OPENAI_API_KEY";
const KEY: &str = "canaryKEYrequests5e1d";
const MODELS: [&str; 2] = ["gpt-4o-mini", "gpt-4.1-nano"];
const RUN_TIMEOUT: Duration = Duration::from_secs(240);

/// `n` Batch API lines: custom_ids req-0000.., two models, their own
/// temperature and max_tokens, each with a message of its own.
fn batch_lines(n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| {
            json!({
                "custom_id": format!("req-{i:04}"),
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": MODELS[i % 2],
                    "messages": [
                        {"role": "system", "content": "Answer briefly."},
                        {"role": "user", "content": format!("Question number {i}: is {i} even?")},
                    ],
                    "temperature": (i % 10) as f64 / 10.0,
                    "max_tokens": 40 + (i % 7) as u64,
                },
            })
        })
        .collect()
}

fn write_lines(path: &Path, lines: &[Value]) {
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(path, text).unwrap();
}

/// The real docket in `dir` (outside any workspace), with a private home.
fn docket(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(bin());
    c.current_dir(dir)
        .args(args)
        .env("HOME", dir.join("home"))
        .env("XDG_DATA_HOME", dir.join("home/data"))
        .env("XDG_STATE_HOME", dir.join("home/state"))
        .env(KEY_ENV, KEY)
        .env_remove("DOCKET_WORKSPACE")
        .env_remove("DOCKET_LOG");
    c
}

/// `run --requests FILE --provider openai` pointed at the mock, unlimited.
fn run_args(mock: &Mock, file: &str, more: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = [
        "run",
        "--requests",
        file,
        "--provider",
        "openai",
        "--base-url",
        &format!("{}/v1", mock.base()),
        "--rate-limit",
        "0",
        "--yes",
        "--headless",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.extend(more.iter().map(|s| s.to_string()));
    a
}

fn run_to_end(dir: &Path, args: &[String]) -> (Option<i32>, String) {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut p = Proc::start(
        docket(dir, &args),
        "docket run --requests".into(),
        dir.join("out.txt"),
    );
    p.wait(RUN_TIMEOUT)
}

/// The output file's lines by custom_id, each checked to be in the Batch
/// API's output format.
fn output_by_id(path: &Path) -> BTreeMap<String, Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        let keys: BTreeSet<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            BTreeSet::from(["id", "custom_id", "response", "error"]),
            "{line}"
        );
        assert!(
            v["id"].as_str().unwrap().starts_with("batch_req_"),
            "{line}"
        );
        let id = v["custom_id"].as_str().unwrap().to_string();
        assert!(
            out.insert(id, v).is_none(),
            "a custom_id written twice: {line}"
        );
    }
    out
}

/// An answered line: status 200, a chat.completion body of the line's
/// model, no error.
fn assert_answered(v: &Value, model: &str) {
    assert_eq!(v["error"], Value::Null, "{v}");
    let r = &v["response"];
    assert_eq!(r["status_code"], 200, "{v}");
    assert!(r["request_id"].is_string(), "{v}");
    assert_eq!(r["body"]["object"], "chat.completion", "{v}");
    assert_eq!(r["body"]["model"], model, "{v}");
    assert!(
        r["body"]["choices"][0]["message"]["content"].is_string(),
        "{v}"
    );
    assert!(
        r["body"]["usage"]["prompt_tokens"].as_u64().unwrap() > 0,
        "{v}"
    );
}

/// How many chat requests the mock got for each prompt (the sha256 of a
/// request's messages), and for each model.
fn sent_by_prompt(mock: &Mock) -> (HashMap<String, u64>, BTreeMap<String, u64>) {
    let mut prompts = HashMap::new();
    let mut models = BTreeMap::new();
    for e in mock.log() {
        if e["route"] != "/v1/chat/completions" {
            continue;
        }
        *prompts
            .entry(e["prompt_sha256"].as_str().unwrap().to_string())
            .or_insert(0) += 1;
        *models
            .entry(e["model"].as_str().unwrap().to_string())
            .or_insert(0) += 1;
    }
    (prompts, models)
}

fn job_ledger(file: &Path) -> Connection {
    let mut dir = file.as_os_str().to_os_string();
    dir.push(".docket");
    Connection::open(PathBuf::from(dir).join("docket.sqlite")).unwrap()
}

/// Each item's recorded request bodies (the ledger's user_prompt), parsed.
fn sent_bodies(conn: &Connection) -> Vec<(String, Value)> {
    let mut st = conn
        .prepare(
            "SELECT q.item_id, m.user_prompt FROM llm_messages m \
             JOIN llm_requests q ON q.request_id = m.request_id ORDER BY m.message_id",
        )
        .unwrap();
    st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
        .unwrap()
        .map(|r| {
            let (id, body) = r.unwrap();
            (id, serde_json::from_str(&body).unwrap())
        })
        .collect()
}

#[test]
fn a_thousand_batch_lines_are_sent_as_written_and_answered_in_the_batch_output_format() {
    let mock = Mock::start(&[]);
    let d = tempfile::tempdir().unwrap();
    let lines = batch_lines(1000);
    let file = d.path().join("requests.jsonl");
    write_lines(&file, &lines);
    let started = Instant::now();
    let (code, out) = run_to_end(d.path(), &run_args(&mock, "requests.jsonl", &[]));
    let took = started.elapsed();
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("requests.jsonl.docket"),
        "says where the job is:\n{out}"
    );
    let written = output_by_id(&d.path().join("requests.results.jsonl"));
    let want: BTreeSet<String> = lines
        .iter()
        .map(|l| l["custom_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(written.keys().cloned().collect::<BTreeSet<_>>(), want);
    for l in &lines {
        assert_answered(
            &written[l["custom_id"].as_str().unwrap()],
            l["body"]["model"].as_str().unwrap(),
        );
    }
    // At the mock: each line's messages once, to the line's own model.
    let (prompts, models) = sent_by_prompt(&mock);
    assert_eq!(prompts.len(), 1000, "one distinct prompt per line");
    assert!(prompts.values().all(|&n| n == 1), "a prompt sent twice");
    assert_eq!(
        models,
        BTreeMap::from([(MODELS[0].to_string(), 500), (MODELS[1].to_string(), 500)])
    );
    // In the ledger: each body exactly as the line wrote it (model, temperature, max_tokens).
    let by_id: HashMap<&str, &Value> = lines
        .iter()
        .map(|l| (l["custom_id"].as_str().unwrap(), &l["body"]))
        .collect();
    let sent = sent_bodies(&job_ledger(&file));
    assert_eq!(sent.len(), 1000);
    for (id, body) in &sent {
        assert_eq!(body, by_id[id.as_str()], "{id}");
    }
    let key_seen = support::files_under(d.path())
        .iter()
        .any(|p| std::fs::read(p).is_ok_and(|b| String::from_utf8_lossy(&b).contains(KEY)));
    assert!(!key_seen, "the API key was written to a file");
    eprintln!("1000 lines, sync, against the mock: {took:?}");
}

#[test]
fn killed_mid_run_the_same_command_resumes_and_resends_only_what_was_in_flight() {
    let mock = Mock::start(&["--latency-median-ms", "60", "--latency-p99-ms", "120"]);
    let d = tempfile::tempdir().unwrap();
    let lines = batch_lines(1000);
    let file = d.path().join("requests.jsonl");
    write_lines(&file, &lines);
    let args = run_args(&mock, "requests.jsonl", &[]);
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut first = Proc::start(
        docket(d.path(), &argv),
        "first run".into(),
        d.path().join("first.txt"),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while mock.stats()["requests"].as_u64().unwrap_or(0) < 300 {
        first.assert_running();
        assert!(
            Instant::now() < deadline,
            "the mock got too few requests:\n{}",
            first.output()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let killed = first.kill9();
    let before = mock.stats()["requests"].as_u64().unwrap();
    assert!(before < 1000, "killed too late ({before} sent):\n{killed}");
    let out_file = d.path().join("requests.results.jsonl");
    assert!(!out_file.exists(), "an output written before the run ended");

    let (code, out) = run_to_end(d.path(), &args);
    assert_eq!(code, Some(0), "resume:\n{out}\nkilled run:\n{killed}");
    assert!(out.contains("Resuming session"), "{out}");
    let written = output_by_id(&out_file);
    assert_eq!(written.len(), 1000);
    for l in &lines {
        assert_answered(
            &written[l["custom_id"].as_str().unwrap()],
            l["body"]["model"].as_str().unwrap(),
        );
    }
    // Only a request in flight at the kill (its answer never recorded: an
    // ambiguous attempt) may have gone twice; no answered one did.
    let conn = job_ledger(&file);
    let ambiguous: i64 = conn
        .query_row(
            "SELECT count(*) FROM llm_messages WHERE state = 'ambiguous'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let answered_twice: i64 = conn
        .query_row(
            "SELECT count(*) FROM (SELECT request_id FROM llm_messages WHERE state = 'answered' \
             GROUP BY request_id HAVING count(*) > 1)",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(answered_twice, 0);
    let (prompts, _) = sent_by_prompt(&mock);
    assert_eq!(prompts.len(), 1000, "every line sent");
    let twice: u64 = prompts.values().filter(|&&n| n > 1).map(|n| n - 1).sum();
    assert!(
        prompts.values().all(|&n| n <= 2),
        "a prompt sent more than twice"
    );
    // The mock counts a request as it arrives (its log only the answered):
    // what arrived past one per line is what went again.
    let arrived = mock.stats()["requests"].as_u64().unwrap();
    let again = arrived - 1000;
    assert!(
        twice <= again && again as i64 <= ambiguous && ambiguous <= 16,
        "{again} requests arrived again ({twice} answered twice), {ambiguous} ambiguous attempts (at most the 16 in flight)"
    );
    eprintln!(
        "killed after {before} requests: {ambiguous} in flight, {again} arrived again, {twice} answered twice"
    );
}

#[test]
fn bad_lines_are_named_a_dry_run_sends_nothing_and_a_finished_file_is_not_sent_again() {
    let mock = Mock::start(&[]);
    let d = tempfile::tempdir().unwrap();
    let mut text: String = batch_lines(3).iter().map(|l| format!("{l}\n")).collect();
    text.push_str("{\"custom_id\": \"broken\",\n");
    text.push_str(
        "{\"custom_id\":\"emb\",\"method\":\"POST\",\"url\":\"/v1/embeddings\",\"body\":{\"model\":\"text-embedding-3-small\",\"input\":\"x\"}}\n",
    );
    text.push_str(&format!("{}\n", batch_lines(1)[0]));
    text.push_str("{\"model\":\"gpt-4o-mini\",\"messages\":[{\"role\":\"user\",\"content\":\"a bare body\"}]}\n");
    std::fs::write(d.path().join("mixed.jsonl"), text).unwrap();
    let requests = || mock.stats()["requests"].as_u64().unwrap();

    // --strict: nothing at all.
    let (code, out) = run_to_end(d.path(), &run_args(&mock, "mixed.jsonl", &["--strict"]));
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("nothing was sent (--strict)"), "{out}");
    for said in [
        "mixed.jsonl:4: not JSON",
        "mixed.jsonl:5: url \"/v1/embeddings\": only /v1/chat/completions requests can be sent",
        "mixed.jsonl:6: custom_id \"req-0000\" is already on line 1",
    ] {
        assert!(out.contains(said), "{said}:\n{out}");
    }
    // --dry-run: the estimate, nothing sent, no output.
    let (code, out) = run_to_end(d.path(), &run_args(&mock, "mixed.jsonl", &["--dry-run"]));
    assert_eq!(code, Some(2), "bad lines make it 2:\n{out}");
    assert!(
        out.contains("Estimating cost") && out.contains("Dry run: nothing was sent"),
        "{out}"
    );
    assert_eq!(requests(), 0);
    let results = d.path().join("mixed.results.jsonl");
    assert!(!results.exists());
    // The good lines go; the bad ones make the exit code 2.
    let (code, out) = run_to_end(
        d.path(),
        &run_args(&mock, "mixed.jsonl", &["--format", "json"]),
    );
    assert_eq!(code, Some(2), "{out}");
    let written = output_by_id(&results);
    assert_eq!(
        written.keys().map(String::as_str).collect::<Vec<_>>(),
        ["line-7", "req-0000", "req-0001", "req-0002"]
    );
    assert_answered(&written["line-7"], "gpt-4o-mini");
    assert_eq!(requests(), 4);
    // Once finished, the same command writes the output again and sends nothing.
    std::fs::remove_file(&results).unwrap();
    let (code, out) = run_to_end(
        d.path(),
        &run_args(&mock, "mixed.jsonl", &["--format", "json"]),
    );
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("nothing is sent"), "{out}");
    assert_eq!(output_by_id(&results), written);
    assert_eq!(requests(), 4, "sent again");
    let doc: Value = out
        .lines()
        .find_map(|l| {
            serde_json::from_str(l)
                .ok()
                .filter(|v: &Value| v.get("requests").is_some())
        })
        .unwrap_or_else(|| panic!("no JSON summary:\n{out}"));
    assert_eq!(doc["requests"]["bad_count"], 3, "{doc}");
    assert_eq!(doc["requests"]["output"]["answered"], 4, "{doc}");
    // A changed file is another job: refused, naming the folder.
    std::fs::write(
        d.path().join("mixed.jsonl"),
        format!("{}\n", batch_lines(2)[1]),
    )
    .unwrap();
    let (code, out) = run_to_end(d.path(), &run_args(&mock, "mixed.jsonl", &[]));
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("another version of mixed.jsonl"), "{out}");
}

/// Lifecycle of a batch at the mock: quick.
const QUICK: [&str; 6] = [
    "--batch-validating-ms",
    "100",
    "--batch-running-ms",
    "300",
    "--batch-finalizing-ms",
    "100",
];

/// The same file through a provider's Batch API at the mock (`kind`, its
/// base URL, key variable and a model of its own): every line answered
/// with a chat.completion body (translated back for Anthropic and Gemini),
/// in batches only (no synchronous request).
fn through_batches(kind: &str, base: &str, key_env: &str, model: &str) {
    let mock = Mock::start(&QUICK);
    let d = tempfile::tempdir().unwrap();
    let lines = batch_lines(1000);
    write_lines(&d.path().join("requests.jsonl"), &lines);
    let base_url = format!("{}{base}", mock.base());
    let args = [
        "run",
        "--requests",
        "requests.jsonl",
        "--provider",
        kind,
        "--base-url",
        &base_url,
        "--model",
        model,
        "--mode",
        "batch",
        "--poll-interval",
        "0.2",
        "--yes",
        "--headless",
    ];
    let mut cmd = docket(d.path(), &args);
    cmd.env(key_env, KEY);
    let mut p = Proc::start(cmd, kind.into(), d.path().join("out.txt"));
    let started = Instant::now();
    let (code, out) = p.wait(RUN_TIMEOUT);
    assert_eq!(code, Some(0), "{kind}:\n{out}");
    let written = output_by_id(&d.path().join("requests.results.jsonl"));
    assert_eq!(written.len(), 1000, "{kind}");
    for l in &lines {
        let v = &written[l["custom_id"].as_str().unwrap()];
        assert_eq!(v["error"], Value::Null, "{kind}: {v}");
        let body = &v["response"]["body"];
        assert_eq!(v["response"]["status_code"], 200, "{kind}: {v}");
        assert_eq!(body["object"], "chat.completion", "{kind}: {v}");
        assert!(
            body["model"].as_str().unwrap().starts_with(model),
            "{kind}: {v}"
        );
        assert_eq!(
            body["choices"][0]["message"]["role"], "assistant",
            "{kind}: {v}"
        );
        assert!(
            body["choices"][0]["message"]["content"].is_string(),
            "{kind}: {v}"
        );
        assert!(
            body["choices"][0]["finish_reason"].is_string(),
            "{kind}: {v}"
        );
        assert!(
            body["usage"]["prompt_tokens"].as_u64().unwrap() > 0,
            "{kind}: {v}"
        );
    }
    let log = mock.log();
    let chat = log
        .iter()
        .filter(|e| e["batch_id"].is_null() && e["outcome"] == "ok")
        .count();
    let created = log
        .iter()
        .filter(|e| e["outcome"] == "batch_created")
        .count();
    assert_eq!(chat, 0, "{kind}: synchronous requests were sent");
    assert!(created >= 1, "{kind}: no batch created");
    eprintln!(
        "{kind}: 1000 lines in {created} batch(es), {:?}",
        started.elapsed()
    );
}

/// SIGKILL while the file's batch runs at the provider (Anthropic: the
/// bodies translated), then the same command again: the batch is collected,
/// not created again, so no line runs twice, and every line is answered.
#[test]
fn killed_while_its_batch_runs_the_same_command_collects_it_and_runs_no_line_twice() {
    let mock = Mock::start(&[
        "--batch-validating-ms",
        "100",
        "--batch-running-ms",
        "4000",
        "--batch-finalizing-ms",
        "100",
    ]);
    let d = tempfile::tempdir().unwrap();
    let lines = batch_lines(200);
    write_lines(&d.path().join("requests.jsonl"), &lines);
    let base = mock.base();
    let args = [
        "run",
        "--requests",
        "requests.jsonl",
        "--provider",
        "anthropic",
        "--base-url",
        &base,
        "--model",
        "claude-haiku-4-5",
        "--mode",
        "batch",
        "--poll-interval",
        "0.2",
        "--yes",
        "--headless",
    ];
    let start = |name: &str| {
        let mut cmd = docket(d.path(), &args);
        cmd.env("ANTHROPIC_API_KEY", KEY);
        Proc::start(cmd, name.into(), d.path().join(format!("{name}.txt")))
    };
    let mut first = start("first");
    let deadline = Instant::now() + Duration::from_secs(60);
    while mock.stat("batches_created") == 0 {
        first.assert_running();
        assert!(Instant::now() < deadline, "no batch:\n{}", first.output());
        std::thread::sleep(Duration::from_millis(20));
    }
    // Past the create's answer, well before the batch ends (4 s running).
    std::thread::sleep(Duration::from_millis(500));
    let killed = first.kill9();
    let out_file = d.path().join("requests.results.jsonl");
    assert!(!out_file.exists(), "an output before the end:\n{killed}");

    let (code, out) = start("again").wait(RUN_TIMEOUT);
    assert_eq!(code, Some(0), "again:\n{out}\nkilled run:\n{killed}");
    assert_eq!(
        mock.stat("batches_created"),
        1,
        "a second batch was created:\n{out}"
    );
    let written = output_by_id(&out_file);
    assert_eq!(written.len(), 200);
    for l in &lines {
        let v = &written[l["custom_id"].as_str().unwrap()];
        assert_eq!(v["error"], Value::Null, "{v}");
        assert_eq!(v["response"]["body"]["object"], "chat.completion", "{v}");
    }
    let chat = mock
        .log()
        .iter()
        .filter(|e| e["batch_id"].is_null() && e["outcome"] == "ok")
        .count();
    assert_eq!(chat, 0, "synchronous requests were sent");
}

#[test]
fn the_same_file_goes_through_the_openai_anthropic_and_gemini_batch_apis() {
    through_batches("openai", "/v1", "OPENAI_API_KEY", "gpt-4o-mini");
    through_batches("anthropic", "", "ANTHROPIC_API_KEY", "claude-haiku-4-5");
    through_batches("gemini", "", "GEMINI_API_KEY", "gemini-2.5-flash");
}

/// `--schema`: an answer that is not valid against it is asked again, up
/// to 3 answers, then kept, with `gate_failed` in its line's error; one
/// that asked for (and got) JSON passes.
#[test]
fn a_schema_gates_the_answers_and_a_failure_is_the_lines_error() {
    let mock = Mock::start(&[]);
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("any-object.json"), r#"{"type": "object"}"#).unwrap();
    let mut lines = batch_lines(2);
    lines[1]["body"]["response_format"] = json!({"type": "json_object"});
    lines[1]["body"]["messages"][1]["content"] = json!("Reply in JSON: is 1 even?");
    write_lines(&d.path().join("gated.jsonl"), &lines);
    let (code, out) = run_to_end(
        d.path(),
        &run_args(&mock, "gated.jsonl", &["--schema", "any-object.json"]),
    );
    assert_eq!(code, Some(5), "a line in error:\n{out}");
    let written = output_by_id(&d.path().join("gated.results.jsonl"));
    let failed = &written["req-0000"];
    assert_eq!(failed["response"]["status_code"], 200, "{failed}");
    assert_eq!(
        failed["response"]["body"]["object"], "chat.completion",
        "{failed}"
    );
    assert_eq!(failed["error"]["code"], "gate_failed", "{failed}");
    assert!(
        failed["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not JSON"),
        "{failed}"
    );
    assert_answered(&written["req-0001"], MODELS[1]);
    let (prompts, _) = sent_by_prompt(&mock);
    let mut counts: Vec<u64> = prompts.values().copied().collect();
    counts.sort();
    assert_eq!(
        counts,
        [1, 3],
        "the failing line asked 3 times, the passing one once"
    );
}

/// Synchronous Anthropic and Gemini requests: each body translated from
/// the chat shape, each answer translated back to a chat.completion body.
#[test]
fn synchronous_anthropic_and_gemini_requests_are_translated_both_ways() {
    for (kind, key_env, model, route) in [
        (
            "anthropic",
            "ANTHROPIC_API_KEY",
            "claude-haiku-4-5",
            "/v1/messages",
        ),
        (
            "gemini",
            "GEMINI_API_KEY",
            "gemini-2.5-flash",
            "/v1beta/models/{model}:generateContent",
        ),
    ] {
        let mock = Mock::start(&[]);
        let d = tempfile::tempdir().unwrap();
        let lines = batch_lines(20);
        write_lines(&d.path().join("requests.jsonl"), &lines);
        let base = mock.base();
        let args = [
            "run",
            "--requests",
            "requests.jsonl",
            "--provider",
            kind,
            "--base-url",
            &base,
            "--model",
            model,
            "--yes",
            "--headless",
        ];
        let mut cmd = docket(d.path(), &args);
        cmd.env(key_env, KEY);
        let (code, out) = Proc::start(cmd, kind.into(), d.path().join("out.txt")).wait(RUN_TIMEOUT);
        assert_eq!(code, Some(0), "{kind}:\n{out}");
        let written = output_by_id(&d.path().join("requests.results.jsonl"));
        assert_eq!(written.len(), 20, "{kind}");
        for v in written.values() {
            assert_eq!(v["error"], Value::Null, "{kind}: {v}");
            let body = &v["response"]["body"];
            assert_eq!(body["object"], "chat.completion", "{kind}: {v}");
            assert!(
                body["model"].as_str().unwrap().starts_with(model),
                "{kind}: {v}"
            );
            assert!(
                body["choices"][0]["message"]["content"].is_string(),
                "{kind}: {v}"
            );
        }
        let log = mock.log();
        let sent: Vec<&Value> = log.iter().filter(|e| e["route"] == route).collect();
        assert_eq!(sent.len(), 20, "{kind}: {log:?}");
        assert!(
            sent.iter()
                .all(|e| e["provider"] == kind && e["model"] == model),
            "{kind}: {sent:?}"
        );
    }
}

/// Inside a workspace, `--provider NAME` is one of its `[providers.NAME]`:
/// its kind, base URL and limits go into the job made beside the file.
#[test]
fn inside_a_workspace_the_provider_is_one_of_its_providers() {
    let mock = Mock::start(&[]);
    let mut job = support::Job::new(&format!("{}/v1", mock.base()));
    job.rpm = 0;
    job.concurrency = 4;
    let ws = support::workspace(&job);
    let d = tempfile::tempdir().unwrap();
    write_lines(&d.path().join("requests.jsonl"), &batch_lines(10));
    let ws_path = ws.path().display().to_string();
    let args = [
        "--workspace",
        &ws_path,
        "run",
        "--requests",
        "requests.jsonl",
        "--provider",
        "main",
        "--yes",
        "--headless",
    ];
    let (code, out) = Proc::start(
        docket(d.path(), &args),
        "in a workspace".into(),
        d.path().join("out.txt"),
    )
    .wait(RUN_TIMEOUT);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        output_by_id(&d.path().join("requests.results.jsonl")).len(),
        10
    );
    let made = std::fs::read_to_string(d.path().join("requests.jsonl.docket/docket.toml")).unwrap();
    for line in [
        "[providers.main]",
        "kind = \"openai_compatible\"",
        "requests_per_minute = 0",
        "max_concurrency = 4",
    ] {
        assert!(made.contains(line), "{line}:\n{made}");
    }
    assert_eq!(mock.stats()["requests"], 10);
    // A name that is neither one of its providers nor a kind: refused, naming both.
    let args = [
        "--workspace",
        &ws_path,
        "run",
        "--requests",
        "requests.jsonl",
        "--provider",
        "nope",
        "--yes",
    ];
    let (code, out) = Proc::start(
        docket(d.path(), &args),
        "unknown".into(),
        d.path().join("out2.txt"),
    )
    .wait(RUN_TIMEOUT);
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains("--provider nope: no [providers.nope]"),
        "{out}"
    );
}

/// `--limit N` sends N lines; the same command without it then sends the
/// others (a new session), and once more sends nothing.
#[test]
fn a_limited_run_leaves_the_other_lines_for_the_next() {
    let mock = Mock::start(&[]);
    let d = tempfile::tempdir().unwrap();
    write_lines(&d.path().join("requests.jsonl"), &batch_lines(5));
    let requests = || mock.stats()["requests"].as_u64().unwrap();
    let (code, out) = run_to_end(
        d.path(),
        &run_args(&mock, "requests.jsonl", &["--limit", "2"]),
    );
    assert_eq!(code, Some(5), "3 lines not sent:\n{out}");
    assert_eq!(requests(), 2);
    let written = output_by_id(&d.path().join("requests.results.jsonl"));
    let not_sent = written
        .values()
        .filter(|v| v["error"]["code"] == "not_sent")
        .count();
    assert_eq!(not_sent, 3, "{written:?}");
    let (code, out) = run_to_end(d.path(), &run_args(&mock, "requests.jsonl", &[]));
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("3 line(s) never sent"), "{out}");
    assert_eq!(requests(), 5);
    let (code, out) = run_to_end(d.path(), &run_args(&mock, "requests.jsonl", &[]));
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(requests(), 5, "sent again:\n{out}");
    let written = output_by_id(&d.path().join("requests.results.jsonl"));
    assert!(
        written.values().all(|v| v["error"].is_null()),
        "{written:?}"
    );
}
