//! Staged pipelines end to end against the built-in mock over loopback:
//! a generator and its critic (run only for answers that passed, routed
//! with the critic's verdict), the four-stage judge-gym shape, stop after a
//! stage and resume, `--rerun-stage`, the repair prompt, budgets spent to
//! an error, and structured batching with criteria asked again one by one.

use docket_testkit as support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use docket::engine::{RunEnd, RunOptions};
use docket::ledger::control::RunControls;
use docket::mock::{MockConfig, MockServer};
use docket::workspace::Example;
use rusqlite::Connection;
use support::*;

/// Every run must end well within this.
const RUN_LIMIT: Duration = Duration::from_secs(40);

/// A workspace written by `docket init --example`, its docket.toml passed
/// through `edit`, holding `items` demo items.
fn example(ex: Example, items: usize, edit: impl FnOnce(String) -> String) -> Workspace {
    let dir = tempfile::tempdir().expect("tempdir");
    docket::workspace::init_example(dir.path(), false, Some(ex)).expect("init example");
    let path = dir.path().join("docket.toml");
    let toml = std::fs::read_to_string(&path).unwrap();
    let edited = edit(toml.clone());
    std::fs::write(&path, edited).unwrap();
    let ws = Workspace { dir };
    import_demo_items(&ws, items);
    ws
}

/// `text` with `from` replaced exactly once (panics if it is not there, so
/// an edit of the example never silently does nothing).
fn edit_once(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "docket.toml has no {from:?}:\n{text}");
    text.replacen(from, to, 1)
}

/// The critic example with the generator's attempt budget and repair
/// prompt set (`repair_after = None` removes the repair prompt).
fn critic_toml(toml: String, gen_attempts: u32, repair_after: Option<u32>) -> String {
    let repair = match repair_after {
        Some(n) => format!("repair_after = {n}"),
        None => String::new(),
    };
    let t = edit_once(
        &toml,
        "max_attempts = 3\nrepair_after = 2",
        &format!("max_attempts = {gen_attempts}\n{repair}"),
    );
    if repair_after.is_none() {
        edit_once(&t, "repair_template = \"prompts/repair.j2\"", "")
    } else {
        t
    }
}

fn opts(ws: &Workspace, m: &MockServer) -> RunOptions {
    RunOptions {
        base_url_override: Some(m.base_url()),
        ..options(ws)
    }
}

async fn completed(o: RunOptions) -> String {
    let (report, lines) = tokio::time::timeout(RUN_LIMIT, run(o))
        .await
        .expect("the run ended in time");
    assert_eq!(report.end, RunEnd::Completed, "{}", lines.text());
    report.session_id.expect("a session")
}

