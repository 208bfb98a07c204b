//! Fault-matrix rows B4, B6 and B7 end to end: the real `docket
//! batch-adjudicate` on the OpenAI, Anthropic and Gemini Batch APIs of the
//! in-process mock, whose billing log (one entry per batch line it ran or
//! closed unrun) is the oracle the ledger is held against.
//!
//! - B4: a batch expires with k of n lines done: exactly the k billed lines
//!   are kept, at the oracle's cost; the n−k go again in a new batch; no
//!   custom_id is billed twice.
//! - B6: a results download that 404s for a while is fetched again, never
//!   retired; the batch completes with every line once. (Gemini's results
//!   come inline in the engine's batches: its responses file is checked at
//!   the adapter.)
//! - B7: crafted results: an unknown custom_id (quarantined, warned), a
//!   duplicate line (the first wins), a billed line with no result line
//!   (requeued, ambiguous), a retryable and a non-retryable per-item error,
//!   and Anthropic's `expired` and `canceled` lines.

use docket_testkit as support;

use std::collections::HashSet;
use std::time::Duration;

use docket::mock::MockConfig;
use docket::provider::ApiKey;
use docket::provider::batch::BatchProvider;
use docket::provider::batch::gemini::{GeminiBatch, PollCadence};
use support::batch_engine::{
    BatchWs, LineRow, Wire, batch_rows, check_billing, each_item_once, line_log, line_rows, mock,
    mock_events, no_double_answers, workspace,
};
use support::{check_complete, count, events_of, poll};

/// Ids of `rows` in `batch_id` whose message is in `state` (and, when
/// given, of `kind`).
fn ids_in(
    rows: &std::collections::HashMap<String, LineRow>,
    batch_id: i64,
    state: &str,
    kind: Option<&str>,
) -> HashSet<String> {
    rows.values()
        .filter(|l| l.batch_id == batch_id && l.state == state)
        .filter(|l| kind.is_none() || l.error_kind.as_deref() == kind)
        .map(|l| l.custom_id.clone())
        .collect()
}

/// The request of line `id` was answered by a later attempt, in another
/// batch.
fn answered_later(rows: &std::collections::HashMap<String, LineRow>, id: &str) -> bool {
    let l = &rows[id];
    rows.values().any(|o| {
        o.request_id == l.request_id
            && o.attempt > l.attempt
            && o.batch_id != l.batch_id
            && o.state == "answered"
    })
}

// ------------------------------------------------------------------- B4

