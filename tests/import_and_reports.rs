//! `docket import`, `batch-results`, `sessions` and `export` against a real
//! ledger in a temporary directory.

use std::path::{Path, PathBuf};

use docket::items::{ImportError, ImportFormat, ImportOptions, import_file, render_import_report};
use docket::ledger::Ledger;
use docket::report::{
    DECISION_COLUMNS, ExportFormat, ExportOptions, ExportWhat, OutputFormat, REQUEST_COLUMNS,
    RESULT_COLUMNS, ReportError, export, write_results, write_sessions,
};
use rusqlite::Connection;
use serde_json::{Value, json};

const SESSION: &str = "batch_20260501_abc123";

fn ledger(dir: &Path) -> Connection {
    docket::ledger::open(&dir.join("docket.sqlite")).expect("open ledger")
}

/// The handle the CLI imports and reports through, on the same file as the
/// fixtures' connection.
fn handle(conn: &Connection) -> Ledger {
    Ledger::open(Path::new(conn.path().expect("a ledger file"))).expect("open the handle")
}

fn write_file(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).expect("write input");
    path
}

fn opts() -> ImportOptions {
    ImportOptions {
        id_field: "id".into(),
        format: None,
        strict: false,
        update: false,
    }
}

fn count(conn: &Connection, sql: &str) -> i64 {
    conn.query_row(sql, [], |r| r.get(0)).expect("count")
}

fn evidence(conn: &Connection, id: &str) -> Value {
    let text: String = conn
        .query_row(
            "SELECT evidence_json FROM decision WHERE item_id = ?1",
            [id],
            |r| r.get(0),
        )
        .expect("evidence");
    serde_json::from_str(&text).expect("evidence is JSON")
}

// ---------------------------------------------------------------- import

#[test]
fn jsonl_import_with_string_and_integer_ids() {
    let dir = tempfile::tempdir().unwrap();
    let conn = ledger(dir.path());
    let path = write_file(
        dir.path(),
        "items.jsonl",
        b"{\"id\": \"a-1\", \"title\": \"First\", \"tags\": [\"x\"], \"n\": 1.5}\n\
          \n\
          {\"id\": 42, \"title\": null, \"nested\": {\"k\": true}}\r\n\
          {\"title\": \"no trailing newline\", \"id\": \"z\"}",
    );
    let report = import_file(&mut handle(&conn), &path, &opts()).unwrap();
    assert_eq!(report.rows_read, 3);
    assert_eq!(report.imported, 3);
    assert_eq!(report.already_present, 0);
    assert_eq!(report.bad_count, 0);
    assert!(report.committed);

    assert_eq!(
        evidence(&conn, "a-1"),
        json!({"title": "First", "tags": ["x"], "n": 1.5})
    );
    assert_eq!(
        evidence(&conn, "42"),
        json!({"title": null, "nested": {"k": true}})
    );
    assert_eq!(
        evidence(&conn, "z"),
        json!({"title": "no trailing newline"})
    );

    let (state, line, file, imported_at, updated_at): (String, i64, String, f64, f64) = conn
        .query_row(
            "SELECT state, source_line, source_file, imported_at, updated_at \
             FROM decision WHERE item_id = '42'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
        )
        .unwrap();
    assert_eq!(state, "indeterminate");
    assert_eq!(line, 3, "physical line, counting the blank one");
    assert!(file.ends_with("items.jsonl"), "{file}");
    assert!(imported_at > 1.7e9 && imported_at == updated_at);
}

#[test]
fn csv_import_keeps_other_columns_as_strings() {
    let dir = tempfile::tempdir().unwrap();
    let conn = ledger(dir.path());
    let path = write_file(
        dir.path(),
        "items.csv",
        "\u{feff}name,id,score,note\n\
         Alice,i1,0.9,\"has, comma\"\n\
         Bob,i2,,\"two\nlines\"\n\
         \n\
         Carol,i3,7,plain\n"
            .as_bytes(),
    );
    let report = import_file(&mut handle(&conn), &path, &opts()).unwrap();
    assert_eq!(
        (report.rows_read, report.imported, report.bad_count),
        (3, 3, 0)
    );
    assert_eq!(
        evidence(&conn, "i1"),
        json!({"name": "Alice", "score": "0.9", "note": "has, comma"})
    );
    assert_eq!(
        evidence(&conn, "i2"),
        json!({"name": "Bob", "score": "", "note": "two\nlines"})
    );
    let line: i64 = conn
        .query_row(
            "SELECT source_line FROM decision WHERE item_id = 'i3'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(
        line, 6,
        "record start line, after a two-line record and a blank line"
    );
}

#[test]
fn explicit_format_and_custom_id_field() {
    let dir = tempfile::tempdir().unwrap();
    let conn = ledger(dir.path());
    let path = write_file(dir.path(), "items.txt", b"{\"key\": \"k1\", \"v\": 1}\n");
    let err = import_file(&mut handle(&conn), &path, &opts()).unwrap_err();
    assert!(matches!(err, ImportError::UnknownFormat { .. }));
    assert!(err.to_string().contains("items.txt"), "{err}");

    let o = ImportOptions {
        id_field: "key".into(),
        format: Some(ImportFormat::Jsonl),
        strict: false,
        update: false,
    };
    let report = import_file(&mut handle(&conn), &path, &o).unwrap();
    assert_eq!(report.imported, 1);
    assert_eq!(evidence(&conn, "k1"), json!({"v": 1}));
}

