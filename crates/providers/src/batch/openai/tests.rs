//! The OpenAI and Azure batch adapter's unit tests: states, results, find.

use super::files::FileObject;
use super::find::ListObject;
use super::*;
use std::collections::HashSet;

use serde_json::{Value, json};

use crate::ErrorClass;
use crate::batch::ResultLine;
use crate::batch::results::Matcher;
use crate::batch::{BatchCounts, BatchStatus, Found, LineOutcome, ResultsSummary, verdict};
use crate::openai::request_body;
use crate::{ChatRequest, FinishReason};

fn openai() -> OpenAiBatch {
    OpenAiBatch::openai(
        "openai",
        "https://api.openai.com/v1/",
        Some(ApiKey::new("sk-canary-unit-1")),
    )
    .unwrap()
}

fn azure() -> OpenAiBatch {
    OpenAiBatch::azure(
        "https://res.openai.azure.com/openai/",
        "2024-10-21",
        ApiKey::new("azure-canary-unit"),
    )
    .unwrap()
}

fn batch(json: &str) -> BatchStatus {
    openai()
        .status_of(serde_json::from_str(json).unwrap())
        .unwrap()
}

fn line(id: &str) -> BatchLine {
    BatchLine {
        custom_id: id.into(),
        request: ChatRequest {
            model: "gpt-4o-mini".into(),
            system: Some("sys".into()),
            user: "is it?".into(),
            max_tokens: 50,
            temperature: Some(0.0),
            response_schema: Some(std::sync::Arc::new((
                "verdict".into(),
                json!({"type":"object"}),
            ))),
            structured_output: Default::default(),
            thinking_budget: None,
            client_request_id: id.into(),
            timeout: Duration::from_secs(5),
            body: None,
        },
    }
}

// The batch object of the reference, in each status.
fn batch_json(status: &str, extra: &str) -> String {
    let base = format!(
        r#"{{"id":"batch_abc123","object":"batch","endpoint":"/v1/chat/completions","model":"gpt-4o-mini-2024-07-18",
        "errors":null,"input_file_id":"file-abc123","completion_window":"24h","status":"{status}",
        "output_file_id":null,"error_file_id":null,"created_at":1711471533,"in_progress_at":1711471538,
        "expires_at":1711557933,"finalizing_at":null,"completed_at":null,"failed_at":null,"expired_at":null,
        "cancelling_at":null,"cancelled_at":null,"request_counts":{{"total":100,"completed":23,"failed":1}},
        "usage":{{"input_tokens":0,"input_tokens_details":{{"cached_tokens":0}},"output_tokens":0,
        "output_tokens_details":{{"reasoning_tokens":0}},"total_tokens":0}},
        "metadata":{{"job":"adjudication-42"}}}}"#
    );
    // Fields in `extra` replace the example's.
    let mut v: Value = serde_json::from_str(&base).unwrap();
    let extra: Value =
        serde_json::from_str(&format!("{{{}}}", extra.trim_start_matches(','))).unwrap();
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    v.to_string()
}

#[test]
fn every_status_maps_to_a_state() {
    for (status, state) in [
        ("validating", BatchState::Validating),
        ("in_progress", BatchState::InProgress),
        ("finalizing", BatchState::Finalizing),
        ("cancelling", BatchState::Cancelling),
    ] {
        let s = batch(&batch_json(status, ""));
        assert_eq!(s.state, state);
        assert!(!s.results_pending, "{status}");
        assert_eq!(
            s.counts,
            BatchCounts {
                total: 100,
                completed: 23,
                failed: 1
            }
        );
        assert_eq!(s.provider_batch_id, "batch_abc123");
    }
    let s = batch(&batch_json(
        "completed",
        r#","output_file_id":"file-out","error_file_id":"file-err""#,
    ));
    assert_eq!(s.state, BatchState::Completed);
    assert_eq!(s.output_ref.as_deref(), Some("file-out"));
    assert_eq!(s.error_ref.as_deref(), Some("file-err"));
    assert!(!s.results_pending);
    let e = openai()
        .status_of(serde_json::from_str(&batch_json("paused", "")).unwrap())
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::Transient);
}

#[test]
fn output_file_late_after_completed_is_results_pending() {
    // completed, counts say 23 + 1 results, no file yet.
    let s = batch(&batch_json("completed", ""));
    assert_eq!(s.state, BatchState::Completed);
    assert!(s.results_pending);
    // Cancelled before anything ran: nothing to wait for.
    let s = batch(&batch_json(
        "cancelled",
        r#","request_counts":{"total":100,"completed":0,"failed":0}"#,
    ));
    assert!(!s.results_pending);
    assert!(s.state.is_terminal());
}

