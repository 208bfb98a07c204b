//! Fault-matrix rows B1, B2, B3, B5 and B8 end to end: the real `docket
//! batch-adjudicate` on the Batch APIs of the in-process mock (over real
//! HTTP), a real SQLite ledger, and the mock's billing log as the oracle.
//!
//! - B1: an Anthropic create whose answer is lost, with another client's
//!   batches of the same size in the same window: docket waits for the
//!   candidates to end and tells its own apart by its custom ids (adopted),
//!   or finds none of them is (submitted again); never resubmitted while
//!   unresolved.
//! - B2: a batch the provider fails at validation (naming an input line) is
//!   failed at no cost, its lines are sent again, the error names the line,
//!   and every file a batch left at the provider (its uploaded input, its
//!   results) is deleted once the batch is done with; on Gemini too, whose
//!   larger batches go up through the Files API.
//! - B3: the enqueued-token limit: refusals are few (learned, held, no hot
//!   loop) and lose nothing; a configured budget keeps every create under it.
//! - B5: a cancel started by the provider: what finished is kept (paid),
//!   the rest is sent again, nothing billed twice.
//! - B8: a batch past its window is shown "stalled for" in the run and the
//!   console and left running; polls refused (429) or failing (503) back off
//!   and the run completes.

use docket_testkit as support;

use std::collections::HashSet;
use std::time::Duration;

use docket::provider::ApiKey;
use docket::provider::batch::BatchProvider;
use docket::provider::batch::openai::OpenAiBatch;
use support::batch_engine::{
    BatchWs, KEY, Wire, answered_later, batch_files, batch_rows, check_billing, each_item_once,
    file_stored, ids_in, line_rows, mock, no_double_answers, workspace,
};
use support::tmux::{Pane, sh_quote};
use support::{check_complete, count, poll};

/// The session's batches made at the provider: (provider id, the input
/// file the ledger recorded: None for an inline Gemini batch).
fn made(conn: &rusqlite::Connection, sid: &str) -> Vec<(String, Option<String>)> {
    conn.prepare(
        "SELECT provider_batch_id, input_file_id FROM provider_batch
         WHERE session_id = ?1 AND provider_batch_id IS NOT NULL ORDER BY batch_id",
    )
    .unwrap()
    .query_map([sid], |r| Ok((r.get(0)?, r.get(1)?)))
    .unwrap()
    .map(Result::unwrap)
    .collect()
}

/// Every file the session's provider batches name at the mock (inputs and
/// results), none of them still stored: each was deleted once (the mock's
/// `files_deleted` counts them, plus `also_deleted` more: uploads of
/// refused creates). Returns how many the batches name.
async fn every_file_deleted(
    m: &docket::mock::MockServer,
    ws: &BatchWs,
    sid: &str,
    also_deleted: u64,
) -> usize {
    let conn = ws.conn();
    let mut named = HashSet::new();
    for (pid, recorded) in made(&conn, sid) {
        let (input, results) = batch_files(m, ws.wire, &pid).await;
        let input = input.expect("a batch read from an uploaded file");
        assert_eq!(
            recorded.as_ref(),
            Some(&input),
            "{pid}: the ledger's input file"
        );
        named.insert(input);
        named.extend(results);
    }
    for f in &named {
        assert!(
            !file_stored(m, ws.wire, f).await,
            "{f} is still stored at the provider"
        );
        assert!(
            m.deleted_file(f).is_some(),
            "{f} was deleted through the API"
        );
    }
    let st = m.stats();
    assert_eq!(
        st.files_deleted,
        named.len() as u64 + also_deleted,
        "each file deleted once: {st:?}"
    );
    named.len()
}

// ------------------------------------------------------------------- B2

