//! Batch mode end to end: the engine against the built-in mock's Files and
//! Batches APIs over loopback (an `openai_compatible` provider pointed at
//! the mock, polled every 0.1 s). Triggers, splitting, auto mode, price,
//! partial failures, expiry, late and cut results, a lost create answer,
//! cancel, pause and resume, the enqueued token limit, config errors.

use docket_testkit as support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use docket::engine::{Interrupts, RunEnd, RunReport};
use docket::ledger::control::RunControls;
use docket::mock::{MockConfig, MockServer};
use rusqlite::Connection;
use support::*;

/// No single run of this file may take longer than this.
const RUN_LIMIT: Duration = Duration::from_secs(40);

/// A mock whose batches go through their lifecycle in well under a second.
fn fast() -> MockConfig {
    MockConfig {
        batch_validating_ms: 100,
        batch_running_ms: 500,
        batch_finalizing_ms: 100,
        batch_cancelling_ms: 100,
        ..Default::default()
    }
}

/// Put `body` (the keys of `[stages.batch]`) into the workspace's config,
/// with the poll interval the mock needs when its kind is not `mock`.
fn set_batch(ws: &Workspace, body: &str) {
    set_batch_raw(ws, &format!("{body}\npoll_interval_secs = 0.1"));
}

fn set_batch_raw(ws: &Workspace, body: &str) {
    let path = ws.path().join("docket.toml");
    let toml = std::fs::read_to_string(&path).unwrap();
    assert!(toml.contains("[stages.gate]"));
    let section = format!("[stages.batch]\n{body}\n\n[stages.gate]");
    std::fs::write(&path, toml.replacen("[stages.gate]", &section, 1)).unwrap();
}

/// A mock and a workspace of `items` demo items pointed at it, batching
/// with `batch`.
async fn batch_ws(cfg: MockConfig, items: usize, batch: &str) -> (MockServer, Workspace) {
    let (m, ws) = mocked(cfg, items, |_| {}).await;
    set_batch(&ws, batch);
    (m, ws)
}

/// `support::run` under `RUN_LIMIT`: a hang fails the test.
async fn run_in_time(opts: docket::engine::RunOptions) -> (RunReport, Arc<Lines>) {
    tokio::time::timeout(RUN_LIMIT, run(opts))
        .await
        .expect("the run did not end in time")
}

/// A run with `interrupts`, spawned so the test can steer it meanwhile.
fn spawn_run(
    opts: docket::engine::RunOptions,
    interrupts: Interrupts,
) -> tokio::task::JoinHandle<(RunReport, Arc<Lines>)> {
    tokio::spawn(async move {
        let lines = Arc::new(Lines::default());
        let report = tokio::time::timeout(
            RUN_LIMIT,
            docket::engine::run(opts, lines.clone(), |_| true, interrupts),
        )
        .await
        .expect("the run did not end in time")
        .unwrap_or_else(|e| panic!("run failed: {e}"));
        (report, lines)
    })
}

#[derive(Debug, Clone)]
struct BatchRow {
    batch_id: i64,
    state: String,
    provider_batch_id: Option<String>,
    request_count: i64,
    completed_count: i64,
    ingested_count: i64,
    quarantined_count: i64,
    submitted_at: Option<f64>,
    ended_at: Option<f64>,
    cancel_requested_at: Option<f64>,
}

/// The session's provider batches, oldest first.
fn batches(conn: &Connection, sid: &str) -> Vec<BatchRow> {
    conn.prepare(
        "SELECT batch_id, state, provider_batch_id, request_count, completed_count, ingested_count,
                quarantined_count, submitted_at, ended_at, cancel_requested_at
         FROM provider_batch WHERE session_id = ?1 ORDER BY batch_id",
    )
    .unwrap()
    .query_map([sid], |r| {
        Ok(BatchRow {
            batch_id: r.get(0)?,
            state: r.get(1)?,
            provider_batch_id: r.get(2)?,
            request_count: r.get(3)?,
            completed_count: r.get(4)?,
            ingested_count: r.get(5)?,
            quarantined_count: r.get(6)?,
            submitted_at: r.get(7)?,
            ended_at: r.get(8)?,
            cancel_requested_at: r.get(9)?,
        })
    })
    .unwrap()
    .map(Result::unwrap)
    .collect()
}