#[test]
fn expired_with_partial_counts_keeps_both_files() {
    let s = batch(&batch_json(
        "expired",
        r#","output_file_id":"file-out","error_file_id":"file-err","request_counts":{"total":100,"completed":60,"failed":0}"#,
    ));
    assert_eq!(s.state, BatchState::Expired);
    assert_eq!(s.counts.completed, 60);
    assert_eq!(s.output_ref.as_deref(), Some("file-out"));
    assert_eq!(s.error_ref.as_deref(), Some("file-err"));
    assert!(!s.results_pending);
}

#[test]
fn failed_names_the_input_line() {
    let s = batch(&batch_json(
        "failed",
        r#","errors":{"object":"list","data":[{"code":"invalid_request","message":"custom_id is duplicated sk-leaked12345","param":"custom_id","line":7},{"code":"token_limit_exceeded","message":"Enqueued token limit reached.","param":null,"line":null}]},"request_counts":{"total":0,"completed":0,"failed":0}"#,
    ));
    let BatchState::Failed(why) = &s.state else {
        panic!("{:?}", s.state)
    };
    assert!(why.contains("line 7: custom_id is duplicated"), "{why}");
    assert!(why.contains("[invalid_request] (param custom_id)"), "{why}");
    assert!(
        why.contains("Enqueued token limit reached. [token_limit_exceeded]"),
        "{why}"
    );
    assert!(!why.contains("sk-leaked"), "{why}");
    assert!(!s.results_pending);
    let s = batch(&batch_json("failed", ""));
    assert_eq!(
        s.state,
        BatchState::Failed("the batch failed (no errors listed)".into())
    );
}

#[test]
fn a_file_object_gives_its_id() {
    let f: FileObject = serde_json::from_str(
        r#"{"id":"file-abc123","object":"file","bytes":120000,"created_at":1711471533,"expires_at":1714063533,"filename":"batchinput.jsonl","purpose":"batch","status":"processed"}"#,
    )
    .unwrap();
    assert_eq!(f.id, "file-abc123");
}

fn ingest(lines: &[&str], expected: &[&str]) -> (Vec<ResultLine>, ResultsSummary) {
    let adapter = openai();
    let expected: HashSet<String> = expected.iter().map(|s| s.to_string()).collect();
    let mut got = Vec::new();
    let mut sink = |l: ResultLine| got.push(l);
    let mut m = Matcher::new(&expected, &mut sink, "custom_id");
    for (i, l) in lines.iter().enumerate() {
        if !l.trim().is_empty() {
            adapter.line(&mut m, l.as_bytes(), &format!("output file line {}", i + 1));
        }
    }
    // Not terminal: nothing is made up for ids with no line.
    let summary = m.finish(&BatchState::InProgress);
    (got, summary)
}

const OK_LINE: &str = r#"{"id":"batch_req_123","custom_id":"item-2","response":{"status_code":200,"request_id":"req_123","body":{"id":"chatcmpl-1","object":"chat.completion","created":1711652795,"model":"gpt-4o-mini-2024-07-18","choices":[{"index":0,"message":{"role":"assistant","content":"{\"a\":1}","refusal":null},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":24,"completion_tokens":8,"total_tokens":32,"prompt_tokens_details":{"cached_tokens":4},"completion_tokens_details":{"reasoning_tokens":2}}}},"error":null}"#;
const ERR_LINE: &str = r#"{"id":"batch_req_456","custom_id":"item-7","response":{"status_code":400,"request_id":"req_456","body":{"error":{"message":"maximum context length","type":"invalid_request_error","param":null,"code":"context_length_exceeded"}}},"error":null}"#;
const EXPIRED_LINE: &str = r#"{"id":"batch_req_789","custom_id":"item-9","response":null,"error":{"code":"batch_expired","message":"This request could not be executed before the completion window expired."}}"#;

