//! The commands on a PostgreSQL ledger (issue 11), against a server the
//! test starts itself (support::pg): the same job run on SQLite and on
//! PostgreSQL gives every item the same outcome and the reports agree; the
//! password in the URL reaches no output, log or ledger row; a password in
//! docket.toml is refused; two reviewers deciding one queue at once never
//! decide an item twice.

use docket_testkit as support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use docket::ledger::console::ConsoleReads;
use docket::ledger::review::ReviewDecisions;
use docket::ledger::{Ledger, LedgerLocation};
use docket::review::Operator;
use docket::watch::ReviewQuery;
use support::pg::PgServer;

const ITEMS: usize = 40;

/// A scaffolded workspace (built-in mock provider) with `ITEMS` demo items
/// in a file, its mock made deterministic (no injected failures).
fn workspace() -> tempfile::TempDir {
    workspace_of(None)
}

/// `docket init` (or `init --example`) with the mock's faults off and the
/// demo items written to items/test.jsonl.
fn workspace_of(example: Option<docket::workspace::Example>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    docket::workspace::init_example(dir.path(), false, example).expect("init");
    let toml = dir.path().join("docket.toml");
    let text = std::fs::read_to_string(&toml).unwrap();
    let mut quiet = String::new();
    for line in text.lines() {
        let key = line.split('=').next().unwrap_or("").trim();
        if ["fail_500", "malformed", "truncated", "wrong_schema"].contains(&key) {
            quiet.push_str(&format!("{key} = 0.0\n"));
        } else {
            quiet.push_str(line);
            quiet.push('\n');
        }
    }
    std::fs::write(&toml, quiet).unwrap();
    let mut f = std::fs::File::create(dir.path().join("items/test.jsonl")).unwrap();
    docket::demo::write_chart_items(&mut f, ITEMS, 99).unwrap();
    dir
}

/// `docket ARGS` in `ws`, on the PostgreSQL ledger at `url` when given.
fn docket(ws: &Path, url: Option<&str>, args: &[&str]) -> Output {
    let mut c = Command::new(support::procs::bin());
    c.current_dir(ws)
        .arg("--workspace")
        .arg(ws)
        .args(args)
        .env("HOME", ws)
        .env("XDG_DATA_HOME", ws.join("data"))
        .env("XDG_STATE_HOME", ws.join("state"))
        .env("DOCKET_LOG", "debug")
        .env("NO_COLOR", "1")
        .env_remove("DOCKET_WORKSPACE")
        .env_remove("DOCKET_LEDGER_URL")
        .env_remove("PGPASSWORD")
        .stdin(Stdio::null());
    if let Some(u) = url {
        c.env("DOCKET_LEDGER_URL", u);
    }
    c.output().expect("run docket")
}

fn ok(ws: &Path, url: Option<&str>, args: &[&str]) -> String {
    let out = docket(ws, url, args);
    assert!(
        out.status.success(),
        "docket {} ({}):\n{}",
        args.join(" "),
        if url.is_some() {
            "PostgreSQL"
        } else {
            "SQLite"
        },
        support::said(&out)
    );
    support::said(&out)
}

/// Import and run the job; the session's id and every command's output.
fn run_job(ws: &Path, url: Option<&str>) -> (String, String) {
    let mut said = ok(ws, url, &["import", "items/test.jsonl"]);
    said.push_str(&ok(ws, url, &["batch-adjudicate", "--yes", "--headless"]));
    let sessions = ok(ws, url, &["sessions"]);
    let sid = sessions
        .lines()
        .nth(1)
        .and_then(|l| l.split_whitespace().next())
        .expect("a session listed")
        .to_string();
    said.push_str(&sessions);
    (sid, said)
}

/// Each item's outcome and answer, from `batch-results --format json`.
fn outcomes(ws: &Path, url: Option<&str>, sid: &str) -> BTreeMap<String, (String, String)> {
    let out = ok(ws, url, &["batch-results", sid, "--format", "json"]);
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out).expect(&out);
    rows.iter()
        .map(|r| {
            (
                r["item_id"].as_str().unwrap().to_string(),
                (r["outcome"].to_string(), r["answer"].to_string()),
            )
        })
        .collect()
}

