//! A bad item never blocks a workspace: an item that lacks a field a
//! template needs fails alone (outcome `error`, the variable named, no
//! request sent for it) while the others run; `docket import` warns about
//! such rows (and refuses them with --strict) and refuses to run outside a
//! workspace; `docket items rm` takes items out (one that ended in error
//! without a request out of its session too, its counts with it). The real binary, a real
//! SQLite ledger, the mock's own log.

use docket_testkit as support;

use std::path::Path;
use std::process::Command;

use docket::mock::MockConfig;
use support::*;

fn docket(ws: &Path, home: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = support::procs::docket_at(ws, home)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        support::said(&out),
    )
}

/// `n` demo items as JSONL lines, with `title` taken out of those whose
/// index is in `without_title`.
fn items_file(dir: &Path, n: usize, without_title: &[usize]) -> std::path::PathBuf {
    let mut buf = Vec::new();
    docket::demo::write_chart_items(&mut buf, n, 7).unwrap();
    let lines: Vec<String> = String::from_utf8(buf)
        .unwrap()
        .lines()
        .enumerate()
        .map(|(i, l)| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            if without_title.contains(&i) {
                v.as_object_mut().unwrap().remove("title");
            }
            v.to_string()
        })
        .collect();
    let path = dir.join("items/mixed.jsonl");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

fn item_id(path: &Path, index: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let line = text.lines().nth(index).unwrap();
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    v["id"].as_str().unwrap().to_string()
}