/// Every one of the `n` items has exactly one result.
fn each_item_once(conn: &Connection, sid: &str, n: i64) {
    assert_eq!(
        n,
        count(
            conn,
            "SELECT COUNT(*) FROM llm_batch_result WHERE session_id = ?1",
            [sid]
        ),
        "results"
    );
    assert_eq!(
        n,
        count(
            conn,
            "SELECT COUNT(DISTINCT item_id) FROM llm_batch_result WHERE session_id = ?1",
            [sid]
        ),
        "distinct items with a result"
    );
}

/// No request was answered twice (nothing paid twice).
fn no_double_answers(conn: &Connection) {
    assert_eq!(
        0,
        count(
            conn,
            "SELECT COUNT(*) FROM (SELECT request_id FROM llm_messages WHERE state = 'answered'
                GROUP BY request_id HAVING COUNT(*) > 1)",
            []
        ),
        "a request with two answered messages"
    );
}

fn messages_in(conn: &Connection, state: &str) -> i64 {
    count(
        conn,
        "SELECT COUNT(*) FROM llm_messages WHERE state = ?1",
        [state],
    )
}

/// Chat requests that reached the mock synchronously.
fn sync_chat_calls(m: &MockServer) -> usize {
    m.log()
        .iter()
        .filter(|e| e.route.contains("chat/completions"))
        .count()
}

fn mock_events(m: &MockServer, outcome: &str) -> usize {
    m.log().iter().filter(|e| e.outcome == outcome).count()
}