/// Row B2 on OpenAI: the first batch fails validation naming input line 2
/// (`invalid_json_line`). It is failed at no cost, the error on the batch
/// and on its lines shows the line, and every line goes back and is
/// answered in a later batch, once. Every file any batch left at the
/// provider (inputs of the failed and the completed batches, their output
/// files) is deleted once the batch is done with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b2_openai_a_batch_failed_at_validation_names_its_line_and_leaves_no_file() {
    let items = 12;
    let m = mock(|c| c.batch_reject_input = 1).await;
    let ws = workspace(Wire::OpenAi, &m, items);
    let sid = ws.run_to(0).await;
    let conn = ws.conn();
    check_complete(&conn, &sid);
    each_item_once(&conn, &sid, items as i64);
    no_double_answers(&conn);

    let st = m.stats();
    let rows = batch_rows(&conn, &sid);
    assert_eq!(st.batches_failed, 1, "{st:?}");
    assert_eq!(rows.len() as u64, st.batches_created, "{rows:?}");
    assert!(rows.len() >= 2, "{rows:?}");
    let failed = &rows[0];
    let why: String = conn
        .query_row(
            "SELECT error_message FROM provider_batch WHERE batch_id = ?1",
            [failed.batch_id],
            |r| r.get(0),
        )
        .unwrap();
    assert!(
        why.contains("line 2") && why.contains("invalid_json_line"),
        "{why}"
    );
    for b in &rows {
        assert_eq!(b.state, "ingested", "{b:?}");
    }
    // Its lines: failed, at no cost, the provider's error with the line,
    // and each answered later in another batch.
    let lines = line_rows(&conn);
    let of_failed: Vec<_> = lines
        .values()
        .filter(|l| l.batch_id == failed.batch_id)
        .collect();
    assert_eq!(of_failed.len(), items, "{of_failed:?}");
    for l in &of_failed {
        assert_eq!(l.state, "failed", "{l:?}");
        assert_eq!(l.cost_usd.unwrap_or(0.0), 0.0, "{l:?}");
        let msg = l.error_message.as_deref().unwrap_or_default();
        assert!(msg.contains("line 2"), "{msg}");
        assert!(
            lines.values().any(|o| o.request_id == l.request_id
                && o.batch_id != failed.batch_id
                && o.state == "answered"),
            "{l:?} was never answered later"
        );
    }
    // Nothing of the failed batch ran or was billed; the oracle holds.
    let billing = check_billing(&m, Wire::OpenAi, &conn, &sid).await;
    assert_eq!(billing.billed.len(), items, "each request billed once");
    assert!(billing.ambiguous.is_empty());
    assert_eq!(st.batch_lines_ok, items as u64, "{st:?}");

    // Every upload and every results file is gone from the provider.
    assert_eq!(st.files_uploaded, st.batches_created, "{st:?}");
    let deleted = every_file_deleted(&m, &ws, &sid, 0).await;
    assert!(deleted as u64 > st.files_uploaded, "inputs and outputs");

    // Deleting again (a resume that settles a batch a second time) is no
    // error and deletes nothing: a file already gone counts as deleted.
    let adapter = OpenAiBatch::openai("openai", &m.base_url(), Some(ApiKey::new(KEY))).unwrap();
    for b in &rows {
        let pid = b.provider_batch_id.as_deref().unwrap();
        let status = adapter.poll(pid).await.expect("poll");
        let again = adapter.delete_files(pid, None, Some(&status)).await;
        assert_eq!(again.expect("deleting again"), 0, "{pid}");
    }
    assert_eq!(m.stats().files_deleted, deleted as u64);
}

/// Row B2 on Gemini's file path (bodies above the inline limit go up
/// through the Files API): every upload, and every responses file, is
/// deleted once its batch is done with; the lines are answered from the
/// responses files, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b2_gemini_uploads_and_responses_files_are_deleted_once_done_with() {
    let items = 12;
    let m = mock(|_| {}).await;
    let ws =
        workspace(Wire::Gemini, &m, items).with_env("DOCKET_GEMINI_INLINE_LIMIT_BYTES", "1000");
    ws.batch_settings("max_requests = 6");
    let sid = ws.run_to(0).await;
    let conn = ws.conn();
    check_complete(&conn, &sid);
    each_item_once(&conn, &sid, items as i64);
    no_double_answers(&conn);
    let st = m.stats();
    let rows = batch_rows(&conn, &sid);
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(st.files_uploaded, 2, "{st:?}");
    // The results came through responses files, each line once, billed once.
    let billing = check_billing(&m, Wire::Gemini, &conn, &sid).await;
    assert_eq!(billing.billed.len(), items);
    for s in billing.served.values() {
        assert!(s.lines.values().all(|n| *n == 1), "{:?}", s.lines);
    }
    let deleted = every_file_deleted(&m, &ws, &sid, 0).await;
    assert_eq!(deleted, 4, "two inputs and two responses files");
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM session_event WHERE kind = 'batch_files_kept'",
            []
        ),
        0
    );
}

// ------------------------------------------------------------------- B3

