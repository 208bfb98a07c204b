//! The OpenAI and Azure Batch adapter against the built-in mock's Files and
//! Batches endpoints, over loopback: every lifecycle the issue names, with
//! the mock's clock compressed to seconds and the adapter polling at the
//! mock's pace.

use docket_testkit as support;

use docket::mock::{MockConfig, MockServer};
use docket::provider::batch::openai::{OpenAiBatch, PollCadence};
use docket::provider::batch::{
    BatchLine, BatchProvider, BatchState, LineOutcome, ResultLine, ResultsSummary,
};
use docket::provider::{ApiKey, ErrorClass};
use support::batch::{
    assert_answers_follow_the_schema, collect, find_the_lost_one, mock, settle,
    settle_seeing_pending, submit_refused, tally, unique, wait_until_some_completed, within,
};

const N: usize = 40;
const MODEL: &str = "gpt-4o-mini";

fn lines(tag: &str, n: usize) -> Vec<BatchLine> {
    support::batch::lines(MODEL, "Answer in JSON.", tag, n)
}

async fn submit(b: &dyn BatchProvider, tag: &str, batch: &[BatchLine]) -> String {
    support::batch::submit(b, MODEL, tag, batch).await
}

fn openai(m: &MockServer) -> OpenAiBatch {
    OpenAiBatch::openai("openai", &m.base_url(), Some(ApiKey::new("sk-batch-test")))
        .unwrap()
        .with_cadence(PollCadence::fast())
}

/// `N` lines under `tag`, on a mock tweaked by `tweak`, polled until they
/// have ended (checked to be in `state`): what reading the results brought.
async fn run_until_ended(
    tweak: impl FnOnce(&mut MockConfig),
    tag: &str,
    state: BatchState,
) -> (Vec<ResultLine>, ResultsSummary) {
    let m = mock(tweak).await;
    let b = openai(&m);
    let batch = lines(tag, N);
    let id = submit(&b, tag, &batch).await;
    let (status, _) = settle(&b, &id).await;
    assert_eq!(status.state, state);
    collect(&b, &status, &batch).await
}

#[tokio::test]
async fn a_normal_batch_answers_every_line_once() {
    let m = mock(|_| {}).await;
    let b = openai(&m);
    let batch = lines("normal", N);
    let id = submit(&b, "normal", &batch).await;
    let (status, seen) = settle(&b, &id).await;
    assert_eq!(status.state, BatchState::Completed);
    assert!(seen.contains(&"in_progress".to_string()), "{seen:?}");
    assert_eq!(status.counts.total, N as u64);
    let (got, summary) = collect(&b, &status, &batch).await;
    assert_eq!(tally(&got), (N, 0, 0));
    assert!(unique(&got) && summary.quarantined.is_empty() && !summary.cut);
    assert_answers_follow_the_schema(&got);
    assert_eq!(m.stats().batches_created, 1);
}

#[tokio::test]
async fn per_line_failures_never_fail_the_batch() {
    let (got, summary) = run_until_ended(
        |c| c.batch_fail_rate = 0.3,
        "partial",
        BatchState::Completed,
    )
    .await;
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
    let (got, _) = run_until_ended(|c| c.batch_expire = 0.5, "expire", BatchState::Expired).await;
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
    let id = submit(&b, "cancel", &batch).await;
    // Let part of it run.
    wait_until_some_completed(&b, &id).await;
    let first = b.cancel(&id).await.expect("cancel");
    assert!(
        matches!(first.state, BatchState::Cancelling | BatchState::Cancelled),
        "{:?}",
        first.state
    );
    let again = b.cancel(&id).await.expect("cancel again");
    assert!(matches!(
        again.state,
        BatchState::Cancelling | BatchState::Cancelled
    ));
    let (status, seen) = settle(&b, &id).await;
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
    let done = b.cancel(&id).await.expect("cancel when done");
    assert_eq!(done.state, BatchState::Cancelled);
}

#[tokio::test]
async fn an_output_file_late_after_completed_is_waited_for() {
    let m = mock(|c| c.batch_output_late_ms = 700).await;
    let b = openai(&m);
    let batch = lines("late", N);
    let id = submit(&b, "late", &batch).await;
    let (status, saw_pending) = settle_seeing_pending(&b, &id).await;
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
    let id = submit(&b, "cut", &batch).await;
    let (status, _) = settle(&b, &id).await;
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
    assert!(within(&first, &second));
}

#[tokio::test]
async fn a_lost_create_answer_is_found_again_and_never_resubmitted() {
    let m = mock(|c| c.batch_lose_create = 1).await;
    let b = openai(&m);
    let batch = lines("lost", N);
    let before = docket::ledger::now_ts() - 1.0;
    let err = submit_refused(&b, MODEL, "lost", &batch, "the create answer is lost").await;
    assert!(err.class.is_retryable(), "{err}");
    // The batch exists at the provider: find it instead of submitting again.
    // Exactly one, also by a clock a few seconds fast; none for another tag.
    let id = find_the_lost_one(&b, "lost", before, N).await;
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
    let id = submit(&b, "azure", &batch).await;
    let (status, _) = settle(&b, &id).await;
    assert_eq!(status.state, BatchState::Completed);
    let (got, _) = collect(&b, &status, &batch).await;
    assert_eq!(tally(&got), (12, 0, 0));
    assert!(
        m.log().iter().any(|e| e.route.starts_with("/openai/")),
        "Azure routes used"
    );
}

/// A sink that takes `limit` lines and then has no room until released.
struct Slow {
    got: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    limit: usize,
    release: std::sync::Arc<tokio::sync::Notify>,
}

impl docket::provider::batch::ResultSink for Slow {
    fn accept(&mut self, _line: ResultLine) {
        self.got.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    fn room(&mut self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            if self.got.load(std::sync::atomic::Ordering::SeqCst) >= self.limit {
                self.release.notified().await;
                self.limit = usize::MAX;
            }
        })
    }
}

/// Results are read only as fast as the sink takes them: while it has no
/// room, the download waits (a piece of it past the limit at most), and
/// it goes on to the end once there is room again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_results_read_waits_while_the_sink_has_no_room() {
    let n = 3_000;
    let m = mock(|_| {}).await;
    let b = openai(&m);
    let batch = lines("slow", n);
    let id = submit(&b, "slow", &batch).await;
    let (status, _) = settle(&b, &id).await;
    assert_eq!(status.state, BatchState::Completed);
    let expected: std::collections::HashSet<String> =
        batch.iter().map(|l| l.custom_id.clone()).collect();
    let got = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let release = std::sync::Arc::new(tokio::sync::Notify::new());
    let mut sink = Slow {
        got: got.clone(),
        limit: 100,
        release: release.clone(),
    };
    let reading = b.results(&status, &expected, &mut sink);
    tokio::pin!(reading);
    let early = tokio::time::timeout(std::time::Duration::from_millis(500), &mut reading).await;
    assert!(early.is_err(), "the read finished without room in the sink");
    let stalled = got.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        (100..n / 2).contains(&stalled),
        "{stalled} lines taken while the sink had no room"
    );
    release.notify_one();
    let summary = reading.await.expect("results");
    assert_eq!(got.load(std::sync::atomic::Ordering::SeqCst), n);
    assert!(!summary.cut && summary.quarantined.is_empty());
}
