//! `docket export --what items|requests` over staged sessions, as CSV, JSONL
//! and Parquet: schema-driven columns and types, one row per item or request.

use docket_testkit as support;

use std::path::Path;
use std::process::Command;

use docket::ledger::Ledger;
use docket::report::{
    ExportFormat, ExportOptions, ExportWhat, ITEM_COLUMNS, REQUEST_COLUMNS, ReportError, export,
    export_file, export_in,
};
use parquet::basic::Type as Physical;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;
use rusqlite::Connection;
use serde_json::{Value, json};

const TWO: &str = "batch_two";
const TWO_SPARSE: &str = "batch_two_sparse";
const GYM: &str = "batch_gym";

const ADJ_SCHEMA: &str = r#"{
  "type": "object",
  "properties": {
    "label": {"enum": ["yes", "no", "maybe"]},
    "confidence": {"type": "number"},
    "rationale": {"type": "string"},
    "details": {
      "type": "object",
      "properties": {"source": {"type": "string"}, "score": {"type": "integer"}}
    },
    "tags": {"type": "array", "items": {"type": "string"}}
  },
  "required": ["label", "confidence", "rationale"]
}"#;

const CRITIC_SCHEMA: &str = r#"{
  "type": "object",
  "properties": {
    "verdict": {"type": "string", "enum": ["agree", "disagree"]},
    "agree": {"type": "boolean"},
    "severity": {"type": ["integer", "null"]}
  }
}"#;

const RUBRIC_SCHEMA: &str = r#"{
  "type": "object",
  "properties": {
    "title": {"type": "string"},
    "criteria": {"type": "array", "items": {"type": "string"}},
    "confidence": {"type": "number"}
  }
}"#;

const SCORE_SCHEMA: &str = r#"{
  "type": "object",
  "properties": {
    "score": {"type": "integer"},
    "confidence": {"type": "number"},
    "rationale": {"type": "string"}
  }
}"#;

/// The two-stage job's snapshot: it also names an env var, which must never
/// reach an export.
const TWO_SNAPSHOT: &str = r#"{"config": {
  "providers": {"main": {"kind": "openai", "api_key_env": "SECRET_ENV_NAME"}},
  "stages": [
    {"name": "adjudicate", "provider": "main", "template": "p.j2",
     "gate": {"kind": "json_schema", "schema": "schemas/adjudicate.json"}},
    {"name": "critic", "provider": "main", "template": "c.j2", "critic_of": "adjudicate",
     "gate": {"kind": "json_schema", "schema": "schemas/critic.json"}}
  ]}}"#;

const GYM_SNAPSHOT: &str = r#"{"config": {
  "stages": [
    {"name": "rubric_gen", "gate": {"kind": "json_schema", "schema": "schemas/rubric.json"}},
    {"name": "rubric_critic", "critic_of": "rubric_gen",
     "gate": {"kind": "regex",
              "pattern": "(?s)VERDICT:\\s*(?P<verdict>\\w+).*?CONFIDENCE:\\s*(?P<confidence>[0-9.]+).*?NOTE:\\s*(?P<note>.*)"}},
    {"name": "score_gen", "gate": {"kind": "json_schema", "schema": "schemas/score.json"}},
    {"name": "score_critic", "critic_of": "score_gen",
     "gate": {"kind": "json_schema", "schema": "schemas/missing.json"}}
  ]}}"#;

struct Ws {
    dir: tempfile::TempDir,
}

impl Ws {
    fn new() -> Ws {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("schemas")).unwrap();
        for (name, text) in [
            ("adjudicate.json", ADJ_SCHEMA),
            ("critic.json", CRITIC_SCHEMA),
            ("rubric.json", RUBRIC_SCHEMA),
            ("score.json", SCORE_SCHEMA),
        ] {
            std::fs::write(dir.path().join("schemas").join(name), text).unwrap();
        }
        let ws = Ws { dir };
        seed(&ws.conn());
        ws
    }
    fn path(&self) -> &Path {
        self.dir.path()
    }
    fn conn(&self) -> Connection {
        docket::ledger::open(&self.dir.path().join("docket.sqlite")).unwrap()
    }
    /// The handle the CLI exports through.
    fn handle(&self) -> Ledger {
        Ledger::open(self.dir.path().join("docket.sqlite")).unwrap()
    }
}

fn session(conn: &Connection, id: &str, snapshot: &str) {
    conn.execute(
        "INSERT INTO llm_batch_session (session_id, started_at, total_count, config_snapshot_json, \
         state, updated_at) VALUES (?1, 1777636800, 3, ?2, 'completed', 1777637000)",
        [id, snapshot],
    )
    .unwrap();
}

