//! Integration tests of the mock provider over real loopback HTTP (reqwest as
//! the client), checking OpenAI wire compatibility, determinism, rate limits,
//! faults and the admin endpoints.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use docket::mock::{MockConfig, MockLogEntry, MockServer, MockStats};
use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

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

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    text: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text))
    }
    fn content(&self) -> String {
        self.json()["choices"][0]["message"]["content"]
            .as_str()
            .expect("content string")
            .to_string()
    }
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

async fn post(client: &reqwest::Client, server: &MockServer, body: &Value) -> Reply {
    post_raw(client, server, serde_json::to_string(body).expect("body")).await
}

async fn post_raw(client: &reqwest::Client, server: &MockServer, body: String) -> Reply {
    let resp = client
        .post(format!("{}/chat/completions", server.base_url()))
        .bearer_auth("sk-test")
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("request");
    Reply {
        status: resp.status(),
        headers: resp.headers().clone(),
        text: resp.text().await.expect("body"),
    }
}

fn ask(prompt: &str) -> Value {
    json!({"model": "gpt-4o-mini", "messages": [
        {"role": "system", "content": "You adjudicate record pairs."},
        {"role": "user", "content": prompt}
    ], "temperature": 0})
}

fn with_schema(prompt: &str, schema: Value) -> Value {
    let mut body = ask(prompt);
    body["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "verdict", "strict": true, "schema": schema}});
    body
}

/// Raw text, because `serde_json::json!` would sort the properties and the
/// order test needs the schema's own order on the wire.
const VERDICT_SCHEMA: &str = r##"{
    "type": "object",
    "additionalProperties": false,
    "required": ["verdict", "confidence", "rationale", "left_id", "score", "tags", "note", "detail"],
    "properties": {
        "verdict": {"type": "string", "enum": ["match", "no_match", "unsure"]},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "rationale": {"type": "string"},
        "left_id": {"type": "string"},
        "score": {"type": "integer", "minimum": 1, "maximum": 5},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["title", "date", "place"]}},
        "note": {"type": ["string", "null"]},
        "detail": {"$ref": "#/$defs/detail"}
    },
    "$defs": {"detail": {"type": "object", "additionalProperties": false, "required": ["same_year"],
                         "properties": {"same_year": {"type": "boolean"}}}}
}"##;

fn verdict_schema() -> Value {
    serde_json::from_str(VERDICT_SCHEMA).expect("schema")
}

const LEFT: &str = "3f2504e0-4f89-41d3-9a0c-0305e82c3301";
const RIGHT: &str = "7c9e6679-7425-40de-944b-e07fc1f90ae7";

fn pair_prompt(n: usize) -> String {
    format!(
        "Record A ({LEFT}): Symphony No. {n} in D minor, recorded in Vienna.\nRecord B ({RIGHT}): Symphony no {n}, Wiener Philharmoniker live recording."
    )
}

fn assert_valid_verdict(obj: &Value) {
    let o = obj.as_object().expect("object");
    for key in [
        "verdict",
        "confidence",
        "rationale",
        "left_id",
        "score",
        "tags",
        "note",
        "detail",
    ] {
        assert!(o.contains_key(key), "missing {key} in {obj}");
    }
    assert_eq!(o.len(), 8, "no extra properties: {obj}");
    assert!(["match", "no_match", "unsure"].contains(&o["verdict"].as_str().expect("verdict str")));
    let c = o["confidence"].as_f64().expect("confidence number");
    assert!((0.0..=1.0).contains(&c), "confidence {c}");
    assert!(o["rationale"].as_str().expect("rationale").len() > 20);
    assert!([LEFT, RIGHT].contains(&o["left_id"].as_str().expect("left_id")));
    let score = o["score"].as_i64().expect("integer score");
    assert!((1..=5).contains(&score));
    let tags = o["tags"].as_array().expect("tags array");
    assert!((1..=3).contains(&tags.len()));
    assert!(
        tags.iter()
            .all(|t| ["title", "date", "place"].contains(&t.as_str().unwrap_or("?")))
    );
    assert!(o["note"].is_null() || o["note"].is_string());
    assert!(o["detail"]["same_year"].is_boolean(), "{obj}");
}