#[test]
fn reimport_is_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let conn = ledger(dir.path());
    let path = write_file(
        dir.path(),
        "items.jsonl",
        b"{\"id\": \"a\", \"v\": 1}\n{\"id\": \"b\", \"v\": 2}\n{\"id\": \"a\", \"v\": 3}\n",
    );
    let first = import_file(&mut handle(&conn), &path, &opts()).unwrap();
    // Line 3 repeats line 1's id with other evidence: a duplicate named
    // with both lines, not an item "already present".
    assert_eq!(
        (
            first.rows_read,
            first.imported,
            first.already_present,
            first.bad_count
        ),
        (3, 2, 0, 1)
    );
    assert_eq!(first.bad_rows[0].line, 3);
    assert!(
        first.bad_rows[0]
            .reason
            .contains("duplicate id \"a\": line 1 has the same id with other evidence"),
        "{:?}",
        first.bad_rows
    );
    assert_eq!(
        evidence(&conn, "a"),
        json!({"v": 1}),
        "first occurrence wins"
    );

    // An item the engine already decided must stay untouched by a re-import.
    conn.execute(
        "UPDATE decision SET state = 'decided', decided_answer_json = '{}' WHERE item_id = 'b'",
        [],
    )
    .unwrap();
    let again = import_file(&mut handle(&conn), &path, &opts()).unwrap();
    assert_eq!(
        (again.rows_read, again.imported, again.already_present),
        (3, 0, 3)
    );
    assert_eq!(count(&conn, "SELECT COUNT(*) FROM decision"), 2);
    let state: String = conn
        .query_row("SELECT state FROM decision WHERE item_id = 'b'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(state, "decided");

    let mut out = Vec::new();
    render_import_report(&again, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.starts_with("Imported 0 new items from ")
            && text.contains(
                "(3 rows read; 3 already present (1 of them with different content: the ledger keeps what it has); 0 bad rows skipped)"
            )
            && text.contains(":3: \"a\" differs from the ledger's copy"),
        "{text}"
    );
}

/// A line that repeats an earlier line exactly is the same item said
/// twice: counted as already present, not a bad row.
#[test]
fn a_repeated_identical_line_is_not_a_duplicate_error() {
    let dir = tempfile::tempdir().unwrap();
    let conn = ledger(dir.path());
    let path = write_file(
        dir.path(),
        "items.jsonl",
        b"{\"id\": \"a\", \"v\": 1}\n{\"id\": \"a\", \"v\": 1}\n",
    );
    let report = import_file(&mut handle(&conn), &path, &opts()).unwrap();
    assert_eq!(
        (
            report.rows_read,
            report.imported,
            report.already_present,
            report.bad_count
        ),
        (2, 1, 1, 0)
    );
}

/// A row over the one-item limit (8 MiB) is a bad row naming its size and
/// the limit, read past without stopping the import; the rows around it go
/// in. JSONL and CSV alike.
#[test]
fn a_row_over_the_size_limit_is_a_bad_row_naming_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let conn = ledger(dir.path());
    let big = "x".repeat(docket::items::MAX_ITEM_BYTES + 1024);
    // Just under the limit still goes in.
    let under = "y".repeat(docket::items::MAX_ITEM_BYTES - 64);
    let jsonl = format!(
        "{{\"id\":\"a\",\"t\":1}}\n{{\"id\":\"big\",\"t\":\"{big}\"}}\n{{\"id\":\"under\",\"t\":\"{under}\"}}\n{{\"id\":\"b\",\"t\":2}}\n"
    );
    let path = write_file(dir.path(), "items.jsonl", jsonl.as_bytes());
    let report = import_file(&mut handle(&conn), &path, &opts()).unwrap();
    assert_eq!(
        (report.rows_read, report.imported, report.bad_count),
        (4, 3, 1)
    );
    let bad = &report.bad_rows[0];
    assert_eq!(bad.line, 2);
    assert!(
        bad.reason
            .contains("8.0 MB, over the 8 MB limit for one item"),
        "{}",
        bad.reason
    );

    let csv = format!("id,t\nc,1\nhuge,\"{big}\"\nd,2\n");
    let path = write_file(dir.path(), "items.csv", csv.as_bytes());
    let report = import_file(&mut handle(&conn), &path, &opts()).unwrap();
    assert_eq!(
        (report.rows_read, report.imported, report.bad_count),
        (3, 2, 1)
    );
    assert_eq!(report.bad_rows[0].line, 3);
    assert!(
        report.bad_rows[0].reason.contains("over the 8 MB limit"),
        "{}",
        report.bad_rows[0].reason
    );
    assert_eq!(count(&conn, "SELECT COUNT(*) FROM decision"), 5);
}

fn messy_jsonl() -> Vec<u8> {
    let long_id = "x".repeat(257);
    let mut s = Vec::new();
    s.extend_from_slice(b"{\"id\": \"good-1\", \"v\": 1}\n"); // 1
    s.extend_from_slice(b"{\"id\": \"broken\", \"v\": 1\n"); // 2 invalid JSON
    s.extend_from_slice(b"   \n"); // 3 blank: skipped
    s.extend_from_slice(b"[1, 2, 3]\n"); // 4 not an object
    s.extend_from_slice(b"{\"v\": 1}\n"); // 5 missing id
    s.extend_from_slice(b"{\"id\": 1.5}\n"); // 6 float id
    s.extend_from_slice(b"{\"id\": \"good-2\"}\n"); // 7
    s.extend_from_slice(b"{\"id\": \"bell\\u0007\"}\n"); // 8 control character
    s.extend_from_slice(format!("{{\"id\": \"{long_id}\"}}\n").as_bytes()); // 9 too long
    s.extend_from_slice(b"{\"id\": \"bad\xff\xfe\"}\n"); // 10 invalid UTF-8
    s.extend_from_slice(b"{\"id\": \"\"}\n"); // 11 empty id
    s
}

