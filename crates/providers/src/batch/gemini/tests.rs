//! The Gemini batch adapter's unit tests: wire shapes, states, results.

use super::find::{matches, verdict};
use super::*;
use std::collections::HashSet;

use serde_json::json;

use crate::batch::ResultLine;
use crate::batch::results::Matcher;
use crate::batch::{BatchCounts, BatchStatus, Found, LineOutcome, ResultsSummary};
use crate::gemini::request_body;
use crate::{ChatRequest, ErrorClass, FinishReason};

fn adapter() -> GeminiBatch {
    GeminiBatch::new(
        "https://generativelanguage.googleapis.com/v1beta/",
        ApiKey::new("AIzaCanaryUnit"),
    )
    .unwrap()
}

fn status(op: &str) -> BatchStatus {
    adapter()
        .status_of(&serde_json::from_str(op).unwrap())
        .unwrap()
}

fn line(id: &str) -> BatchLine {
    BatchLine {
        custom_id: id.into(),
        request: ChatRequest {
            model: "gemini-2.5-flash".into(),
            system: None,
            user: "…".into(),
            max_tokens: 50,
            temperature: Some(0.0),
            response_schema: None,
            structured_output: Default::default(),
            thinking_budget: None,
            client_request_id: id.into(),
            timeout: Duration::from_secs(5),
            body: None,
        },
    }
}

// The reference's poll response (an Operation), in a given state.
fn op(state: &str, extra: &str) -> String {
    format!(
        r#"{{"name": "batches/123456789",
         "metadata": {{"@type": "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch",
                      "model": "models/gemini-2.5-flash", "displayName": "job-42", "state": "{state}",
                      "createTime": "2025-07-01T10:00:00.123456Z", "updateTime": "2025-07-01T10:05:00Z",
                      "batchStats": {{"requestCount": "2", "successfulRequestCount": "1", "failedRequestCount": "1", "pendingRequestCount": "0"}}}}
         {extra}}}"#
    )
}

#[test]
fn both_state_prefixes_map_to_states() {
    for (state, want) in [
        ("BATCH_STATE_PENDING", BatchState::Validating),
        ("BATCH_STATE_RUNNING", BatchState::InProgress),
        ("JOB_STATE_RUNNING", BatchState::InProgress),
        ("JOB_STATE_QUEUED", BatchState::Validating),
        ("JOB_STATE_CANCELLING", BatchState::Cancelling),
        ("BATCH_STATE_CANCELLED", BatchState::Cancelled),
        ("JOB_STATE_EXPIRED", BatchState::Expired),
    ] {
        let s = status(&op(state, ""));
        assert_eq!(s.state, want, "{state}");
        assert_eq!(s.provider_batch_id, "batches/123456789");
        assert_eq!(
            s.counts,
            BatchCounts {
                total: 2,
                completed: 1,
                failed: 1
            }
        );
        assert!(!s.results_pending, "{state}");
    }
    let e = adapter()
        .status_of(&serde_json::from_str(&op("BATCH_STATE_WEIRD", "")).unwrap())
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::Transient);
    // Counts as numbers too.
    let s = status(
        r#"{"name":"batches/1","metadata":{"state":"BATCH_STATE_RUNNING","batchStats":{"requestCount":5,"successfulRequestCount":2}}}"#,
    );
    assert_eq!((s.counts.total, s.counts.completed), (5, 2));
}

