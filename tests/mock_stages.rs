//! The mock provider's staged-pipeline switches over real loopback HTTP:
//! `verdict`, `verdict_disagree_rate`, `omit_optional_rate`,
//! `omit_optional_first`, the `partial_answers` counter, determinism, config
//! validation, and the OpenAI Files + Batches path honouring the same switches.

use std::time::{Duration, Instant};

use clap::Parser;
use docket::mock::{MockConfig, MockServer};
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn start(config: MockConfig) -> MockServer {
    MockServer::start(config, "127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("mock server starts")
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client")
}

fn ask(prompt: &str) -> Value {
    json!({"model": "gpt-4o-mini", "messages": [
        {"role": "system", "content": "You critique a generated answer."},
        {"role": "user", "content": prompt}
    ], "temperature": 0})
}

fn with_schema(prompt: &str, schema: &Value) -> Value {
    let mut body = ask(prompt);
    body["response_format"] = json!({"type": "json_schema",
        "json_schema": {"name": "stage", "strict": true, "schema": schema}});
    body
}

/// The assistant content of a 200 answer.
async fn content(http: &reqwest::Client, server: &MockServer, body: &Value) -> String {
    let resp = http
        .post(format!("{}/chat/completions", server.base_url()))
        .bearer_auth("sk-test")
        .json(body)
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), StatusCode::OK);
    let v: Value = resp.json().await.expect("json");
    v["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
        .to_string()
}

async fn answer(http: &reqwest::Client, server: &MockServer, body: &Value) -> Value {
    let text = content(http, server, body).await;
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

fn text_verdict(text: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix("VERDICT: "))
        .unwrap_or_else(|| panic!("no VERDICT line: {text}"))
        .to_string()
}

/// A critic stage: a required verdict (agree/disagree) plus a nested one.
fn critic_schema() -> Value {
    json!({"type": "object", "additionalProperties": false,
    "required": ["verdict", "confidence", "rationale", "detail"],
    "properties": {
        "verdict": {"type": "string", "enum": ["agree", "disagree"]},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "rationale": {"type": "string"},
        "detail": {"type": "object", "additionalProperties": false,
            "required": ["verdict"],
            "properties": {"verdict": {"enum": ["agree", "disagree", null]}}}
    }})
}

fn criterion() -> Value {
    json!({"type": "object", "additionalProperties": false, "required": ["score", "rationale"],
        "properties": {"score": {"type": "integer", "minimum": 1, "maximum": 5},
                       "rationale": {"type": "string"}}})
}

/// A structured batch of three optional criteria plus required non-criteria fields.
fn batched_schema(criteria: &[&str]) -> Value {
    let mut props = serde_json::Map::new();
    props.insert("summary".into(), json!({"type": "string"}));
    props.insert("confidence".into(), json!({"type": "number"}));
    for c in criteria {
        props.insert((*c).to_string(), criterion());
    }
    json!({"type": "object", "additionalProperties": false,
        "required": ["summary", "confidence"], "properties": props})
}

const CRITERIA: [&str; 3] = ["accuracy", "fluency", "relevance"];

fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().expect("object").keys().cloned().collect();
    k.sort_unstable();
    k
}

fn valid(schema: &Value, instance: &Value) -> bool {
    jsonschema::validator_for(schema)
        .expect("schema compiles")
        .is_valid(instance)
}

#[tokio::test]
async fn forced_verdict_in_schema_and_text() {
    let server = start(MockConfig {
        verdict: Some("disagree".into()),
        ..MockConfig::default()
    })
    .await;
    let http = client();
    let schema = critic_schema();
    for i in 0..12 {
        let v = answer(&http, &server, &with_schema(&format!("item {i}"), &schema)).await;
        assert_eq!(v["verdict"], "disagree", "{v}");
        assert_eq!(v["detail"]["verdict"], "disagree", "nested too: {v}");
        assert!(valid(&schema, &v), "{v}");
        // Text with a regex gate: the VERDICT line carries the label.
        let t = content(
            &http,
            &server,
            &ask(&format!("item {i}\nLabels: agree, disagree")),
        )
        .await;
        assert_eq!(text_verdict(&t), "disagree");
        let t = content(&http, &server, &ask(&format!("no labels {i}"))).await;
        assert_eq!(text_verdict(&t), "disagree", "forced even without options");
    }
    // A label the enum does not allow: the enum's first value.
    server.set_config(MockConfig {
        verdict: Some("maybe".into()),
        ..MockConfig::default()
    });
    for i in 0..6 {
        let v = answer(&http, &server, &with_schema(&format!("item {i}"), &schema)).await;
        assert_eq!(v["verdict"], "agree", "{v}");
        assert!(valid(&schema, &v), "{v}");
    }
    // A free-text verdict property takes the label as is.
    let free = json!({"type": "object", "required": ["verdict"],
        "properties": {"verdict": {"type": "string"}}});
    let v = answer(&http, &server, &with_schema("free", &free)).await;
    assert_eq!(v["verdict"], "maybe");
}