#[test]
fn bad_rows_are_reported_with_lines_and_reasons() {
    let dir = tempfile::tempdir().unwrap();
    let conn = ledger(dir.path());
    let path = write_file(dir.path(), "items.jsonl", &messy_jsonl());
    let report = import_file(&mut handle(&conn), &path, &opts()).unwrap();
    assert_eq!(report.rows_read, 10);
    assert_eq!(report.imported, 2);
    assert_eq!(report.bad_count, 8);
    let lines: Vec<u64> = report.bad_rows.iter().map(|b| b.line).collect();
    assert_eq!(lines, vec![2, 4, 5, 6, 8, 9, 10, 11]);
    let reason = |line: u64| {
        report
            .bad_rows
            .iter()
            .find(|b| b.line == line)
            .map(|b| b.reason.clone())
            .unwrap()
    };
    assert!(reason(2).starts_with("invalid JSON: "), "{}", reason(2));
    assert!(reason(2).contains("at column "), "{}", reason(2));
    assert_eq!(reason(4), "not a JSON object (found an array)");
    assert_eq!(reason(5), "missing id field \"id\"");
    assert!(
        reason(6).contains("must be a string or an integer"),
        "{}",
        reason(6)
    );
    assert!(reason(8).contains("control character"), "{}", reason(8));
    assert!(reason(9).contains("257 characters"), "{}", reason(9));
    assert!(reason(10).starts_with("invalid UTF-8"), "{}", reason(10));
    assert!(reason(11).contains("empty"), "{}", reason(11));
    assert_eq!(count(&conn, "SELECT COUNT(*) FROM decision"), 2);

    let mut out = Vec::new();
    render_import_report(&report, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("Imported 2 new items from "), "{text}");
    assert!(
        text.contains("(10 rows read; 0 already present; 8 bad rows skipped)"),
        "{text}"
    );
    assert!(text.contains("items.jsonl:2: invalid JSON: "), "{text}");
    assert!(text.contains("items.jsonl:4: not a JSON object"), "{text}");
}

#[test]
fn csv_bad_rows_name_field_counts() {
    let dir = tempfile::tempdir().unwrap();
    let conn = ledger(dir.path());
    let path = write_file(
        dir.path(),
        "items.csv",
        b"id,a,b,c\n1,x,y,z\n2,x,y\n3,x,y,z,extra\n4,\xff,y,z\n,x,y,z\n5,x,y,z\n",
    );
    let report = import_file(&mut handle(&conn), &path, &opts()).unwrap();
    assert_eq!(
        (report.rows_read, report.imported, report.bad_count),
        (6, 2, 4)
    );
    let got: Vec<(u64, &str)> = report
        .bad_rows
        .iter()
        .map(|b| (b.line, b.reason.as_str()))
        .collect();
    assert_eq!(got[0], (3, "row has 3 fields, header has 4"));
    assert_eq!(got[1], (4, "row has 5 fields, header has 4"));
    assert_eq!(got[2].0, 5);
    assert!(
        got[2].1.starts_with("invalid UTF-8 in column \"a\""),
        "{}",
        got[2].1
    );
    assert_eq!(got[3].0, 6);
    assert!(got[3].1.contains("empty"), "{}", got[3].1);
}

#[test]
fn strict_mode_imports_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let conn = ledger(dir.path());
    let path = write_file(dir.path(), "items.jsonl", &messy_jsonl());
    let o = ImportOptions {
        strict: true,
        ..opts()
    };
    let err = import_file(&mut handle(&conn), &path, &o).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("items.jsonl") && msg.contains("8 bad rows"),
        "{msg}"
    );
    assert!(msg.contains("line 2: invalid JSON"), "{msg}");
    match err {
        ImportError::StrictRejected { report, .. } => {
            assert!(!report.committed);
            assert_eq!(report.imported, 0);
            assert_eq!(report.bad_count, 8);
            let mut out = Vec::new();
            render_import_report(&report, &mut out).unwrap();
            let text = String::from_utf8(out).unwrap();
            assert!(text.starts_with("Imported nothing from "), "{text}");
        }
        other => panic!("unexpected error {other:?}"),
    }
    assert_eq!(count(&conn, "SELECT COUNT(*) FROM decision"), 0);

    // A clean file still imports in strict mode.
    let good = write_file(dir.path(), "good.jsonl", b"{\"id\": 1}\n{\"id\": 2}\n");
    assert_eq!(
        import_file(&mut handle(&conn), &good, &o).unwrap().imported,
        2
    );
}

#[test]
fn missing_id_column_is_a_file_error() {
    let dir = tempfile::tempdir().unwrap();
    let conn = ledger(dir.path());
    let path = write_file(dir.path(), "items.csv", b"\n\nkey,name\nk1,Alice\n");
    let err = import_file(&mut handle(&conn), &path, &opts()).unwrap_err();
    assert!(
        matches!(err, ImportError::MissingIdColumn { line: 3, .. }),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains("items.csv:3"), "{msg}");
    assert!(msg.contains("\"id\""), "{msg}");
    assert!(msg.contains("key, name"), "{msg}");
    assert_eq!(count(&conn, "SELECT COUNT(*) FROM decision"), 0);

    let missing = dir.path().join("nope.jsonl");
    let err = import_file(&mut handle(&conn), &missing, &opts()).unwrap_err();
    assert!(matches!(err, ImportError::Open { .. }));
    assert!(err.to_string().contains("nope.jsonl"), "{err}");
}

