//! The Gemini batch-mode adapter against the built-in mock's Gemini batch
//! and Files endpoints, over loopback: inline and file input, per-request
//! errors, expiry, cancel, late results, a cut responses file, a lost create
//! found by display name, the enqueued-token limit, and the key kept out of
//! every URL.

use docket_testkit as support;

use docket::mock::MockServer;
use docket::provider::batch::gemini::{GeminiBatch, INLINE_REF, PollCadence};
use docket::provider::batch::{
    BatchLine, BatchProvider, BatchState, Found, LineOutcome, SubmitSpec,
};
use docket::provider::{ApiKey, ErrorClass};
use support::batch::{
    assert_answers_follow_the_schema, collect, find_the_lost_one, mock, settle,
    settle_seeing_pending, submit_refused, tally, unique, wait_until_some_completed, within,
};

const N: usize = 40;
const MODEL: &str = "gemini-2.5-flash";
const KEY: &str = "AIzaGeminiBatchCanary-123";

fn lines(tag: &str, n: usize) -> Vec<BatchLine> {
    support::batch::lines(MODEL, "Answer in JSON.", tag, n)
}

async fn submit(b: &dyn BatchProvider, tag: &str, batch: &[BatchLine]) -> String {
    support::batch::submit(b, MODEL, tag, batch).await
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
    wait_until_some_completed(&b, &id).await;
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
    let (status, saw_pending) = settle_seeing_pending(&b, &id).await;
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
    assert!(within(&first, &second));
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
    let err = submit_refused(&b, MODEL, "lost", &batch, "the create answer is lost").await;
    assert!(err.class.is_retryable(), "{err}");
    // Exactly one, also by a clock a few seconds fast; none for another tag.
    let id = find_the_lost_one(&b, "lost", before, N).await;
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
    let err = submit_refused(&b, MODEL, "tokens", &batch, "over the enqueued-token limit").await;
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