/// The prompt tokens of `items` demo items as the mock counts them (the
/// sum of the answered lines' input tokens in a run with no limit).
async fn prompt_tokens_of(wire: Wire, items: usize) -> u64 {
    let probe = mock(|_| {}).await;
    let ws = workspace(wire, &probe, items);
    ws.run_to(0).await;
    let tokens = count(
        &ws.conn(),
        "SELECT SUM(input_tokens) FROM llm_messages WHERE state = 'answered'",
        [],
    ) as u64;
    assert!(tokens > 0);
    tokens
}

/// Creates the provider refused for the enqueued-token limit: OpenAI fails
/// the batch at validation, Anthropic and Gemini answer the create a 429.
fn refused_creates(m: &docket::mock::MockServer, wire: Wire) -> u64 {
    let st = m.stats();
    match wire {
        Wire::OpenAi => st.batches_failed,
        _ => st.batch_rate_limited,
    }
}

/// Row B3 on `wire`, learned: four batches of a quarter of the items are
/// formed at once, and the provider's queue holds two (3/5 of their
/// tokens), each running five seconds. The creates past it are refused
/// (failed at validation, or a 429 at create), once each and no more:
/// their lines are failed at no cost and wait before they go again, and
/// the planner, having learned the budget, holds the batches they form
/// until the open ones finish; every item ends once, billed once.
async fn b3_learned(
    wire: Wire,
    env: Option<(&str, &str)>,
) -> (docket::mock::MockServer, BatchWs, String) {
    let items = 40;
    let tokens = prompt_tokens_of(wire, items).await;
    let m = mock(|c| {
        c.batch_enqueued_token_limit = tokens * 3 / 5;
        // Five seconds: the refused lines' one-second hold must end while
        // the open batches still run, however late a loaded machine makes
        // the creates past the limit (at two seconds, CI once saw none wait).
        c.batch_running_ms = 5_000;
    })
    .await;
    let mut ws = workspace(wire, &m, items);
    if let Some((k, v)) = env {
        ws = ws.with_env(k, v);
    }
    ws.batch_settings("max_requests = 10\nmax_open_batches = 4");
    let sid = ws.run_to(0).await;
    let conn = ws.conn();
    check_complete(&conn, &sid);
    each_item_once(&conn, &sid, items as i64);
    no_double_answers(&conn);
    let billing = check_billing(&m, wire, &conn, &sid).await;
    assert_eq!(billing.billed.len(), items, "each request billed once");

    // The limit was met, a few times at most: learned, not asked in a loop.
    let refused = refused_creates(&m, wire);
    assert!((1..=3).contains(&refused), "refused creates: {refused}");
    let st = m.stats();
    assert_eq!(st.batch_lines_ok, items as u64, "{st:?}");
    // The batches formed of the refused lines waited for the open ones to
    // end (their one-second hold is over long before five seconds of
    // running). Anthropic's 429 says how long to wait (`retry-after`, the
    // length of a batch): its lines wait that long, and find room.
    if wire != Wire::Anthropic {
        let waits = support::events_of(&conn, &sid, "batch_waits_for_tokens");
        assert!(
            !waits.is_empty(),
            "no batch waited for room after a refusal"
        );
    }
    // Each refused batch's lines: failed for the limit, at no cost, and
    // sent again only after the hold (at least a second after the refusal).
    let rows = batch_rows(&conn, &sid);
    let failed: Vec<_> = rows
        .iter()
        .filter(|b| b.ingested_count == 0 && b.completed_count == 0)
        .collect();
    assert_eq!(failed.len() as u64, refused, "{rows:?}");
    let lines = line_rows(&conn);
    for b in &failed {
        let ended: f64 = conn
            .query_row(
                "SELECT ended_at FROM provider_batch WHERE batch_id = ?1",
                [b.batch_id],
                |r| r.get(0),
            )
            .unwrap();
        for l in lines.values().filter(|l| l.batch_id == b.batch_id) {
            assert_eq!(l.state, "failed", "{l:?}");
            assert_eq!(l.cost_usd.unwrap_or(0.0), 0.0, "{l:?}");
            let msg = l
                .error_message
                .as_deref()
                .unwrap_or_default()
                .to_lowercase();
            assert!(msg.contains("token") || msg.contains("quota"), "{msg}");
            let next: f64 = conn
                .query_row(
                    "SELECT MIN(sent_at) FROM llm_messages WHERE request_id = ?1 AND attempt > ?2",
                    [l.request_id, l.attempt],
                    |r| r.get(0),
                )
                .unwrap();
            assert!(
                next - ended >= 0.9,
                "{}: sent again {:.2} s after its batch was refused",
                l.custom_id,
                next - ended
            );
        }
    }
    (m, ws, sid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b3_openai_a_learned_enqueued_budget_refuses_few_creates_and_loses_nothing() {
    b3_learned(Wire::OpenAi, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b3_anthropic_a_learned_enqueued_budget_refuses_few_creates_and_loses_nothing() {
    let (m, ..) = b3_learned(Wire::Anthropic, None).await;
    assert_eq!(
        m.stats().batches_failed,
        0,
        "a refused create makes no batch"
    );
}

/// Gemini, through the Files API: a refused create's upload is deleted at
/// once (row B2), the others once their batches are done with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b3_gemini_a_learned_enqueued_budget_refuses_few_creates_and_deletes_their_uploads() {
    let env = ("DOCKET_GEMINI_INLINE_LIMIT_BYTES", "1000");
    let (m, ws, sid) = b3_learned(Wire::Gemini, Some(env)).await;
    let st = m.stats();
    let refused = refused_creates(&m, Wire::Gemini);
    assert_eq!(st.files_uploaded, st.batches_created + refused, "{st:?}");
    every_file_deleted(&m, &ws, &sid, refused).await;
}

/// The planner's intervals of batches in progress at the mock (OpenAI):
/// the most that were ever in progress at once.
fn most_in_progress_at_once(m: &docket::mock::MockServer) -> usize {
    let mut edges: Vec<(u64, i32)> = Vec::new();
    for e in m.log() {
        match e.outcome.as_str() {
            "batch_in_progress" => edges.push((e.at_ms, 1)),
            "batch_completed" | "batch_failed" | "batch_expired" | "batch_cancelled"
                if e.status == 0 =>
            {
                edges.push((e.at_ms, -1))
            }
            _ => {}
        }
    }
    // An end before a start at the same ms.
    edges.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        most = most.max(now);
    }
    most.max(0) as usize
}

/// Row B3, configured: `max_enqueued_tokens` under the provider's limit
/// (which holds two batches of the four). The planner keeps the estimated
/// budget: a batch that would pass it waits (said once) until an open one
/// finishes, so the provider never refuses a create and never has more
/// than two in progress; every item ends once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b3_openai_a_configured_enqueued_budget_holds_batches_and_none_is_refused() {
    let items = 40;
    let tokens = prompt_tokens_of(Wire::OpenAi, items).await;
    let limit = tokens * 3 / 5;
    let m = mock(|c| {
        c.batch_enqueued_token_limit = limit;
        c.batch_running_ms = 600;
    })
    .await;
    let ws = workspace(Wire::OpenAi, &m, items);
    ws.batch_settings(&format!(
        "max_requests = 10\nmax_open_batches = 4\nmax_enqueued_tokens = {limit}"
    ));
    let sid = ws.run_to(0).await;
    let conn = ws.conn();
    check_complete(&conn, &sid);
    each_item_once(&conn, &sid, items as i64);
    no_double_answers(&conn);
    let st = m.stats();
    assert_eq!(refused_creates(&m, Wire::OpenAi), 0, "{st:?}");
    assert_eq!(st.batches_completed, st.batches_created, "{st:?}");
    assert!(st.batches_created >= 4, "{st:?}");
    let most = most_in_progress_at_once(&m);
    assert!(
        (1..=2).contains(&most),
        "{most} batches in progress at once"
    );
    let waits = support::events_of(&conn, &sid, "batch_waits_for_tokens");
    assert!(!waits.is_empty(), "no batch waited for room");
    assert!(
        waits[0].message.contains("gpt-4o-mini"),
        "{}",
        waits[0].message
    );
    let billing = check_billing(&m, Wire::OpenAi, &conn, &sid).await;
    assert_eq!(billing.billed.len(), items);
}

// ------------------------------------------------------------------- B8

/// Row B8, stalled: the provider keeps the batch `in_progress` far past the
/// stage's `stall_after_secs` (one second). The run says the batch is
/// "stalled for" so long (a line and a `batch_stalled` event), the console's
/// batches view (`b`) shows it, and nothing is cancelled or sent again:
/// once the provider finishes, the batch is ingested, every item once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b8_a_batch_past_its_window_is_shown_stalled_and_left_running() {
    let items = 8;
    let m = mock(|c| c.batch_running_ms = 7_000).await;
    let ws = workspace(Wire::OpenAi, &m, items);
    ws.batch_settings("stall_after_secs = 1");
    let run = ws.spawn();
    let conn = ws.conn();
    let sid = support::session_created(&ws.ws).await;
    let stalled = poll("the batch said stalled", Duration::from_secs(10), || {
        support::events_of(&conn, &sid, "batch_stalled").pop()
    })
    .await;
    assert!(
        stalled.message.contains("is stalled for") && stalled.message.contains("in_progress"),
        "{}",
        stalled.message
    );
    assert_eq!(stalled.level, "warn");

    // The console, on the same workspace, lists the batch as stalled.
    let cmd = format!(
        "cd {} && env HOME={} XDG_DATA_HOME={} NO_COLOR=1 {} --workspace {} console --session {}",
        sh_quote(&ws.ws.path().display().to_string()),
        sh_quote(&ws.home.path().display().to_string()),
        sh_quote(&ws.home.path().join("data").display().to_string()),
        sh_quote(support::procs::bin()),
        sh_quote(&ws.ws.path().display().to_string()),
        sh_quote(&sid),
    );
    let pane = Pane::start("b8-stalled", &cmd, 120, 40);
    pane.wait("the console on the session", Duration::from_secs(10), |s| {
        s.lines().next().is_some_and(|h| h.contains(&sid))
    });
    pane.keys(&["b"]);
    let screen = pane.wait(
        "the batches view showing the batch stalled",
        Duration::from_secs(10),
        |s| s.contains("Provider batches") && s.contains("stalled for"),
    );
    let line = screen
        .lines()
        .find(|l| l.contains("stalled for"))
        .unwrap_or_default();
    assert!(line.contains("in_progress"), "{line}\n{screen}");
    pane.keys(&["Escape", "q"]);
    drop(pane);

    let (code, out) = BatchWs::finish(run).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("is stalled for"), "{out}");
    check_complete(&conn, &sid);
    each_item_once(&conn, &sid, items as i64);
    let st = m.stats();
    assert_eq!(
        (st.batches_created, st.batches_cancelled),
        (1, 0),
        "no cancel, no second batch: {st:?}"
    );
    assert_eq!(st.batch_lines_ok, items as u64);
    // Said once.
    assert_eq!(support::events_of(&conn, &sid, "batch_stalled").len(), 1);
}