#[test]
fn bad_row_details_are_capped_but_counted() {
    let dir = tempfile::tempdir().unwrap();
    let conn = ledger(dir.path());
    let mut body = String::new();
    for i in 0..1500 {
        body.push_str(if i % 3 == 0 {
            "{\"id\": \"ok-"
        } else {
            "not json "
        });
        body.push_str(&i.to_string());
        body.push_str(if i % 3 == 0 { "\"}\n" } else { "\n" });
    }
    let path = write_file(dir.path(), "many.jsonl", body.as_bytes());
    let report = import_file(&mut handle(&conn), &path, &opts()).unwrap();
    assert_eq!(report.imported, 500);
    assert_eq!(report.bad_count, 1000);
    assert_eq!(report.bad_rows.len(), 1000);
    let mut out = Vec::new();
    render_import_report(&report, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert_eq!(text.lines().count(), 1 + 20 + 1, "{text}");
    assert!(text.contains("(1,500 rows read; 0 already present; 1,000 bad rows skipped)"));
    assert!(text.trim_end().ends_with("… and 980 more"), "{text}");
}

/// Not run by default: `cargo test --release --test import_and_reports -- --ignored`.
#[test]
#[ignore]
fn import_a_million_rows_quickly() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let conn = ledger(dir.path());
    let path = dir.path().join("big.jsonl");
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        for i in 0..1_000_000u32 {
            writeln!(
                f,
                "{{\"id\": \"item-{i:08}\", \"title\": \"Some title for item {i}\", \"artist\": \"Artist {}\", \"score\": {}}}",
                i % 977,
                i % 100
            )
            .unwrap();
        }
    }
    let started = std::time::Instant::now();
    let report = import_file(&mut handle(&conn), &path, &opts()).unwrap();
    let took = started.elapsed();
    eprintln!("imported {} rows in {took:?}", report.imported);
    assert_eq!(report.imported, 1_000_000);
    if !cfg!(debug_assertions) {
        assert!(took.as_secs_f64() < 10.0, "{took:?}");
    }
}

// ---------------------------------------------------------------- reports

/// A completed session over items a, b, c (accepted, accepted, review) whose
/// rationales carry terminal escapes, plus one error in a second session.
fn seed(conn: &Connection) {
    conn.execute_batch(
        r#"
        INSERT INTO decision (item_id, state, evidence_json, decided_answer_json, decided_by,
                              decided_at, confidence, model_id, adjudication_id, imported_at, updated_at)
        VALUES ('a', 'decided', '{"title":"A"}', '{"label":"yes"}', 'llm_auto_accept',
                1777636900.25, 0.97, 'mock-1', '1', 1777636000, 1777636900),
               ('b', 'decided', '{"title":"B"}', '{"label":"no"}', 'llm_auto_accept',
                1777636950, 0.91, 'mock-1', '2', 1777636000, 1777636950),
               ('c', 'indeterminate', '{"title":"C"}', NULL, NULL, NULL, NULL, NULL, NULL,
                1777636000, 1777636000),
               ('d', 'indeterminate', '{"title":"D"}', NULL, NULL, NULL, NULL, NULL, NULL,
                1777636000, 1777636000);

        INSERT INTO llm_batch_session (session_id, started_at, completed_at, total_count,
            processed_count, accepted_count, reviewed_count, rejected_count, error_count,
            config_snapshot_json, state, retry_count, rate_limited_count, ambiguous_count,
            input_tokens, output_tokens, cost_usd, estimated_cost_usd, updated_at)
        VALUES ('batch_20260501_abc123', 1777636800, 1777637100, 3, 3, 2, 1, 0, 0,
                '{"provider":{"api_key":"sk-SECRET-never-export"}}', 'completed', 4, 2, 1,
                1200, 300, 0.0123, 0.02, 1777637100),
               ('batch_20260430_old000', 1777550400, NULL, 1, 1, 0, 0, 0, 1,
                '{}', 'error', 0, 0, 0, 10, 0, 0, 0.001, 1777550500);

        INSERT INTO llm_requests (request_id, item_id, stage, provider, model, status, attempt,
            transport_retries, template_hash, params_hash, created_at, updated_at)
        VALUES (1, 'a', 'adjudicate', 'mock', 'mock-1', 'completed', 1, 0, 'th1', 'ph1', 1, 1),
               (2, 'b', 'adjudicate', 'mock', 'mock-1', 'completed', 2, 1, 'th1', 'ph1', 1, 1),
               (3, 'c', 'adjudicate', 'mock', 'mock-1', 'completed', 1, 0, 'th1', 'ph1', 1, 1),
               (4, 'd', 'adjudicate', 'mock', 'mock-1', 'error', 1, 0, 'th1', 'ph1', 1, 1);

        INSERT INTO llm_messages (request_id, attempt, session_id, client_request_id, state,
            user_prompt, input_tokens, output_tokens, cost_usd, sent_at)
        VALUES (1, 1, 'batch_20260501_abc123', 'c1', 'answered', 'p', 400, 100, 0.004, 1),
               (2, 1, 'batch_20260501_abc123', 'c2', 'ambiguous', 'p', NULL, NULL, NULL, 1),
               (2, 2, 'batch_20260501_abc123', 'c3', 'answered', 'p', 400, 100, 0.004, 1),
               (3, 1, 'batch_20260501_abc123', 'c4', 'answered', 'p', 400, 100, 0.0043, 1),
               (4, 1, 'batch_20260430_old000', 'c5', 'failed', 'p', 10, 0, 0, 1);

        INSERT INTO session_item (session_id, position, item_id, request_id)
        VALUES ('batch_20260501_abc123', 0, 'a', 1), ('batch_20260501_abc123', 1, 'b', 2),
               ('batch_20260501_abc123', 2, 'c', 3), ('batch_20260430_old000', 0, 'd', 4);

        INSERT INTO llm_batch_result (session_id, item_id, processed_at, outcome, answer_json,
            confidence, rationale, model_id, error_message, adjudication_id, stage, request_id,
            attempts, input_tokens, output_tokens, cost_usd)
        VALUES ('batch_20260501_abc123', 'a', 1777636900.25, 'accepted', '{"label":"yes"}', 0.97,
                'clear match' || char(27) || '[31m red' || char(10) || 'second line',
                'mock-1', NULL, '1', 'adjudicate', 1, 1, 400, 100, 0.004),
               ('batch_20260501_abc123', 'b', 1777636950, 'accepted', '{"label":"no"}', 0.91,
                'tab' || char(9) || 'bell' || char(7), 'mock-1', NULL, '2', 'adjudicate', 2, 2,
                400, 100, 0.004),
               ('batch_20260501_abc123', 'c', 1777637000, 'review', '{"label":"maybe"}', 0.6,
                'unsure', 'mock-1', NULL, '3', 'adjudicate', 3, 1, 400, 100, 0.0043),
               ('batch_20260430_old000', 'd', 1777550450, 'error', NULL, NULL, NULL, 'mock-1',
                'HTTP 500 from provider', NULL, 'adjudicate', 4, 1, 10, 0, 0);

        INSERT INTO review_item (item_id, session_id, source, status, llm_suggestion_json,
            confidence, created_at)
        VALUES ('c', 'batch_20260501_abc123', 'LLM_REVIEW', 'pending', '{"label":"maybe"}', 0.6,
                1777637000);
        "#,
    )
    .expect("seed");
}

