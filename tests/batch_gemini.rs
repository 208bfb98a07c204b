//! The Gemini batch-mode adapter against the built-in mock's Gemini batch
//! and Files endpoints, over loopback: inline and file input, per-request
//! errors, expiry, cancel, late results, a cut responses file, a lost create
//! found by display name, the enqueued-token limit, and the key kept out of
//! every URL.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use docket::mock::{MockConfig, MockServer};
use docket::provider::batch::gemini::{GeminiBatch, INLINE_REF, PollCadence};
use docket::provider::batch::{
    BatchLine, BatchProvider, BatchState, BatchStatus, Found, LineOutcome, ResultLine,
    ResultsSummary, SubmitSpec,
};
use docket::provider::{ApiKey, ChatRequest, ErrorClass};

const N: usize = 40;
const MODEL: &str = "gemini-2.5-flash";
const KEY: &str = "AIzaGeminiBatchCanary-123";

async fn mock(tweak: impl FnOnce(&mut MockConfig)) -> MockServer {
    let mut cfg = MockConfig {
        batch_validating_ms: 100,
        batch_running_ms: 600,
        batch_finalizing_ms: 100,
        ..Default::default()
    };
    tweak(&mut cfg);
    MockServer::start(cfg, "127.0.0.1:0".parse().unwrap())
        .await
        .expect("mock")
}

fn lines(tag: &str, n: usize) -> Vec<BatchLine> {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"answer": {"type": "string"}, "confidence": {"type": "number"}},
        "required": ["answer", "confidence"],
        "additionalProperties": false
    });
    (0..n)
        .map(|i| BatchLine {
            custom_id: format!("{tag}-{i}-1"),
            request: ChatRequest {
                model: MODEL.into(),
                system: Some("Answer in JSON.".into()),
                user: format!("Item {i}: which release is this?"),
                max_tokens: 200,
                temperature: Some(0.0),
                response_schema: Some(std::sync::Arc::new(("adjudicate".into(), schema.clone()))),
                client_request_id: format!("{tag}-{i}-1"),
                timeout: Duration::from_secs(10),
            },
        })
        .collect()
}

fn root(m: &MockServer) -> String {
    format!("http://{}", m.addr())
}

fn gemini(m: &MockServer) -> GeminiBatch {
    GeminiBatch::new(&root(m), ApiKey::new(KEY))
        .unwrap()
        .with_cadence(PollCadence::fast())
}

/// Forced through the Files API: nothing fits inline.
fn gemini_file(m: &MockServer) -> GeminiBatch {
    gemini(m).with_inline_limit(1_000)
}

async fn submit(b: &GeminiBatch, tag: &str, batch: &[BatchLine]) -> String {
    b.submit(SubmitSpec {
        tag,
        model: MODEL,
        lines: batch,
    })
    .await
    .expect("submit")
    .provider_batch_id
}

async fn settle(b: &dyn BatchProvider, id: &str) -> (BatchStatus, Vec<String>) {
    let started = Instant::now();
    let mut seen = Vec::new();
    loop {
        let s = b.poll(id).await.expect("poll");
        if seen.last() != Some(&s.state.as_str().to_string()) {
            seen.push(s.state.as_str().to_string());
        }
        if s.state.is_terminal() && !s.results_pending {
            return (s, seen);
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "stuck: {seen:?}"
        );
        let wait = b
            .poll_after(&s.state, started.elapsed())
            .max(Duration::from_millis(20));
        tokio::time::sleep(wait.min(Duration::from_millis(200))).await;
    }
}

async fn collect(
    b: &dyn BatchProvider,
    status: &BatchStatus,
    batch: &[BatchLine],
) -> (Vec<ResultLine>, ResultsSummary) {
    let expected: HashSet<String> = batch.iter().map(|l| l.custom_id.clone()).collect();
    let mut got = Vec::new();
    let summary = b
        .results(status, &expected, &mut |l| got.push(l))
        .await
        .expect("results");
    (got, summary)
}

fn tally(lines: &[ResultLine]) -> (usize, usize, usize) {
    let mut t = (0, 0, 0);
    for l in lines {
        match &l.outcome {
            LineOutcome::Answer(_) => t.0 += 1,
            LineOutcome::Error(_) => t.1 += 1,
            LineOutcome::NotRun(_) => t.2 += 1,
        }
    }
    t
}

