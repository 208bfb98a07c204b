//! The Anthropic Message Batches adapter against the built-in mock's
//! `/v1/messages/batches` endpoints, over loopback: every lifecycle the
//! issue names, with the mock's clock compressed to seconds and the adapter
//! polling at the mock's pace.

use docket_testkit as support;

use std::time::Duration;

use docket::mock::MockServer;
use docket::provider::batch::anthropic::{self, AnthropicBatch};
use docket::provider::batch::{
    BatchLine, BatchProvider, BatchState, FIND_CLOCK_MARGIN, Found, LineOutcome,
};
use docket::provider::{ApiKey, ErrorClass};
use support::batch::{
    assert_answers_follow_the_schema, collect, mock, settle, settle_seeing_pending, submit_refused,
    tally, unique, within,
};

const N: usize = 40;
const MODEL: &str = "claude-haiku-4-5";

fn lines(tag: &str, n: usize) -> Vec<BatchLine> {
    support::batch::lines(MODEL, "You are an adjudicator.", tag, n)
}

async fn submit(b: &dyn BatchProvider, tag: &str, batch: &[BatchLine]) -> String {
    support::batch::submit(b, MODEL, tag, batch).await
}

fn adapter(m: &MockServer) -> AnthropicBatch {
    AnthropicBatch::new(&m.base_url(), ApiKey::new("sk-ant-batch-test"))
        .unwrap()
        .with_cadence(anthropic::fast())
}

#[tokio::test]
async fn a_normal_batch_answers_every_line_once() {
    let m = mock(|_| {}).await;
    let b = adapter(&m);
    let batch = lines("normal", N);
    let id = submit(&b, "normal", &batch).await;
    assert!(id.starts_with("msgbatch_"), "{id}");
    let first = b.poll(&id).await.unwrap();
    assert_eq!(first.state, BatchState::InProgress);
    assert_eq!(
        (first.counts.total, first.counts.completed),
        (N as u64, 0),
        "everything is processing until the end"
    );
    let (status, seen) = settle(&b, &id).await;
    assert_eq!(status.state, BatchState::Completed, "{seen:?}");
    assert_eq!(seen, ["in_progress", "completed"]);
    assert_eq!((status.counts.total, status.counts.completed), (40, 40));
    assert!(status.output_ref.as_deref().unwrap().ends_with("/results"));
    let (got, summary) = collect(&b, &status, &batch).await;
    assert_eq!(tally(&got), (N, 0, 0));
    assert!(unique(&got) && summary.quarantined.is_empty() && !summary.cut);
    assert_answers_follow_the_schema(&got);
    for l in &got {
        let LineOutcome::Answer(a) = &l.outcome else {
            unreachable!()
        };
        assert_eq!(a.model.as_deref(), Some(MODEL));
    }
    // Shuffled: not in submission order.
    let order: Vec<&str> = got.iter().map(|l| l.custom_id.as_str()).collect();
    let submitted: Vec<&str> = batch.iter().map(|l| l.custom_id.as_str()).collect();
    assert_ne!(order, submitted);
    assert_eq!(m.stats().batches_created, 1);
    assert_eq!(m.stats().batches_completed, 1);
    let log = m.log();
    assert!(
        log.iter()
            .any(|e| e.provider == "anthropic" && e.outcome == "batch_created")
    );
}

#[tokio::test]
async fn per_line_errors_never_fail_the_batch() {
    let m = mock(|c| c.batch_fail_rate = 0.3).await;
    let b = adapter(&m);
    let mut batch = lines("partial", N);
    // Params are validated only when they run: an errored line, not a 400.
    batch[7].request.max_tokens = 0;
    let id = submit(&b, "partial", &batch).await;
    let (status, _) = settle(&b, &id).await;
    assert_eq!(status.state, BatchState::Completed);
    let (got, summary) = collect(&b, &status, &batch).await;
    let (ok, failed, not_run) = tally(&got);
    assert!(failed > 1 && ok > 0, "{ok} ok, {failed} failed");
    assert_eq!((ok + failed, not_run), (N, 0));
    assert!(unique(&got) && summary.quarantined.is_empty());
    assert_eq!(status.counts.completed as usize, ok);
    assert_eq!(status.counts.failed as usize, failed);
    for l in &got {
        if let LineOutcome::Error(e) = &l.outcome {
            if l.custom_id == batch[7].custom_id {
                assert_eq!(e.class, ErrorClass::Request, "{e}");
                assert!(e.message.contains("invalid_request_error"), "{e}");
            } else {
                assert_eq!(e.class, ErrorClass::Transient, "{e}");
                assert!(e.message.contains("api_error"), "{e}");
            }
        }
    }
}

