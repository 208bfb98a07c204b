use std::path::Path;

use super::group::run;
use super::transaction::{Applied, apply_group};
use super::*;
use crate::db::{Connection, params};
use crate::{search_index, store};

/// A new ledger at `path` with session "s1" (one stage, no items).
fn ledger_with_session(path: &Path) -> Connection {
    let mut conn = Connection::Sqlite(crate::open(path).unwrap());
    store::create_session(
        &mut conn,
        &store::NewSession {
            session_id: "s1",
            config_snapshot_json: "{}",
            stages: &[store::NewStage::for_test("adjudicate", None)],
            estimated_tokens: 0,
            estimated_cost_usd: 0.0,
            max_cost_usd: None,
            item_ids: &[],
            profile: None,
        },
    )
    .unwrap();
    conn
}

fn event(message: &str) -> Queued {
    let op = WriteOp::Event {
        session_id: "s1".into(),
        level: "info",
        kind: "note",
        message: message.into(),
    };
    (op, None, None)
}

/// A group is applied straight when every operation succeeds, and again
/// with a savepoint each when one fails: the others still commit, and
/// nothing of the failed one stays.
#[test]
fn one_failing_operation_never_takes_its_group_down() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("docket.sqlite");
    let mut conn = ledger_with_session(&path);
    let mut search = search_index::Pacer::new();
    let events = |conn: &Connection| -> Vec<String> {
        let mut stmt = conn
            .prepare("SELECT message FROM session_event ORDER BY event_id")
            .unwrap();
        stmt.query_map(params![], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };

    let all_good = [event("a"), event("b")];
    let Applied::Results(results) = apply_group(&mut conn, &all_good, &mut search) else {
        panic!("no conflict on SQLite")
    };
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(events(&conn), ["a", "b"]);

    // An attempt of a request that does not exist breaks a foreign key.
    let orphan = WriteOp::Send(SendIntent {
        session_id: "s1".into(),
        request_id: 404,
        attempt: 1,
        client_request_id: "s1-404-1".into(),
        system_prompt: None,
        user_prompt: "hello".into(),
        evidence_hash: None,
    });
    let mixed = [event("c"), (orphan, None, None), event("d")];
    let Applied::Results(results) = apply_group(&mut conn, &mixed, &mut search) else {
        panic!("no conflict on SQLite")
    };
    assert!(results[0].is_ok() && results[2].is_ok(), "{results:?}");
    assert!(
        matches!(&results[1], Err(WriteError::Failed(m)) if m.contains("FOREIGN KEY")),
        "{results:?}"
    );
    assert_eq!(events(&conn), ["a", "b", "c", "d"]);
    let messages: i64 = conn
        .query_row("SELECT COUNT(*) FROM llm_messages", params![], |r| r.get(0))
        .unwrap();
    assert_eq!(messages, 0);
}