#[allow(clippy::too_many_arguments)]
fn request(
    conn: &Connection,
    id: i64,
    item: &str,
    stage: &str,
    status: &str,
    attempt: i64,
    gate_failures: i64,
    parsed: Option<&str>,
) {
    conn.execute(
        "INSERT INTO llm_requests (request_id, item_id, stage, provider, model, status, attempt, \
         gate_failures, last_error, template_hash, params_hash, parsed_output_json, created_at, \
         updated_at) VALUES (?1, ?2, ?3, 'main', 'gpt-x', ?4, ?5, ?6, \
         CASE WHEN ?4 = 'error' THEN 'gate: not JSON' END, 'th-' || ?3, 'ph1', ?7, 1, 1)",
        rusqlite::params![id, item, stage, status, attempt, gate_failures, parsed],
    )
    .unwrap();
}

fn link(conn: &Connection, sess: &str, item: &str, stage: &str, pos: i64, req: i64, state: &str) {
    conn.execute(
        "INSERT INTO session_request (session_id, item_id, stage, position, request_id, state, \
         updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, 1)",
        rusqlite::params![sess, item, stage, pos, req, state],
    )
    .unwrap();
}

fn message(conn: &Connection, sess: &str, req: i64, attempt: i64, tokens: (i64, i64), cost: f64) {
    conn.execute(
        "INSERT INTO llm_messages (request_id, attempt, session_id, client_request_id, state, \
         user_prompt, input_tokens, output_tokens, cost_usd, sent_at) \
         VALUES (?1, ?2, ?3, ?3 || '-' || ?1 || '-' || ?2, 'answered', 'p', ?4, ?5, ?6, 1)",
        rusqlite::params![req, attempt, sess, tokens.0, tokens.1, cost],
    )
    .unwrap();
}