fn unique(lines: &[ResultLine]) -> bool {
    let ids: HashSet<&str> = lines.iter().map(|l| l.custom_id.as_str()).collect();
    ids.len() == lines.len()
}

fn assert_answers_follow_the_schema(got: &[ResultLine]) {
    for l in got {
        let LineOutcome::Answer(a) = &l.outcome else {
            panic!("{l:?}")
        };
        let v: serde_json::Value = serde_json::from_str(a.content.as_deref().unwrap()).unwrap();
        assert!(v.get("confidence").is_some(), "schema followed: {v}");
        assert!(a.usage.is_some_and(|u| u.input_tokens > 0));
    }
}

/// No request carried the key in its URL, and the key is nowhere in the log.
fn assert_key_never_in_a_url(m: &MockServer) {
    let log = m.log();
    assert!(
        log.iter().all(|e| e.outcome != "key_in_url"),
        "a request put the key in its URL"
    );
    let text = serde_json::to_string(&log).unwrap();
    assert!(!text.contains(KEY), "the key is in the mock's log");
}

#[tokio::test]
async fn an_inline_batch_answers_every_line_once() {
    let m = mock(|_| {}).await;
    let b = gemini(&m);
    let batch = lines("inline", N);
    let id = submit(&b, "inline", &batch).await;
    assert!(id.starts_with("batches/"), "{id}");
    let (status, seen) = settle(&b, &id).await;
    assert_eq!(status.state, BatchState::Completed);
    assert!(seen.contains(&"in_progress".to_string()), "{seen:?}");
    assert_eq!(status.counts.total, N as u64);
    assert!(
        status
            .output_ref
            .as_deref()
            .unwrap()
            .starts_with(INLINE_REF),
        "{:?}",
        status.output_ref
    );
    let (got, summary) = collect(&b, &status, &batch).await;
    assert_eq!(tally(&got), (N, 0, 0));
    assert!(unique(&got) && summary.quarantined.is_empty() && !summary.cut);
    assert_answers_follow_the_schema(&got);
    let stats = m.stats();
    assert_eq!((stats.batches_created, stats.files_uploaded), (1, 0));
    assert_key_never_in_a_url(&m);
}

#[tokio::test]
async fn a_batch_over_the_inline_limit_goes_through_a_file() {
    let m = mock(|_| {}).await;
    let b = gemini_file(&m);
    let batch = lines("file", N);
    let sub = b
        .submit(SubmitSpec {
            tag: "file",
            model: MODEL,
            lines: &batch,
        })
        .await
        .expect("submit");
    assert!(
        sub.input_file_id.as_deref().unwrap().starts_with("files/"),
        "{sub:?}"
    );
    let (status, _) = settle(&b, &sub.provider_batch_id).await;
    assert_eq!(status.state, BatchState::Completed);
    assert!(status.output_ref.as_deref().unwrap().starts_with("files/"));
    let (got, summary) = collect(&b, &status, &batch).await;
    assert_eq!(tally(&got), (N, 0, 0));
    assert!(unique(&got) && summary.quarantined.is_empty() && !summary.cut);
    assert_answers_follow_the_schema(&got);
    let stats = m.stats();
    assert_eq!((stats.batches_created, stats.files_uploaded), (1, 1));
    assert_key_never_in_a_url(&m);
}

#[tokio::test]
async fn per_request_errors_never_fail_the_batch() {
    let m = mock(|c| c.batch_fail_rate = 0.3).await;
    for b in [gemini(&m), gemini_file(&m)] {
        let batch = lines("partial", N);
        let id = submit(&b, "partial", &batch).await;
        let (status, _) = settle(&b, &id).await;
        assert_eq!(status.state, BatchState::Completed);
        let (got, summary) = collect(&b, &status, &batch).await;
        let (ok, failed, not_run) = tally(&got);
        assert!(failed > 0 && ok > 0, "{ok} ok, {failed} failed");
        assert_eq!((ok + failed, not_run), (N, 0));
        assert_eq!(status.counts.failed, failed as u64);
        assert!(unique(&got) && summary.quarantined.is_empty());
        for l in &got {
            if let LineOutcome::Error(e) = &l.outcome {
                assert_eq!(e.class, ErrorClass::Transient, "{e}");
                assert_eq!(e.http_status, Some(500), "{e}");
            }
        }
    }
}

