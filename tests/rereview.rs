//! Items awaiting review (issue 16): a new session leaves out, by default,
//! the items that already have a pending review item; with
//! `--rereview-pending` it takes them, and each new suggestion supersedes
//! the old one (kept as history, out of the queue, named on the new card).
//! An item never has two pending review items, on SQLite and on
//! PostgreSQL; migration 8 repairs a ledger that already holds two.

use docket_testkit as support;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use docket::ledger::console::ConsoleReads;
use docket::ledger::postgres::{self, PG_MIGRATIONS, PgUrl};
use docket::ledger::review::ReviewDecisions;
use docket::ledger::{Ledger, LedgerLocation, MIGRATIONS};
use docket::review::Operator;
use docket::watch::ReviewQuery;
use rusqlite::Connection;
use support::pg::PgServer;

// ---------------------------------------------------------------- helpers

/// A scaffolded workspace (built-in mock provider) with its mock's faults
/// off, so every item gets an answer.
fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    docket::workspace::init_example(dir.path(), false, None).expect("init");
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
    dir
}

/// The first `n` demo chart items (the same seed: a longer file starts
/// with the shorter one's items) in `items/NAME`.
fn items_file(ws: &Path, name: &str, n: usize) -> String {
    let path = ws.join("items").join(name);
    let mut f = std::fs::File::create(&path).unwrap();
    docket::demo::write_chart_items(&mut f, n, 99).unwrap();
    format!("items/{name}")
}

/// `docket ARGS` in `ws`, on the PostgreSQL ledger at `url` when given;
/// what it said, after checking it succeeded.
fn ok(ws: &Path, url: Option<&str>, args: &[&str]) -> String {
    let mut c = Command::new(support::procs::bin());
    c.current_dir(ws)
        .arg("--workspace")
        .arg(ws)
        .args(args)
        .env("HOME", ws)
        .env("XDG_DATA_HOME", ws.join("data"))
        .env("XDG_STATE_HOME", ws.join("state"))
        .env("NO_COLOR", "1")
        .env_remove("DOCKET_WORKSPACE")
        .env_remove("DOCKET_LEDGER_URL")
        .env_remove("PGPASSWORD")
        .stdin(Stdio::null());
    if let Some(u) = url {
        c.env("DOCKET_LEDGER_URL", u);
    }
    let out: Output = c.output().expect("run docket");
    let said = support::said(&out);
    assert!(out.status.success(), "docket {}:\n{said}", args.join(" "));
    said
}

/// The session a headless run created, from its output.
fn session_of(said: &str) -> String {
    said.lines()
        .find_map(|l| l.strip_prefix("Creating batch session: "))
        .unwrap_or_else(|| panic!("no session created:\n{said}"))
        .trim()
        .to_string()
}

/// The ledger as SQLite: the file itself, or a snapshot of the PostgreSQL
/// ledger (by `docket ledger copy`, so the new columns go over too).
fn as_sqlite(ws: &Path, url: Option<&str>, snapshots: &Path, n: &mut u32) -> Connection {
    match url {
        None => Connection::open(ws.join("docket.sqlite")).unwrap(),
        Some(u) => {
            *n += 1;
            support::pg::snapshot(u, &snapshots.join(format!("snap{n}")))
        }
    }
}