#[test]
fn results_are_found_where_the_reference_says() {
    let inline = r#","done": true, "response": {"@type": "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatchOutput",
        "inlinedResponses": {"inlinedResponses": [{"metadata": {"key": "item-000123"}, "response": {"candidates": []}}]}}"#;
    let s = status(&op("BATCH_STATE_SUCCEEDED", inline));
    assert_eq!(s.state, BatchState::Completed);
    assert_eq!(s.output_ref.as_deref(), Some("inline:batches/123456789"));
    assert!(!s.results_pending);
    let file = r#","done": true, "response": {"responsesFile": "files/abc123"}"#;
    let s = status(&op("JOB_STATE_SUCCEEDED", file));
    assert_eq!(s.output_ref.as_deref(), Some("files/abc123"));
    // Only under metadata.output (the SDK's reading).
    let s = status(
        r#"{"name":"batches/9","metadata":{"state":"BATCH_STATE_SUCCEEDED","output":{"responsesFile":"files/xyz"}},"done":true}"#,
    );
    assert_eq!(s.output_ref.as_deref(), Some("files/xyz"));
    // Succeeded with counted results and none to be found: wait.
    let s = status(&op("BATCH_STATE_SUCCEEDED", ""));
    assert!(s.results_pending);
    // Expired with nothing: the docs say no results, so nothing to wait for.
    let s = status(&op("BATCH_STATE_EXPIRED", r#","done": true"#));
    assert!(!s.results_pending && s.output_ref.is_none());
    // batchStats is optional: succeeded without it may still have results.
    let s =
        status(r#"{"name":"batches/7","metadata":{"state":"BATCH_STATE_SUCCEEDED"},"done":true}"#);
    assert!(s.results_pending);
    // Present, and zero (proto JSON leaves zero counts out): nothing to wait for.
    let s = status(
        r#"{"name":"batches/7","metadata":{"state":"BATCH_STATE_SUCCEEDED","batchStats":{"requestCount":"0"}},"done":true}"#,
    );
    assert!(!s.results_pending);
    // Counts that would wrap a u64 do not read as zero.
    let s = status(
        r#"{"name":"batches/7","metadata":{"state":"BATCH_STATE_SUCCEEDED","batchStats":{"successfulRequestCount":"18446744073709551615","failedRequestCount":"1"}},"done":true}"#,
    );
    assert!(s.results_pending);
}

#[test]
fn a_failed_operation_says_why_without_the_key() {
    let s = status(&op(
        "BATCH_STATE_FAILED",
        r#","done": true, "error": {"code": 3, "message": "Invalid JSON in input file at line 7 AIzaCanaryUnit"}"#,
    ));
    let BatchState::Failed(why) = &s.state else {
        panic!("{:?}", s.state)
    };
    assert!(why.contains("line 7") && why.contains("code 3"), "{why}");
    assert!(!why.contains("AIzaCanaryUnit"), "{why}");
    let s = status(r#"{"name":"batches/2","done":true,"error":{"code":13,"message":"boom"}}"#);
    assert!(matches!(s.state, BatchState::Failed(_)));
}

#[test]
fn requests_are_the_sync_body_under_the_batch_envelopes() {
    let l = line("item-000123");
    let v: Value = serde_json::from_slice(&adapter().encode_line(&l).unwrap()).unwrap();
    assert_eq!(
        v,
        json!({"key": "item-000123", "request": request_body(&l.request)})
    );
    // The thinking budget rides along, as on a synchronous request.
    assert_eq!(
        v["request"]["generationConfig"]["thinkingConfig"],
        json!({"thinkingBudget": crate::gemini::thinking::DEFAULT_THINKING_BUDGET})
    );
    assert_eq!(
        GeminiBatch::inline_item(&l).unwrap(),
        json!({"request": request_body(&l.request), "metadata": {"key": "item-000123"}})
    );
    let lines = [line("a"), line("b")];
    let chunks = adapter().split(&lines).unwrap();
    let body: Value =
        serde_json::from_slice(&adapter().inline_body("job-42", &chunks[0]).unwrap()).unwrap();
    assert_eq!(body["batch"]["displayName"], "job-42");
    assert_eq!(
        body["batch"]["inputConfig"]["requests"]["requests"][1]["metadata"]["key"],
        "b"
    );
    assert!(
        adapter()
            .with_inline_limit(100)
            .inline_body("job-42", &chunks[0])
            .is_none()
    );
}

#[test]
fn the_streamed_inline_body_is_the_whole_body_it_replaced() {
    let lines = [line("a"), line("b-2"), line("c_3")];
    let chunks = adapter().split(&lines).unwrap();
    for tag in ["job-42", "a \"quoted\" tag \\ é ✓"] {
        let body = adapter().inline_body(tag, &chunks[0]).unwrap();
        let items: Vec<Value> = lines
            .iter()
            .map(|l| GeminiBatch::inline_item(l).unwrap())
            .collect();
        let want = json!({"batch": {
            "displayName": tag,
            "inputConfig": {"requests": {"requests": items}},
        }});
        assert_eq!(serde_json::from_slice::<Value>(&body).unwrap(), want);
        // The limit is the exact length.
        let len = body.len() as u64;
        let a = adapter().with_inline_limit(len);
        assert_eq!(
            a.inline_body(tag, &chunks[0]).map(|b| b.len()),
            Some(body.len())
        );
        assert!(
            adapter()
                .with_inline_limit(len - 1)
                .inline_body(tag, &chunks[0])
                .is_none()
        );
    }
}

#[test]
fn a_poll_reads_as_leniently_as_a_value_and_skips_the_results() {
    // A bare batch resource (no metadata object): its own fields.
    let s = status(
        r#"{"name":"batches/5","metadata":"x","state":"BATCH_STATE_SUCCEEDED","done":"true",
            "batch_stats":{"request_count":3,"successful_request_count":"2","failed_request_count":-1},
            "output":{"responses_file":"files/f"}}"#,
    );
    assert_eq!(s.provider_batch_id, "batches/5");
    assert_eq!(s.state, BatchState::Completed);
    assert_eq!(
        (s.counts.total, s.counts.completed, s.counts.failed),
        (3, 2, 0)
    );
    assert_eq!(s.output_ref.as_deref(), Some("files/f"));
    // A null camelCase field hides its snake_case twin, as `field` does.
    let s = status(
        r#"{"name":"batches/6","metadata":{"state":"SUCCEEDED","batchStats":null,"batch_stats":{"requestCount":"4"}},
            "response":{"responsesFile":null,"responses_file":"files/g","inlinedResponses":{"inlined_responses":[]}}}"#,
    );
    assert!(!s.results_pending);
    assert_eq!(s.output_ref.as_deref(), Some("inline:batches/6"));
    // The name falls back to metadata.name; a wrong-typed field is absent.
    let s = status(
        r#"{"metadata":{"name":"batches/8","state":7,"batchStats":[1]},"done":true,"error":"boom",
            "response":{"inlinedResponses":{"inlinedResponses":[{"metadata":{"key":"k"},"response":{"x":[1,{"y":null}]}}]}}}"#,
    );
    assert_eq!(s.provider_batch_id, "batches/8");
    assert!(matches!(&s.state, BatchState::Failed(w) if w.contains("(no message)")));
    assert_eq!(s.counts, BatchCounts::default());
    assert_eq!(s.output_ref.as_deref(), Some("inline:batches/8"));
}