fn strings(conn: &Connection, sql: &str, p: impl rusqlite::Params) -> Vec<String> {
    conn.prepare(sql)
        .unwrap()
        .query_map(p, |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// Messages (attempts) sent in a session per request stage name.
fn messages_by_stage(conn: &Connection, sid: &str) -> BTreeMap<String, i64> {
    conn.prepare(
        "SELECT r.stage, COUNT(*) FROM llm_messages m JOIN llm_requests r ON r.request_id = m.request_id
         WHERE m.session_id = ?1 GROUP BY r.stage",
    )
    .unwrap()
    .query_map([sid], |r| Ok((r.get(0)?, r.get(1)?)))
    .unwrap()
    .map(Result::unwrap)
    .collect()
}

/// The state of each item's request for `stage`.
fn stage_states(conn: &Connection, sid: &str, stage: &str) -> BTreeMap<String, String> {
    conn.prepare("SELECT item_id, state FROM session_request WHERE session_id = ?1 AND stage = ?2")
        .unwrap()
        .query_map([sid, stage], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

#[derive(Debug, PartialEq)]
struct RunStage {
    total: i64,
    completed: i64,
    failed: i64,
    skipped: i64,
    state: String,
}

fn run_stage(conn: &Connection, sid: &str, stage: &str) -> RunStage {
    conn.query_row(
        "SELECT total, completed, failed, skipped, state FROM run_stages WHERE session_id = ?1 AND stage = ?2",
        [sid, stage],
        |r| {
            Ok(RunStage {
                total: r.get(0)?,
                completed: r.get(1)?,
                failed: r.get(2)?,
                skipped: r.get(3)?,
                state: r.get(4)?,
            })
        },
    )
    .unwrap_or_else(|e| panic!("run_stages {stage}: {e}"))
}

/// Per item: (outcome, confidence, critic_verdict, routing_note, error_message).
type ResultRow = (
    String,
    Option<f64>,
    Option<String>,
    Option<String>,
    Option<String>,
);

fn results(conn: &Connection, sid: &str) -> BTreeMap<String, ResultRow> {
    conn.prepare(
        "SELECT item_id, outcome, confidence, critic_verdict, routing_note, error_message
         FROM llm_batch_result WHERE session_id = ?1",
    )
    .unwrap()
    .query_map([sid], |r| {
        Ok((
            r.get(0)?,
            (r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?),
        ))
    })
    .unwrap()
    .map(Result::unwrap)
    .collect()
}

/// 1. The critic runs once for every item whose generator passed, never for
/// one whose generator spent its budget; the checkpoints add up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn critic_runs_only_after_a_passing_generator() {
    let m = mock(MockConfig {
        wrong_schema: 0.5,
        seed: 11,
        ..Default::default()
    })
    .await;
    let ws = example(Example::Critic, 30, |t| critic_toml(t, 2, Some(1)));
    let sid = completed(opts(&ws, &m)).await;
    let conn = ws.conn();
    check_complete(&conn, &sid);
    let gen_states = stage_states(&conn, &sid, "adjudicate");
    let critic_states = stage_states(&conn, &sid, "critic");
    assert_eq!(gen_states.len(), 30);
    assert_eq!(critic_states.len(), 30);
    let gen_failed: BTreeSet<&String> = gen_states
        .iter()
        .filter(|(_, s)| *s == "failed")
        .map(|(i, _)| i)
        .collect();
    let gen_passed = 30 - gen_failed.len();
    assert!(
        !gen_failed.is_empty() && gen_passed > 0,
        "the seed makes some generators fail and some pass: {gen_states:?}"
    );
    assert!(gen_states.values().all(|s| s == "passed" || s == "failed"));
    let res = results(&conn, &sid);
    for (item, gen_state) in &gen_states {
        let critic_msgs = count(
            &conn,
            "SELECT COUNT(*) FROM llm_messages m JOIN llm_requests r ON r.request_id = m.request_id
             WHERE m.session_id = ?1 AND r.item_id = ?2 AND r.stage = 'critic'",
            [&sid, item],
        );
        let critic_requests = count(
            &conn,
            "SELECT COUNT(DISTINCT r.request_id) FROM llm_messages m JOIN llm_requests r ON r.request_id = m.request_id
             WHERE m.session_id = ?1 AND r.item_id = ?2 AND r.stage = 'critic'",
            [&sid, item],
        );
        // Attempts of the critic whose answer passed its gate.
        let critic_passing = count(
            &conn,
            "SELECT COUNT(*) FROM llm_messages m JOIN llm_requests r ON r.request_id = m.request_id
             WHERE m.session_id = ?1 AND r.item_id = ?2 AND r.stage = 'critic'
               AND m.state = 'answered' AND m.error_kind IS NULL",
            [&sid, item],
        );
        let critic = &critic_states[item];
        let (outcome, _, verdict, _, error) = &res[item];
        let note = res[item].3.as_deref().unwrap_or_default();
        if gen_state == "failed" {
            assert_eq!(critic, "skipped", "{item}");
            assert_eq!(critic_msgs, 0, "{item}: no critic for a failed generator");
            // Row S7: its answers all failed the gate: a human reads them.
            assert_eq!(outcome, "review", "{item}");
            let e = error.as_deref().unwrap_or_default();
            assert!(e.starts_with("stage adjudicate: "), "{item}: {e}");
            assert!(
                note.contains("stage adjudicate")
                    && note.contains("after 2 answers failed the gate"),
                "{item}: {note}"
            );
            assert_eq!(verdict, &None);
        } else {
            assert_eq!(critic_requests, 1, "{item}: one critic request");
            match critic.as_str() {
                "passed" => {
                    assert_eq!(critic_passing, 1, "{item}: the critic answered once");
                    assert_ne!(outcome, "error", "{item}");
                    assert!(verdict.is_some(), "{item}");
                }
                "failed" => {
                    assert_eq!(critic_passing, 0, "{item}");
                    assert_eq!(critic_msgs, 3, "{item}: the critic's budget");
                    // The generator's answer goes to review, unchecked.
                    assert_eq!(outcome, "review", "{item}");
                    let e = error.as_deref().unwrap_or_default();
                    assert!(e.starts_with("stage critic: "), "{item}: {e}");
                    assert!(
                        note.contains("stage critic") && note.contains("unchecked"),
                        "{item}: {note}"
                    );
                }
                other => panic!("{item}: critic {other} after a passing generator"),
            }
        }
    }
    let critic_passed = critic_states.values().filter(|s| *s == "passed").count() as i64;
    let critic_failed = critic_states.values().filter(|s| *s == "failed").count() as i64;
    assert_eq!(
        run_stage(&conn, &sid, "adjudicate"),
        RunStage {
            total: 30,
            completed: gen_passed as i64,
            failed: gen_failed.len() as i64,
            skipped: 0,
            state: "done".into(),
        }
    );
    assert_eq!(
        run_stage(&conn, &sid, "critic"),
        RunStage {
            total: 30,
            completed: critic_passed,
            failed: critic_failed,
            skipped: gen_failed.len() as i64,
            state: "done".into(),
        }
    );
    // Every send the mock saw is an attempt in the ledger.
    let msgs: i64 = messages_by_stage(&conn, &sid).values().sum();
    assert_eq!(m.stats().requests as i64, msgs);
}

/// 2. A critic that disagrees turns auto-accepts into reviews (or, with
/// `on_disagree = "reject"`, rejects); one that agrees leaves the routing
/// to the confidence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_critic_verdict_bears_on_the_routing() {
    fn band(c: f64) -> &'static str {
        if c >= 0.85 {
            "accepted"
        } else if c >= 0.60 {
            "review"
        } else {
            "rejected"
        }
    }
    // Disagree, on_disagree = review.
    let m = mock(MockConfig {
        verdict: Some("disagree".into()),
        ..Default::default()
    })
    .await;
    let ws = example(Example::Critic, 40, |t| t);
    let sid = completed(opts(&ws, &m)).await;
    let conn = ws.conn();
    check_complete(&conn, &sid);
    let res = results(&conn, &sid);
    assert_eq!(res.len(), 40);
    let mut high = 0;
    for (item, (outcome, conf, verdict, note, _)) in &res {
        assert_ne!(outcome, "accepted", "{item}");
        assert_eq!(verdict.as_deref(), Some("disagree"), "{item}");
        let c = conf.expect("a confidence");
        if c >= 0.85 {
            high += 1;
            assert_eq!(outcome, "review", "{item} ({c})");
            let n = note.as_deref().unwrap_or_default();
            assert!(n.contains("accepted -> review"), "{item}: {n}");
        } else {
            assert_eq!(outcome, band(c), "{item} ({c})");
            assert_eq!(note, &None, "{item}");
        }
    }
    assert!(high > 0, "some generator answers reach 0.85: {res:?}");

    // Agree: the confidence alone decides.
    let m = mock(MockConfig {
        verdict: Some("agree".into()),
        ..Default::default()
    })
    .await;
    let ws = example(Example::Critic, 40, |t| t);
    let sid = completed(opts(&ws, &m)).await;
    let conn = ws.conn();
    check_complete(&conn, &sid);
    let res = results(&conn, &sid);
    let mut accepted = 0;
    for (item, (outcome, conf, verdict, note, _)) in &res {
        assert_eq!(verdict.as_deref(), Some("agree"), "{item}");
        assert_eq!(outcome, band(conf.unwrap()), "{item}");
        assert_eq!(note, &None, "{item}");
        accepted += i32::from(outcome == "accepted");
    }
    assert!(accepted > 0, "{res:?}");

    // Disagree, on_disagree = reject: accepts and reviews become rejects.
    let m = mock(MockConfig {
        verdict: Some("disagree".into()),
        ..Default::default()
    })
    .await;
    let ws = example(Example::Critic, 40, |t| {
        edit_once(&t, "on_disagree = \"review\"", "on_disagree = \"reject\"")
    });
    let sid = completed(opts(&ws, &m)).await;
    let conn = ws.conn();
    check_complete(&conn, &sid);
    let res = results(&conn, &sid);
    for (item, (outcome, conf, _, note, _)) in &res {
        assert_eq!(outcome, "rejected", "{item}");
        let c = conf.unwrap();
        if band(c) != "rejected" {
            let n = note.as_deref().unwrap_or_default();
            assert!(
                n.contains(&format!("{} -> rejected", band(c))),
                "{item} ({c}): {n}"
            );
        }
    }
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM review_item WHERE session_id = ?1",
            [&sid]
        ),
        0
    );
}

