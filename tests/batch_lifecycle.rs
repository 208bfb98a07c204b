//! The OpenAI and Azure Batch adapter against the built-in mock's Files and
//! Batches endpoints, over loopback: every lifecycle the issue names, with
//! the mock's clock compressed to seconds and the adapter polling at the
//! mock's pace.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use docket::mock::{MockConfig, MockServer};
use docket::provider::batch::openai::{OpenAiBatch, PollCadence};
use docket::provider::batch::{
    BatchLine, BatchProvider, BatchState, BatchStatus, Found, LineOutcome, ResultLine,
    ResultsSummary, SubmitSpec,
};
use docket::provider::{ApiKey, ChatRequest, ErrorClass};

const N: usize = 40;

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
                model: "gpt-4o-mini".into(),
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

fn openai(m: &MockServer) -> OpenAiBatch {
    OpenAiBatch::openai("openai", &m.base_url(), Some(ApiKey::new("sk-batch-test")))
        .unwrap()
        .with_cadence(PollCadence::fast())
}

/// Poll until the batch is terminal with its results in place.
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

#[tokio::test]
async fn a_normal_batch_answers_every_line_once() {
    let m = mock(|_| {}).await;
    let b = openai(&m);
    let batch = lines("normal", N);
    let sub = b
        .submit(SubmitSpec {
            tag: "normal",
            model: "gpt-4o-mini",
            lines: &batch,
        })
        .await
        .expect("submit");
    let (status, seen) = settle(&b, &sub.provider_batch_id).await;
    assert_eq!(status.state, BatchState::Completed);
    assert!(seen.contains(&"in_progress".to_string()), "{seen:?}");
    assert_eq!(status.counts.total, N as u64);
    let (got, summary) = collect(&b, &status, &batch).await;
    assert_eq!(tally(&got), (N, 0, 0));
    assert!(unique(&got) && summary.quarantined.is_empty() && !summary.cut);
    for l in &got {
        let LineOutcome::Answer(a) = &l.outcome else {
            unreachable!()
        };
        let v: serde_json::Value = serde_json::from_str(a.content.as_deref().unwrap()).unwrap();
        assert!(v.get("confidence").is_some(), "schema followed: {v}");
        assert!(a.usage.is_some_and(|u| u.input_tokens > 0));
    }
    assert_eq!(m.stats().batches_created, 1);
}

#[tokio::test]
async fn per_line_failures_never_fail_the_batch() {
    let m = mock(|c| c.batch_fail_rate = 0.3).await;
    let b = openai(&m);
    let batch = lines("partial", N);
    let sub = b
        .submit(SubmitSpec {
            tag: "partial",
            model: "gpt-4o-mini",
            lines: &batch,
        })
        .await
        .unwrap();
    let (status, _) = settle(&b, &sub.provider_batch_id).await;
    assert_eq!(status.state, BatchState::Completed);
    let (got, summary) = collect(&b, &status, &batch).await;
    let (ok, failed, not_run) = tally(&got);
    assert!(failed > 0 && ok > 0, "{ok} ok, {failed} failed");
    assert_eq!((ok + failed, not_run), (N, 0));
    assert!(unique(&got) && summary.quarantined.is_empty());
    for l in &got {
        if let LineOutcome::Error(e) = &l.outcome {
            assert_eq!(e.class, ErrorClass::Transient, "{e}");
        }
    }
}

#[tokio::test]
async fn an_expired_batch_keeps_its_finished_lines_and_returns_the_rest() {
    let m = mock(|c| c.batch_expire = 0.5).await;
    let b = openai(&m);
    let batch = lines("expire", N);
    let sub = b
        .submit(SubmitSpec {
            tag: "expire",
            model: "gpt-4o-mini",
            lines: &batch,
        })
        .await
        .unwrap();
    let (status, _) = settle(&b, &sub.provider_batch_id).await;
    assert_eq!(status.state, BatchState::Expired);
    let (got, _) = collect(&b, &status, &batch).await;
    let (ok, failed, not_run) = tally(&got);
    assert!(
        ok > 0 && not_run > 0,
        "{ok} answered (paid), {not_run} not run"
    );
    assert_eq!(ok + failed + not_run, N, "every line accounted for");
    assert!(unique(&got));
}