#[test]
fn output_lines_become_answers_errors_and_not_run() {
    let (got, summary) = ingest(
        &[OK_LINE, "", ERR_LINE, EXPIRED_LINE],
        &["item-2", "item-7", "item-9"],
    );
    assert_eq!(summary.lines, 3);
    assert_eq!(summary.delivered, 3);
    assert!(summary.quarantined.is_empty());
    let LineOutcome::Answer(a) = &got[0].outcome else {
        panic!("{:?}", got[0])
    };
    assert_eq!(got[0].custom_id, "item-2");
    assert_eq!(a.content.as_deref(), Some("{\"a\":1}"));
    assert_eq!(a.finish_reason, FinishReason::Stop);
    assert_eq!(a.usage.unwrap().cached_input_tokens, 4);
    assert_eq!(a.provider_request_id.as_deref(), Some("req_123"));
    let LineOutcome::Error(e) = &got[1].outcome else {
        panic!("{:?}", got[1])
    };
    assert_eq!(e.class, ErrorClass::Request);
    assert_eq!(e.http_status, Some(400));
    assert!(e.message.contains("context_length_exceeded"));
    let LineOutcome::NotRun(why) = &got[2].outcome else {
        panic!("{:?}", got[2])
    };
    assert!(why.contains("batch_expired"), "{why}");
}

#[test]
fn unknown_duplicate_and_garbage_lines_are_quarantined() {
    let (got, summary) = ingest(
        &[
            OK_LINE,
            OK_LINE,
            EXPIRED_LINE,
            "{\"custom_id\":\"item-2\",\"resp",
            r#"{"id":"x","custom_id":"item-7"}"#,
            r#"{"id":"x","response":null,"error":null}"#,
        ],
        &["item-2", "item-7"],
    );
    assert_eq!(got.len(), 1);
    assert_eq!(summary.lines, 6);
    assert_eq!(summary.delivered, 1);
    let q: Vec<(u64, Option<&str>)> = summary
        .quarantined
        .iter()
        .map(|q| (q.line, q.custom_id.as_deref()))
        .collect();
    assert_eq!(
        q,
        vec![
            (2, Some("item-2")),
            (3, Some("item-9")),
            (4, None),
            (5, Some("item-7")),
            (6, None)
        ]
    );
    assert!(summary.quarantined[0].reason.contains("second result"));
    assert!(summary.quarantined[1].reason.contains("unknown custom_id"));
    // item-7's line with neither part did not use up its id.
    let (got, _) = ingest(&[r#"{"custom_id":"item-7"}"#, ERR_LINE], &["item-7"]);
    assert_eq!(got.len(), 1);
}

#[test]
fn find_matches_tag_and_count_newest_first() {
    let list: ListObject = serde_json::from_str(
        r#"{"object":"list","data":[
          {"id":"batch_3","object":"batch","endpoint":"/v1/chat/completions","input_file_id":"f","completion_window":"24h","status":"validating","created_at":1711472000,"metadata":{"docket_tag":"b-42","docket_requests":"10"}},
          {"id":"batch_2","object":"batch","endpoint":"/v1/chat/completions","input_file_id":"f","completion_window":"24h","status":"completed","created_at":1711471600,"metadata":{"docket_tag":"b-41","docket_requests":"10"}},
          {"id":"batch_1","object":"batch","endpoint":"/v1/chat/completions","input_file_id":"f","completion_window":"24h","status":"completed","created_at":1711471000,"metadata":{"docket_tag":"b-42","docket_requests":"10"}},
          {"id":"batch_0","object":"batch","endpoint":"/v1/chat/completions","input_file_id":"f","completion_window":"24h","status":"completed","created_at":1711472100,"metadata":null}
        ],"first_id":"batch_3","last_id":"batch_0","has_more":false}"#
    )
    .unwrap();
    let run = |tag: &str, after: f64, n: usize| {
        let (mut exact, mut tag_only) = (Vec::new(), Vec::new());
        list.matches(tag, after, n, &mut exact, &mut tag_only);
        verdict(exact, tag_only, Vec::new())
    };
    assert_eq!(run("b-42", 1711471500.0, 10), Found::One("batch_3".into()));
    // batch_1 is before the window unless the window reaches back.
    assert_eq!(
        run("b-42", 1711470000.0, 10),
        Found::Ambiguous(vec!["batch_3".into(), "batch_1".into()])
    );
    assert_eq!(run("b-43", 0.0, 10), Found::None);
    // Our tag with another count: never guessed to be safe.
    assert_eq!(
        run("b-42", 1711471500.0, 11),
        Found::Ambiguous(vec!["batch_3".into()])
    );
    // Azure: batch_0 has no metadata and could be ours. Beside no match
    // it is Ambiguous, never None; beside our one match, it is not ours.
    let mut unknown = Vec::new();
    list.without_metadata(1711471500.0, &mut unknown);
    assert_eq!(unknown, vec!["batch_0"]);
    assert_eq!(
        verdict(Vec::new(), Vec::new(), unknown.clone()),
        Found::Ambiguous(vec!["batch_0".into()])
    );
    assert_eq!(
        verdict(vec!["batch_3".into()], Vec::new(), unknown),
        Found::One("batch_3".into())
    );
    let mut unknown = Vec::new();
    list.without_metadata(1711472200.0, &mut unknown);
    assert!(unknown.is_empty(), "outside the window");
}