/// The seconds the engine said it would wait before the next poll, from
/// its `batch_poll_failed` events ("trying again in N s").
fn poll_waits(conn: &rusqlite::Connection, sid: &str) -> Vec<f64> {
    support::events_of(conn, sid, "batch_poll_failed")
        .iter()
        .filter_map(|e| {
            let rest = e.message.split("trying again in ").nth(1)?;
            rest.split(' ').next()?.parse().ok()
        })
        .collect()
}

/// Row B8, polls refused for rate limits: the mock's rpm bucket (one call a
/// second, shared by uploads, creates, polls and downloads) answers most
/// of the 0.1 s polls a 429 with `retry-after`. The poller honours it
/// (its next poll at least a second away, not 0.1 s), so its attempts stay
/// near one a second; the run completes, every item once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b8_polls_refused_with_429_back_off_and_the_run_completes() {
    let items = 8;
    let m = mock(|c| {
        c.rpm_limit = 60;
        c.batch_running_ms = 3_000;
    })
    .await;
    let ws = workspace(Wire::OpenAi, &m, items);
    let started = std::time::Instant::now();
    let sid = ws.run_to(0).await;
    let took = started.elapsed().as_secs_f64();
    let conn = ws.conn();
    check_complete(&conn, &sid);
    each_item_once(&conn, &sid, items as i64);
    no_double_answers(&conn);
    let st = m.stats();
    assert!(st.batch_rate_limited >= 1, "{st:?}");
    let waits = poll_waits(&conn, &sid);
    assert!(waits.len() >= 2, "polls refused: {waits:?}");
    assert!(
        waits.iter().all(|w| *w >= 1.0),
        "the poll interval grew from 0.1 s to the hint: {waits:?}"
    );
    // At the configured 0.1 s the poller would have asked ten times a
    // second through the batch's three seconds of running; backing off,
    // it asks about once a second (the bucket's rate).
    assert!(
        (st.batch_polls as f64) <= 2.0 * took + 2.0,
        "{} polls in {took:.1} s",
        st.batch_polls
    );
    let polled = count(
        &conn,
        "SELECT poll_count FROM provider_batch WHERE session_id = ?1",
        [&sid],
    );
    assert!(polled >= 2, "polls answered: {polled}");
    // One batch, its create asked again after a 429 with the same upload.
    assert_eq!((st.batches_created, st.files_uploaded), (1, 1), "{st:?}");
}