fn strings(conn: &Connection, sql: &str, p: impl rusqlite::Params) -> Vec<String> {
    conn.prepare(sql)
        .unwrap()
        .query_map(p, |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn count(conn: &Connection, sql: &str) -> i64 {
    conn.query_row(sql, [], |r| r.get(0))
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// No item has two pending review items, and the console's queue shows
/// each pending item once.
fn one_pending_per_item(conn: &Connection, ledger: &Ledger) -> BTreeSet<String> {
    assert_eq!(
        count(
            conn,
            "SELECT COUNT(*) FROM (SELECT item_id FROM review_item WHERE status = 'pending'
             GROUP BY item_id HAVING COUNT(*) > 1) AS doubled"
        ),
        0,
        "an item has two pending review items"
    );
    let page = ledger
        .review_page(&ReviewQuery {
            limit: 10_000,
            ..ReviewQuery::default()
        })
        .unwrap();
    let items: BTreeSet<String> = page.rows.iter().map(|r| r.item_id.clone()).collect();
    assert_eq!(items.len(), page.rows.len(), "an item twice in the queue");
    assert_eq!(page.total as usize, items.len());
    let sessions: BTreeSet<_> = page.rows.iter().map(|r| r.session_id.clone()).collect();
    assert_eq!(page.several_sessions, sessions.len() > 1, "{sessions:?}");
    items
}

// ------------------------------------------- two sessions, same items

/// Import, run; import more, run again (by default, then with
/// `--rereview-pending`): the default leaves the items awaiting review
/// out and says how many; the flag takes them and supersedes their old
/// suggestions; never two pending review items for one item.
fn two_sessions_over_the_same_items(url: Option<&str>) {
    let ws = workspace();
    let ws = ws.path();
    let snapshots = tempfile::tempdir().unwrap();
    let mut snaps = 0;
    let location = match url {
        Some(u) => LedgerLocation::parse(u).unwrap(),
        None => LedgerLocation::File(ws.join("docket.sqlite")),
    };
    let first = items_file(ws, "first.jsonl", 30);
    ok(ws, url, &["import", &first]);
    let s1 = session_of(&ok(ws, url, &["batch-adjudicate", "--yes", "--headless"]));
    let ledger = Ledger::open(location.clone()).unwrap();
    let conn = as_sqlite(ws, url, snapshots.path(), &mut snaps);
    let awaiting = one_pending_per_item(&conn, &ledger);
    assert!(awaiting.len() >= 3, "too few review items: {awaiting:?}");

    // More items; the default run leaves the first session's pending ones out.
    let more = items_file(ws, "more.jsonl", 45);
    ok(ws, url, &["import", &more]);
    let left_out = format!(
        "{} item(s) awaiting review left out (they have a pending review item; --rereview-pending",
        awaiting.len()
    );
    let dry = ok(ws, url, &["batch-adjudicate", "--dry-run"]);
    assert!(dry.contains(&left_out), "{dry}");
    let said = ok(ws, url, &["batch-adjudicate", "--yes", "--headless"]);
    assert!(said.contains(&left_out), "{said}");
    // `--skip-reviewed` is still accepted (it is the default now).
    let skip = ok(
        ws,
        url,
        &["batch-adjudicate", "--dry-run", "--skip-reviewed"],
    );
    assert!(skip.contains("awaiting review left out"), "{skip}");
    let s2 = session_of(&said);
    let conn = as_sqlite(ws, url, snapshots.path(), &mut snaps);
    let taken: BTreeSet<String> = strings(
        &conn,
        "SELECT item_id FROM session_item WHERE session_id = ?1",
        [&s2],
    )
    .into_iter()
    .collect();
    assert!(!taken.is_empty());
    assert!(
        taken.is_disjoint(&awaiting),
        "the second session took items awaiting review: {:?}",
        taken.intersection(&awaiting).collect::<Vec<_>>()
    );
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM review_item WHERE status = 'superseded'"
        ),
        0
    );
    let after_two = one_pending_per_item(&conn, &ledger);
    assert!(after_two.is_superset(&awaiting));

    // Asked again: the first ten items in import order (most of them
    // awaiting review) get new suggestions that supersede the old ones.
    let said = ok(
        ws,
        url,
        &[
            "batch-adjudicate",
            "--yes",
            "--headless",
            "--rereview-pending",
            "--limit",
            "10",
        ],
    );
    assert!(!said.contains("awaiting review left out"), "{said}");
    let s3 = session_of(&said);
    let conn = as_sqlite(ws, url, snapshots.path(), &mut snaps);
    let after_three = one_pending_per_item(&conn, &ledger);
    assert_eq!(
        after_three, after_two,
        "the same items await review, once each"
    );
    let superseded: Vec<(i64, String, String, i64, String, String)> = conn
        .prepare(
            "SELECT o.review_id, o.item_id, o.session_id, n.review_id, n.session_id, n.status
             FROM review_item o JOIN review_item n ON n.review_id = o.superseded_by
             WHERE o.status = 'superseded' ORDER BY o.review_id",
        )
        .unwrap()
        .query_map([], |r| {
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
    assert!(!superseded.is_empty(), "nothing was superseded");
    assert_eq!(
        superseded.len() as i64,
        count(
            &conn,
            "SELECT COUNT(*) FROM review_item WHERE status = 'superseded'"
        ),
        "a superseded review item names no successor"
    );
    for (_, item, old_session, _, new_session, status) in &superseded {
        assert!(after_two.contains(item), "{item} was not awaiting review");
        assert!(old_session == &s1 || old_session == &s2, "{old_session}");
        assert_eq!(new_session, &s3);
        assert_eq!(status, "pending");
    }
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM review_item WHERE status = 'superseded'
             AND (superseded_at IS NULL OR decided_by IS NOT NULL OR claimed_by IS NOT NULL)"
        ),
        0,
        "a superseded row is not a decision and holds no claim"
    );

    // The new card names what it replaced; the old one cannot be decided.
    let (old_id, item, _, new_id, _, _) = superseded[0].clone();
    let (old_suggestion, old_confidence): (String, Option<f64>) = conn
        .query_row(
            "SELECT llm_suggestion_json, confidence FROM review_item WHERE review_id = ?1",
            [old_id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    let card = ledger.review_detail(new_id).unwrap().expect("the new card");
    assert_eq!(card.item_id, item);
    assert_eq!(card.replaced.len(), 1, "{:?}", card.replaced);
    let replaced = &card.replaced[0];
    assert_eq!(replaced.review_id, old_id);
    let old_session = superseded[0].2.clone();
    assert_eq!(replaced.session_id.as_deref(), Some(old_session.as_str()));
    assert_eq!(replaced.confidence, old_confidence);
    let as_value = |s: &str| serde_json::from_str::<serde_json::Value>(s).unwrap();
    assert_eq!(as_value(&replaced.suggestion), as_value(&old_suggestion));
    let old_card = ledger.review_detail(old_id).unwrap().expect("the old card");
    assert_eq!(old_card.status, "superseded");
    assert_eq!(old_card.superseded_by, Some((new_id, Some(s3.clone()))));
    let op = Operator {
        user: "ann".into(),
        claimant: "ann@host:1".into(),
    };
    let applied = ledger.accept(&[old_id], &op).unwrap();
    assert!(applied.done.is_empty());
    assert!(
        applied.skipped[0].1.contains("superseded by a newer one"),
        "{:?}",
        applied.skipped
    );
    // Accepting the new one decides the item; nothing of it stays queued.
    let applied = ledger.accept(&[new_id], &op).unwrap();
    assert_eq!(applied.done, vec![new_id]);
    let conn = as_sqlite(ws, url, snapshots.path(), &mut snaps);
    let queued = one_pending_per_item(&conn, &ledger);
    assert!(!queued.contains(&item));

    // The exports read the new status.
    let items_csv = ok(
        ws,
        url,
        &["export", "--what", "items", "--session", &old_session],
    );
    assert!(items_csv.contains(",superseded,"), "{items_csv}");
    ok(ws, url, &["export", "--what", "decisions"]);
    ok(
        ws,
        url,
        &[
            "export",
            "--what",
            "results",
            "--format",
            "parquet",
            "-o",
            "r.parquet",
        ],
    );
}

#[test]
fn a_second_session_leaves_items_awaiting_review_out_or_supersedes_them() {
    two_sessions_over_the_same_items(None);
}

#[test]
fn a_second_session_leaves_items_awaiting_review_out_or_supersedes_them_on_postgres() {
    let server = PgServer::start();
    let url = server.fresh_database();
    two_sessions_over_the_same_items(Some(&url));
}

// ---------------------------------------------------------- migration 8

/// The rows of a ledger made before migration 8 that held two pending
/// review items for item `x` (sessions s1 then s2, the older one claimed
/// and named by a review log entry) and one for `y`.
const BEFORE_8: &str = "
    INSERT INTO decision (item_id, state, evidence_json, imported_at, updated_at)
    VALUES ('x', 'indeterminate', '{}', 1, 1), ('y', 'indeterminate', '{}', 1, 1),
           ('z', 'indeterminate', '{}', 1, 1);
    INSERT INTO llm_batch_session (session_id, started_at, total_count, config_snapshot_json, state, updated_at)
    VALUES ('s1', 1, 2, '{}', 'completed', 1), ('s2', 2, 2, '{}', 'completed', 2);
    INSERT INTO review_item (review_id, item_id, session_id, source, status, llm_suggestion_json,
        confidence, created_at, claimed_by, claim_expires_at)
    VALUES (1, 'x', 's1', 'LLM_REVIEW', 'pending', '{\"label\":\"old\"}', 0.84, 10, 'bob@h:1', 99999999999),
           (2, 'y', 's1', 'LLM_REVIEW', 'pending', '{\"label\":\"only\"}', 0.7, 10, NULL, NULL),
           (3, 'x', 's2', 'LLM_REVIEW', 'pending', '{\"label\":\"new\"}', 0.84, 20, NULL, NULL),
           (4, 'z', 's1', 'LLM_REVIEW', 'rejected', '{\"label\":\"no\"}', 0.6, 10, NULL, NULL);
    INSERT INTO review_log (log_id, review_id, item_id, action, actor, at)
    VALUES (1, 4, 'z', 'reject', 'review:ann', 30), (2, 1, 'x', 'reject', 'review:ann', 11);
";

/// What migration 8 must have made of `BEFORE_8`, as
/// `review_id|status|superseded_by|superseded_at|claimed_by` rows.
const AFTER_8: &str = "1|superseded|3|20.0|\n2|pending|||\n3|pending|||\n4|rejected|||";

#[test]
fn migration_8_repairs_a_ledger_with_two_pending_review_items_for_one_item() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("docket.sqlite");
    {
        let conn = Connection::open(&path).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v <= 7) {
            conn.execute_batch(sql).unwrap();
            conn.pragma_update(None, "user_version", version).unwrap();
        }
        conn.execute_batch(BEFORE_8).unwrap();
    }
    // Opening migrates (and repairs).
    let conn = docket::ledger::open(&path).unwrap();
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version, MIGRATIONS.last().unwrap().0);
    let rows = strings(
        &conn,
        "SELECT review_id || '|' || status || '|' || COALESCE(superseded_by, '') || '|'
                || CASE WHEN superseded_at IS NULL THEN '' ELSE printf('%.1f', superseded_at) END || '|' || COALESCE(claimed_by, '')
         FROM review_item ORDER BY review_id",
        [],
    );
    assert_eq!(rows.join("\n"), AFTER_8);
    // The log still points at its review items; the file is sound.
    assert_eq!(count(&conn, "SELECT COUNT(*) FROM review_log"), 2);
    assert_eq!(
        count(&conn, "SELECT COUNT(*) FROM pragma_foreign_key_check"),
        0
    );
    let integrity: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(integrity, "ok");
    let fk: i64 = conn
        .pragma_query_value(None, "foreign_keys", |r| r.get(0))
        .unwrap();
    assert_eq!(fk, 1, "foreign keys are on again after the migration");
    // The invariant holds from now on: a second pending row is refused.
    let doubled = conn.execute(
        "INSERT INTO review_item (item_id, session_id, source, status, llm_suggestion_json, created_at)
         VALUES ('x', NULL, 'LLM_REVIEW', 'pending', '{}', 30)",
        [],
    );
    assert!(doubled.is_err(), "two pending review items for x");
    // The search index still follows the table (its triggers were remade).
    conn.execute(
        "INSERT INTO review_item (item_id, session_id, source, status, llm_suggestion_json, rationale, created_at)
         VALUES ('z', 's2', 'LLM_REVIEW', 'pending', '{\"label\":\"needle\"}', 'haystack', 40)",
        [],
    )
    .unwrap();
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM review_search_pending WHERE review_id = (SELECT MAX(review_id) FROM review_item)"
        ),
        1,
        "the new review item waits to be indexed"
    );
    let ledger = Ledger::open(LedgerLocation::File(path.clone())).unwrap();
    let found = ledger
        .review_page(&ReviewQuery {
            filter: Some("needle".into()),
            ..ReviewQuery::default()
        })
        .unwrap();
    assert_eq!(found.total, 1);
    let all = ledger.review_page(&ReviewQuery::default()).unwrap();
    assert_eq!(all.total, 3, "x, y and z, once each");
    assert!(all.several_sessions);
    let card = ledger.review_detail(3).unwrap().unwrap();
    assert_eq!(card.replaced.len(), 1);
    assert_eq!(card.replaced[0].session_id.as_deref(), Some("s1"));
    assert_eq!(card.replaced[0].confidence, Some(0.84));
    assert_eq!(card.replaced[0].suggestion, r#"{"label":"old"}"#);
}