#[tokio::test]
async fn disagree_rate_one_and_zero() {
    let plain = start(MockConfig::default()).await;
    let server = start(MockConfig {
        verdict_disagree_rate: 1.0,
        ..MockConfig::default()
    })
    .await;
    let http = client();
    let schema = critic_schema();
    let single = json!({"type": "object", "required": ["verdict"],
        "properties": {"verdict": {"enum": ["agree"]}}});
    for i in 0..12 {
        let prompt = format!("item {i}\nLabels: agree, disagree");
        let v = answer(&http, &server, &with_schema(&prompt, &schema)).await;
        assert_eq!(v["verdict"], "disagree", "{v}");
        assert_eq!(v["detail"]["verdict"], "disagree", "{v}");
        let t = content(&http, &server, &ask(&prompt)).await;
        assert_eq!(text_verdict(&t), "disagree", "second listed option");
        let t = content(&http, &server, &ask(&format!("unlabelled {i}"))).await;
        assert_eq!(text_verdict(&t), "no", "fallback options yes/no");
        let v = answer(&http, &server, &with_schema(&prompt, &single)).await;
        assert_eq!(v["verdict"], "agree", "a single option is always taken");
        // Everything but the verdict is as without the switch.
        let p = answer(&http, &plain, &with_schema(&prompt, &schema)).await;
        let v = answer(&http, &server, &with_schema(&prompt, &schema)).await;
        assert_eq!(v["rationale"], p["rationale"]);
        assert_eq!(v["confidence"], p["confidence"]);
    }
    // Rate 0 is off: exactly the unsteered answers, which use both values.
    server.set_config(MockConfig {
        verdict_disagree_rate: 0.0,
        ..MockConfig::default()
    });
    let mut seen = std::collections::HashSet::new();
    for i in 0..40 {
        let body = with_schema(&format!("item {i}"), &schema);
        let v = content(&http, &server, &body).await;
        assert_eq!(v, content(&http, &plain, &body).await);
        let v: Value = serde_json::from_str(&v).expect("json");
        seen.insert(v["verdict"].as_str().expect("verdict").to_string());
    }
    assert_eq!(seen.len(), 2, "seeded choice: {seen:?}");
    // A middle rate mixes the two, deterministically.
    server.set_config(MockConfig {
        verdict_disagree_rate: 0.5,
        ..MockConfig::default()
    });
    let mut disagree = 0;
    for i in 0..40 {
        let body = with_schema(&format!("item {i}"), &schema);
        let a = content(&http, &server, &body).await;
        assert_eq!(
            a,
            content(&http, &server, &body).await,
            "same prompt, same answer"
        );
        let v: Value = serde_json::from_str(&a).expect("json");
        disagree += usize::from(v["verdict"] == "disagree");
    }
    assert!((8..=32).contains(&disagree), "{disagree}/40");
}