/// A request holds a provider slot while its intent waits, so intents
/// queued behind other writes commit first, in a transaction of their
/// own, and every sender still hears back.
#[test]
fn intents_commit_before_the_other_writes_of_their_group() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("docket.sqlite");
    let conn = ledger_with_session(&path);
    conn.execute_batch(
        "INSERT INTO decision (item_id, evidence_json, imported_at, updated_at)
                 VALUES ('i1', '{}', 0, 0);
             INSERT INTO llm_requests (request_id, item_id, stage, provider, model, request_version,
                 status, template_hash, params_hash, created_at, updated_at)
                 VALUES (7, 'i1', 'adjudicate', 'main', 'm', 1, 'pending', 't', 'p', 0, 0);",
    )
    .unwrap();
    // Triggers log each insert in the order the writer makes them.
    conn.execute_batch(
        "CREATE TABLE write_order (seq INTEGER PRIMARY KEY, what TEXT);
             CREATE TRIGGER intent_written AFTER INSERT ON llm_messages
                 BEGIN INSERT INTO write_order (what) VALUES ('intent ' || NEW.attempt); END;
             CREATE TRIGGER event_written AFTER INSERT ON session_event
                 BEGIN INSERT INTO write_order (what) VALUES ('event ' || NEW.message); END;",
    )
    .unwrap();
    let intent = |attempt: i64| {
        WriteOp::Send(SendIntent {
            session_id: "s1".into(),
            request_id: 7,
            attempt,
            client_request_id: format!("s1-7-{attempt}"),
            system_prompt: None,
            user_prompt: "hello".into(),
            evidence_hash: None,
        })
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let mut answers = Vec::new();
    for op in [event("a").0, intent(1), event("b").0, intent(2)] {
        let (reply, answer) = oneshot::channel();
        tx.send((op, None, Some(reply))).unwrap();
        answers.push(answer);
    }
    drop(tx);
    // All four are queued before the writer starts, so they form one
    // group; the writer returns once the channel is empty and closed.
    run(
        Connection::Sqlite(crate::open(&path).unwrap()),
        rx,
        &Health::default(),
    );
    for mut answer in answers {
        assert!(matches!(answer.try_recv(), Ok(Ok(()))));
    }
    let mut stmt = conn
        .prepare("SELECT what FROM write_order ORDER BY seq")
        .unwrap();
    let order: Vec<String> = stmt
        .query_map(params![], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(order, ["intent 1", "intent 2", "event a", "event b"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_gauges_events_and_controls_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("docket.sqlite");
    let conn = ledger_with_session(&path);
    let (writer, handle) = LedgerWriter::start(&path).unwrap();
    let hb = |live: Option<&str>| WriteOp::Heartbeat {
        session_id: "s1".into(),
        live_json: live.map(str::to_string),
        worker: None,
    };
    writer.write(hb(Some("{\"in_flight\":3}"))).await.unwrap();
    // A heartbeat without gauges keeps the last ones.
    writer.write(hb(None)).await.unwrap();
    writer
        .write(WriteOp::Event {
            session_id: "s1".into(),
            level: "warn",
            kind: "paused",
            message: "paused by operator".into(),
        })
        .await
        .unwrap();
    drop(writer);
    tokio::task::block_in_place(|| handle.join());
    let (live, hb_at): (Option<String>, Option<f64>) = conn
        .query_row(
            "SELECT live_json, heartbeat_at FROM llm_batch_session WHERE session_id = 's1'",
            params![],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(live.as_deref(), Some("{\"in_flight\":3}"));
    assert!(crate::now_ts() - hb_at.unwrap() < 5.0);
    let ev: (String, String, String, Option<String>) = conn
        .query_row(
            "SELECT level, kind, message, actor FROM session_event WHERE session_id = 's1'",
            params![],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .unwrap();
    assert_eq!(
        ev,
        (
            "warn".into(),
            "paused".into(),
            "paused by operator".into(),
            None
        )
    );

    // Controls: NULL tune columns are None; a negative one reads as unset.
    let c = store::session_controls(&conn, "s1").unwrap().unwrap();
    assert_eq!(c.desired_state, "running");
    assert_eq!(c.stop_after_stage, None);
    assert_eq!(c.tune, docket_model::live::Tune::default());
    assert_eq!(c.routing, (None, None), "no thresholds recorded");
    conn.execute(
        "UPDATE llm_batch_session SET desired_state = 'paused', stop_after_stage = 'adjudicate',
                 tune_rpm = 1200, tune_tpm = -5, tune_concurrency = 3 WHERE session_id = 's1'",
        params![],
    )
    .unwrap();
    let c = store::session_controls(&conn, "s1").unwrap().unwrap();
    assert_eq!(c.desired_state, "paused");
    assert_eq!(c.stop_after_stage.as_deref(), Some("adjudicate"));
    assert_eq!(
        c.tune,
        docket_model::live::Tune {
            rpm: Some(1200),
            tpm: None,
            concurrency: Some(3)
        }
    );
    // The routing the session records: its flags over its config, the
    // auto-accept raised to the confidence floor.
    conn.execute(
        r#"UPDATE llm_batch_session SET config_snapshot_json =
             '{"flags":{"auto_accept_threshold":0.8,"min_confidence":0.95},"config":{"routing":{"auto_accept_threshold":0.7,"review_threshold":0.5}}}'
           WHERE session_id = 's1'"#,
        params![],
    )
    .unwrap();
    let c = store::session_controls(&conn, "s1").unwrap().unwrap();
    assert_eq!(c.routing, (Some(0.5), Some(0.95)));
    assert_eq!(store::session_controls(&conn, "nope").unwrap(), None);
}