/// 3. Judge-gym: four stages in order, scoring only after every rubric is
/// through its critic, the regex-gated critic's verdict parsed, the outcome
/// routed on score_gen with score_critic's verdict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn judge_gym_runs_four_stages_in_order() {
    let m = mock(MockConfig {
        latency_median_ms: 5.0,
        latency_p99_ms: 20.0,
        ..Default::default()
    })
    .await;
    let ws = example(Example::JudgeGym, 20, |t| t);
    let sid = completed(opts(&ws, &m)).await;
    let conn = ws.conn();
    check_complete(&conn, &sid);
    let stages = ["rubric_gen", "rubric_critic", "score_gen", "score_critic"];
    for (pos, stage) in stages.iter().enumerate() {
        let states = stage_states(&conn, &sid, stage);
        assert_eq!(states.len(), 20, "{stage}");
        assert!(
            states.values().all(|s| s == "passed"),
            "{stage}: {states:?}"
        );
        assert_eq!(
            count(
                &conn,
                "SELECT COUNT(*) FROM session_request WHERE session_id = ?1 AND stage = ?2 AND position = ?3",
                rusqlite::params![&sid, stage, pos as i64]
            ),
            20,
            "{stage} at position {pos}"
        );
        assert_eq!(
            run_stage(&conn, &sid, stage),
            RunStage {
                total: 20,
                completed: 20,
                failed: 0,
                skipped: 0,
                state: "done".into()
            },
            "{stage}"
        );
    }
    let by_stage = messages_by_stage(&conn, &sid);
    assert_eq!(
        by_stage,
        stages.iter().map(|s| (s.to_string(), 20)).collect(),
        "one send per item and stage, no criterion asked again"
    );
    // Per item, each stage's send comes after the previous stage's answer.
    for item in strings(
        &conn,
        "SELECT item_id FROM session_item WHERE session_id = ?1",
        [&sid],
    ) {
        let times: Vec<(f64, f64)> = stages
            .iter()
            .map(|s| {
                conn.query_row(
                    "SELECT m.sent_at, m.finished_at FROM llm_messages m JOIN llm_requests r ON r.request_id = m.request_id
                     WHERE m.session_id = ?1 AND r.item_id = ?2 AND r.stage = ?3",
                    [&sid, &item, &s.to_string()],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .unwrap()
            })
            .collect();
        for w in times.windows(2) {
            assert!(w[1].0 >= w[0].1, "{item}: {times:?}");
        }
    }
    // wait_for_previous: no score before every rubric critic answered.
    let (first_score, last_rubric_critic): (f64, f64) = conn
        .query_row(
            "SELECT (SELECT MIN(m.sent_at) FROM llm_messages m JOIN llm_requests r ON r.request_id = m.request_id
                     WHERE m.session_id = ?1 AND r.stage = 'score_gen'),
                    (SELECT MAX(m.finished_at) FROM llm_messages m JOIN llm_requests r ON r.request_id = m.request_id
                     WHERE m.session_id = ?1 AND r.stage = 'rubric_critic')",
            [&sid],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert!(
        first_score >= last_rubric_critic,
        "first score_gen send {first_score} before the last rubric_critic answer {last_rubric_critic}"
    );
    // The regex gate's named captures are the rubric critic's output.
    for out in strings(
        &conn,
        "SELECT output_json FROM session_request WHERE session_id = ?1 AND stage = 'rubric_critic'",
        [&sid],
    ) {
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let verdict = v["verdict"].as_str().unwrap_or_default();
        assert!(verdict == "agree" || verdict == "disagree", "{out}");
        assert!(v.get("rationale").is_some(), "{out}");
    }
    // The outcome: score_gen's answer, score_critic's verdict.
    let rows: Vec<(String, String, String, f64, String, String)> = conn
        .prepare(
            "SELECT b.item_id, b.stage, b.outcome, b.confidence, b.critic_verdict, sr.output_json
             FROM llm_batch_result b JOIN session_request sr
               ON sr.session_id = b.session_id AND sr.item_id = b.item_id AND sr.stage = 'score_critic'
             WHERE b.session_id = ?1",
        )
        .unwrap()
        .query_map([&sid], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
            ))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(rows.len(), 20);
    for (item, stage, outcome, conf, verdict, critic_out) in rows {
        assert_eq!(stage, "score_gen", "{item}");
        let v: serde_json::Value = serde_json::from_str(&critic_out).unwrap();
        assert_eq!(Some(verdict.as_str()), v["verdict"].as_str(), "{item}");
        let gen_conf: f64 = conn
            .query_row(
                "SELECT json_extract(output_json, '$.confidence') FROM session_request
                 WHERE session_id = ?1 AND item_id = ?2 AND stage = 'score_gen'",
                [&sid, &item],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(conf, gen_conf, "{item}: routed on score_gen's confidence");
        let expected = match (conf >= 0.85, conf >= 0.60, verdict == "agree") {
            (true, _, true) => "accepted",
            (true, _, false) => "review",
            (false, true, _) => "review",
            _ => "rejected",
        };
        assert_eq!(outcome, expected, "{item}: {conf} {verdict}");
    }
}