#[tokio::test]
async fn omit_rate_one_leaves_out_every_optional_property() {
    let server = start(MockConfig {
        omit_optional_rate: 1.0,
        ..MockConfig::default()
    })
    .await;
    let http = client();
    let schema = batched_schema(&CRITERIA);
    // What docket checks a partial answer against: the criteria absent.
    for i in 0..10 {
        let v = answer(&http, &server, &with_schema(&format!("item {i}"), &schema)).await;
        assert_eq!(keys(&v), ["confidence", "summary"], "{v}");
        assert!(valid(&schema, &v), "{v}");
    }
    assert_eq!(server.stats().partial_answers, 10);
    // Follow-ups listing only the missing criteria: one criterion is answered,
    // whether optional or required.
    for c in CRITERIA {
        let one = batched_schema(&[c]);
        let v = answer(&http, &server, &with_schema(&format!("only {c}"), &one)).await;
        let mut want = vec![c.to_string(), "confidence".into(), "summary".into()];
        want.sort_unstable();
        assert_eq!(keys(&v), want, "{v}");
        assert!(valid(&one, &v), "{v}");
        let mut required = one.clone();
        required["required"] = json!(["summary", "confidence", c]);
        let v = answer(&http, &server, &with_schema(&format!("req {c}"), &required)).await;
        assert!(v.get(c).is_some(), "{v}");
        assert!(valid(&required, &v), "{v}");
    }
    assert_eq!(server.stats().partial_answers, 10, "follow-ups are whole");
    // Two missing criteria asked together: both optional, so still omitted.
    let two = batched_schema(&CRITERIA[1..]);
    let v = answer(&http, &server, &with_schema("two", &two)).await;
    assert_eq!(keys(&v), ["confidence", "summary"]);
    let stats: Value = http
        .get(server.base_url().replace("/v1", "/_mock/stats"))
        .send()
        .await
        .expect("stats")
        .json()
        .await
        .expect("json");
    assert_eq!(stats["partial_answers"], 11);
}

#[tokio::test]
async fn omit_rate_zero_keeps_all_and_a_middle_rate_is_deterministic() {
    let server = start(MockConfig::default()).await;
    let http = client();
    let schema = batched_schema(&CRITERIA);
    for i in 0..10 {
        let v = answer(&http, &server, &with_schema(&format!("item {i}"), &schema)).await;
        assert_eq!(
            keys(&v),
            ["accuracy", "confidence", "fluency", "relevance", "summary"]
        );
        assert!(valid(&schema, &v), "{v}");
    }
    assert_eq!(server.stats().partial_answers, 0);
    let full = answer(&http, &server, &with_schema("item 3", &schema)).await;

    server.set_config(MockConfig {
        omit_optional_rate: 0.5,
        ..MockConfig::default()
    });
    let mut partial = 0;
    for i in 0..30 {
        let body = with_schema(&format!("item {i}"), &schema);
        let a = content(&http, &server, &body).await;
        assert_eq!(
            a,
            content(&http, &server, &body).await,
            "same prompt, same answer"
        );
        let v: Value = serde_json::from_str(&a).expect("json");
        assert!(valid(&schema, &v), "{v}");
        let kept = CRITERIA.iter().filter(|c| v.get(**c).is_some()).count();
        partial += usize::from(kept < 3);
        if i == 3 {
            // The values kept are those of the whole answer.
            for c in CRITERIA.iter().filter(|c| v.get(**c).is_some()) {
                assert_eq!(v[*c], full[*c]);
            }
            assert_eq!(v["summary"], full["summary"]);
        }
    }
    assert!((15..30).contains(&partial), "{partial}/30 partial");
    assert_eq!(server.stats().partial_answers as usize, partial * 2);
    // Another seed draws differently for some prompt, yet stays deterministic.
    server.set_config(MockConfig {
        omit_optional_rate: 0.5,
        seed: 7,
        ..MockConfig::default()
    });
    let mut differs = false;
    for i in 0..30 {
        let body = with_schema(&format!("item {i}"), &schema);
        let a = content(&http, &server, &body).await;
        assert_eq!(a, content(&http, &server, &body).await);
        let v: Value = serde_json::from_str(&a).expect("json");
        let kept: Vec<bool> = CRITERIA.iter().map(|c| v.get(*c).is_some()).collect();
        server.set_config(MockConfig {
            omit_optional_rate: 0.5,
            ..MockConfig::default()
        });
        let b: Value = answer(&http, &server, &body).await;
        let kept42: Vec<bool> = CRITERIA.iter().map(|c| b.get(*c).is_some()).collect();
        differs |= kept != kept42;
        server.set_config(MockConfig {
            omit_optional_rate: 0.5,
            seed: 7,
            ..MockConfig::default()
        });
    }
    assert!(differs, "the config seed takes part in the draw");
}