#[tokio::test]
async fn cancel_is_idempotent_and_keeps_what_finished() {
    let m = mock(|c| {
        c.batch_running_ms = 3000;
        c.batch_cancelling_ms = 400;
    })
    .await;
    let b = openai(&m);
    let batch = lines("cancel", N);
    let sub = b
        .submit(SubmitSpec {
            tag: "cancel",
            model: "gpt-4o-mini",
            lines: &batch,
        })
        .await
        .unwrap();
    // Let part of it run.
    let started = Instant::now();
    loop {
        let s = b.poll(&sub.provider_batch_id).await.unwrap();
        if s.state == BatchState::InProgress && s.counts.completed > 0 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "never ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first = b.cancel(&sub.provider_batch_id).await.expect("cancel");
    assert!(
        matches!(first.state, BatchState::Cancelling | BatchState::Cancelled),
        "{:?}",
        first.state
    );
    let again = b
        .cancel(&sub.provider_batch_id)
        .await
        .expect("cancel again");
    assert!(matches!(
        again.state,
        BatchState::Cancelling | BatchState::Cancelled
    ));
    let (status, seen) = settle(&b, &sub.provider_batch_id).await;
    assert_eq!(status.state, BatchState::Cancelled, "{seen:?}");
    let (got, summary) = collect(&b, &status, &batch).await;
    let (ok, failed, not_run) = tally(&got);
    assert!(
        ok > 0 && not_run > 0,
        "{ok} finished before the cancel, {not_run} not run"
    );
    // A cancelled batch writes no line for what never ran: each comes back NotRun.
    assert_eq!(ok + failed + not_run, N, "every line accounted for");
    assert!(unique(&got) && summary.missing.is_empty());
    // Cancelling a finished batch is not an error either.
    let done = b
        .cancel(&sub.provider_batch_id)
        .await
        .expect("cancel when done");
    assert_eq!(done.state, BatchState::Cancelled);
}

#[tokio::test]
async fn an_output_file_late_after_completed_is_waited_for() {
    let m = mock(|c| c.batch_output_late_ms = 700).await;
    let b = openai(&m);
    let batch = lines("late", N);
    let sub = b
        .submit(SubmitSpec {
            tag: "late",
            model: "gpt-4o-mini",
            lines: &batch,
        })
        .await
        .unwrap();
    let started = Instant::now();
    let mut saw_pending = false;
    let status = loop {
        let s = b.poll(&sub.provider_batch_id).await.unwrap();
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
        "completed without files was seen and not ingested"
    );
    let (got, _) = collect(&b, &status, &batch).await;
    assert_eq!(tally(&got), (N, 0, 0));
}

#[tokio::test]
async fn a_results_stream_cut_mid_line_is_reported_and_fetched_again() {
    let m = mock(|c| c.batch_cut_results = 1).await;
    let b = openai(&m);
    let batch = lines("cut", N);
    let sub = b
        .submit(SubmitSpec {
            tag: "cut",
            model: "gpt-4o-mini",
            lines: &batch,
        })
        .await
        .unwrap();
    let (status, _) = settle(&b, &sub.provider_batch_id).await;
    let (first, summary) = collect(&b, &status, &batch).await;
    assert!(summary.cut, "the cut is reported");
    assert!(
        first.len() < N,
        "only whole lines before the cut: {}",
        first.len()
    );
    let (second, summary) = collect(&b, &status, &batch).await;
    assert!(!summary.cut);
    assert_eq!(tally(&second), (N, 0, 0));
    // What the first read delivered is a subset of the whole.
    let all: HashSet<&str> = second.iter().map(|l| l.custom_id.as_str()).collect();
    assert!(first.iter().all(|l| all.contains(l.custom_id.as_str())));
}

#[tokio::test]
async fn a_lost_create_answer_is_found_again_and_never_resubmitted() {
    let m = mock(|c| c.batch_lose_create = 1).await;
    let b = openai(&m);
    let batch = lines("lost", N);
    let before = docket::ledger::now_ts() - 1.0;
    let err = b
        .submit(SubmitSpec {
            tag: "lost",
            model: "gpt-4o-mini",
            lines: &batch,
        })
        .await
        .expect_err("the create answer is lost");
    assert!(err.class.is_retryable(), "{err}");
    // The batch exists at the provider: find it instead of submitting again.
    let found = b.find("lost", before, N).await.expect("find");
    let Found::One(id) = found else {
        panic!("expected exactly one, got {found:?}")
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
    let (status, _) = settle(&b, &id).await;
    let (got, _) = collect(&b, &status, &batch).await;
    assert_eq!(tally(&got), (N, 0, 0));
    assert_eq!(m.stats().batches_created, 1, "one batch, never a second");
}

#[tokio::test]
async fn azure_runs_the_same_lifecycle_under_its_urls() {
    let m = mock(|_| {}).await;
    let base = m.base_url();
    let base = base.trim_end_matches("/v1");
    let b = OpenAiBatch::azure(base, "2024-10-21", ApiKey::new("az-batch-test"))
        .unwrap()
        .with_cadence(PollCadence::fast());
    let batch = lines("azure", 12);
    let sub = b
        .submit(SubmitSpec {
            tag: "azure",
            model: "gpt-4o-mini",
            lines: &batch,
        })
        .await
        .expect("submit");
    let (status, _) = settle(&b, &sub.provider_batch_id).await;
    assert_eq!(status.state, BatchState::Completed);
    let (got, _) = collect(&b, &status, &batch).await;
    assert_eq!(tally(&got), (12, 0, 0));
    assert!(
        m.log().iter().any(|e| e.route.starts_with("/openai/")),
        "Azure routes used"
    );
}