/// Row B8, polls failing with 503s (`batch_poll_fail`): the poller backs off
/// exponentially (2 s, then 4 s: not the configured 0.1 s), says so, and
/// the run completes once polls answer again, with no second batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b8_polls_failing_with_503_back_off_exponentially_and_the_run_completes() {
    let items = 8;
    let m = mock(|c| c.batch_poll_fail = 2).await;
    let ws = workspace(Wire::OpenAi, &m, items);
    let started = std::time::Instant::now();
    let sid = ws.run_to(0).await;
    let took = started.elapsed().as_secs_f64();
    let conn = ws.conn();
    check_complete(&conn, &sid);
    each_item_once(&conn, &sid, items as i64);
    let st = m.stats();
    assert_eq!(st.batches_created, 1, "{st:?}");
    let failed = support::events_of(&conn, &sid, "batch_poll_failed");
    assert_eq!(failed.len(), 1, "said at the first failure: {failed:?}");
    assert!(failed[0].message.contains("503"), "{}", failed[0].message);
    assert_eq!(poll_waits(&conn, &sid), vec![2.0]);
    // Two failed polls, 2 s and 4 s apart before the next: the run lasted
    // at least their sum.
    assert!(took >= 6.0, "{took:.1} s");
    let polled: i64 = count(
        &conn,
        "SELECT poll_count FROM provider_batch WHERE session_id = ?1",
        [&sid],
    );
    assert!(polled >= 1);
}