#[test]
fn migration_8_repairs_a_postgres_ledger_with_two_pending_review_items_for_one_item() {
    let server = PgServer::start();
    let url = server.fresh_database();
    let mut script = String::from(
        "CREATE TABLE docket_schema (version BIGINT NOT NULL); INSERT INTO docket_schema VALUES (7);\n",
    );
    for (_, sql) in PG_MIGRATIONS.iter().filter(|(v, _)| *v <= 7) {
        script.push_str(sql);
        script.push('\n');
    }
    script.push_str(BEFORE_8);
    server.psql(&url, &script);
    postgres::open(&PgUrl::parse(&url).unwrap()).expect("the ledger opens, migrated");
    assert_eq!(
        server.psql(&url, "SELECT version FROM docket_schema"),
        PG_MIGRATIONS.last().unwrap().0.to_string()
    );
    let rows = server.psql(
        &url,
        "SELECT review_id, status, COALESCE(superseded_by::text, ''),
                COALESCE(to_char(superseded_at, 'FM99990.0'), ''), COALESCE(claimed_by, '')
         FROM review_item ORDER BY review_id",
    );
    assert_eq!(rows, AFTER_8);
    assert_eq!(
        server.psql(
            &url,
            "SELECT COUNT(*) FROM pg_indexes WHERE indexname = 'idx_review_item_one_pending'"
        ),
        "1",
        "the one-pending index is made after the repair"
    );
    let ledger = Ledger::open(LedgerLocation::parse(&url).unwrap()).unwrap();
    let all = ledger.review_page(&ReviewQuery::default()).unwrap();
    assert_eq!(all.total, 2, "x and y, once each");
    let card = ledger.review_detail(3).unwrap().unwrap();
    assert_eq!(card.replaced.len(), 1);
    assert_eq!(card.replaced[0].session_id.as_deref(), Some("s1"));
}