#[tokio::test]
async fn success_body_has_openai_wire_format() {
    let server = start(MockConfig::default()).await;
    let r = post(&client(), &server, &ask("Is the sky blue?")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert!(
        r.header("x-request-id")
            .is_some_and(|v| v.starts_with("req_"))
    );
    assert!(r.header("openai-processing-ms").is_some());
    assert!(
        r.header("x-ratelimit-limit-requests").is_none(),
        "no limits, no headers"
    );
    let v = r.json();
    assert!(
        v["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("chatcmpl-") && id.len() > 20)
    );
    assert_eq!(v["object"], "chat.completion");
    assert!(v["created"].as_u64().is_some_and(|t| t > 1_700_000_000));
    assert_eq!(v["model"], "gpt-4o-mini");
    assert_eq!(v["service_tier"], "default");
    assert_eq!(v["system_fingerprint"], "fp_mock");
    let choice = &v["choices"][0];
    assert_eq!(v["choices"].as_array().map(Vec::len), Some(1));
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["finish_reason"], "stop");
    assert!(choice["logprobs"].is_null());
    assert_eq!(choice["message"]["role"], "assistant");
    assert!(choice["message"]["refusal"].is_null());
    assert_eq!(choice["message"]["annotations"], json!([]));
    let u = &v["usage"];
    let (p, c) = (
        u["prompt_tokens"].as_u64().expect("p"),
        u["completion_tokens"].as_u64().expect("c"),
    );
    assert!(p >= 10 && c >= 5, "plausible token counts {p} {c}");
    assert_eq!(u["total_tokens"].as_u64(), Some(p + c));
    assert_eq!(
        u["prompt_tokens_details"],
        json!({"cached_tokens": 0, "audio_tokens": 0})
    );
    assert_eq!(u["completion_tokens_details"]["reasoning_tokens"], 0);
    assert_eq!(
        u["completion_tokens_details"]["rejected_prediction_tokens"],
        0
    );
    let s = server.stats();
    assert_eq!(
        (s.requests, s.ok, s.prompt_tokens, s.completion_tokens),
        (1, 1, p, c)
    );
    server.shutdown().await;
}

#[tokio::test]
async fn answers_are_deterministic_per_prompt() {
    let a = start(MockConfig::default()).await;
    let b = start(MockConfig {
        seed: 7,
        ..MockConfig::default()
    })
    .await;
    let http = client();
    let body = with_schema(&pair_prompt(9), verdict_schema());
    let first = post(&http, &a, &body).await;
    let again = post(&http, &a, &body).await;
    let other_server = post(&http, &b, &body).await;
    assert_eq!(first.content(), again.content());
    assert_eq!(
        first.content(),
        other_server.content(),
        "the seed is for faults, not answers"
    );
    let texts: HashSet<String> = {
        let mut set = HashSet::new();
        for n in 0..5 {
            set.insert(
                post(&http, &a, &ask(&format!("Question {n}: is it raining?")))
                    .await
                    .content(),
            );
        }
        set
    };
    assert_eq!(texts.len(), 5, "different prompts give different answers");
    let mut other_model = body.clone();
    other_model["model"] = json!("gpt-4o");
    assert_ne!(
        post(&http, &a, &other_model).await.content(),
        first.content()
    );
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn json_schema_answers_validate_and_keep_property_order() {
    let server = start(MockConfig::default()).await;
    let http = client();
    let mut left_ids = HashSet::new();
    for n in 0..40 {
        let prompt = serde_json::to_string(&pair_prompt(n)).expect("prompt");
        let body = format!(
            r#"{{"model":"gpt-4o-mini","messages":[{{"role":"user","content":{prompt}}}],"response_format":{{"type":"json_schema","json_schema":{{"name":"verdict","strict":true,"schema":{VERDICT_SCHEMA}}}}}}}"#
        );
        let r = post_raw(&http, &server, body).await;
        assert_eq!(r.status, StatusCode::OK);
        let content = r.content();
        assert!(
            !content.contains("\": ") && content.starts_with("{\"verdict\":"),
            "compact, in schema order: {content}"
        );
        let obj: Value = serde_json::from_str(&content).expect("content is JSON");
        assert_valid_verdict(&obj);
        left_ids.insert(obj["left_id"].as_str().unwrap_or_default().to_string());
        let pos = |k: &str| content.find(&format!("\"{k}\":")).expect("key present");
        assert!(pos("verdict") < pos("confidence") && pos("confidence") < pos("rationale"));
        assert!(pos("rationale") < pos("left_id") && pos("note") < pos("detail"));
    }
    assert_eq!(left_ids.len(), 2, "both UUIDs of the prompt get picked");
    server.shutdown().await;
}

#[tokio::test]
async fn confidence_spread_covers_all_routing_bands() {
    let server = start(MockConfig::default()).await;
    let http = client();
    let mut bands = [0usize; 3];
    for n in 0..300 {
        let mut body = ask(&format!("Item {n}: does the invoice match the order?"));
        body["response_format"] = json!({"type": "json_object"});
        let obj: Value =
            serde_json::from_str(&post(&http, &server, &body).await.content()).expect("json");
        assert!(["yes", "no"].contains(&obj["answer"].as_str().expect("answer")));
        assert!(obj["rationale"].is_string());
        let c = obj["confidence"].as_f64().expect("confidence");
        assert!((0.05..=0.99).contains(&c), "confidence {c}");
        bands[if c >= 0.85 {
            0
        } else if c >= 0.60 {
            1
        } else {
            2
        }] += 1;
    }
    assert!((110..=190).contains(&bands[0]), "high band ~50%: {bands:?}");
    assert!(
        (55..=125).contains(&bands[1]),
        "middle band ~30%: {bands:?}"
    );
    assert!((30..=95).contains(&bands[2]), "low band ~20%: {bands:?}");
    server.shutdown().await;
}

#[tokio::test]
async fn text_mode_has_verdict_confidence_and_uses_labels() {
    let server = start(MockConfig::default()).await;
    let http = client();
    let mut seen = HashSet::new();
    for n in 0..30 {
        let prompt =
            format!("Classify ticket {n}: printer on fire.\nLabels: hardware, software, network");
        let content = post(&http, &server, &ask(&prompt)).await.content();
        let lines: Vec<&str> = content.lines().collect();
        let verdict = lines
            .iter()
            .find_map(|l| l.strip_prefix("VERDICT: "))
            .expect("VERDICT line");
        assert!(
            ["hardware", "software", "network"].contains(&verdict),
            "{content}"
        );
        seen.insert(verdict.to_string());
        let conf = lines
            .last()
            .and_then(|l| l.strip_prefix("CONFIDENCE: "))
            .expect("CONFIDENCE last");
        assert_eq!(conf.len(), 4, "x.xx format: {conf}");
        assert!(conf.parse::<f64>().is_ok_and(|c| (0.0..=1.0).contains(&c)));
        assert!(
            lines[0].len() > 30,
            "a reasoning paragraph first: {content}"
        );
    }
    assert_eq!(seen.len(), 3, "all labels used across prompts");
    let plain = post(&http, &server, &ask("Is water wet?")).await.content();
    assert!(
        plain.contains("\nVERDICT: yes\n") || plain.contains("\nVERDICT: no\n"),
        "{plain}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn unauthorized_mode_returns_401_invalid_api_key() {
    let server = start(MockConfig {
        mode: "unauthorized".into(),
        ..MockConfig::default()
    })
    .await;
    let r = post(&client(), &server, &ask("hi")).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        r.json(),
        json!({"error": {"message": "Incorrect API key provided: sk-mock***. You can find your API key at https://platform.openai.com/account/api-keys.",
                         "type": "invalid_request_error", "param": null, "code": "invalid_api_key"}})
    );
    let s = server.stats();
    assert_eq!((s.requests, s.unauthorized, s.ok), (1, 1, 0));
    server.shutdown().await;
}

#[tokio::test]
async fn quota_mode_returns_429_insufficient_quota_without_retry() {
    let server = start(MockConfig {
        mode: "quota".into(),
        rpm_limit: 600,
        ..MockConfig::default()
    })
    .await;
    let r = post(&client(), &server, &ask("hi")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        r.json(),
        json!({"error": {"message": "You exceeded your current quota, please check your plan and billing details.",
                         "type": "insufficient_quota", "param": null, "code": "insufficient_quota"}})
    );
    assert_eq!(r.header("x-should-retry"), Some("false"));
    assert!(r.header("retry-after").is_none());
    assert_eq!(server.stats().quota, 1);
    server.shutdown().await;
}

#[tokio::test]
async fn rpm_limit_cuts_a_burst_at_one_seconds_worth() {
    let server = start(MockConfig {
        rpm_limit: 600,
        ..MockConfig::default()
    })
    .await;
    let http = client();
    let burst = Instant::now();
    let replies = futures::future::join_all((0..30).map(|n| {
        let (http, server) = (&http, &server);
        async move { post(http, server, &ask(&format!("burst {n}"))).await }
    }))
    .await;
    let ok: Vec<&Reply> = replies
        .iter()
        .filter(|r| r.status == StatusCode::OK)
        .collect();
    let limited: Vec<&Reply> = replies
        .iter()
        .filter(|r| r.status == StatusCode::TOO_MANY_REQUESTS)
        .collect();
    // 10 fit in the bucket; a slow machine may see a refill (10/s) during the burst.
    let refilled = (burst.elapsed().as_secs_f64() * 10.0).ceil() as usize;
    assert!(
        (10..=10 + refilled).contains(&ok.len()),
        "ok {} (burst took {:?})",
        ok.len(),
        burst.elapsed()
    );
    assert_eq!(ok.len() + limited.len(), 30);
    for r in &ok {
        assert_eq!(r.header("x-ratelimit-limit-requests"), Some("600"));
        let remaining: u64 = r
            .header("x-ratelimit-remaining-requests")
            .expect("remaining")
            .parse()
            .expect("int");
        assert!(remaining < 600);
        assert!(
            r.header("x-ratelimit-reset-requests")
                .is_some_and(|v| v.ends_with('s'))
        );
    }
    for r in &limited {
        let v = r.json();
        assert_eq!(v["error"]["type"], "requests");
        assert_eq!(v["error"]["code"], "rate_limit_exceeded");
        assert!(v["error"]["param"].is_null());
        let msg = v["error"]["message"].as_str().expect("message");
        assert!(
            msg.starts_with("Rate limit reached for gpt-4o-mini in organization org-mock on requests per min (RPM): Limit 600, Used "),
            "{msg}"
        );
        assert!(
            msg.contains("Requested 1. Please try again in ") && msg.ends_with("ms."),
            "{msg}"
        );
        let secs: u64 = r
            .header("retry-after")
            .expect("retry-after")
            .parse()
            .expect("int");
        assert_eq!(secs, 1);
        let ms: u64 = r
            .header("retry-after-ms")
            .expect("retry-after-ms")
            .parse()
            .expect("int");
        assert!((1..=100).contains(&ms), "retry-after-ms {ms}");
        assert_eq!(r.header("x-ratelimit-limit-requests"), Some("600"));
        // The bucket holds less than one request: scaled to the minute that is below 60.
        let remaining: u64 = r
            .header("x-ratelimit-remaining-requests")
            .expect("remaining")
            .parse()
            .expect("int");
        assert!(remaining < 60, "remaining {remaining}");
    }
    let s = server.stats();
    assert_eq!(
        (s.requests, s.ok as usize, s.rate_limited as usize),
        (30, ok.len(), limited.len())
    );
    // After the bucket refills, requests pass again.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        post(&http, &server, &ask("after")).await.status,
        StatusCode::OK
    );
    server.shutdown().await;
}

#[tokio::test]
async fn tpm_limit_counts_prompt_and_max_tokens() {
    // 6,000 TPM = 100-token bucket refilling 100/s; each request costs 20 prompt + 30 max_tokens.
    let server = start(MockConfig {
        tpm_limit: 6_000,
        ..MockConfig::default()
    })
    .await;
    let http = client();
    let mut statuses = Vec::new();
    for n in 0..4 {
        let mut body = ask(&format!("tokens {n}"));
        body["max_tokens"] = json!(30);
        statuses.push(post(&http, &server, &body).await);
    }
    let codes: Vec<u16> = statuses.iter().map(|r| r.status.as_u16()).collect();
    assert_eq!(codes, [200, 200, 429, 429]);
    let v = statuses[2].json();
    assert_eq!(v["error"]["type"], "tokens");
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("on tokens per min (TPM): Limit 6000, Used ") && msg.contains("Requested 50."),
        "{msg}"
    );
    assert_eq!(statuses[2].header("x-ratelimit-limit-tokens"), Some("6000"));
    assert!(statuses[2].header("x-ratelimit-reset-tokens").is_some());
    // A request larger than the whole minute can never pass.
    let mut huge = ask("huge");
    huge["max_completion_tokens"] = json!(7_000);
    let r = post(&http, &server, &huge).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("Request too large"))
    );
    server.shutdown().await;
}