#[tokio::test]
async fn omit_optional_first_counts_per_server_and_resets() {
    let cfg = MockConfig {
        omit_optional_first: 2,
        ..MockConfig::default()
    };
    let server = start(cfg.clone()).await;
    let http = client();
    let schema = batched_schema(&CRITERIA);
    let one = batched_schema(&["fluency"]);
    // A single-criterion request never uses the budget.
    let v = answer(&http, &server, &with_schema("single", &one)).await;
    assert!(v.get("fluency").is_some());
    let expect_partial = ["accuracy", "confidence", "summary"];
    let all = ["accuracy", "confidence", "fluency", "relevance", "summary"];
    for (i, want) in [&expect_partial[..], &expect_partial[..], &all[..], &all[..]]
        .into_iter()
        .enumerate()
    {
        // The same prompt each time: only the counter decides.
        let v = answer(&http, &server, &with_schema("same item", &schema)).await;
        assert_eq!(keys(&v), want, "answer {i}: {v}");
        assert!(valid(&schema, &v), "{v}");
    }
    assert_eq!(server.stats().partial_answers, 2);
    // A config change restarts the count (over HTTP, like a test driver would).
    let resp = http
        .post(server.base_url().replace("/v1", "/_mock/config"))
        .json(&serde_json::to_value(&cfg).expect("config json"))
        .send()
        .await
        .expect("config");
    assert_eq!(resp.status(), StatusCode::OK);
    let v = answer(&http, &server, &with_schema("same item", &schema)).await;
    assert_eq!(keys(&v), expect_partial);
    // So does a reset.
    let _ = answer(&http, &server, &with_schema("same item", &schema)).await;
    let v = answer(&http, &server, &with_schema("same item", &schema)).await;
    assert_eq!(keys(&v), all);
    let resp = http
        .post(server.base_url().replace("/v1", "/_mock/reset"))
        .send()
        .await
        .expect("reset");
    assert_eq!(resp.status(), StatusCode::OK);
    let v = answer(&http, &server, &with_schema("other item", &schema)).await;
    assert_eq!(keys(&v), expect_partial);
    assert_eq!(server.stats().partial_answers, 1, "counted since the reset");
}

#[tokio::test]
async fn same_prompt_same_answer_with_every_switch() {
    let cfg = MockConfig {
        verdict_disagree_rate: 0.4,
        omit_optional_rate: 0.6,
        ..MockConfig::default()
    };
    let a = start(cfg.clone()).await;
    let b = start(cfg).await;
    let http = client();
    let mut schema = batched_schema(&CRITERIA);
    schema["properties"]["verdict"] = json!({"enum": ["agree", "disagree"]});
    for i in 0..10 {
        for body in [
            with_schema(&format!("item {i}"), &schema),
            ask(&format!("item {i}\nLabels: agree, disagree")),
        ] {
            let first = content(&http, &a, &body).await;
            assert_eq!(first, content(&http, &a, &body).await);
            assert_eq!(
                first,
                content(&http, &b, &body).await,
                "another server, same answer"
            );
        }
    }
}

