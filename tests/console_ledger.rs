//! The console's reads (`ledger::console::ConsoleReads`), review decisions
//! (`ledger::review::ReviewDecisions`) and run controls
//! (`ledger::control::RunControls`) against a real ledger file, with
//! fixtures written as plain SQL the way the engine writes them.

use std::path::PathBuf;

use docket::control::{ControlError, Desired};
use docket::ledger::console::ConsoleReads;
use docket::ledger::control::RunControls;
use docket::ledger::now_ts;
use docket::ledger::review::ReviewDecisions;
use docket::review::{CLAIM_LEASE_SECS, Claim, Operator, ReviewError};
use docket::watch::{Level, ReviewQuery, Tune};
use rusqlite::{Connection, OptionalExtension, params};

const SNAPSHOT: &str = r#"{"config":{"stages":[{"name":"triage","provider":"mock"}]},"flags":{}}"#;

struct Ledger {
    _dir: tempfile::TempDir,
    path: PathBuf,
    /// The fixtures' connection: rows are written here as the engine would.
    conn: Connection,
    /// The console's handle on the same file: every read goes through it.
    db: docket::ledger::Ledger,
}

impl Ledger {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("docket.sqlite");
        let conn = docket::ledger::open(&path).expect("open ledger");
        let db = docket::ledger::Ledger::open(&path).expect("open the console's handle");
        Ledger {
            _dir: dir,
            path,
            conn,
            db,
        }
    }

    /// A new console handle, as a console in another process would have.
    fn fresh(&self) -> docket::ledger::Ledger {
        docket::ledger::Ledger::open(&self.path).expect("open a console handle")
    }

    /// A read-only console's handle.
    fn read_only(&self) -> docket::ledger::Ledger {
        docket::ledger::Ledger::open_read_only(&self.path).expect("read-only")
    }

    /// A second connection, as another process would have.
    fn reopen(&self) -> Connection {
        docket::ledger::open(&self.path).expect("reopen ledger")
    }

    fn item(&self, item_id: &str) {
        self.conn
            .execute(
                "INSERT INTO decision (item_id, evidence_json, imported_at, updated_at) VALUES (?1, ?2, 1, 1)",
                params![item_id, format!(r#"{{"title":"{item_id}","year":1999}}"#)],
            )
            .expect("insert decision");
    }

    fn session(&self, id: &str, started_at: f64, heartbeat_at: Option<f64>, state: &str) {
        self.conn
            .execute(
                "INSERT INTO llm_batch_session (session_id, started_at, total_count, config_snapshot_json, state,
                     heartbeat_at, updated_at)
                 VALUES (?1, ?2, 0, ?3, ?4, ?5, ?2)",
                params![id, started_at, SNAPSHOT, state, heartbeat_at],
            )
            .expect("insert session");
    }

    fn counters(&self, id: &str, total: u64, processed: u64, errors: u64) {
        self.conn
            .execute(
                "UPDATE llm_batch_session SET total_count = ?2, processed_count = ?3, error_count = ?4,
                     accepted_count = ?3 - ?4 WHERE session_id = ?1",
                params![id, total as i64, processed as i64, errors as i64],
            )
            .expect("update counters");
    }

    fn request(&self, item_id: &str, stage: &str, created_at: f64) -> i64 {
        self.conn
            .query_row(
                "INSERT INTO llm_requests (item_id, stage, provider, model, status, template_hash, params_hash,
                     created_at, updated_at)
                 VALUES (?1, ?2, 'mock', 'mock-1', 'pending', 't', 'p', ?3, ?3) RETURNING request_id",
                params![item_id, stage, created_at],
                |r| r.get(0),
            )
            .expect("insert request")
    }

    #[allow(clippy::too_many_arguments)]
    fn message(
        &self,
        request_id: i64,
        attempt: i64,
        session: &str,
        state: &str,
        finished_at: Option<f64>,
        http_status: Option<i64>,
        error_kind: Option<&str>,
        error_message: Option<&str>,
    ) -> i64 {
        self.conn
            .query_row(
                "INSERT INTO llm_messages (request_id, attempt, session_id, client_request_id, state, user_prompt,
                     http_status, error_kind, error_message, sent_at, finished_at)
                 VALUES (?1, ?2, ?3, ?3 || '-' || ?1 || '-' || ?2, ?4, 'prompt', ?5, ?6, ?7, ?8, ?9)
                 RETURNING message_id",
                params![
                    request_id,
                    attempt,
                    session,
                    state,
                    http_status,
                    error_kind,
                    error_message,
                    finished_at.unwrap_or(1.0) - 1.0,
                    finished_at
                ],
                |r| r.get(0),
            )
            .expect("insert message")
    }

    /// An answered attempt linked as its request's result.
    fn answer(&self, request_id: i64, session: &str, output: &str, tokens: (i64, i64), cost: f64) {
        let mid = self.message(
            request_id,
            1,
            session,
            "answered",
            Some(10.0),
            Some(200),
            None,
            None,
        );
        self.conn
            .execute(
                "UPDATE llm_messages SET assistant_output = ?2, finish_reason = 'stop', input_tokens = ?3,
                     output_tokens = ?4, cost_usd = ?5 WHERE message_id = ?1",
                params![mid, output, tokens.0, tokens.1, cost],
            )
            .expect("answer");
        self.conn
            .execute(
                "UPDATE llm_requests SET status = 'completed', attempt = 1, parsed_output_json = ?2,
                     result_message_id = ?3 WHERE request_id = ?1",
                params![request_id, output, mid],
            )
            .expect("link answer");
    }

    fn result(&self, session: &str, item_id: &str, outcome: &str, at: f64, error: Option<&str>) {
        self.conn
            .execute(
                "INSERT INTO llm_batch_result (session_id, item_id, processed_at, outcome, error_message, stage)
                 VALUES (?1, ?2, ?3, ?4, ?5, 'triage')",
                params![session, item_id, at, outcome, error],
            )
            .expect("insert result");
    }

    fn event(&self, session: &str, at: f64, level: &str, message: &str) {
        self.conn
            .execute(
                "INSERT INTO session_event (session_id, at, level, kind, message) VALUES (?1, ?2, ?3, 'state', ?4)",
                params![session, at, level, message],
            )
            .expect("insert event");
    }

    /// A pending review item, as the engine writes one for a 'review' outcome.
    fn review(
        &self,
        item_id: &str,
        session: &str,
        confidence: Option<f64>,
        rationale: &str,
        request_id: Option<i64>,
    ) -> i64 {
        self.conn
            .query_row(
                "INSERT INTO review_item (item_id, session_id, source, status, llm_suggestion_json, confidence,
                     rationale, model_id, request_id, created_at)
                 VALUES (?1, ?2, 'LLM_REVIEW', 'pending', ?3, ?4, ?5, 'mock-1', ?6, 1) RETURNING review_id",
                params![
                    item_id,
                    session,
                    format!(r#"{{"label":"match","item":"{item_id}"}}"#),
                    confidence,
                    rationale,
                    request_id
                ],
                |r| r.get(0),
            )
            .expect("insert review item")
    }

    /// An item with a request and a pending review item for it.
    fn reviewable(&self, item_id: &str, session: &str, confidence: f64) -> i64 {
        self.item(item_id);
        let rid = self.request(item_id, "triage", 1.0);
        self.review(item_id, session, Some(confidence), "looks right", Some(rid))
    }

    fn decision(&self, item_id: &str) -> Decision {
        decision(&self.conn, item_id)
    }

    fn review_status(&self, review_id: i64) -> (String, Option<String>, Option<f64>) {
        self.conn
            .query_row(
                "SELECT status, decided_by, decided_at FROM review_item WHERE review_id = ?1",
                params![review_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .expect("review status")
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Decision {
    state: String,
    answer: Option<String>,
    decided_by: Option<String>,
    decided_at: Option<f64>,
    confidence: Option<f64>,
    model_id: Option<String>,
    adjudication_id: Option<String>,
}

fn decision(conn: &Connection, item_id: &str) -> Decision {
    conn.query_row(
        "SELECT state, decided_answer_json, decided_by, decided_at, confidence, model_id, adjudication_id
         FROM decision WHERE item_id = ?1",
        params![item_id],
        |r| {
            Ok(Decision {
                state: r.get(0)?,
                answer: r.get(1)?,
                decided_by: r.get(2)?,
                decided_at: r.get(3)?,
                confidence: r.get(4)?,
                model_id: r.get(5)?,
                adjudication_id: r.get(6)?,
            })
        },
    )
    .expect("decision")
}

fn alice() -> Operator {
    Operator::new("alice", "alice@host-a:100")
}

fn bob() -> Operator {
    Operator::new("bob", "bob@host-b:200")
}

// ---------------------------------------------------------------- watch

#[test]
fn sessions_are_newest_first_and_live_only_with_a_fresh_heartbeat() {
    let l = Ledger::new();
    let now = now_ts();
    l.session("batch_old", 1000.0, None, "completed");
    l.session("batch_live", 3000.0, Some(now - 1.0), "running");
    l.session("batch_stale", 2000.0, Some(now - 60.0), "running");
    l.counters("batch_live", 10, 4, 1);

    let s = l.db.sessions().expect("sessions");
    let ids: Vec<&str> = s.iter().map(|s| s.session_id.as_str()).collect();
    assert_eq!(ids, ["batch_live", "batch_stale", "batch_old"]);
    let live: Vec<bool> = s.iter().map(|s| s.live).collect();
    assert_eq!(live, [true, false, false]);
    assert_eq!(
        (s[0].total, s[0].processed, s[0].errors, s[0].accepted),
        (10, 4, 1, 3)
    );
    assert_eq!(s[0].state, "running");
    assert_eq!(s[2].state, "completed");
}

#[test]
fn session_view_counts_in_flight_pending_stage_and_gauges() {
    let l = Ledger::new();
    let now = now_ts();
    l.session("s1", 1000.0, Some(now - 2.0), "running");
    l.session("s2", 1001.0, None, "running");
    l.counters("s1", 10, 3, 1);
    for i in 0..5 {
        l.item(&format!("i{i}"));
    }
    // Three attempts in flight in s1 (one a retry of a failed attempt), one
    // in s2, and closed attempts that must not count.
    let r0 = l.request("i0", "triage", 1.0);
    let r1 = l.request("i1", "triage", 1.0);
    let r2 = l.request("i2", "triage", 1.0);
    let r3 = l.request("i3", "triage", 1.0);
    let r4 = l.request("i4", "triage", 1.0);
    l.message(r0, 1, "s1", "sent", None, None, None, None);
    l.message(
        r1,
        1,
        "s1",
        "failed",
        Some(5.0),
        Some(500),
        Some("server"),
        Some("boom"),
    );
    l.message(r1, 2, "s1", "sent", None, None, None, None);
    l.message(r2, 1, "s1", "sent", None, None, None, None);
    l.message(r3, 1, "s1", "answered", Some(5.0), Some(200), None, None);
    l.message(r4, 1, "s2", "sent", None, None, None, None);
    l.conn
        .execute(
            "UPDATE llm_batch_session SET live_json = ?2, stop_after_stage = 'triage', tune_rpm = 120,
                 tune_concurrency = 4 WHERE session_id = ?1",
            params![
                "s1",
                r#"{"in_flight":3,"concurrency_limit":4,"rpm_limit":120,"rpm_used":55.5,"slow_reason":"429s","stage":"triage","eta_secs":30.0,"future_field":1}"#
            ],
        )
        .expect("live_json");

    let v = l.db.session_view("s1").expect("view").expect("s1 exists");
    assert_eq!(v.row.session_id, "s1");
    assert_eq!(v.in_flight, 3);
    assert_eq!(v.pending, 10 - 3 - 3);
    assert!(v.live);
    let age = v.heartbeat_age_secs.expect("heartbeat age");
    assert!((1.0..10.0).contains(&age), "{age}");
    assert_eq!(v.stop_after_stage.as_deref(), Some("triage"));
    assert_eq!(
        v.tune,
        Tune {
            rpm: Some(120),
            tpm: None,
            concurrency: Some(4)
        }
    );
    let g = v.gauges.expect("gauges parsed");
    assert_eq!(g.in_flight, 3);
    assert_eq!(g.concurrency_limit, 4);
    assert_eq!(g.rpm_used, 55.5);
    assert_eq!(g.slow_reason, "429s");
    assert_eq!(g.eta_secs, Some(30.0));
    assert_eq!(v.stages.len(), 1);
    let st = &v.stages[0];
    assert_eq!(st.name, "triage");
    assert_eq!((st.total, st.done, st.failed, st.in_flight), (10, 3, 1, 3));

    // No heartbeat, no gauges: not live, None (not an error).
    let v2 = l.db.session_view("s2").expect("view").expect("s2 exists");
    assert!(!v2.live);
    assert_eq!(v2.heartbeat_age_secs, None);
    assert!(v2.gauges.is_none());
    assert_eq!(v2.in_flight, 1);
    // More in flight than unprocessed never goes negative.
    assert_eq!(v2.pending, 0);

    for garbage in ["{not json", "[1,2]", r#"{"in_flight":"lots"}"#, ""] {
        l.conn
            .execute(
                "UPDATE llm_batch_session SET live_json = ?1 WHERE session_id = 's1'",
                params![garbage],
            )
            .expect("garbage");
        let v =
            l.db.session_view("s1")
                .expect("garbage never errors")
                .expect("s1");
        assert!(v.gauges.is_none(), "{garbage:?}");
    }

    // A snapshot without stages falls back to the default stage name.
    l.conn
        .execute(
            "UPDATE llm_batch_session SET config_snapshot_json = '{}' WHERE session_id = 's2'",
            [],
        )
        .expect("snapshot");
    let v2 = l.db.session_view("s2").expect("view").expect("s2");
    assert_eq!(v2.stages[0].name, "adjudicate");

    assert!(l.db.session_view("nope").expect("view").is_none());
}

#[test]
fn events_merge_three_sources_newest_first_and_are_sanitized() {
    let l = Ledger::new();
    l.session("s1", 1000.0, None, "running");
    l.session("other", 1000.0, None, "running");
    l.item("a");
    l.item("b");
    l.item("evil\u{1b}[2Jid");
    let ra = l.request("a", "triage", 1.0);
    let rb = l.request("b", "triage", 1.0);
    let re = l.request("evil\u{1b}[2Jid", "triage", 1.0);

    l.event("s1", 100.0, "info", "session started");
    l.message(
        ra,
        2,
        "s1",
        "failed",
        Some(200.0),
        Some(429),
        Some("rate_limited"),
        Some("slow down"),
    );
    l.event("s1", 300.0, "warn", "pause requested by review:alice");
    l.result("s1", "b", "error", 400.0, Some("gate failed 3 times"));
    l.message(
        rb,
        1,
        "s1",
        "ambiguous",
        Some(500.0),
        None,
        Some("ambiguous"),
        Some("no answer"),
    );
    l.event(
        "s1",
        600.0,
        "error",
        "stopped\u{1b}]0;pwned\u{7}: quota exhausted\n",
    );
    l.message(
        re,
        1,
        "s1",
        "failed",
        Some(650.0),
        Some(500),
        Some("server"),
        Some("bad\u{1b}[31m"),
    );
    // Not events: an answered attempt, an accepted result, another session.
    l.message(ra, 3, "s1", "answered", Some(700.0), Some(200), None, None);
    l.result("s1", "a", "accepted", 700.0, None);
    l.event("other", 800.0, "info", "other session");

    let ev = l.db.events("s1", 50).expect("events");
    let at: Vec<f64> = ev.iter().map(|e| e.at).collect();
    assert_eq!(at, [650.0, 600.0, 500.0, 400.0, 300.0, 200.0, 100.0]);
    let levels: Vec<Level> = ev.iter().map(|e| e.level).collect();
    assert_eq!(
        levels,
        [
            Level::Warn,
            Level::Error,
            Level::Warn,
            Level::Error,
            Level::Warn,
            Level::Warn,
            Level::Info
        ]
    );
    assert_eq!(
        ev[5].message,
        "item a attempt 2: http 429 rate_limited: slow down"
    );
    assert_eq!(ev[5].item_id.as_deref(), Some("a"));
    assert_eq!(ev[3].message, "item b: gate failed 3 times");
    assert_eq!(ev[3].item_id.as_deref(), Some("b"));
    assert_eq!(ev[2].message, "item b attempt 1: ambiguous: no answer");
    assert_eq!(ev[4].message, "pause requested by review:alice");
    assert_eq!(ev[4].item_id, None);
    for e in &ev {
        assert!(!e.message.chars().any(char::is_control), "{:?}", e.message);
        assert!(!e.kind.chars().any(char::is_control), "{:?}", e.kind);
        if let Some(id) = &e.item_id {
            assert!(!id.chars().any(char::is_control), "{id:?}");
        }
    }
    assert!(ev[1].message.starts_with("stopped"), "{}", ev[1].message);
    assert!(ev[1].message.contains("quota exhausted"));
    // The escape sequence goes whole, not just its ESC.
    assert!(ev[0].message.contains("evilid"), "{}", ev[0].message);

    // The limit applies to the merged list.
    let top = l.db.events("s1", 3).expect("events");
    assert_eq!(
        top.iter().map(|e| e.at).collect::<Vec<_>>(),
        [650.0, 600.0, 500.0]
    );
    assert!(l.db.events("s1", 0).expect("events").is_empty());
    assert!(l.db.events("nope", 10).expect("events").is_empty());
}

#[test]
fn review_page_orders_by_confidence_filters_and_pages() {
    let l = Ledger::new();
    l.session("s1", 1000.0, None, "completed");
    l.session("s2", 2000.0, None, "completed");
    for id in ["x1", "x2", "x3", "x4", "x5", "Needle-7", "x6"] {
        l.item(id);
    }
    let x1 = l.review("x1", "s1", Some(0.70), "plain", None);
    let x2 = l.review("x2", "s1", Some(0.90), "plain", None);
    let x3 = l.review("x3", "s2", None, "no score", None);
    let x4 = l.review("x4", "s2", Some(0.80), "Mentions a NEEDLE here", None);
    let x5 = l.review("x5", "s1", Some(0.90), "plain", None);
    let n7 = l.review("Needle-7", "s2", Some(0.60), "plain", None);
    let x6 = l.review("x6", "s1", Some(0.99), "plain", None);
    // Decided items are not in the queue.
    l.conn
        .execute(
            "UPDATE review_item SET status = 'accepted' WHERE review_id = ?1",
            params![x6],
        )
        .expect("decide x6");

    let all =
        l.db.review_page(&ReviewQuery {
            limit: 50,
            ..Default::default()
        })
        .expect("page");
    assert_eq!(all.total, 6);
    let ids: Vec<i64> = all.rows.iter().map(|r| r.review_id).collect();
    // 0.90 (two, by review id), 0.80, 0.70, 0.60, then no confidence.
    assert_eq!(ids, [x2, x5, x4, x1, n7, x3]);
    assert_eq!(all.rows[0].suggestion, r#"{"label":"match","item":"x2"}"#);
    assert_eq!(all.rows[0].model_id.as_deref(), Some("mock-1"));
    assert_eq!(all.rows[0].session_id.as_deref(), Some("s1"));
    assert_eq!(all.rows[5].confidence, None);

    // Paging: total counts every page; offset echoes.
    let page2 =
        l.db.review_page(&ReviewQuery {
            offset: 2,
            limit: 2,
            ..Default::default()
        })
        .expect("page 2");
    assert_eq!(page2.total, 6);
    assert_eq!(page2.offset, 2);
    assert_eq!(
        page2.rows.iter().map(|r| r.review_id).collect::<Vec<_>>(),
        [x4, x1]
    );
    let past =
        l.db.review_page(&ReviewQuery {
            offset: 10,
            limit: 2,
            ..Default::default()
        })
        .expect("past the end");
    assert_eq!(past.total, 6);
    assert!(past.rows.is_empty());

    // Case-insensitive, over item id and rationale.
    let needle =
        l.db.review_page(&ReviewQuery {
            filter: Some("nEeDlE".into()),
            limit: 50,
            ..Default::default()
        })
        .expect("filter");
    assert_eq!(needle.total, 2);
    assert_eq!(
        needle.rows.iter().map(|r| r.review_id).collect::<Vec<_>>(),
        [x4, n7]
    );
    // Over the suggestion JSON too; % and _ are plain characters.
    let by_json =
        l.db.review_page(&ReviewQuery {
            filter: Some(r#""item":"x5""#.into()),
            limit: 50,
            ..Default::default()
        })
        .expect("filter json");
    assert_eq!(
        by_json.rows.iter().map(|r| r.review_id).collect::<Vec<_>>(),
        [x5]
    );
    for literal in ["%", "_"] {
        let none =
            l.db.review_page(&ReviewQuery {
                filter: Some(literal.into()),
                limit: 50,
                ..Default::default()
            })
            .expect("literal");
        assert_eq!(none.total, 0, "{literal}");
    }
    // An empty filter is no filter.
    let empty =
        l.db.review_page(&ReviewQuery {
            filter: Some(String::new()),
            limit: 50,
            ..Default::default()
        })
        .expect("empty filter");
    assert_eq!(empty.total, 6);

    // One session only, with and without a filter.
    let s2 =
        l.db.review_page(&ReviewQuery {
            session: Some("s2".into()),
            limit: 50,
            ..Default::default()
        })
        .expect("session");
    assert_eq!(s2.total, 3);
    assert_eq!(
        s2.rows.iter().map(|r| r.review_id).collect::<Vec<_>>(),
        [x4, n7, x3]
    );
    let s1_needle =
        l.db.review_page(&ReviewQuery {
            session: Some("s1".into()),
            filter: Some("needle".into()),
            limit: 50,
            ..Default::default()
        })
        .expect("session + filter");
    assert_eq!(s1_needle.total, 0);
    assert!(s1_needle.rows.is_empty());

    // limit 0 is the default page.
    let default = l.db.review_page(&ReviewQuery::default()).expect("default");
    assert_eq!(default.rows.len(), 6);
}

#[test]
fn review_page_total_follows_new_items_and_decisions() {
    let l = Ledger::new();
    l.session("s1", 1000.0, None, "running");
    l.session("s2", 1000.0, None, "running");
    let queries = |filter: Option<&str>, session: Option<&str>| ReviewQuery {
        filter: filter.map(str::to_string),
        session: session.map(str::to_string),
        limit: 2,
        ..Default::default()
    };
    let total = |filter: Option<&str>, session: Option<&str>| {
        l.fresh()
            .review_page(&queries(filter, session))
            .expect("page")
            .total
    };
    let a = l.reviewable("a-hit", "s1", 0.9);
    let b = l.reviewable("b", "s1", 0.8);
    assert_eq!(total(None, None), 2);
    assert_eq!(total(Some("HIT"), None), 1);
    assert_eq!(total(None, Some("s2")), 0);

    // The engine appends review items while the console watches.
    let c = l.reviewable("c-hit", "s2", 0.7);
    l.reviewable("d", "s2", 0.6);
    assert_eq!(total(None, None), 4);
    assert_eq!(total(Some("hit"), None), 2);
    assert_eq!(total(Some("hit"), Some("s2")), 1);
    assert_eq!(total(None, Some("s2")), 2);

    // Decisions and undos take items out of the queue and back.
    l.db.accept(&[a, c], &alice()).expect("accept");
    assert_eq!(total(None, None), 2);
    assert_eq!(total(Some("hit"), None), 0);
    l.db.reject(&[b], &bob()).expect("reject");
    l.reviewable("e-hit", "s1", 0.5);
    assert_eq!(total(None, None), 2);
    assert_eq!(total(Some("hit"), None), 1);
    // One undo takes back alice's whole bulk accept: a and c are back.
    l.db.undo_last(&alice()).expect("undo").expect("undone");
    assert_eq!(total(None, None), 4);
    assert_eq!(total(Some("hit"), None), 3);
    assert_eq!(total(None, Some("s2")), 2);
    let page = l.db.review_page(&queries(None, None)).expect("page");
    assert_eq!(page.rows.len(), 2);
    assert_eq!(page.total, 4);
}

#[test]
fn review_page_shows_only_unexpired_claims() {
    let l = Ledger::new();
    l.session("s1", 1000.0, None, "completed");
    let a = l.reviewable("a", "s1", 0.9);
    let b = l.reviewable("b", "s1", 0.8);
    let c = l.reviewable("c", "s1", 0.7);
    let now = now_ts();
    l.conn
        .execute(
            "UPDATE review_item SET claimed_by = 'bob@host-b:200', claim_expires_at = ?2 WHERE review_id = ?1",
            params![a, now + 20.0],
        )
        .expect("live claim");
    l.conn
        .execute(
            "UPDATE review_item SET claimed_by = 'carol@host-c:300', claim_expires_at = ?2 WHERE review_id = ?1",
            params![b, now - 1.0],
        )
        .expect("expired claim");
    let page = l.db.review_page(&ReviewQuery::default()).expect("page");
    let claims: Vec<(i64, Option<&str>)> = page
        .rows
        .iter()
        .map(|r| (r.review_id, r.claimed_by.as_deref()))
        .collect();
    assert_eq!(claims, [(a, Some("bob@host-b:200")), (b, None), (c, None)]);
    let d = l.db.review_detail(a).expect("detail").expect("a");
    assert_eq!(d.claimed_by.as_deref(), Some("bob@host-b:200"));
    let d = l.db.review_detail(b).expect("detail").expect("b");
    assert_eq!(d.claimed_by, None);
}

#[test]
fn review_detail_shows_evidence_suggestion_and_every_stage() {
    let l = Ledger::new();
    l.session("s1", 1000.0, None, "completed");
    l.item("song-1");
    let triage = l.request("song-1", "triage", 1.0);
    let critic = l.request("song-1", "critic", 2.0);
    l.answer(
        triage,
        "s1",
        r#"{"label":"match","confidence":0.7}"#,
        (120, 30),
        0.002,
    );
    l.answer(critic, "s1", r#"{"agree":true}"#, (200, 10), 0.003);
    // A failed first attempt of the critic counts in its attempts.
    l.conn
        .execute(
            "UPDATE llm_messages SET attempt = 2 WHERE request_id = ?1",
            params![critic],
        )
        .expect("renumber");
    l.message(
        critic,
        1,
        "s1",
        "failed",
        Some(3.0),
        Some(500),
        Some("server"),
        Some("oops"),
    );
    let rid = l.review("song-1", "s1", Some(0.7), "raw \u{1b}[1mbold", Some(critic));

    let d = l.db.review_detail(rid).expect("detail").expect("exists");
    assert_eq!(d.review_id, rid);
    assert_eq!(d.item_id, "song-1");
    assert_eq!(d.session_id.as_deref(), Some("s1"));
    assert_eq!(d.status, "pending");
    assert_eq!(d.confidence, Some(0.7));
    // As stored: the renderer sanitizes.
    assert_eq!(d.rationale.as_deref(), Some("raw \u{1b}[1mbold"));
    assert!(
        d.evidence_json.contains('\n'),
        "pretty: {}",
        d.evidence_json
    );
    let ev: serde_json::Value = serde_json::from_str(&d.evidence_json).expect("evidence is JSON");
    assert_eq!(ev["title"], "song-1");
    let sug: serde_json::Value =
        serde_json::from_str(&d.suggestion_json).expect("suggestion is JSON");
    assert_eq!(sug["label"], "match");
    assert!(d.suggestion_json.contains('\n'));
    assert_eq!(d.decided_by, None);

    assert_eq!(d.stages.len(), 2);
    let t = &d.stages[0];
    assert_eq!(
        (
            t.stage.as_str(),
            t.provider.as_str(),
            t.model.as_str(),
            t.status.as_str()
        ),
        ("triage", "mock", "mock-1", "completed")
    );
    assert_eq!(t.attempts, 1);
    assert_eq!(
        t.raw_output.as_deref(),
        Some(r#"{"label":"match","confidence":0.7}"#)
    );
    assert_eq!(
        t.parsed_output_json.as_deref(),
        Some(r#"{"label":"match","confidence":0.7}"#)
    );
    assert_eq!(t.finish_reason.as_deref(), Some("stop"));
    assert_eq!((t.input_tokens, t.output_tokens), (120, 30));
    assert_eq!(t.cost_usd, 0.002);
    let c = &d.stages[1];
    assert_eq!(c.stage, "critic");
    assert_eq!(c.attempts, 2);
    assert_eq!(c.raw_output.as_deref(), Some(r#"{"agree":true}"#));
    assert_eq!((c.input_tokens, c.output_tokens), (200, 10));

    // A request with no answer yet has no output and zero tokens.
    l.item("song-2");
    let r2 = l.request("song-2", "triage", 1.0);
    let rid2 = l.review("song-2", "s1", None, "x", Some(r2));
    let d2 = l.db.review_detail(rid2).expect("detail").expect("exists");
    assert_eq!(d2.stages.len(), 1);
    assert_eq!(d2.stages[0].raw_output, None);
    assert_eq!(d2.stages[0].input_tokens, 0);
    assert_eq!(d2.stages[0].attempts, 0);

    assert!(l.db.review_detail(9999).expect("detail").is_none());
}

// ---------------------------------------------------------------- review

#[test]
fn two_operators_claims_leases_and_skips() {
    let l = Ledger::new();
    l.session("s1", 1000.0, None, "completed");
    let x = l.reviewable("x", "s1", 0.8);
    let y = l.reviewable("y", "s1", 0.7);
    let (a, b) = (alice(), bob());
    // Bob works from his own handle (another process).
    let bdb = l.fresh();

    assert_eq!(l.db.claim(x, &a).expect("claim"), Claim::Held);
    let until: f64 = l
        .conn
        .query_row(
            "SELECT claim_expires_at FROM review_item WHERE review_id = ?1",
            params![x],
            |r| r.get(0),
        )
        .expect("lease");
    let left = until - now_ts();
    assert!(
        left > CLAIM_LEASE_SECS - 5.0 && left <= CLAIM_LEASE_SECS,
        "{left}"
    );
    assert_eq!(
        bdb.claim(x, &b).expect("claim"),
        Claim::HeldByOther(a.claimant.clone())
    );
    // Alice renews her own claim.
    assert_eq!(l.db.claim(x, &a).expect("renew"), Claim::Held);
    // The same user in another console is someone else.
    let a2 = Operator::new("alice", "alice@host-a:999");
    assert!(matches!(
        l.db.claim(x, &a2).expect("claim"),
        Claim::HeldByOther(_)
    ));

    // Bob's bulk accept skips what Alice holds and does the rest.
    let applied = bdb.accept(&[x, y], &b).expect("accept");
    assert_eq!(applied.done, [y]);
    assert_eq!(applied.skipped.len(), 1);
    assert_eq!(applied.skipped[0].0, x);
    assert!(
        applied.skipped[0].1.contains(&a.claimant),
        "{}",
        applied.skipped[0].1
    );
    assert_eq!(l.review_status(x).0, "pending");
    assert_eq!(l.decision("x").state, "indeterminate");

    // Alice's lease runs out: Bob may claim, and Alice is then the other.
    l.conn
        .execute(
            "UPDATE review_item SET claim_expires_at = ?2 WHERE review_id = ?1",
            params![x, now_ts() - 0.5],
        )
        .expect("expire");
    assert_eq!(bdb.claim(x, &b).expect("claim"), Claim::Held);
    assert_eq!(
        l.db.claim(x, &a).expect("claim"),
        Claim::HeldByOther(b.claimant.clone())
    );
    // Releasing: only our own claims.
    assert!(!l.db.release(x, &a).expect("release"));
    assert!(bdb.release(x, &b).expect("release"));
    assert_eq!(l.db.claim(x, &a).expect("claim"), Claim::Held);
    // release_all drops Alice's claims and nobody else's.
    l.item("z");
    let z = l.review("z", "s1", Some(0.5), "r", None);
    assert_eq!(bdb.claim(z, &b).expect("claim"), Claim::Held);
    assert_eq!(l.db.release_all(&a).expect("release all"), 1);
    let holders: Vec<Option<String>> = [x, z]
        .iter()
        .map(|id| {
            l.conn
                .query_row(
                    "SELECT claimed_by FROM review_item WHERE review_id = ?1",
                    params![id],
                    |r| r.get(0),
                )
                .expect("holder")
        })
        .collect();
    assert_eq!(holders, [None, Some(b.claimant.clone())]);

    // Decided items cannot be claimed; unknown ones are an error.
    assert_eq!(l.db.claim(y, &a).expect("claim"), Claim::NotPending);
    assert!(matches!(
        l.db.claim(4242, &a),
        Err(ReviewError::NotFound(4242))
    ));
}

#[test]
fn accept_records_the_decision_as_auto_accept_would() {
    let l = Ledger::new();
    l.session("s1", 1000.0, None, "completed");
    l.item("x");
    let req = l.request("x", "triage", 1.0);
    let rid = l.review("x", "s1", Some(0.82), "close call", Some(req));
    assert_eq!(l.db.claim(rid, &alice()).expect("claim"), Claim::Held);

    let before = now_ts();
    let applied = l.db.accept(&[rid], &alice()).expect("accept");
    assert_eq!(applied.done, [rid]);
    assert!(applied.skipped.is_empty());

    let d = l.decision("x");
    assert_eq!(d.state, "decided");
    assert_eq!(d.answer.as_deref(), Some(r#"{"label":"match","item":"x"}"#));
    assert_eq!(d.decided_by.as_deref(), Some("review:alice"));
    assert_eq!(d.confidence, Some(0.82));
    assert_eq!(d.model_id.as_deref(), Some("mock-1"));
    // The engine records the request id as text.
    assert_eq!(d.adjudication_id, Some(req.to_string()));
    let at = d.decided_at.expect("decided_at");
    assert!(at >= before && at <= now_ts());
    let updated_at: f64 = l
        .conn
        .query_row(
            "SELECT updated_at FROM decision WHERE item_id = 'x'",
            [],
            |r| r.get(0),
        )
        .expect("updated_at");
    assert_eq!(updated_at, at);

    let (status, by, when) = l.review_status(rid);
    assert_eq!(status, "accepted");
    assert_eq!(by.as_deref(), Some("review:alice"));
    assert_eq!(when, Some(at));
    let claim: (Option<String>, Option<f64>) = l
        .conn
        .query_row(
            "SELECT claimed_by, claim_expires_at FROM review_item WHERE review_id = ?1",
            params![rid],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("claim");
    assert_eq!(claim, (None, None));

    let (action, actor, prev): (String, String, String) = l
        .conn
        .query_row(
            "SELECT action, actor, prev_decision_json FROM review_log WHERE review_id = ?1",
            params![rid],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .expect("log row");
    assert_eq!(
        (action.as_str(), actor.as_str()),
        ("accept", "review:alice")
    );
    let prev: serde_json::Value = serde_json::from_str(&prev).expect("prev is JSON");
    assert_eq!(prev["state"], "indeterminate");
    assert!(prev["decided_by"].is_null());

    // Accepting again is skipped, saying who decided.
    let again = l.db.accept(&[rid], &bob()).expect("accept");
    assert!(again.done.is_empty());
    assert!(
        again.skipped[0].1.contains("review:alice"),
        "{}",
        again.skipped[0].1
    );
}

#[test]
fn accept_never_overwrites_a_decision_made_elsewhere() {
    let l = Ledger::new();
    l.session("s1", 1000.0, None, "completed");
    let rid = l.reviewable("x", "s1", 0.8);
    l.conn
        .execute(
            "UPDATE decision SET state = 'decided', decided_answer_json = '{\"label\":\"other\"}',
                 decided_by = 'llm_auto_accept', decided_at = 5, adjudication_id = '77' WHERE item_id = 'x'",
            [],
        )
        .expect("auto-accepted elsewhere");
    let before = l.decision("x");
    let applied = l.db.accept(&[rid], &alice()).expect("accept");
    assert!(applied.done.is_empty());
    assert!(
        applied.skipped[0].1.contains("llm_auto_accept"),
        "{}",
        applied.skipped[0].1
    );
    assert_eq!(l.decision("x"), before);
    assert_eq!(l.review_status(rid).0, "pending");
}

#[test]
fn reject_closes_the_review_item_and_leaves_the_decision() {
    let l = Ledger::new();
    l.session("s1", 1000.0, None, "completed");
    let rid = l.reviewable("x", "s1", 0.6);
    let before = l.decision("x");
    let applied = l.db.reject(&[rid], &bob()).expect("reject");
    assert_eq!(applied.done, [rid]);
    assert_eq!(l.decision("x"), before);
    assert_eq!(before.state, "indeterminate");
    let (status, by, at) = l.review_status(rid);
    assert_eq!(status, "rejected");
    assert_eq!(by.as_deref(), Some("review:bob"));
    assert!(at.is_some());
    let action: String = l
        .conn
        .query_row(
            "SELECT action FROM review_log WHERE review_id = ?1",
            params![rid],
            |r| r.get(0),
        )
        .expect("log");
    assert_eq!(action, "reject");

    // Undo of a reject: pending again, decision still untouched.
    let u =
        l.db.undo_last(&bob())
            .expect("undo")
            .expect("something undone");
    assert_eq!(
        (u.review_id, u.item_id.as_str(), u.action.as_str()),
        (rid, "x", "reject")
    );
    assert_eq!(l.review_status(rid), ("pending".to_string(), None, None));
    assert_eq!(l.decision("x"), before);
}

#[test]
fn bulk_accept_with_one_already_decided() {
    let l = Ledger::new();
    l.session("s1", 1000.0, None, "completed");
    let a = l.reviewable("a", "s1", 0.9);
    let b = l.reviewable("b", "s1", 0.8);
    let c = l.reviewable("c", "s1", 0.7);
    assert_eq!(l.db.reject(&[b], &bob()).expect("reject").done, [b]);

    let applied = l.db.accept(&[a, b, c], &alice()).expect("accept");
    assert_eq!(applied.done, [a, c]);
    assert_eq!(applied.skipped.len(), 1);
    assert_eq!(applied.skipped[0].0, b);
    assert!(
        applied.skipped[0].1.contains("already decided"),
        "{}",
        applied.skipped[0].1
    );
    assert!(
        applied.skipped[0].1.contains("review:bob"),
        "{}",
        applied.skipped[0].1
    );
    assert_eq!(l.decision("a").state, "decided");
    assert_eq!(l.decision("b").state, "indeterminate");
    assert_eq!(l.decision("c").state, "decided");
    // Unknown ids are skipped too, not an error.
    let applied = l.db.accept(&[9999], &alice()).expect("accept");
    assert_eq!(applied.skipped.len(), 1);
}

#[test]
fn undo_after_accept_restores_the_decision_even_after_a_restart() {
    let l = Ledger::new();
    l.session("s1", 1000.0, None, "completed");
    let rid = l.reviewable("x", "s1", 0.8);
    let before = l.decision("x");
    l.db.accept(&[rid], &alice()).expect("accept");
    assert_eq!(l.decision("x").state, "decided");

    // A new process (restart): the undo stack is in the ledger.
    let conn2 = l.reopen();
    let db2 = l.fresh();
    // Bob has nothing to undo; Alice's decision is hers.
    assert_eq!(db2.undo_last(&bob()).expect("undo"), None);
    let u = db2.undo_last(&alice()).expect("undo").expect("undone");
    assert_eq!(
        (u.review_id, u.item_id.as_str(), u.action.as_str()),
        (rid, "x", "accept")
    );
    assert_eq!(decision(&conn2, "x"), before);
    assert_eq!(l.review_status(rid), ("pending".to_string(), None, None));

    let log: Vec<(i64, String, Option<i64>, Option<i64>)> = {
        let mut stmt = conn2
            .prepare("SELECT log_id, action, undoes_log_id, undone_by_log_id FROM review_log ORDER BY log_id")
            .expect("prepare");
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows")
    };
    assert_eq!(log.len(), 2);
    let (accept_id, undo_id) = (log[0].0, log[1].0);
    assert_eq!(log[0], (accept_id, "accept".into(), None, Some(undo_id)));
    assert_eq!(log[1], (undo_id, "undo".into(), Some(accept_id), None));

    // Nothing left to undo; the item can be decided afresh.
    assert_eq!(db2.undo_last(&alice()).expect("undo"), None);
    assert_eq!(db2.accept(&[rid], &bob()).expect("accept").done, [rid]);
}

#[test]
fn undo_restores_an_earlier_decision_exactly() {
    let l = Ledger::new();
    l.session("s1", 1000.0, None, "completed");
    let rid = l.reviewable("x", "s1", 0.8);
    // Earlier history on the decision row (values that must come back bit for bit).
    l.conn
        .execute(
            "UPDATE decision SET decided_answer_json = '{\"old\":1}', confidence = 0.123456789,
                 model_id = 'old-model', adjudication_id = 'old' WHERE item_id = 'x'",
            [],
        )
        .expect("history");
    let before = l.decision("x");
    l.db.accept(&[rid], &alice()).expect("accept");
    assert_ne!(l.decision("x"), before);
    l.db.undo_last(&alice()).expect("undo").expect("undone");
    assert_eq!(l.decision("x"), before);
}

#[test]
fn repeated_undo_walks_back() {
    let l = Ledger::new();
    l.session("s1", 1000.0, None, "completed");
    let a = l.reviewable("a", "s1", 0.9);
    let b = l.reviewable("b", "s1", 0.8);
    let c = l.reviewable("c", "s1", 0.7);
    l.db.accept(&[a], &alice()).expect("accept a");
    l.db.reject(&[b], &alice()).expect("reject b");
    // Bob's decision in between is not Alice's to undo.
    l.db.accept(&[c], &bob()).expect("accept c");

    let u1 = l.db.undo_last(&alice()).expect("undo").expect("one");
    assert_eq!((u1.review_id, u1.action.as_str()), (b, "reject"));
    let u2 = l.db.undo_last(&alice()).expect("undo").expect("two");
    assert_eq!((u2.review_id, u2.action.as_str()), (a, "accept"));
    assert_eq!(l.db.undo_last(&alice()).expect("undo"), None);

    assert_eq!(l.review_status(a).0, "pending");
    assert_eq!(l.review_status(b).0, "pending");
    assert_eq!(l.decision("a").state, "indeterminate");
    assert_eq!(l.review_status(c).0, "accepted");
    assert_eq!(l.decision("c").decided_by.as_deref(), Some("review:bob"));
}

#[test]
fn undo_is_refused_when_someone_else_decided_since() {
    let l = Ledger::new();
    l.session("s1", 1000.0, None, "completed");

    // 1. Alice accepted; the decision was then re-decided by someone else.
    let x = l.reviewable("x", "s1", 0.8);
    l.db.accept(&[x], &alice()).expect("accept");
    l.conn
        .execute(
            "UPDATE decision SET decided_answer_json = '{\"label\":\"other\"}', decided_by = 'review:bob',
                 decided_at = decided_at + 10 WHERE item_id = 'x'",
            [],
        )
        .expect("bob re-decides");
    let after_bob = l.decision("x");
    let err = l.db.undo_last(&alice()).expect_err("refused");
    assert!(matches!(err, ReviewError::UndoConflict { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("review:bob") && msg.contains('x'), "{msg}");
    // Nothing changed, and nothing was logged.
    assert_eq!(l.decision("x"), after_bob);
    assert_eq!(l.review_status(x).0, "accepted");
    let undos: i64 = l
        .conn
        .query_row(
            "SELECT COUNT(*) FROM review_log WHERE action = 'undo' OR undone_by_log_id IS NOT NULL",
            [],
            |r| r.get(0),
        )
        .expect("count");
    assert_eq!(undos, 0);

    // 2. Alice rejected; the item was reopened and Bob accepted it.
    let l = Ledger::new();
    l.session("s1", 1000.0, None, "completed");
    let y = l.reviewable("y", "s1", 0.8);
    l.db.reject(&[y], &alice()).expect("reject");
    l.conn
        .execute("UPDATE review_item SET status = 'pending', decided_by = NULL, decided_at = NULL WHERE review_id = ?1", params![y])
        .expect("reopen");
    assert_eq!(l.db.accept(&[y], &bob()).expect("accept").done, [y]);
    let err = l.db.undo_last(&alice()).expect_err("refused");
    assert!(err.to_string().contains("accepted by review:bob"), "{err}");
    assert_eq!(l.review_status(y).0, "accepted");
    assert_eq!(l.decision("y").decided_by.as_deref(), Some("review:bob"));
    // Bob's own undo still works.
    let u = l.db.undo_last(&bob()).expect("undo").expect("bob's");
    assert_eq!(u.review_id, y);
    assert_eq!(l.decision("y").state, "indeterminate");
}

/// A bulk decision is one decision: one undo takes every item of it back,
/// in one transaction, and the next undo walks on to the decision before.
#[test]
fn one_undo_takes_back_a_whole_bulk_decision() {
    let l = Ledger::new();
    l.session("s1", 1000.0, None, "completed");
    let ids: Vec<i64> = (0..6)
        .map(|i| l.reviewable(&format!("b{i}"), "s1", 0.9 - f64::from(i) * 0.01))
        .collect();
    let single = l.reviewable("single", "s1", 0.5);
    l.db.accept(&[single], &alice()).expect("accept one");
    // Bob's bulk decision in between is not Alice's to undo.
    let bobs = l.reviewable("bobs", "s1", 0.4);
    l.db.reject(&[bobs], &bob()).expect("bob rejects");
    // The bulk accept of three, then the bulk reject of the other three.
    assert_eq!(
        l.db.accept(&ids[..3], &alice())
            .expect("bulk accept")
            .done
            .len(),
        3
    );
    assert_eq!(
        l.db.reject(&ids[3..], &alice())
            .expect("bulk reject")
            .done
            .len(),
        3
    );

    let u =
        l.db.undo_last(&alice())
            .expect("undo")
            .expect("the bulk reject");
    assert_eq!(u.action, "reject");
    let mut back = u.review_ids.clone();
    back.sort_unstable();
    assert_eq!(back, ids[3..].to_vec());
    for &id in &ids[3..] {
        assert_eq!(l.review_status(id).0, "pending");
    }
    for &id in &ids[..3] {
        assert_eq!(
            l.review_status(id).0,
            "accepted",
            "the bulk accept is still there"
        );
    }
    let u =
        l.db.undo_last(&alice())
            .expect("undo")
            .expect("the bulk accept");
    assert_eq!((u.action.as_str(), u.review_ids.len()), ("accept", 3));
    for (i, &id) in ids[..3].iter().enumerate() {
        assert_eq!(l.review_status(id).0, "pending");
        assert_eq!(l.decision(&format!("b{i}")).state, "indeterminate");
    }
    let u =
        l.db.undo_last(&alice())
            .expect("undo")
            .expect("the single accept");
    assert_eq!(u.review_ids, vec![single]);
    assert_eq!(l.db.undo_last(&alice()).expect("undo"), None);
    assert_eq!(l.review_status(bobs).0, "rejected", "Bob's decision stands");
    // Every undo is logged against the entry it undid.
    let (undos, undone): (i64, i64) = l
        .conn
        .query_row(
            "SELECT (SELECT COUNT(*) FROM review_log WHERE action = 'undo'),
                    (SELECT COUNT(*) FROM review_log WHERE undone_by_log_id IS NOT NULL)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("count");
    assert_eq!((undos, undone), (7, 7));
}

/// A bulk decision with one item changed since by someone else is refused
/// whole: nothing of it is undone, and the error names the item.
#[test]
fn a_bulk_undo_is_refused_whole_when_one_item_changed_since() {
    let l = Ledger::new();
    l.session("s1", 1000.0, None, "completed");
    let ids: Vec<i64> = (0..3)
        .map(|i| l.reviewable(&format!("c{i}"), "s1", 0.8))
        .collect();
    l.db.accept(&ids, &alice()).expect("bulk accept");
    l.conn
        .execute(
            "UPDATE decision SET decided_by = 'review:bob', decided_at = decided_at + 10 WHERE item_id = 'c1'",
            [],
        )
        .expect("bob re-decides c1");
    let err = l.db.undo_last(&alice()).expect_err("refused");
    assert!(err.to_string().contains("c1"), "{err}");
    for &id in &ids {
        assert_eq!(l.review_status(id).0, "accepted", "nothing undone");
    }
    assert_eq!(l.decision("c0").decided_by.as_deref(), Some("review:alice"));
}

// ---------------------------------------------------------------- control

fn session_controls(
    conn: &Connection,
    id: &str,
) -> (
    String,
    Option<String>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
) {
    conn.query_row(
        "SELECT desired_state, stop_after_stage, tune_rpm, tune_tpm, tune_concurrency FROM llm_batch_session
         WHERE session_id = ?1",
        params![id],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
    )
    .expect("controls")
}

fn control_events(conn: &Connection, id: &str) -> Vec<(String, String, String, Option<String>)> {
    let mut stmt = conn
        .prepare("SELECT level, kind, message, actor FROM session_event WHERE session_id = ?1 ORDER BY event_id")
        .expect("prepare");
    stmt.query_map(params![id], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
    })
    .expect("query")
    .collect::<Result<_, _>>()
    .expect("rows")
}

#[test]
fn set_desired_writes_the_state_and_an_event() {
    let l = Ledger::new();
    l.session("run", 1000.0, Some(now_ts()), "running");
    l.session("done", 900.0, None, "completed");

    l.db.set_desired("run", Desired::Paused, "review:alice")
        .expect("pause");
    assert_eq!(session_controls(&l.conn, "run").0, "paused");
    // The engine's own reader sees it.
    assert_eq!(
        docket::ledger::store::desired_state(
            &docket::ledger::db::Connection::Sqlite(l.reopen()),
            "run"
        )
        .expect("read")
        .as_deref(),
        Some("paused")
    );
    l.db.set_desired("run", Desired::Running, "review:bob")
        .expect("resume");
    assert_eq!(session_controls(&l.conn, "run").0, "running");
    l.db.set_desired("run", Desired::Cancelled, "review:alice")
        .expect("cancel");
    assert_eq!(session_controls(&l.conn, "run").0, "cancelled");

    let ev = control_events(&l.conn, "run");
    assert_eq!(
        ev,
        [
            (
                "info".into(),
                "control".into(),
                "pause requested by review:alice".into(),
                Some("review:alice".into())
            ),
            (
                "info".into(),
                "control".into(),
                "resume requested by review:bob".into(),
                Some("review:bob".into())
            ),
            (
                "info".into(),
                "control".into(),
                "cancel requested by review:alice".into(),
                Some("review:alice".into())
            ),
        ]
    );
    // They show in the events pane, newest first.
    let pane = l.db.events("run", 10).expect("events");
    assert_eq!(pane[0].message, "cancel requested by review:alice");
    assert_eq!(pane[0].kind, "control");

    let err =
        l.db.set_desired("done", Desired::Paused, "review:alice")
            .expect_err("completed");
    assert!(matches!(err, ControlError::Completed(_)));
    assert!(err.to_string().contains("completed"), "{err}");
    assert_eq!(session_controls(&l.conn, "done").0, "running");
    assert!(control_events(&l.conn, "done").is_empty());

    let err =
        l.db.set_desired("batch_nope", Desired::Paused, "review:alice")
            .expect_err("unknown");
    assert!(matches!(err, ControlError::NoSession(_)));
    assert!(err.to_string().contains("batch_nope"), "{err}");
}

#[test]
fn retune_validates_and_leaves_unset_limits_alone() {
    let l = Ledger::new();
    l.session("run", 1000.0, Some(now_ts()), "running");
    l.session("done", 900.0, None, "completed");

    l.db.retune(
        "run",
        Tune {
            rpm: Some(120),
            tpm: Some(50_000),
            concurrency: Some(4),
        },
        "review:alice",
    )
    .expect("retune");
    assert_eq!(
        session_controls(&l.conn, "run"),
        ("running".into(), None, Some(120), Some(50_000), Some(4))
    );
    // None leaves a column as it is; 0 means no client limit.
    l.db.retune(
        "run",
        Tune {
            rpm: Some(0),
            ..Tune::default()
        },
        "review:bob",
    )
    .expect("retune");
    assert_eq!(
        session_controls(&l.conn, "run"),
        ("running".into(), None, Some(0), Some(50_000), Some(4))
    );
    let view = l.db.session_view("run").expect("view").expect("run");
    assert_eq!(
        view.tune,
        Tune {
            rpm: Some(0),
            tpm: Some(50_000),
            concurrency: Some(4)
        }
    );
    let ev = control_events(&l.conn, "run");
    assert_eq!(ev.len(), 2);
    assert!(
        ev[0]
            .2
            .starts_with("retune requested: rpm 120, tpm 50000, concurrency 4"),
        "{}",
        ev[0].2
    );
    assert_eq!(ev[0].3.as_deref(), Some("review:alice"));
    assert!(
        ev[1].2.starts_with("retune requested: rpm 0"),
        "{}",
        ev[1].2
    );

    // Refused, with nothing written.
    for bad in [
        Tune {
            concurrency: Some(0),
            ..Tune::default()
        },
        Tune {
            concurrency: Some(10_001),
            ..Tune::default()
        },
        Tune {
            rpm: Some(5),
            concurrency: Some(0),
            ..Tune::default()
        },
        Tune::default(),
    ] {
        let err =
            l.db.retune("run", bad, "review:alice")
                .expect_err("invalid");
        assert!(
            matches!(err, ControlError::InvalidTune(_)),
            "{bad:?}: {err}"
        );
    }
    assert_eq!(
        session_controls(&l.conn, "run"),
        ("running".into(), None, Some(0), Some(50_000), Some(4))
    );
    assert_eq!(control_events(&l.conn, "run").len(), 2);
    // The bounds themselves are fine.
    for c in [1, 10_000] {
        l.db.retune(
            "run",
            Tune {
                concurrency: Some(c),
                ..Tune::default()
            },
            "review:alice",
        )
        .expect("in range");
        assert_eq!(session_controls(&l.conn, "run").4, Some(c as i64));
    }

    let ok = Tune {
        rpm: Some(10),
        ..Tune::default()
    };
    assert!(matches!(
        l.db.retune("done", ok, "review:alice"),
        Err(ControlError::Completed(_))
    ));
    assert!(matches!(
        l.db.retune("nope", ok, "review:alice"),
        Err(ControlError::NoSession(_))
    ));
}

#[test]
fn stop_after_stage_names_the_current_stage() {
    let l = Ledger::new();
    l.session("run", 1000.0, Some(now_ts()), "running");
    l.session("bare", 1000.0, Some(now_ts()), "paused");
    l.session("done", 900.0, None, "completed");
    l.conn
        .execute(
            "UPDATE llm_batch_session SET config_snapshot_json = '{}' WHERE session_id = 'bare'",
            [],
        )
        .expect("bare snapshot");

    // From the config snapshot.
    let stage = l.db.stop_after_stage("run", "review:alice").expect("stop");
    assert_eq!(stage, "triage");
    assert_eq!(
        session_controls(&l.conn, "run").1.as_deref(),
        Some("triage")
    );
    let ev = control_events(&l.conn, "run");
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].1, "control");
    assert!(
        ev[0].2.contains("triage") && ev[0].2.contains("review:alice"),
        "{}",
        ev[0].2
    );

    // The engine's own word wins when it has written one.
    l.conn
        .execute("UPDATE llm_batch_session SET live_json = '{\"stage\":\"critic\"}' WHERE session_id = 'run'", [])
        .expect("live");
    assert_eq!(
        l.db.stop_after_stage("run", "review:bob").expect("stop"),
        "critic"
    );
    assert_eq!(
        session_controls(&l.conn, "run").1.as_deref(),
        Some("critic")
    );
    // An empty stage in the gauges does not count.
    l.conn
        .execute(
            "UPDATE llm_batch_session SET live_json = '{\"stage\":\"\"}' WHERE session_id = 'run'",
            [],
        )
        .expect("live");
    assert_eq!(
        l.db.stop_after_stage("run", "review:bob").expect("stop"),
        "triage"
    );

    // No stages configured: the default stage.
    assert_eq!(
        l.db.stop_after_stage("bare", "review:alice").expect("stop"),
        "adjudicate"
    );
    let view = l.db.session_view("bare").expect("view").expect("bare");
    assert_eq!(view.stop_after_stage.as_deref(), Some("adjudicate"));

    assert!(matches!(
        l.db.stop_after_stage("done", "review:alice"),
        Err(ControlError::Completed(_))
    ));
    assert!(matches!(
        l.db.stop_after_stage("nope", "review:alice"),
        Err(ControlError::NoSession(_))
    ));
    let none: Option<String> = l
        .conn
        .query_row(
            "SELECT stop_after_stage FROM llm_batch_session WHERE session_id = 'done'",
            [],
            |r| r.get(0),
        )
        .optional()
        .expect("read")
        .flatten();
    assert_eq!(none, None);
}

/// Since migration 0007 a new review item waits in `review_search_pending`
/// until the writer indexes a batch of them (`ledger::search_index`): a
/// filter finds it while it waits and after, through text updates and
/// deletes in either state, the page's total agrees, and FTS5's own check
/// holds at every step (its content check whenever nothing waits).
#[test]
fn the_review_filter_finds_items_waiting_for_the_index_and_indexed_ones() {
    let l = Ledger::new();
    l.session("s1", 1.0, None, "completed");
    let page = |f: &str| {
        let p =
            l.db.review_page(&ReviewQuery {
                filter: Some(f.into()),
                limit: 50,
                ..Default::default()
            })
            .expect("filter");
        (
            p.rows.iter().map(|r| r.item_id.clone()).collect::<Vec<_>>(),
            p.total,
        )
    };
    // Review texts never change in use, so the queue's count cache does not
    // watch for it: totals are checked before the texts change below.
    let counted = |f: &str| {
        let (ids, total) = page(f);
        assert_eq!(total as usize, ids.len(), "total for {f:?}");
        ids
    };
    let page = |f: &str| page(f).0;
    let waiting = || -> i64 {
        l.conn
            .query_row("SELECT COUNT(*) FROM review_search_pending", [], |r| {
                r.get(0)
            })
            .expect("waiting")
    };
    // FTS5's check of its own structure; with nothing waiting, also of its
    // content against the table (rank 1), which rows still waiting fail.
    let index_matches_table = || {
        let content = i64::from(waiting() == 0);
        l.conn
            .execute(
                "INSERT INTO review_search(review_search, rank) VALUES ('integrity-check', ?1)",
                [content],
            )
            .expect("the index matches its table");
    };

    l.item("alpha-1");
    let a = l.review("alpha-1", "s1", Some(0.7), "Venue was Wembley", None);
    assert_eq!(waiting(), 1);
    assert_eq!(counted("wembley"), ["alpha-1"], "found while it waits");
    assert_eq!(counted("EMBLE"), ["alpha-1"], "a substring, any case");
    index_matches_table();
    assert_eq!(
        docket::ledger::search_index::catch_up(&docket::ledger::db::Connection::Sqlite(l.reopen()))
            .unwrap(),
        1
    );
    assert_eq!(waiting(), 0);
    index_matches_table();
    assert_eq!(counted("wembley"), ["alpha-1"], "found in the index");

    // One indexed, one waiting: both found, counted once each.
    l.item("beta-2");
    let b = l.review("beta-2", "s1", Some(0.6), "Venue was Hyde Park", None);
    assert_eq!(counted("venue"), ["alpha-1", "beta-2"]);
    assert_eq!(counted("hyde park"), ["beta-2"]);

    // Text changed in either state: the new text is found, the old is not.
    for (id, text) in [(a, "Venue was Glastonbury"), (b, "Venue was Isle of Wight")] {
        l.conn
            .execute(
                "UPDATE review_item SET rationale = ?2 WHERE review_id = ?1",
                rusqlite::params![id, text],
            )
            .unwrap();
    }
    assert!(page("wembley").is_empty());
    assert!(page("hyde park").is_empty());
    assert_eq!(page("glaston"), ["alpha-1"]);
    assert_eq!(page("isle of"), ["beta-2"]);
    index_matches_table();

    // Deleted in either state: gone, and nothing is left waiting.
    for id in [a, b] {
        l.conn
            .execute("DELETE FROM review_item WHERE review_id = ?1", [id])
            .unwrap();
    }
    assert!(page("venue").is_empty());
    assert_eq!(waiting(), 0);
    index_matches_table();
    assert_eq!(
        docket::ledger::search_index::catch_up(&docket::ledger::db::Connection::Sqlite(l.reopen()))
            .unwrap(),
        0
    );

    // A reused id (the deleted row was the newest) waits again, as new.
    l.item("gamma-3");
    l.review("gamma-3", "s1", Some(0.5), "Venue was Wembley", None);
    assert_eq!(waiting(), 1);
    assert_eq!(page("wembley"), ["gamma-3"]);
    assert_eq!(
        docket::ledger::search_index::catch_up(&docket::ledger::db::Connection::Sqlite(l.reopen()))
            .unwrap(),
        1
    );
    assert_eq!(page("wembley"), ["gamma-3"]);
    index_matches_table();
}

/// The filter's index (migration 0003) follows inserts, text updates and
/// deletes; filters of one or two characters, which have no trigram, still
/// match as substrings.
#[test]
fn the_review_filter_index_follows_every_change() {
    let l = Ledger::new();
    l.session("s1", 1.0, None, "completed");
    let q = |f: &str| {
        l.db.review_page(&ReviewQuery {
            filter: Some(f.into()),
            limit: 50,
            ..Default::default()
        })
        .expect("filter")
        .rows
        .iter()
        .map(|r| r.item_id.clone())
        .collect::<Vec<_>>()
    };
    l.item("alpha-1");
    let a = l.review("alpha-1", "s1", Some(0.7), "Venue was Wembley", None);
    assert_eq!(q("wembley"), ["alpha-1"]);
    assert_eq!(q("EMBLE"), ["alpha-1"], "a substring, any case");
    // Inserted after: found.
    l.item("beta-2");
    l.review("beta-2", "s1", Some(0.6), "Venue was Hyde Park", None);
    assert_eq!(q("venue"), ["alpha-1", "beta-2"]);
    // Text changed: the new text is found, the old is not.
    l.conn
        .execute(
            "UPDATE review_item SET rationale = 'Venue was Glastonbury' WHERE review_id = ?1",
            [a],
        )
        .unwrap();
    assert!(q("wembley").is_empty());
    assert_eq!(q("glaston"), ["alpha-1"]);
    // Short filters: no trigram, still a substring.
    assert_eq!(q("-2"), ["beta-2"]);
    assert_eq!(q("a"), ["alpha-1", "beta-2"]);
    // Deleted: gone from the index too.
    l.conn
        .execute("DELETE FROM review_item WHERE review_id = ?1", [a])
        .unwrap();
    assert!(q("glaston").is_empty());
    // FTS5's own check fails (an error) when the index and the table differ.
    l.conn
        .execute(
            "INSERT INTO review_search(review_search) VALUES ('integrity-check')",
            [],
        )
        .expect("the index matches its table");
}

// ---------------------------------------------------------------- provider batches

/// A provider_batch row as the engine writes it; returns its batch_id.
#[allow(clippy::too_many_arguments)]
fn provider_batch(
    conn: &Connection,
    tag: &str,
    session: &str,
    state: &str,
    provider_batch_id: Option<&str>,
    counts: (i64, i64, i64),
    created_at: f64,
    next_poll_at: Option<f64>,
) -> i64 {
    conn.query_row(
        "INSERT INTO provider_batch (tag, session_id, stage, provider, provider_kind, model, state,
             provider_batch_id, request_count, input_bytes, ingested_count, failed_count,
             created_at, next_poll_at, updated_at)
         VALUES (?1, ?2, 'triage', 'openai-main', 'openai', 'gpt-4o-mini', ?3, ?4, ?5, 1000, ?6, ?7,
             ?8, ?9, ?8)
         RETURNING batch_id",
        params![
            tag,
            session,
            state,
            provider_batch_id,
            counts.0,
            counts.1,
            counts.2,
            created_at,
            next_poll_at
        ],
        |r| r.get(0),
    )
    .expect("insert provider_batch")
}

#[test]
fn provider_batches_open_first_newest_first_with_a_summary() {
    let l = Ledger::new();
    l.session("s1", 100.0, None, "running");
    l.session("s2", 200.0, None, "running");
    let c = &l.conn;
    // Ingested ones are finished with: listed after every open one, however new.
    let old_done = provider_batch(
        c,
        "t-old",
        "s1",
        "ingested",
        Some("batch_old"),
        (50, 50, 0),
        1000.0,
        None,
    );
    let new_done = provider_batch(
        c,
        "t-new",
        "s1",
        "ingested",
        Some("batch_new"),
        (10, 10, 1),
        1900.0,
        None,
    );
    let running = provider_batch(
        c,
        "t-run",
        "s1",
        "in_progress",
        Some("batch_run"),
        (300, 100, 2),
        1500.0,
        Some(1510.0),
    );
    let unknown = provider_batch(c, "t-unk", "s1", "unknown", None, (40, 0, 0), 1700.0, None);
    let creating = provider_batch(
        c,
        "t-sub",
        "s1",
        "submitting",
        None,
        (200, 0, 0),
        1800.0,
        None,
    );
    let finishing = provider_batch(
        c,
        "t-fin",
        "s1",
        "finalizing",
        Some("batch_fin"),
        (60, 70, 0),
        1600.0,
        Some(1620.0),
    );
    // Another session's batch is never shown.
    provider_batch(
        c,
        "t-other",
        "s2",
        "in_progress",
        Some("batch_other"),
        (999, 0, 0),
        1950.0,
        Some(2000.0),
    );
    c.execute(
        "UPDATE provider_batch SET error_message = ?2, cancel_requested_at = 1650.0,
             quarantined_count = 3, completed_count = 99, poll_count = 7, submitted_at = 1501.0,
             last_polled_at = 1505.0
         WHERE batch_id = ?1",
        params![running, "\u{1b}[2Jboom\u{1b}]0;t\u{7} from provider"],
    )
    .expect("error message");

    let rows = l.db.provider_batches("s1", 50).expect("batches");
    let ids: Vec<i64> = rows.iter().map(|b| b.batch_id).collect();
    assert_eq!(
        ids,
        vec![creating, unknown, finishing, running, new_done, old_done]
    );
    let states: Vec<&str> = rows.iter().map(|b| b.state.as_str()).collect();
    assert_eq!(
        states,
        vec![
            "submitting",
            "unknown",
            "finalizing",
            "in_progress",
            "ingested",
            "ingested"
        ]
    );

    let r = &rows[3];
    assert_eq!(r.tag, "t-run");
    assert_eq!(r.stage, "triage");
    assert_eq!(r.provider, "openai-main");
    assert_eq!(r.provider_kind, "openai");
    assert_eq!(r.model, "gpt-4o-mini");
    assert_eq!(r.provider_batch_id.as_deref(), Some("batch_run"));
    assert_eq!(
        (
            r.request_count,
            r.ingested_count,
            r.failed_count,
            r.completed_count
        ),
        (300, 100, 2, 99)
    );
    assert_eq!((r.quarantined_count, r.poll_count), (3, 7));
    assert_eq!(r.created_at, Some(1500.0));
    assert_eq!(r.submitted_at, Some(1501.0));
    assert_eq!(r.last_polled_at, Some(1505.0));
    assert_eq!(r.next_poll_at, Some(1510.0));
    assert_eq!(r.cancel_requested_at, Some(1650.0));
    assert_eq!(r.ended_at, None);
    // The provider's text arrives sanitized: no escape sequence survives.
    assert_eq!(r.error_message.as_deref(), Some("boom from provider"));
    assert_eq!(rows[0].provider_batch_id, None, "no id while submitting");
    assert_eq!(rows[0].error_message, None);

    // The limit keeps the open ones.
    let two = l.db.provider_batches("s1", 2).expect("limited");
    assert_eq!(
        two.iter().map(|b| b.batch_id).collect::<Vec<_>>(),
        vec![creating, unknown]
    );
    assert!(l.db.provider_batches("s1", 0).expect("zero").is_empty());
    assert!(l.db.provider_batches("nope", 10).expect("none").is_empty());

    let s = l.db.provider_batch_summary("s1").expect("summary");
    assert_eq!(s.total, 6);
    assert_eq!(s.ingested, 2);
    assert_eq!(
        s.open,
        vec![
            ("submitting".to_string(), 1),
            ("in_progress".to_string(), 1),
            ("finalizing".to_string(), 1),
            ("unknown".to_string(), 1),
        ]
    );
    assert_eq!(s.open_count(), 4);
    assert_eq!(s.in_state("unknown"), 1);
    assert_eq!(s.in_state("ingested"), 2);
    // 200 + (300 - 100) + 40 + max(60 - 70, 0): ingested batches do not count.
    assert_eq!(s.lines_waiting, 440);
    let other = l.db.provider_batch_summary("s2").expect("other");
    assert_eq!((other.total, other.lines_waiting), (1, 999));
    assert_eq!(
        l.db.provider_batch_summary("nope").expect("empty"),
        Default::default()
    );

    // The same from a read-only connection (a read-only console).
    let ro = l.read_only();
    assert_eq!(ro.provider_batches("s1", 50).expect("ro batches"), rows);
    assert_eq!(ro.provider_batch_summary("s1").expect("ro summary"), s);
}

#[test]
fn provider_batches_survive_odd_ledger_content() {
    let l = Ledger::new();
    l.session("s1", 100.0, None, "running");
    let c = &l.conn;
    let id = provider_batch(
        c,
        "t-odd",
        "s1",
        "in_progress",
        Some("b"),
        (5, 9, 0),
        1000.0,
        Some(1.0),
    );
    // What another version or a hand edit might leave: any type SQLite
    // accepts in a column, negative counts, an infinite time.
    c.execute_batch(&format!(
        "UPDATE provider_batch SET request_count = 'many', ingested_count = -5, failed_count = 2.7,
             created_at = 'yesterday', next_poll_at = 1e308 * 10, cancel_requested_at = X'00',
             error_message = '   ', model = 42 WHERE batch_id = {id};"
    ))
    .expect("odd values");
    let rows = l.db.provider_batches("s1", 10).expect("reads");
    let r = &rows[0];
    assert_eq!(r.request_count, 0);
    assert_eq!(r.ingested_count, 0);
    assert_eq!(r.failed_count, 2);
    assert_eq!(r.created_at, None);
    assert_eq!(r.next_poll_at, None, "infinity is not a time");
    assert_eq!(r.cancel_requested_at, None);
    assert_eq!(r.error_message, None, "a blank error is no error");
    assert_eq!(r.model, "42");
    let s = l.db.provider_batch_summary("s1").expect("summary");
    assert_eq!((s.total, s.open_count()), (1, 1));
}

#[test]
fn provider_batches_on_a_ledger_without_the_table() {
    // A ledger from before migration 0004, opened read-only, is never
    // migrated: it has no batches rather than an error.
    let l = Ledger::new();
    l.session("s1", 100.0, None, "running");
    l.conn
        .execute_batch("DROP TABLE provider_batch_quarantine; DROP TABLE provider_batch_item; DROP TABLE provider_batch;")
        .expect("drop");
    let ro = l.read_only();
    assert!(ro.provider_batches("s1", 10).expect("rows").is_empty());
    assert_eq!(ro.provider_batch_summary("s1").expect("summary").total, 0);
}

// ---------------------------------------------------------------- workers

/// A worker's row as the work queue writes it.
struct Worker<'a> {
    id: &'a str,
    session: &'a str,
    host: &'a str,
    started_at: f64,
    heartbeat_at: f64,
    ended_at: Option<f64>,
    claims: i64,
    requests_per_sec: f64,
    orphaned: i64,
}

fn worker(conn: &Connection, w: &Worker) {
    conn.execute(
        "INSERT INTO session_worker (worker_id, session_id, user_name, host, pid, started_at,
             heartbeat_at, ended_at, claims, sent, requests_per_sec, orphaned)
         VALUES (?1, ?2, 'alice', ?3, 4242, ?4, ?5, ?6, ?7, 100, ?8, ?9)",
        params![
            w.id,
            w.session,
            w.host,
            w.started_at,
            w.heartbeat_at,
            w.ended_at,
            w.claims,
            w.requests_per_sec,
            w.orphaned
        ],
    )
    .expect("insert session_worker");
}

#[test]
fn workers_are_newest_first_and_alive_only_with_a_fresh_heartbeat() {
    let l = Ledger::new();
    l.session("s1", 100.0, None, "running");
    l.session("s2", 100.0, None, "running");
    let now = now_ts();
    let base = Worker {
        id: "",
        session: "s1",
        host: "build-01",
        started_at: 0.0,
        heartbeat_at: now - 1.0,
        ended_at: None,
        claims: 0,
        requests_per_sec: 0.0,
        orphaned: 0,
    };
    worker(
        &l.conn,
        &Worker {
            id: "alice@build-01:11#a",
            started_at: 1000.0,
            claims: 40,
            requests_per_sec: 12.5,
            ..base
        },
    );
    // No heartbeat for ten minutes: gone, though it never said goodbye.
    worker(
        &l.conn,
        &Worker {
            id: "alice@build-02:22#b",
            host: "build-02",
            started_at: 2000.0,
            heartbeat_at: now - 600.0,
            claims: 3,
            ..base
        },
    );
    // Let go of the session a moment ago: gone at once.
    worker(
        &l.conn,
        &Worker {
            id: "alice@build-03:33#c",
            host: "build-03",
            started_at: 3000.0,
            ended_at: Some(now - 0.5),
            orphaned: 2,
            ..base
        },
    );
    worker(
        &l.conn,
        &Worker {
            id: "bob@elsewhere:44#d",
            session: "s2",
            started_at: 4000.0,
            ..base
        },
    );

    let w = l.db.workers("s1").expect("workers");
    let ids: Vec<&str> = w.iter().map(|w| w.worker_id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "alice@build-03:33#c",
            "alice@build-02:22#b",
            "alice@build-01:11#a"
        ]
    );
    let alive: Vec<bool> = w.iter().map(|w| w.alive).collect();
    assert_eq!(alive, [false, false, true]);
    let live = &w[2];
    assert_eq!(live.host, "build-01");
    assert_eq!((live.claims, live.requests_per_sec), (40, 12.5));
    assert!(
        (0.5..30.0).contains(&live.heartbeat_age_secs),
        "{}",
        live.heartbeat_age_secs
    );
    assert!(
        w[1].heartbeat_age_secs >= 599.0,
        "{}",
        w[1].heartbeat_age_secs
    );
    assert_eq!(w[0].orphaned, 2);

    assert!(l.db.workers("nope").expect("none").is_empty());
    // The same from a read-only console.
    let ro = l.read_only();
    let ro_ids: Vec<String> = ro
        .workers("s1")
        .expect("ro workers")
        .into_iter()
        .map(|w| w.worker_id)
        .collect();
    assert_eq!(ro_ids, ids);
}

#[test]
fn workers_on_a_ledger_without_the_table() {
    // A ledger from before the work queue (migration 0006), opened
    // read-only, is never migrated: it has no workers rather than an error.
    let l = Ledger::new();
    l.session("s1", 100.0, None, "running");
    l.conn
        .execute_batch("DROP TABLE session_worker;")
        .expect("drop");
    assert!(
        l.read_only()
            .workers("s1")
            .expect("no table, no rows")
            .is_empty()
    );
}

#[test]
fn has_changed_follows_another_connections_commits() {
    let l = Ledger::new();
    let mut db = l.fresh();
    assert!(
        ConsoleReads::has_changed(&mut db).expect("first"),
        "the first call says yes"
    );
    assert!(!ConsoleReads::has_changed(&mut db).expect("again"));
    // Reading is not a change.
    db.sessions().expect("sessions");
    assert!(!ConsoleReads::has_changed(&mut db).expect("after a read"));
    l.session("s1", 100.0, None, "running");
    assert!(ConsoleReads::has_changed(&mut db).expect("after a write"));
    assert!(!ConsoleReads::has_changed(&mut db).expect("settled"));
}

// ---------------------------------------------------------------- staged pipelines

impl Ledger {
    #[allow(clippy::too_many_arguments)]
    fn run_stage(
        &self,
        session: &str,
        stage: &str,
        position: i64,
        critic_of: Option<&str>,
        (total, completed, failed, skipped): (i64, i64, i64, i64),
        state: &str,
    ) {
        self.conn
            .execute(
                "INSERT INTO run_stages (session_id, stage, position, role, critic_of, total, completed, failed,
                     skipped, state, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 1)",
                params![
                    session,
                    stage,
                    position,
                    if critic_of.is_some() { "critic" } else { "generator" },
                    critic_of,
                    total,
                    completed,
                    failed,
                    skipped,
                    state
                ],
            )
            .expect("insert run_stages");
    }

    fn session_request(
        &self,
        session: &str,
        item_id: &str,
        stage: &str,
        position: i64,
        rid: i64,
        output: Option<&str>,
    ) {
        self.conn
            .execute(
                "INSERT INTO session_request (session_id, item_id, stage, position, request_id, state, output_json,
                     updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, CASE WHEN ?6 IS NULL THEN 'pending' ELSE 'passed' END, ?6, 1)",
                params![session, item_id, stage, position, rid, output],
            )
            .expect("insert session_request");
    }
}

#[test]
fn stages_come_from_run_stages_in_job_order() {
    let l = Ledger::new();
    let now = now_ts();
    l.session("two", 1000.0, Some(now - 1.0), "running");
    l.session("four", 1001.0, None, "running");
    l.counters("two", 4, 2, 0);
    // Written out of order: the query orders by position.
    l.run_stage(
        "two",
        "critic",
        1,
        Some("adjudicate"),
        (4, 1, 0, 1),
        "running",
    );
    l.run_stage("two", "adjudicate", 0, None, (4, 3, 1, 0), "done");
    for (i, (name, of, counts, state)) in [
        ("rubric_gen", None, (10, 10, 0, 0), "done"),
        ("rubric_critic", Some("rubric_gen"), (10, 9, 0, 1), "done"),
        ("score_gen", None, (10, 4, 1, 0), "running"),
        ("score_critic", Some("score_gen"), (10, 0, 0, 0), "pending"),
    ]
    .into_iter()
    .enumerate()
    {
        l.run_stage("four", name, i as i64, of, counts, state);
    }
    // In flight: two critic attempts (one a criterion asked on its own) in
    // "two"; one score_gen attempt in "four".
    for i in 0..3 {
        l.item(&format!("i{i}"));
    }
    let c0 = l.request("i0", "critic", 1.0);
    let c1 = l.request("i1", "critic:tone", 1.0);
    let g2 = l.request("i2", "score_gen", 1.0);
    l.message(c0, 1, "two", "sent", None, None, None, None);
    l.message(c1, 1, "two", "sent", None, None, None, None);
    l.message(g2, 1, "four", "sent", None, None, None, None);
    l.conn
        .execute(
            "UPDATE llm_batch_session SET live_json = ?2, stop_after_stage = 'critic' WHERE session_id = ?1",
            params!["two", r#"{"in_flight":1,"stage":"critic"}"#],
        )
        .expect("live_json");

    let v = l.db.session_view("two").expect("view").expect("two");
    let names: Vec<&str> = v.stages.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["adjudicate", "critic"]);
    let (g, c) = (&v.stages[0], &v.stages[1]);
    assert_eq!(
        (g.total, g.done, g.failed, g.skipped, g.in_flight),
        (4, 4, 1, 0, 0)
    );
    assert_eq!(g.state.as_deref(), Some("done"));
    assert!(!g.is_critic() && g.critic_of.is_none());
    // done = passed + failed + skipped; the ledger's two open attempts
    // outnumber the gauge's one.
    assert_eq!(
        (c.total, c.done, c.failed, c.skipped, c.in_flight),
        (4, 2, 0, 1, 2)
    );
    assert!(c.is_critic());
    assert_eq!(c.critic_of.as_deref(), Some("adjudicate"));
    assert_eq!((c.position, c.state.as_deref()), (1, Some("running")));
    assert!(!c.is_finished());
    assert_eq!(v.stop_after_stage.as_deref(), Some("critic"));

    let v = l.fresh().session_view("four").expect("view").expect("four");
    type Row<'a> = (&'a str, Option<&'a str>, u64, u64, u64, Option<&'a str>);
    let got: Vec<Row> = v
        .stages
        .iter()
        .map(|s| {
            (
                s.name.as_str(),
                s.critic_of.as_deref(),
                s.done,
                s.skipped,
                s.in_flight,
                s.state.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("rubric_gen", None, 10, 0, 0, Some("done")),
            ("rubric_critic", Some("rubric_gen"), 10, 1, 0, Some("done")),
            ("score_gen", None, 5, 0, 1, Some("running")),
            ("score_critic", Some("score_gen"), 0, 0, 0, Some("pending")),
        ]
    );
    assert!(v.stages[0].is_finished() && !v.stages[2].is_finished());

    // Odd values never fail the view: NULL-ish and mistyped counts read as 0.
    l.conn
        .execute(
            "UPDATE run_stages SET total = 'lots', completed = -3, critic_of = '' WHERE session_id = 'four'
                 AND stage = 'rubric_critic'",
            [],
        )
        .expect("odd");
    let v = l.db.session_view("four").expect("odd view").expect("four");
    let s = &v.stages[1];
    assert_eq!((s.total, s.done, s.critic_of.as_deref()), (0, 1, None));
    assert!(s.is_critic(), "its role still says critic");
}

#[test]
fn review_detail_pairs_the_generator_with_its_critic() {
    let l = Ledger::new();
    l.session("s", 1000.0, None, "running");
    l.run_stage("s", "adjudicate", 0, None, (1, 1, 0, 0), "done");
    l.run_stage("s", "critic", 1, Some("adjudicate"), (1, 1, 0, 0), "done");
    l.item("song-1");
    let g = l.request("song-1", "adjudicate", 1.0);
    let c = l.request("song-1", "critic", 2.0);
    let answer = r#"{"label":"match","confidence":0.93,"rationale":"same ISRC"}"#;
    let critique = r#"{"verdict":"disagree","confidence":0.6,"rationale":"live \u001b[2Jversion"}"#;
    l.answer(g, "s", answer, (10, 5), 0.001);
    l.answer(c, "s", critique, (12, 6), 0.002);
    l.session_request("s", "song-1", "adjudicate", 0, g, Some(answer));
    l.session_request("s", "song-1", "critic", 1, c, Some(critique));
    l.conn
        .execute(
            "INSERT INTO llm_batch_result (session_id, item_id, processed_at, outcome, answer_json, confidence,
                 rationale, stage, request_id, critic_json, critic_verdict, routing_note)
             VALUES ('s', 'song-1', 5, 'review', ?1, 0.93, 'same ISRC', 'adjudicate', ?2, ?3, 'disagree',
                 'critic disagreed: accept -> review')",
            params![answer, g, critique],
        )
        .expect("result");
    let rid = l.review("song-1", "s", Some(0.93), "same ISRC", Some(g));

    let d = l.db.review_detail(rid).expect("detail").expect("exists");
    assert_eq!(
        d.routing_note.as_deref(),
        Some("critic disagreed: accept -> review")
    );
    let gen_ = d.generator.expect("generator");
    assert_eq!(gen_.stage, "adjudicate");
    assert_eq!(gen_.output_json.as_deref(), Some(answer));
    assert_eq!(
        (gen_.confidence, gen_.rationale.as_deref()),
        (Some(0.93), Some("same ISRC"))
    );
    assert_eq!(gen_.verdict, None);
    let crit = d.critic.expect("critic");
    assert_eq!(crit.stage, "critic");
    assert_eq!(crit.verdict.as_deref(), Some("disagree"));
    assert_eq!(crit.confidence, Some(0.6));
    // As stored: the renderer sanitizes.
    assert_eq!(crit.rationale.as_deref(), Some("live \u{1b}[2Jversion"));
    assert_eq!(crit.output_json.as_deref(), Some(critique));
    // Every stage's own output is still listed.
    assert_eq!(d.stages.len(), 2);

    // No critic_json on the result (an engine that did not write it): the
    // critic's passed output from session_request stands in.
    l.conn
        .execute(
            "UPDATE llm_batch_result SET critic_json = NULL, critic_verdict = NULL, routing_note = NULL",
            [],
        )
        .expect("clear");
    let d = l.db.review_detail(rid).expect("detail").expect("exists");
    assert_eq!(d.routing_note, None);
    let crit = d.critic.expect("critic from its request");
    assert_eq!(crit.verdict.as_deref(), Some("disagree"));
    assert_eq!(crit.output_json.as_deref(), Some(critique));

    // A one-stage session: no critic, the layout of old.
    l.session("one", 1001.0, None, "completed");
    l.run_stage("one", "adjudicate", 0, None, (1, 1, 0, 0), "done");
    l.item("song-2");
    let r2 = l.request("song-2", "adjudicate", 1.0);
    l.conn
        .execute(
            "INSERT INTO llm_batch_result (session_id, item_id, processed_at, outcome, answer_json, confidence,
                 stage, request_id)
             VALUES ('one', 'song-2', 5, 'review', '{\"label\":\"x\"}', 0.5, 'adjudicate', ?1)",
            params![r2],
        )
        .expect("result");
    let rid2 = l.review("song-2", "one", Some(0.5), "meh", Some(r2));
    let d2 = l.db.review_detail(rid2).expect("detail").expect("exists");
    assert!(d2.critic.is_none());
    assert_eq!(d2.generator.expect("generator").stage, "adjudicate");
    assert_eq!(d2.routing_note, None);

    // A review item with no session result at all: neither.
    l.item("song-3");
    let rid3 = l.review("song-3", "one", None, "x", None);
    let d3 = l.db.review_detail(rid3).expect("detail").expect("exists");
    assert!(d3.generator.is_none() && d3.critic.is_none());
}

/// One "in flight": the header gauge's count and the stage rows' are the
/// same synchronous attempts sent and not answered, whatever the engine's
/// own gauge says (16 slots held while 3 were sent); batch lines waiting
/// at the provider are counted apart and never as in flight. A paused
/// session's stage that was running reads paused.
#[test]
fn in_flight_is_one_count_and_batch_lines_wait_at_the_provider() {
    let l = Ledger::new();
    let now = now_ts();
    l.session("s1", 1000.0, Some(now - 1.0), "paused");
    l.counters("s1", 20, 2, 0);
    l.run_stage("s1", "triage", 0, None, (20, 2, 0, 0), "running");
    l.run_stage("s1", "verify", 1, Some("triage"), (20, 0, 0, 0), "pending");
    let mut requests = Vec::new();
    for i in 0..8 {
        l.item(&format!("i{i}"));
        requests.push(l.request(&format!("i{i}"), "triage", 1.0));
    }
    // Three synchronous attempts in flight, one answered.
    for r in &requests[..3] {
        l.message(*r, 1, "s1", "sent", None, None, None, None);
    }
    l.message(
        requests[3],
        1,
        "s1",
        "answered",
        Some(5.0),
        Some(200),
        None,
        None,
    );
    // Four lines of an open provider batch, waiting at the provider.
    l.conn
        .execute(
            "INSERT INTO provider_batch (batch_id, tag, session_id, stage, provider, provider_kind, model, state,
                 request_count, input_bytes, created_at, updated_at)
             VALUES (1, 'tag-1', 's1', 'triage', 'mock', 'openai', 'mock-1', 'in_progress', 4, 100, 1, 1)",
            [],
        )
        .expect("insert provider_batch");
    for r in &requests[4..] {
        l.message(*r, 1, "s1", "sent", None, None, None, None);
        l.conn
            .execute(
                "INSERT INTO provider_batch_item (batch_id, custom_id, request_id, attempt) VALUES (1, ?1, ?2, 1)",
                params![format!("s1-{r}-1"), r],
            )
            .expect("insert provider_batch_item");
    }
    l.conn
        .execute(
            "UPDATE llm_batch_session SET desired_state = 'paused',
                 live_json = '{\"in_flight\":16,\"stage\":\"triage\"}' WHERE session_id = 's1'",
            [],
        )
        .expect("live_json");

    let v = l.db.session_view("s1").expect("view").expect("s1 exists");
    assert_eq!((v.in_flight, v.at_provider), (3, 4));
    assert_eq!(v.pending, 20 - 2 - 3 - 4);
    let triage = &v.stages[0];
    assert_eq!(
        (triage.in_flight, triage.at_provider),
        (v.in_flight, v.at_provider),
        "the stage row and the gauge say the same"
    );
    assert_eq!((v.stages[1].in_flight, v.stages[1].at_provider), (0, 0));
    assert_eq!(v.shown.word(), "paused");
    let words: Vec<&str> = v
        .stages
        .iter()
        .map(|s| docket::watch::stage_word(s.state.as_deref().unwrap_or(""), v.shown))
        .collect();
    assert_eq!(words, ["paused", "paused"]);
    assert!(
        !triage.is_finished(),
        "lines at the provider are not finished"
    );
}

/// The decisions export as JSONL objects by item id.
fn exported_decisions(db: &docket::ledger::Ledger) -> Vec<serde_json::Value> {
    use docket::report::{ExportFormat, ExportOptions, ExportWhat, export};
    let mut out = Vec::new();
    let opts = ExportOptions {
        session: None,
        what: ExportWhat::Decisions,
        format: ExportFormat::Jsonl,
    };
    export(db, &opts, &mut out).expect("export");
    String::from_utf8(out)
        .expect("utf-8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect()
}

/// A correction is an accept of the operator's own answer: the decision
/// holds it, the log says who changed which fields when, the export shows
/// the changed fields and the suggestion it replaced, and one undo takes
/// it all back.
#[test]
fn a_correction_is_logged_exported_and_undone() {
    let l = Ledger::new();
    l.session("s1", 1000.0, None, "completed");
    let rid = l.reviewable("x", "s1", 0.7);
    let before = l.decision("x");
    let answer = serde_json::json!({"label": "no_match", "item": "x", "note": "year differs"});
    let applied = l.db.correct(rid, &answer, &alice()).expect("correct");
    assert_eq!(applied.done, [rid]);

    let d = l.decision("x");
    assert_eq!(d.state, "decided");
    assert_eq!(d.decided_by.as_deref(), Some("review:alice"));
    let stored: serde_json::Value = serde_json::from_str(d.answer.as_deref().unwrap()).unwrap();
    assert_eq!(stored, answer);
    let (status, by, at) = l.review_status(rid);
    assert_eq!(
        (status.as_str(), by.as_deref()),
        ("accepted", Some("review:alice"))
    );
    let log: (String, String, f64, Option<String>, Option<String>) = l
        .conn
        .query_row(
            "SELECT action, actor, at, corrected_answer_json, corrected_fields FROM review_log WHERE review_id = ?1",
            params![rid],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
        )
        .expect("log row");
    assert_eq!((log.0.as_str(), log.1.as_str()), ("accept", "review:alice"));
    assert_eq!(Some(log.2), at);
    assert_eq!(log.3.as_deref(), Some(answer.to_string().as_str()));
    assert_eq!(log.4.as_deref(), Some("label,note"));

    let rows = exported_decisions(&l.db);
    let row = rows
        .iter()
        .find(|r| r["item_id"] == "x")
        .expect("x exported");
    assert_eq!(row["decided_answer_json"], answer);
    assert_eq!(row["corrected_fields"], "label,note");
    assert_eq!(
        row["suggested_answer_json"],
        serde_json::json!({"label": "match", "item": "x"})
    );

    // A second correction is refused: the item is decided.
    let again = l.db.correct(rid, &answer, &bob()).expect("correct");
    assert!(
        again.done.is_empty() && again.skipped.len() == 1,
        "{again:?}"
    );

    let u = l.db.undo_last(&alice()).expect("undo").expect("undone");
    assert_eq!((u.review_id, u.action.as_str()), (rid, "accept"));
    assert_eq!(l.decision("x"), before);
    assert_eq!(l.review_status(rid), ("pending".to_string(), None, None));
    let rows = exported_decisions(&l.db);
    let row = rows
        .iter()
        .find(|r| r["item_id"] == "x")
        .expect("x exported");
    assert_eq!(row["state"], "indeterminate");
    assert!(row["corrected_fields"].is_null(), "{row}");
    assert!(row["suggested_answer_json"].is_null(), "{row}");
}
