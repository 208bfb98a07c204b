//! The Anthropic batch adapter's unit tests: bodies, states, results, find.

use super::find::ListPage;
use super::poll::unix_of;
use super::results::same_origin;
use super::*;
use std::collections::HashSet;

use serde_json::Value;

use crate::batch::ResultLine;
use crate::batch::results::Matcher;
use crate::batch::{BatchCounts, BatchStatus, LineOutcome, ResultsSummary};
use crate::{ChatRequest, ErrorClass, FinishReason};

fn adapter() -> AnthropicBatch {
    AnthropicBatch::new(
        "https://api.anthropic.com/v1/",
        ApiKey::new("sk-ant-canary-unit"),
    )
    .unwrap()
}

fn line(id: &str) -> BatchLine {
    BatchLine {
        custom_id: id.into(),
        request: ChatRequest {
            model: "claude-haiku-4-5".into(),
            system: None,
            user: "…".into(),
            max_tokens: 256,
            temperature: None,
            response_schema: None,
            structured_output: Default::default(),
            thinking_budget: None,
            client_request_id: id.into(),
            timeout: Duration::from_secs(5),
            body: None,
        },
    }
}

// The reference's MessageBatch example, with `extra` fields replaced.
fn batch(extra: Value) -> BatchStatus {
    let mut v = json!({
      "id": "msgbatch_013Zva2CMHLNnXjNJJKqJ2EF", "type": "message_batch",
      "processing_status": "in_progress",
      "request_counts": {"processing": 2, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0},
      "created_at": "2024-09-24T18:37:24.100435Z",
      "expires_at": "2024-09-25T18:37:24.100435Z",
      "ended_at": null, "cancel_initiated_at": null, "archived_at": null,
      "results_url": null
    });
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    adapter()
        .status_of(serde_json::from_value(v).unwrap())
        .unwrap()
}

#[test]
fn the_create_body_is_the_references_example() {
    let b = adapter();
    let v: Value = serde_json::from_slice(&b.encode_line(&line("item-000123")).unwrap()).unwrap();
    assert_eq!(
        v,
        json!({"custom_id": "item-000123",
               "params": {"model": "claude-haiku-4-5", "max_tokens": 256,
                          "messages": [{"role": "user", "content": "…"}]}})
    );
    // The params are the sync body: a schema goes as `output_config.format`
    // on a model that takes it, exactly as a synchronous request.
    let mut with_schema = line("item-000124");
    with_schema.request.response_schema = Some(std::sync::Arc::new((
        "verdict".into(),
        json!({"type": "object", "properties": {"c": {"type": "number", "maximum": 1}}}),
    )));
    let v: Value = serde_json::from_slice(&b.encode_line(&with_schema).unwrap()).unwrap();
    assert_eq!(
        v["params"]["output_config"]["format"]["schema"],
        json!({"type": "object", "properties": {"c": {"type": "number"}}, "additionalProperties": false})
    );
    assert_eq!(
        v["params"],
        crate::anthropic::request_body(&with_schema.request)
    );
    assert_eq!(b.url(""), "https://api.anthropic.com/v1/messages/batches");
    assert_eq!(
        b.batch_url("msgbatch_1", "/cancel"),
        "https://api.anthropic.com/v1/messages/batches/msgbatch_1/cancel"
    );
    assert_eq!(b.limits().max_requests, 100_000);
    // A whole batch at the byte limit still fits 256 MB with its envelope.
    assert!(b.limits().max_bytes + 14 <= 256_000_000);
}

#[test]
fn processing_status_maps_to_states() {
    let s = batch(json!({}));
    assert_eq!(s.state, BatchState::InProgress);
    assert_eq!(
        s.counts,
        BatchCounts {
            total: 2,
            completed: 0,
            failed: 0
        }
    );
    assert!(!s.results_pending);
    assert_eq!(s.provider_batch_id, "msgbatch_013Zva2CMHLNnXjNJJKqJ2EF");
    let s = batch(json!({"processing_status": "canceling",
                         "cancel_initiated_at": "2024-09-24T18:39:00Z"}));
    assert_eq!(s.state, BatchState::Cancelling);
    let url =
        "https://api.anthropic.com/v1/messages/batches/msgbatch_013Zva2CMHLNnXjNJJKqJ2EF/results";
    let ended = |counts: Value, extra: Value| {
        let mut e = json!({"processing_status": "ended", "ended_at": "2024-09-24T19:00:00Z",
                           "results_url": url, "request_counts": counts});
        for (k, x) in extra.as_object().unwrap() {
            e[k] = x.clone();
        }
        batch(e)
    };
    let c = |s, e, c, x| json!({"processing": 0, "succeeded": s, "errored": e, "canceled": c, "expired": x});
    let s = ended(c(1, 1, 0, 0), json!({}));
    assert_eq!(s.state, BatchState::Completed);
    assert_eq!(
        s.counts,
        BatchCounts {
            total: 2,
            completed: 1,
            failed: 1
        }
    );
    assert_eq!(s.output_ref.as_deref(), Some(url));
    assert!(!s.results_pending);
    assert_eq!(ended(c(1, 0, 0, 1), json!({})).state, BatchState::Expired);
    let s = ended(
        c(1, 0, 1, 0),
        json!({"cancel_initiated_at": "2024-09-24T18:39:00Z"}),
    );
    assert_eq!(s.state, BatchState::Cancelled);
    // Ended, results not there yet: wait. Archived: nothing to wait for.
    let s = ended(c(2, 0, 0, 0), json!({"results_url": null}));
    assert!(s.results_pending && s.state == BatchState::Completed);
    let s = ended(
        c(2, 0, 0, 0),
        json!({"results_url": null, "archived_at": "2024-10-23T18:37:24Z"}),
    );
    assert!(!s.results_pending);
    // Provider counts that would wrap a u64 saturate.
    let s = ended(c(u64::MAX, 1, 0, 0), json!({}));
    assert_eq!((s.counts.total, s.counts.failed), (u64::MAX, 1));
    let s = ended(c(0, u64::MAX, u64::MAX, 1), json!({}));
    assert_eq!((s.counts.total, s.counts.failed), (u64::MAX, u64::MAX));
    let e = adapter()
        .status_of(
            serde_json::from_value(json!({"id": "m", "processing_status": "paused"})).unwrap(),
        )
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::Transient);
}