fn seeded() -> (tempfile::TempDir, Connection) {
    let dir = tempfile::tempdir().unwrap();
    let conn = ledger(dir.path());
    seed(&conn);
    (dir, conn)
}

fn results(conn: &Connection, session: &str, format: OutputFormat) -> Result<String, ReportError> {
    let mut out = Vec::new();
    write_results(&handle(conn), session, format, &mut out)?;
    Ok(String::from_utf8(out).expect("utf-8 output"))
}

#[test]
fn results_table_shows_counters_and_strips_controls() {
    let (_dir, conn) = seeded();
    let text = results(&conn, SESSION, OutputFormat::Table).unwrap();
    for expected in [
        SESSION,
        "completed",
        "2026-05-01 12:00:00",
        "2026-05-01 12:05:00",
        "3 / 3",
        "✓ Auto-accepted: 2 (67%)",
        "⚠ Needs review:  1 (33%)",
        "✗ Rejected:      0 (0%)",
        "⨯ Errors:        0 (0%)",
        "Retries: 4",
        "429s: 2",
        "Ambiguous attempts: 1",
        "1,200 in / 300 out",
        "$0.0123",
        "$0.0200",
        "0.97",
        "clear match red second line",
        "tab bell",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in\n{text}");
    }
    assert!(
        !text.chars().any(|c| c.is_control() && c != '\n'),
        "control chars in\n{text}"
    );
    let row_lines = text.lines().filter(|l| l.contains("mock-1")).count();
    assert_eq!(row_lines, 3, "{text}");
    assert!(text.lines().all(|l| l.chars().count() <= 120), "{text}");
    assert!(!text.contains("sk-SECRET"));
}

#[test]
fn results_table_for_an_error_shows_the_error() {
    let (_dir, conn) = seeded();
    let text = results(&conn, "batch_20260430_old000", OutputFormat::Table).unwrap();
    // Stored as `error`: the one vocabulary says failed.
    assert!(text.contains("[failed]"), "{text}");
    assert!(text.contains("⨯ Errors:        1 (100%)"), "{text}");
    assert!(text.contains("HTTP 500 from provider"), "{text}");
}

#[test]
fn unknown_session_is_an_error_pointing_at_sessions() {
    let (_dir, conn) = seeded();
    for format in [OutputFormat::Table, OutputFormat::Csv, OutputFormat::Json] {
        let err = results(&conn, "batch_nope", format).unwrap_err();
        assert!(matches!(err, ReportError::UnknownSession(ref s) if s == "batch_nope"));
        let msg = err.to_string();
        assert!(
            msg.contains("batch_nope") && msg.contains("docket sessions"),
            "{msg}"
        );
    }
    let opts = ExportOptions {
        session: Some("batch_nope".into()),
        what: ExportWhat::Results,
        format: ExportFormat::Csv,
    };
    let err = export(&handle(&conn), &opts, &mut Vec::new()).unwrap_err();
    assert!(matches!(err, ReportError::UnknownSession(_)));
}