/// 4. Stop after the current stage: the critic (waiting for every
/// generator) starts for no item; the session ends paused; a resume runs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_after_stage_then_resume() {
    let m = mock(MockConfig {
        latency_median_ms: 250.0,
        latency_p99_ms: 250.0,
        ..Default::default()
    })
    .await;
    let ws = example(Example::Critic, 40, |t| {
        let t = edit_once(&t, "max_concurrency = 16", "max_concurrency = 4");
        edit_once(
            &t,
            "critic_of = \"adjudicate\"\n",
            "critic_of = \"adjudicate\"\nwait_for_previous = true\n",
        )
    });
    let handle = tokio::spawn(tokio::time::timeout(RUN_LIMIT, run(opts(&ws, &m))));
    let sid = session_created(&ws).await;
    let conn = ws.conn();
    poll("the generator under way", Duration::from_secs(10), || {
        live_gauges(&conn, &sid).filter(|g| g.in_flight > 0 && g.stage == "adjudicate")
    })
    .await;
    let sent_before = count(
        &conn,
        "SELECT COUNT(*) FROM llm_messages WHERE session_id = ?1",
        [&sid],
    );
    assert!(sent_before < 30, "the stop lands early: {sent_before} sent");
    let stage = ws
        .handle()
        .stop_after_stage(&sid, "test:stop")
        .expect("stop");
    assert_eq!(stage, "adjudicate");
    let (report, lines) = handle.await.unwrap().expect("the run ended in time");
    let RunEnd::Paused(why) = &report.end else {
        panic!("{:?}\n{}", report.end, lines.text());
    };
    assert!(why.contains("stopped after stage adjudicate"), "{why}");
    let by_stage = messages_by_stage(&conn, &sid);
    assert_eq!(by_stage.get("critic"), None, "{by_stage:?}");
    assert_eq!(by_stage.get("adjudicate"), Some(&40));
    assert_eq!(m.stats().requests, 40);
    let generated = stage_states(&conn, &sid, "adjudicate");
    assert!(generated.values().all(|s| s == "passed"), "{generated:?}");
    let critic = stage_states(&conn, &sid, "critic");
    assert!(critic.values().all(|s| s == "pending"), "{critic:?}");
    assert_eq!(run_stage(&conn, &sid, "critic").state, "pending");
    assert_eq!(run_stage(&conn, &sid, "adjudicate").state, "done");
    let (state, reason): (String, Option<String>) = conn
        .query_row(
            "SELECT state, stop_reason FROM llm_batch_session WHERE session_id = ?1",
            [&sid],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(state, "paused");
    let reason = reason.unwrap_or_default();
    assert!(
        reason.contains("adjudicate") && reason.contains("critic"),
        "{reason}"
    );
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_batch_result WHERE session_id = ?1",
            [&sid]
        ),
        0,
        "no outcome before the critic"
    );
    check_invariants(&conn, &sid);
    assert_eq!(events_of(&conn, &sid, "stop_at_stage").len(), 1);

    // Resume: the critic runs for every item, the generator is not asked again.
    let mut o = opts(&ws, &m);
    o.resume = Some(sid.clone());
    let resumed = completed(o).await;
    assert_eq!(resumed, sid);
    check_complete(&conn, &sid);
    let by_stage = messages_by_stage(&conn, &sid);
    assert_eq!(by_stage.get("critic"), Some(&40), "{by_stage:?}");
    assert_eq!(by_stage.get("adjudicate"), Some(&40), "{by_stage:?}");
    assert_eq!(m.stats().requests, 80);
    assert_eq!(
        run_stage(&conn, &sid, "critic"),
        RunStage {
            total: 40,
            completed: 40,
            failed: 0,
            skipped: 0,
            state: "done".into()
        }
    );
}