fn session_state(conn: &Connection, sid: &str) -> String {
    conn.query_row(
        "SELECT state FROM llm_batch_session WHERE session_id = ?1",
        [sid],
        |r| r.get(0),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_normal_batch_run_sends_every_item_in_one_batch() {
    let (m, ws) = batch_ws(MockConfig::default(), 200, "mode = \"batch\"").await;
    let (report, lines) = run_in_time(options(&ws)).await;
    assert_eq!(report.end, RunEnd::Completed, "{}", lines.text());
    let sid = report.session_id.unwrap();
    let conn = ws.conn();
    check_complete(&conn, &sid);
    each_item_once(&conn, &sid, 200);

    let rows = batches(&conn, &sid);
    let st = m.stats();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(st.batches_created, rows.len() as u64);
    assert_eq!(st.batches_completed, 1);
    for b in &rows {
        assert_eq!(b.state, "ingested", "{b:?}");
        assert_eq!(b.request_count, 200, "{b:?}");
        assert_eq!(b.ingested_count, b.request_count, "{b:?}");
        assert_eq!(b.quarantined_count, 0, "{b:?}");
        assert!(b.provider_batch_id.is_some(), "{b:?}");
    }
    // Every message is an answered batch line, named by its custom_id.
    assert_eq!(messages_in(&conn, "answered"), 200);
    assert_eq!(
        0,
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_messages WHERE state != 'answered'",
            []
        )
    );
    assert_eq!(
        200,
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_messages m JOIN provider_batch_item i
               ON i.request_id = m.request_id AND i.attempt = m.attempt
             WHERE m.client_request_id = i.custom_id",
            []
        )
    );
    assert_eq!(st.batch_lines_ok, 200);
    assert_eq!(st.batch_lines_failed, 0);
    // Nothing went the synchronous way.
    assert_eq!(st.requests, 0, "{st:?}");
    assert_eq!(sync_chat_calls(&m), 0);
    // The stage's checkpoint names the batch it last used.
    let last: Option<i64> = conn
        .query_row(
            "SELECT last_batch_id FROM run_stages WHERE session_id = ?1",
            [&sid],
            |r| r.get(0),
        )
        .unwrap();
    let batch_id: i64 = conn
        .query_row(
            "SELECT batch_id FROM provider_batch WHERE session_id = ?1",
            [&sid],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(last, Some(batch_id));
    no_double_answers(&conn);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_batch_price_is_half_the_synchronous_one() {
    let (m_sync, ws_sync) = mocked(fast(), 40, |_| {}).await;
    let (m_batch, ws_batch) = batch_ws(fast(), 40, "mode = \"batch\"").await;
    let ((r_sync, l_sync), (r_batch, l_batch)) = tokio::join!(
        run_in_time(options(&ws_sync)),
        run_in_time(options(&ws_batch))
    );
    assert_eq!(r_sync.end, RunEnd::Completed, "{}", l_sync.text());
    assert_eq!(r_batch.end, RunEnd::Completed, "{}", l_batch.text());
    assert_eq!(m_sync.stats().batches_created, 0);
    assert_eq!(m_batch.stats().batches_created, 1);
    assert_eq!(sync_chat_calls(&m_batch), 0);
    let (price, known) = docket::cost::price_of("gpt-4o-mini");
    assert!(known);
    let per_list_price = |ws: &Workspace, r: &RunReport| -> (f64, f64) {
        let conn = ws.conn();
        let sid = r.session_id.clone().unwrap();
        check_complete(&conn, &sid);
        let s = r.session.clone().unwrap();
        let cached = count(
            &conn,
            "SELECT COALESCE(SUM(cached_input_tokens), 0) FROM llm_messages WHERE state = 'answered'",
            [],
        ) as u64;
        let list = price.cost(s.input_tokens, cached, s.output_tokens);
        assert!(list > 0.0 && s.cost_usd > 0.0, "{s:?}");
        (s.cost_usd / list, s.estimated_cost_usd)
    };
    let (sync_ratio, sync_estimate) = per_list_price(&ws_sync, &r_sync);
    let (batch_ratio, batch_estimate) = per_list_price(&ws_batch, &r_batch);
    assert!(
        (sync_ratio - 1.0).abs() < 1e-6,
        "sync pays list price: {sync_ratio}"
    );
    assert!(
        (batch_ratio / sync_ratio - 0.5).abs() < 1e-6,
        "batch {batch_ratio} vs sync {sync_ratio}"
    );
    assert!(sync_estimate > 0.0);
    assert!(
        (batch_estimate / sync_estimate - 0.5).abs() < 1e-6,
        "estimates: batch {batch_estimate} sync {sync_estimate}"
    );
    // The same prompts went out both ways.
    let s_sync = r_sync.session.unwrap();
    let s_batch = r_batch.session.unwrap();
    assert_eq!(s_sync.input_tokens, s_batch.input_tokens);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_count_trigger_splits_and_max_open_batches_bounds_them() {
    let (m, ws) = batch_ws(
        fast(),
        100,
        "mode = \"batch\"\nmax_requests = 40\nmax_open_batches = 1",
    )
    .await;
    let (report, lines) = run_in_time(options(&ws)).await;
    assert_eq!(report.end, RunEnd::Completed, "{}", lines.text());
    let sid = report.session_id.unwrap();
    let conn = ws.conn();
    check_complete(&conn, &sid);
    each_item_once(&conn, &sid, 100);
    let mut rows = batches(&conn, &sid);
    let mut sizes: Vec<i64> = rows.iter().map(|b| b.request_count).collect();
    sizes.sort();
    assert_eq!(sizes, vec![20, 40, 40], "{rows:?}");
    assert_eq!(m.stats().batches_created, 3);
    for b in &rows {
        assert_eq!(b.state, "ingested", "{b:?}");
        assert_eq!(b.ingested_count, b.request_count, "{b:?}");
    }
    // One open at a time: each is submitted after the one before ended.
    rows.sort_by(|a, b| a.submitted_at.partial_cmp(&b.submitted_at).unwrap());
    for w in rows.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        let ended = a.ended_at.expect("ended_at");
        let submitted = b.submitted_at.expect("submitted_at");
        assert!(
            submitted >= ended,
            "batch {} submitted at {submitted} while batch {} was open until {ended}",
            b.batch_id,
            a.batch_id
        );
    }
    assert_eq!(sync_chat_calls(&m), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_mode_batches_only_enough_requests() {
    let (m_few, ws_few) = batch_ws(fast(), 30, "mode = \"auto\"\nmin_batch_size = 1000").await;
    let (m_many, ws_many) = batch_ws(fast(), 30, "mode = \"auto\"\nmin_batch_size = 10").await;
    let ((r_few, l_few), (r_many, l_many)) = tokio::join!(
        run_in_time(options(&ws_few)),
        run_in_time(options(&ws_many))
    );
    assert_eq!(r_few.end, RunEnd::Completed, "{}", l_few.text());
    assert_eq!(r_many.end, RunEnd::Completed, "{}", l_many.text());

    // Too few: everything synchronously, no batch.
    let conn = ws_few.conn();
    let sid = r_few.session_id.unwrap();
    check_complete(&conn, &sid);
    each_item_once(&conn, &sid, 30);
    let st = m_few.stats();
    assert_eq!(st.batches_created, 0, "{st:?}");
    assert_eq!(st.ok, 30, "{st:?}");
    assert_eq!(sync_chat_calls(&m_few), 30);
    assert!(batches(&conn, &sid).is_empty());
    // The estimate did not count on the batch price.
    let (price, _) = docket::cost::price_of("gpt-4o-mini");
    let s = r_few.session.unwrap();
    assert!(
        (s.cost_usd - price.cost(s.input_tokens, 0, s.output_tokens)).abs() < 1e-9,
        "{s:?}"
    );

    // Enough: batches.
    let conn = ws_many.conn();
    let sid = r_many.session_id.unwrap();
    check_complete(&conn, &sid);
    each_item_once(&conn, &sid, 30);
    let st = m_many.stats();
    assert!(st.batches_created >= 1, "{st:?}");
    assert_eq!(st.batches_created as usize, batches(&conn, &sid).len());
    assert_eq!(st.batch_lines_ok, 30, "{st:?}");
    assert_eq!(sync_chat_calls(&m_many), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_lines_are_retried_in_new_batches() {
    let cfg = MockConfig {
        batch_fail_rate: 0.2,
        batch_validating_ms: 50,
        batch_running_ms: 300,
        batch_finalizing_ms: 50,
        ..Default::default()
    };
    let (m, ws) = batch_ws(cfg, 60, "mode = \"batch\"").await;
    let (report, lines) = run_in_time(options(&ws)).await;
    assert_eq!(report.end, RunEnd::Completed, "{}", lines.text());
    let sid = report.session_id.unwrap();
    let conn = ws.conn();
    check_complete(&conn, &sid);
    each_item_once(&conn, &sid, 60);
    let st = m.stats();
    assert!(st.batch_lines_failed > 0, "{st:?}");
    assert!(
        st.batches_created >= 2,
        "the failed lines went again: {st:?}"
    );
    assert_eq!(st.batches_created as usize, batches(&conn, &sid).len());
    // One message per line, each in the state its line ended in.
    assert_eq!(messages_in(&conn, "failed") as u64, st.batch_lines_failed);
    assert_eq!(messages_in(&conn, "answered") as u64, st.batch_lines_ok);
    assert!(
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_requests WHERE attempt > 1",
            []
        ) > 0
    );
    no_double_answers(&conn);
    // A retry is a new line in a later batch, never the same custom_id again.
    assert_eq!(
        0,
        count(
            &conn,
            "SELECT COUNT(*) FROM (SELECT custom_id FROM provider_batch_item GROUP BY custom_id HAVING COUNT(*) > 1)",
            []
        )
    );
    for b in batches(&conn, &sid) {
        assert_eq!(b.state, "ingested", "{b:?}");
        assert_eq!(b.ingested_count, b.request_count, "{b:?}");
    }
    assert_eq!(sync_chat_calls(&m), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_batch_keeps_what_finished_and_sends_the_rest_again() {
    let cfg = MockConfig {
        batch_expire: 0.5,
        batch_running_ms: 800,
        ..fast()
    };
    let (m, ws) = batch_ws(cfg, 40, "mode = \"batch\"").await;
    let handle = spawn_run(options(&ws), Interrupts::default());
    // Once one batch expired, let the next ones finish.
    poll("a batch to expire", Duration::from_secs(20), || {
        (m.stats().batches_expired >= 1).then_some(())
    })
    .await;
    m.set_config(MockConfig {
        batch_expire: 0.0,
        ..m.config()
    });
    let (report, lines) = handle.await.unwrap();
    assert_eq!(report.end, RunEnd::Completed, "{}", lines.text());
    let sid = report.session_id.unwrap();
    let conn = ws.conn();
    check_complete(&conn, &sid);
    each_item_once(&conn, &sid, 40);
    let st = m.stats();
    assert!(st.batches_expired >= 1, "{st:?}");
    assert!(st.batches_created >= 2, "{st:?}");
    let rows = batches(&conn, &sid);
    assert_eq!(rows.len() as u64, st.batches_created, "{rows:?}");
    let first = &rows[0];
    assert_eq!(first.request_count, 40, "{first:?}");
    assert_eq!(first.state, "ingested", "{first:?}");
    assert_eq!(first.ingested_count, 40, "{first:?}");
    let in_first = |state: &str, kind: Option<&str>| {
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_messages m JOIN provider_batch_item i
               ON i.request_id = m.request_id AND i.attempt = m.attempt
             WHERE i.batch_id = ?1 AND m.state = ?2 AND (?3 IS NULL OR m.error_kind = ?3)",
            rusqlite::params![first.batch_id, state, kind],
        )
    };
    let answered = in_first("answered", None);
    let not_run = in_first("failed", Some("not_run"));
    assert!(
        answered > 0 && not_run > 0,
        "answered {answered}, not run {not_run}"
    );
    assert_eq!(answered + not_run, 40);
    // Every not-run attempt is a failed, unbilled message; its request was
    // answered later, in another batch.
    assert_eq!(
        0,
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_messages WHERE error_kind = 'not_run' AND (state != 'failed' OR COALESCE(cost_usd, 0) != 0)",
            []
        )
    );
    assert_eq!(
        0,
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_messages m WHERE m.error_kind = 'not_run'
               AND NOT EXISTS (SELECT 1 FROM llm_messages a WHERE a.request_id = m.request_id
                                 AND a.state = 'answered' AND a.attempt > m.attempt)",
            []
        ),
        "a not-run request that was never answered later"
    );
    assert_eq!(messages_in(&conn, "answered"), 40);
    no_double_answers(&conn);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_output_files_and_cut_result_streams_lose_nothing() {
    let late = MockConfig {
        batch_output_late_ms: 1500,
        ..fast()
    };
    let cut = MockConfig {
        batch_cut_results: 1,
        ..fast()
    };
    let (m_late, ws_late) = batch_ws(late, 30, "mode = \"batch\"").await;
    let (m_cut, ws_cut) = batch_ws(cut, 30, "mode = \"batch\"").await;
    let ((r_late, l_late), (r_cut, l_cut)) = tokio::join!(
        run_in_time(options(&ws_late)),
        run_in_time(options(&ws_cut))
    );
    for (m, ws, r, l) in [
        (&m_late, &ws_late, r_late, l_late),
        (&m_cut, &ws_cut, r_cut, l_cut),
    ] {
        assert_eq!(r.end, RunEnd::Completed, "{}", l.text());
        let sid = r.session_id.unwrap();
        let conn = ws.conn();
        check_complete(&conn, &sid);
        each_item_once(&conn, &sid, 30);
        let rows = batches(&conn, &sid);
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(m.stats().batches_created, 1);
        for b in &rows {
            assert_eq!(b.quarantined_count, 0, "{b:?}");
            assert_eq!(b.ingested_count, b.request_count, "{b:?}");
            assert_eq!(b.state, "ingested", "{b:?}");
        }
        assert_eq!(
            0,
            count(&conn, "SELECT COUNT(*) FROM provider_batch_quarantine", [])
        );
        assert_eq!(messages_in(&conn, "answered"), 30);
        no_double_answers(&conn);
        assert_eq!(sync_chat_calls(m), 0);
    }
    // The late files really were late: the engine waited for them.
    assert_eq!(mock_events(&m_late, "batch_output_ready"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_create_answer_is_found_not_resubmitted() {
    let cfg = MockConfig {
        batch_lose_create: 1,
        ..fast()
    };
    let (m, ws) = batch_ws(cfg, 30, "mode = \"batch\"").await;
    let (report, lines) = run_in_time(options(&ws)).await;
    assert_eq!(report.end, RunEnd::Completed, "{}", lines.text());
    let sid = report.session_id.unwrap();
    let conn = ws.conn();
    check_complete(&conn, &sid);
    each_item_once(&conn, &sid, 30);
    let st = m.stats();
    assert_eq!(st.batches_created, 1, "{st:?}");
    let creates: Vec<_> = m
        .log()
        .into_iter()
        .filter(|e| e.outcome == "batch_created")
        .collect();
    assert_eq!(creates.len(), 1, "{creates:?}");
    assert_eq!(creates[0].status, 500, "the one create lost its answer");
    let rows = batches(&conn, &sid);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].provider_batch_id, creates[0].batch_id);
    assert!(
        !events_of(&conn, &sid, "batch_found").is_empty(),
        "{:?}",
        events(&conn, &sid)
    );
    assert!(events_of(&conn, &sid, "batch_resubmitted").is_empty());
    assert_eq!(messages_in(&conn, "answered"), 30);
    no_double_answers(&conn);
}

/// Claim, don't hold: while a batch waits at the provider its items are not
/// held by the worker (the batch's lease covers them), nothing else claims
/// them, and when the results come the items are claimed, finished and let
/// go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_batch_holds_its_items_by_its_lease_not_by_claims() {
    let cfg = MockConfig {
        batch_validating_ms: 100,
        batch_running_ms: 2_500,
        ..Default::default()
    };
    let (_m, ws) = batch_ws(cfg, 60, "mode = \"batch\"\nmax_wait_secs = 1").await;
    let handle = spawn_run(options(&ws), Interrupts::default());
    let sid = session_created(&ws).await;
    let conn = ws.conn();
    poll(
        "the batch to be at the provider",
        Duration::from_secs(20),
        || {
            batches(&conn, &sid)
                .first()
                .filter(|b| b.state == "in_progress")
                .map(|_| ())
        },
    )
    .await;
    let held_by_claims = count(
        &conn,
        "SELECT COUNT(*) FROM session_item WHERE session_id = ?1 AND claimed_by IS NOT NULL",
        [&sid],
    );
    assert_eq!(
        held_by_claims, 0,
        "items of a waiting batch are not claimed"
    );
    let leased = count(
        &conn,
        "SELECT COUNT(*) FROM provider_batch WHERE session_id = ?1 AND claimed_by IS NOT NULL AND lease_until > 0",
        [&sid],
    );
    assert_eq!(leased, 1, "the batch carries the lease");
    let waiting = count(
        &conn,
        "SELECT COUNT(*) FROM llm_messages WHERE session_id = ?1 AND state = 'sent'",
        [&sid],
    );
    assert_eq!(waiting, 60, "every line waits in the batch");
    let (report, lines) = handle.await.unwrap();
    assert_eq!(report.end, RunEnd::Completed, "{}", lines.text());
    check_complete(&conn, &sid);
    each_item_once(&conn, &sid, 60);
    assert_eq!(
        0,
        count(
            &conn,
            "SELECT COUNT(*) FROM session_item WHERE session_id = ?1 AND lease_until IS NOT NULL",
            [&sid],
        ),
        "nothing stays leased"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_cancels_the_provider_batch_and_keeps_what_finished() {
    let cfg = MockConfig {
        batch_validating_ms: 100,
        batch_running_ms: 20_000,
        batch_cancelling_ms: 1500,
        ..Default::default()
    };
    let (m, ws) = batch_ws(cfg, 40, "mode = \"batch\"").await;
    let handle = spawn_run(options(&ws), Interrupts::default());
    let sid = session_created(&ws).await;
    let conn = ws.conn();
    // In progress, with a few lines done.
    poll(
        "the batch to run a few lines",
        Duration::from_secs(15),
        || {
            let rows = batches(&conn, &sid);
            rows.first()
                .filter(|b| b.state == "in_progress" && b.completed_count >= 2)
                .map(|_| ())
        },
    )
    .await;
    ws.handle()
        .set_desired(&sid, docket::control::Desired::Cancelled, "test")
        .unwrap();
    let (report, lines) = handle.await.unwrap();
    assert_eq!(report.end, RunEnd::Cancelled, "{}", lines.text());
    assert_eq!(session_state(&conn, &sid), "cancelled");
    check_invariants(&conn, &sid);
    let st = m.stats();
    assert_eq!(st.batches_cancelled, 1, "{st:?}");
    assert_eq!(
        st.batches_created, 1,
        "no new batch after the cancel: {st:?}"
    );
    let rows = batches(&conn, &sid);
    assert_eq!(rows.len(), 1, "{rows:?}");
    let b = &rows[0];
    assert!(b.cancel_requested_at.is_some(), "{b:?}");
    assert_eq!(b.state, "ingested", "{b:?}");
    assert_eq!(b.ingested_count, 40, "{b:?}");
    // What finished before the cancel counts; nothing twice.
    let results = count(
        &conn,
        "SELECT COUNT(*) FROM llm_batch_result WHERE session_id = ?1",
        [&sid],
    );
    assert!((2..40).contains(&results), "results: {results}");
    assert_eq!(
        results,
        count(
            &conn,
            "SELECT COUNT(DISTINCT item_id) FROM llm_batch_result WHERE session_id = ?1",
            [&sid]
        )
    );
    assert_eq!(messages_in(&conn, "answered"), results);
    assert_eq!(messages_in(&conn, "ambiguous"), 0);
    // The rest never ran: not billed, back to pending.
    assert_eq!(
        40 - results,
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_messages WHERE error_kind = 'not_run' AND state = 'failed'",
            []
        )
    );
    assert_eq!(
        40 - results,
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_requests WHERE status = 'pending'",
            []
        )
    );
    no_double_answers(&conn);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_leaves_the_batch_open_and_a_resume_collects_it() {
    let cfg = MockConfig {
        batch_validating_ms: 100,
        // Long enough that a pause waiting for the batch could not pass
        // for one that does not.
        batch_running_ms: 8_000,
        batch_finalizing_ms: 100,
        ..Default::default()
    };
    let (m, ws) = batch_ws(cfg, 30, "mode = \"batch\"").await;
    let interrupts = Interrupts::default();
    let mut opts = options(&ws);
    opts.grace = Some(Duration::from_secs(5));
    let handle = spawn_run(opts, interrupts.clone());
    let sid = session_created(&ws).await;
    let conn = ws.conn();
    poll(
        "the batch to be in progress",
        Duration::from_secs(15),
        || {
            batches(&conn, &sid)
                .first()
                .filter(|b| b.state == "in_progress" && b.provider_batch_id.is_some())
                .map(|_| ())
        },
    )
    .await;
    let paused_at = Instant::now();
    interrupts.pause.cancel();
    let (report, lines) = handle.await.unwrap();
    let took = paused_at.elapsed();
    assert!(
        matches!(report.end, RunEnd::Paused(_)),
        "{:?}\n{}",
        report.end,
        lines.text()
    );
    assert!(
        took < Duration::from_secs(6),
        "the pause waited {took:?} (for the batch?)"
    );
    assert_eq!(session_state(&conn, &sid), "paused");
    let st = m.stats();
    assert_eq!(st.batches_cancelled, 0, "{st:?}");
    assert_eq!(st.batches_created, 1, "{st:?}");
    let rows = batches(&conn, &sid);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_ne!(rows[0].state, "ingested", "{:?}", rows[0]);
    assert!(rows[0].cancel_requested_at.is_none(), "{:?}", rows[0]);
    assert_eq!(messages_in(&conn, "sent"), 30);
    assert_eq!(messages_in(&conn, "ambiguous"), 0);
    assert_eq!(
        0,
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_batch_result WHERE session_id = ?1",
            [&sid]
        )
    );

    // The resume re-attaches the open batch: nothing is sent again.
    let mut opts = options(&ws);
    opts.resume = Some(sid.clone());
    let (report, lines) = run_in_time(opts).await;
    assert_eq!(report.end, RunEnd::Completed, "{}", lines.text());
    check_complete(&conn, &sid);
    each_item_once(&conn, &sid, 30);
    let st = m.stats();
    assert_eq!(st.batches_created, 1, "{st:?}");
    assert_eq!(st.batches_cancelled, 0, "{st:?}");
    let rows = batches(&conn, &sid);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].state, "ingested", "{:?}", rows[0]);
    assert_eq!(rows[0].ingested_count, 30, "{:?}", rows[0]);
    assert_eq!(messages_in(&conn, "answered"), 30);
    assert_eq!(messages_in(&conn, "sent"), 0);
    no_double_answers(&conn);
    assert_eq!(sync_chat_calls(&m), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_enqueued_token_limit_fails_a_batch_without_losing_its_items() {
    // The prompt tokens of the 40 items, as the mock counts them.
    let (_probe_mock, probe) = mocked(fast(), 40, |_| {}).await;
    let (r, l) = run_in_time(options(&probe)).await;
    assert_eq!(r.end, RunEnd::Completed, "{}", l.text());
    let tokens = count(
        &probe.conn(),
        "SELECT SUM(input_tokens) FROM llm_messages WHERE state = 'answered'",
        [],
    ) as u64;
    assert!(tokens > 0);

    // Two batches of 20 at once would queue every token: 3/4 lets one in.
    let cfg = MockConfig {
        batch_enqueued_token_limit: tokens * 3 / 4,
        batch_validating_ms: 100,
        batch_running_ms: 800,
        batch_finalizing_ms: 100,
        ..Default::default()
    };
    let (m, ws) = batch_ws(
        cfg,
        40,
        "mode = \"batch\"\nmax_requests = 20\nmax_open_batches = 2",
    )
    .await;
    let (report, lines) = run_in_time(options(&ws)).await;
    assert_eq!(report.end, RunEnd::Completed, "{}", lines.text());
    let sid = report.session_id.unwrap();
    let conn = ws.conn();
    check_complete(&conn, &sid);
    each_item_once(&conn, &sid, 40);
    let st = m.stats();
    assert!(st.batches_failed >= 1, "{st:?}");
    assert!(st.batches_completed >= 2, "{st:?}");
    assert_eq!(st.batches_created as usize, batches(&conn, &sid).len());
    // The failed batch's lines were recorded as failed attempts and sent again.
    assert!(
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_messages WHERE state = 'failed' AND error_message LIKE '%limit%'",
            []
        ) >= 20
    );
    for b in batches(&conn, &sid) {
        assert_eq!(b.state, "ingested", "{b:?}");
    }
    no_double_answers(&conn);
    assert_eq!(sync_chat_calls(&m), 0);
}

/// The 1-based line of the first line of docket.toml containing `needle`.
fn line_of(ws: &Workspace, needle: &str) -> usize {
    std::fs::read_to_string(ws.path().join("docket.toml"))
        .unwrap()
        .lines()
        .position(|l| l.contains(needle))
        .expect(needle)
        + 1
}

fn config_error(ws: &Workspace) -> String {
    match docket::config::LoadedConfig::load(&ws.path().join("docket.toml")) {
        Ok(_) => panic!("the config was accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn config_errors_name_the_file_line_and_key() {
    let cases = [
        (
            "mode = \"batch\"\nmax_batchez = 3",
            "max_batchez = 3",
            "max_batchez",
        ),
        (
            "mode = \"batch\"\nmax_open_batches = 0",
            "max_open_batches = 0",
            "stages[0].batch.max_open_batches",
        ),
        (
            "mode = \"batch\"\npoll_interval_secs = 0",
            "poll_interval_secs = 0",
            "stages[0].batch.poll_interval_secs",
        ),
        (
            "mode = \"batch\"\nmax_requests = 0",
            "max_requests = 0",
            "stages[0].batch.max_requests",
        ),
        ("mode = \"sometimes\"", "mode = \"sometimes\"", "sometimes"),
    ];
    for (body, needle, key) in cases {
        let ws = workspace(&Job::new("http://127.0.0.1:9/v1"));
        set_batch_raw(&ws, body);
        let line = line_of(&ws, needle);
        let err = config_error(&ws);
        assert!(
            err.contains(&format!("docket.toml:{line}:")),
            "{body:?}: no file:line {line} in {err}"
        );
        assert!(err.contains(key), "{body:?}: no key {key} in {err}");
    }
    // The engine refuses the same way before anything is sent.
    let ws = workspace(&Job::new("http://127.0.0.1:9/v1"));
    set_batch_raw(&ws, "mode = \"batch\"\nmax_open_batches = 0");
    let err = match docket::engine::prepare(&options(&ws)) {
        Ok(_) => panic!("prepared a bad config"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("max_open_batches") && err.contains("docket.toml:"),
        "{err}"
    );
}

/// Row B2: a batch create the provider refuses (a 400, after the input
/// file was uploaded) makes no batch and costs nothing: its lines go back
/// and are sent in a new batch, every item ends with one result, and the
/// uploaded file no batch uses is deleted at the provider.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_create_loses_no_line_and_deletes_its_upload() {
    let cfg = MockConfig {
        batch_refuse_create: 1,
        batch_validating_ms: 100,
        batch_running_ms: 400,
        batch_finalizing_ms: 100,
        ..Default::default()
    };
    let (m, ws) = batch_ws(cfg, 30, "mode = \"batch\"").await;
    let (report, lines) = run_in_time(options(&ws)).await;
    assert_eq!(report.end, RunEnd::Completed, "{}", lines.text());
    let sid = report.session_id.unwrap();
    let conn = ws.conn();
    check_complete(&conn, &sid);
    each_item_once(&conn, &sid, 30);
    no_double_answers(&conn);
    let st = m.stats();
    assert_eq!(st.files_uploaded, st.batches_created + 1, "{st:?}");
    // The refused create's upload at once; the batch's input and output
    // files once it is done with (row B2).
    assert_eq!(
        st.files_deleted,
        st.files_uploaded + st.batches_completed,
        "every upload and output file: {st:?}"
    );
    assert_eq!(st.batch_lines_ok, 30, "each line ran once: {st:?}");
    let refused: i64 = count(
        &conn,
        "SELECT COUNT(*) FROM llm_messages WHERE state = 'failed' AND error_message LIKE '%refused%'",
        [],
    );
    assert!(refused >= 1, "the refusal is on record");
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_messages WHERE state = 'failed' AND cost_usd > 0",
            []
        ),
        0,
        "a refused create costs nothing"
    );
}