#[test]
fn urls_never_hold_the_key() {
    let a = adapter();
    let urls = [
        a.model_url("models/gemini-2.5-flash"),
        a.batch_url("batches/123", ""),
        a.batch_url("123", ":cancel"),
        a.download_url("files/abc"),
    ];
    assert_eq!(
        urls,
        [
            "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:batchGenerateContent",
            "https://generativelanguage.googleapis.com/v1beta/batches/123",
            "https://generativelanguage.googleapis.com/v1beta/batches/123:cancel",
            "https://generativelanguage.googleapis.com/download/v1beta/files/abc:download?alt=media",
        ]
    );
    assert!(
        urls.iter()
            .all(|u| !u.contains("key=") && !u.contains("AIza"))
    );
    assert_eq!(a.limits().max_bytes, 2_000_000_000);
    assert_eq!(INLINE_LIMIT, 20_000_000);
}

fn ingest(items: &[&str], expected: &[&str]) -> (Vec<ResultLine>, ResultsSummary) {
    let a = adapter();
    let expected: HashSet<String> = expected.iter().map(|s| s.to_string()).collect();
    let mut got = Vec::new();
    let mut sink = |l: ResultLine| got.push(l);
    let mut m = Matcher::new(&expected, &mut sink, "key");
    for (i, l) in items.iter().enumerate() {
        a.raw_line(
            &mut m,
            l.as_bytes(),
            &format!("responses file line {}", i + 1),
        );
    }
    let summary = m.finish(&BatchState::InProgress);
    (got, summary)
}

const OK: &str = r#"{"key": "item-1", "response": {"candidates": [{"content": {"role": "model", "parts": [{"text": "{\"a\":1}"}]}, "finishReason": "STOP", "index": 0}], "usageMetadata": {"promptTokenCount": 50, "candidatesTokenCount": 20, "totalTokenCount": 70}, "modelVersion": "gemini-2.5-flash", "responseId": "r1"}}"#;
const INLINE_OK: &str = r#"{"metadata": {"key": "item-2"}, "response": {"candidates": [{"content": {"role": "model", "parts": [{"text": "x"}]}, "finishReason": "MAX_TOKENS", "index": 0}]}}"#;
const BAD: &str = r#"{"key": "item-3", "error": {"code": 3, "message": "* GenerateContentRequest.contents: contents is not specified"}}"#;
const INTERNAL: &str = r#"{"metadata": {"key": "item-4"}, "error": {"code": 500, "message": "internal", "status": "INTERNAL"}}"#;
const CANCELLED: &str =
    r#"{"key": "item-5", "error": {"code": 1, "message": "cancelled before it ran"}}"#;