fn seed(conn: &Connection) {
    conn.execute_batch(
        "INSERT INTO decision (item_id, state, evidence_json, decided_answer_json, decided_by, \
           decided_at, imported_at, updated_at) VALUES \
           ('i1', 'decided', '{}', '{\"label\":\"yes\"}', 'llm_auto_accept', 1777636900, 1, 1), \
           ('i2', 'decided', '{}', '{\"label\":\"no\"}', 'review:alice', 1777636990, 1, 1), \
           ('i3', 'indeterminate', '{}', NULL, NULL, NULL, 1, 1), \
           ('s1', 'indeterminate', '{}', NULL, NULL, NULL, 1, 1), \
           ('g1', 'indeterminate', '{}', NULL, NULL, NULL, 1, 1), \
           ('g2', 'indeterminate', '{}', NULL, NULL, NULL, 1, 1);",
    )
    .unwrap();

    // Two stages: adjudicate, then its critic.
    session(conn, TWO, TWO_SNAPSHOT);
    request(
        conn,
        1,
        "i1",
        "adjudicate",
        "completed",
        1,
        0,
        Some(
            r#"{"label":"yes","confidence":0.9,"rationale":"clear, \"quoted\"","details":{"source":"db","score":3},"tags":["a","b"]}"#,
        ),
    );
    request(
        conn,
        2,
        "i1",
        "critic",
        "completed",
        1,
        0,
        Some(r#"{"verdict":"agree","agree":true,"severity":1}"#),
    );
    request(
        conn,
        3,
        "i2",
        "adjudicate",
        "completed",
        2,
        1,
        Some(r#"{"label":"no","confidence":1,"rationale":"line one\nline two"}"#),
    );
    request(
        conn,
        4,
        "i2",
        "critic",
        "completed",
        1,
        0,
        Some(r#"{"verdict":"disagree","agree":false,"severity":null}"#),
    );
    request(conn, 5, "i3", "adjudicate", "error", 3, 3, None);
    request(conn, 6, "i3", "critic", "pending", 0, 0, None);
    for (item, pos) in [("i1", 0), ("i2", 1), ("i3", 2)] {
        conn.execute(
            "INSERT INTO session_item (session_id, position, item_id, request_id) \
             VALUES (?1, ?2, ?3, (SELECT request_id FROM llm_requests \
                                  WHERE item_id = ?3 AND stage = 'adjudicate'))",
            rusqlite::params![TWO, pos, item],
        )
        .unwrap();
    }
    link(conn, TWO, "i1", "adjudicate", 0, 1, "passed");
    link(conn, TWO, "i1", "critic", 1, 2, "passed");
    link(conn, TWO, "i2", "adjudicate", 0, 3, "passed");
    link(conn, TWO, "i2", "critic", 1, 4, "passed");
    link(conn, TWO, "i3", "adjudicate", 0, 5, "failed");
    link(conn, TWO, "i3", "critic", 1, 6, "skipped");
    message(conn, TWO, 1, 1, (100, 20), 0.001);
    message(conn, TWO, 2, 1, (50, 10), 0.0005);
    message(conn, TWO, 3, 1, (100, 0), 0.0007);
    message(conn, TWO, 3, 2, (100, 25), 0.001);
    message(conn, TWO, 4, 1, (40, 8), 0.0004);
    for a in 1..=3 {
        message(conn, TWO, 5, a, (90, 5), 0.0002);
    }
    conn.execute_batch(
        "INSERT INTO llm_batch_result (session_id, item_id, processed_at, outcome, answer_json, \
           confidence, rationale, stage, request_id, attempts, input_tokens, output_tokens, cost_usd, \
           critic_json, critic_verdict, routing_note, error_message) VALUES \
         ('batch_two', 'i1', 1777636900, 'accepted', '{\"label\":\"yes\"}', 0.9, 'clear', \
          'adjudicate', 1, 1, 100, 20, 0.001, '{\"verdict\":\"agree\"}', 'agree', 'critic agreed', NULL), \
         ('batch_two', 'i2', 1777636950, 'review', '{\"label\":\"no\"}', 1.0, 'line one', \
          'adjudicate', 3, 2, 200, 25, 0.0017, '{\"verdict\":\"disagree\"}', 'disagree', \
          'critic disagreed: review', NULL), \
         ('batch_two', 'i3', 1777636960, 'error', NULL, NULL, NULL, 'adjudicate', 5, 3, 270, 15, \
          0.0006, NULL, NULL, NULL, 'gate failed 3 times'); \
         INSERT INTO review_item (item_id, session_id, source, status, llm_suggestion_json, \
           confidence, created_at, decided_by, decided_at) VALUES \
         ('i2', 'batch_two', 'LLM_REVIEW', 'accepted', '{\"label\":\"no\"}', 1.0, 1777636950, \
          'review:alice', 1777636990);",
    )
    .unwrap();

    // The same job again, with answers that lack the optional fields.
    session(conn, TWO_SPARSE, TWO_SNAPSHOT);
    request(
        conn,
        20,
        "s1",
        "adjudicate",
        "completed",
        1,
        0,
        Some(r#"{"label":"maybe","confidence":0.5,"rationale":"thin"}"#),
    );
    request(conn, 21, "s1", "critic", "pending", 0, 0, None);
    link(conn, TWO_SPARSE, "s1", "adjudicate", 0, 20, "passed");
    link(conn, TWO_SPARSE, "s1", "critic", 1, 21, "pending");

    // judge-gym: rubric_gen, rubric_critic (regex), score_gen, score_critic
    // (its schema file is missing: the data's keys, sorted).
    session(conn, GYM, GYM_SNAPSHOT);
    // (request id, item, stage, position, state, parsed output)
    type Row<'a> = (i64, &'a str, &'a str, i64, &'a str, Option<&'a str>);
    let gym: &[Row] = &[
        (
            30,
            "g1",
            "rubric_gen",
            0,
            "passed",
            Some(r#"{"title":"R1","criteria":["c1","c2"],"confidence":0.8}"#),
        ),
        (
            31,
            "g1",
            "rubric_critic",
            1,
            "passed",
            Some(r#"{"verdict":"ok","confidence":0.75,"note":"fine"}"#),
        ),
        (
            32,
            "g1",
            "score_gen",
            2,
            "passed",
            // The answer left the score out; it was asked on its own.
            Some(r#"{"confidence":0.7,"rationale":"good"}"#),
        ),
        (
            33,
            "g1",
            "score_critic",
            3,
            "passed",
            Some(r#"{"zz_last":"x","agree":true,"adjusted":{"score":3}}"#),
        ),
        (
            40,
            "g2",
            "rubric_gen",
            0,
            "passed",
            Some(r#"{"title":"R2","criteria":[],"confidence":0.6}"#),
        ),
        (
            41,
            "g2",
            "rubric_critic",
            1,
            "passed",
            Some(r#"{"verdict":"weak","confidence":0.4,"note":""}"#),
        ),
        (42, "g2", "score_gen", 2, "failed", None),
        (43, "g2", "score_critic", 3, "skipped", None),
    ];
    for (id, item, stage, pos, state, parsed) in gym {
        let status = match *state {
            "passed" => "completed",
            "failed" => "error",
            _ => "pending",
        };
        let attempt = if *state == "skipped" { 0 } else { 1 };
        request(conn, *id, item, stage, status, attempt, 0, *parsed);
        link(conn, GYM, item, stage, *pos, *id, state);
    }
    // Structured batching's follow-up ("STAGE:CRITERION"), merged into the
    // stage's output: no columns of its own, its cost in the item's totals.
    request(
        conn,
        34,
        "g1",
        "score_gen:score",
        "completed",
        1,
        0,
        Some(r#"{"score":4}"#),
    );
    link(conn, GYM, "g1", "score_gen:score", 2, 34, "passed");
    message(conn, GYM, 34, 1, (10, 2), 0.0001);
    conn.execute(
        "UPDATE session_request SET output_json = ?1 \
         WHERE session_id = ?2 AND item_id = 'g1' AND stage = 'score_gen'",
        [r#"{"confidence":0.7,"rationale":"good","score":4}"#, GYM],
    )
    .unwrap();
    conn.execute_batch(
        "INSERT INTO session_item (session_id, position, item_id, request_id) VALUES \
           ('batch_gym', 0, 'g1', 30), ('batch_gym', 1, 'g2', 40); \
         INSERT INTO llm_batch_result (session_id, item_id, processed_at, outcome, answer_json, \
           confidence, stage, request_id, attempts) VALUES \
         ('batch_gym', 'g1', 1777637000, 'accepted', '{\"score\":4}', 0.7, 'score_gen', 32, 1), \
         ('batch_gym', 'g2', 1777637001, 'error', NULL, NULL, 'score_gen', 42, 1);",
    )
    .unwrap();
}

fn opts(session: &str, what: ExportWhat, format: ExportFormat) -> ExportOptions {
    ExportOptions {
        session: Some(session.into()),
        what,
        format,
    }
}

fn text(ws: &Ws, session: &str, what: ExportWhat, format: ExportFormat) -> (u64, String) {
    let mut out = Vec::new();
    let n = export_in(
        &ws.handle(),
        &opts(session, what, format),
        ws.path(),
        &mut out,
    )
    .unwrap();
    (n, String::from_utf8(out).unwrap())
}

fn header(csv_text: &str) -> Vec<String> {
    let mut r = csv::Reader::from_reader(csv_text.as_bytes());
    r.headers().unwrap().iter().map(String::from).collect()
}

fn jsonl(text: &str) -> Vec<serde_json::Map<String, Value>> {
    text.lines()
        .map(|l| match serde_json::from_str(l).unwrap() {
            Value::Object(m) => m,
            v => panic!("not an object: {v}"),
        })
        .collect()
}

fn stage_cols(stage: &str, fields: &[&str]) -> Vec<String> {
    ["request_id", "state", "attempts", "gate_failures"]
        .iter()
        .chain(fields)
        .map(|c| format!("{stage}__{c}"))
        .collect()
}

fn two_header() -> Vec<String> {
    let mut h: Vec<String> = ITEM_COLUMNS.iter().map(|c| c.to_string()).collect();
    h.extend(stage_cols(
        "adjudicate",
        &[
            "label",
            "confidence",
            "rationale",
            "details__source",
            "details__score",
            "tags",
        ],
    ));
    h.extend(stage_cols("critic", &["verdict", "agree", "severity"]));
    h
}

#[test]
fn items_header_follows_the_stages_and_their_schemas() {
    let ws = Ws::new();
    let (n, csv_text) = text(&ws, TWO, ExportWhat::Items, ExportFormat::Csv);
    assert_eq!(n, 3);
    assert_eq!(header(&csv_text), two_header());
    assert_eq!(
        &ITEM_COLUMNS[..8],
        &[
            "item_id",
            "position",
            "outcome",
            "confidence",
            "rationale",
            "routing_note",
            "critic_verdict",
            "answer_stage"
        ]
    );
    assert!(
        !csv_text.contains("SECRET_ENV_NAME"),
        "no snapshot in exports"
    );

    let (n, gym) = text(&ws, GYM, ExportWhat::Items, ExportFormat::Csv);
    assert_eq!(n, 2);
    let mut want: Vec<String> = ITEM_COLUMNS.iter().map(|c| c.to_string()).collect();
    want.extend(stage_cols(
        "rubric_gen",
        &["title", "criteria", "confidence"],
    ));
    // Regex gate: the named captures in pattern order.
    want.extend(stage_cols(
        "rubric_critic",
        &["verdict", "confidence", "note"],
    ));
    want.extend(stage_cols(
        "score_gen",
        &["score", "confidence", "rationale"],
    ));
    // Unreadable schema: the keys in the data, sorted, nested ones flattened.
    want.extend(stage_cols(
        "score_critic",
        &["adjusted__score", "agree", "zz_last"],
    ));
    assert_eq!(header(&gym), want);
}

#[test]
fn items_jsonl_values_and_types() {
    let ws = Ws::new();
    let (_, t) = text(&ws, TWO, ExportWhat::Items, ExportFormat::Jsonl);
    let rows = jsonl(&t);
    assert_eq!(rows.len(), 3);
    for r in &rows {
        let keys: Vec<&String> = r.keys().collect();
        let mut want = two_header();
        want.sort();
        let mut keys: Vec<String> = keys.into_iter().cloned().collect();
        keys.sort();
        assert_eq!(keys, want, "every key on every line");
    }
    // Keys in column order on the line itself.
    let first = t.lines().next().unwrap();
    let mut last = 0;
    for c in two_header() {
        let at = first.find(&format!("\"{c}\":")).unwrap();
        assert!(at >= last, "{c} out of order");
        last = at;
    }

    let i1 = &rows[0];
    assert_eq!(i1["item_id"], json!("i1"));
    assert_eq!(i1["position"], json!(0));
    assert_eq!(i1["outcome"], json!("accepted"));
    assert_eq!(i1["confidence"], json!(0.9));
    assert_eq!(i1["critic_verdict"], json!("agree"));
    assert_eq!(i1["routing_note"], json!("critic agreed"));
    assert_eq!(i1["decision_state"], json!("decided"));
    assert_eq!(i1["decided_by"], json!("llm_auto_accept"));
    assert_eq!(i1["decided_at"], json!("2026-05-01T12:01:40Z"));
    assert_eq!(i1["review_status"], Value::Null);
    // Totals over both stages' attempts.
    assert_eq!(i1["attempts"], json!(2));
    assert_eq!(i1["input_tokens"], json!(150));
    assert_eq!(i1["output_tokens"], json!(30));
    assert!((i1["cost_usd"].as_f64().unwrap() - 0.0015).abs() < 1e-12);
    assert_eq!(i1["adjudicate__request_id"], json!(1));
    assert_eq!(i1["adjudicate__state"], json!("passed"));
    assert_eq!(i1["adjudicate__label"], json!("yes"));
    assert!(i1["adjudicate__confidence"].is_f64());
    assert_eq!(i1["adjudicate__details__source"], json!("db"));
    assert!(i1["adjudicate__details__score"].is_i64());
    assert_eq!(i1["adjudicate__details__score"], json!(3));
    assert_eq!(
        i1["adjudicate__tags"],
        json!(r#"["a","b"]"#),
        "arrays as JSON text"
    );
    assert_eq!(i1["critic__agree"], json!(true));
    assert_eq!(i1["critic__severity"], json!(1));

    let i2 = &rows[1];
    assert_eq!(i2["outcome"], json!("review"));
    assert_eq!(i2["review_status"], json!("accepted"));
    assert_eq!(i2["review_decided_by"], json!("review:alice"));
    assert_eq!(i2["review_decided_at"], json!("2026-05-01T12:03:10Z"));
    assert_eq!(i2["adjudicate__attempts"], json!(2));
    assert_eq!(i2["adjudicate__gate_failures"], json!(1));
    // An integer answer in a number field stays a float.
    assert!(i2["adjudicate__confidence"].is_f64());
    assert_eq!(i2["adjudicate__confidence"].as_f64(), Some(1.0));
    assert_eq!(i2["adjudicate__details__source"], Value::Null);
    assert_eq!(i2["adjudicate__tags"], Value::Null);
    assert_eq!(i2["critic__agree"], json!(false));
    assert_eq!(i2["critic__severity"], Value::Null);

    let i3 = &rows[2];
    assert_eq!(i3["outcome"], json!("error"));
    assert_eq!(i3["error_message"], json!("gate failed 3 times"));
    assert_eq!(i3["confidence"], Value::Null);
    assert_eq!(i3["adjudicate__state"], json!("failed"));
    assert_eq!(i3["adjudicate__gate_failures"], json!(3));
    assert_eq!(i3["adjudicate__label"], Value::Null);
    assert_eq!(i3["critic__state"], json!("skipped"));
    assert_eq!(i3["critic__attempts"], json!(0));
    assert_eq!(i3["critic__verdict"], Value::Null);
    assert_eq!(i3["attempts"], json!(3));
    assert_eq!(i3["input_tokens"], json!(270));

    // The regex stage: captures are strings, the confidence a float.
    let (_, t) = text(&ws, GYM, ExportWhat::Items, ExportFormat::Jsonl);
    let g = jsonl(&t);
    assert_eq!(g[0]["rubric_critic__verdict"], json!("ok"));
    assert_eq!(g[0]["rubric_critic__confidence"], json!(0.75));
    assert_eq!(g[0]["rubric_gen__criteria"], json!(r#"["c1","c2"]"#));
    // From the stage's merged output (the follow-up's answer).
    assert_eq!(g[0]["score_gen__score"], json!(4));
    assert_eq!(g[0]["attempts"], json!(5), "four stages and the follow-up");
    assert_eq!(g[0]["input_tokens"], json!(10));
    assert_eq!(g[0]["score_critic__adjusted__score"], json!(3));
    assert_eq!(g[0]["score_critic__agree"], json!(true));
    assert_eq!(g[1]["outcome"], json!("error"));
    assert_eq!(g[1]["score_gen__state"], json!("failed"));
    assert_eq!(g[1]["score_critic__state"], json!("skipped"));
    assert_eq!(g[1]["score_gen__score"], Value::Null);
    assert_eq!(g[1]["rubric_critic__note"], json!(""));
}

#[test]
fn items_csv_reads_back_with_pythons_csv_module() {
    let ws = Ws::new();
    let (_, t) = text(&ws, TWO, ExportWhat::Items, ExportFormat::Csv);
    let path = ws.path().join("items.csv");
    std::fs::write(&path, &t).unwrap();

    // The Rust reader first: one header, three rows, the values.
    let mut r = csv::Reader::from_reader(t.as_bytes());
    let rows: Vec<csv::StringRecord> = r.records().map(|x| x.unwrap()).collect();
    let h = two_header();
    let col = |n: &str| h.iter().position(|c| c == n).unwrap();
    assert_eq!(rows.len(), 3);
    assert_eq!(&rows[0][col("adjudicate__rationale")], "clear, \"quoted\"");
    assert_eq!(&rows[0][col("adjudicate__confidence")], "0.9");
    assert_eq!(&rows[1][col("adjudicate__confidence")], "1.0");
    assert_eq!(&rows[1][col("adjudicate__rationale")], "line one\nline two");
    assert_eq!(&rows[1][col("critic__agree")], "false");
    assert_eq!(
        &rows[2][col("critic__verdict")],
        "",
        "null is an empty cell"
    );
    assert_eq!(&rows[0][col("adjudicate__tags")], r#"["a","b"]"#);

    let script = "import csv, json, sys\n\
                  rows = list(csv.reader(open(sys.argv[1], newline='')))\n\
                  print(json.dumps(rows))";
    let out = match Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(&path)
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            eprintln!("python3 missing ({e}): skipping the python read-back");
            return;
        }
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let py: Vec<Vec<String>> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(py.len(), 4, "header + 3 rows");
    assert_eq!(py[0], h);
    for (i, row) in py[1..].iter().enumerate() {
        assert_eq!(row.len(), h.len());
        let rust: Vec<&str> = rows[i].iter().collect();
        assert_eq!(row, &rust, "row {i} reads the same in python");
    }
    assert_eq!(py[2][col("adjudicate__rationale")], "line one\nline two");
}

fn parquet_file(ws: &Ws, session: &str, what: ExportWhat, name: &str) -> std::path::PathBuf {
    let path = ws.path().join(name);
    export_file(
        &ws.handle(),
        &opts(session, what, ExportFormat::Parquet),
        ws.path(),
        &path,
    )
    .unwrap();
    path
}

fn parquet_schema(path: &Path) -> Vec<(String, Physical)> {
    let reader = SerializedFileReader::new(std::fs::File::open(path).unwrap()).unwrap();
    let descr = reader.metadata().file_metadata().schema_descr_ptr();
    descr
        .columns()
        .iter()
        .map(|c| (c.name().to_string(), c.physical_type()))
        .collect()
}

fn parquet_rows(path: &Path) -> Vec<Vec<(String, Field)>> {
    let reader = SerializedFileReader::new(std::fs::File::open(path).unwrap()).unwrap();
    reader
        .get_row_iter(None)
        .unwrap()
        .map(|r| {
            r.unwrap()
                .get_column_iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .collect()
}

fn field<'a>(row: &'a [(String, Field)], name: &str) -> &'a Field {
    &row.iter().find(|(k, _)| k == name).unwrap().1
}

#[test]
fn items_parquet_has_the_same_columns_and_types() {
    let ws = Ws::new();
    let path = parquet_file(&ws, TWO, ExportWhat::Items, "items.parquet");
    assert_eq!(&std::fs::read(&path).unwrap()[..4], b"PAR1");
    let schema = parquet_schema(&path);
    let names: Vec<String> = schema.iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(names, two_header());
    let ty = |n: &str| schema.iter().find(|(c, _)| c == n).unwrap().1;
    assert_eq!(ty("item_id"), Physical::BYTE_ARRAY);
    assert_eq!(ty("position"), Physical::INT64);
    assert_eq!(ty("confidence"), Physical::DOUBLE);
    assert_eq!(ty("decided_at"), Physical::BYTE_ARRAY);
    assert_eq!(ty("cost_usd"), Physical::DOUBLE);
    assert_eq!(ty("adjudicate__request_id"), Physical::INT64);
    assert_eq!(ty("adjudicate__confidence"), Physical::DOUBLE);
    assert_eq!(ty("adjudicate__details__score"), Physical::INT64);
    assert_eq!(ty("adjudicate__tags"), Physical::BYTE_ARRAY);
    assert_eq!(ty("critic__agree"), Physical::BOOLEAN);

    let rows = parquet_rows(&path);
    assert_eq!(rows.len(), 3);
    assert_eq!(field(&rows[0], "item_id"), &Field::Str("i1".into()));
    assert_eq!(
        field(&rows[0], "adjudicate__confidence"),
        &Field::Double(0.9)
    );
    assert_eq!(
        field(&rows[0], "adjudicate__details__score"),
        &Field::Long(3)
    );
    assert_eq!(field(&rows[0], "critic__agree"), &Field::Bool(true));
    assert_eq!(field(&rows[0], "input_tokens"), &Field::Long(150));
    assert_eq!(
        field(&rows[1], "adjudicate__confidence"),
        &Field::Double(1.0)
    );
    assert_eq!(
        field(&rows[1], "review_decided_by"),
        &Field::Str("review:alice".into())
    );
    assert_eq!(field(&rows[1], "critic__severity"), &Field::Null);
    assert_eq!(field(&rows[2], "confidence"), &Field::Null);
    assert_eq!(
        field(&rows[2], "critic__state"),
        &Field::Str("skipped".into())
    );

    // And the requests table.
    let path = parquet_file(&ws, TWO, ExportWhat::Requests, "requests.parquet");
    let schema = parquet_schema(&path);
    let names: Vec<&str> = schema.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, REQUEST_COLUMNS);
    let rows = parquet_rows(&path);
    assert_eq!(rows.len(), 6);
    assert_eq!(field(&rows[0], "request_id"), &Field::Long(1));
    assert_eq!(field(&rows[0], "cost_usd"), &Field::Double(0.001));
}

#[test]
fn columns_and_types_do_not_depend_on_the_data() {
    let ws = Ws::new();
    let (_, full) = text(&ws, TWO, ExportWhat::Items, ExportFormat::Csv);
    let (n, sparse) = text(&ws, TWO_SPARSE, ExportWhat::Items, ExportFormat::Csv);
    assert_eq!(n, 1);
    assert_eq!(header(&full), header(&sparse));

    let (_, sparse_jsonl) = text(&ws, TWO_SPARSE, ExportWhat::Items, ExportFormat::Jsonl);
    let s = &jsonl(&sparse_jsonl)[0];
    assert_eq!(s["adjudicate__details__score"], Value::Null);
    assert_eq!(s["adjudicate__tags"], Value::Null);
    assert_eq!(s["critic__state"], json!("pending"));
    assert_eq!(s["critic__agree"], Value::Null);
    assert_eq!(s["outcome"], Value::Null, "no result yet");
    assert_eq!(s["attempts"], json!(1));

    let a = parquet_schema(&parquet_file(&ws, TWO, ExportWhat::Items, "a.parquet"));
    let b = parquet_schema(&parquet_file(
        &ws,
        TWO_SPARSE,
        ExportWhat::Items,
        "b.parquet",
    ));
    assert_eq!(a, b, "same names and physical types");
}

#[test]
fn requests_one_row_per_stage_request() {
    let ws = Ws::new();
    let (n, t) = text(&ws, TWO, ExportWhat::Requests, ExportFormat::Csv);
    assert_eq!(n, 6, "3 items x 2 stages, the skipped critic included");
    assert_eq!(header(&t), REQUEST_COLUMNS);

    let (_, t) = text(&ws, TWO, ExportWhat::Requests, ExportFormat::Jsonl);
    let rows = jsonl(&t);
    let ids: Vec<i64> = rows
        .iter()
        .map(|r| r["request_id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, [1, 2, 3, 4, 5, 6], "dispatch order, then stage order");
    let r = &rows[2];
    assert_eq!(r["session_id"], json!(TWO));
    assert_eq!(r["item_id"], json!("i2"));
    assert_eq!(r["stage"], json!("adjudicate"));
    assert_eq!(r["position"], json!(0));
    assert_eq!(r["state"], json!("passed"));
    assert_eq!(r["request_version"], json!(1));
    assert_eq!(r["template_hash"], json!("th-adjudicate"));
    assert_eq!(r["params_hash"], json!("ph1"));
    assert_eq!(r["provider"], json!("main"));
    assert_eq!(r["model"], json!("gpt-x"));
    assert_eq!(r["attempt"], json!(2));
    assert_eq!(r["gate_failures"], json!(1));
    assert_eq!(r["input_tokens"], json!(200));
    assert_eq!(r["output_tokens"], json!(25));
    assert!(r["cost_usd"].is_f64());
    assert_eq!(r["last_client_request_id"], json!("batch_two-3-2"));
    let skipped = &rows[5];
    assert_eq!(skipped["stage"], json!("critic"));
    assert_eq!(skipped["position"], json!(1));
    assert_eq!(skipped["state"], json!("skipped"));
    assert_eq!(skipped["attempt"], json!(0));
    assert_eq!(skipped["cost_usd"], json!(0.0));
    assert_eq!(skipped["last_client_request_id"], Value::Null);
    assert_eq!(rows[4]["last_error"], json!("gate: not JSON"));

    let (n, t) = text(&ws, GYM, ExportWhat::Requests, ExportFormat::Jsonl);
    assert_eq!(n, 9, "the follow-up is a request of its own");
    let stages: Vec<String> = jsonl(&t)
        .iter()
        .map(|r| r["stage"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        stages[..5],
        [
            "rubric_gen",
            "rubric_critic",
            "score_gen",
            "score_gen:score",
            "score_critic"
        ]
    );

    // Every session's requests, each with its session.
    let mut out = Vec::new();
    let all = ExportOptions {
        session: None,
        what: ExportWhat::Requests,
        format: ExportFormat::Jsonl,
    };
    assert_eq!(export(&ws.handle(), &all, &mut out).unwrap(), 17);
    let rows = jsonl(&String::from_utf8(out).unwrap());
    assert_eq!(rows[0]["session_id"], json!(TWO));
    assert_eq!(rows.last().unwrap()["session_id"], json!(GYM));
}

#[test]
fn library_errors() {
    let ws = Ws::new();
    let ledger = ws.handle();
    let mut out = Vec::new();
    let err = export(
        &ledger,
        &opts("nope", ExportWhat::Items, ExportFormat::Csv),
        &mut out,
    )
    .unwrap_err();
    assert!(matches!(err, ReportError::UnknownSession(_)));
    let err = export(
        &ledger,
        &opts(TWO, ExportWhat::Items, ExportFormat::Parquet),
        &mut out,
    )
    .unwrap_err();
    assert!(matches!(err, ReportError::ParquetNeedsFile));
    let no_session = ExportOptions {
        session: None,
        what: ExportWhat::Items,
        format: ExportFormat::Csv,
    };
    assert!(matches!(
        export(&ledger, &no_session, &mut out).unwrap_err(),
        ReportError::ItemsNeedSession
    ));
    // `export` reads schema files next to the ledger: the same header.
    let (_, via_ws) = text(&ws, TWO, ExportWhat::Items, ExportFormat::Csv);
    let mut out = Vec::new();
    export(
        &ledger,
        &opts(TWO, ExportWhat::Items, ExportFormat::Csv),
        &mut out,
    )
    .unwrap();
    assert_eq!(String::from_utf8(out).unwrap(), via_ws);
}

fn docket(ws: &Ws) -> Command {
    let mut c = support::procs::docket_at(ws.path(), ws.path());
    c.env("XDG_CONFIG_HOME", ws.path().join("config"));
    c
}

#[test]
fn cli_export_items_and_errors() {
    let ws = Ws::new();

    let out = docket(&ws)
        .args(["export", "--session", "nope", "--what", "items"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown session \"nope\""), "{err}");

    let out = docket(&ws)
        .args([
            "export",
            "--session",
            TWO,
            "--what",
            "items",
            "--format",
            "parquet",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty(), "nothing binary on stdout");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--output FILE"), "{err}");

    let out = docket(&ws)
        .args(["export", "--what", "items"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--session"));

    let out = docket(&ws)
        .args(["export", "--session", TWO, "--what", "items"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        header(&String::from_utf8(out.stdout).unwrap()),
        two_header()
    );

    let file = ws.path().join("cli.parquet");
    let out = docket(&ws)
        .args([
            "export",
            "--session",
            TWO,
            "--what",
            "items",
            "--format",
            "parquet",
            "-o",
        ])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("Exported 3 rows"));
    assert_eq!(parquet_rows(&file).len(), 3);

    // An unknown session leaves no file behind.
    let file = ws.path().join("none.csv");
    let out = docket(&ws)
        .args(["export", "--session", "nope", "--what", "requests", "-o"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(!file.exists());
}