#[tokio::test]
async fn invalid_values_are_refused() {
    let bad = [
        MockConfig {
            verdict_disagree_rate: 1.5,
            ..MockConfig::default()
        },
        MockConfig {
            verdict_disagree_rate: f64::NAN,
            ..MockConfig::default()
        },
        MockConfig {
            omit_optional_rate: -0.1,
            ..MockConfig::default()
        },
        MockConfig {
            omit_optional_rate: 2.0,
            ..MockConfig::default()
        },
        MockConfig {
            verdict: Some("agree".into()),
            verdict_disagree_rate: 0.5,
            ..MockConfig::default()
        },
        MockConfig {
            verdict: Some("  ".into()),
            ..MockConfig::default()
        },
    ];
    let messages: Vec<String> = bad
        .iter()
        .map(|c| c.validate().expect_err("invalid").to_string())
        .collect();
    assert!(
        messages[0].contains("verdict_disagree_rate"),
        "{messages:?}"
    );
    assert!(messages[2].contains("omit_optional_rate"), "{messages:?}");
    assert!(messages[4].contains("exclude"), "{messages:?}");
    assert!(messages[5].contains("verdict"), "{messages:?}");
    assert!(
        MockConfig {
            verdict: Some("agree".into()),
            omit_optional_rate: 1.0,
            omit_optional_first: 3,
            ..MockConfig::default()
        }
        .validate()
        .is_ok()
    );
    let err = MockServer::start(bad[4].clone(), "127.0.0.1:0".parse().expect("addr"))
        .await
        .err()
        .expect("refused");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    // Live: 400 and the config in force is kept.
    let server = start(MockConfig::default()).await;
    let http = client();
    let url = server.base_url().replace("/v1", "/_mock/config");
    for body in [
        json!({"omit_optional_rate": 1.2}),
        json!({"verdict": "agree", "verdict_disagree_rate": 1.0}),
        json!({"omit_optional_first": -1}),
        json!({"verdict": 3}),
    ] {
        let resp = http.post(&url).json(&body).send().await.expect("config");
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{body}");
    }
    assert_eq!(server.config().omit_optional_rate, 0.0);
    let resp = http
        .post(&url)
        .json(&json!({"verdict": "agree", "omit_optional_first": 1}))
        .send()
        .await
        .expect("config");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(server.config().verdict.as_deref(), Some("agree"));
    assert_eq!(server.config().omit_optional_first, 1);
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    mock: MockConfig,
}

#[test]
fn cli_flags_and_toml_keys() {
    let cli = Cli::try_parse_from([
        "mock",
        "--verdict",
        "disagree",
        "--omit-optional-rate",
        "0.25",
        "--omit-optional-first",
        "4",
    ])
    .expect("parse");
    assert_eq!(cli.mock.verdict.as_deref(), Some("disagree"));
    assert_eq!(cli.mock.omit_optional_rate, 0.25);
    assert_eq!(cli.mock.omit_optional_first, 4);
    let cli = Cli::try_parse_from(["mock", "--verdict-disagree-rate", "0.3"]).expect("parse");
    assert_eq!(cli.mock.verdict_disagree_rate, 0.3);
    assert_eq!(cli.mock.verdict, None);
    let d = Cli::try_parse_from(["mock"]).expect("defaults").mock;
    assert_eq!(
        (
            d.verdict,
            d.verdict_disagree_rate,
            d.omit_optional_rate,
            d.omit_optional_first
        ),
        (None, 0.0, 0.0, 0)
    );
    let from_toml: MockConfig = serde_json::from_value(json!({
        "verdict": "agree", "omit_optional_rate": 0.5, "omit_optional_first": 2
    }))
    .expect("keys");
    assert_eq!(from_toml.verdict.as_deref(), Some("agree"));
    assert_eq!(from_toml.omit_optional_first, 2);
}

// ---- the OpenAI Files + Batches path ----

struct Batches {
    root: String,
    http: reqwest::Client,
}

impl Batches {
    fn new(server: &MockServer) -> Batches {
        Batches {
            root: server.base_url(),
            http: client(),
        }
    }

    async fn upload(&self, data: &str) -> String {
        let b = "----docketStagesBoundary";
        let mut body = format!(
            "--{b}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{b}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"input.jsonl\"\r\nContent-Type: application/octet-stream\r\n\r\n"
        )
        .into_bytes();
        body.extend_from_slice(data.as_bytes());
        body.extend_from_slice(format!("\r\n--{b}--\r\n").as_bytes());
        let resp = self
            .http
            .post(format!("{}/files", self.root))
            .bearer_auth("sk-test")
            .header("content-type", format!("multipart/form-data; boundary={b}"))
            .body(body)
            .send()
            .await
            .expect("upload");
        assert_eq!(resp.status(), StatusCode::OK);
        let v: Value = resp.json().await.expect("file");
        v["id"].as_str().expect("file id").to_string()
    }

    async fn get(&self, path: &str) -> reqwest::Response {
        let resp = self
            .http
            .get(format!("{}{path}", self.root))
            .bearer_auth("sk-test")
            .send()
            .await
            .expect("get");
        assert_eq!(resp.status(), StatusCode::OK);
        resp
    }