/// Row B4 on `wire`: the first batch expires halfway (the mock's clock
/// passes its window once half its lines ran); then batches run whole.
async fn b4(wire: Wire, items: usize) {
    let m = mock(|c| {
        c.batch_expire = 0.5;
        c.batch_running_ms = 800;
    })
    .await;
    let ws = workspace(wire, &m, items);
    let run = ws.spawn();
    poll("a batch to expire", Duration::from_secs(30), || {
        (m.stats().batches_expired >= 1).then_some(())
    })
    .await;
    m.set_config(MockConfig {
        batch_expire: 0.0,
        ..m.config()
    });
    let (code, out) = BatchWs::finish(run).await;
    assert_eq!(code, Some(0), "{out}");
    let sid = ws.session();
    let conn = ws.conn();
    check_complete(&conn, &sid);
    each_item_once(&conn, &sid, items as i64);
    no_double_answers(&conn);
    let st = m.stats();
    let rows = batch_rows(&conn, &sid);
    assert_eq!(rows.len() as u64, st.batches_created, "{rows:?}");
    assert!(
        st.batches_expired >= 1 && rows.len() >= 2,
        "{st:?} {rows:?}"
    );
    for b in &rows {
        assert_eq!(b.state, "ingested", "{b:?}");
        assert_eq!(b.ingested_count, b.request_count, "{b:?}");
        assert_eq!(b.quarantined_count, 0, "{b:?}");
    }

    // The oracle holds over every line of the run: what was billed is
    // answered at its result line's tokens and batch price, once.
    let billing = check_billing(&m, wire, &conn, &sid).await;
    assert!(billing.ambiguous.is_empty(), "{:?}", billing.ambiguous);
    assert_eq!(
        billing.billed.len(),
        items,
        "each item's request billed exactly once"
    );

    // The expired batch: k lines ran and were billed, n−k never ran.
    let first = &rows[0];
    let pid = first.provider_batch_id.clone().expect("submitted");
    let log = line_log(&m);
    let logged = |outcome: &str| -> HashSet<String> {
        log.iter()
            .filter(|e| e.batch == pid && e.outcome == outcome)
            .map(|e| e.custom_id.clone())
            .collect()
    };
    let k = logged("batch_line_ok");
    let expired = logged("batch_line_expired");
    let n = first.request_count as usize;
    assert_eq!(n, items, "{first:?}");
    assert!(
        !k.is_empty() && !expired.is_empty(),
        "k {} of {n}, expired {}",
        k.len(),
        expired.len()
    );
    assert_eq!(k.len() + expired.len(), n);
    assert_eq!(first.completed_count as usize, k.len(), "{first:?}");
    if wire != Wire::Gemini {
        // Gemini counts a request never run as neither done nor failed.
        assert_eq!(first.failed_count as usize, n - k.len(), "{first:?}");
    }
    let lines = line_rows(&conn);
    // Exactly the k results are kept (paid) ...
    assert_eq!(ids_in(&lines, first.batch_id, "answered", None), k);
    // ... and the n−k are on record as never run, unbilled, and went again
    // in a later batch, where they were answered.
    assert_eq!(
        ids_in(&lines, first.batch_id, "failed", Some("not_run")),
        expired
    );
    for id in &expired {
        assert!(answered_later(&lines, id), "{id} was never answered later");
    }
    // The ledger cost for the k equals the oracle's: the k lines' tokens as
    // the provider served them, at the batch price.
    let (price, _) = docket::cost::price_of(wire.model());
    let served = &billing.served[&pid];
    let oracle_k: f64 = k
        .iter()
        .map(|id| {
            let (i, o) = served.usage[id];
            price.cost(i, 0, o) * docket::provider::batch::BATCH_PRICE_FACTOR
        })
        .sum();
    let ledger_k: f64 = k.iter().map(|id| lines[id].cost_usd.unwrap_or(0.0)).sum();
    assert!(oracle_k > 0.0);
    assert!(
        (ledger_k - oracle_k).abs() <= oracle_k * 1e-9,
        "ledger {ledger_k} oracle {oracle_k}"
    );
    // No custom_id is ever charged twice, and no request either.
    let requests: HashSet<i64> = billing
        .billed
        .iter()
        .map(|id| lines[id].request_id)
        .collect();
    assert_eq!(requests.len(), billing.billed.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b4_openai_an_expired_batch_keeps_the_billed_k_at_the_oracles_cost() {
    b4(Wire::OpenAi, 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b4_anthropic_an_expired_batch_keeps_the_billed_k_at_the_oracles_cost() {
    b4(Wire::Anthropic, 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b4_gemini_an_expired_batch_keeps_the_billed_k_at_the_oracles_cost() {
    b4(Wire::Gemini, 20).await;
}

// ------------------------------------------------------------------- B6

/// How long the mock answers 404 for a batch's results once they exist.
const RESULTS_404_MS: u64 = 1_800;

/// Row B6 on `wire`: the results download 404s for a while after the batch
/// completed. The batch is fetched again (not retired, not resubmitted),
/// and every line is applied once.
async fn b6(wire: Wire, items: usize) {
    let m = mock(|c| c.batch_results_404_ms = RESULTS_404_MS).await;
    let ws = workspace(wire, &m, items);
    let sid = ws.run_to(0).await;
    let conn = ws.conn();
    check_complete(&conn, &sid);
    each_item_once(&conn, &sid, items as i64);
    no_double_answers(&conn);
    assert!(
        mock_events(&m, "results_not_found") >= 1,
        "the results never 404ed"
    );
    let st = m.stats();
    assert_eq!(st.batches_created, 1, "resubmitted: {st:?}");
    assert_eq!(st.batch_lines_ok, items as u64, "{st:?}");
    let rows = batch_rows(&conn, &sid);
    assert_eq!(rows.len(), 1, "{rows:?}");
    let b = &rows[0];
    assert_eq!(b.state, "ingested", "{b:?}");
    assert_eq!(b.ingested_count, b.request_count, "{b:?}");
    assert_eq!(b.quarantined_count, 0, "{b:?}");
    // The failed fetch was reported as one to try again, not given up on.
    let failed = events_of(&conn, &sid, "batch_results_failed");
    assert!(!failed.is_empty(), "no warning of the failed fetch");
    assert!(
        failed
            .iter()
            .all(|e| e.level == "warn" && e.message.contains("trying again")),
        "{failed:?}"
    );
    // Every line answered once, nothing ambiguous or failed on the way.
    let lines = line_rows(&conn);
    assert_eq!(
        ids_in(&lines, b.batch_id, "answered", None).len(),
        items,
        "{lines:?}"
    );
    assert_eq!(
        0,
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_messages WHERE state != 'answered'",
            []
        )
    );
    let billing = check_billing(&m, wire, &conn, &sid).await;
    assert_eq!(billing.billed.len(), items);
    assert!(billing.ambiguous.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b6_openai_a_results_file_that_404s_for_a_while_is_fetched_again() {
    b6(Wire::OpenAi, 12).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b6_anthropic_results_that_404_for_a_while_are_fetched_again() {
    b6(Wire::Anthropic, 12).await;
}

/// Row B6 on Gemini's responses file (the engine's batches are small
/// enough to come inline, so this is the adapter): while the file 404s, a
/// read is an error to try again, with nothing delivered and nothing taken
/// as missing; once it is there, every line comes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b6_gemini_a_responses_file_that_404s_is_an_error_to_fetch_again() {
    const MODEL: &str = "gemini-2.5-flash";
    const N: usize = 12;
    let m = support::batch::mock(|c| c.batch_results_404_ms = RESULTS_404_MS).await;
    let b = GeminiBatch::new(
        &support::batch_engine::root(&m),
        ApiKey::new("gemini-b6-key"),
    )
    .unwrap()
    .with_cadence(PollCadence::fast())
    .with_inline_limit(1_000);
    let batch = support::batch::lines(MODEL, "Answer in JSON.", "b6", N);
    let id = support::batch::submit(&b, MODEL, "b6", &batch).await;
    let (status, _) = support::batch::settle(&b, &id).await;
    assert_eq!(status.state, docket::provider::batch::BatchState::Completed);
    assert!(
        status
            .output_ref
            .as_deref()
            .is_some_and(|r| r.starts_with("files/")),
        "{status:?}"
    );
    let expected: HashSet<String> = batch.iter().map(|l| l.custom_id.clone()).collect();
    let mut got = Vec::new();
    let err = b
        .results(&status, &expected, &mut |l| got.push(l))
        .await
        .expect_err("the responses file is not there yet");
    assert_eq!(err.http_status, Some(404), "{err}");
    assert!(got.is_empty(), "delivered from a 404: {got:?}");
    assert_eq!(mock_events(&m, "results_not_found"), 1);
    tokio::time::sleep(Duration::from_millis(RESULTS_404_MS + 200)).await;
    let (got, summary) = support::batch::collect(&b, &status, &batch).await;
    assert_eq!(support::batch::tally(&got), (N, 0, 0));
    assert!(support::batch::unique(&got));
    assert!(summary.missing.is_empty() && summary.quarantined.is_empty() && !summary.cut);
    assert_eq!(mock_events(&m, "results_not_found"), 1);
}

// ------------------------------------------------------------------- B7

/// Row B7 on `wire`: the first batch's results carry the mock's anomalies
/// (`batch_result_anomalies`); later batches are clean.
async fn b7(wire: Wire, items: usize) {
    let m = mock(|c| c.batch_result_anomalies = 1).await;
    let ws = workspace(wire, &m, items);
    // Done, with the item whose request was refused in error.
    let sid = ws.run_to(5).await;
    let conn = ws.conn();
    check_complete(&conn, &sid);
    each_item_once(&conn, &sid, items as i64);
    no_double_answers(&conn);
    let rows = batch_rows(&conn, &sid);
    assert!(rows.len() >= 2, "nothing went again: {rows:?}");
    for b in &rows {
        assert_eq!(b.state, "ingested", "{b:?}");
    }
    let first = &rows[0];
    let pid = first.provider_batch_id.clone().expect("submitted");
    assert_eq!(first.request_count as usize, items);
    let billing = check_billing(&m, wire, &conn, &sid).await;
    let lines = line_rows(&conn);
    let log: Vec<_> = line_log(&m)
        .into_iter()
        .filter(|e| e.batch == pid)
        .collect();
    assert_eq!(
        log.len(),
        items,
        "every line of the batch in the billing log"
    );
    let with_status = |status: u16| -> Vec<String> {
        log.iter()
            .filter(|e| e.status == status)
            .map(|e| e.custom_id.clone())
            .collect()
    };

    // Unknown IDs are quarantined with a warning; so is the duplicate.
    let quarantined: Vec<(Option<String>, String)> = conn
        .prepare(
            "SELECT custom_id, reason FROM provider_batch_quarantine WHERE batch_id = ?1 ORDER BY line",
        )
        .unwrap()
        .query_map([first.batch_id], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(quarantined.len(), 2, "{quarantined:?}");
    assert_eq!(first.quarantined_count, 2, "{first:?}");
    let unknown = "mock-unknown-0";
    assert!(
        quarantined
            .iter()
            .any(|(id, why)| id.as_deref() == Some(unknown) && why.contains("unknown")),
        "{quarantined:?}"
    );
    assert!(!lines.contains_key(unknown));
    let warned = events_of(&conn, &sid, "batch_quarantined");
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert_eq!(warned[0].level, "warn");
    assert!(warned[0].message.contains("2 result line(s)"), "{warned:?}");
    for b in &rows[1..] {
        assert_eq!(b.quarantined_count, 0, "a clean batch: {b:?}");
    }

    // Duplicates resolve as "first wins": the second line (1000 more output
    // tokens) is quarantined, the first applied once.
    let (dup, why) = quarantined
        .iter()
        .find(|(id, _)| id.as_deref() != Some(unknown))
        .unwrap();
    let dup = dup.clone().expect("the duplicate's custom_id");
    assert!(why.contains("second result"), "{why}");
    let served = &billing.served[&pid];
    assert_eq!(served.lines[&dup], 2, "the duplicate came twice");
    let (_, first_out) = served.usage[&dup];
    assert_eq!(lines[&dup].state, "answered");
    assert_eq!(lines[&dup].output_tokens, Some(first_out as i64));
    assert!(billing.billed.contains(&dup));

    // Missing IDs are requeued once the batch is terminal: the line billed
    // with no result line is ambiguous (it may have cost), and went again.
    assert_eq!(billing.ambiguous.len(), 1, "{:?}", billing.ambiguous);
    let missing = billing.ambiguous.iter().next().unwrap();
    let l = &lines[missing];
    assert_eq!(l.batch_id, first.batch_id);
    assert!(
        l.error_message
            .as_deref()
            .is_some_and(|m| m.contains("without a result line")),
        "{l:?}"
    );
    assert!(answered_later(&lines, missing), "{missing} not requeued");

    // Per-item errors are split into retryable (sent again, answered) and
    // non-retryable (the item's error, never sent again); neither billed.
    let retryable = with_status(500);
    let refused = with_status(400);
    assert_eq!((retryable.len(), refused.len()), (1, 1), "{log:?}");
    let r = &lines[&retryable[0]];
    assert_eq!(r.state, "failed", "{r:?}");
    assert_ne!(r.error_kind.as_deref(), Some("request"), "{r:?}");
    assert!(answered_later(&lines, &r.custom_id), "{r:?}");
    let x = &lines[&refused[0]];
    assert_eq!(
        (x.state.as_str(), x.error_kind.as_deref()),
        ("failed", Some("request")),
        "{x:?}"
    );
    assert!(
        !lines
            .values()
            .any(|o| o.request_id == x.request_id && o.attempt > x.attempt),
        "a non-retryable error was sent again"
    );
    let outcome: String = conn
        .query_row(
            "SELECT r.outcome FROM llm_batch_result r JOIN llm_requests q ON q.item_id = r.item_id
             WHERE q.request_id = ?1 AND r.session_id = ?2",
            rusqlite::params![x.request_id, sid],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(outcome, "error");
    assert_eq!(
        1,
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_batch_result WHERE session_id = ?1 AND outcome = 'error'",
            [&sid]
        ),
        "only the refused item ends in error"
    );

    // The lines never run (Anthropic's `expired` and `canceled`) are not
    // billed, and went again.
    let expired: Vec<String> = log
        .iter()
        .filter(|e| e.outcome == "batch_line_expired" || e.outcome == "batch_line_canceled")
        .map(|e| e.custom_id.clone())
        .collect();
    let not_run = ids_in(&lines, first.batch_id, "failed", Some("not_run"));
    assert_eq!(not_run, expired.iter().cloned().collect::<HashSet<_>>());
    for id in &expired {
        assert!(answered_later(&lines, id), "{id} not requeued");
    }

    // The provider's counts, every bucket of them: done (billed) and
    // failed (errored, expired, canceled) add up to the batch.
    let billed_here = log.iter().filter(|e| e.status == 200).count();
    assert_eq!(first.completed_count as usize, billed_here, "{first:?}");
    let unrun = if wire == Wire::Anthropic {
        assert_eq!(expired.len(), 2, "an expired and a canceled line: {log:?}");
        2
    } else {
        assert!(expired.is_empty(), "{log:?}");
        0
    };
    assert_eq!(first.failed_count as usize, 2 + unrun, "{first:?}");
    assert_eq!(
        (first.completed_count + first.failed_count) as usize,
        items,
        "{first:?}"
    );
    // The first batch's lines: the billed ones answered (the duplicate
    // once) but the one with no line, the errors, and those never run.
    assert_eq!(
        ids_in(&lines, first.batch_id, "answered", None).len(),
        billed_here - 1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b7_openai_result_anomalies_are_quarantined_requeued_or_split() {
    b7(Wire::OpenAi, 12).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b7_anthropic_result_anomalies_and_all_five_buckets_are_accounted_for() {
    b7(Wire::Anthropic, 12).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b7_gemini_result_anomalies_are_quarantined_requeued_or_split() {
    b7(Wire::Gemini, 12).await;
}