async fn one_fault(config: MockConfig, body: &Value) -> (Reply, MockStats) {
    let server = start(config).await;
    let r = post(&client(), &server, body).await;
    let stats = server.stats();
    server.shutdown().await;
    (r, stats)
}

#[tokio::test]
async fn error_faults_produce_their_statuses() {
    let body = ask("fault please");
    let (r, s) = one_fault(
        MockConfig {
            fail_500: 1.0,
            ..MockConfig::default()
        },
        &body,
    )
    .await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(r.json()["error"]["type"], "server_error");
    assert_eq!(s.server_errors, 1);
    let (r, s) = one_fault(
        MockConfig {
            fail_503: 1.0,
            ..MockConfig::default()
        },
        &body,
    )
    .await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.json()["error"]["message"].is_string());
    assert_eq!(s.overloaded, 1);
    let (r, s) = one_fault(
        MockConfig {
            malformed: 1.0,
            ..MockConfig::default()
        },
        &body,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert!(
        serde_json::from_str::<Value>(&r.text).is_err(),
        "{}",
        r.text
    );
    assert!(r.text.starts_with("{\"id\":\"chatcmpl-"));
    assert_eq!(s.malformed, 1);
}

#[tokio::test]
async fn truncated_and_wrong_schema_damage_the_normal_answer() {
    let mut body = with_schema(&pair_prompt(3), verdict_schema());
    body["max_tokens"] = json!(50);
    let (normal, _) = one_fault(MockConfig::default(), &body).await;
    let full = normal.content();

    let (r, s) = one_fault(
        MockConfig {
            truncated: 1.0,
            ..MockConfig::default()
        },
        &body,
    )
    .await;
    let v = r.json();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 50);
    let cut = r.content();
    assert!(full.starts_with(&cut) && cut.len() < full.len() * 2 / 3 && cut.len() > full.len() / 3);
    assert!(serde_json::from_str::<Value>(&cut).is_err());
    assert_eq!(s.truncated, 1);

    let (r, s) = one_fault(
        MockConfig {
            wrong_schema: 1.0,
            ..MockConfig::default()
        },
        &body,
    )
    .await;
    assert_eq!(r.json()["choices"][0]["finish_reason"], "stop");
    let broken: Value = serde_json::from_str(&r.content()).expect("still JSON");
    let full: Value = serde_json::from_str(&full).expect("json");
    let (b, f) = (
        broken.as_object().expect("obj"),
        full.as_object().expect("obj"),
    );
    assert_eq!(b.len() + 1, f.len(), "exactly one required field dropped");
    assert!(b.iter().all(|(k, v)| f.get(k) == Some(v)));
    assert_eq!(s.wrong_schema, 1);

    let (r, _) = one_fault(
        MockConfig {
            wrong_schema: 1.0,
            ..MockConfig::default()
        },
        &ask("Is it?"),
    )
    .await;
    assert!(
        !r.content().contains("VERDICT"),
        "text mode drops the VERDICT line"
    );
}