#[tokio::test]
async fn an_expired_batch_keeps_its_finished_lines_and_returns_the_rest() {
    let m = mock(|c| c.batch_expire = 0.5).await;
    let b = adapter(&m);
    let batch = lines("expire", N);
    let id = submit(&b, "expire", &batch).await;
    let (status, _) = settle(&b, &id).await;
    assert_eq!(status.state, BatchState::Expired);
    let (got, _) = collect(&b, &status, &batch).await;
    let (ok, failed, not_run) = tally(&got);
    assert!(
        ok > 0 && not_run > 0,
        "{ok} answered (paid), {not_run} not run"
    );
    assert_eq!((ok + failed + not_run, failed), (N, 0), "every line once");
    assert!(unique(&got));
    assert_eq!(m.stats().batches_expired, 1);
}

#[tokio::test]
async fn cancel_is_idempotent_with_a_long_canceling_state() {
    let m = mock(|c| {
        c.batch_running_ms = 3000;
        c.batch_cancelling_ms = 800;
    })
    .await;
    let b = adapter(&m);
    let batch = lines("cancel", N);
    let id = submit(&b, "cancel", &batch).await;
    // Let part of it run (counts do not show it: wait past validating).
    tokio::time::sleep(Duration::from_millis(900)).await;
    let first = b.cancel(&id).await.expect("cancel");
    assert_eq!(first.state, BatchState::Cancelling);
    let again = b.cancel(&id).await.expect("cancel again");
    assert_eq!(again.state, BatchState::Cancelling);
    let (status, seen) = settle(&b, &id).await;
    assert_eq!(seen, ["cancelling", "cancelled"]);
    assert_eq!(status.state, BatchState::Cancelled);
    let (got, _) = collect(&b, &status, &batch).await;
    let (ok, failed, not_run) = tally(&got);
    assert!(
        ok > 0 && not_run > 0,
        "{ok} finished before the cancel, {not_run} canceled"
    );
    assert_eq!(
        ok + failed + not_run,
        N,
        "a canceled line for each unrun one"
    );
    // Cancelling an ended batch is not an error either.
    let done = b.cancel(&id).await.expect("cancel when done");
    assert_eq!(done.state, BatchState::Cancelled);
    assert_eq!(m.stats().batches_cancelled, 1);
    // A batch that ended on its own: the mock refuses, the adapter says where it is.
    let other = lines("done", 3);
    let id = submit(&b, "done", &other).await;
    settle(&b, &id).await;
    let s = b.cancel(&id).await.expect("cancel a completed batch");
    assert_eq!(s.state, BatchState::Completed);
}

#[tokio::test]
async fn results_late_after_ended_are_waited_for() {
    let m = mock(|c| c.batch_output_late_ms = 700).await;
    let b = adapter(&m);
    let batch = lines("late", N);
    let id = submit(&b, "late", &batch).await;
    let (status, saw_pending) = settle_seeing_pending(&b, &id).await;
    assert!(
        saw_pending,
        "ended without results_url was seen and not ingested"
    );
    let (got, _) = collect(&b, &status, &batch).await;
    assert_eq!(tally(&got), (N, 0, 0));
}

#[tokio::test]
async fn a_results_stream_cut_mid_line_is_reported_and_fetched_again() {
    let m = mock(|c| c.batch_cut_results = 1).await;
    let b = adapter(&m);
    let batch = lines("cut", N);
    let id = submit(&b, "cut", &batch).await;
    let (status, _) = settle(&b, &id).await;
    let (first, summary) = collect(&b, &status, &batch).await;
    assert!(summary.cut, "the cut is reported");
    assert!(
        !first.is_empty() && first.len() < N,
        "only whole lines before the cut: {}",
        first.len()
    );
    assert!(summary.quarantined.is_empty(), "{:?}", summary.quarantined);
    let (second, summary) = collect(&b, &status, &batch).await;
    assert!(!summary.cut);
    assert_eq!(tally(&second), (N, 0, 0));
    assert!(within(&first, &second));
}

#[tokio::test]
async fn a_lost_create_answer_is_found_again_by_time_and_count() {
    let m = mock(|_| {}).await;
    let b = adapter(&m);
    // An older batch of the same size, just before the submission: inside
    // the clock-skew margin, so a candidate too.
    let old = lines("old", N);
    let old_id = submit(&b, "old", &old).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = docket::ledger::now_ts();
    let mut cfg = m.config();
    cfg.batch_lose_create = 1;
    m.set_config(cfg);
    let batch = lines("lost", N);
    let err = submit_refused(&b, MODEL, "lost", &batch, "the create answer is lost").await;
    assert!(err.class.is_retryable(), "{err}");
    assert_eq!(m.stats().batches_created, 2, "the batch was made");
    // The batch exists at the provider: find it instead of submitting again.
    // Anthropic keeps no tag: the old batch of the same size, inside the
    // margin, cannot be told apart (the safe side: never resubmitted).
    let found = b.find("lost", before, N).await.expect("find");
    let Found::Ambiguous(ids) = found else {
        panic!("expected both candidates, got {found:?}")
    };
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert_eq!(ids[1], old_id, "newest first");
    let id = ids[0].clone();
    // Another size: nothing of ours.
    assert_eq!(b.find("lost", before, N + 1).await.unwrap(), Found::None);
    let (status, _) = settle(&b, &id).await;
    let (got, _) = collect(&b, &status, &batch).await;
    assert_eq!(tally(&got), (N, 0, 0));
    assert_eq!(m.stats().batches_created, 2, "never a second one for it");
    let created: Vec<_> = m
        .log()
        .into_iter()
        .filter(|e| e.outcome == "batch_created")
        .map(|e| (e.status, e.batch_id.unwrap()))
        .collect();
    assert_eq!(created.len(), 2);
    assert_eq!(created[1], (500, id));
}

