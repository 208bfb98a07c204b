//! Shared helpers for the Batch API adapter tests (`batch_lifecycle`,
//! `batch_anthropic`, `batch_gemini`): the built-in mock with its clock
//! compressed to seconds, request lines sharing one schema, and the
//! submit, poll and results steps every lifecycle goes through.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use docket::mock::{MockConfig, MockServer};
use docket::provider::batch::{
    BatchLine, BatchProvider, BatchState, BatchStatus, Found, LineOutcome, ResultLine,
    ResultsSummary, SubmitSpec,
};
use docket::provider::{ChatRequest, ProviderError};

/// The mock on a free loopback port, its batches validating, running and
/// finalizing in under a second; `tweak` adjusts the config first.
pub async fn mock(tweak: impl FnOnce(&mut MockConfig)) -> MockServer {
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

/// `n` lines for `model`, custom ids `{tag}-{i}-1`, each asking for the same
/// structured answer (`answer`, `confidence`).
pub fn lines(model: &str, system: &str, tag: &str, n: usize) -> Vec<BatchLine> {
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
                model: model.into(),
                system: Some(system.into()),
                user: format!("Item {i}: which release is this?"),
                max_tokens: 200,
                temperature: Some(0.0),
                response_schema: Some(std::sync::Arc::new(("adjudicate".into(), schema.clone()))),
                structured_output: Default::default(),
                thinking_budget: None,
                client_request_id: format!("{tag}-{i}-1"),
                timeout: Duration::from_secs(10),
                body: None,
            },
        })
        .collect()
}

/// `lines` are the batch's lines, in memory (`Vec<BatchLine>` is a
/// `LineSource`).
fn spec<'a>(model: &'a str, tag: &'a str, lines: &'a Vec<BatchLine>) -> SubmitSpec<'a> {
    SubmitSpec { tag, model, lines }
}

/// Submit `batch` under `tag`; the provider's batch id.
pub async fn submit(b: &dyn BatchProvider, model: &str, tag: &str, batch: &[BatchLine]) -> String {
    let lines = batch.to_vec();
    b.submit(spec(model, tag, &lines))
        .await
        .expect("submit")
        .provider_batch_id
}

/// Submit `batch` under `tag` when the provider must refuse it (`why`
/// says what refuses it); the error.
pub async fn submit_refused(
    b: &dyn BatchProvider,
    model: &str,
    tag: &str,
    batch: &[BatchLine],
    why: &str,
) -> ProviderError {
    let lines = batch.to_vec();
    b.submit(spec(model, tag, &lines)).await.expect_err(why)
}

/// Poll until the batch is terminal with its results in place.
pub async fn settle(b: &dyn BatchProvider, id: &str) -> (BatchStatus, Vec<String>) {
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

/// Poll every 50 ms until the batch is terminal with its results in place;
/// whether it was seen completed with its results still pending (each such
/// poll must carry no output reference).
pub async fn settle_seeing_pending(b: &dyn BatchProvider, id: &str) -> (BatchStatus, bool) {
    let started = Instant::now();
    let mut saw_pending = false;
    let status = loop {
        let s = b.poll(id).await.unwrap();
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
    (status, saw_pending)
}

/// Poll every 50 ms until the batch is in progress with some lines done.
pub async fn wait_until_some_completed(b: &dyn BatchProvider, id: &str) {
    let started = Instant::now();
    loop {
        let s = b.poll(id).await.unwrap();
        if s.state == BatchState::InProgress && s.counts.completed > 0 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "never ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Read the results of a terminal batch into a Vec, expecting `batch`'s ids.
pub async fn collect(
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

/// (answered, errored, not run).
pub fn tally(lines: &[ResultLine]) -> (usize, usize, usize) {
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

/// No custom id comes back twice.
pub fn unique(lines: &[ResultLine]) -> bool {
    let ids: HashSet<&str> = lines.iter().map(|l| l.custom_id.as_str()).collect();
    ids.len() == lines.len()
}

/// Every custom id of `part` is among those of `whole`.
pub fn within(part: &[ResultLine], whole: &[ResultLine]) -> bool {
    let all: HashSet<&str> = whole.iter().map(|l| l.custom_id.as_str()).collect();
    part.iter().all(|l| all.contains(l.custom_id.as_str()))
}

/// Every line is an answer in the schema's shape, with its usage.
pub fn assert_answers_follow_the_schema(got: &[ResultLine]) {
    for l in got {
        let LineOutcome::Answer(a) = &l.outcome else {
            panic!("{l:?}")
        };
        let v: serde_json::Value = serde_json::from_str(a.content.as_deref().unwrap()).unwrap();
        assert!(v.get("confidence").is_some(), "schema followed: {v}");
        assert!(a.usage.is_some_and(|u| u.input_tokens > 0));
    }
}

/// A batch of `n` lines whose create answer was lost is found again under
/// `tag`: exactly one, also by a local clock a few seconds fast, and none
/// under another tag. Its id.
pub async fn find_the_lost_one(b: &dyn BatchProvider, tag: &str, before: f64, n: usize) -> String {
    let found = b.find(tag, before, n).await.expect("find");
    let Found::One(id) = found else {
        panic!("expected exactly one, got {found:?}")
    };
    // A local clock a few seconds fast: the batch still counts.
    let fast = docket::ledger::now_ts() + 5.0;
    assert_eq!(b.find(tag, fast, n).await.unwrap(), Found::One(id.clone()));
    assert_eq!(
        b.find("someone-else", before, n).await.unwrap(),
        Found::None
    );
    id
}
