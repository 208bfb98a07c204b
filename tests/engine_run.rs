//! The engine end to end against the built-in mock (and one scripted server)
//! over loopback: counters, routing, flags, faults, budgets, resume.

use docket_testkit as support;

use std::net::SocketAddr;
use std::time::Duration;

use docket::engine::RunEnd;
use docket::mock::MockConfig;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_add_up_and_match_the_results_table() {
    let (m, ws) = mocked(MockConfig::default(), 300, |_| {}).await;
    let (report, lines) = run(options(&ws)).await;
    assert_eq!(report.end, RunEnd::Completed, "{}", lines.text());
    let sid = report.session_id.unwrap();
    let conn = ws.conn();
    check_complete(&conn, &sid);
    let s = report.session.unwrap();
    assert_eq!(s.total_count, 300);
    // The mock's confidence spread reaches every band.
    assert!(
        s.accepted_count > 0 && s.reviewed_count > 0 && s.rejected_count > 0,
        "{s:?}"
    );
    // One answered send per item, nothing sent twice.
    assert_eq!(m.stats().ok, 300);
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_messages WHERE state = 'answered'",
            []
        ),
        300
    );
    // Tokens and cost are recorded and summed.
    let (tin, cost): (i64, f64) = conn
        .query_row(
            "SELECT SUM(input_tokens), SUM(cost_usd) FROM llm_batch_result WHERE session_id = ?1",
            [&sid],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(tin as u64, s.input_tokens);
    assert!((cost - s.cost_usd).abs() < 1e-9 && cost > 0.0);
    // The snapshot holds the config, never a key value.
    assert!(s.config_snapshot_json.contains("\"model\":\"gpt-4o-mini\""));
    // The review search index caught up as the writer ended: nothing waits,
    // and FTS5's content check agrees with the review items.
    assert_eq!(
        count(&conn, "SELECT COUNT(*) FROM review_search_pending", []),
        0
    );
    conn.execute(
        "INSERT INTO review_search(review_search, rank) VALUES ('integrity-check', 1)",
        [],
    )
    .expect("the search index matches the review items");
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM review_search WHERE review_search MATCH 'rr_mbid'",
            []
        ),
        s.reviewed_count as i64
    );
    // The seed's summary was printed.
    let text = lines.text();
    assert!(text.contains("✓ Auto-accepted:"), "{text}");
    assert!(text.contains(&format!("Creating batch session: {sid}")));
}