/// Row count of an export (CSV: lines after the header).
fn exported(ws: &Path, url: Option<&str>, args: &[&str]) -> usize {
    let mut all = vec!["export"];
    all.extend_from_slice(args);
    ok(ws, url, &all).lines().count().saturating_sub(1)
}

/// The same job on both backends: every item the same outcome and answer,
/// the exports the same size, nothing written beside the PostgreSQL ledger,
/// and the password of its URL nowhere: not in any output, the log, or the
/// ledger's rows.
#[test]
fn a_job_on_postgres_matches_the_same_job_on_sqlite() {
    let server = PgServer::start();
    let url = server.fresh_database();
    let lite = workspace();
    let pg = workspace();
    let (lite_sid, _) = run_job(lite.path(), None);
    let (pg_sid, mut said) = run_job(pg.path(), Some(&url));
    let on_sqlite = outcomes(lite.path(), None, &lite_sid);
    let on_postgres = outcomes(pg.path(), Some(&url), &pg_sid);
    assert_eq!(on_sqlite.len(), ITEMS);
    assert_eq!(on_sqlite, on_postgres, "the same job, other outcomes");
    for what in [
        vec!["--what", "decisions"],
        vec!["--what", "results"],
        vec!["--what", "requests"],
    ] {
        assert_eq!(
            exported(lite.path(), None, &what),
            exported(pg.path(), Some(&url), &what),
            "export {what:?}"
        );
    }
    let items = ["--what", "items", "--session"];
    assert_eq!(
        exported(
            lite.path(),
            None,
            &[&items[..], &[lite_sid.as_str()]].concat()
        ),
        exported(
            pg.path(),
            Some(&url),
            &[&items[..], &[pg_sid.as_str()]].concat()
        ),
        "export items"
    );
    said.push_str(&ok(pg.path(), Some(&url), &["batch-results", &pg_sid]));
    said.push_str(&ok(pg.path(), Some(&url), &["workers", &pg_sid]));
    assert!(
        !pg.path().join("docket.sqlite").exists(),
        "a SQLite ledger was made beside the PostgreSQL one"
    );

    // The password: in no output, not in the log, not in any row.
    if std::env::var_os("DOCKET_TEST_PG_URL").is_none() {
        let canary = PgServer::PASSWORD;
        assert!(url.contains(canary), "the URL carries the canary");
        assert!(!said.contains(canary), "{said}");
        let log = std::fs::read_to_string(support::procs::log_file(pg.path())).unwrap_or_default();
        assert!(!log.is_empty(), "no log found to check");
        assert!(!log.contains(canary), "the password is in the log");
        let copy = tempfile::tempdir().unwrap();
        ok(copy.path(), None, &["ledger", "copy", "--from", &url]);
        let bytes = std::fs::read(copy.path().join("docket.sqlite")).unwrap();
        assert!(
            !bytes.windows(canary.len()).any(|w| w == canary.as_bytes()),
            "the password is in the ledger"
        );
    }
}

/// The staged-pipeline examples (adjudicate then a critic; the four
/// stages of judge-gym, one waiting for the whole stage before it) on
/// both backends: every item the same outcome and answer, and the same
/// exports, items and requests.
#[test]
fn the_staged_examples_on_postgres_match_sqlite() {
    use docket::workspace::Example;
    let server = PgServer::start();
    for example in [Example::Critic, Example::JudgeGym] {
        let url = server.fresh_database();
        let lite = workspace_of(Some(example));
        let pg = workspace_of(Some(example));
        let (lite_sid, _) = run_job(lite.path(), None);
        let (pg_sid, _) = run_job(pg.path(), Some(&url));
        let on_sqlite = outcomes(lite.path(), None, &lite_sid);
        assert_eq!(on_sqlite.len(), ITEMS, "{example:?}");
        assert_eq!(
            on_sqlite,
            outcomes(pg.path(), Some(&url), &pg_sid),
            "{example:?}: the same job, other outcomes"
        );
        for what in ["items", "requests"] {
            let rows = |ws: &Path, url: Option<&str>, sid: &str| {
                exported(ws, url, &["--what", what, "--session", sid])
            };
            let lite_rows = rows(lite.path(), None, &lite_sid);
            assert!(lite_rows >= ITEMS, "{example:?}: {lite_rows} {what}");
            assert_eq!(
                lite_rows,
                rows(pg.path(), Some(&url), &pg_sid),
                "{example:?}: export {what}"
            );
        }
    }
}