/// 5. `--rerun-stage critic`: new critic requests (version 2), the
/// generator's answers reused, the old outcomes kept as history; a changed
/// critic template is not reused or asked again silently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerun_stage_asks_the_critic_again() {
    let m = mock(MockConfig::default()).await;
    let ws = example(Example::Critic, 30, |t| t);
    let sid = completed(opts(&ws, &m)).await;
    let conn = ws.conn();
    check_complete(&conn, &sid);
    assert_eq!(m.stats().requests, 60);
    let before = results(&conn, &sid);

    let mut o = opts(&ws, &m);
    o.resume = Some(sid.clone());
    o.rerun_stage = Some("critic".into());
    let again = completed(o).await;
    assert_eq!(again, sid);
    check_complete(&conn, &sid);
    let critic_v2 = count(
        &conn,
        "SELECT COUNT(*) FROM llm_requests r JOIN session_request sr ON sr.request_id = r.request_id
         WHERE sr.session_id = ?1 AND sr.stage = 'critic' AND r.request_version = 2 AND r.status = 'completed'",
        [&sid],
    );
    assert_eq!(critic_v2, 30, "every critic request is a new version 2");
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_requests WHERE stage = 'critic' AND request_version = 1 AND status = 'completed'",
            []
        ),
        30,
        "the first critic answers are kept"
    );
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_requests WHERE stage = 'adjudicate'",
            []
        ),
        30,
        "no new generator request"
    );
    assert_eq!(
        m.stats().requests,
        60 + 30,
        "only the critic was sent again"
    );
    let by_stage = messages_by_stage(&conn, &sid);
    assert_eq!(by_stage.get("adjudicate"), Some(&30), "{by_stage:?}");
    assert_eq!(by_stage.get("critic"), Some(&60), "{by_stage:?}");
    // The old outcomes are history; each item has one outcome again.
    let history: Vec<(String, String, String)> = conn
        .prepare(
            "SELECT item_id, outcome, superseded_by FROM llm_batch_result_history WHERE session_id = ?1",
        )
        .unwrap()
        .query_map([&sid], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(history.len(), 30);
    for (item, outcome, by) in &history {
        assert_eq!(outcome, &before[item].0, "{item}");
        assert!(by.contains("rerun-stage critic"), "{by}");
    }
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM (SELECT item_id FROM llm_batch_result WHERE session_id = ?1 GROUP BY item_id HAVING COUNT(*) = 1)",
            [&sid]
        ),
        30
    );
    assert_eq!(results(&conn, &sid).len(), 30);

    // A changed critic template: a new session refuses rather than reuse
    // or silently resend the answers of the items still undecided.
    let undecided = count(
        &conn,
        "SELECT COUNT(*) FROM decision WHERE state = 'indeterminate'",
        [],
    );
    assert!(undecided > 0, "some items are in review or rejected");
    let tpl = ws.path().join("prompts/critic.j2");
    let text = std::fs::read_to_string(&tpl).unwrap();
    std::fs::write(&tpl, format!("{text}\nBe strict.")).unwrap();
    // (Every undecided item: those awaiting review too, which a new
    // session leaves out by default.)
    let refused = tokio::time::timeout(
        RUN_LIMIT,
        docket::engine::run(
            RunOptions {
                rereview_pending: true,
                ..opts(&ws, &m)
            },
            std::sync::Arc::new(Lines::default()),
            |_| true,
            Default::default(),
        ),
    )
    .await
    .expect("refused in time");
    let e = match refused {
        Ok(r) => panic!("not refused: {:?}", r.end),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("--rerun-stage critic"), "{e}");
    assert!(
        e.contains(&format!("stage critic: {undecided} item(s)")),
        "{e}"
    );
    assert_eq!(m.stats().requests, 90, "nothing was sent");
}