    /// Submit, wait for completion, and return the output lines' contents by custom_id.
    async fn run(&self, data: &str) -> Vec<(String, String)> {
        let file = self.upload(data).await;
        let resp = self
            .http
            .post(format!("{}/batches", self.root))
            .bearer_auth("sk-test")
            .json(
                &json!({"input_file_id": file, "endpoint": "/v1/chat/completions",
                          "completion_window": "24h"}),
            )
            .send()
            .await
            .expect("create");
        assert_eq!(resp.status(), StatusCode::OK);
        let batch: Value = resp.json().await.expect("batch");
        let id = batch["id"].as_str().expect("id").to_string();
        let deadline = Instant::now() + Duration::from_secs(15);
        let out = loop {
            let b: Value = self
                .get(&format!("/batches/{id}"))
                .await
                .json()
                .await
                .expect("b");
            if b["status"] == "completed" && !b["output_file_id"].is_null() {
                break b["output_file_id"].as_str().expect("output").to_string();
            }
            assert!(Instant::now() < deadline, "stuck: {b}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let text = self
            .get(&format!("/files/{out}/content"))
            .await
            .text()
            .await
            .expect("content");
        let mut lines: Vec<(String, String)> = text
            .lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l).expect("line");
                let body = &v["response"]["body"];
                (
                    v["custom_id"].as_str().expect("custom_id").to_string(),
                    body["choices"][0]["message"]["content"]
                        .as_str()
                        .expect("content")
                        .to_string(),
                )
            })
            .collect();
        lines.sort();
        lines
    }
}

fn batch_line(id: &str, body: &Value) -> String {
    json!({"custom_id": id, "method": "POST", "url": "/v1/chat/completions", "body": body})
        .to_string()
        + "\n"
}

#[tokio::test]
async fn the_batch_path_honours_the_same_switches() {
    let cfg = MockConfig {
        batch_validating_ms: 50,
        batch_running_ms: 200,
        batch_finalizing_ms: 50,
        verdict: Some("disagree".into()),
        omit_optional_rate: 1.0,
        ..MockConfig::default()
    };
    let server = start(cfg).await;
    let api = Batches::new(&server);
    let http = client();
    let critic = critic_schema();
    let batched = batched_schema(&CRITERIA);
    let mut data = String::new();
    for i in 0..4 {
        data += &batch_line(
            &format!("critic-{i}"),
            &with_schema(&format!("c {i}"), &critic),
        );
        data += &batch_line(
            &format!("crit-{i}"),
            &with_schema(&format!("b {i}"), &batched),
        );
        data += &batch_line(
            &format!("text-{i}"),
            &ask(&format!("t {i}\nLabels: agree, disagree")),
        );
    }
    let lines = api.run(&data).await;
    assert_eq!(lines.len(), 12);
    for (id, text) in &lines {
        if id.starts_with("text-") {
            assert_eq!(text_verdict(text), "disagree", "{id}");
            continue;
        }
        let v: Value = serde_json::from_str(text).expect("json content");
        if id.starts_with("critic-") {
            assert_eq!(v["verdict"], "disagree", "{id}: {v}");
            assert!(valid(&critic, &v));
        } else {
            assert_eq!(keys(&v), ["confidence", "summary"], "{id}: {v}");
            assert!(valid(&batched, &v));
        }
    }
    assert_eq!(server.stats().partial_answers, 4);
    // A batch line answers like the sync route.
    let sync = content(&http, &server, &with_schema("b 2", &batched)).await;
    let line = &lines.iter().find(|(id, _)| id == "crit-2").expect("line").1;
    assert_eq!(&sync, line);

    // omit_optional_first counts batch lines too.
    server.set_config(MockConfig {
        batch_validating_ms: 50,
        batch_running_ms: 200,
        batch_finalizing_ms: 50,
        omit_optional_first: 3,
        ..MockConfig::default()
    });
    let data: String = (0..5)
        .map(|i| {
            batch_line(
                &format!("crit-{i}"),
                &with_schema(&format!("b {i}"), &batched),
            )
        })
        .collect();
    let lines = api.run(&data).await;
    let partial = lines
        .iter()
        .filter(|(_, t)| {
            let v: Value = serde_json::from_str(t).expect("json");
            keys(&v) == ["accuracy", "confidence", "summary"]
        })
        .count();
    assert_eq!(partial, 3);
    assert_eq!(server.stats().partial_answers, 4 + 1 + 3);
}