/// `[ledger] url` with a password in it is refused, naming the file and
/// never showing the password; without one (PGPASSWORD) it is used.
#[test]
fn docket_toml_names_the_ledger_but_never_its_password() {
    let server = PgServer::start();
    let url = server.fresh_database();
    let ws = workspace();
    let toml = ws.path().join("docket.toml");
    let text_before = std::fs::read_to_string(&toml).unwrap();
    std::fs::write(&toml, format!("{text_before}\n[ledger]\nurl = \"{url}\"\n")).unwrap();
    let out = docket(ws.path(), None, &["import", "items/test.jsonl"]);
    assert!(!out.status.success(), "{}", support::said(&out));
    let said = support::said(&out);
    assert!(
        said.contains("docket.toml") && said.contains("PGPASSWORD"),
        "{said}"
    );
    assert!(!said.contains(PgServer::PASSWORD), "{said}");
    assert!(!ws.path().join("docket.sqlite").exists());

    let bare = url.replace(&format!(":{}@", PgServer::PASSWORD), "@");
    std::fs::write(
        &toml,
        format!("{text_before}\n[ledger]\nurl = \"{bare}\"\n"),
    )
    .unwrap();
    let out = Command::new(support::procs::bin())
        .current_dir(ws.path())
        .arg("--workspace")
        .arg(ws.path())
        .args(["import", "items/test.jsonl"])
        .env("HOME", ws.path())
        .env_remove("DOCKET_LEDGER_URL")
        .env("PGPASSWORD", PgServer::PASSWORD)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", support::said(&out));
    assert!(
        support::said(&out).contains(&format!("{ITEMS} new items")),
        "{}",
        support::said(&out)
    );
    assert!(!ws.path().join("docket.sqlite").exists());
    let handle = Ledger::open(LedgerLocation::parse(&url).unwrap()).unwrap();
    assert_eq!(
        handle
            .review_page(&ReviewQuery::default())
            .map(|p| p.total)
            .unwrap(),
        0
    );
}

/// Two reviewers, each with a connection of its own (as two consoles on two
/// hosts), accept and reject the same pending queue at once, in opposite
/// orders: every item is decided once, by one of them, and the other is
/// told it was already decided.
#[test]
fn two_reviewers_on_postgres_never_decide_an_item_twice() {
    let server = PgServer::start();
    let url = server.fresh_database();
    let ws = workspace();
    run_job(ws.path(), Some(&url));
    let location = LedgerLocation::parse(&url).unwrap();
    let pending: Vec<i64> = Ledger::open(location.clone())
        .unwrap()
        .review_page(&ReviewQuery {
            limit: 1_000,
            ..ReviewQuery::default()
        })
        .unwrap()
        .rows
        .iter()
        .map(|r| r.review_id)
        .collect();
    assert!(
        pending.len() >= 5,
        "too few review items: {}",
        pending.len()
    );
    let reviewer = |name: &str, ids: Vec<i64>, accept: bool| {
        let location = location.clone();
        let op = Operator {
            user: name.to_string(),
            claimant: format!("{name}@host-{name}:1"),
        };
        std::thread::spawn(move || {
            let ledger = Ledger::open(location).unwrap();
            let mut done = Vec::new();
            for id in ids {
                let applied = if accept {
                    ledger.accept(&[id], &op)
                } else {
                    ledger.reject(&[id], &op)
                }
                .unwrap();
                done.extend(applied.done);
            }
            done
        })
    };
    let mut reversed = pending.clone();
    reversed.reverse();
    let a = reviewer("ann", pending.clone(), true);
    let b = reviewer("bob", reversed, false);
    let mut decided = a.join().unwrap();
    let by_bob = b.join().unwrap();
    decided.extend(by_bob.iter().copied());
    decided.sort_unstable();
    let mut expected = pending.clone();
    expected.sort_unstable();
    assert_eq!(decided, expected, "each item decided exactly once");
    let after = Ledger::open(location)
        .unwrap()
        .review_page(&ReviewQuery::default())
        .unwrap();
    assert_eq!(after.total, 0, "nothing left pending");
}