/// 6. After a gate failure the next attempt sends the repair prompt, with
/// the failed answer in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_failure_brings_the_repair_prompt() {
    let m = mock(MockConfig {
        wrong_schema: 0.5,
        seed: 5,
        ..Default::default()
    })
    .await;
    let ws = example(Example::Critic, 30, |t| critic_toml(t, 3, Some(1)));
    let sid = completed(opts(&ws, &m)).await;
    let conn = ws.conn();
    check_complete(&conn, &sid);
    // Generator requests whose first answer failed the gate and whose
    // second passed.
    let repaired: Vec<(String, String, String, String, String)> = conn
        .prepare(
            "SELECT r.item_id, m1.user_prompt, m1.assistant_output, m2.user_prompt, COALESCE(m1.error_message, '')
             FROM llm_requests r
             JOIN llm_messages m1 ON m1.request_id = r.request_id AND m1.attempt = 1
             JOIN llm_messages m2 ON m2.request_id = r.request_id AND m2.attempt = 2
             WHERE m1.session_id = ?1 AND r.stage = 'adjudicate' AND r.status = 'completed'
               AND r.result_message_id = m2.message_id AND m1.error_kind IS NOT NULL",
        )
        .unwrap()
        .query_map([&sid], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert!(
        !repaired.is_empty(),
        "the seed gives a gate failure then a pass"
    );
    for (item, p1, out1, p2, err1) in &repaired {
        assert!(
            p1.contains("Which release group and recording is this chart entry?")
                && !p1.contains("could not be used"),
            "{item}: attempt 1 is the normal prompt:\n{p1}"
        );
        assert!(
            p2.contains(&format!(
                "Your previous answer for chart entry {item} could not be used:"
            )),
            "{item}: attempt 2 is the repair prompt:\n{p2}"
        );
        assert!(
            p2.contains(out1.trim()),
            "{item}: the repair prompt shows the failed output {out1}:\n{p2}"
        );
        assert!(!err1.is_empty(), "{item}");
    }
    // Every first attempt is the normal prompt; no critic attempt is a repair.
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_messages m JOIN llm_requests r ON r.request_id = m.request_id
             WHERE m.session_id = ?1 AND (m.attempt = 1 OR r.stage = 'critic') AND m.user_prompt LIKE '%could not be used%'",
            [&sid]
        ),
        0
    );
}