#[test]
fn results_csv_round_trips() {
    let (_dir, conn) = seeded();
    let text = results(&conn, SESSION, OutputFormat::Csv).unwrap();
    let mut rdr = csv::Reader::from_reader(text.as_bytes());
    let header: Vec<String> = rdr.headers().unwrap().iter().map(String::from).collect();
    assert_eq!(header, RESULT_COLUMNS);
    let rows: Vec<csv::StringRecord> = rdr.records().map(|r| r.unwrap()).collect();
    assert_eq!(rows.len(), 3);
    let col = |name: &str| RESULT_COLUMNS.iter().position(|c| *c == name).unwrap();
    let a = &rows[0];
    assert_eq!(&a[col("item_id")], "a");
    assert_eq!(&a[col("outcome")], "accepted");
    assert_eq!(&a[col("confidence")], "0.97");
    assert_eq!(&a[col("answer_json")], r#"{"label":"yes"}"#);
    assert_eq!(
        &a[col("rationale")],
        "clear match\u{1b}[31m red\nsecond line",
        "CSV keeps data"
    );
    assert_eq!(&a[col("error_message")], "", "null is an empty cell");
    assert_eq!(&a[col("request_id")], "1");
    assert_eq!(&a[col("processed_at")], "2026-05-01T12:01:40Z");
    assert_eq!(&a[col("cost_usd")], "0.004");
    assert_eq!(&rows[2][col("outcome")], "review");
}

#[test]
fn results_json_nests_the_answer() {
    let (_dir, conn) = seeded();
    let text = results(&conn, SESSION, OutputFormat::Json).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let arr = v.as_array().unwrap();
    assert_eq!(arr.len(), 3);
    assert_eq!(arr[0]["answer"], json!({"label": "yes"}));
    assert_eq!(arr[0]["confidence"], json!(0.97));
    assert_eq!(arr[0]["error_message"], Value::Null);
    assert_eq!(arr[0]["attempts"], json!(1));
    assert_eq!(arr[0]["processed_at"], json!("2026-05-01T12:01:40Z"));
    assert_eq!(arr[1]["item_id"], json!("b"));

    let err = results(&conn, "batch_20260430_old000", OutputFormat::Json).unwrap();
    let v: Value = serde_json::from_str(&err).unwrap();
    assert_eq!(v[0]["answer"], Value::Null);
    assert_eq!(v[0]["error_message"], json!("HTTP 500 from provider"));

    // A session with no results yet is an empty array, not an error.
    conn.execute(
        "INSERT INTO llm_batch_session (session_id, started_at, total_count, config_snapshot_json, \
         state, updated_at) VALUES ('batch_empty', 1, 0, '{}', 'running', 1)",
        [],
    )
    .unwrap();
    let empty: Value =
        serde_json::from_str(&results(&conn, "batch_empty", OutputFormat::Json).unwrap()).unwrap();
    assert_eq!(empty, json!([]));
    let table = results(&conn, "batch_empty", OutputFormat::Table).unwrap();
    assert!(table.contains("No results yet."), "{table}");
}

fn sessions(conn: &Connection, format: OutputFormat) -> String {
    let mut out = Vec::new();
    write_sessions(&handle(conn), format, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

#[test]
fn sessions_list_newest_first_with_resumable() {
    let dir = tempfile::tempdir().unwrap();
    let conn = ledger(dir.path());
    assert_eq!(
        sessions(&conn, OutputFormat::Table).trim(),
        "No sessions yet. Start one with: docket batch-adjudicate"
    );
    seed(&conn);
    let now = docket::ledger::now_ts();
    conn.execute(
        "INSERT INTO llm_batch_session (session_id, started_at, total_count, processed_count, \
         config_snapshot_json, state, desired_state, updated_at, heartbeat_at) \
         VALUES ('batch_live', ?1, 10, 4, '{}', 'running', 'paused', ?1, ?2)",
        [now - 3600.0, now],
    )
    .unwrap();

    let text = sessions(&conn, OutputFormat::Table);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    assert!(
        lines[0].starts_with("session_id") && lines[0].contains("429s"),
        "{text}"
    );
    // A pause asked of a live engine that has not obeyed yet.
    assert!(
        lines[1].starts_with("batch_live") && lines[1].contains("pausing"),
        "{text}"
    );
    assert!(lines[1].trim_end().ends_with("yes"), "{text}");
    assert!(
        lines[2].starts_with(SESSION) && lines[2].contains("2026-05-01 12:00:00"),
        "{text}"
    );
    assert!(
        lines[2].trim_end().ends_with("no"),
        "completed is not resumable: {text}"
    );
    assert!(lines[3].starts_with("batch_20260430_old000"), "{text}");
    assert!(
        lines[3].trim_end().ends_with("no"),
        "older than 7 days: {text}"
    );
    assert!(!text.contains("sk-SECRET"));

    let v: Value = serde_json::from_str(&sessions(&conn, OutputFormat::Json)).unwrap();
    let arr = v.as_array().unwrap();
    assert_eq!(arr.len(), 3);
    assert_eq!(arr[0]["session_id"], json!("batch_live"));
    assert_eq!(arr[0]["resumable"], json!(true));
    assert_eq!(arr[0]["desired_state"], json!("paused"));
    assert_eq!(arr[1]["accepted"], json!(2));
    assert_eq!(arr[1]["rate_limited"], json!(2));
    assert_eq!(arr[1]["cost_usd"], json!(0.0123));
    assert_eq!(arr[1]["started_at"], json!("2026-05-01T12:00:00Z"));
    assert_eq!(arr[1]["resumable"], json!(false));
}

/// `docket sessions` and the console's sessions pane name every state with
/// the same word, from the same columns: a killed engine (a heartbeat 10 s
/// old) reads interrupted in both, not running.
#[test]
fn sessions_and_the_console_name_states_alike() {
    use docket::ledger::console::ConsoleReads;
    let dir = tempfile::tempdir().unwrap();
    let conn = ledger(dir.path());
    let now = docket::ledger::now_ts();
    // (id, state, desired, stop after, heartbeat age; None: let go), word.
    type Case<'a> = (
        &'a str,
        &'a str,
        &'a str,
        Option<&'a str>,
        Option<f64>,
        &'a str,
    );
    let cases: &[Case] = &[
        ("s_run", "running", "running", None, Some(0.5), "running"),
        ("s_pausing", "running", "paused", None, Some(0.5), "pausing"),
        ("s_paused", "paused", "paused", None, Some(0.5), "paused"),
        (
            "s_stop",
            "running",
            "running",
            Some("a"),
            Some(0.5),
            "stopping at stage",
        ),
        (
            "s_cancelling",
            "running",
            "cancelled",
            None,
            Some(0.5),
            "cancelling",
        ),
        (
            "s_cancelled",
            "cancelled",
            "cancelled",
            None,
            None,
            "cancelled",
        ),
        (
            "s_killed",
            "running",
            "running",
            None,
            Some(10.0),
            "interrupted",
        ),
        (
            "s_killed_paused",
            "paused",
            "paused",
            None,
            Some(10.0),
            "interrupted",
        ),
        ("s_let_go", "paused", "running", Some("a"), None, "paused"),
        ("s_done", "completed", "running", None, None, "completed"),
        ("s_error", "error", "running", None, None, "failed"),
    ];
    for (i, (id, state, desired, stop, age, _)) in cases.iter().enumerate() {
        conn.execute(
            "INSERT INTO llm_batch_session (session_id, started_at, total_count, config_snapshot_json, \
             state, desired_state, stop_after_stage, updated_at, heartbeat_at) \
             VALUES (?1, ?2, 10, '{}', ?3, ?4, ?5, ?2, ?6)",
            rusqlite::params![id, now - 100.0 + i as f64, state, desired, stop, age.map(|a| now - a)],
        )
        .unwrap();
    }
    let v: Value = serde_json::from_str(&sessions(&conn, OutputFormat::Json)).unwrap();
    let cli: std::collections::HashMap<String, String> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["session_id"].as_str().unwrap().to_string(),
                s["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let console = handle(&conn).sessions().unwrap();
    assert_eq!(console.len(), cases.len());
    for (id, .., word) in cases {
        let pane = console.iter().find(|s| s.session_id == *id).unwrap();
        assert_eq!(pane.shown.word(), *word, "console, {id}");
        assert_eq!(cli[*id], *word, "docket sessions, {id}");
    }
    let table = sessions(&conn, OutputFormat::Table);
    let killed = table.lines().find(|l| l.starts_with("s_killed ")).unwrap();
    assert!(killed.contains("interrupted"), "{table}");
}

fn export_text(
    conn: &Connection,
    what: ExportWhat,
    format: ExportFormat,
    session: Option<&str>,
) -> (u64, String) {
    let opts = ExportOptions {
        session: session.map(String::from),
        what,
        format,
    };
    let mut out = Vec::new();
    let n = export(&handle(conn), &opts, &mut out).unwrap();
    (n, String::from_utf8(out).unwrap())
}

fn csv_rows(text: &str, columns: &[&str]) -> Vec<csv::StringRecord> {
    let mut rdr = csv::Reader::from_reader(text.as_bytes());
    let header: Vec<String> = rdr.headers().unwrap().iter().map(String::from).collect();
    assert_eq!(header, columns);
    rdr.records().map(|r| r.unwrap()).collect()
}

#[test]
fn export_decisions_csv_and_jsonl() {
    let (_dir, conn) = seeded();
    let (n, text) = export_text(&conn, ExportWhat::Decisions, ExportFormat::Csv, None);
    assert_eq!(n, 4);
    let rows = csv_rows(&text, DECISION_COLUMNS);
    assert_eq!(rows.len(), 4);
    let col = |name: &str| DECISION_COLUMNS.iter().position(|c| *c == name).unwrap();
    assert_eq!(&rows[0][col("item_id")], "a");
    assert_eq!(&rows[0][col("decided_answer_json")], r#"{"label":"yes"}"#);
    assert_eq!(&rows[0][col("decided_at")], "2026-05-01T12:01:40Z");
    assert_eq!(&rows[0][col("confidence")], "0.97");
    assert_eq!(&rows[0][col("last_outcome")], "accepted");
    assert_eq!(&rows[0][col("last_session_id")], SESSION);
    assert_eq!(&rows[2][col("review_status")], "pending");
    assert_eq!(&rows[2][col("decided_by")], "");
    assert_eq!(&rows[3][col("last_outcome")], "error");
    assert_eq!(&rows[3][col("last_session_id")], "batch_20260430_old000");

    let (n, text) = export_text(
        &conn,
        ExportWhat::Decisions,
        ExportFormat::Jsonl,
        Some(SESSION),
    );
    assert_eq!(n, 3, "only the session's items");
    let objs: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(objs.len(), 3);
    assert_eq!(objs[0]["evidence_json"], json!({"title": "A"}));
    assert_eq!(objs[0]["decided_answer_json"], json!({"label": "yes"}));
    assert_eq!(objs[2]["decided_answer_json"], Value::Null);
    assert_eq!(objs[2]["confidence"], Value::Null);
    // Keys in the documented order.
    let first_line = text.lines().next().unwrap();
    let mut last = 0;
    for c in DECISION_COLUMNS {
        let at = first_line.find(&format!("\"{c}\":")).unwrap();
        assert!(at >= last, "{c} out of order in {first_line}");
        last = at;
    }
    assert!(!text.contains("sk-SECRET"));

    // The newest result wins, whichever session it came from.
    conn.execute_batch(
        "INSERT INTO llm_batch_session (session_id, started_at, total_count, config_snapshot_json, \
         state, updated_at) VALUES ('batch_20260502_later0', 1777723200, 1, '{}', 'completed', 1); \
         INSERT INTO llm_batch_result (session_id, item_id, processed_at, outcome, stage) \
         VALUES ('batch_20260502_later0', 'c', 1777723300, 'rejected', 'adjudicate');",
    )
    .unwrap();
    let (_, text) = export_text(&conn, ExportWhat::Decisions, ExportFormat::Csv, None);
    let rows = csv_rows(&text, DECISION_COLUMNS);
    assert_eq!(&rows[2][col("item_id")], "c");
    assert_eq!(&rows[2][col("last_outcome")], "rejected");
    assert_eq!(&rows[2][col("last_session_id")], "batch_20260502_later0");
    assert_eq!(&rows[0][col("last_outcome")], "accepted");
}

#[test]
fn export_results_all_sessions_and_one() {
    let (_dir, conn) = seeded();
    let (n, text) = export_text(&conn, ExportWhat::Results, ExportFormat::Csv, None);
    assert_eq!(n, 4);
    assert_eq!(csv_rows(&text, RESULT_COLUMNS).len(), 4);
    let (n, text) = export_text(
        &conn,
        ExportWhat::Results,
        ExportFormat::Jsonl,
        Some(SESSION),
    );
    assert_eq!(n, 3);
    let objs: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(objs.len(), 3);
    assert_eq!(objs[0]["answer_json"], json!({"label": "yes"}));
    assert_eq!(objs[0]["cost_usd"], json!(0.004));
    assert!(!text.contains("sk-SECRET"));
}

#[test]
fn export_requests_sums_messages() {
    let (_dir, conn) = seeded();
    let (n, text) = export_text(&conn, ExportWhat::Requests, ExportFormat::Csv, None);
    assert_eq!(n, 4);
    let rows = csv_rows(&text, REQUEST_COLUMNS);
    let col = |name: &str| REQUEST_COLUMNS.iter().position(|c| *c == name).unwrap();
    let b = &rows[1];
    assert_eq!(&b[col("request_id")], "2");
    assert_eq!(&b[col("attempt")], "2");
    assert_eq!(&b[col("transport_retries")], "1");
    assert_eq!(&b[col("input_tokens")], "400");
    assert_eq!(&b[col("output_tokens")], "100");
    assert_eq!(&b[col("cost_usd")], "0.004");
    assert_eq!(&b[col("ambiguous_attempts")], "1");
    assert_eq!(&rows[0][col("ambiguous_attempts")], "0");
    assert_eq!(&rows[3][col("cost_usd")], "0.0", "floats stay floats");

    let (n, text) = export_text(
        &conn,
        ExportWhat::Requests,
        ExportFormat::Jsonl,
        Some("batch_20260430_old000"),
    );
    assert_eq!(n, 1);
    let v: Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(v["request_id"], json!(4));
    assert_eq!(v["status"], json!("error"));
    assert_eq!(v["last_error"], Value::Null);
    assert_eq!(v["cost_usd"], json!(0.0));
}

#[test]
fn export_of_an_empty_ledger_is_just_a_header() {
    let dir = tempfile::tempdir().unwrap();
    let conn = ledger(dir.path());
    let (n, text) = export_text(&conn, ExportWhat::Decisions, ExportFormat::Csv, None);
    assert_eq!(n, 0);
    assert_eq!(text, format!("{}\n", DECISION_COLUMNS.join(",")));
    let (n, text) = export_text(&conn, ExportWhat::Requests, ExportFormat::Jsonl, None);
    assert_eq!((n, text.as_str()), (0, ""));
}

/// Row I2: a header naming a column twice, and a file delimited by
/// something other than commas, are refused before anything is imported,
/// naming the file, the line and what is wrong.
#[test]
fn i2_a_duplicate_header_or_another_delimiter_is_refused_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let conn = ledger(dir.path());
    let dup = write_file(dir.path(), "dup.csv", b"id,title,title\na1,x,y\n");
    let e = import_file(&mut handle(&conn), &dup, &opts())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("dup.csv:1") && e.contains("\"title\" twice"),
        "{e}"
    );
    for (name, bytes, word) in [
        ("semi.csv", &b"id;title;artist\na2;x;y\n"[..], "semicolons"),
        ("tabs.csv", &b"id\ttitle\na3\tx\n"[..], "tabs"),
    ] {
        let path = write_file(dir.path(), name, bytes);
        let e = import_file(&mut handle(&conn), &path, &opts())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("{name}:1")) && e.contains(word) && e.contains("comma-separated"),
            "{e}"
        );
    }
    // A comma file without the id column gets no delimiter hint.
    let plain = write_file(dir.path(), "plain.csv", b"key,title\nk,x\n");
    let e = import_file(&mut handle(&conn), &plain, &opts())
        .unwrap_err()
        .to_string();
    assert!(!e.contains("delimited by"), "{e}");
    let n: i64 = conn
        .query_row("SELECT COUNT(*) FROM decision", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 0, "nothing imported");
}

/// Row I2: importing the same CSV file again changes nothing: every row is
/// already present (same id, same evidence), no row is bad, and the
/// items' evidence is byte for byte what it was.
#[test]
fn i2_re_importing_a_csv_is_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let conn = ledger(dir.path());
    let path = write_file(
        dir.path(),
        "items.csv",
        "id,title,artist\nb1,\"Hey, Jude\",The Beatles\nb2,=SUM(A1),\"x \"\"quoted\"\"\"\nb3,héllo,ünï\n".as_bytes(),
    );
    let first = import_file(&mut handle(&conn), &path, &opts()).unwrap();
    assert_eq!((first.imported, first.bad_count), (3, 0));
    let evidence = |conn: &Connection| -> Vec<(String, String)> {
        conn.prepare("SELECT item_id, evidence_json FROM decision ORDER BY item_id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    let before = evidence(&conn);
    let again = import_file(&mut handle(&conn), &path, &opts()).unwrap();
    assert_eq!(
        (again.rows_read, again.imported, again.bad_count),
        (3, 0, 0)
    );
    assert_eq!(evidence(&conn), before);
}