#[tokio::test]
async fn hang_holds_until_the_client_gives_up_and_does_not_block_shutdown() {
    let server = start(MockConfig {
        hang: 1.0,
        ..MockConfig::default()
    })
    .await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .expect("client");
    let t = Instant::now();
    let err = http
        .post(format!("{}/chat/completions", server.base_url()))
        .json(&ask("hang"))
        .send()
        .await
        .expect_err("never answered");
    assert!(err.is_timeout(), "{err}");
    assert!(t.elapsed() >= Duration::from_millis(290));
    assert_eq!(server.stats().hangs, 1);
    assert_eq!(server.log()[0].outcome, "hang");
    // A second hang still in flight when we stop.
    let base = server.base_url();
    let pending = tokio::spawn(async move {
        let c = reqwest::Client::new();
        c.post(format!("{base}/chat/completions"))
            .json(&ask("hang 2"))
            .send()
            .await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t = Instant::now();
    server.shutdown().await;
    assert!(
        t.elapsed() < Duration::from_millis(1500),
        "shutdown took {:?}",
        t.elapsed()
    );
    let _ = tokio::time::timeout(Duration::from_secs(3), pending)
        .await
        .expect("hung client released");
}

#[tokio::test]
async fn latency_follows_the_configured_median() {
    let server = start(MockConfig {
        latency_median_ms: 80.0,
        ..MockConfig::default()
    })
    .await;
    let http = client();
    let t = Instant::now();
    let r = post(&http, &server, &ask("slow")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(
        t.elapsed() >= Duration::from_millis(80),
        "{:?}",
        t.elapsed()
    );
    let processing: u64 = r
        .header("openai-processing-ms")
        .expect("header")
        .parse()
        .expect("int");
    assert!(processing >= 80);
    server.shutdown().await;
}

#[tokio::test]
async fn stats_and_log_endpoints_reflect_requests() {
    let server = start(MockConfig::default()).await;
    let http = client();
    let base = server.base_url();
    for n in 0..3 {
        let resp = http
            .post(format!("{base}/chat/completions"))
            .header("X-Client-Request-Id", format!("item-{n}"))
            .json(&ask(&format!("question {n}")))
            .send()
            .await
            .expect("send");
        assert_eq!(resp.status(), StatusCode::OK);
    }
    let bad = http
        .post(format!("{base}/chat/completions"))
        .body("this is not json")
        .send()
        .await
        .expect("send");
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    let err: Value = bad.json().await.expect("error body");
    assert_eq!(err["error"]["type"], "invalid_request_error");
    assert!(err["error"]["param"].is_null() && err["error"]["code"].is_null());
    let no_messages = post(&http, &server, &json!({"model": "gpt-4o-mini"})).await;
    assert_eq!(no_messages.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        http.get(format!("{base}/models"))
            .send()
            .await
            .expect("models")
            .status(),
        200
    );

    let root = base.trim_end_matches("/v1");
    let stats: MockStats = http
        .get(format!("{root}/_mock/stats"))
        .send()
        .await
        .expect("stats")
        .json()
        .await
        .expect("json");
    assert_eq!(stats, server.stats());
    assert_eq!(
        (
            stats.requests,
            stats.ok,
            stats.bad_requests,
            stats.models_requests
        ),
        (5, 3, 2, 1)
    );
    let log: Vec<MockLogEntry> = http
        .get(format!("{root}/_mock/log"))
        .send()
        .await
        .expect("log")
        .json()
        .await
        .expect("json");
    assert_eq!(log, server.log());
    assert_eq!(log.len(), 5);
    let expected_sha = |prompt: &str| {
        let digest = Sha256::digest(format!("You adjudicate record pairs.{prompt}").as_bytes());
        digest
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    for (n, entry) in log.iter().take(3).enumerate() {
        assert_eq!(entry.seq, n as u64);
        assert_eq!(
            entry.client_request_id.as_deref(),
            Some(format!("item-{n}").as_str())
        );
        assert_eq!(entry.prompt_sha256, expected_sha(&format!("question {n}")));
        assert_eq!(
            (entry.model.as_str(), entry.status, entry.outcome.as_str()),
            ("gpt-4o-mini", 200, "ok")
        );
    }
    assert_eq!(
        (
            log[3].status,
            log[3].outcome.as_str(),
            log[3].client_request_id.as_deref()
        ),
        (400, "bad_request", None)
    );
    assert!(log.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));

    let reset = http
        .post(format!("{root}/_mock/reset"))
        .send()
        .await
        .expect("reset");
    assert_eq!(reset.status(), StatusCode::OK);
    assert_eq!(server.stats(), MockStats::default());
    assert!(server.log().is_empty());
    server.shutdown().await;
}

#[tokio::test]
async fn log_capacity_drops_oldest() {
    let server = start(MockConfig {
        log_capacity: 2,
        ..MockConfig::default()
    })
    .await;
    let http = client();
    for n in 0..5 {
        post(&http, &server, &ask(&format!("q{n}"))).await;
    }
    let seqs: Vec<u64> = server.log().iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [3, 4]);
    assert_eq!(server.stats().ok, 5);
    server.shutdown().await;
}

#[tokio::test]
async fn config_endpoint_changes_behaviour_live() {
    let server = start(MockConfig::default()).await;
    let http = client();
    let root = server.base_url().trim_end_matches("/v1").to_string();
    assert_eq!(post(&http, &server, &ask("a")).await.status, StatusCode::OK);

    let cfg = MockConfig {
        mode: "unauthorized".into(),
        ..MockConfig::default()
    };
    let resp = http
        .post(format!("{root}/_mock/config"))
        .json(&cfg)
        .send()
        .await
        .expect("config");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        post(&http, &server, &ask("a")).await.status,
        StatusCode::UNAUTHORIZED
    );

    // A partial config is filled with defaults; an invalid one is refused and changes nothing.
    let resp = http
        .post(format!("{root}/_mock/config"))
        .json(&json!({"fail_503": 1.0}))
        .send()
        .await
        .expect("config");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        post(&http, &server, &ask("a")).await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let resp = http
        .post(format!("{root}/_mock/config"))
        .json(&json!({"mode": "sideways"}))
        .send()
        .await
        .expect("config");
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let current: MockConfig = http
        .get(format!("{root}/_mock/config"))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert_eq!(current.fail_503, 1.0);

    // Limits resize live, and set_config works the same as the endpoint.
    server.set_config(MockConfig {
        rpm_limit: 120,
        ..MockConfig::default()
    });
    let codes: Vec<StatusCode> = {
        let mut v = Vec::new();
        for n in 0..4 {
            v.push(post(&http, &server, &ask(&format!("r{n}"))).await.status);
        }
        v
    };
    assert_eq!(
        codes,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    server.shutdown().await;
}

#[tokio::test]
async fn models_endpoint_lists_gpt_4o_mini() {
    let server = start(MockConfig::default()).await;
    let v: Value = client()
        .get(format!("{}/models", server.base_url()))
        .send()
        .await
        .expect("models")
        .json()
        .await
        .expect("json");
    assert_eq!(v["object"], "list");
    let data = v["data"].as_array().expect("data");
    assert!(data.iter().any(|m| m["id"] == "gpt-4o-mini"));
    assert!(data.iter().all(|m| m["object"] == "model"
        && m["owned_by"] == "docket-mock"
        && m["created"].is_u64()));
    assert_eq!(server.stats().models_requests, 1);
    let missing = client()
        .get(format!("{}/nope", server.base_url()))
        .send()
        .await
        .expect("404");
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    server.shutdown().await;
}

#[tokio::test]
async fn faults_are_drawn_by_seed_not_by_prompt_so_retries_can_succeed() {
    let server = start(MockConfig {
        fail_500: 0.5,
        seed: 1,
        ..MockConfig::default()
    })
    .await;
    let http = client();
    let body = ask("the same prompt every time");
    let mut codes = Vec::new();
    for _ in 0..40 {
        codes.push(post(&http, &server, &body).await.status.as_u16());
    }
    assert!(codes.contains(&200) && codes.contains(&500), "{codes:?}");
    // Same seed, same sequence.
    let again = start(MockConfig {
        fail_500: 0.5,
        seed: 1,
        ..MockConfig::default()
    })
    .await;
    let mut codes2 = Vec::new();
    for _ in 0..40 {
        codes2.push(post(&http, &again, &body).await.status.as_u16());
    }
    assert_eq!(codes, codes2);
    server.shutdown().await;
    again.shutdown().await;
}

#[tokio::test]
async fn invalid_config_is_refused_at_start() {
    let err = MockServer::start(
        MockConfig {
            fail_500: 1.5,
            ..MockConfig::default()
        },
        "127.0.0.1:0".parse().expect("addr"),
    )
    .await
    .err()
    .expect("refused");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
}

/// Throughput on loopback. Run in release: `cargo test --release --test mock_provider -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; run in release"]
async fn throughput_over_5000_per_second() {
    let server = start(MockConfig::default()).await;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()
        .expect("client");
    let url = format!("{}/chat/completions", server.base_url());
    let body = serde_json::to_vec(&ask("benchmark prompt with a few words in it")).expect("body");
    let total = 20_000usize;
    let workers = 64usize;
    let t = Instant::now();
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let (http, url, body) = (http.clone(), url.clone(), body.clone());
            tokio::spawn(async move {
                for _ in 0..total / workers {
                    let r = http
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(body.clone())
                        .send()
                        .await
                        .expect("send");
                    assert_eq!(r.status(), 200);
                    r.bytes().await.expect("body");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("worker");
    }
    let rate = (total / workers * workers) as f64 / t.elapsed().as_secs_f64();
    println!(
        "mock provider throughput: {rate:.0} requests/s (client and server on the same machine)"
    );
    assert!(rate > 5_000.0, "{rate:.0} req/s");
    server.shutdown().await;
}

// ---------------------------------------------------------------------------
// The other providers' synchronous routes: Anthropic, Gemini, Ollama, Azure
// OpenAI and OpenRouter, each in its own wire format, all through the same
// pipeline (limits, faults, modes, determinism, stats and log).
// ---------------------------------------------------------------------------

fn root(server: &MockServer) -> String {
    server.base_url().trim_end_matches("/v1").to_string()
}

async fn call(url: &str, headers: &[(&str, &str)], body: &Value) -> Reply {
    let mut req = client().post(url).json(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.expect("request");
    Reply {
        status: resp.status(),
        headers: resp.headers().clone(),
        text: resp.text().await.expect("body"),
    }
}

fn config(f: impl FnOnce(&mut MockConfig)) -> MockConfig {
    let mut c = MockConfig::default();
    f(&mut c);
    c
}

fn mode(m: &str) -> MockConfig {
    config(|c| c.mode = m.to_string())
}

/// rpm 60 = a bucket of one request per second: the second request of a burst is a 429.
fn one_per_second() -> MockConfig {
    config(|c| c.rpm_limit = 60)
}

fn keys(v: &Value) -> Vec<&str> {
    let mut k: Vec<&str> = v
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    k.sort_unstable();
    k
}

const ANTHROPIC_HEADERS: [(&str, &str); 2] = [
    ("x-api-key", "sk-ant-test"),
    ("anthropic-version", "2023-06-01"),
];

fn anthropic_body(system: &str, prompt: &str, max_tokens: u64) -> Value {
    json!({"model": "claude-haiku-4-5", "max_tokens": max_tokens, "system": system,
           "messages": [{"role": "user", "content": [{"type": "text", "text": prompt}]}],
           "temperature": 0})
}

fn schema_system() -> String {
    format!(
        "You adjudicate record pairs. Answer with JSON valid against this JSON Schema:\n{VERDICT_SCHEMA}"
    )
}

#[tokio::test]
async fn anthropic_messages_success_shape_determinism_and_answer_rule() {
    let server = start(MockConfig::default()).await;
    let url = format!("{}/v1/messages", root(&server));
    let body = anthropic_body(&schema_system(), &pair_prompt(9), 512);
    let r = call(&url, &ANTHROPIC_HEADERS, &body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(
        r.header("request-id")
            .is_some_and(|v| v.starts_with("req_"))
    );
    let v = r.json();
    assert_eq!(
        keys(&v),
        [
            "content",
            "id",
            "model",
            "role",
            "stop_reason",
            "stop_sequence",
            "type",
            "usage"
        ]
    );
    assert!(
        v["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("msg_") && id.len() > 20)
    );
    assert_eq!(
        (v["type"].as_str(), v["role"].as_str()),
        (Some("message"), Some("assistant"))
    );
    assert_eq!(v["model"], "claude-haiku-4-5");
    assert_eq!(v["stop_reason"], "end_turn");
    assert!(v["stop_sequence"].is_null());
    let content = v["content"].as_array().expect("content blocks");
    assert_eq!(content.len(), 1);
    assert_eq!(keys(&content[0]), ["text", "type"]);
    assert_eq!(content[0]["type"], "text");
    let text = content[0]["text"].as_str().expect("text");
    // The schema written in the system prompt is followed, in schema order.
    assert_valid_verdict(&serde_json::from_str(text).expect("JSON answer"));
    assert!(text.starts_with("{\"verdict\":"), "{text}");
    let u = &v["usage"];
    for k in [
        "input_tokens",
        "output_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
    ] {
        assert!(u[k].as_u64().is_some(), "usage.{k} in {u}");
    }
    assert!(u["input_tokens"].as_u64() > Some(50) && u["output_tokens"].as_u64() > Some(5));
    assert_eq!(
        (
            u["cache_creation_input_tokens"].as_u64(),
            u["cache_read_input_tokens"].as_u64()
        ),
        (Some(0), Some(0))
    );

    // Same prompt, same answer.
    let again = call(&url, &ANTHROPIC_HEADERS, &body).await.json();
    assert_eq!(again["content"], v["content"]);
    assert_ne!(again["id"], v["id"]);

    // output_config.format wins over the prompt; "JSON" without a schema gives the
    // default object; neither gives the VERDICT/CONFIDENCE text.
    let mut explicit = anthropic_body("Decide.", &pair_prompt(9), 512);
    // The structured-outputs subset: no numeric limits (the score's become
    // an enum; `confidence` is 0..1 by the mock's default).
    let mut fitted = verdict_schema();
    let props = &mut fitted["properties"];
    props["confidence"] = json!({"type": "number"});
    props["score"] = json!({"type": "integer", "enum": [1, 2, 3, 4, 5]});
    explicit["output_config"] = json!({"format": {"type": "json_schema", "schema": fitted}});
    let t = call(&url, &ANTHROPIC_HEADERS, &explicit).await.json()["content"][0]["text"]
        .as_str()
        .map(str::to_string);
    assert_valid_verdict(&serde_json::from_str(&t.expect("text")).expect("JSON"));
    let plain_json = call(
        &url,
        &ANTHROPIC_HEADERS,
        &anthropic_body("Reply in JSON.", "Is Paris in France?", 64),
    )
    .await
    .json();
    let obj: Value = serde_json::from_str(plain_json["content"][0]["text"].as_str().expect("text"))
        .expect("JSON");
    assert_eq!(keys(&obj), ["answer", "confidence", "rationale"]);
    let text_mode = call(
        &url,
        &ANTHROPIC_HEADERS,
        &anthropic_body("Labels: same, different", "Two records.", 64),
    )
    .await
    .json();
    let t = text_mode["content"][0]["text"].as_str().expect("text");
    assert!(
        t.lines()
            .any(|l| l == "VERDICT: same" || l == "VERDICT: different"),
        "{t}"
    );
    assert!(t.lines().any(|l| l.starts_with("CONFIDENCE: ")), "{t}");

    // Headers and body the API requires.
    let no_key = call(&url, &ANTHROPIC_HEADERS[1..], &body).await;
    assert_eq!(no_key.status, StatusCode::UNAUTHORIZED);
    assert_eq!(no_key.json()["error"]["type"], "authentication_error");
    let no_version = call(&url, &ANTHROPIC_HEADERS[..1], &body).await;
    assert_eq!(no_version.status, StatusCode::BAD_REQUEST);
    assert_eq!(no_version.json()["error"]["type"], "invalid_request_error");
    let no_max = call(
        &url,
        &ANTHROPIC_HEADERS,
        &json!({"model": "claude-haiku-4-5", "messages": [{"role": "user", "content": "x"}]}),
    )
    .await;
    assert_eq!(no_max.status, StatusCode::BAD_REQUEST);
    let e = no_max.json();
    assert_eq!(e["type"], "error");
    assert!(
        e["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("max_tokens"))
    );
    assert!(
        e["request_id"]
            .as_str()
            .is_some_and(|id| id.starts_with("req_"))
    );
    server.shutdown().await;
}

#[tokio::test]
async fn anthropic_truncation_rate_limit_overload_and_modes() {
    let body = anthropic_body("Decide.", "Is the sky blue? Explain at length.", 7);
    // truncated fault → stop_reason max_tokens, output_tokens = max_tokens
    let server = start(config(|c| c.truncated = 1.0)).await;
    let url = format!("{}/v1/messages", root(&server));
    let v = call(&url, &ANTHROPIC_HEADERS, &body).await.json();
    assert_eq!(v["stop_reason"], "max_tokens");
    assert_eq!(v["usage"]["output_tokens"], 7);
    assert_eq!(server.stats().truncated, 1);

    // 429 rate_limit_error with retry-after and anthropic-ratelimit-* (RFC 3339 reset)
    server.set_config(one_per_second());
    let ok = call(&url, &ANTHROPIC_HEADERS, &body).await;
    assert_eq!(ok.status, StatusCode::OK);
    assert_eq!(ok.header("anthropic-ratelimit-requests-limit"), Some("60"));
    let limited = call(&url, &ANTHROPIC_HEADERS, &body).await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    let e = limited.json();
    assert_eq!(keys(&e), ["error", "request_id", "type"]);
    assert_eq!(
        (e["type"].as_str(), e["error"]["type"].as_str()),
        (Some("error"), Some("rate_limit_error"))
    );
    assert!(
        e["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("rate limit"))
    );
    let secs: u64 = limited
        .header("retry-after")
        .expect("retry-after")
        .parse()
        .expect("seconds");
    assert!((1..=2).contains(&secs));
    assert_eq!(
        limited.header("anthropic-ratelimit-requests-limit"),
        Some("60")
    );
    let remaining: u64 = limited
        .header("anthropic-ratelimit-requests-remaining")
        .expect("remaining")
        .parse()
        .expect("number");
    assert!(remaining < 30, "bucket nearly empty: {remaining}");
    let reset = limited
        .header("anthropic-ratelimit-requests-reset")
        .expect("reset");
    let at = chrono::DateTime::parse_from_rfc3339(reset).expect("RFC 3339");
    assert!(reset.ends_with('Z'), "{reset}");
    let ahead = at.timestamp_millis() - chrono::Utc::now().timestamp_millis();
    assert!(
        (-100..=2_100).contains(&ahead),
        "reset {reset} is {ahead} ms ahead"
    );

    // fail-503 → 529 overloaded_error; fail-500 → 500 api_error
    server.set_config(config(|c| c.fail_503 = 1.0));
    let over = call(&url, &ANTHROPIC_HEADERS, &body).await;
    assert_eq!(over.status.as_u16(), 529);
    assert_eq!(over.json()["error"]["type"], "overloaded_error");
    server.set_config(config(|c| c.fail_500 = 1.0));
    let err = call(&url, &ANTHROPIC_HEADERS, &body).await;
    assert_eq!(err.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(err.json()["error"]["type"], "api_error");

    // unauthorized → 401 authentication_error; quota → 400 credit balance
    server.set_config(mode("unauthorized"));
    let unauth = call(&url, &ANTHROPIC_HEADERS, &body).await;
    assert_eq!(unauth.status, StatusCode::UNAUTHORIZED);
    assert_eq!(unauth.json()["error"]["type"], "authentication_error");
    server.set_config(mode("quota"));
    let quota = call(&url, &ANTHROPIC_HEADERS, &body).await;
    assert_eq!(quota.status, StatusCode::BAD_REQUEST);
    let q = quota.json();
    assert_eq!(q["error"]["type"], "invalid_request_error");
    assert_eq!(
        q["error"]["message"],
        "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."
    );
    let s = server.stats();
    assert_eq!(
        (
            s.rate_limited,
            s.overloaded,
            s.server_errors,
            s.unauthorized,
            s.quota
        ),
        (1, 1, 1, 1, 1)
    );
    server.shutdown().await;
}

const GEMINI_KEY: [(&str, &str); 1] = [("x-goog-api-key", "AIza-test")];

fn gemini_body(prompt: &str) -> Value {
    json!({"systemInstruction": {"parts": [{"text": "You adjudicate record pairs."}]},
           "contents": [{"role": "user", "parts": [{"text": prompt}]}],
           // Thinking off: the whole maxOutputTokens is the answer's.
           "generationConfig": {"maxOutputTokens": 400, "temperature": 0,
                                "thinkingConfig": {"thinkingBudget": 0},
                                "responseMimeType": "application/json",
                                "responseJsonSchema": verdict_schema()}})
}

#[tokio::test]
async fn gemini_generate_content_success_shape_and_determinism() {
    let server = start(MockConfig::default()).await;
    let url = format!(
        "{}/v1beta/models/gemini-2.5-flash:generateContent",
        root(&server)
    );
    let body = gemini_body(&pair_prompt(3));
    let r = call(&url, &GEMINI_KEY, &body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let v = r.json();
    assert_eq!(
        keys(&v),
        ["candidates", "modelVersion", "responseId", "usageMetadata"]
    );
    let cands = v["candidates"].as_array().expect("candidates");
    assert_eq!(cands.len(), 1);
    let c = &cands[0];
    assert_eq!(keys(c), ["content", "finishReason", "index"]);
    assert_eq!(
        (c["finishReason"].as_str(), c["index"].as_u64()),
        (Some("STOP"), Some(0))
    );
    assert_eq!(c["content"]["role"], "model");
    let parts = c["content"]["parts"].as_array().expect("parts");
    assert_eq!(parts.len(), 1);
    let text = parts[0]["text"].as_str().expect("text");
    assert_valid_verdict(&serde_json::from_str(text).expect("JSON"));
    let u = &v["usageMetadata"];
    let (p, k) = (
        u["promptTokenCount"].as_u64().expect("p"),
        u["candidatesTokenCount"].as_u64().expect("c"),
    );
    assert!(p > 10 && k > 5);
    assert_eq!(u["totalTokenCount"].as_u64(), Some(p + k));
    assert_eq!(v["modelVersion"], "gemini-2.5-flash");
    assert!(v["responseId"].as_str().is_some_and(|id| !id.is_empty()));
    let again = call(&url, &GEMINI_KEY, &body).await.json();
    assert_eq!(again["candidates"], v["candidates"]);

    // responseSchema (OpenAPI subset, upper-case types) is followed too.
    let openapi = json!({"contents": [{"parts": [{"text": "Same work?"}]}],
        "generationConfig": {"responseMimeType": "application/json", "responseSchema": {
            "type": "OBJECT", "required": ["verdict", "score"], "propertyOrdering": ["verdict", "score"],
            "properties": {"verdict": {"type": "STRING", "enum": ["match", "no_match"]},
                           "score": {"type": "INTEGER", "minimum": 1, "maximum": 3}}}}});
    let o = call(&url, &GEMINI_KEY, &openapi).await.json();
    let obj: Value = serde_json::from_str(
        o["candidates"][0]["content"]["parts"][0]["text"]
            .as_str()
            .expect("text"),
    )
    .expect("JSON");
    assert!(["match", "no_match"].contains(&obj["verdict"].as_str().expect("verdict")));
    assert!(obj["score"].as_i64().is_some_and(|s| (1..=3).contains(&s)));

    // The key never goes in the URL; without the header the call is refused.
    let in_url = call(&format!("{url}?key=AIza-test"), &GEMINI_KEY, &body).await;
    assert_eq!(in_url.status, StatusCode::BAD_REQUEST);
    let e = in_url.json();
    assert_eq!(e["error"]["code"], 400);
    assert_eq!(e["error"]["status"], "INVALID_ARGUMENT");
    assert_eq!(
        e["error"]["message"],
        "API key in URL is not accepted by this mock: send x-goog-api-key"
    );
    let no_key = call(&url, &[], &body).await;
    assert_eq!(no_key.status, StatusCode::FORBIDDEN);
    assert_eq!(no_key.json()["error"]["status"], "PERMISSION_DENIED");
    let empty = call(&url, &GEMINI_KEY, &json!({"contents": []})).await;
    assert_eq!(empty.status, StatusCode::BAD_REQUEST);
    server.shutdown().await;
}

fn gemini_detail<'a>(err: &'a Value, kind: &str) -> Option<&'a Value> {
    err["error"]["details"]
        .as_array()?
        .iter()
        .find(|d| d["@type"] == format!("type.googleapis.com/google.rpc.{kind}"))
}

#[tokio::test]
async fn gemini_truncation_rate_limit_overload_and_modes() {
    let server = start(config(|c| c.truncated = 1.0)).await;
    let url = format!(
        "{}/v1beta/models/gemini-2.5-flash:generateContent",
        root(&server)
    );
    let mut body = gemini_body(&pair_prompt(4));
    body["generationConfig"]["maxOutputTokens"] = json!(9);
    let v = call(&url, &GEMINI_KEY, &body).await.json();
    assert_eq!(v["candidates"][0]["finishReason"], "MAX_TOKENS");
    assert_eq!(v["usageMetadata"]["candidatesTokenCount"], 9);

    server.set_config(one_per_second());
    assert_eq!(call(&url, &GEMINI_KEY, &body).await.status, StatusCode::OK);
    let limited = call(&url, &GEMINI_KEY, &body).await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    let e = limited.json();
    assert_eq!(keys(&e["error"]), ["code", "details", "message", "status"]);
    assert_eq!(
        (e["error"]["code"].as_u64(), e["error"]["status"].as_str()),
        (Some(429), Some("RESOURCE_EXHAUSTED"))
    );
    let retry = gemini_detail(&e, "RetryInfo").expect("RetryInfo detail");
    let delay = retry["retryDelay"].as_str().expect("retryDelay");
    let secs: f64 = delay
        .strip_suffix('s')
        .expect("ends in s")
        .parse()
        .expect("number");
    assert!(secs > 0.0 && secs <= 1.0, "{delay}");
    let quota_id =
        gemini_detail(&e, "QuotaFailure").expect("QuotaFailure")["violations"][0]["quotaId"]
            .as_str()
            .unwrap_or("");
    assert!(quota_id.contains("PerMinute"), "{quota_id}");

    server.set_config(config(|c| c.fail_503 = 1.0));
    let over = call(&url, &GEMINI_KEY, &body).await;
    assert_eq!(over.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(over.json()["error"]["status"], "UNAVAILABLE");

    server.set_config(mode("unauthorized"));
    let unauth = call(&url, &GEMINI_KEY, &body).await;
    assert_eq!(unauth.status, StatusCode::FORBIDDEN);
    assert_eq!(
        (
            unauth.json()["error"]["code"].as_u64(),
            unauth.json()["error"]["status"].as_str()
        ),
        (Some(403), Some("PERMISSION_DENIED"))
    );

    server.set_config(mode("quota"));
    let quota = call(&url, &GEMINI_KEY, &body).await;
    assert_eq!(quota.status, StatusCode::TOO_MANY_REQUESTS);
    let q = quota.json();
    assert_eq!(q["error"]["status"], "RESOURCE_EXHAUSTED");
    let msg = q["error"]["message"].as_str().expect("message");
    assert!(
        msg.contains("exceeded your current quota") && msg.contains("billing"),
        "{msg}"
    );
    assert!(
        gemini_detail(&q, "RetryInfo").is_none(),
        "a daily quota gives no retry delay"
    );
    let quota_id =
        gemini_detail(&q, "QuotaFailure").expect("QuotaFailure")["violations"][0]["quotaId"]
            .as_str()
            .unwrap_or("");
    assert!(quota_id.contains("PerDay"), "{quota_id}");
    server.shutdown().await;
}

fn ollama_body(prompt: &str, stream: Option<bool>) -> Value {
    let mut b = json!({"model": "llama3.2", "messages": [
        {"role": "system", "content": "You adjudicate record pairs."},
        {"role": "user", "content": prompt}],
        "format": verdict_schema(), "options": {"num_predict": 300, "temperature": 0}});
    if let Some(s) = stream {
        b["stream"] = json!(s);
    }
    b
}

#[tokio::test]
async fn ollama_chat_success_shape_stream_and_determinism() {
    let server = start(MockConfig::default()).await;
    let url = format!("{}/api/chat", root(&server));
    let body = ollama_body(&pair_prompt(5), Some(false));
    let r = call(&url, &[], &body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let v = r.json();
    assert_eq!(
        keys(&v),
        [
            "created_at",
            "done",
            "done_reason",
            "eval_count",
            "eval_duration",
            "load_duration",
            "message",
            "model",
            "prompt_eval_count",
            "prompt_eval_duration",
            "total_duration"
        ]
    );
    assert_eq!(v["model"], "llama3.2");
    chrono::DateTime::parse_from_rfc3339(v["created_at"].as_str().expect("created_at"))
        .expect("RFC 3339");
    assert_eq!(
        (v["done"].as_bool(), v["done_reason"].as_str()),
        (Some(true), Some("stop"))
    );
    assert_eq!(keys(&v["message"]), ["content", "role"]);
    assert_eq!(v["message"]["role"], "assistant");
    let content = v["message"]["content"]
        .as_str()
        .expect("content")
        .to_string();
    assert_valid_verdict(&serde_json::from_str(&content).expect("JSON"));
    assert!(v["prompt_eval_count"].as_u64() > Some(10) && v["eval_count"].as_u64() > Some(5));
    assert!(v["total_duration"].as_u64() > Some(0));
    assert_eq!(call(&url, &[], &body).await.json()["message"], v["message"]);

    // stream absent (Ollama's default is true): NDJSON chunks, then a done line.
    let s = call(&url, &[], &ollama_body(&pair_prompt(5), None)).await;
    assert_eq!(s.status, StatusCode::OK);
    assert_eq!(s.header("content-type"), Some("application/x-ndjson"));
    let lines: Vec<Value> = s
        .text
        .lines()
        .map(|l| serde_json::from_str(l).expect("NDJSON line"))
        .collect();
    assert!(lines.len() >= 3);
    let (last, chunks) = lines.split_last().expect("lines");
    assert!(
        chunks
            .iter()
            .all(|c| c["done"] == false && c.get("done_reason").is_none())
    );
    assert_eq!(
        (last["done"].as_bool(), last["done_reason"].as_str()),
        (Some(true), Some("stop"))
    );
    assert_eq!(last["eval_count"], v["eval_count"]);
    let joined: String = chunks
        .iter()
        .map(|c| c["message"]["content"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(joined, content);

    let no_model = call(
        &url,
        &[],
        &json!({"messages": [{"role": "user", "content": "x"}], "stream": false}),
    )
    .await;
    assert_eq!(no_model.status, StatusCode::BAD_REQUEST);
    assert!(no_model.json()["error"].is_string());
    server.shutdown().await;
}

#[tokio::test]
async fn ollama_truncation_rate_limit_overload_and_modes() {
    let server = start(config(|c| c.truncated = 1.0)).await;
    let url = format!("{}/api/chat", root(&server));
    let mut body = ollama_body(&pair_prompt(6), Some(false));
    body["options"]["num_predict"] = json!(11);
    let v = call(&url, &[], &body).await.json();
    assert_eq!(
        (v["done_reason"].as_str(), v["eval_count"].as_u64()),
        (Some("length"), Some(11))
    );

    server.set_config(one_per_second());
    assert_eq!(call(&url, &[], &body).await.status, StatusCode::OK);
    let limited = call(&url, &[], &body).await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    let e = limited.json();
    assert_eq!(keys(&e), ["error"]);
    assert!(e["error"].as_str().is_some_and(|m| m.contains("retry in")));
    assert!(limited.header("retry-after").is_some());

    for (cfg, status) in [
        (
            config(|c| c.fail_503 = 1.0),
            StatusCode::SERVICE_UNAVAILABLE,
        ),
        (mode("unauthorized"), StatusCode::UNAUTHORIZED),
        (mode("quota"), StatusCode::TOO_MANY_REQUESTS),
    ] {
        server.set_config(cfg);
        let r = call(&url, &[], &body).await;
        assert_eq!(r.status, status, "{}", r.text);
        let e = r.json();
        assert_eq!(keys(&e), ["error"]);
        assert!(e["error"].as_str().is_some_and(|m| !m.is_empty()));
    }
    let s = server.stats();
    assert_eq!(
        (
            s.truncated,
            s.rate_limited,
            s.overloaded,
            s.unauthorized,
            s.quota
        ),
        (1, 1, 1, 1, 1)
    );
    server.shutdown().await;
}

const AZURE_KEY: [(&str, &str); 1] = [("api-key", "azure-test-key")];

#[tokio::test]
async fn azure_openai_routes_by_deployment_and_needs_key_and_api_version() {
    let server = start(MockConfig::default()).await;
    let base = format!(
        "{}/openai/deployments/my-gpt4o/chat/completions",
        root(&server)
    );
    let url = format!("{base}?api-version=2024-10-21");
    let body = ask("Is the sky blue?");
    let r = call(&url, &AZURE_KEY, &body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert!(
        v["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("chatcmpl-"))
    );
    assert_eq!(v["model"], "my-gpt4o", "the deployment names the model");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert!(v["usage"]["total_tokens"].as_u64() > Some(0));
    assert!(r.header("x-request-id").is_some());
    assert_eq!(call(&url, &AZURE_KEY, &body).await.content(), r.content());

    let no_version = call(&base, &AZURE_KEY, &body).await;
    assert_eq!(no_version.status, StatusCode::BAD_REQUEST);
    assert!(
        no_version.json()["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("api-version"))
    );
    let no_key = call(&url, &[], &body).await;
    assert_eq!(no_key.status, StatusCode::UNAUTHORIZED);
    assert_eq!(no_key.json()["error"]["code"], "401");

    server.set_config(config(|c| c.truncated = 1.0));
    let mut capped = body.clone();
    capped["max_tokens"] = json!(5);
    let t = call(&url, &AZURE_KEY, &capped).await.json();
    assert_eq!(
        (
            t["choices"][0]["finish_reason"].as_str(),
            t["usage"]["completion_tokens"].as_u64()
        ),
        (Some("length"), Some(5))
    );

    server.set_config(one_per_second());
    assert_eq!(call(&url, &AZURE_KEY, &body).await.status, StatusCode::OK);
    let limited = call(&url, &AZURE_KEY, &body).await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    let e = limited.json();
    assert_eq!(e["error"]["code"], "429");
    let secs: u64 = limited
        .header("retry-after")
        .expect("retry-after")
        .parse()
        .expect("secs");
    assert!(
        e["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(&format!("Please retry after {secs} second")))
    );
    assert!(limited.header("retry-after-ms").is_some());
    let remaining: u64 = limited
        .header("x-ratelimit-remaining-requests")
        .expect("remaining")
        .parse()
        .expect("number");
    assert!(remaining < 30, "bucket nearly empty: {remaining}");

    server.set_config(mode("unauthorized"));
    assert_eq!(
        call(&url, &AZURE_KEY, &body).await.status,
        StatusCode::UNAUTHORIZED
    );
    server.set_config(mode("quota"));
    let q = call(&url, &AZURE_KEY, &body).await;
    assert_eq!(q.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(q.json()["error"]["code"], "insufficient_quota");
    server.shutdown().await;
}

const OPENROUTER_KEY: [(&str, &str); 1] = [("authorization", "Bearer sk-or-v1-test")];

#[tokio::test]
async fn openrouter_openai_format_with_credits_and_numeric_error_codes() {
    let server = start(MockConfig::default()).await;
    let url = format!("{}/api/v1/chat/completions", root(&server));
    let mut body = ask("Is the sky blue?");
    body["model"] = json!("anthropic/claude-sonnet-4.5");
    let r = call(&url, &OPENROUTER_KEY, &body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let v = r.json();
    assert!(v["id"].as_str().is_some_and(|id| id.starts_with("gen-")));
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "anthropic/claude-sonnet-4.5");
    assert!(v["provider"].is_string());
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["choices"][0]["native_finish_reason"], "stop");
    assert!(v["usage"]["cost"].as_f64().is_some_and(|c| c > 0.0));
    assert_eq!(
        call(&url, &OPENROUTER_KEY, &body).await.content(),
        r.content()
    );

    let no_key = call(&url, &[], &body).await;
    assert_eq!(no_key.status, StatusCode::UNAUTHORIZED);
    assert_eq!(no_key.json()["error"]["code"], 401);

    server.set_config(config(|c| c.truncated = 1.0));
    let t = call(&url, &OPENROUTER_KEY, &body).await.json();
    assert_eq!(t["choices"][0]["finish_reason"], "length");

    server.set_config(one_per_second());
    assert_eq!(
        call(&url, &OPENROUTER_KEY, &body).await.status,
        StatusCode::OK
    );
    let limited = call(&url, &OPENROUTER_KEY, &body).await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limited.json()["error"]["code"], 429);
    assert!(limited.header("retry-after").is_some());

    server.set_config(mode("unauthorized"));
    let unauth = call(&url, &OPENROUTER_KEY, &body).await;
    assert_eq!(
        (unauth.status, unauth.json()["error"]["code"].as_u64()),
        (StatusCode::UNAUTHORIZED, Some(401))
    );
    server.set_config(mode("quota"));
    let quota = call(&url, &OPENROUTER_KEY, &body).await;
    assert_eq!(quota.status, StatusCode::PAYMENT_REQUIRED);
    let q = quota.json();
    assert_eq!(q["error"]["code"], 402);
    assert!(
        q["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("Insufficient credits"))
    );
    server.shutdown().await;
}

/// (url, headers, body)
type Call<'a> = (String, &'a [(&'a str, &'a str)], Value);

#[tokio::test]
async fn log_names_the_route_of_every_request() {
    let server = start(MockConfig::default()).await;
    let r = root(&server);
    let calls: [Call; 6] = [
        (format!("{r}/v1/chat/completions"), &[], ask("one")),
        (
            format!("{r}/openai/deployments/dep-1/chat/completions?api-version=2024-10-21"),
            &AZURE_KEY,
            ask("two"),
        ),
        (
            format!("{r}/api/v1/chat/completions"),
            &OPENROUTER_KEY,
            ask("three"),
        ),
        (
            format!("{r}/v1/messages"),
            &ANTHROPIC_HEADERS,
            anthropic_body("Decide.", "four", 64),
        ),
        (
            format!("{r}/v1beta/models/gemini-2.5-flash:generateContent"),
            &GEMINI_KEY,
            gemini_body("five"),
        ),
        (
            format!("{r}/api/chat"),
            &[],
            ollama_body("six", Some(false)),
        ),
    ];
    for (url, headers, body) in &calls {
        let reply = call(url, headers, body).await;
        assert_eq!(reply.status, StatusCode::OK, "{url}: {}", reply.text);
    }
    let log: Vec<MockLogEntry> = client()
        .get(format!("{r}/_mock/log"))
        .send()
        .await
        .expect("log")
        .json()
        .await
        .expect("json");
    let seen: Vec<(&str, &str, &str)> = log
        .iter()
        .map(|e| (e.provider.as_str(), e.route.as_str(), e.model.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            ("openai", "/v1/chat/completions", "gpt-4o-mini"),
            (
                "azure",
                "/openai/deployments/{deployment}/chat/completions",
                "dep-1"
            ),
            ("openrouter", "/api/v1/chat/completions", "gpt-4o-mini"),
            ("anthropic", "/v1/messages", "claude-haiku-4-5"),
            (
                "gemini",
                "/v1beta/models/{model}:generateContent",
                "gemini-2.5-flash"
            ),
            ("ollama", "/api/chat", "llama3.2"),
        ]
    );
    assert!(log.iter().all(|e| e.status == 200 && e.outcome == "ok"));
    let s = server.stats();
    assert_eq!((s.requests, s.ok), (6, 6));
    server.shutdown().await;
}