/// 7. Every answer fails the gate (fault-matrix row S7): once the budget is
/// spent the item goes to review, with no suggestion and the raw answers
/// kept and shown; it can be rejected, not accepted. (Three items: from
/// four on, a stage whose first twelve answers all fail pauses the session
/// instead; see engine_run's a_gate_that_never_passes_pauses_the_session_early.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s7_a_spent_gate_budget_goes_to_review_with_the_answers_kept() {
    let m = mock(MockConfig {
        wrong_schema: 1.0,
        ..Default::default()
    })
    .await;
    let ws = example(Example::Critic, 3, |t| critic_toml(t, 2, None));
    let sid = completed(opts(&ws, &m)).await;
    let conn = ws.conn();
    check_complete(&conn, &sid);
    let res = results(&conn, &sid);
    assert_eq!(res.len(), 3);
    for (item, (outcome, confidence, _, note, error)) in &res {
        assert_eq!(outcome, "review", "{item}");
        assert_eq!(confidence, &None, "{item}");
        // The reason is in the error column too, for exports.
        let e = error.as_deref().unwrap_or_default();
        assert!(e.contains("after 2 answers failed the gate"), "{item}: {e}");
        let note = note.as_deref().unwrap_or_default();
        assert!(
            note.contains("stage adjudicate")
                && note.contains("after 2 answers failed the gate")
                && note.contains("nothing to accept"),
            "{item}: {note}"
        );
    }
    let reviews: Vec<(i64, String)> = conn
        .prepare("SELECT review_id, llm_suggestion_json FROM review_item WHERE session_id = ?1")
        .unwrap()
        .query_map([&sid], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(reviews.len(), 3, "one review item per item");
    assert!(reviews.iter().all(|(_, s)| s == "null"), "{reviews:?}");
    assert_eq!(
        count(
            &conn,
            "SELECT reviewed_count FROM llm_batch_session WHERE session_id = ?1",
            [&sid]
        ),
        3
    );
    // The card shows the raw answer of the stage that failed.
    use docket::ledger::console::ConsoleReads;
    use docket::ledger::review::ReviewDecisions;
    let ledger = ws.handle();
    let detail = ledger.review_detail(reviews[0].0).unwrap().unwrap();
    let adjudicate = detail
        .stages
        .iter()
        .find(|s| s.stage == "adjudicate")
        .expect("the failed stage in the card");
    assert_eq!(adjudicate.status, "error");
    assert!(
        adjudicate
            .raw_output
            .as_deref()
            .is_some_and(|o| !o.is_empty()),
        "{adjudicate:?}"
    );
    assert!(
        detail
            .routing_note
            .is_some_and(|n| n.contains("failed the gate"))
    );
    // Nothing to accept; a reject closes it and leaves the item undecided.
    let op = docket::review::Operator::new("tester", "tester@test");
    let accepted = ledger.accept(&[reviews[0].0], &op).unwrap();
    assert!(accepted.done.is_empty(), "{accepted:?}");
    assert!(
        accepted.skipped[0].1.contains("no answer passed the gate"),
        "{accepted:?}"
    );
    let rejected = ledger.reject(&[reviews[0].0], &op).unwrap();
    assert_eq!(rejected.done, vec![reviews[0].0]);
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM decision WHERE state = 'indeterminate'",
            []
        ),
        3,
        "no item decided"
    );
    let reqs: Vec<(String, String, i64, i64)> = conn
        .prepare(
            "SELECT r.item_id, r.status, r.gate_failures, r.attempt FROM llm_requests r
             JOIN session_request sr ON sr.request_id = r.request_id
             WHERE sr.session_id = ?1 AND sr.stage = 'adjudicate'",
        )
        .unwrap()
        .query_map([&sid], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(reqs.len(), 3);
    for (item, status, gate_failures, attempt) in &reqs {
        assert_eq!(status, "error", "{item}");
        assert_eq!(*gate_failures, 2, "{item}");
        assert_eq!(*attempt, 2, "{item}");
    }
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_messages m JOIN llm_requests r ON r.request_id = m.request_id
             WHERE m.session_id = ?1 AND r.stage = 'adjudicate' AND m.assistant_output IS NOT NULL
               AND m.assistant_output != '' AND m.attempt IN (1, 2)",
            [&sid]
        ),
        6,
        "both raw answers of every item are kept"
    );
    let critic = stage_states(&conn, &sid, "critic");
    assert!(critic.values().all(|s| s == "skipped"), "{critic:?}");
    assert_eq!(messages_by_stage(&conn, &sid).get("critic"), None);
    let s = m.stats();
    assert_eq!((s.requests, s.wrong_schema), (6, 6), "{s:?}");
    assert_eq!(
        run_stage(&conn, &sid, "adjudicate"),
        RunStage {
            total: 3,
            completed: 0,
            failed: 3,
            skipped: 0,
            state: "done".into()
        }
    );
    assert_eq!(run_stage(&conn, &sid, "critic").skipped, 3);
}

/// 8. Structured batching: a score answer that leaves criteria out gets
/// exactly those criteria asked one by one, merged into the stage output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn left_out_criteria_are_asked_one_by_one() {
    const ITEMS: i64 = 12;
    const PARTIAL: i64 = 4;
    let m = mock(MockConfig {
        omit_optional_first: PARTIAL as u32,
        ..Default::default()
    })
    .await;
    let ws = example(Example::JudgeGym, ITEMS as usize, |t| t);
    let sid = completed(opts(&ws, &m)).await;
    let conn = ws.conn();
    check_complete(&conn, &sid);
    assert_eq!(m.stats().partial_answers, PARTIAL as u64);
    let follow_ups: Vec<(String, String, String)> = conn
        .prepare(
            "SELECT item_id, stage, state FROM session_request WHERE session_id = ?1 AND stage LIKE 'score_gen:%'",
        )
        .unwrap()
        .query_map([&sid], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(follow_ups.len() as i64, 2 * PARTIAL, "{follow_ups:?}");
    let mut per_item: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (item, stage, state) in &follow_ups {
        assert_eq!(state, "passed", "{item} {stage}");
        per_item.entry(item).or_default().insert(stage);
    }
    assert_eq!(per_item.len() as i64, PARTIAL);
    const CRITERIA: [&str; 3] = ["title_match", "artist_match", "release_type"];
    let mut asked_alone: BTreeMap<&str, i64> = BTreeMap::new();
    for (item, stages) in &per_item {
        // The batched answer kept exactly one criterion (the first of the
        // schema as sent); the two it left out, and only those, were asked
        // on their own.
        let parsed: String = conn
            .query_row(
                "SELECT r.parsed_output_json FROM llm_requests r JOIN session_request sr ON sr.request_id = r.request_id
                 WHERE sr.session_id = ?1 AND sr.item_id = ?2 AND sr.stage = 'score_gen'",
                [&sid, &item.to_string()],
                |r| r.get(0),
            )
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&parsed).unwrap();
        let missing: BTreeSet<String> = CRITERIA
            .iter()
            .filter(|c| v.get(**c).is_none())
            .map(|c| format!("score_gen:{c}"))
            .collect();
        assert_eq!(missing.len(), 2, "{item}: one criterion kept: {parsed}");
        let asked: BTreeSet<String> = stages.iter().map(|s| s.to_string()).collect();
        assert_eq!(
            asked, missing,
            "{item}: exactly the criteria the answer left out"
        );
        for c in missing {
            *asked_alone
                .entry(CRITERIA.iter().find(|k| c.ends_with(*k)).unwrap())
                .or_default() += 1;
        }
    }
    // The stage's output has every criterion, for every item.
    for out in strings(
        &conn,
        "SELECT output_json FROM session_request WHERE session_id = ?1 AND stage = 'score_gen'",
        [&sid],
    ) {
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        for c in ["title_match", "artist_match", "release_type"] {
            assert!(v[c]["score"].is_number(), "{c} in {out}");
        }
    }
    assert_eq!(
        stage_states(&conn, &sid, "score_gen").len() as i64,
        ITEMS,
        "one score_gen row per item"
    );
    // Sends: one batched score per item, plus two per partial answer.
    let by_stage = messages_by_stage(&conn, &sid);
    let score_sends: i64 = by_stage
        .iter()
        .filter(|(s, _)| s.as_str() == "score_gen" || s.starts_with("score_gen:"))
        .map(|(_, n)| n)
        .sum();
    assert_eq!(score_sends, ITEMS + 2 * PARTIAL, "{by_stage:?}");
    for c in CRITERIA {
        assert_eq!(
            by_stage.get(&format!("score_gen:{c}")),
            asked_alone.get(c),
            "{c}: one send per item that left it out"
        );
    }
    let total: i64 = by_stage.values().sum();
    assert_eq!(m.stats().requests as i64, total);
    assert_eq!(total, 4 * ITEMS + 2 * PARTIAL);
}