/// Live updates by LISTEN/NOTIFY: a run control reaches a listener, and a
/// ledger writer's commit reaches a reader's `has_changed`, each within
/// 200 ms; between them `has_changed` says nothing changed (no re-read
/// every tick).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controls_and_results_are_heard_within_200_ms() {
    use docket::ledger::control::RunControls;
    use docket::ledger::writer::{LedgerWriter, WriteOp};
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    let server = PgServer::start();
    let url = server.fresh_database();
    let ws = workspace();
    // A session that is still open: a run stopped by its own budget.
    ok(ws.path(), Some(&url), &["import", "items/test.jsonl"]);
    let out = docket(
        ws.path(),
        Some(&url),
        &[
            "batch-adjudicate",
            "--yes",
            "--headless",
            "--limit",
            "5",
            "--max-cost",
            "0.0000001",
        ],
    );
    let said = support::said(&out);
    let sid = said
        .split_whitespace()
        .find(|w| w.starts_with("batch_"))
        .map(|w| w.trim_end_matches([':', '.', ',']).to_string())
        .unwrap_or_else(|| panic!("no session in:\n{said}"));
    let location = LedgerLocation::parse(&url).unwrap();
    let (tx, rx) = mpsc::channel();
    let watcher = Ledger::open(location.clone()).unwrap();
    let _listening = watcher
        .listen(move |n| {
            let _ = tx.send((n, Instant::now()));
        })
        .expect("a PostgreSQL ledger listens");
    // The listener connects on its own thread: give it a moment.
    std::thread::sleep(Duration::from_millis(500));
    let controller = Ledger::open(location.clone()).unwrap();
    let asked = Instant::now();
    controller
        .set_desired(&sid, docket::control::Desired::Paused, "test")
        .unwrap_or_else(|e| panic!("pause {sid}: {e}\n{said}"));
    let (notice, heard) = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("no notification");
    assert_eq!(notice.channel, "docket_control");
    assert_eq!(notice.payload, sid);
    let took = heard - asked;
    assert!(
        took < Duration::from_millis(200),
        "the control took {took:?}"
    );

    let mut reader = Ledger::open(location.clone()).unwrap();
    assert!(reader.has_changed().unwrap(), "the first answer is yes");
    std::thread::sleep(Duration::from_millis(500));
    assert!(!reader.has_changed().unwrap(), "nothing changed since");
    let (writer, handle) = LedgerWriter::start(location).unwrap();
    let wrote = Instant::now();
    writer
        .write(WriteOp::Event {
            session_id: sid.clone(),
            level: "info",
            kind: "test",
            message: "a change".into(),
        })
        .await
        .unwrap();
    let seen = loop {
        if reader.has_changed().unwrap() {
            break Instant::now();
        }
        assert!(
            wrote.elapsed() < Duration::from_secs(5),
            "never heard of the write"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let took = seen - wrote;
    assert!(
        took < Duration::from_millis(200),
        "the result took {took:?}"
    );
    drop(writer);
    tokio::task::spawn_blocking(move || handle.join())
        .await
        .unwrap();
}

/// PostgreSQL text cannot hold a NUL character, which SQLite stores as
/// any other. An item with one (here in its title, so it reaches the
/// rendered prompt the ledger records) must not stop a run on PostgreSQL:
/// the job completes with every item one result, and the recorded prompt
/// holds U+2400 (␀) where the item had the NUL. On SQLite the NUL stays.
#[test]
fn a_nul_in_an_item_does_not_stop_a_run_on_postgres() {
    let server = PgServer::start();
    let url = server.fresh_database();
    for on in [None, Some(url.as_str())] {
        let ws = workspace();
        let items = ws.path().join("items/test.jsonl");
        let text = std::fs::read_to_string(&items).unwrap();
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        let mut first: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
        let title = format!("Nul\u{0}Title {}", first["title"].as_str().unwrap());
        first["title"] = serde_json::Value::String(title);
        lines[0] = first.to_string();
        let item_id = first["id"].as_str().unwrap().to_string();
        std::fs::write(&items, lines.join("\n") + "\n").unwrap();
        let (sid, _) = run_job(ws.path(), on);
        let results = outcomes(ws.path(), on, &sid);
        assert_eq!(results.len(), ITEMS, "one result per item");
        let sql = format!(
            "SELECT m.user_prompt FROM llm_messages m JOIN session_request sr ON sr.request_id = m.request_id
             WHERE sr.item_id = '{item_id}' ORDER BY m.attempt LIMIT 1"
        );
        let prompt = match on {
            Some(url) => server.psql(url, &sql),
            None => rusqlite::Connection::open(ws.path().join("docket.sqlite"))
                .unwrap()
                .query_row(&sql, [], |r| r.get::<_, String>(0))
                .unwrap(),
        };
        let expected = if on.is_some() {
            "Nul\u{2400}Title"
        } else {
            "Nul\u{0}Title"
        };
        assert!(prompt.contains(expected), "{prompt:?}");
    }
}

/// The state words and the one "in flight" read the same on PostgreSQL:
/// an attempt sent and one line of an open provider batch are one in
/// flight and one at the provider (the header and its stage row alike),
/// and a session whose engine's heartbeat went stale is interrupted in the
/// console's reads and in `docket sessions`.
#[test]
fn states_and_in_flight_read_alike_on_postgres() {
    let server = PgServer::start();
    let url = server.fresh_database();
    let pg = workspace();
    let (sid, _) = run_job(pg.path(), Some(&url));
    server.psql(
        &url,
        &format!(
            "UPDATE llm_batch_session SET state = 'running', completed_at = NULL,
                 heartbeat_at = extract(epoch from now()) - 10 WHERE session_id = '{sid}';
             INSERT INTO llm_messages (request_id, attempt, session_id, client_request_id, state, user_prompt, sent_at)
                 SELECT request_id, 9, '{sid}', 'x-' || request_id, 'sent', 'p', 1
                 FROM llm_requests ORDER BY request_id LIMIT 2;
             INSERT INTO provider_batch (batch_id, tag, session_id, stage, provider, provider_kind, model, state,
                 request_count, input_bytes, created_at, updated_at)
                 VALUES (1, 'tag-1', '{sid}', 'adjudicate', 'mock', 'openai', 'mock-1', 'in_progress', 1, 1, 1, 1);
             INSERT INTO provider_batch_item (batch_id, custom_id, request_id, attempt)
                 SELECT 1, 'line-1', MIN(request_id), 9 FROM llm_requests;"
        ),
    );
    let handle = Ledger::open(LedgerLocation::parse(&url).unwrap()).unwrap();
    let v = handle.session_view(&sid).unwrap().expect("the session");
    assert_eq!((v.in_flight, v.at_provider), (1, 1));
    let stage = &v.stages[0];
    assert_eq!((stage.in_flight, stage.at_provider), (1, 1));
    assert_eq!(v.shown.word(), "interrupted");
    let pane = handle.sessions().unwrap();
    assert_eq!(pane[0].shown.word(), "interrupted");
    let json = ok(pg.path(), Some(&url), &["sessions", "--format", "json"]);
    let rows: Vec<serde_json::Value> = serde_json::from_str(&json).expect(&json);
    assert_eq!(rows[0]["state"], "interrupted", "{json}");
}

#[path = "stale_evidence/scenario.rs"]
mod stale_scenario;

/// `import --update` on PostgreSQL: the changed items' answers and review
/// items marked stale, and the next run asks again for them and the new
/// ones alone (the scenario of tests/stale_evidence.rs).
#[test]
fn import_update_marks_stale_and_asks_again_on_postgres() {
    let pg = PgServer::start();
    stale_scenario::update_then_run(Some(&pg));
}

/// Evidence replaced while a session waits, on PostgreSQL: the resume's
/// requests record the evidence they were sent with, and the next run asks
/// only for the new items (the scenario of tests/stale_evidence.rs).
#[test]
fn evidence_replaced_before_a_resume_is_what_its_answers_record_on_postgres() {
    let pg = PgServer::start();
    stale_scenario::replaced_before_a_resume(Some(&pg), false);
}