// ------------------------------------------------------------------- B5

/// Row B5 on `wire`, a cancel started by the provider: the first batch is
/// cancelled at the provider (not by docket) part way through. The k lines
/// it finished are ingested at the oracle's cost, the n−k it never ran are
/// recorded as not run (no cost) and answered in a later batch, every item
/// once, no custom_id billed twice; docket never sent a cancel and says
/// the provider cancelled it.
async fn b5(wire: Wire) {
    let items = 20;
    let m = mock(|c| {
        c.batch_running_ms = 1_500;
        c.batch_cancel_after_ms = 600;
    })
    .await;
    let ws = workspace(wire, &m, items);
    let run = ws.spawn();
    poll(
        "the provider to cancel a batch",
        Duration::from_secs(20),
        || {
            m.log()
                .iter()
                .any(|e| e.outcome == "batch_cancelling")
                .then_some(())
        },
    )
    .await;
    // Later batches run whole.
    m.set_config(docket::mock::MockConfig {
        batch_cancel_after_ms: 0,
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
    assert_eq!(st.batches_cancelled, 1, "{st:?}");
    let rows = batch_rows(&conn, &sid);
    assert!(rows.len() >= 2, "{rows:?}");
    for b in &rows {
        assert_eq!(b.state, "ingested", "{b:?}");
    }
    // Nobody asked: every cancel in the mock's log is its own (status 0).
    let cancels: Vec<_> = m
        .log()
        .into_iter()
        .filter(|e| e.outcome == "batch_cancelling")
        .collect();
    assert_eq!(cancels.len(), 1, "{cancels:?}");
    assert_eq!(cancels[0].status, 0, "docket sent a cancel: {cancels:?}");
    let told = support::events_of(&conn, &sid, "batch_cancelled_by_provider");
    assert_eq!(told.len(), 1, "{told:?}");

    let billing = check_billing(&m, wire, &conn, &sid).await;
    assert!(billing.ambiguous.is_empty(), "{:?}", billing.ambiguous);
    assert_eq!(billing.billed.len(), items, "each request billed once");

    // The cancelled batch: k lines finished and billed, ingested; n−k not.
    let first = &rows[0];
    let pid = first.provider_batch_id.clone().expect("submitted");
    let k: HashSet<String> = support::batch_engine::line_log(&m)
        .into_iter()
        .filter(|e| e.batch == pid && e.status == 200)
        .map(|e| e.custom_id)
        .collect();
    let n = first.request_count as usize;
    assert!(!k.is_empty() && k.len() < n, "k {} of {n}", k.len());
    let lines = line_rows(&conn);
    assert_eq!(ids_in(&lines, first.batch_id, "answered", None), k);
    let unrun = ids_in(&lines, first.batch_id, "failed", Some("not_run"));
    assert_eq!(unrun.len(), n - k.len(), "{unrun:?}");
    for id in &unrun {
        assert!(!billing.billed.contains(id));
        assert_eq!(lines[id].cost_usd.unwrap_or(0.0), 0.0);
        assert!(answered_later(&lines, id), "{id} was never answered later");
    }
    assert!(billing.ledger_cost > 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b5_openai_a_cancel_by_the_provider_keeps_what_finished_and_sends_the_rest_again() {
    b5(Wire::OpenAi).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b5_anthropic_a_cancel_by_the_provider_keeps_what_finished_and_sends_the_rest_again() {
    b5(Wire::Anthropic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b5_gemini_a_cancel_by_the_provider_keeps_what_finished_and_sends_the_rest_again() {
    b5(Wire::Gemini).await;
}

// ------------------------------------------------------------------- B1

/// Another client's Anthropic batch of `n` requests (custom ids `other-…`),
/// made over HTTP: its id.
async fn anthropic_batch_of_another_client(
    m: &docket::mock::MockServer,
    n: usize,
    who: &str,
) -> String {
    let requests: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            serde_json::json!({
                "custom_id": format!("{who}-{i}"),
                "params": {"model": Wire::Anthropic.model(), "max_tokens": 50,
                           "messages": [{"role": "user", "content": format!("{who} asks {i}")}]},
            })
        })
        .collect();
    let r = reqwest::Client::new()
        .post(format!(
            "{}/v1/messages/batches",
            support::batch_engine::root(m)
        ))
        .header("x-api-key", KEY)
        .header("anthropic-version", "2023-06-01")
        .json(&serde_json::json!({"requests": requests}))
        .send()
        .await
        .expect("a create");
    assert!(r.status().is_success(), "{}", r.status());
    let v: serde_json::Value = r.json().await.unwrap();
    v["id"].as_str().expect("an id").to_string()
}

/// When Anthropic batch `id` ended (unix seconds), asked over HTTP.
async fn anthropic_ended_at(m: &docket::mock::MockServer, id: &str) -> f64 {
    let v: serde_json::Value = reqwest::Client::new()
        .get(format!(
            "{}/v1/messages/batches/{id}",
            support::batch_engine::root(m)
        ))
        .header("x-api-key", KEY)
        .header("anthropic-version", "2023-06-01")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let at = v["ended_at"]
        .as_str()
        .unwrap_or_else(|| panic!("not ended: {v}"));
    let t = chrono::DateTime::parse_from_rfc3339(at).unwrap();
    t.timestamp() as f64 + f64::from(t.timestamp_subsec_micros()) / 1e6
}

/// Row B1 on Anthropic, set up: `others` batches of another client with as
/// many requests as docket's one batch, made just before the run (in its
/// window, still running when docket looks: four seconds), with no line
/// in the billing log; then `tweak` for docket's create.
async fn b1_setup(
    items: usize,
    others: usize,
    tweak: impl FnOnce(&mut docket::mock::MockConfig),
) -> (docket::mock::MockServer, BatchWs, Vec<String>) {
    let m = mock(|c| {
        c.batch_line_log = false;
        c.batch_running_ms = 4_000;
    })
    .await;
    let mut foreign = Vec::new();
    for i in 0..others {
        foreign.push(anthropic_batch_of_another_client(&m, items, &format!("other{i}")).await);
    }
    let mut cfg = docket::mock::MockConfig {
        batch_line_log: true,
        batch_running_ms: 500,
        ..m.config()
    };
    tweak(&mut cfg);
    m.set_config(cfg);
    let ws = workspace(Wire::Anthropic, &m, items);
    ws.batch_settings(&format!("max_requests = {items}"));
    (m, ws, foreign)
}

/// Row B1 on Anthropic: docket's create makes the batch but the answer is
/// lost (a 500), and another client's batch has the same request count in
/// the same window, so time and count cannot tell them apart. Nothing is
/// sent again: docket waits for both to end, finds its custom ids in one
/// of them, adopts that one and ingests it; one create, every item once,
/// the other client's batch untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b1_anthropic_an_ambiguous_lost_create_is_told_apart_by_its_custom_ids() {
    let items = 6;
    let (m, ws, foreign) = b1_setup(items, 1, |c| c.batch_lose_create = 1).await;
    let sid = ws.run_to(0).await;
    let conn = ws.conn();
    check_complete(&conn, &sid);
    each_item_once(&conn, &sid, items as i64);
    no_double_answers(&conn);
    let st = m.stats();
    assert_eq!(
        st.batches_created, 2,
        "the other client's and docket's one: {st:?}"
    );
    let rows = batch_rows(&conn, &sid);
    assert_eq!(rows.len(), 1, "{rows:?}");
    let ours = rows[0].provider_batch_id.clone().expect("adopted");
    assert_ne!(ours, foreign[0], "the other client's batch was taken");
    assert_eq!(rows[0].state, "ingested");
    assert_eq!(rows[0].ingested_count, items as i64, "{rows:?}");
    assert_eq!(rows[0].quarantined_count, 0, "{rows:?}");
    let unknown = support::events_of(&conn, &sid, "batch_unknown");
    assert_eq!(unknown.len(), 1, "{unknown:?}");
    assert!(
        unknown[0].message.contains("2 batches"),
        "{}",
        unknown[0].message
    );
    let found = support::events_of(&conn, &sid, "batch_found");
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].message.contains(&ours) && found[0].message.contains("custom ids"),
        "{}",
        found[0].message
    );
    // Adopted only once the other client's batch had ended.
    let other_ended = anthropic_ended_at(&m, &foreign[0]).await;
    assert!(
        found[0].at >= other_ended,
        "adopted at {} before the other batch ended at {other_ended}",
        found[0].at
    );
    assert!(support::events_of(&conn, &sid, "batch_resubmitted").is_empty());
    let billing = check_billing(&m, Wire::Anthropic, &conn, &sid).await;
    assert_eq!(billing.billed.len(), items);
}

/// Row B1 on Anthropic, the other way: docket's create is lost before the
/// provider acts on it (a 500, no batch), and two batches of another
/// client match its time and count. docket waits for both to end, finds
/// none of its custom ids in them, and only then submits again: one batch
/// of its own, every item once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b1_anthropic_a_lost_create_matching_none_of_the_candidates_is_submitted_again() {
    let items = 6;
    let (m, ws, foreign) = b1_setup(items, 2, |c| c.batch_drop_create = 1).await;
    let sid = ws.run_to(0).await;
    let conn = ws.conn();
    check_complete(&conn, &sid);
    each_item_once(&conn, &sid, items as i64);
    no_double_answers(&conn);
    let st = m.stats();
    assert_eq!(
        st.batches_created, 3,
        "two of the other client's, one of docket's: {st:?}"
    );
    assert_eq!(
        m.log()
            .iter()
            .filter(|e| e.outcome == "batch_create_dropped")
            .count(),
        1
    );
    let rows = batch_rows(&conn, &sid);
    assert_eq!(rows.len(), 1, "{rows:?}");
    let ours = rows[0].provider_batch_id.clone().expect("submitted");
    assert!(!foreign.contains(&ours), "{ours} is another client's");
    let again = support::events_of(&conn, &sid, "batch_resubmitted");
    assert_eq!(again.len(), 1, "{again:?}");
    assert!(
        again[0].message.contains("none of the 2"),
        "{}",
        again[0].message
    );
    assert!(support::events_of(&conn, &sid, "batch_found").is_empty());
    // Submitted again only once both had ended.
    let submitted: f64 = conn
        .query_row(
            "SELECT submitted_at FROM provider_batch WHERE batch_id = ?1",
            [rows[0].batch_id],
            |r| r.get(0),
        )
        .unwrap();
    for f in &foreign {
        let ended = anthropic_ended_at(&m, f).await;
        assert!(
            submitted >= ended,
            "submitted at {submitted}, {f} ended at {ended}"
        );
    }
    let billing = check_billing(&m, Wire::Anthropic, &conn, &sid).await;
    assert_eq!(billing.billed.len(), items);
}

/// The new batch settings are checked like every key: out of range or
/// misspelled, the run stops before a session exists, naming the key path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b3_b8_the_new_batch_settings_are_checked_before_a_session() {
    let m = mock(|_| {}).await;
    for (setting, named) in [
        (
            "max_enqueued_tokens = 0",
            "stages[0].batch.max_enqueued_tokens",
        ),
        ("stall_after_secs = 0.5", "stages[0].batch.stall_after_secs"),
        ("max_enqueued_token = 100", "max_enqueued_token"),
    ] {
        let ws = workspace(Wire::OpenAi, &m, 2);
        ws.batch_settings(setting);
        let (code, out) = BatchWs::finish(ws.spawn()).await;
        assert_ne!(code, Some(0), "{setting}: {out}");
        assert!(out.contains(named), "{setting}: {out}");
        assert_eq!(
            count(&ws.conn(), "SELECT COUNT(*) FROM llm_batch_session", []),
            0,
            "{setting}: a session was made"
        );
    }
    assert_eq!(m.stats().batches_created, 0);
}
