//! Run policy `completion_mode` end to end: the real `docket
//! batch-adjudicate` on the mock's OpenAI Batch API, whose batches expire
//! once half their lines ran (a batch of one line expires with none run).
//! Each request may fail twice (`max_transport_attempts = 2`).
//!
//! - exact (here by `--completion-mode exact`, over `best_effort` in
//!   docket.toml): a line never run spends none of that budget and goes
//!   again in a new batch until it runs; every item ends answered.
//! - best_effort: a line never run spends a transport attempt; past the
//!   budget its item ends in `error` and the session completes (exit 5).
//!
//! Both read the stored mode back from `docket sessions --format json` and
//! `docket batch-results`.

use docket_testkit as support;

use std::time::Duration;

use docket::mock::MockConfig;
use rusqlite::Connection;
use support::batch_engine::{BatchWs, Wire, mock, workspace};
use support::{check_complete, count, poll};

const ITEMS: usize = 6;

/// A workspace whose requests may fail twice, with `completion_mode` set to
/// `mode` in docket.toml, at a mock whose batches expire halfway.
async fn expiring(mode: &str) -> (docket::mock::MockServer, BatchWs) {
    let m = mock(|c| {
        c.batch_expire = 0.5;
        c.batch_running_ms = 400;
    })
    .await;
    let ws = workspace(Wire::OpenAi, &m, ITEMS);
    let path = ws.ws.path().join("docket.toml");
    let toml = std::fs::read_to_string(&path).unwrap();
    let toml = toml
        .replacen(
            "max_transport_attempts = 4",
            "max_transport_attempts = 2",
            1,
        )
        .replacen(
            "[job]\n",
            &format!("[job]\ncompletion_mode = \"{mode}\"\n"),
            1,
        );
    std::fs::write(&path, toml).unwrap();
    (m, ws)
}

/// The most sends of one request that never ran.
fn most_not_run(conn: &Connection) -> i64 {
    count(
        conn,
        "SELECT COALESCE(MAX(n), 0) FROM (SELECT COUNT(*) AS n FROM llm_messages \
         WHERE error_kind = 'not_run' GROUP BY request_id)",
        [],
    )
}

/// `docket ARGS` in the workspace: its stdout (it must succeed).
fn docket(ws: &BatchWs, args: &[&str]) -> String {
    let out = support::procs::docket_at(ws.ws.path(), ws.home.path())
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "docket {args:?}: {}",
        support::said(&out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The mode `docket sessions` and `docket batch-results` show for `sid`.
fn shown_mode(ws: &BatchWs, sid: &str, mode: &str) {
    let json: serde_json::Value =
        serde_json::from_str(&docket(ws, &["sessions", "--format", "json"])).unwrap();
    let row = json
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["session_id"] == sid)
        .expect("the session listed");
    assert_eq!(row["completion_mode"], mode, "{row}");
    let table = docket(ws, &["sessions"]);
    let line = table.lines().find(|l| l.starts_with(sid)).expect("its row");
    assert!(line.contains(mode), "{table}");
    let results = docket(ws, &["batch-results", sid]);
    assert!(
        results.contains(&format!("Completion: {mode}")),
        "{results}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_sends_lines_never_run_again_past_their_budget_until_every_item_answers() {
    let (m, ws) = expiring("best_effort").await;
    let run = ws.spawn_with(&["--completion-mode", "exact"]);
    // Some request's line went unrun more times than its two sends allow.
    let conn = ws.conn();
    poll(
        "a line never run three times",
        Duration::from_secs(20),
        || (most_not_run(&conn) >= 3).then_some(()),
    )
    .await;
    m.set_config(MockConfig {
        batch_expire: 0.0,
        ..m.config()
    });
    let (code, out) = BatchWs::finish(run).await;
    assert_eq!(code, Some(0), "{out}");
    let sid = ws.session();
    check_complete(&conn, &sid);
    let errors = count(
        &conn,
        "SELECT COUNT(*) FROM llm_batch_result WHERE session_id = ?1 AND outcome = 'error'",
        [&sid],
    );
    assert_eq!(errors, 0, "{out}");
    let results = count(
        &conn,
        "SELECT COUNT(*) FROM llm_batch_result WHERE session_id = ?1",
        [&sid],
    );
    assert_eq!(results, ITEMS as i64);
    // Never run spent none of the budget.
    assert_eq!(
        count(
            &conn,
            "SELECT COALESCE(SUM(transport_retries), 0) FROM llm_requests",
            []
        ),
        0
    );
    assert!(m.stats().batches_expired >= 3, "{:?}", m.stats());
    shown_mode(&ws, &sid, "exact");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn best_effort_ends_lines_never_run_past_their_budget_as_errors() {
    let (m, ws) = expiring("best_effort").await;
    let (code, out) = BatchWs::finish(ws.spawn()).await;
    // Completed with items in error.
    assert_eq!(code, Some(5), "{out}");
    let sid = ws.session();
    let conn = ws.conn();
    check_complete(&conn, &sid);
    let given_up = count(
        &conn,
        "SELECT COUNT(*) FROM llm_batch_result WHERE session_id = ?1 AND outcome = 'error' \
         AND error_message LIKE 'gave up after 2 sends that did not run%'",
        [&sid],
    );
    let answered = count(
        &conn,
        "SELECT COUNT(*) FROM llm_batch_result WHERE session_id = ?1 AND outcome <> 'error'",
        [&sid],
    );
    // Halving batches leave at least one line that never runs twice.
    assert!(given_up >= 1, "{out}");
    assert_eq!(given_up + answered, ITEMS as i64, "{out}");
    // No line was ever sent a third time.
    assert_eq!(most_not_run(&conn), 2);
    assert!(m.stats().batches_expired >= 2, "{:?}", m.stats());
    shown_mode(&ws, &sid, "best_effort");
}

/// Chat requests that reached the mock synchronously.
fn sync_chat_calls(m: &docket::mock::MockServer) -> usize {
    m.log()
        .iter()
        .filter(|e| e.route.contains("chat/completions"))
        .count()
}

/// `auto` with fewer requests than `min_batch_size`: `exact` sends them
/// synchronously, `throughput` puts them in a provider batch (half price).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throughput_batches_a_cut_smaller_than_min_batch_size() {
    for (mode, batched) in [("exact", false), ("throughput", true)] {
        let m = mock(|_| {}).await;
        let ws = workspace(Wire::OpenAi, &m, ITEMS);
        let path = ws.ws.path().join("docket.toml");
        let toml = std::fs::read_to_string(&path).unwrap().replacen(
            "mode = \"batch\"",
            "mode = \"auto\"\nmin_batch_size = 100",
            1,
        );
        std::fs::write(&path, toml).unwrap();
        let (code, out) = BatchWs::finish(ws.spawn_with(&["--completion-mode", mode])).await;
        assert_eq!(code, Some(0), "{mode}: {out}");
        let sid = ws.session();
        check_complete(&ws.conn(), &sid);
        let st = m.stats();
        if batched {
            assert!(st.batches_created >= 1, "{mode}: {st:?}");
            assert_eq!(sync_chat_calls(&m), 0, "{mode}");
        } else {
            assert_eq!(st.batches_created, 0, "{mode}: {st:?}");
            assert_eq!(sync_chat_calls(&m), ITEMS, "{mode}");
        }
        shown_mode(&ws, &sid, mode);
    }
}