// ---------------------------------------------------------------- undo

/// A reject undone after the item got a newer suggestion (a later session
/// took the rejected item and sent it to review again): the undone one
/// does not come back beside it, it is superseded by it.
#[test]
fn undoing_a_reject_after_a_newer_suggestion_leaves_the_old_one_superseded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("docket.sqlite");
    let conn = docket::ledger::open(&path).unwrap();
    conn.execute_batch(
        "INSERT INTO decision (item_id, state, evidence_json, imported_at, updated_at)
         VALUES ('x', 'indeterminate', '{}', 1, 1);
         INSERT INTO llm_batch_session (session_id, started_at, total_count, config_snapshot_json, state, updated_at)
         VALUES ('s1', 1, 1, '{}', 'completed', 1), ('s2', 2, 1, '{}', 'completed', 2);
         INSERT INTO review_item (review_id, item_id, session_id, source, status, llm_suggestion_json, confidence, created_at)
         VALUES (1, 'x', 's1', 'LLM_REVIEW', 'pending', '{\"label\":\"old\"}', 0.8, 10);",
    )
    .unwrap();
    let ledger = Ledger::open(LedgerLocation::File(path.clone())).unwrap();
    let op = Operator {
        user: "ann".into(),
        claimant: "ann@host:1".into(),
    };
    assert_eq!(ledger.reject(&[1], &op).unwrap().done, vec![1]);
    // The later session's suggestion, as the writer makes it.
    conn.execute(
        "INSERT INTO review_item (review_id, item_id, session_id, source, status, llm_suggestion_json, confidence, created_at)
         VALUES (2, 'x', 's2', 'LLM_REVIEW', 'pending', '{\"label\":\"new\"}', 0.7, 20)",
        [],
    )
    .unwrap();
    let undone = ledger
        .undo_last(&op)
        .unwrap()
        .expect("the reject is undone");
    assert_eq!(undone.review_id, 1);
    let rows = strings(
        &conn,
        "SELECT review_id || '|' || status || '|' || COALESCE(superseded_by, '') || '|' || COALESCE(decided_by, '')
         FROM review_item ORDER BY review_id",
        [],
    );
    assert_eq!(rows, vec!["1|superseded|2|", "2|pending||"]);
    let queue = ledger.review_page(&ReviewQuery::default()).unwrap();
    assert_eq!(queue.total, 1);
    assert_eq!(queue.rows[0].review_id, 2);
    let card = ledger.review_detail(2).unwrap().unwrap();
    assert_eq!(card.replaced.len(), 1);
    assert_eq!(card.replaced[0].review_id, 1);
    // Without a newer suggestion, an undone reject is pending again.
    assert_eq!(ledger.reject(&[2], &op).unwrap().done, vec![2]);
    ledger.undo_last(&op).unwrap().expect("undone");
    let queue = ledger.review_page(&ReviewQuery::default()).unwrap();
    assert_eq!(
        queue.rows.iter().map(|r| r.review_id).collect::<Vec<_>>(),
        vec![2]
    );
}

/// `--skip-reviewed` and `--rereview-pending` say opposite things: refused.
#[test]
fn skip_reviewed_and_rereview_pending_together_are_refused() {
    let ws = workspace();
    let out = Command::new(support::procs::bin())
        .arg("--workspace")
        .arg(ws.path())
        .args([
            "batch-adjudicate",
            "--dry-run",
            "--skip-reviewed",
            "--rereview-pending",
        ])
        .env("HOME", ws.path())
        .env_remove("DOCKET_LEDGER_URL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", support::said(&out));
    assert!(
        support::said(&out).contains("cannot be used with"),
        "{}",
        support::said(&out)
    );
}