#[tokio::test]
async fn two_batches_of_the_same_size_in_the_window_are_ambiguous() {
    let m = mock(|_| {}).await;
    let b = adapter(&m);
    let before = docket::ledger::now_ts() - 1.0;
    let a = submit(&b, "a", &lines("a", N)).await;
    let c = submit(&b, "c", &lines("c", N)).await;
    let small = submit(&b, "s", &lines("s", 3)).await;
    let Found::Ambiguous(ids) = b.find("a", before, N).await.unwrap() else {
        panic!("two candidates cannot be told apart")
    };
    assert_eq!(ids, vec![c, a], "newest first");
    assert_eq!(
        b.find("s", before, 3).await.unwrap(),
        Found::One(small.clone())
    );
    // A local clock a few seconds fast: the batches still count.
    let fast = docket::ledger::now_ts() + 5.0;
    assert_eq!(b.find("s", fast, 3).await.unwrap(), Found::One(small));
    // After the window and its margin: none.
    let later = docket::ledger::now_ts() + FIND_CLOCK_MARGIN + 5.0;
    assert_eq!(b.find("a", later, N).await.unwrap(), Found::None);
}

#[tokio::test]
async fn the_mock_speaks_anthropic_shapes_and_pages_newest_first() {
    let m = mock(|_| {}).await;
    let b = adapter(&m);
    let ids = [
        submit(&b, "p0", &lines("p0", 1)).await,
        submit(&b, "p1", &lines("p1", 2)).await,
        submit(&b, "p2", &lines("p2", 3)).await,
    ];
    let root = m.base_url();
    let client = reqwest::Client::new();
    let get = |url: String| {
        client
            .get(url)
            .header("x-api-key", "k")
            .header("anthropic-version", "2023-06-01")
            .send()
    };
    let page: serde_json::Value = get(format!("{root}/messages/batches?limit=2"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(page["has_more"], true);
    assert_eq!(page["first_id"], ids[2].as_str());
    assert_eq!(page["last_id"], ids[1].as_str());
    let one = &page["data"][0];
    assert_eq!(one["type"], "message_batch");
    assert_eq!(one["processing_status"], "in_progress");
    assert_eq!(one["request_counts"]["processing"], 3);
    for k in [
        "ended_at",
        "cancel_initiated_at",
        "archived_at",
        "results_url",
    ] {
        assert!(one[k].is_null(), "{k}");
    }
    let created = one["created_at"].as_str().unwrap();
    assert!(created.ends_with('Z') && created.contains('T'), "{created}");
    let next: serde_json::Value = get(format!(
        "{root}/messages/batches?limit=2&after_id={}",
        ids[1]
    ))
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(next["has_more"], false);
    assert_eq!(next["data"][0]["id"], ids[0].as_str());
    // Auth: no key is a 401 in Anthropic's error shape.
    let r = client
        .get(format!("{root}/messages/batches/{}", ids[0]))
        .header("anthropic-version", "2023-06-01")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let e: serde_json::Value = r.json().await.unwrap();
    assert_eq!(e["type"], "error");
    assert_eq!(e["error"]["type"], "authentication_error");
    // A bad custom_id is refused at create, naming the request.
    let r = client
        .post(format!("{root}/messages/batches"))
        .header("x-api-key", "k")
        .header("anthropic-version", "2023-06-01")
        .json(&serde_json::json!({"requests": [
            {"custom_id": "ok-1", "params": {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}},
            {"custom_id": "x".repeat(65), "params": {"model": "m", "max_tokens": 5, "messages": []}}
        ]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let e: serde_json::Value = r.json().await.unwrap();
    assert_eq!(
        e["error"]["message"],
        "requests.1.custom_id: String should have at most 64 characters"
    );
}

#[tokio::test]
async fn the_enqueued_limit_refuses_a_create_with_a_429() {
    let m = mock(|c| {
        // One batch of N (about 1,000 prompt tokens: the schema goes as
        // `output_config`, not in the prompt) fits; a second does not.
        c.batch_enqueued_token_limit = 1500;
        c.batch_running_ms = 2000;
    })
    .await;
    let b = adapter(&m);
    submit(&b, "q1", &lines("q1", N)).await;
    let e = submit_refused(&b, MODEL, "q2", &lines("q2", N), "over the queue limit").await;
    assert_eq!(e.class, ErrorClass::RateLimited, "{e}");
    assert!(e.headers.retry_after.is_some(), "{e:?}");
    assert_eq!(
        m.stats().batches_created,
        1,
        "the refused batch is not made"
    );
}