#[tokio::test]
async fn an_expired_batch_keeps_its_finished_lines() {
    let m = mock(|c| c.batch_expire = 0.5).await;
    for b in [gemini(&m), gemini_file(&m)] {
        let batch = lines("expire", N);
        let id = submit(&b, "expire", &batch).await;
        let (status, _) = settle(&b, &id).await;
        assert_eq!(status.state, BatchState::Expired);
        assert!(!status.results_pending);
        let (got, summary) = collect(&b, &status, &batch).await;
        let (ok, failed, not_run) = tally(&got);
        assert!(
            ok > 0 && not_run > 0,
            "{ok} answered (paid), {not_run} not run"
        );
        // No result written for what never ran: each comes back NotRun.
        assert_eq!(ok + failed + not_run, N, "every line accounted for");
        assert!(unique(&got) && summary.missing.is_empty());
    }
}

#[tokio::test]
async fn cancel_is_idempotent_and_keeps_what_finished() {
    let m = mock(|c| {
        c.batch_running_ms = 3000;
        c.batch_cancelling_ms = 600;
    })
    .await;
    let b = gemini(&m);
    let batch = lines("cancel", N);
    let id = submit(&b, "cancel", &batch).await;
    let started = Instant::now();
    loop {
        let s = b.poll(&id).await.unwrap();
        if s.state == BatchState::InProgress && s.counts.completed > 0 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "never ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first = b.cancel(&id).await.expect("cancel");
    assert_eq!(first.state, BatchState::Cancelling);
    let again = b.cancel(&id).await.expect("cancel again");
    assert!(matches!(
        again.state,
        BatchState::Cancelling | BatchState::Cancelled
    ));
    // The long cancelling period: still not cancelled a moment later.
    let s = b.poll(&id).await.unwrap();
    assert!(!s.state.is_terminal(), "{:?}", s.state);
    let (status, seen) = settle(&b, &id).await;
    assert_eq!(status.state, BatchState::Cancelled, "{seen:?}");
    let (got, summary) = collect(&b, &status, &batch).await;
    let (ok, failed, not_run) = tally(&got);
    assert!(
        ok > 0 && not_run > 0,
        "{ok} finished before the cancel, {not_run} not run"
    );
    assert_eq!(ok + failed + not_run, N, "every line accounted for");
    assert!(unique(&got) && summary.missing.is_empty());
    let done = b.cancel(&id).await.expect("cancel when done");
    assert_eq!(done.state, BatchState::Cancelled);
    // A finished batch: cancel answers where it is, not an error.
    let other = lines("finished", 4);
    let id = submit(&b, "finished", &other).await;
    settle(&b, &id).await;
    let done = b.cancel(&id).await.expect("cancel a succeeded batch");
    assert_eq!(done.state, BatchState::Completed);
    assert_eq!(m.stats().batches_cancelled, 1);
}

#[tokio::test]
async fn results_late_after_succeeded_are_waited_for() {
    let m = mock(|c| c.batch_output_late_ms = 700).await;
    let b = gemini(&m);
    let batch = lines("late", N);
    let id = submit(&b, "late", &batch).await;
    let started = Instant::now();
    let mut saw_pending = false;
    let status = loop {
        let s = b.poll(&id).await.unwrap();
        if s.state == BatchState::Completed && s.results_pending {
            saw_pending = true;
            assert!(s.output_ref.is_none());
        }
        if s.state.is_terminal() && !s.results_pending {
            break s;
        }
        assert!(started.elapsed() < Duration::from_secs(20));
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        saw_pending,
        "succeeded without results was seen and waited on"
    );
    let (got, _) = collect(&b, &status, &batch).await;
    assert_eq!(tally(&got), (N, 0, 0));
}

#[tokio::test]
async fn a_cut_responses_file_is_reported_and_fetched_again() {
    let m = mock(|c| c.batch_cut_results = 1).await;
    let b = gemini_file(&m);
    let batch = lines("cut", N);
    let id = submit(&b, "cut", &batch).await;
    let (status, _) = settle(&b, &id).await;
    let (first, summary) = collect(&b, &status, &batch).await;
    assert!(summary.cut, "the cut is reported");
    assert!(first.len() < N, "only whole lines: {}", first.len());
    let (second, summary) = collect(&b, &status, &batch).await;
    assert!(!summary.cut);
    assert_eq!(tally(&second), (N, 0, 0));
    let all: HashSet<&str> = second.iter().map(|l| l.custom_id.as_str()).collect();
    assert!(first.iter().all(|l| all.contains(l.custom_id.as_str())));
}

#[tokio::test]
async fn a_lost_create_is_found_by_display_name_and_never_resubmitted() {
    let m = mock(|_| {}).await;
    let b = gemini(&m);
    // Other batches around it, so `find` has to tell them apart.
    for i in 0..3 {
        submit(&b, &format!("other-{i}"), &lines("other", 2)).await;
    }
    let mut cfg = m.config();
    cfg.batch_lose_create = 1;
    m.set_config(cfg);
    let batch = lines("lost", N);
    let before = docket::ledger::now_ts() - 1.0;
    let err = b
        .submit(SubmitSpec {
            tag: "lost",
            model: MODEL,
            lines: &batch,
        })
        .await
        .expect_err("the create answer is lost");
    assert!(err.class.is_retryable(), "{err}");
    let Found::One(id) = b.find("lost", before, N).await.expect("find") else {
        panic!("expected exactly one")
    };
    // A local clock a few seconds fast: the batch still counts.
    let fast = docket::ledger::now_ts() + 5.0;
    assert_eq!(
        b.find("lost", fast, N).await.unwrap(),
        Found::One(id.clone())
    );
    assert_eq!(
        b.find("someone-else", before, N).await.unwrap(),
        Found::None
    );
    // Our name with another count cannot be told apart: never guessed safe.
    assert!(matches!(
        b.find("lost", before, N + 1).await.unwrap(),
        Found::Ambiguous(_)
    ));
    let (status, _) = settle(&b, &id).await;
    assert_eq!(status.state, BatchState::Completed);
    let (got, _) = collect(&b, &status, &batch).await;
    assert_eq!(tally(&got), (N, 0, 0));
    assert_eq!(
        m.stats().batches_created,
        4,
        "one batch for the lost create, never a second"
    );
}

#[tokio::test]
async fn the_enqueued_token_limit_refuses_the_create() {
    let m = mock(|c| c.batch_enqueued_token_limit = 50).await;
    let b = gemini(&m);
    let batch = lines("tokens", N);
    let err = b
        .submit(SubmitSpec {
            tag: "tokens",
            model: MODEL,
            lines: &batch,
        })
        .await
        .expect_err("over the enqueued-token limit");
    assert_eq!(err.class, ErrorClass::RateLimited, "{err}");
    assert_eq!(err.http_status, Some(429));
    assert!(err.message.contains("RESOURCE_EXHAUSTED"), "{err}");
    assert_eq!(m.stats().batches_created, 0);
}

#[tokio::test]
async fn the_mock_refuses_a_key_in_the_url() {
    let m = mock(|_| {}).await;
    let client = reqwest::Client::new();
    let r = client
        .get(format!("{}/v1beta/batches?key=AIzaInUrl", root(&m)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    assert!(m.log().iter().any(|e| e.outcome == "key_in_url"));
    let r = client
        .get(format!("{}/v1beta/batches", root(&m)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403, "no x-goog-api-key");
    // The list's shape: operations + nextPageToken.
    let b = gemini(&m);
    for i in 0..3 {
        submit(&b, &format!("page-{i}"), &lines("page", 1)).await;
    }
    let page: serde_json::Value = client
        .get(format!("{}/v1beta/batches?pageSize=2", root(&m)))
        .header("x-goog-api-key", KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(page["operations"].as_array().unwrap().len(), 2);
    assert_eq!(
        page["operations"][0]["metadata"]["@type"],
        "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch"
    );
    assert!(page["nextPageToken"].is_string());
}