/// 9. The structured-output schema goes to the provider with its
/// properties in the order the schema file lists them: a model writing
/// structured output follows that order (rationale before or after the
/// verdict), and the mock's `omit_optional_first` keeps the first one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schema_is_sent_in_the_order_it_was_written() {
    use axum::{Router, body::Bytes, extract::State, http::StatusCode, routing::post};
    use std::sync::{Arc, Mutex};
    type Seen = Arc<Mutex<Vec<String>>>;
    async fn handler(State(seen): State<Seen>, body: Bytes) -> (StatusCode, String) {
        seen.lock()
            .unwrap()
            .push(String::from_utf8_lossy(&body).into_owned());
        (
            StatusCode::UNAUTHORIZED,
            r#"{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#.into(),
        )
    }
    let seen: Seen = Arc::default();
    let app = Router::new()
        .route("/v1/chat/completions", post(handler))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let ws = example(Example::Critic, 2, |t| t);
    let o = RunOptions {
        base_url_override: Some(format!("http://{addr}/v1")),
        ..options(&ws)
    };
    let _ = tokio::time::timeout(RUN_LIMIT, run(o))
        .await
        .expect("the run ended in time");
    server.abort();
    let bodies = seen.lock().unwrap().clone();
    let body = bodies.first().expect("a request was sent");
    let props = body
        .find("\"properties\":{")
        .unwrap_or_else(|| panic!("no schema in {body}"));
    let at = |key: &str| {
        body[props..]
            .find(&format!("\"{key}\":"))
            .unwrap_or_else(|| panic!("no {key} in {body}"))
    };
    let order = ["crg_mbid", "rr_mbid", "confidence", "rationale"];
    let positions: Vec<usize> = order.iter().map(|k| at(k)).collect();
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "schemas/adjudicate.schema.json lists {order:?}; the request's schema has them at {positions:?}:\n{}",
        &body[props..]
    );
}

/// 5b. `--rerun-stage critic` in a session where some generators failed:
/// their items never reach the critic, and they still end with exactly one
/// outcome (review: the generator's answers all failed the gate), the
/// session completed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerun_stage_keeps_an_outcome_for_items_whose_generator_failed() {
    let m = mock(MockConfig {
        wrong_schema: 0.5,
        seed: 11,
        ..Default::default()
    })
    .await;
    let ws = example(Example::Critic, 30, |t| critic_toml(t, 2, Some(1)));
    let sid = completed(opts(&ws, &m)).await;
    let conn = ws.conn();
    check_complete(&conn, &sid);
    let failed: Vec<String> = strings(
        &conn,
        "SELECT item_id FROM session_request WHERE session_id = ?1 AND stage = 'adjudicate' AND state = 'failed'",
        [&sid],
    );
    assert!(!failed.is_empty(), "the seed fails some generators");
    let sent = m.stats().requests;
    m.set_config(MockConfig::default());
    let mut o = opts(&ws, &m);
    o.resume = Some(sid.clone());
    o.rerun_stage = Some("critic".into());
    let (report, lines) = tokio::time::timeout(RUN_LIMIT, run(o))
        .await
        .expect("the run ended in time");
    assert_eq!(report.end, RunEnd::Completed, "{}", lines.text());
    let conn = ws.conn();
    check_complete(&conn, &sid);
    let res = results(&conn, &sid);
    assert_eq!(res.len(), 30, "every item has its outcome again");
    for item in &failed {
        assert_eq!(res[item].0, "review", "{item}: row S7");
        assert_eq!(
            stage_states(&conn, &sid, "critic")[item],
            "skipped",
            "{item}"
        );
    }
    let passed = 30 - failed.len() as u64;
    assert_eq!(
        m.stats().requests,
        sent + passed,
        "the critic, for the passing items only"
    );
}