/// A scripted provider that answers with the confidence written in the prompt.
async fn echo_confidence_server() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    use axum::{Json, Router, routing::post};
    async fn handler(Json(body): Json<serde_json::Value>) -> Json<serde_json::Value> {
        let user = body["messages"]
            .as_array()
            .and_then(|m| m.last())
            .and_then(|m| m["content"].as_str())
            .unwrap_or("");
        let conf: f64 = user
            .split("CONF=")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .and_then(|s| s.parse().ok())
            .unwrap_or(0.0);
        let content = serde_json::json!({"crg_mbid": "c", "rr_mbid": "r", "confidence": conf, "rationale": "scripted"}).to_string();
        Json(serde_json::json!({
            "id": "chatcmpl-x", "object": "chat.completion", "created": 1, "model": "gpt-4o-mini",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "logprobs": null, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        }))
    }
    let app = Router::new().route("/v1/chat/completions", post(handler));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let h = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, h)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thresholds_route_boundary_values() {
    let (addr, _h) = echo_confidence_server().await;
    let mut job = Job::new(&format!("http://{addr}/v1"));
    job.template = Some("CONF={{ item.conf }} end");
    let ws = workspace(&job);
    let confs = [
        ("a", "1.0"),
        ("b", "0.85"),
        ("c", "0.8499"),
        ("d", "0.6"),
        ("e", "0.5999"),
        ("f", "0.0"),
        ("g", "0.9"),
    ];
    let path = ws.path().join("items/conf.jsonl");
    let body: String = confs
        .iter()
        .map(|(id, c)| format!("{{\"id\":\"{id}\",\"conf\":\"{c}\"}}\n"))
        .collect();
    std::fs::write(&path, body).unwrap();
    import(&ws, &path);
    let (report, lines) = run(options(&ws)).await;
    assert_eq!(report.end, RunEnd::Completed, "{}", lines.text());
    let sid = report.session_id.unwrap();
    let conn = ws.conn();
    check_complete(&conn, &sid);
    let outcome = |id: &str| -> String {
        conn.query_row(
            "SELECT outcome FROM llm_batch_result WHERE item_id = ?1",
            [id],
            |r| r.get(0),
        )
        .unwrap()
    };
    assert_eq!(outcome("a"), "accepted");
    assert_eq!(
        outcome("b"),
        "accepted",
        "== auto-accept threshold is accepted"
    );
    assert_eq!(outcome("c"), "review");
    assert_eq!(outcome("d"), "review", "== review threshold is review");
    assert_eq!(outcome("e"), "rejected");
    assert_eq!(outcome("f"), "rejected");
    // The decision took the model's answer; the review item holds the suggestion.
    let (state, answer): (String, String) = conn
        .query_row(
            "SELECT state, decided_answer_json FROM decision WHERE item_id = 'b'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(state, "decided");
    assert!(answer.contains("\"crg_mbid\":\"c\""));
    let sugg: String = conn
        .query_row(
            "SELECT llm_suggestion_json FROM review_item WHERE item_id = 'c'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(sugg.contains("0.8499"));

    // --min-confidence raises the accept bar; flags override the config.
    let ws2 = workspace(&job);
    import(&ws2, &path);
    let mut o = options(&ws2);
    o.min_confidence = Some(0.95);
    o.review_threshold = Some(0.5);
    let (report, _) = run(o).await;
    let conn = ws2.conn();
    let sid = report.session_id.unwrap();
    check_complete(&conn, &sid);
    let outcome = |id: &str| -> String {
        conn.query_row(
            "SELECT outcome FROM llm_batch_result WHERE item_id = ?1",
            [id],
            |r| r.get(0),
        )
        .unwrap()
    };
    assert_eq!(outcome("a"), "accepted");
    assert_eq!(outcome("g"), "review", "0.9 is below the 0.95 floor");
    assert_eq!(
        outcome("e"),
        "review",
        "0.5999 is above --review-threshold 0.5"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_and_skip_reviewed_choose_the_items() {
    let (m, ws) = mocked(MockConfig::default(), 40, |_| {}).await;
    let mut o = options(&ws);
    o.limit = Some(15);
    let (r1, _) = run(o).await;
    let s1 = r1.session.unwrap();
    assert_eq!(s1.total_count, 15);
    assert_eq!(m.stats().ok, 15);
    let conn = ws.conn();
    check_complete(&conn, &s1.session_id);
    let pending_reviews = count(
        &conn,
        "SELECT COUNT(*) FROM review_item WHERE status = 'pending'",
        [],
    );
    assert!(pending_reviews > 0);
    let indeterminate = count(
        &conn,
        "SELECT COUNT(*) FROM decision WHERE state = 'indeterminate'",
        [],
    );
    // By default (what --skip-reviewed asked for before) a new session
    // leaves out the items waiting for review.
    let o = options(&ws);
    assert!(!o.rereview_pending);
    let (r2, _) = run(o).await;
    let s2 = r2.session.unwrap();
    assert_eq!(s2.total_count as i64, indeterminate - pending_reviews);
    assert_eq!(
        0,
        count(
            &conn,
            "SELECT COUNT(*) FROM session_item si JOIN review_item r ON r.item_id = si.item_id
             WHERE si.session_id = ?1 AND r.session_id = ?2",
            rusqlite::params![s2.session_id, s1.session_id]
        )
    );
    // Items answered in the first session were not sent again in the second.
    let sent_twice = count(
        &conn,
        "SELECT COUNT(*) FROM (SELECT request_id FROM llm_messages WHERE state = 'answered' GROUP BY request_id HAVING COUNT(*) > 1)",
        [],
    );
    assert_eq!(sent_twice, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_sends_nothing_and_shows_the_first_prompt() {
    let (m, ws) = mocked(MockConfig::default(), 25, |_| {}).await;
    let mut o = options(&ws);
    o.dry_run = true;
    let (report, lines) = run(o).await;
    assert_eq!(report.end, RunEnd::DryRun);
    assert_eq!(m.stats().requests, 0, "the mock's counter: no HTTP request");
    let text = lines.text();
    assert!(text.contains("25 found"), "{text}");
    assert!(text.contains("Estimating cost: ~$"), "{text}");
    assert!(
        text.contains("First rendered prompt (item chart-000001)"),
        "{text}"
    );
    assert!(text.contains("Candidate release groups:"), "{text}");
    assert_eq!(
        count(&ws.conn(), "SELECT COUNT(*) FROM llm_batch_session", []),
        0
    );
}

/// Above `EXACT_COUNT_MAX` items the estimate tokenizes every k-th prompt,
/// says so, and lands close to the count of every prompt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_estimate_counts_a_sample_and_says_so() {
    let max = docket::engine::EXACT_COUNT_MAX as usize;
    let avg_tokens = |text: &str| -> u64 {
        let line = text
            .lines()
            .find(|l| l.starts_with("Estimating cost:"))
            .unwrap_or_else(|| panic!("{text}"));
        let after = line.split(" items × ~").nth(1).expect("per-item tokens");
        after.split(' ').next().unwrap().parse().expect("a number")
    };
    let dry = |n: usize| async move {
        let (_m, ws) = mocked(MockConfig::default(), n, |_| {}).await;
        let mut o = options(&ws);
        o.dry_run = true;
        let (report, lines) = run(o).await;
        assert_eq!(report.end, RunEnd::DryRun);
        lines.text()
    };
    let exact = dry(max).await;
    assert!(!exact.contains("sample"), "{exact}");
    let sampled = dry(max * 2 + 1).await;
    assert!(
        sampled.contains(&format!(
            "tokens counted on a sample of {} prompts",
            max + 1
        )),
        "{sampled}"
    );
    let (a, b) = (avg_tokens(&exact) as f64, avg_tokens(&sampled) as f64);
    assert!((a - b).abs() / a < 0.02, "exact {a} vs sampled {b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_storm_completes_with_aimd_backing_off() {
    // The server allows 10 requests/s; the client has no limit of its own and
    // 32 slots, so it is refused until it learns to back off.
    let (m, ws) = mocked(
        MockConfig {
            rpm_limit: 600,
            latency_median_ms: 20.0,
            latency_p99_ms: 60.0,
            ..Default::default()
        },
        60,
        |job| {
            job.concurrency = 32;
        },
    )
    .await;
    let (report, lines) = run(options(&ws)).await;
    assert_eq!(report.end, RunEnd::Completed, "{}", lines.text());
    let s = report.session.unwrap();
    check_complete(&ws.conn(), &s.session_id);
    assert_eq!(s.error_count, 0, "no item failed");
    let st = m.stats();
    assert!(st.rate_limited > 0, "the storm happened: {st:?}");
    assert_eq!(
        s.rate_limited_count, st.rate_limited,
        "every 429 is counted"
    );
    assert_eq!(st.ok, 60);
    // AIMD: the progress lines show the concurrency limit cut below its max.
    let text = lines.text();
    let limits: Vec<usize> = text
        .split("(limit ")
        .skip(1)
        .filter_map(|rest| rest.split(')').next()?.parse().ok())
        .collect();
    assert!(
        limits.iter().any(|l| *l < 32),
        "no cut seen in {limits:?}\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthorized_stops_at_once_with_a_clear_message() {
    let (m, ws) = mocked(mode("unauthorized"), 200, |job| {
        job.concurrency = 4;
    })
    .await;
    let (report, lines) = run(options(&ws)).await;
    let RunEnd::Stopped(msg) = &report.end else {
        panic!("{:?}\n{}", report.end, lines.text())
    };
    assert!(msg.contains("credentials"), "{msg}");
    assert_eq!(report.end.exit_code(), 3);
    assert!(
        m.stats().requests <= 8,
        "stopped at once, not after 200 tries: {:?}",
        m.stats()
    );
    let s = report.session.unwrap();
    assert_eq!(s.state, "error");
    assert_eq!(
        s.processed_count, 0,
        "no item is marked as failed: all stay pending"
    );
    assert!(lines.text().contains(&format!(
        "docket batch-adjudicate --resume {}",
        s.session_id
    )));
    // Resumable: with the provider fixed, resume finishes it.
    m.set_config(MockConfig::default());
    let mut o = options(&ws);
    o.resume = Some(s.session_id.clone());
    let (report, lines) = run(o).await;
    assert_eq!(report.end, RunEnd::Completed, "{}", lines.text());
    check_complete(&ws.conn(), &s.session_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_exhausted_stops_and_is_not_a_rate_limit() {
    let (m, ws) = mocked(mode("quota"), 50, |job| {
        job.concurrency = 2;
    })
    .await;
    let (report, _) = run(options(&ws)).await;
    let RunEnd::Stopped(msg) = &report.end else {
        panic!("{:?}", report.end)
    };
    assert!(msg.contains("quota"), "{msg}");
    assert!(m.stats().requests <= 4);
    assert_eq!(report.session.unwrap().rate_limited_count, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_answers_are_retried_then_recorded_as_truncation() {
    let (m, ws) = mocked(
        MockConfig {
            truncated: 1.0,
            ..Default::default()
        },
        5,
        |job| {
            job.max_attempts = 2;
        },
    )
    .await;
    let (report, _) = run(options(&ws)).await;
    let s = report.session.unwrap();
    let conn = ws.conn();
    check_complete(&conn, &s.session_id);
    assert_eq!(s.error_count, 5);
    assert_eq!(m.stats().requests, 10, "two attempts each");
    let err: String = conn
        .query_row(
            "SELECT error_message FROM llm_batch_result LIMIT 1",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(err.starts_with("output_truncated"), "{err}");
    assert!(!err.contains("parse error"), "{err}");
    // Row S8: never the same request again: the second send of each item
    // had twice the max_tokens of the first.
    let per_attempt: Vec<(i64, String)> = conn
        .prepare("SELECT attempt, error_message FROM llm_messages WHERE request_id = (SELECT MIN(request_id) FROM llm_messages) ORDER BY attempt")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let max_tokens = |m: &str| -> u64 {
        m.split("max_tokens (")
            .nth(1)
            .and_then(|r| r.split(')').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no max_tokens in {m}"))
    };
    assert_eq!(per_attempt.len(), 2, "{per_attempt:?}");
    assert_eq!(
        max_tokens(&per_attempt[1].1),
        2 * max_tokens(&per_attempt[0].1),
        "{per_attempt:?}"
    );
    // Raw output is always kept.
    assert_eq!(
        10,
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_messages WHERE finish_reason = 'length' AND assistant_output IS NOT NULL AND error_kind = 'output_truncated'",
            []
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_wrong_schema_answers_are_retried_then_recorded() {
    // Half the bodies are garbage: retried as transport errors; all complete.
    let (m, ws) = mocked(
        MockConfig {
            malformed: 0.5,
            seed: 3,
            ..Default::default()
        },
        40,
        |_| {},
    )
    .await;
    let (report, _) = run(options(&ws)).await;
    let s = report.session.unwrap();
    check_complete(&ws.conn(), &s.session_id);
    let malformed = m.stats().malformed;
    assert!(malformed > 0);
    // Each garbage body is retried, except the last of an item that used up
    // all five transport attempts (then the item is an error that says so).
    assert_eq!(s.retry_count, malformed - s.error_count);
    assert_eq!(m.stats().ok, 40 - s.error_count);
    if s.error_count > 0 {
        let err: String = ws
            .conn()
            .query_row(
                "SELECT error_message FROM llm_batch_result WHERE outcome = 'error'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        // Five alike in a row is what row S4 calls deterministic.
        assert!(
            err.contains("gave up after 5")
                || err.starts_with(
                    "failed_deterministic: the same request failed the same way 5 times in a row"
                ),
            "{err}"
        );
    }
    // Row S7: a 200 that is not an answer was most likely billed: every one
    // is on record as an ambiguous attempt, none as a success.
    assert_eq!(s.ambiguous_count, malformed);
    assert_eq!(
        count(
            &ws.conn(),
            "SELECT COUNT(*) FROM llm_messages WHERE state = 'ambiguous' AND http_status = 200",
            []
        ),
        malformed as i64
    );
}

/// Row S7, transport: the connection is reset halfway through a 200's
/// body (its Content-Length promised all of it). Nothing of the half body
/// is stored as a success; each such attempt is ambiguous (the answer was
/// generated and billed), sent again, and every item gets its one result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s7_a_body_cut_by_a_reset_is_ambiguous_and_sent_again() {
    let (m, ws) = mocked(
        MockConfig {
            reset_mid_body: 0.3,
            seed: 5,
            ..Default::default()
        },
        40,
        |_| {},
    )
    .await;
    let (report, _) = run(options(&ws)).await;
    let s = report.session.unwrap();
    check_complete(&ws.conn(), &s.session_id);
    let resets = m.stats().resets;
    assert!(resets > 0);
    assert_eq!(s.ambiguous_count, resets);
    let conn = ws.conn();
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_messages WHERE state = 'ambiguous' AND assistant_output IS NULL",
            []
        ),
        resets as i64
    );
    // Every answered attempt holds a whole answer, and only whole answers
    // became results.
    let answered: Vec<String> = conn
        .prepare("SELECT assistant_output FROM llm_messages WHERE state = 'answered'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(answered.len() as u64, 40 - s.error_count);
    for a in &answered {
        serde_json::from_str::<serde_json::Value>(a).unwrap_or_else(|e| panic!("{e}: {a}"));
    }
}

/// A gate that can never pass (every answer misses a required field, as
/// when a custom prompt does not ask for what the default schema needs):
/// the session pauses once the stage's first twelve answers, from four
/// items or more, all failed, naming the fields and the schema, instead
/// of every item paying for its three attempts and the session ending
/// "completed" with 100% errors. Fixed (here: the mock answers right
/// again), the resume finishes the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_that_never_passes_pauses_the_session_early() {
    const ITEMS: usize = 20;
    let (m, ws) = mocked(
        MockConfig {
            wrong_schema: 1.0,
            ..Default::default()
        },
        ITEMS,
        |job| {
            job.concurrency = 4;
            // Room for the watch's twelve failures from four items before
            // any item could spend its attempts, however the sends are
            // ordered on a loaded machine.
            job.max_attempts = 10;
        },
    )
    .await;
    let (report, _) = run(options(&ws)).await;
    let RunEnd::Paused(why) = &report.end else {
        let conn = ws.conn();
        let mut stmt = conn
            .prepare("SELECT DISTINCT error_message FROM llm_messages WHERE error_kind = 'gate'")
            .unwrap();
        let seen: Vec<String> = stmt
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        panic!("not paused: {:?}; gate failures: {seen:#?}", report.end);
    };
    assert!(
        why.contains("stage adjudicate")
            && why.contains("all failed the gate")
            && why.contains("required property")
            && why.contains("adjudicate.schema.json"),
        "{why}"
    );
    let s = report.session.unwrap();
    assert_eq!(s.state, "paused");
    assert_eq!(s.error_count, 0, "no item was failed for it");
    let sent = m.stats().requests;
    assert!(
        sent < (ITEMS * 3) as u64 / 3,
        "{sent} requests: the pause came before every item paid"
    );
    let conn = ws.conn();
    support::check_invariants(&conn, &s.session_id);
    assert!(
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_messages WHERE error_kind = 'gate' AND assistant_output IS NOT NULL",
            []
        ) >= 12,
        "every failed answer is kept"
    );

    let mut fixed = m.config();
    fixed.wrong_schema = 0.0;
    m.set_config(fixed);
    let mut opts = options(&ws);
    opts.resume = Some(s.session_id.clone());
    let (report, _) = run(opts).await;
    assert!(matches!(report.end, RunEnd::Completed), "{:?}", report.end);
    check_complete(&conn, &s.session_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hangs_are_cut_by_the_timeout_and_counted_ambiguous() {
    let (m, ws) = mocked(
        MockConfig {
            hang: 0.3,
            seed: 11,
            ..Default::default()
        },
        20,
        |job| {
            job.timeout_secs = 0.3;
        },
    )
    .await;
    let (report, _) = run(options(&ws)).await;
    let s = report.session.unwrap();
    check_complete(&ws.conn(), &s.session_id);
    let hangs = m.stats().hangs;
    assert!(hangs > 0);
    assert_eq!(
        s.ambiguous_count, hangs,
        "each timed-out send may have been billed"
    );
    assert_eq!(s.error_count, 0);
}

/// Issue 12: with the default 120 s timeout, a request the provider never
/// answers is cut at the deadline learned from the answers coming back
/// (here: 2 s, the floor, for 20 ms answers), counted ambiguous and sent
/// again at once. The speed figure is `cargo bench --bench engine -- hangs`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hangs_are_cut_at_the_learned_deadline_not_the_timeout() {
    let (m, ws) = mocked(
        MockConfig {
            hang: 0.02,
            latency_median_ms: 20.0,
            latency_p99_ms: 60.0,
            seed: 5,
            ..Default::default()
        },
        300,
        |job| {
            job.timeout_secs = 120.0;
            job.concurrency = 16;
        },
    )
    .await;
    let (report, lines) = run(options(&ws)).await;
    assert_eq!(report.end, RunEnd::Completed, "{}", lines.text());
    let s = report.session.unwrap();
    check_complete(&ws.conn(), &s.session_id);
    assert_eq!(s.error_count, 0);
    let hangs = m.stats().hangs;
    assert!(hangs > 0, "the seed makes some requests hang");
    assert_eq!(s.ambiguous_count, hangs, "every cut send is on record");
    let conn = ws.conn();
    let mut q = conn
        .prepare("SELECT error_message, latency_ms FROM llm_messages WHERE state = 'ambiguous'")
        .unwrap();
    let cut: Vec<(String, f64)> = q
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(cut.len() as u64, hangs);
    for (message, latency_ms) in &cut {
        assert!(
            message.contains("the deadline learned from the provider's latency"),
            "{message}"
        );
        // Cut at the learned deadline, far from the 120 s timeout (a loaded
        // machine may wake the timer late, never by a minute).
        assert!(
            (1_900.0..60_000.0).contains(latency_ms),
            "{latency_ms} ms: {message}"
        );
    }
    // Every item has its answer: the resend of each cut one was answered.
    assert_eq!(m.stats().ok, 300);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_cost_pauses_before_the_budget_and_resume_finishes() {
    let (m, ws) = mocked(MockConfig::default(), 30, |job| {
        job.concurrency = 1;
    })
    .await;
    let mut o = options(&ws);
    // gpt-4o-mini: a ~300-token prompt and 200 max output tokens cost at most
    // about $0.00017 a request, so $0.001 covers a handful only.
    o.max_cost = Some(0.001);
    let (report, lines) = run(o).await;
    let RunEnd::Paused(why) = &report.end else {
        panic!("{:?}\n{}", report.end, lines.text())
    };
    assert!(why.contains("budget"), "{why}");
    let s = report.session.unwrap();
    assert!(
        s.cost_usd <= 0.001,
        "spend {} passed the budget",
        s.cost_usd
    );
    assert!(s.processed_count > 0 && s.processed_count < 30);
    assert_eq!(s.state, "paused");
    check_invariants(&ws.conn(), &s.session_id);
    let mut o = options(&ws);
    o.resume = Some(s.session_id.clone());
    o.max_cost = Some(10.0);
    let (report, _) = run(o).await;
    assert_eq!(report.end, RunEnd::Completed);
    check_complete(&ws.conn(), &s.session_id);
    assert_eq!(m.stats().ok, 30, "nothing paid twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_older_than_seven_days_cannot_be_resumed() {
    let (_m, ws) = mocked(mode("unauthorized"), 3, |_| {}).await;
    let (report, _) = run(options(&ws)).await;
    let sid = report.session_id.unwrap();
    ws.conn()
        .execute("UPDATE llm_batch_session SET started_at = started_at - 8 * 86400 WHERE session_id = ?1", [&sid])
        .unwrap();
    let mut o = options(&ws);
    o.resume = Some(sid);
    let err = docket::engine::run(
        o,
        std::sync::Arc::new(Lines::default()),
        |_| true,
        Default::default(),
    )
    .await
    .expect_err("refused")
    .to_string();
    assert!(
        err.contains("7 days") && err.contains("new session"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_pause_then_resume_is_obeyed_by_the_running_engine() {
    let (m, ws) = mocked(latency(50.0, 80.0), 60, |job| {
        job.concurrency = 2;
    })
    .await;
    let path = ws.path().to_path_buf();
    let handle = tokio::spawn(run(options(&ws)));
    // Wait for the session to exist and make progress, then pause it from
    // "another process": a plain connection writing desired_state.
    let ledger = path.join("docket.sqlite");
    let sid = loop {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let conn = docket::ledger::open(&ledger).unwrap();
        if let Ok(Some(id)) = docket::ledger::store::latest_session(&support::db(&conn))
            && count(&conn, "SELECT processed_count FROM llm_batch_session", []) >= 5
        {
            docket::ledger::store::set_desired_state(&support::db(&conn), &id, "paused").unwrap();
            break id;
        }
    };
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let sent_paused = m.stats().requests;
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert_eq!(
        m.stats().requests,
        sent_paused,
        "no request sent while paused"
    );
    let conn = docket::ledger::open(&ledger).unwrap();
    let state: String = conn
        .query_row("SELECT state FROM llm_batch_session", [], |r| r.get(0))
        .unwrap();
    assert_eq!(state, "paused");
    docket::ledger::store::set_desired_state(&support::db(&conn), &sid, "running").unwrap();
    let (report, _) = handle.await.unwrap();
    assert_eq!(report.end, RunEnd::Completed);
    check_complete(&ws.conn(), &sid);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_refuses_a_changed_job() {
    let (m, ws) = mocked(mode("unauthorized"), 3, |_| {}).await;
    let (report, _) = run(options(&ws)).await;
    let sid = report.session_id.unwrap();
    let tpl = ws.path().join("prompts/adjudicate.j2");
    let original = std::fs::read_to_string(&tpl).unwrap();
    std::fs::write(&tpl, format!("{original}\nBe brief.")).unwrap();
    let mut o = options(&ws);
    o.resume = Some(sid.clone());
    let err = docket::engine::run(
        o.clone(),
        std::sync::Arc::new(Lines::default()),
        |_| true,
        Default::default(),
    )
    .await
    .expect_err("refused");
    assert!(err.to_string().contains("the prompt template"), "{err}");
    // Restored, it resumes (and the fixed provider finishes it).
    std::fs::write(&tpl, original).unwrap();
    m.set_config(MockConfig::default());
    let (report, _) = run(o).await;
    assert_eq!(report.end, RunEnd::Completed);
    check_complete(&ws.conn(), &sid);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_routes_with_the_thresholds_the_session_started_with() {
    let (m, ws) = mocked(mode("unauthorized"), 30, |_| {}).await;
    let mut o = options(&ws);
    o.auto_accept_threshold = Some(1.0);
    let (report, _) = run(o).await;
    let sid = report.session_id.unwrap();
    m.set_config(MockConfig::default());
    // Resumed without the flag: the session's 1.0 still applies.
    let mut o = options(&ws);
    o.resume = Some(sid.clone());
    let (report, _) = run(o).await;
    let s = report.session.unwrap();
    check_complete(&ws.conn(), &sid);
    assert_eq!(s.accepted_count, 0, "nothing reaches confidence 1.0: {s:?}");
    assert!(s.reviewed_count > 0);
}

/// A resume that passes a flag with another value runs the session with
/// it and records it with the session (its snapshot's flags, which the
/// console, the report and `docket sessions` read), with a `config` event
/// naming each change; a resume passing nothing new records nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_with_other_flags_records_them_with_the_session() {
    let (m, ws) = mocked(mode("unauthorized"), 30, |_| {}).await;
    let mut o = options(&ws);
    o.auto_accept_threshold = Some(1.0);
    let (report, _) = run(o).await;
    let sid = report.session_id.unwrap();
    let flag = |name: &str| -> String {
        ws.conn()
            .query_row(
                &format!(
                    "SELECT json_extract(config_snapshot_json, '$.flags.{name}') FROM llm_batch_session WHERE session_id = ?1"
                ),
                [&sid],
                |r| r.get::<_, rusqlite::types::Value>(0),
            )
            .map(|v| format!("{v:?}"))
            .unwrap()
    };
    let changes_recorded = || {
        count(
            &ws.conn(),
            "SELECT COUNT(*) FROM session_event WHERE session_id = ?1 AND kind = 'config'
               AND message LIKE 'resumed with other flags: %'",
            [&sid],
        )
    };
    // The same flags (the session's own, kept): nothing to record.
    let mut o = options(&ws);
    o.resume = Some(sid.clone());
    let (_, lines) = run(o).await;
    assert!(!lines.text().contains("other flags"), "{}", lines.text());
    assert_eq!(changes_recorded(), 0);
    assert_eq!(flag("completion_mode"), "Text(\"exact\")");
    // Other ones: run with and recorded.
    m.set_config(MockConfig::default());
    let mut o = options(&ws);
    o.resume = Some(sid.clone());
    o.auto_accept_threshold = Some(0.7);
    o.completion_mode = Some(docket::config::CompletionMode::BestEffort);
    let (report, lines) = run(o).await;
    let said = lines.text();
    assert!(
        said.contains(&format!(
            "Session {sid} runs from now on with other flags than it recorded: \
             auto_accept_threshold 1.0 -> 0.7, completion_mode exact -> best_effort"
        )),
        "{said}"
    );
    assert_eq!(flag("auto_accept_threshold"), "Real(0.7)");
    assert_eq!(flag("completion_mode"), "Text(\"best_effort\")");
    assert_eq!(changes_recorded(), 1);
    // The new threshold routed the rest: accepted at 0.7.
    check_complete(&ws.conn(), &sid);
    assert!(report.session.unwrap().accepted_count > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_template_is_not_reused_or_sent_again_unless_asked() {
    let (m, ws) = mocked(MockConfig::default(), 30, |_| {}).await;
    let (first, _) = run(options(&ws)).await;
    let s1 = first.session.unwrap();
    let left = s1.reviewed_count + s1.rejected_count;
    assert!(left > 0);
    // Every undecided item, those awaiting review included (by default a
    // new session leaves them out).
    let every_undecided = || docket::engine::RunOptions {
        rereview_pending: true,
        ..options(&ws)
    };
    // Same job: the second session reuses every answer, sends nothing.
    let (second, _) = run(every_undecided()).await;
    assert_eq!(second.session.unwrap().total_count, left);
    assert_eq!(m.stats().ok, 30);
    // A new prompt: the answers made with the old one are neither reused
    // nor asked again silently; the operator chooses.
    let tpl = ws.path().join("prompts/adjudicate.j2");
    let text = std::fs::read_to_string(&tpl).unwrap();
    std::fs::write(&tpl, format!("{text}\nThink twice.")).unwrap();
    let refused = docket::engine::run(
        every_undecided(),
        std::sync::Arc::new(docket::engine::StdoutReporter),
        |_| true,
        Default::default(),
    )
    .await;
    let e = refused.expect_err("refused").to_string();
    assert!(
        e.contains("another prompt template") && e.contains("--rerun-stage adjudicate"),
        "{e}"
    );
    assert_eq!(m.stats().ok, 30, "nothing was sent");
    // Asked again on purpose: a new request_version for the remaining items.
    let mut opts = every_undecided();
    opts.rerun_stage = Some("adjudicate".into());
    let (third, _) = run(opts).await;
    let s3 = third.session.unwrap();
    check_complete(&ws.conn(), &s3.session_id);
    assert_eq!(m.stats().ok, 30 + s3.total_count);
    let hash: String = ws
        .conn()
        .query_row("SELECT template_hash FROM llm_requests r JOIN session_item si ON si.request_id = r.request_id WHERE si.session_id = ?1 LIMIT 1", [&s3.session_id], |r| r.get(0))
        .unwrap();
    let snap_hash: String = ws
        .conn()
        .query_row("SELECT json_extract(config_snapshot_json, '$.template_hash') FROM llm_batch_session WHERE session_id = ?1", [&s3.session_id], |r| r.get(0))
        .unwrap();
    assert_eq!(
        hash, snap_hash,
        "requests record the template they were sent with"
    );
    // The old answers stay in the ledger as version 1; the new ones are 2.
    let versions: Vec<i64> = ws
        .conn()
        .prepare("SELECT DISTINCT r.request_version FROM llm_requests r JOIN session_item si ON si.request_id = r.request_id WHERE si.session_id = ?1")
        .unwrap()
        .query_map([&s3.session_id], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(versions, vec![2]);
    assert_eq!(
        30,
        count(
            &ws.conn(),
            "SELECT COUNT(*) FROM llm_requests WHERE request_version = 1 AND status = 'completed'",
            []
        ),
        "the first answers are kept"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_writer_during_a_run_never_sees_busy() {
    let (_m, ws) = mocked(latency(5.0, 20.0), 400, |_| {}).await;
    let dir = ws.path().to_path_buf();
    let run_handle = tokio::spawn(run(options(&ws)));
    // (Once the session exists: items imported before planning would be in
    // it, and these have no chart fields for the template.)
    while docket::ledger::store::latest_session(&support::db(&ws.conn()))
        .unwrap()
        .is_none()
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A second connection imports batches and flips desired_state while the
    // engine writes: every write must wait its turn, none may fail.
    let writer = std::thread::spawn(move || {
        let conn = docket::ledger::open(&dir.join("docket.sqlite")).unwrap();
        let mut ledger = docket::ledger::Ledger::open(dir.join("docket.sqlite")).unwrap();
        for i in 0..30 {
            let path = dir.join(format!("items/extra{i}.jsonl"));
            let body: String = (0..20)
                .map(|k| format!("{{\"id\":\"extra-{i}-{k}\",\"x\":{k}}}\n"))
                .collect();
            std::fs::write(&path, body).unwrap();
            let opts = docket::items::ImportOptions {
                id_field: "id".into(),
                format: None,
                strict: true,
                update: false,
            };
            docket::items::import_file(&mut ledger, &path, &opts).expect("import during a run");
            if let Ok(Some(id)) = docket::ledger::store::latest_session(&support::db(&conn)) {
                docket::ledger::store::set_desired_state(&support::db(&conn), &id, "running")
                    .expect("control write during a run");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    tokio::task::spawn_blocking(move || writer.join().expect("writer thread"))
        .await
        .unwrap();
    let (report, lines) = run_handle.await.unwrap();
    assert_eq!(report.end, RunEnd::Completed, "{}", lines.text());
    check_complete(&ws.conn(), &report.session_id.unwrap());
    assert_eq!(
        count(
            &ws.conn(),
            "SELECT COUNT(*) FROM decision WHERE item_id LIKE 'extra-%'",
            []
        ),
        600
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_regex_gate_reads_verdict_and_confidence_from_text_answers() {
    let (m, ws) = mocked(MockConfig::default(), 40, |job| {
        job.template =
            Some("Is {{ item.title }} by {{ item.artist }} a match?\nLabels: match, no_match\n");
    })
    .await;
    let toml_path = ws.path().join("docket.toml");
    let toml = std::fs::read_to_string(&toml_path).unwrap().replace(
        "kind = \"json_schema\"\nschema = \"schemas/adjudicate.schema.json\"",
        "kind = \"regex\"\npattern = '(?s)(?P<rationale>.*)VERDICT:\\s*(?P<verdict>\\w+)\\s+CONFIDENCE:\\s*(?P<confidence>[0-9.]+)'",
    );
    assert!(toml.contains("kind = \"regex\""));
    std::fs::write(&toml_path, toml).unwrap();
    let (report, lines) = run(options(&ws)).await;
    assert_eq!(report.end, RunEnd::Completed, "{}", lines.text());
    let s = report.session.unwrap();
    check_complete(&ws.conn(), &s.session_id);
    assert_eq!(s.error_count, 0);
    assert_eq!(m.stats().ok, 40);
    // The named captures are the answer; the verdict is one of the labels.
    let verdicts: Vec<String> = ws
        .conn()
        .prepare("SELECT json_extract(answer_json, '$.verdict') FROM llm_batch_result")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(verdicts.len(), 40);
    assert!(
        verdicts.iter().all(|v| v == "match" || v == "no_match"),
        "{verdicts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_still_in_flight_after_the_grace_are_ambiguous_and_sent_again() {
    let (m, ws) = mocked(latency(3_000.0, 3_000.0), 6, |job| {
        job.concurrency = 6;
    })
    .await;
    let interrupts = docket::engine::Interrupts::default();
    let stop = interrupts.stop.clone();
    let mut o = options(&ws);
    o.grace = Some(Duration::from_millis(200));
    let lines = std::sync::Arc::new(Lines::default());
    let handle = tokio::spawn(docket::engine::run(o, lines.clone(), |_| true, interrupts));
    // Every request is out (3 s latency), then Ctrl-C.
    while m.stats().requests < 6 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    let report = handle.await.unwrap().unwrap();
    assert_eq!(report.end, RunEnd::Cancelled, "{}", lines.text());
    let s = report.session.unwrap();
    assert_eq!(
        s.ambiguous_count, 6,
        "abandoned after the grace: may have been billed"
    );
    assert_eq!(s.processed_count, 0);
    let conn = ws.conn();
    assert_eq!(
        6,
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_messages WHERE state = 'ambiguous'",
            []
        )
    );
    check_invariants(&conn, &s.session_id);
    // Resume sends them again (attempt 2), and finishes.
    m.set_config(MockConfig::default());
    let mut o = options(&ws);
    o.resume = Some(s.session_id.clone());
    let (report, _) = run(o).await;
    assert_eq!(report.end, RunEnd::Completed);
    check_complete(&ws.conn(), &s.session_id);
    assert_eq!(
        6,
        count(
            &ws.conn(),
            "SELECT COUNT(*) FROM llm_messages WHERE attempt = 2 AND state = 'answered'",
            []
        )
    );
    assert_eq!(
        report.session.unwrap().ambiguous_count,
        6,
        "counted once, not again on resume"
    );
}

fn heartbeat_age(conn: &rusqlite::Connection, sid: &str) -> Option<f64> {
    let hb: Option<f64> = conn
        .query_row(
            "SELECT heartbeat_at FROM llm_batch_session WHERE session_id = ?1",
            [sid],
            |r| r.get(0),
        )
        .unwrap();
    hb.map(|h| docket::ledger::now_ts() - h)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_gauges_are_written_with_each_heartbeat() {
    let (_m, ws) = mocked(latency(100.0, 150.0), 120, |job| {
        job.concurrency = 3;
        job.rpm = 6_000;
    })
    .await;
    let handle = tokio::spawn(run(options(&ws)));
    let sid = session_created(&ws).await;
    let conn = ws.conn();
    // Gauges of a run that is sending: limits from the config, a rate.
    let g = poll("gauges with a rate", Duration::from_secs(10), || {
        live_gauges(&conn, &sid).filter(|g| g.rpm_used > 0.0 && g.in_flight > 0)
    })
    .await;
    assert_eq!(g.max_concurrency, 3, "{g:?}");
    assert!(
        g.concurrency_limit >= 1 && g.concurrency_limit <= 3,
        "{g:?}"
    );
    assert_eq!(g.rpm_limit, 6_000, "{g:?}");
    assert_eq!(g.tpm_limit, 0, "{g:?}");
    assert_eq!(g.stage, "adjudicate");
    assert!(!g.paused);
    assert!(g.in_flight <= 3, "{g:?}");
    assert!(g.elapsed_secs > 0.0, "{g:?}");
    let age = heartbeat_age(&conn, &sid).expect("a heartbeat");
    assert!(age < 1.5, "heartbeat {age} s old");
    // The gauges move: a later heartbeat has a later elapsed time and an ETA.
    let later = poll("later gauges with an ETA", Duration::from_secs(10), || {
        live_gauges(&conn, &sid).filter(|l| l.elapsed_secs > g.elapsed_secs && l.eta_secs.is_some())
    })
    .await;
    assert!(later.eta_secs.unwrap() >= 0.0);
    // A stop after the (only) stage is acknowledged, nothing else changes.
    conn.execute(
        "UPDATE llm_batch_session SET stop_after_stage = 'adjudicate' WHERE session_id = ?1",
        [&sid],
    )
    .unwrap();
    let ev = poll("the stop_at_stage event", Duration::from_secs(2), || {
        events_of(&conn, &sid, "stop_at_stage").into_iter().next()
    })
    .await;
    assert!(
        ev.message.contains("adjudicate is the last stage"),
        "{ev:?}"
    );
    assert_eq!(ev.actor, None);
    let (report, lines) = handle.await.unwrap();
    assert_eq!(report.end, RunEnd::Completed, "{}", lines.text());
    check_complete(&conn, &sid);
    assert_eq!(
        events_of(&conn, &sid, "stop_at_stage").len(),
        1,
        "reported once"
    );
    // Released: no heartbeat; the last gauges stay for the console.
    assert_eq!(heartbeat_age(&conn, &sid), None);
    assert!(live_gauges(&conn, &sid).is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retune_in_the_ledger_is_followed_within_a_second() {
    let (_m, ws) = mocked(latency(100.0, 150.0), 400, |job| {
        job.concurrency = 4;
        job.rpm = 6_000;
    })
    .await;
    let lines = std::sync::Arc::new(Lines::default());
    let handle = tokio::spawn(docket::engine::run(
        options(&ws),
        lines.clone(),
        |_| true,
        Default::default(),
    ));
    let sid = session_created(&ws).await;
    let conn = ws.conn();
    poll("the first gauges", Duration::from_secs(10), || {
        live_gauges(&conn, &sid).filter(|g| g.in_flight > 0)
    })
    .await;
    // Lower: concurrency 2, 3,000 requests/min.
    conn.execute(
        "UPDATE llm_batch_session SET tune_concurrency = 2, tune_rpm = 3000 WHERE session_id = ?1",
        [&sid],
    )
    .unwrap();
    let g = poll(
        "the lowered limits in the gauges",
        Duration::from_millis(1_500),
        || live_gauges(&conn, &sid).filter(|g| g.max_concurrency == 2 && g.rpm_limit == 3_000),
    )
    .await;
    assert!(g.concurrency_limit <= 2, "{g:?}");
    let ev = events_of(&conn, &sid, "retuned");
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(ev[0].level, "info");
    assert!(
        ev[0].message.contains("concurrency 4 -> 2")
            && ev[0].message.contains("requests/min 6000 -> 3000"),
        "{ev:?}"
    );
    // In flight drops to the new limit once the earlier sends are answered.
    poll(
        "in flight within the lowered limit",
        Duration::from_secs(3),
        || live_gauges(&conn, &sid).filter(|g| g.in_flight <= 2),
    )
    .await;
    // Raise: concurrency 8; the limit climbs past the lowered one.
    conn.execute(
        "UPDATE llm_batch_session SET tune_concurrency = 8 WHERE session_id = ?1",
        [&sid],
    )
    .unwrap();
    poll(
        "the raised limit in the gauges",
        Duration::from_millis(1_500),
        || live_gauges(&conn, &sid).filter(|g| g.max_concurrency == 8 && g.rpm_limit == 3_000),
    )
    .await;
    let g = poll(
        "concurrency to climb above 2",
        Duration::from_secs(5),
        || live_gauges(&conn, &sid).filter(|g| g.concurrency_limit > 2 && g.in_flight > 2),
    )
    .await;
    assert!(g.concurrency_limit <= 8, "{g:?}");
    assert_eq!(events_of(&conn, &sid, "retuned").len(), 2);
    let report = handle.await.unwrap().unwrap();
    assert_eq!(report.end, RunEnd::Completed, "{}", lines.text());
    check_complete(&conn, &sid);
    assert!(
        lines
            .text()
            .contains("Retuned from the ledger: concurrency 2 -> 8"),
        "{}",
        lines.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_pause_stops_sending_and_records_events() {
    let (_m, ws) = mocked(latency(50.0, 80.0), 200, |job| {
        job.concurrency = 2;
    })
    .await;
    let handle = tokio::spawn(run(options(&ws)));
    let sid = session_created(&ws).await;
    let conn = ws.conn();
    poll("some progress", Duration::from_secs(10), || {
        let n = count(
            &conn,
            "SELECT processed_count FROM llm_batch_session WHERE session_id = ?1",
            [&sid],
        );
        (n >= 5).then_some(())
    })
    .await;
    docket::ledger::store::set_desired_state(&support::db(&conn), &sid, "paused").unwrap();
    let ev = poll("the paused event", Duration::from_millis(1_500), || {
        events_of(&conn, &sid, "paused").into_iter().next()
    })
    .await;
    assert_eq!(ev.level, "warn");
    // The pause took effect once nothing is in flight any more.
    poll("in-flight sends to finish", Duration::from_secs(5), || {
        let open = count(
            &conn,
            "SELECT COUNT(*) FROM llm_messages WHERE session_id = ?1 AND state = 'sent'",
            [&sid],
        );
        let g = live_gauges(&conn, &sid)?;
        (open == 0 && g.paused && g.slow_reason == "paused by operator").then_some(())
    })
    .await;
    let attempts = |c: &rusqlite::Connection| {
        count(
            c,
            "SELECT COUNT(*) FROM llm_messages WHERE session_id = ?1",
            [&sid],
        )
    };
    let before = attempts(&conn);
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(attempts(&conn), before, "no attempt while paused");
    assert!(before < 200, "paused before the end: {before}");
    let (state, reason): (String, Option<String>) = conn
        .query_row(
            "SELECT state, stop_reason FROM llm_batch_session WHERE session_id = ?1",
            [&sid],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(state, "paused");
    assert_eq!(reason.as_deref(), Some("paused by operator"));
    // Still live while paused: the heartbeat goes on.
    assert!(heartbeat_age(&conn, &sid).unwrap() < 1.5);
    docket::ledger::store::set_desired_state(&support::db(&conn), &sid, "running").unwrap();
    poll("the resumed event", Duration::from_millis(1_500), || {
        events_of(&conn, &sid, "resumed").into_iter().next()
    })
    .await;
    let (report, lines) = handle.await.unwrap();
    assert_eq!(report.end, RunEnd::Completed, "{}", lines.text());
    check_complete(&conn, &sid);
    let kinds: Vec<String> = events(&conn, &sid).into_iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        ["started", "paused", "resumed", "ended"],
        "{kinds:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_pause_ends_paused_and_resume_finishes_every_item_once() {
    let (m, ws) = mocked(latency(200.0, 300.0), 40, |job| {
        job.concurrency = 4;
    })
    .await;
    let interrupts = docket::engine::Interrupts::default();
    let pause = interrupts.pause.clone();
    let lines = std::sync::Arc::new(Lines::default());
    let handle = tokio::spawn(docket::engine::run(
        options(&ws),
        lines.clone(),
        |_| true,
        interrupts,
    ));
    let sid = session_created(&ws).await;
    let conn = ws.conn();
    poll("some answers", Duration::from_secs(10), || {
        let n = count(
            &conn,
            "SELECT processed_count FROM llm_batch_session WHERE session_id = ?1",
            [&sid],
        );
        (n >= 4).then_some(())
    })
    .await;
    pause.cancel();
    let report = handle.await.unwrap().unwrap();
    assert_eq!(
        report.end,
        RunEnd::Paused("paused by operator".into()),
        "{}",
        lines.text()
    );
    assert_eq!(report.end.exit_code(), 4);
    let s = report.session.unwrap();
    assert_eq!(s.state, "paused");
    assert_eq!(s.stop_reason.as_deref(), Some("paused by operator"));
    assert!(s.processed_count < 40, "{s:?}");
    assert_eq!(
        s.ambiguous_count, 0,
        "in-flight sends finished within the grace"
    );
    check_invariants(&conn, &sid);
    assert_eq!(heartbeat_age(&conn, &sid), None, "released");
    let ended = events_of(&conn, &sid, "ended");
    assert_eq!(ended.len(), 1);
    assert_eq!(ended[0].level, "warn");
    assert!(ended[0].message.contains("paused by operator"), "{ended:?}");
    assert_eq!(events_of(&conn, &sid, "paused").len(), 1);
    // Resumed to the end: every item exactly once, nothing paid twice.
    m.set_config(MockConfig::default());
    let rec = std::sync::Arc::new(Recorder::default());
    let mut o = options(&ws);
    o.resume = Some(sid.clone());
    let report = docket::engine::run(o, rec.clone(), |_| true, Default::default())
        .await
        .unwrap();
    assert_eq!(report.end, RunEnd::Completed, "{}", rec.lines.text());
    check_complete(&conn, &sid);
    assert_eq!(m.stats().ok, 40, "every item answered exactly once");
    assert_eq!(
        0,
        count(
            &conn,
            "SELECT COUNT(*) FROM (SELECT request_id FROM llm_messages WHERE state = 'answered' GROUP BY request_id HAVING COUNT(*) > 1)",
            []
        )
    );
    let told: Vec<String> = rec
        .sessions
        .lock()
        .unwrap()
        .iter()
        .map(|(s, _)| s.clone())
        .collect();
    assert_eq!(told, vec![sid.clone()], "session_started on resume too");
    let started: Vec<String> = events_of(&conn, &sid, "started")
        .into_iter()
        .map(|e| e.message)
        .collect();
    assert_eq!(started.len(), 2, "{started:?}");
    assert!(
        started[0].starts_with("started with gpt-4o-mini"),
        "{started:?}"
    );
    assert!(
        started[1].starts_with("resumed with gpt-4o-mini"),
        "{started:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completed_run_ends_with_an_event_and_tells_the_reporter_its_session() {
    let (_m, ws) = mocked(MockConfig::default(), 20, |_| {}).await;
    let rec = std::sync::Arc::new(Recorder::default());
    let report = docket::engine::run(options(&ws), rec.clone(), |_| true, Default::default())
        .await
        .unwrap();
    assert_eq!(report.end, RunEnd::Completed, "{}", rec.lines.text());
    let sid = report.session_id.unwrap();
    let conn = ws.conn();
    check_complete(&conn, &sid);
    let told = rec.sessions.lock().unwrap().clone();
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!(told[0].0, sid);
    // Told once the session exists, before any progress or summary line.
    let lines = rec.lines.0.lock().unwrap().clone();
    assert!(
        lines[..told[0].1]
            .iter()
            .any(|l| l.contains(&format!("Creating batch session: {sid}")))
    );
    assert!(
        !lines[..told[0].1].iter().any(|l| l.starts_with('[')),
        "{lines:?}"
    );
    let evs = events(&conn, &sid);
    assert_eq!(
        evs.first().map(|e| e.kind.as_str()),
        Some("started"),
        "{evs:?}"
    );
    let last = evs.last().unwrap();
    assert_eq!(last.kind, "ended");
    assert_eq!(last.level, "info");
    assert!(
        last.message.contains("completed") && last.message.contains("20 of 20"),
        "{last:?}"
    );
    assert!(
        evs.iter().all(|e| e.actor.is_none()),
        "the engine's events have no actor"
    );
    assert_eq!(evs.iter().filter(|e| e.kind == "ended").count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limiting_is_recorded_as_events_but_not_one_per_refusal() {
    let (m, ws) = mocked(
        MockConfig {
            rpm_limit: 600,
            latency_median_ms: 20.0,
            latency_p99_ms: 60.0,
            ..Default::default()
        },
        60,
        |job| {
            job.concurrency = 32;
        },
    )
    .await;
    let started = std::time::Instant::now();
    let (report, lines) = run(options(&ws)).await;
    let took = started.elapsed().as_secs_f64();
    assert_eq!(report.end, RunEnd::Completed, "{}", lines.text());
    let sid = report.session_id.unwrap();
    let conn = ws.conn();
    check_complete(&conn, &sid);
    assert!(m.stats().rate_limited > 0);
    let ev = events_of(&conn, &sid, "rate_limited");
    assert!(!ev.is_empty(), "no rate_limited event");
    assert!(ev.iter().all(|e| e.level == "warn"));
    assert!(
        (ev.len() as f64) <= (took / 10.0).ceil() + 1.0,
        "{} events in {took:.1} s",
        ev.len()
    );
    for w in ev.windows(2) {
        assert!(w[1].at - w[0].at >= 9.9, "{ev:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_cancel_is_recorded_and_ends_cancelled() {
    let (_m, ws) = mocked(latency(100.0, 150.0), 100, |job| {
        job.concurrency = 2;
    })
    .await;
    let handle = tokio::spawn(run(options(&ws)));
    let sid = session_created(&ws).await;
    let conn = ws.conn();
    poll("the first gauges", Duration::from_secs(10), || {
        live_gauges(&conn, &sid)
    })
    .await;
    docket::ledger::store::set_desired_state(&support::db(&conn), &sid, "cancelled").unwrap();
    let (report, lines) = handle.await.unwrap();
    assert_eq!(report.end, RunEnd::Cancelled, "{}", lines.text());
    check_invariants(&conn, &sid);
    let ev = events_of(&conn, &sid, "cancelled");
    assert_eq!(ev.len(), 1, "{ev:?}");
    let ended = events_of(&conn, &sid, "ended");
    assert_eq!(ended.len(), 1);
    assert_eq!(ended[0].level, "warn");
    assert!(ended[0].message.contains("ended cancelled"), "{ended:?}");
}

/// Row S5 mid-run: the provider goes away (the mock shuts down: every
/// connect is refused). Once ten sends in a row, for three items or more,
/// reached nothing, the breaker opens: nothing more is sent, the session
/// shows paused with the reason, no item is failed for it, and no send that
/// never left counts as ambiguous or as one of the item's transport
/// attempts. Probes find the provider when it is back (a new mock on the
/// same port) and the run goes on by itself to the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_provider_holds_the_run_and_probes_resume_it() {
    const ITEMS: usize = 120;
    let (m, ws) = mocked(latency(30.0, 60.0), ITEMS, |job| job.concurrency = 4).await;
    let addr = m.addr();
    let run_task = tokio::spawn(run(options(&ws)));
    let conn = ws.conn();
    poll("some results", Duration::from_secs(20), || {
        (count(&conn, "SELECT COUNT(*) FROM llm_batch_result", []) >= 20).then_some(())
    })
    .await;
    m.shutdown().await;
    let why = paused_reason(
        &conn,
        "the session paused as unreachable",
        Duration::from_secs(30),
    )
    .await;
    assert!(
        why.contains("provider main unreachable") && why.contains("did not reach"),
        "{why}"
    );
    // The cause, not only reqwest's "error sending request".
    assert!(why.contains("connection refused"), "{why}");
    assert!(why.contains("goes on by itself"), "{why}");
    // The breaker holds: no more refused sends pile up while it is open.
    let refused = || {
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_messages WHERE state = 'failed' AND http_status IS NULL",
            [],
        )
    };
    let at_open = refused();
    assert!(at_open >= 10, "the refused sends are recorded as failed");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        refused(),
        at_open,
        "nothing is sent while the breaker is open"
    );
    assert!(!run_task.is_finished(), "the run waits for the provider");

    let back = docket::mock::MockServer::start(latency(30.0, 60.0), addr)
        .await
        .expect("the mock again, on the same port");
    let (report, lines) = tokio::time::timeout(Duration::from_secs(90), run_task)
        .await
        .expect("the run went on by itself once the provider was back")
        .unwrap();
    assert!(
        matches!(report.end, RunEnd::Completed),
        "{:?}\n{}",
        report.end,
        lines.text()
    );
    let s = report.session.unwrap();
    assert_eq!(s.error_count, 0, "no item failed for it");
    let ambiguous: Vec<String> = conn
        .prepare("SELECT COALESCE(error_kind, '') || ': ' || COALESCE(error_message, '') FROM llm_messages WHERE state = 'ambiguous'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    // A refused connect sent nothing, so it is never ambiguous. A request
    // written on a kept-alive connection the stopping mock closed at that
    // very moment may have reached it: ambiguous, rightly (seen on a loaded
    // machine), at most one per concurrent send.
    assert_eq!(s.ambiguous_count as usize, ambiguous.len());
    assert!(
        ambiguous.len() <= 4
            && ambiguous
                .iter()
                .all(|e| e.contains("connection closed before message completed")),
        "a refused connect sent nothing: {ambiguous:?}"
    );
    check_complete(&conn, &s.session_id);
    assert!(
        count(
            &conn,
            "SELECT COALESCE(SUM(transport_retries), 0) FROM llm_requests",
            []
        ) <= ambiguous.len() as i64,
        "refused sends spend none of an item's transport attempts"
    );
    assert!(back.stats().ok > 0);
    let events: Vec<String> = conn
        .prepare("SELECT kind || ': ' || message FROM session_event WHERE kind IN ('unreachable', 'reachable') ORDER BY event_id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(
        events[1].starts_with("reachable: provider main answers again"),
        "{events:?}"
    );
}

/// Row S4, persistent: the provider answers every request with a 500 (an
/// outage). Once twenty answers in a row, for three items or more, were
/// server errors, the breaker opens: the session shows paused with the
/// reason, no item is failed for it, and sends stop but for one now and
/// then (half-open). When the provider heals, that probe's answer closes
/// the breaker and the run goes on by itself to the end; the 500s while
/// it was open spent none of the items' transport attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_failing_every_request_holds_the_run_until_it_heals() {
    const ITEMS: usize = 60;
    let (m, ws) = mocked(latency(20.0, 40.0), ITEMS, |job| job.concurrency = 4).await;
    let conn = ws.conn();
    let run_task = tokio::spawn(run(options(&ws)));
    poll("some results", Duration::from_secs(20), || {
        (count(&conn, "SELECT COUNT(*) FROM llm_batch_result", []) >= 10).then_some(())
    })
    .await;
    m.set_config(MockConfig {
        fail_500: 1.0,
        ..latency(20.0, 40.0)
    });
    let why = paused_reason(
        &conn,
        "the session paused as failing",
        Duration::from_secs(60),
    )
    .await;
    assert!(
        why.contains("provider main failing") && why.contains("were server errors"),
        "{why}"
    );
    // Half-open: a probe goes now and then, not a flood (at most one per
    // second at first, then fewer).
    let server_errors = || m.stats().server_errors;
    let at_open = server_errors();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let probes = server_errors() - at_open;
    assert!(
        probes <= 6,
        "{probes} sends in 4 s while the breaker was open"
    );
    assert!(!run_task.is_finished(), "the run waits for the provider");
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_batch_result WHERE outcome = 'error'",
            []
        ),
        0,
        "no item failed for the outage"
    );

    m.set_config(latency(20.0, 40.0));
    let (report, lines) = tokio::time::timeout(Duration::from_secs(90), run_task)
        .await
        .expect("the run went on by itself once the provider healed")
        .unwrap();
    assert!(
        matches!(report.end, RunEnd::Completed),
        "{:?}\n{}",
        report.end,
        lines.text()
    );
    let s = report.session.unwrap();
    assert_eq!(s.error_count, 0, "no item failed for it");
    check_complete(&conn, &s.session_id);
    // Only the failures before the breaker opened count against items
    // (at most a few each; the item's cap is 5).
    assert!(
        count(
            &conn,
            "SELECT COALESCE(MAX(transport_retries), 0) FROM llm_requests",
            []
        ) < 5
    );
    let events: Vec<String> = conn
        .prepare("SELECT kind || ': ' || message FROM session_event WHERE kind IN ('unreachable', 'reachable') ORDER BY event_id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(events[0].contains("failing"), "{events:?}");
    assert!(
        events[1].starts_with("reachable: provider main answers again"),
        "{events:?}"
    );
}

/// Row S6, timed out but landed: the provider takes some requests, bills
/// them, and answers only after the client's timeout (`late`). Each such
/// attempt is ambiguous and sent again; the billing log then holds two
/// executions for it against one ambiguous attempt, and every billed
/// execution is on record as answered or ambiguous. The summary reports
/// them as possible duplicate charges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s6_timed_out_but_billed_is_ambiguous_and_reported() {
    const ITEMS: i64 = 40;
    let (m, ws) = mocked(
        MockConfig {
            late: 0.15,
            late_ms: 2_500,
            seed: 11,
            ..Default::default()
        },
        ITEMS as usize,
        |job| {
            job.timeout_secs = 1.0;
            job.concurrency = 8;
        },
    )
    .await;
    let (report, lines) = run(options(&ws)).await;
    assert!(matches!(report.end, RunEnd::Completed), "{}", lines.text());
    let s = report.session.clone().unwrap();
    let conn = ws.conn();
    check_complete(&conn, &s.session_id);
    assert_eq!(s.error_count, 0);
    // A late request's bill is logged as it arrives, before its wait.
    let billed: Vec<String> = m
        .log()
        .into_iter()
        .filter(|e| e.status == 200)
        .filter_map(|e| e.client_request_id)
        .collect();
    let answered = count(
        &conn,
        "SELECT COUNT(*) FROM llm_messages WHERE state = 'answered'",
        [],
    );
    let ambiguous = count(
        &conn,
        "SELECT COUNT(*) FROM llm_messages WHERE state = 'ambiguous'",
        [],
    );
    assert_eq!(answered, ITEMS);
    assert!(ambiguous > 0, "no request was late");
    assert_eq!(s.ambiguous_count as i64, ambiguous);
    // Two executions for each late request: the late one and its resend.
    assert_eq!(billed.len() as i64, answered + ambiguous);
    for id in &billed {
        let state: String = conn
            .query_row(
                "SELECT state FROM llm_messages WHERE client_request_id = ?1",
                [id],
                |r| r.get(0),
            )
            .unwrap_or_else(|e| panic!("{id} billed, not on record: {e}"));
        assert!(
            state == "answered" || state == "ambiguous",
            "{id} billed, recorded {state}"
        );
    }
    let summary = docket::engine::format_summary(&s, &report.end).join("\n");
    assert!(
        summary.contains(&format!(
            "possible duplicate charges: {ambiguous} attempt(s)"
        )),
        "{summary}"
    );
}

/// Row S3, 403: a key that may not use the model stops the session at
/// once like a rejected key (no retries, no item failed), and a resume
/// once access is granted finishes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_a_forbidden_model_stops_at_once_and_resumes_once_granted() {
    let (m, ws) = mocked(mode("forbidden"), 60, |job| job.concurrency = 4).await;
    let (report, lines) = run(options(&ws)).await;
    let RunEnd::Stopped(msg) = &report.end else {
        panic!("{:?}\n{}", report.end, lines.text())
    };
    assert!(msg.contains("403") || msg.contains("credentials"), "{msg}");
    assert!(m.stats().requests <= 8, "{:?}", m.stats());
    let s = report.session.unwrap();
    assert_eq!(s.processed_count, 0, "no item failed for it");
    m.set_config(MockConfig::default());
    let mut o = options(&ws);
    o.resume = Some(s.session_id.clone());
    let (report, lines) = run(o).await;
    assert_eq!(report.end, RunEnd::Completed, "{}", lines.text());
    check_complete(&ws.conn(), &s.session_id);
}

/// Row S3, 404 model: a model the provider does not know (a typo in
/// docket.toml) is refused for every request. Before the stage's first
/// answer a refusal is not held against the item: once twelve requests,
/// from four items or more, were all refused, the session pauses naming
/// the model and the provider's words, with no item failed. When the
/// provider serves the model, the resume finishes every item.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_an_unknown_model_pauses_the_session_before_items_fail() {
    let (m, ws) = mocked(
        MockConfig {
            models: "some-other-model".into(),
            ..Default::default()
        },
        60,
        |job| job.concurrency = 4,
    )
    .await;
    let (report, lines) = run(options(&ws)).await;
    let RunEnd::Paused(why) = &report.end else {
        panic!("{:?}\n{}", report.end, lines.text())
    };
    assert!(
        why.contains("were all refused by the provider")
            && why.contains("HTTP 404")
            && why.contains("gpt-4o-mini")
            && why.contains("does not exist"),
        "{why}"
    );
    assert_eq!(report.end.exit_code(), 4);
    let s = report.session.unwrap();
    let errors: Vec<String> = ws
        .conn()
        .prepare("SELECT error_message FROM llm_batch_result")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(s.error_count, 0, "no item failed for it: {errors:?}");
    assert!(m.stats().requests < 40, "stopped early: {:?}", m.stats());
    m.set_config(MockConfig::default());
    let mut o = options(&ws);
    o.resume = Some(s.session_id.clone());
    let (report, lines) = run(o).await;
    assert_eq!(report.end, RunEnd::Completed, "{}", lines.text());
    let s = report.session.unwrap();
    assert_eq!(s.error_count, 0);
    check_complete(&ws.conn(), &s.session_id);
}

/// Row S3, 400 context length: once the provider takes the stage's
/// requests, an item whose prompt is too long for the model fails alone,
/// at its first refusal (no retry), with the provider's words; every other
/// item is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_a_prompt_past_the_context_length_fails_that_item_alone() {
    let (m, ws) = mocked(MockConfig::default(), 0, |job| job.concurrency = 2).await;
    let mut raw = Vec::new();
    docket::demo::write_chart_items(&mut raw, 20, 3).unwrap();
    let mut text = String::from_utf8(raw).unwrap();
    // One item far longer than the others, last in the file.
    let long = format!(
        "{{\"id\":\"long-one\",\"chart\":\"UK\",\"week\":\"2020-01-01\",\"position\":1,\"artist\":\"{}\",\"title\":\"t\",\"candidates\":[]}}\n",
        "word ".repeat(3000)
    );
    text.push_str(&long);
    let path = ws.path().join("items/ctx.jsonl");
    std::fs::write(&path, text).unwrap();
    support::import(&ws, &path);
    m.set_config(MockConfig {
        context_tokens: 1500,
        ..Default::default()
    });
    let mut o = options(&ws);
    o.rate_limit = None;
    let (report, lines) = run(o).await;
    assert!(
        matches!(report.end, RunEnd::Completed),
        "{:?}\n{}",
        report.end,
        lines.text()
    );
    let s = report.session.unwrap();
    check_complete(&ws.conn(), &s.session_id);
    assert_eq!(s.error_count, 1, "{}", lines.text());
    let conn = ws.conn();
    let (item, message): (String, String) = conn
        .query_row(
            "SELECT item_id, error_message FROM llm_batch_result WHERE outcome = 'error'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(item, "long-one");
    assert!(message.contains("maximum context length"), "{message}");
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_messages m JOIN session_request sr ON sr.request_id = m.request_id WHERE sr.item_id = 'long-one'",
            []
        ),
        1,
        "refused once, not retried"
    );
}

/// Row S2: a 429 storm with no hint (no retry-after, no rate headers) hits
/// every request for twelve seconds. The first wave meets it; then the
/// limiter halves concurrency and holds every send for a jittered cooldown
/// after each 429 (spread over 2 s after it, there being no hint), so the
/// storm sees a probe now and then, not waves: of the sends after its
/// first wave, at most 10% (or two) fall in any one 100 ms window (the
/// herd metric). When it ends, the run finishes with no item failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s2_a_hintless_429_storm_gets_spread_probes_not_waves() {
    const ITEMS: usize = 200;
    const CONCURRENCY: u64 = 32;
    let (m, ws) = mocked(MockConfig::default(), ITEMS, |job| {
        job.concurrency = CONCURRENCY
    })
    .await;
    m.set_config(MockConfig {
        storm_429_ms: 12_000,
        ..latency(10.0, 20.0)
    });
    let (report, lines) = run(options(&ws)).await;
    assert!(matches!(report.end, RunEnd::Completed), "{}", lines.text());
    let s = report.session.unwrap();
    assert_eq!(s.error_count, 0, "{}", lines.text());
    check_complete(&ws.conn(), &s.session_id);
    let mut storm: Vec<u64> = m
        .log()
        .iter()
        .filter(|e| e.status == 429)
        .map(|e| e.at_ms)
        .collect();
    storm.sort_unstable();
    let start = *storm.first().expect("the storm hit no send");
    // The first wave: what was under way when the storm began.
    let first_wave = storm.iter().filter(|t| **t < start + 250).count();
    assert!(
        first_wave as u64 <= CONCURRENCY,
        "{first_wave} sends in the first wave"
    );
    let later: Vec<u64> = storm
        .iter()
        .copied()
        .filter(|t| *t >= start + 250)
        .collect();
    assert!(
        later.len() >= 5,
        "{} sends after the first wave",
        later.len()
    );
    let mut buckets: std::collections::HashMap<u64, usize> = Default::default();
    for at in &later {
        *buckets.entry(at / 100).or_default() += 1;
    }
    let worst = buckets.values().copied().max().unwrap_or(0);
    eprintln!(
        "storm: {} 429s, {first_wave} in the first wave, {} after it, at most {worst} in one 100 ms window",
        storm.len(),
        later.len()
    );
    // 10%, with a floor of two: the storm sees only a probe every second
    // or so, and two random probes share a 100 ms window now and then.
    assert!(
        worst <= (later.len() / 10).max(2),
        "{worst} of {} sends in one 100 ms window",
        later.len()
    );
}

/// Row I3: evidence is data. An item whose fields hold template syntax
/// (`{{ ... }}`, `{% ... %}`) is rendered with that text as it is, never
/// evaluated: the prompt sent holds the braces, not what they would make.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn template_syntax_in_evidence_is_text_not_template() {
    let (_m, ws) = mocked(MockConfig::default(), 0, |_| {}).await;
    let path = ws.path().join("items/hostile.jsonl");
    std::fs::write(
        &path,
        r#"{"id":"h1","chart":"UK","week":"2020-01-01","position":1,"artist":"{{ 7 * 7 }}","title":"{% for x in range(3) %}boom{% endfor %}","candidates":[]}
"#,
    )
    .unwrap();
    support::import(&ws, &path);
    let (report, lines) = run(options(&ws)).await;
    assert!(report.session.is_some(), "{}", lines.text());
    let prompt: String = ws
        .conn()
        .query_row("SELECT user_prompt FROM llm_messages LIMIT 1", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert!(prompt.contains("artist: {{ 7 * 7 }}"), "{prompt}");
    assert!(
        prompt.contains("title: {% for x in range(3) %}boom{% endfor %}"),
        "{prompt}"
    );
    assert!(
        !prompt.contains("49") && !prompt.contains("boomboom"),
        "{prompt}"
    );
}

/// Items of the demo set, plus one whose evidence carries `marker`.
fn demo_items_and_one_marked(ws: &Workspace, n: usize, marker: &str) {
    let mut raw = Vec::new();
    docket::demo::write_chart_items(&mut raw, n, 3).unwrap();
    let mut text = String::from_utf8(raw).unwrap();
    text.push_str(&format!(
        "{{\"id\":\"marked\",\"chart\":\"UK\",\"week\":\"2020-01-01\",\"position\":1,\"artist\":\"{marker}\",\"title\":\"t\",\"candidates\":[]}}\n"
    ));
    let path = ws.path().join("items/marked.jsonl");
    std::fs::write(&path, text).unwrap();
    support::import(ws, &path);
}

/// The llm_messages rows of one item: (attempt, error_kind, http_status).
fn attempts_of(conn: &rusqlite::Connection, item: &str) -> Vec<(i64, Option<String>, Option<i64>)> {
    conn.prepare(
        "SELECT m.attempt, m.error_kind, m.http_status FROM llm_messages m \
         JOIN session_request sr ON sr.request_id = m.request_id WHERE sr.item_id = ?1 ORDER BY m.attempt",
    )
    .unwrap()
    .query_map([item], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
    .unwrap()
    .map(Result::unwrap)
    .collect()
}

/// Row S4: intermittent 500s are retried to success; a request that fails
/// the same way every time ends, after its transport attempts, as a named
/// `failed_deterministic` error, not an endless retry and not a breaker
/// that holds everyone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s4_a_request_failing_the_same_way_every_time_is_failed_deterministic() {
    let (m, ws) = mocked(MockConfig::default(), 0, |job| {
        job.concurrency = 4;
        job.transport_attempts = 4;
    })
    .await;
    demo_items_and_one_marked(&ws, 30, "POISON-PILL");
    m.set_config(MockConfig {
        poison: "POISON-PILL".into(),
        fail_500: 0.05,
        seed: 7,
        ..Default::default()
    });
    let mut o = options(&ws);
    o.rate_limit = None;
    let (report, lines) = run(o).await;
    assert_eq!(report.end, RunEnd::Completed, "{}", lines.text());
    let s = report.session.unwrap();
    let conn = ws.conn();
    check_complete(&conn, &s.session_id);
    assert_eq!(s.error_count, 1, "{}", lines.text());
    let (item, message): (String, String) = conn
        .query_row(
            "SELECT item_id, error_message FROM llm_batch_result WHERE outcome = 'error'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(item, "marked");
    assert!(
        message.starts_with(
            "failed_deterministic: the same request failed the same way 4 times in a row"
        ),
        "{message}"
    );
    // Sent exactly its transport attempts, each a 500, none ambiguous.
    let tries = attempts_of(&conn, "marked");
    assert_eq!(tries.len(), 4, "{tries:?}");
    assert!(
        tries.iter().all(|(_, _, status)| *status == Some(500)),
        "{tries:?}"
    );
    // The intermittent ones were retried to an answer: every other item
    // answered, some of them after a 500.
    let intermittent = count(
        &conn,
        "SELECT COUNT(*) FROM llm_messages m JOIN session_request sr ON sr.request_id = m.request_id \
         WHERE sr.item_id <> 'marked' AND m.http_status = 500",
        [],
    );
    assert!(intermittent > 0, "the 5% of 500s hit some item");
    let stats = m.stats();
    assert_eq!(stats.ok, 30, "{stats:?}");
    assert_eq!(stats.server_errors as i64, intermittent + 4, "{stats:?}");
}

/// Row S8: a refusal and an empty answer are named outcomes, not parse
/// errors, and never asked again the same way (no repair prompt here): one
/// paid send each, then the item's error says which.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s8_refusals_and_empty_answers_are_named_and_not_asked_again() {
    let (m, ws) = mocked(
        MockConfig {
            refusal: 0.15,
            empty: 0.1,
            seed: 5,
            ..Default::default()
        },
        60,
        |job| {
            job.concurrency = 4;
            job.max_attempts = 3;
        },
    )
    .await;
    let (report, lines) = run(options(&ws)).await;
    assert_eq!(report.end, RunEnd::Completed, "{}", lines.text());
    let s = report.session.unwrap();
    let conn = ws.conn();
    check_complete(&conn, &s.session_id);
    let stats = m.stats();
    assert!(stats.refused > 0 && stats.empty > 0, "{stats:?}");
    assert_eq!(
        s.error_count,
        stats.refused + stats.empty,
        "each refused or empty answer ends its item: {}",
        lines.text()
    );
    let errors: Vec<(String, String)> = conn
        .prepare("SELECT item_id, error_message FROM llm_batch_result WHERE outcome = 'error'")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let named = |prefix: &str| errors.iter().filter(|(_, e)| e.starts_with(prefix)).count() as u64;
    assert_eq!(
        named("refused: the model refused"),
        stats.refused,
        "{errors:?}"
    );
    assert_eq!(
        named("empty: the answer has no content"),
        stats.empty,
        "{errors:?}"
    );
    for (item, e) in &errors {
        assert!(!e.contains("parse error"), "{e}");
        assert!(e.contains("not asked again"), "{e}");
        let tries = attempts_of(&conn, item);
        assert_eq!(
            tries.len(),
            1,
            "{item}: one paid send, no re-ask: {tries:?}"
        );
        let kind = tries[0].1.as_deref();
        assert!(matches!(kind, Some("refused" | "empty")), "{kind:?}");
    }
    // Paid for: the ledger counts the refusals' tokens like any answer's.
    assert_eq!(
        stats.ok as i64 + errors.len() as i64,
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_messages WHERE state = 'answered'",
            []
        )
    );
}

/// Row S8, truncation at the ceiling: a stage whose max_tokens is already
/// the most docket asks for is not asked again the same way; the item ends
/// `output_truncated` after one paid send.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s8_a_truncated_answer_at_the_ceiling_is_not_asked_again() {
    let (m, ws) = mocked(
        MockConfig {
            truncated: 1.0,
            ..Default::default()
        },
        3,
        |job| job.max_attempts = 3,
    )
    .await;
    let path = ws.path().join("docket.toml");
    let toml = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, toml.replace("max_tokens = 200", "max_tokens = 8192")).unwrap();
    let (report, lines) = run(options(&ws)).await;
    let s = report.session.unwrap();
    check_complete(&ws.conn(), &s.session_id);
    assert_eq!(s.error_count, 3, "{}", lines.text());
    assert_eq!(m.stats().requests, 3, "one send each");
    let err: String = ws
        .conn()
        .query_row(
            "SELECT error_message FROM llm_batch_result LIMIT 1",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(
        err.starts_with("output_truncated: the answer hit max_tokens (8192)")
            && err.contains("not asked again"),
        "{err}"
    );
}

/// Row S2, past the caps: every request is refused for rate limits twice
/// in a row (the mock's `rate_limit_first`), one more than its rate-limit
/// retries (`max_rate_limit_retries = 1`). No request is failed for it:
/// each goes to `retry_wait`, the warning events say how many and until when
/// (`run_at`), the progress line counts them while they wait (about
/// `retry_wait_secs`, no hot loop), and each goes again and is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s2_rate_limit_retries_run_out_into_retry_wait_not_an_item_error() {
    const ITEMS: usize = 6;
    let (m, ws) = mocked(
        MockConfig {
            rate_limit_first: 2,
            ..Default::default()
        },
        ITEMS,
        |job| job.concurrency = 4,
    )
    .await;
    let path = ws.path().join("docket.toml");
    let toml = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        toml.replace(
            "max_transport_attempts = 5\n",
            "max_transport_attempts = 5\nmax_rate_limit_retries = 1\nretry_wait_secs = 2.5\n",
        ),
    )
    .unwrap();
    let started = std::time::Instant::now();
    let (report, lines) = run(options(&ws)).await;
    assert_eq!(report.end, RunEnd::Completed, "{}", lines.text());
    let s = report.session.unwrap();
    let conn = ws.conn();
    check_complete(&conn, &s.session_id);
    assert_eq!(s.error_count, 0, "{}", lines.text());
    // Two refusals each, then the wait, then one answer: no hot loop.
    let stats = m.stats();
    assert_eq!(stats.rate_limited, 2 * ITEMS as u64, "{stats:?}");
    assert_eq!(stats.ok, ITEMS as u64);
    assert!(
        started.elapsed() >= std::time::Duration::from_secs_f64(2.5 * 0.75),
        "the requests waited"
    );
    let waits = events_of(&conn, &s.session_id, "retry_wait");
    assert!(!waits.is_empty(), "{}", lines.text());
    let mut said = 0;
    for w in &waits {
        assert_eq!(w.level, "warn");
        assert!(
            w.message
                .contains("refused for rate limits 2 times in a row")
                && w.message.contains("(run_at)")
                && w.message.contains("No item is failed"),
            "{}",
            w.message
        );
        said += w
            .message
            .split(" request(s)")
            .next()
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no count in {}", w.message));
    }
    // Every wait said, in few events (not one per request).
    assert_eq!(said, ITEMS as u64, "{waits:?}");
    assert!(waits.len() < ITEMS, "{} events", waits.len());
    assert!(
        lines.text().contains("waiting to retry (rate limited)"),
        "{}",
        lines.text()
    );
}