#[test]
fn result_items_become_answers_errors_and_not_run() {
    let (got, s) = ingest(
        &[OK, INLINE_OK, BAD, INTERNAL, CANCELLED],
        &["item-1", "item-2", "item-3", "item-4", "item-5"],
    );
    assert_eq!((s.lines, s.delivered), (5, 5));
    assert!(s.quarantined.is_empty());
    let LineOutcome::Answer(a) = &got[0].outcome else {
        panic!("{:?}", got[0])
    };
    assert_eq!(a.content.as_deref(), Some("{\"a\":1}"));
    assert_eq!(a.usage.unwrap().input_tokens, 50);
    let LineOutcome::Answer(a) = &got[1].outcome else {
        panic!("{:?}", got[1])
    };
    assert_eq!(a.finish_reason, FinishReason::Length);
    let LineOutcome::Error(e) = &got[2].outcome else {
        panic!("{:?}", got[2])
    };
    assert_eq!((e.class, e.http_status), (ErrorClass::Request, Some(400)));
    assert!(e.message.contains("INVALID_ARGUMENT"), "{e}");
    let LineOutcome::Error(e) = &got[3].outcome else {
        panic!("{:?}", got[3])
    };
    assert_eq!(e.class, ErrorClass::Transient);
    assert!(matches!(got[4].outcome, LineOutcome::NotRun(_)));
}

#[test]
fn unknown_duplicate_and_garbage_are_quarantined() {
    let (got, s) = ingest(
        &[
            OK,
            OK,
            BAD,
            "{\"key\":\"item-1\",\"resp",
            r#"{"response":{}}"#,
            r#"{"key":"item-1"}"#,
        ],
        &["item-1"],
    );
    assert_eq!(got.len(), 1);
    let q: Vec<(u64, Option<&str>)> = s
        .quarantined
        .iter()
        .map(|q| (q.line, q.custom_id.as_deref()))
        .collect();
    assert_eq!(
        q,
        vec![
            (2, Some("item-1")),
            (3, Some("item-3")),
            (4, None),
            (5, None),
            (6, Some("item-1"))
        ]
    );
    assert!(s.quarantined[0].reason.contains("second result"));
    assert!(s.quarantined[1].reason.contains("unknown key"));
}

#[test]
fn find_matches_the_display_name_and_count() {
    let page: Value = serde_json::from_str(
        r#"{"operations": [
          {"name": "batches/3", "metadata": {"displayName": "b-42", "createTime": "2025-07-01T10:00:00Z", "batchStats": {"requestCount": "10"}}},
          {"name": "batches/2", "metadata": {"displayName": "b-41", "createTime": "2025-07-01T10:00:00Z", "batchStats": {"requestCount": "10"}}},
          {"name": "batches/1", "metadata": {"displayName": "b-42", "createTime": "2025-06-01T10:00:00Z", "batchStats": {"requestCount": "10"}}}
        ], "nextPageToken": ""}"#,
    )
    .unwrap();
    let ops = page["operations"].as_array().unwrap();
    let run = |tag: &str, after: f64, n: usize| {
        let (mut exact, mut tag_only) = (Vec::new(), Vec::new());
        matches(ops, tag, after, n, &mut exact, &mut tag_only);
        verdict(exact, tag_only)
    };
    let july = 1_751_000_000.0; // 2025-06-27
    assert_eq!(run("b-42", july, 10), Found::One("batches/3".into()));
    assert_eq!(
        run("b-42", 0.0, 10),
        Found::Ambiguous(vec!["batches/3".into(), "batches/1".into()])
    );
    assert_eq!(run("b-43", 0.0, 10), Found::None);
    assert_eq!(
        run("b-42", july, 11),
        Found::Ambiguous(vec!["batches/3".into()])
    );
}

#[test]
fn cadence_follows_the_plan_for_gemini() {
    let c = PollCadence::STANDARD;
    let min = |m: u64| Duration::from_secs(60 * m);
    assert_eq!(
        c.after(&BatchState::Validating, min(0)),
        Duration::from_secs(120)
    );
    assert_eq!(
        c.after(&BatchState::InProgress, min(19)),
        Duration::from_secs(120)
    );
    assert_eq!(
        c.after(&BatchState::InProgress, min(21)),
        Duration::from_secs(300)
    );
    assert_eq!(
        c.after(&BatchState::Cancelling, min(60)),
        Duration::from_secs(120)
    );
    let f = PollCadence::fast();
    assert_eq!(f.quick, Duration::from_millis(120));
    assert_eq!(
        adapter()
            .with_cadence(f)
            .poll_after(&BatchState::InProgress, Duration::from_secs(2)),
        Duration::from_millis(300)
    );
}