fn ingest(lines: &[&str], expected: &[&str]) -> (Vec<ResultLine>, ResultsSummary) {
    let a = adapter();
    let expected: HashSet<String> = expected.iter().map(|s| s.to_string()).collect();
    let mut got = Vec::new();
    let mut sink = |l: ResultLine| got.push(l);
    let mut m = Matcher::new(&expected, &mut sink, "custom_id");
    for (i, l) in lines.iter().enumerate() {
        a.line(&mut m, l.as_bytes(), &format!("results line {}", i + 1));
    }
    let summary = m.finish(&BatchState::InProgress);
    (got, summary)
}

const SUCCEEDED: &str = r#"{"custom_id":"a","result":{"type":"succeeded","message":{"id":"msg_014VwiXbi91y3JMjcpyGBHX5","type":"message","role":"assistant","model":"claude-haiku-4-5","content":[{"type":"text","text":"{\"same\":true}"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":120,"output_tokens":48,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":0},"service_tier":"batch"}}}}"#;
const ERRORED: &str = r#"{"custom_id":"b","result":{"type":"errored","error":{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: Field required"},"request_id":"req_011CSHoEeqs5C35K2UUqR7Fy"}}}"#;

#[test]
fn result_lines_of_every_type() {
    let (got, summary) = ingest(
        &[
            SUCCEEDED,
            ERRORED,
            r#"{"custom_id":"c","result":{"type":"canceled"}}"#,
            r#"{"custom_id":"d","result":{"type":"expired"}}"#,
            r#"{"custom_id":"e","result":{"type":"errored","error":{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}}}"#,
        ],
        &["a", "b", "c", "d", "e"],
    );
    assert_eq!(summary.delivered, 5);
    assert!(summary.quarantined.is_empty());
    let LineOutcome::Answer(a) = &got[0].outcome else {
        panic!("{:?}", got[0])
    };
    assert_eq!(a.content.as_deref(), Some("{\"same\":true}"));
    assert_eq!(a.finish_reason, FinishReason::Stop);
    assert_eq!(a.usage.unwrap().input_tokens, 120);
    assert_eq!(
        a.provider_request_id.as_deref(),
        Some("msg_014VwiXbi91y3JMjcpyGBHX5")
    );
    let LineOutcome::Error(e) = &got[1].outcome else {
        panic!()
    };
    assert_eq!(e.class, ErrorClass::Request);
    assert_eq!(e.http_status, None);
    assert!(
        e.message
            .contains("max_tokens: Field required [invalid_request_error]")
    );
    assert!(matches!(got[2].outcome, LineOutcome::NotRun(_)));
    assert!(matches!(got[3].outcome, LineOutcome::NotRun(_)));
    let LineOutcome::Error(e) = &got[4].outcome else {
        panic!()
    };
    assert_eq!(e.class, ErrorClass::Overloaded);
}

#[test]
fn unknown_duplicate_and_broken_lines_are_quarantined() {
    let (got, summary) = ingest(
        &[
            SUCCEEDED,
            SUCCEEDED,
            ERRORED,
            r#"{"custom_id":"a2","result":{"type":"mystery"}}"#,
            r#"{"custom_id":"#,
            r#"{"result":{"type":"canceled"}}"#,
        ],
        &["a", "a2"],
    );
    assert_eq!(got.len(), 1);
    let q: Vec<(u64, Option<&str>)> = summary
        .quarantined
        .iter()
        .map(|q| (q.line, q.custom_id.as_deref()))
        .collect();
    assert_eq!(
        q,
        vec![
            (2, Some("a")),
            (3, Some("b")),
            (4, Some("a2")),
            (5, None),
            (6, None)
        ]
    );
    assert!(summary.quarantined[0].reason.contains("second result"));
    assert!(summary.quarantined[1].reason.contains("unknown custom_id"));
}