/// Attempts (sent requests) recorded for an item, over all its requests.
fn attempts_of(ws: &Workspace, item: &str) -> i64 {
    count(
        &ws.conn(),
        "SELECT COUNT(*) FROM llm_messages m JOIN llm_requests q ON q.request_id = m.request_id
         WHERE q.item_id = ?1",
        [item],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_lacking_a_template_field_fails_alone_and_nothing_is_sent_for_it() {
    let m = mock(MockConfig::default()).await;
    let ws = workspace(&Job::new(&m.base_url()));
    let home = tempfile::tempdir().unwrap();
    let file = items_file(ws.path(), 6, &[2]);
    let bad = item_id(&file, 2);

    // The import says which row will not render, and imports it.
    let (code, out, said) = docket(ws.path(), home.path(), &["import", file.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{said}");
    assert!(out.contains("Imported 6 new items"), "{said}");
    assert!(
        out.contains("warning: 1 new item cannot be rendered")
            && out.contains(&format!("mixed.jsonl:3: item \"{bad}\""))
            && out.contains("adjudicate.j2:4: undefined variable \"item.title\""),
        "{said}"
    );

    // A dry run names it, and says the others run.
    let (code, out, said) = docket(ws.path(), home.path(), &["run", "--dry-run", "--headless"]);
    assert_eq!(code, Some(0), "{said}");
    assert!(
        out.contains("6 found") && out.contains("1 item cannot be rendered"),
        "{said}"
    );
    assert!(
        out.contains(&format!(
            "item {bad}: {}",
            ws.path().join("prompts/adjudicate.j2").display()
        )) && out.contains(":4: undefined variable \"item.title\""),
        "{said}"
    );
    assert!(out.contains(&format!("docket items rm {bad}")), "{said}");
    assert!(out.contains("would run 5 items"), "{said}");
    assert_eq!(m.stats().requests, 0);

    // The run completes: five answered, the sixth in error with why.
    let (code, out, said) = docket(ws.path(), home.path(), &["run", "--yes", "--headless"]);
    assert_eq!(
        code,
        Some(docket::engine::EXIT_COMPLETED_WITH_ERRORS),
        "{said}"
    );
    assert!(out.contains("1 item cannot be rendered"), "{said}");
    let conn = ws.conn();
    let sid: String = conn
        .query_row("SELECT session_id FROM llm_batch_session", [], |r| r.get(0))
        .unwrap();
    check_invariants(&conn, &sid);
    let (outcome, message): (String, String) = conn
        .query_row(
            "SELECT outcome, error_message FROM llm_batch_result WHERE item_id = ?1",
            [&bad],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(outcome, "error");
    assert!(
        message.contains("adjudicate.j2:4: undefined variable \"item.title\"")
            && message.contains(&format!("(item \"{bad}\")"))
            && message.contains(&format!("docket items rm {bad}")),
        "{message}"
    );
    assert_eq!(
        5,
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_batch_result WHERE outcome != 'error'",
            []
        )
    );
    let (processed, errors): (i64, i64) = conn
        .query_row(
            "SELECT processed_count, error_count FROM llm_batch_session",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!((processed, errors), (6, 1));
    // Nothing was sent for it: no attempt in the ledger, and the mock
    // heard one request per other item.
    assert_eq!(attempts_of(&ws, &bad), 0);
    assert_eq!(m.stats().requests, 5);
    let sent_ids: Vec<String> = m
        .log()
        .iter()
        .filter_map(|e| e.client_request_id.clone())
        .collect();
    let bad_request: i64 = conn
        .query_row(
            "SELECT request_id FROM session_item WHERE item_id = ?1",
            [&bad],
            |r| r.get(0),
        )
        .unwrap();
    assert!(
        !sent_ids
            .iter()
            .any(|c| c.starts_with(&format!("{sid}-{bad_request}-"))),
        "{sent_ids:?}"
    );

    // The way out: remove it (out of the session too, its counts with
    // it), fix the row, import it again; the next run answers it.
    let (code, out, said) = docket(ws.path(), home.path(), &["items", "rm", &bad]);
    assert_eq!(code, Some(0), "{said}");
    assert!(
        out.contains(&format!(
            "removed {bad} (and its error outcome from session {sid}: nothing was ever sent for it"
        )),
        "{said}"
    );
    check_invariants(&conn, &sid);
    let (total, processed, errors): (i64, i64, i64) = conn
        .query_row(
            "SELECT total_count, processed_count, error_count FROM llm_batch_session",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!((total, processed, errors), (5, 5, 0));
    for table in [
        "decision",
        "llm_requests",
        "session_request",
        "session_item",
    ] {
        assert_eq!(
            0,
            count(
                &conn,
                &format!("SELECT COUNT(*) FROM {table} WHERE item_id = ?1"),
                [&bad]
            ),
            "{table}"
        );
    }
    let (stage_total, stage_failed): (i64, i64) = conn
        .query_row("SELECT total, failed FROM run_stages", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert_eq!((stage_total, stage_failed), (5, 0));
    let fixed = items_file(ws.path(), 6, &[]);
    let (code, out, said) = docket(ws.path(), home.path(), &["import", fixed.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{said}");
    assert!(
        out.contains("Imported 1 new item") && !out.contains("warning"),
        "{said}"
    );
    let (code, _, said) = docket(ws.path(), home.path(), &["run", "--yes", "--headless"]);
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(m.stats().requests, 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_no_item_renders_still_stops_the_run_before_anything_is_sent() {
    let m = mock(MockConfig::default()).await;
    let ws = workspace(&Job::new(&m.base_url()));
    let home = tempfile::tempdir().unwrap();
    let file = items_file(ws.path(), 3, &[]);
    let (code, _, said) = docket(ws.path(), home.path(), &["import", file.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{said}");
    std::fs::write(
        ws.path().join("prompts/adjudicate.j2"),
        "Entry {{ item.title }}\nby {{ item.singer }}\n",
    )
    .unwrap();
    let (code, _, said) = docket(ws.path(), home.path(), &["run", "--yes", "--headless"]);
    assert_eq!(code, Some(2), "{said}");
    assert!(
        said.contains("adjudicate.j2:2: undefined variable \"item.singer\"")
            && said.contains("not one of the 3 items to run renders")
            && said.contains("fix the template"),
        "{said}"
    );
    assert_eq!(m.stats().requests, 0);
    assert_eq!(
        0,
        count(&ws.conn(), "SELECT COUNT(*) FROM llm_batch_session", [])
    );
}

/// A critic stage whose template needs a field one item lacks: that item
/// ends in error before its first stage is sent; the others pass both.
#[test]
fn an_item_a_later_stage_cannot_render_fails_before_its_first_stage_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let ws = dir.path();
    let (code, _, said) = docket(
        ws,
        home.path(),
        &["init", ws.to_str().unwrap(), "--example", "critic"],
    );
    assert_eq!(code, Some(0), "{said}");
    let toml = ws.join("docket.toml");
    let text = std::fs::read_to_string(&toml)
        .unwrap()
        .replace("wrong_schema = 0.02", "wrong_schema = 0.0")
        .replace("latency_median_ms = 80.0", "latency_median_ms = 5.0")
        .replace("latency_p99_ms = 300.0", "latency_p99_ms = 20.0");
    std::fs::write(&toml, text).unwrap();
    let critic = ws.join("prompts/critic.j2");
    let body = std::fs::read_to_string(&critic).unwrap();
    std::fs::write(&critic, format!("{body}\nLabel: {{{{ item.label }}}}\n")).unwrap();
    let mut buf = Vec::new();
    docket::demo::write_chart_items(&mut buf, 4, 3).unwrap();
    let lines: Vec<String> = String::from_utf8(buf)
        .unwrap()
        .lines()
        .enumerate()
        .map(|(i, l)| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            if i != 1 {
                v["label"] = "x".into();
            }
            v.to_string()
        })
        .collect();
    let file = ws.join("items/labelled.jsonl");
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let bad = item_id(&file, 1);
    let (code, out, said) = docket(ws, home.path(), &["import", file.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{said}");
    assert!(
        out.contains(&format!("item \"{bad}\": stage critic: "))
            && out.contains("undefined variable \"item.label\""),
        "{said}"
    );
    let (code, _, said) = docket(ws, home.path(), &["run", "--yes", "--headless"]);
    assert_eq!(
        code,
        Some(docket::engine::EXIT_COMPLETED_WITH_ERRORS),
        "{said}"
    );
    let conn = rusqlite::Connection::open(ws.join("docket.sqlite")).unwrap();
    let sid: String = conn
        .query_row("SELECT session_id FROM llm_batch_session", [], |r| r.get(0))
        .unwrap();
    let message: String = conn
        .query_row(
            "SELECT error_message FROM llm_batch_result WHERE item_id = ?1 AND outcome = 'error'",
            [&bad],
            |r| r.get(0),
        )
        .unwrap();
    assert!(
        message.starts_with(
            "stage adjudicate: not sent, since its prompt for stage critic cannot be rendered: "
        ) && message.contains("critic.j2")
            && message.contains("undefined variable \"item.label\""),
        "{message}"
    );
    let sent_for_bad = count(
        &conn,
        "SELECT COUNT(*) FROM llm_messages m JOIN llm_requests q ON q.request_id = m.request_id
         WHERE q.item_id = ?1",
        [&bad],
    );
    assert_eq!(
        sent_for_bad, 0,
        "nothing sent for the item, not even stage 1"
    );
    // Its critic stage is skipped, its first failed; the others passed both.
    let states: Vec<(String, String)> = conn
        .prepare("SELECT stage, state FROM session_request WHERE item_id = ?1 ORDER BY position")
        .unwrap()
        .query_map([&bad], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        states,
        vec![
            ("adjudicate".to_string(), "failed".to_string()),
            ("critic".to_string(), "skipped".to_string())
        ]
    );
    assert_eq!(
        6,
        count(
            &conn,
            "SELECT COUNT(*) FROM session_request WHERE state = 'passed'",
            []
        )
    );
    check_invariants(&conn, &sid);

    // Removed, it leaves both stages' counts as if it never was there.
    let (code, _, said) = docket(ws, home.path(), &["items", "rm", &bad]);
    assert_eq!(code, Some(0), "{said}");
    let stage_counts: Vec<(String, i64, i64, i64, i64)> = conn
        .prepare(
            "SELECT stage, total, completed, failed, skipped FROM run_stages ORDER BY position",
        )
        .unwrap()
        .query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        stage_counts,
        vec![
            ("adjudicate".to_string(), 3, 3, 0, 0),
            ("critic".to_string(), 3, 3, 0, 0)
        ]
    );
    check_invariants(&conn, &sid);
}

#[test]
fn import_outside_a_workspace_refuses_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let file = dir.path().join("items.jsonl");
    std::fs::write(&file, "{\"id\":\"a\",\"title\":\"t\"}\n").unwrap();
    let (code, _, said) = docket(dir.path(), home.path(), &["import", file.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{said}");
    assert!(
        said.contains("no docket.toml here") && said.contains("docket init"),
        "{said}"
    );
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, vec!["items.jsonl".to_string()], "nothing created");
}

#[test]
fn strict_import_refuses_rows_the_templates_cannot_render() {
    let ws = workspace(&Job::new("http://127.0.0.1:9/v1"));
    let home = tempfile::tempdir().unwrap();
    let file = items_file(
        ws.path(),
        30,
        &[
            4, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28,
        ],
    );
    let (code, out, said) = docket(
        ws.path(),
        home.path(),
        &["import", "--strict", file.to_str().unwrap()],
    );
    assert_eq!(code, Some(2), "{said}");
    assert!(
        said.contains("21 bad rows in strict mode")
            && said.contains("first: line 5: item")
            && said.contains("undefined variable \"item.title\""),
        "{said}"
    );
    assert!(out.is_empty() || out.contains("Imported nothing"), "{said}");
    assert_eq!(0, count(&ws.conn(), "SELECT COUNT(*) FROM decision", []));

    // Without --strict: imported, the first twenty named and the rest counted.
    let (code, out, said) = docket(ws.path(), home.path(), &["import", file.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{said}");
    assert!(
        out.contains("warning: 21 new items cannot be rendered"),
        "{said}"
    );
    assert!(out.contains("… and 1 more"), "{said}");
    assert_eq!(30, count(&ws.conn(), "SELECT COUNT(*) FROM decision", []));
}

/// The template check runs beside the import (on its own thread, rows
/// handed over in chunks): what it finds still comes out in file order,
/// merged with the rows that do not parse, over more rows than one chunk.
#[test]
fn unrenderable_and_malformed_rows_are_listed_in_file_order() {
    let ws = workspace(&Job::new("http://127.0.0.1:9/v1"));
    let home = tempfile::tempdir().unwrap();
    let file = items_file(ws.path(), 1000, &[2, 400, 999]);
    let mut lines: Vec<String> = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    lines.insert(700, "{broken".to_string());
    lines.insert(5, "{not json".to_string());
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    // Lines 6 and 702 do not parse; lines 3, 402 and 1002 lack a title.
    // The check's rows come to the report after the reader's: the first
    // bad row is one of the check's only when they are put in file order.
    let in_order = |text: &str, marks: &[&str]| {
        let at: Vec<usize> = marks
            .iter()
            .map(|m| text.find(m).unwrap_or_else(|| panic!("no {m:?} in {text}")))
            .collect();
        assert!(
            at.windows(2).all(|w| w[0] < w[1]),
            "{marks:?} out of order: {text}"
        );
    };

    let (code, _, said) = docket(
        ws.path(),
        home.path(),
        &["import", "--strict", file.to_str().unwrap()],
    );
    assert_eq!(code, Some(2), "{said}");
    assert!(
        said.contains("5 bad rows in strict mode")
            && said.contains("first: line 3: item")
            && said.contains("undefined variable \"item.title\""),
        "{said}"
    );
    assert_eq!(0, count(&ws.conn(), "SELECT COUNT(*) FROM decision", []));

    // Exit 2: rows were bad (README: "so scripts notice").
    let (code, out, said) = docket(ws.path(), home.path(), &["import", file.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{said}");
    assert!(
        out.contains("Imported 1,000 new items") && out.contains("2 bad rows skipped"),
        "{said}"
    );
    assert!(
        out.contains("warning: 3 new items cannot be rendered"),
        "{said}"
    );
    in_order(
        &out,
        &[
            "mixed.jsonl:3: item",
            "mixed.jsonl:402: item",
            "mixed.jsonl:1002: item",
            "mixed.jsonl:6: ",
            "mixed.jsonl:702: ",
        ],
    );
    assert_eq!(1000, count(&ws.conn(), "SELECT COUNT(*) FROM decision", []));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_rm_removes_unused_items_and_keeps_those_a_session_ran() {
    let m = mock(MockConfig::default()).await;
    let ws = workspace(&Job::new(&m.base_url()));
    let home = tempfile::tempdir().unwrap();
    let file = items_file(ws.path(), 8, &[1, 5]);
    let ids: Vec<String> = (0..8).map(|i| item_id(&file, i)).collect();
    let (code, _, said) = docket(ws.path(), home.path(), &["import", file.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{said}");
    let decisions = |ws: &Workspace| count(&ws.conn(), "SELECT COUNT(*) FROM decision", []);

    // Nothing named: a usage error, nothing removed.
    let (code, _, said) = docket(ws.path(), home.path(), &["items", "rm"]);
    assert_eq!(code, Some(2), "{said}");
    assert!(said.contains("--unrenderable"), "{said}");

    // The unrenderable ones, listed first, then removed.
    let (code, out, said) = docket(
        ws.path(),
        home.path(),
        &["items", "rm", "--unrenderable", "--dry-run"],
    );
    assert_eq!(code, Some(0), "{said}");
    assert!(
        out.contains(&format!("would remove {}", ids[1]))
            && out.contains(&format!("would remove {}", ids[5]))
            && out.contains("Would remove 2 items"),
        "{said}"
    );
    assert_eq!(decisions(&ws), 8);
    let (code, out, said) = docket(
        ws.path(),
        home.path(),
        &["items", "rm", "--missing", "title"],
    );
    assert_eq!(code, Some(0), "{said}");
    assert!(out.contains("Removed 2 items"), "{said}");
    assert_eq!(decisions(&ws), 6);

    // By id, and from a file; an unknown id is named (exit 2).
    let list = ws.path().join("ids.txt");
    std::fs::write(&list, format!("# to go\n{}\n\n", ids[3])).unwrap();
    let (code, out, said) = docket(
        ws.path(),
        home.path(),
        &[
            "items",
            "rm",
            &ids[2],
            "nope",
            "--ids-from",
            list.to_str().unwrap(),
        ],
    );
    assert_eq!(code, Some(2), "{said}");
    assert!(
        out.contains(&format!("removed {}", ids[2]))
            && out.contains(&format!("removed {}", ids[3]))
            && said.contains("no item nope in this ledger"),
        "{said}"
    );
    assert_eq!(decisions(&ws), 4);

    // An item a session ran is kept, named with its session.
    let (code, _, said) = docket(ws.path(), home.path(), &["run", "--yes", "--headless"]);
    assert_eq!(code, Some(0), "{said}");
    let sid: String = ws
        .conn()
        .query_row("SELECT session_id FROM llm_batch_session", [], |r| r.get(0))
        .unwrap();
    let (code, _, said) = docket(ws.path(), home.path(), &["items", "rm", &ids[0]]);
    assert_eq!(code, Some(2), "{said}");
    assert!(
        said.contains(&format!("kept {}: session {sid} ran it", ids[0])),
        "{said}"
    );
    assert_eq!(decisions(&ws), 4);
    check_invariants(&ws.conn(), &sid);
}

#[test]
fn items_rm_help_has_an_example() {
    let out = Command::new(support::procs::bin())
        .args(["items", "rm", "--help"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        text.contains("Examples:") && text.contains("docket items rm --unrenderable"),
        "{text}"
    );
}

/// The same on a PostgreSQL ledger (a server the test starts): the bad
/// item ends in error with the variable named and no attempt sent, the
/// others are answered; `items rm` keeps an item the session ran and
/// removes a fresh one.
#[test]
fn on_postgresql_an_unrenderable_item_fails_alone_and_items_rm_keeps_history() {
    let server = support::pg::PgServer::start();
    let url = server.fresh_database();
    let dir = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let ws = dir.path();
    docket::workspace::init(ws, false).unwrap();
    let toml = ws.join("docket.toml");
    let quiet: String = std::fs::read_to_string(&toml)
        .unwrap()
        .lines()
        .map(|line| {
            let key = line.split('=').next().unwrap_or("").trim();
            if ["fail_500", "malformed", "truncated", "wrong_schema"].contains(&key) {
                format!("{key} = 0.0\n")
            } else {
                format!("{line}\n")
            }
        })
        .collect();
    std::fs::write(&toml, quiet).unwrap();
    let file = items_file(ws, 5, &[3]);
    let bad = item_id(&file, 3);
    let on_pg = |args: &[&str]| {
        let out = support::procs::docket_at(ws, home.path())
            .env("DOCKET_LEDGER_URL", &url)
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            support::said(&out),
        )
    };
    let (code, out, said) = on_pg(&["import", file.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{said}");
    assert!(
        out.contains("warning: 1 new item cannot be rendered"),
        "{said}"
    );
    assert!(
        !ws.join("docket.sqlite").exists(),
        "the ledger is on the server"
    );

    let (code, out, said) = on_pg(&["run", "--yes", "--headless"]);
    assert_eq!(
        code,
        Some(docket::engine::EXIT_COMPLETED_WITH_ERRORS),
        "{said}"
    );
    let sid = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("Results: docket batch-results "))
        .expect("the session's id")
        .trim()
        .to_string();
    let (code, out, said) = on_pg(&["batch-results", &sid, "--format", "json"]);
    assert_eq!(code, Some(0), "{said}");
    let results: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rows = results.as_array().expect("an array of results");
    assert_eq!(rows.len(), 5, "{out}");
    for row in rows {
        let error = row["outcome"] == "error";
        assert_eq!(error, row["item_id"] == bad.as_str(), "{row}");
        if error {
            let message = row["error_message"].as_str().unwrap();
            assert!(
                message.contains("undefined variable \"item.title\""),
                "{message}"
            );
        }
    }
    let (code, out, said) = on_pg(&[
        "export",
        "--what",
        "requests",
        "--format",
        "jsonl",
        "--session",
        &sid,
    ]);
    assert_eq!(code, Some(0), "{said}");
    for line in out.lines() {
        let request: serde_json::Value = serde_json::from_str(line).unwrap();
        let attempts = request["attempt"].as_i64().unwrap();
        if request["item_id"] == bad.as_str() {
            assert_eq!(attempts, 0, "nothing sent for it: {request}");
            assert_eq!(request["state"], "failed", "{request}");
        } else {
            assert!(attempts >= 1, "{request}");
        }
    }

    let good = item_id(&file, 0);
    let (code, _, said) = on_pg(&["items", "rm", &good]);
    assert_eq!(code, Some(2), "{said}");
    assert!(
        said.contains(&format!("kept {good}: session {sid} ran it")),
        "{said}"
    );
    let (code, out, said) = on_pg(&["items", "rm", &bad]);
    assert_eq!(code, Some(0), "{said}");
    assert!(
        out.contains(&format!(
            "removed {bad} (and its error outcome from session {sid}"
        )),
        "{said}"
    );
    let (code, out, said) = on_pg(&["sessions", "--format", "json"]);
    assert_eq!(code, Some(0), "{said}");
    let sessions: serde_json::Value = serde_json::from_str(&out).unwrap();
    let session = &sessions.as_array().expect("an array of sessions")[0];
    assert_eq!(session["total"], 4, "{session}");
    assert_eq!(session["processed"], 4, "{session}");
    assert_eq!(session["errors"], 0, "{session}");
    let fresh = ws.join("items/fresh.jsonl");
    std::fs::write(&fresh, "{\"id\":\"fresh-1\",\"title\":\"t\"}\n").unwrap();
    let (code, _, said) = on_pg(&["import", fresh.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{said}");
    let (code, out, said) = on_pg(&["items", "rm", "fresh-1"]);
    assert_eq!(code, Some(0), "{said}");
    assert!(
        out.contains("removed fresh-1") && out.contains("Removed 1 item"),
        "{said}"
    );
    let (code, _, said) = on_pg(&["items", "rm", "fresh-1"]);
    assert_eq!(code, Some(2), "{said}");
    assert!(said.contains("no item fresh-1 in this ledger"), "{said}");
}