#[test]
fn a_completed_batch_without_counts_or_files_is_pending() {
    // request_counts is optional: without it, results may still come.
    let s = batch(&batch_json("completed", r#","request_counts":null"#));
    assert!(s.results_pending);
    // Counted and both zero: nothing will come.
    let s = batch(&batch_json(
        "completed",
        r#","request_counts":{"total":0,"completed":0,"failed":0}"#,
    ));
    assert!(!s.results_pending);
    // Counts that would wrap a u64 do not read as zero.
    let s = batch(&batch_json(
        "completed",
        r#","request_counts":{"total":1,"completed":18446744073709551615,"failed":1}"#,
    ));
    assert!(s.results_pending);
    let s = batch(&batch_json(
        "expired",
        r#","request_counts":{"total":2,"completed":18446744073709551615,"failed":1}"#,
    ));
    assert!(s.results_pending);
}

#[test]
fn urls_and_endpoints_per_flavour() {
    let o = openai();
    assert_eq!(o.url("files", &[]), "https://api.openai.com/v1/files");
    assert_eq!(
        o.url("batches", &[("limit", "100"), ("after", "batch_x")]),
        "https://api.openai.com/v1/batches?limit=100&after=batch_x"
    );
    assert_eq!(o.endpoint(), "/v1/chat/completions");
    let a = azure();
    assert_eq!(
        a.url("batches/b1/cancel", &[]),
        "https://res.openai.azure.com/openai/batches/b1/cancel?api-version=2024-10-21"
    );
    assert_eq!(
        a.url("batches", &[("limit", "100")]),
        "https://res.openai.azure.com/openai/batches?api-version=2024-10-21&limit=100"
    );
    assert_eq!(a.endpoint(), "/chat/completions");
    assert_eq!(a.limits().max_requests, 100_000);
    assert_eq!(o.limits().max_requests, 50_000);
}

#[test]
fn a_line_is_the_sync_body_under_the_batch_envelope() {
    let l = line("item-1");
    let v: Value = serde_json::from_slice(&openai().encode_line(&l).unwrap()).unwrap();
    assert_eq!(v["custom_id"], "item-1");
    assert_eq!(v["method"], "POST");
    assert_eq!(v["url"], "/v1/chat/completions");
    assert_eq!(v["body"], request_body(&l.request));
    let v: Value = serde_json::from_slice(&azure().encode_line(&l).unwrap()).unwrap();
    assert_eq!(v["url"], "/chat/completions");
    assert_eq!(v["body"]["model"], "gpt-4o-mini");
}

#[test]
fn cadence_follows_the_plan() {
    let c = PollCadence::STANDARD;
    let min = |m: u64| Duration::from_secs(60 * m);
    assert_eq!(
        c.after(&BatchState::Validating, min(0)),
        Duration::from_secs(30)
    );
    assert_eq!(
        c.after(&BatchState::InProgress, min(5)),
        Duration::from_secs(30)
    );
    assert_eq!(
        c.after(&BatchState::InProgress, min(11)),
        Duration::from_secs(120)
    );
    assert_eq!(
        c.after(&BatchState::Finalizing, min(60)),
        Duration::from_secs(30)
    );
    assert_eq!(
        c.after(&BatchState::Cancelling, min(60)),
        Duration::from_secs(30)
    );
    assert_eq!(
        c.after(&BatchState::InProgress, min(23 * 60 + 45)),
        Duration::from_secs(30)
    );
    let f = PollCadence::fast();
    assert_eq!(
        f.after(&BatchState::InProgress, Duration::ZERO),
        Duration::from_millis(30)
    );
    assert_eq!(
        f.after(&BatchState::InProgress, Duration::from_secs(1)),
        Duration::from_millis(120)
    );
    assert_eq!(
        openai()
            .with_cadence(f)
            .poll_after(&BatchState::Validating, Duration::ZERO),
        f.quick
    );
}