#[test]
fn find_counts_requests_in_the_window() {
    let page: ListPage = serde_json::from_value(json!({
        "data": [
            {"id": "msgbatch_3", "type": "message_batch", "processing_status": "in_progress",
             "request_counts": {"processing": 10, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0},
             "created_at": "2024-09-24T18:40:00.000000Z", "expires_at": "2024-09-25T18:40:00.000000Z",
             "ended_at": null, "cancel_initiated_at": null, "archived_at": null, "results_url": null},
            {"id": "msgbatch_2", "type": "message_batch", "processing_status": "ended",
             "request_counts": {"processing": 0, "succeeded": 7, "errored": 1, "canceled": 1, "expired": 1},
             "created_at": "2024-09-24T18:39:00Z", "expires_at": "2024-09-25T18:39:00Z",
             "ended_at": "2024-09-24T18:45:00Z", "cancel_initiated_at": null, "archived_at": null,
             "results_url": "https://api.anthropic.com/v1/messages/batches/msgbatch_2/results"},
            {"id": "msgbatch_1", "type": "message_batch", "processing_status": "ended",
             "request_counts": {"processing": 0, "succeeded": 10, "errored": 0, "canceled": 0, "expired": 0},
             "created_at": "2024-09-24T18:00:00Z", "expires_at": "2024-09-25T18:00:00Z",
             "ended_at": "2024-09-24T18:30:00Z", "cancel_initiated_at": null, "archived_at": null,
             "results_url": "https://api.anthropic.com/v1/messages/batches/msgbatch_1/results"}
        ],
        "has_more": false, "first_id": "msgbatch_3", "last_id": "msgbatch_1"
    }))
    .unwrap();
    let window = unix_of(Some("2024-09-24T18:38:00Z")).unwrap();
    let run = |after: f64, n: usize| {
        let mut found = Vec::new();
        page.matches(after, n, &mut found);
        found
    };
    assert_eq!(run(window, 10), vec!["msgbatch_3", "msgbatch_2"]);
    assert_eq!(
        run(unix_of(Some("2024-09-24T18:39:30Z")).unwrap(), 10),
        vec!["msgbatch_3"]
    );
    assert_eq!(run(0.0, 10).len(), 3);
    assert!(run(window, 11).is_empty());
    // Microseconds count.
    let t = unix_of(Some("2024-09-24T18:37:24.100435Z")).unwrap();
    assert!((t - 1727203044.100435).abs() < 1e-5, "{t}");
}

#[test]
fn results_url_is_followed_only_on_the_api_origin() {
    let b = adapter();
    let mut s = batch(json!({}));
    let own =
        "https://api.anthropic.com/v1/messages/batches/msgbatch_013Zva2CMHLNnXjNJJKqJ2EF/results";
    s.output_ref = Some(own.into());
    assert_eq!(b.results_url(&s), own);
    s.output_ref = Some("https://evil.example/v1/x".into());
    assert_eq!(b.results_url(&s), own);
    assert!(same_origin(
        "HTTPS://API.anthropic.com/v1/x",
        "https://api.anthropic.com"
    ));
    assert!(!same_origin(
        "https://api.anthropic.com.evil/v1",
        "https://api.anthropic.com"
    ));
}

#[test]
fn cadence_follows_the_seed() {
    let b = adapter();
    let min = |m: u64| Duration::from_secs(60 * m);
    assert_eq!(
        b.poll_after(&BatchState::InProgress, min(1)),
        Duration::from_secs(30)
    );
    assert_eq!(
        b.poll_after(&BatchState::InProgress, min(11)),
        Duration::from_secs(120)
    );
    assert_eq!(
        b.poll_after(&BatchState::InProgress, min(23 * 60 + 50)),
        Duration::from_secs(120)
    );
    assert_eq!(
        b.poll_after(&BatchState::Cancelling, min(60)),
        Duration::from_secs(30)
    );
    let f = fast();
    assert_eq!(
        f.after(&BatchState::InProgress, Duration::ZERO),
        Duration::from_millis(30)
    );
    assert_eq!(
        f.after(&BatchState::InProgress, Duration::from_secs(1)),
        Duration::from_millis(120)
    );
}

#[test]
fn bad_custom_ids_are_refused_before_sending() {
    let b = adapter();
    let mut lines = vec![line("ok-1"), line("bad id")];
    let e = b.split(&lines).unwrap_err();
    assert_eq!(e.index, 1);
    lines[1].custom_id = "x".repeat(65);
    assert!(b.split(&lines).is_err());
    lines[1].custom_id = "ok-2".into();
    assert_eq!(b.split(&lines).unwrap().len(), 1);
}
