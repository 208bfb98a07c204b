//! Fault-matrix rows I4 (invalid config, inputs changed before a resume),
//! S5 (a provider that cannot be reached: DNS, TLS) and S1 (a 429 with a
//! retry-after hint, as the operator sees it), end to end: the real binary,
//! a real SQLite ledger, the built-in mock provider over real HTTP, and a
//! real terminal (tmux) for the console.

use docket_testkit as support;

use std::process::Output;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use docket::mock::MockConfig;
use support::procs::{Proc, docket_at, signal};
use support::*;

/// `docket --workspace WS ARGS` to its end: exit code and everything it said.
fn docket(ws: &Workspace, home: &std::path::Path, args: &[&str]) -> (Option<i32>, String) {
    let out: Output = docket_at(ws.path(), home).args(args).output().unwrap();
    (out.status.code(), said(&out))
}

/// A home folder for the commands a test runs, inside its workspace.
fn home(ws: &Workspace) -> std::path::PathBuf {
    let home = ws.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    home
}

fn sessions(ws: &Workspace) -> i64 {
    count(&ws.conn(), "SELECT COUNT(*) FROM llm_batch_session", [])
}

/// The 1-based line of the first line of docket.toml starting with `key`.
fn line_of(toml: &str, key: &str) -> usize {
    toml.lines()
        .position(|l| l.trim_start().starts_with(key))
        .unwrap_or_else(|| panic!("no {key} in docket.toml"))
        + 1
}

/// A session that exists and is resumable with nothing answered: a first
/// run against a provider that refuses the key (no preflight, so the
/// session is made and stops at the first refusal, exit 3).
async fn stopped_session(items: usize) -> (docket::mock::MockServer, Workspace, String) {
    let (m, ws) = mocked(mode("unauthorized"), items, |_| {}).await;
    let home = home(&ws);
    let (code, text) = docket(
        &ws,
        &home,
        &["run", "--yes", "--headless", "--no-preflight"],
    );
    assert_eq!(code, Some(3), "{text}");
    let sid = docket::ledger::store::latest_session(&db(&ws.conn()))
        .unwrap()
        .expect("a session");
    m.set_config(MockConfig::default());
    (m, ws, sid)
}

// ------------------------------------------------------------------- I4

/// Row I4, invalid config: each bad setting stops `run` with exit 2 before
/// a session exists or anything is sent, and the message names the file,
/// the line and the key's whole path. A backoff cannot be configured at
/// all (it is fixed: 1 s doubling to 60 s), so a backoff key, even one
/// whose maximum is below its base, is refused as unknown, by its path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i4_invalid_settings_stop_before_a_session_naming_the_key_path() {
    let (m, ws) = mocked(MockConfig::default(), 3, |_| {}).await;
    let home = home(&ws);
    let toml_path = ws.path().join("docket.toml");
    let good = std::fs::read_to_string(&toml_path).unwrap();
    let rpm = line_of(&good, "requests_per_minute");
    let conc = line_of(&good, "max_concurrency");
    let attempts = line_of(&good, "max_transport_attempts");
    for (edit, key, line, said) in [
        (
            good.replace("max_concurrency = 16", "max_concurrency = 0"),
            "providers.main.max_concurrency",
            conc,
            "0 is out of range (1 to 10000)",
        ),
        (
            good.replace("requests_per_minute = 0", "requests_per_minute = -60"),
            "providers.main.requests_per_minute",
            rpm,
            "invalid value: integer `-60`",
        ),
        (
            good.replace(
                "max_transport_attempts = 5",
                "max_transport_attempts = 5\nbackoff_base_secs = 10\nbackoff_max_secs = 1",
            ),
            "providers.main.backoff_base_secs",
            attempts + 1,
            "unknown field `backoff_base_secs`",
        ),
        (
            good.replace(
                "[routing]",
                "[retry]\nbackoff_base_secs = 10\nbackoff_max_secs = 1\n\n[routing]",
            ),
            "retry",
            line_of(&good, "[routing]"),
            "unknown field `retry`",
        ),
    ] {
        std::fs::write(&toml_path, &edit).unwrap();
        let (code, text) = docket(&ws, &home, &["run", "--yes", "--headless"]);
        assert_eq!(code, Some(2), "{key}: {text}");
        let at = format!("docket.toml:{line}: {key}: ");
        assert!(
            text.contains(&at) && text.contains(said),
            "{at:?} / {said:?} missing:\n{text}"
        );
        assert_eq!(sessions(&ws), 0, "{key}: a session was made");
    }

    // A key variable that is not set: named by its key path and variable,
    // before a session, with or without the preflight.
    let keyed = good.replace(
        "base_url = ",
        "api_key_env = \"DOCKET_FCR_NEVER_SET\"\nbase_url = ",
    );
    std::fs::write(&toml_path, keyed).unwrap();
    for extra in [&[][..], &["--no-preflight"][..]] {
        let out = docket_at(ws.path(), &home)
            .args(["run", "--yes", "--headless"])
            .args(extra)
            .env_remove("DOCKET_FCR_NEVER_SET")
            .output()
            .unwrap();
        let text = said(&out);
        assert_eq!(out.status.code(), Some(2), "{text}");
        assert!(
            text.contains(
                "providers.main.api_key_env names DOCKET_FCR_NEVER_SET, which is not set"
            ),
            "{text}"
        );
        assert_eq!(sessions(&ws), 0, "{extra:?}");
    }
    assert_eq!(m.stats().requests, 0, "nothing was sent");
}

/// Row I4, unknown model on an OpenAI-compatible server: its models list
/// may leave out models a gateway routes, so the preflight only warns that
/// the model is not listed (naming it and the closest listed) and goes on;
/// a session is made, and the provider's 404 for every request pauses it
/// (exit 4) before anything is answered or billed, naming the provider,
/// the model and the provider's words, with no item failed for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i4_an_unknown_model_pauses_the_session_before_any_spend() {
    let (m, ws) = mocked(
        MockConfig {
            models: "some-other-model".into(),
            ..Default::default()
        },
        30,
        |_| {},
    )
    .await;
    let home = home(&ws);
    let (code, text) = docket(&ws, &home, &["run", "--yes", "--headless"]);
    assert_eq!(code, Some(4), "{text}");
    assert!(
        text.contains("Warning: provider main (kind = \"openai_compatible\")")
            && text.contains("does not list model \"gpt-4o-mini\" among its 1 model")
            && text.contains("Going on"),
        "{text}"
    );
    assert_eq!(m.stats().models_requests, 1, "the preflight asked");
    assert!(
        text.contains("provider main, model gpt-4o-mini")
            && text.contains("HTTP 404")
            && text.contains("does not exist"),
        "{text}"
    );
    let conn = ws.conn();
    let (processed, errors, cost): (i64, i64, f64) = conn
        .query_row(
            "SELECT processed_count, error_count, cost_usd FROM llm_batch_session",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!((processed, errors, cost), (0, 0, 0.0));
    assert_eq!(count(&conn, "SELECT COUNT(*) FROM llm_batch_result", []), 0);
    let stats = m.stats();
    assert_eq!((stats.ok, stats.prompt_tokens), (0, 0), "{stats:?}");
    assert!(stats.requests > 0 && stats.requests < 40, "{stats:?}");
}

/// The workspace's provider as `kind = "openai"` (whose models list is
/// the provider's own) with `model`.
fn as_openai(ws: &Workspace, model: &str) {
    let path = ws.path().join("docket.toml");
    let toml = std::fs::read_to_string(&path).unwrap();
    let edited = toml
        .replace("kind = \"openai_compatible\"", "kind = \"openai\"")
        .replace("model = \"gpt-4o-mini\"", &format!("model = \"{model}\""));
    assert_ne!(edited, toml);
    std::fs::write(&path, edited).unwrap();
}

/// Row I4, unknown model, before the session: a provider whose models
/// list is its own (OpenAI here; Anthropic, Gemini, Ollama too) and does
/// not name the configured model stops `run` at the preflight with exit 3,
/// naming the file, the line and `providers.main.model`, the model and the
/// closest listed names, before a session exists; nothing was sent but
/// the models list. `--no-preflight` skips the check (the provider's
/// refusals then pause the session). A listed model runs to the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i4_an_unknown_model_stops_at_the_preflight_before_a_session() {
    let served = MockConfig {
        models: "gpt-4o-mini,gpt-4o,gpt-4.1-mini".into(),
        ..Default::default()
    };
    let (m, ws) = mocked(served.clone(), 20, |_| {}).await;
    as_openai(&ws, "gpt-4o-mni");
    let home = home(&ws);
    let toml = std::fs::read_to_string(ws.path().join("docket.toml")).unwrap();
    let line = line_of(&toml, "model = ");
    let (code, text) = docket(&ws, &home, &["run", "--yes", "--headless"]);
    assert_eq!(code, Some(3), "{text}");
    for said in [
        &format!("docket.toml:{line}: providers.main.model: "),
        "provider main (kind = \"openai\")",
        "does not serve model \"gpt-4o-mni\"",
        "its models list (3 models) does not name it",
        "closest listed: \"gpt-4o-mini\", \"gpt-4.1-mini\", \"gpt-4o\"",
        "Nothing was created or sent",
        "--no-preflight",
    ] {
        assert!(text.contains(said), "{said:?} missing:\n{text}");
    }
    assert_eq!(sessions(&ws), 0, "no session");
    let stats = m.stats();
    assert_eq!(
        (stats.requests, stats.models_requests),
        (0, 1),
        "nothing sent but the models list: {stats:?}"
    );

    // Skipped: the session is made, and the provider's refusals pause it.
    let (code, text) = docket(
        &ws,
        &home,
        &["run", "--yes", "--headless", "--no-preflight"],
    );
    assert_eq!(code, Some(4), "{text}");
    assert!(
        text.contains("model gpt-4o-mni") && text.contains("HTTP 404"),
        "{text}"
    );
    assert_eq!(sessions(&ws), 1);
    assert_eq!(m.stats().models_requests, 1, "no preflight asked");
    assert_eq!(m.stats().ok, 0);

    // A model the list names runs (its own workspace and provider).
    let (known, ws) = mocked(served, 20, |_| {}).await;
    as_openai(&ws, "gpt-4o-mini");
    let home = self::home(&ws);
    let (code, text) = docket(&ws, &home, &["run", "--yes", "--headless"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(!text.contains("does not"), "{text}");
    let sid = docket::ledger::store::latest_session(&db(&ws.conn()))
        .unwrap()
        .expect("a session");
    check_complete(&ws.conn(), &sid);
    let stats = known.stats();
    assert_eq!((stats.models_requests, stats.ok), (1, 20), "{stats:?}");
}

/// Row I4, unknown model, on the other wires whose models list is the
/// provider's own (the mock serving any model lists a few of each: an
/// Anthropic list has dated ids only, Ollama's tags end in `:latest`): a
/// model none names is refused at the preflight, exit 3, before a session,
/// with the closest listed; the names each provider takes for a listed
/// model (an Anthropic alias, Gemini's `models/` prefix, an Ollama name
/// without its tag) run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i4_each_providers_own_models_list_is_checked_in_its_own_naming() {
    let (m, ws) = mocked(MockConfig::default(), 3, |_| {}).await;
    let home = home(&ws);
    let root = m.base_url().trim_end_matches("/v1").to_string();
    let path = ws.path().join("docket.toml");
    let scaffold = std::fs::read_to_string(&path).unwrap();
    let with_provider = |kind: &str, model: &str| {
        let start = scaffold.find("[providers.main]").unwrap();
        let end = scaffold.find("[[stages]]").unwrap();
        let key = if kind == "ollama" {
            ""
        } else {
            "api_key_env = \"DOCKET_FCR_KEY\"\n"
        };
        let block = format!(
            "[providers.main]\nkind = \"{kind}\"\nmodel = \"{model}\"\nbase_url = \"{root}\"\n{key}\
             requests_per_minute = 0\ntokens_per_minute = 0\n\n"
        );
        std::fs::write(
            &path,
            format!("{}{block}{}", &scaffold[..start], &scaffold[end..]),
        )
        .unwrap();
    };
    let run = |extra: &[&str]| {
        let out = docket_at(ws.path(), &home)
            .args(["run", "--yes", "--headless"])
            .args(extra)
            .env("DOCKET_FCR_KEY", "canaryKEYfcr20")
            .output()
            .unwrap();
        (out.status.code(), said(&out))
    };
    for (kind, typo, closest) in [
        ("anthropic", "claude-haiku-4-6", "claude-haiku-4-5-20251001"),
        ("gemini", "gemini-2.5-flsh", "gemini-2.5-flash"),
        ("ollama", "llama3.3", "llama3.2:latest"),
    ] {
        with_provider(kind, typo);
        let (code, text) = run(&[]);
        assert_eq!(code, Some(3), "{kind}: {text}");
        for said in [
            "providers.main.model: ".to_string(),
            format!("(kind = \"{kind}\")"),
            format!("does not serve model \"{typo}\""),
            format!("closest listed: \"{closest}\""),
        ] {
            assert!(text.contains(&said), "{kind}: {said:?} missing:\n{text}");
        }
        assert_eq!(sessions(&ws), 0, "{kind}");
    }
    assert_eq!(m.stats().requests, 0, "nothing was sent");
    assert_eq!(m.stats().models_requests, 3);
    for (kind, model) in [
        ("anthropic", "claude-haiku-4-5"),
        ("gemini", "models/gemini-2.5-pro"),
        ("ollama", "llama3.2"),
    ] {
        with_provider(kind, model);
        let (code, text) = run(&["--limit", "1"]);
        assert_eq!(code, Some(0), "{kind} {model}: {text}");
    }
    assert_eq!(m.stats().ok, 3, "one item on each");
}

/// Row I4, config edited between `run` and `resume`: the resume is refused
/// (exit 2, nothing sent, the session untouched), naming every setting
/// that changed with its value then and now, unless `--accept-changes` is
/// given; then the edited file applies, its new threshold included. A
/// changed model is refused even with the flag: that is another job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i4_resume_refuses_an_edited_config_unless_the_changes_are_accepted() {
    let (m, ws, sid) = stopped_session(20).await;
    let home = home(&ws);
    let toml_path = ws.path().join("docket.toml");
    let good = std::fs::read_to_string(&toml_path).unwrap();
    let sent_before = m.stats().requests;
    let state = || -> (String, i64) {
        ws.conn()
            .query_row(
                "SELECT state, processed_count FROM llm_batch_session WHERE session_id = ?1",
                [&sid],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap()
    };
    let before = state();
    let resume = ["run", "--yes", "--headless", "--resume", sid.as_str()];

    // A threshold and a limit.
    let edited = good
        .replace(
            "auto_accept_threshold = 0.85",
            "auto_accept_threshold = 0.99",
        )
        .replace("max_concurrency = 16", "max_concurrency = 4");
    std::fs::write(&toml_path, &edited).unwrap();
    let (code, text) = docket(&ws, &home, &resume);
    assert_eq!(code, Some(2), "{text}");
    for said in [
        &format!("session {sid} was started with another"),
        "routing.auto_accept_threshold 0.85 -> 0.99",
        "providers.main.max_concurrency 16 -> 4",
        "--accept-changes",
    ] {
        assert!(text.contains(said), "{said:?} missing:\n{text}");
    }
    assert_eq!(m.stats().requests, sent_before, "nothing was sent");
    assert_eq!(state(), before, "the session is as it was");

    // The model: refused without the flag, and with it.
    std::fs::write(
        &toml_path,
        good.replace("model = \"gpt-4o-mini\"", "model = \"gpt-4o\""),
    )
    .unwrap();
    let (code, text) = docket(&ws, &home, &resume);
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("providers.main.model \"gpt-4o-mini\" -> \"gpt-4o\""),
        "{text}"
    );
    let with_flag: Vec<&str> = resume.iter().copied().chain(["--accept-changes"]).collect();
    let (code, text) = docket(&ws, &home, &with_flag);
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("provider/model main/gpt-4o-mini -> main/gpt-4o"),
        "{text}"
    );
    assert_eq!(m.stats().requests, sent_before, "nothing was sent");

    // Accepted: said, and the new threshold routes the session's items.
    std::fs::write(&toml_path, &edited).unwrap();
    let (code, text) = docket(&ws, &home, &with_flag);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("changed since session")
            && text.contains("routing.auto_accept_threshold 0.85 -> 0.99"),
        "{text}"
    );
    let conn = ws.conn();
    check_complete(&conn, &sid);
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_batch_result WHERE outcome = 'accepted' AND confidence < 0.99",
            []
        ),
        0,
        "accepted under the new threshold only"
    );
    assert!(
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_batch_result WHERE outcome = 'review' AND confidence >= 0.85",
            []
        ) > 0,
        "an answer the old threshold would have accepted went to review"
    );
}

/// Row I4, input edited between `run` and `resume`. The items are copied
/// into the ledger at import: a session works on its items as imported,
/// and never reads the file again. Editing the file changes nothing by
/// itself; importing it again adds its new rows as new undecided items
/// (not to the session) and leaves every id the ledger has as it was (its
/// evidence included): the resumed session sends the prompts of the
/// evidence it started with, and the new item waits for a new session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i4_an_input_file_edited_before_resume_leaves_the_session_as_imported() {
    let (m, ws, sid) = stopped_session(12).await;
    let home = home(&ws);
    let file = ws.path().join("items/test.jsonl");
    let text = std::fs::read_to_string(&file).unwrap();
    let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    let (id, title) = (
        first["id"].as_str().unwrap().to_string(),
        first["title"].as_str().unwrap().to_string(),
    );
    let evidence = |item: &str| -> String {
        ws.conn()
            .query_row(
                "SELECT evidence_json FROM decision WHERE item_id = ?1",
                [item],
                |r| r.get(0),
            )
            .unwrap()
    };
    let evidence_before = evidence(&id);
    let mut added = first.clone();
    added["id"] = "added-after-the-run".into();
    let edited = format!("{}{added}\n", text.replacen(&title, "EDITED TITLE 4417", 1));
    std::fs::write(&file, edited).unwrap();

    let (code, said) = docket(&ws, &home, &["import", &file.display().to_string()]);
    assert_eq!(code, Some(0), "{said}");
    // The edited row is told apart from the eleven the ledger has as they
    // are, and named by its line and id.
    assert!(
        said.contains("Imported 1 new")
            && said.contains(
                "12 already present (1 of them with different content: the ledger keeps what it has)"
            ),
        "{said}"
    );
    assert!(
        said.contains(&format!(
            "test.jsonl:1: \"{id}\" differs from the ledger's copy (kept as first imported)"
        )),
        "{said}"
    );
    assert_eq!(
        said.matches("differs from the ledger's copy").count(),
        1,
        "{said}"
    );
    assert_eq!(evidence(&id), evidence_before, "an imported item is kept");
    // Again, unchanged since: the same is said (it still differs), and
    // nothing is new.
    let (code, again) = docket(&ws, &home, &["import", &file.display().to_string()]);
    assert_eq!(code, Some(0), "{again}");
    assert!(
        again.contains("Imported 0 new")
            && again.contains("13 already present (1 of them with different content"),
        "{again}"
    );

    let (code, said) = docket(
        &ws,
        &home,
        &["run", "--yes", "--headless", "--resume", &sid],
    );
    assert_eq!(code, Some(0), "{said}");
    let conn = ws.conn();
    check_complete(&conn, &sid);
    assert_eq!(
        count(
            &conn,
            "SELECT total_count FROM llm_batch_session WHERE session_id = ?1",
            [&sid]
        ),
        12
    );
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM session_item WHERE item_id = 'added-after-the-run'",
            []
        ),
        0,
        "the new row is not the session's"
    );
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM decision WHERE item_id = 'added-after-the-run' AND state = 'indeterminate'",
            []
        ),
        1
    );
    // Every prompt for the edited item carried the evidence as imported.
    let prompts: Vec<String> = conn
        .prepare(
            "SELECT m.user_prompt FROM llm_messages m JOIN llm_requests r USING (request_id)
              WHERE r.item_id = ?1 AND m.state = 'answered'",
        )
        .unwrap()
        .query_map([&id], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert!(!prompts.is_empty());
    assert!(
        prompts
            .iter()
            .all(|p| p.contains(&title) && !p.contains("EDITED TITLE 4417")),
        "{prompts:?}"
    );
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM llm_messages WHERE user_prompt LIKE '%EDITED TITLE 4417%'",
            []
        ),
        0
    );
    assert_eq!(m.stats().ok, 12, "the session's 12 items, once each");
}

// ------------------------------------------------------------------- S5

/// A run with the preflight skipped against `base_url`, where nothing
/// answers (`host` is named in the error): once its sends have reached
/// nothing ten times in a row, it holds. Checked while it holds and after
/// Ctrl-C: no attempt ambiguous, no item failed or answered, no transport
/// attempt spent, nothing billed; the hold's reason, in the ledger, its
/// event and on the headless output, says the provider is unreachable,
/// names `host` and says why in each of the words of `cause` (the layer
/// that failed: "DNS:", "TLS:", and what it said). Returns the reason.
async fn holds_mid_run(base_url: &str, host: &str, cause: &[&str]) -> String {
    let mut job = Job::new(base_url);
    job.concurrency = 4;
    let ws = workspace(&job);
    import_demo_items(&ws, 20);
    let home = home(&ws);
    let mut cmd = docket_at(ws.path(), &home);
    cmd.args(["run", "--yes", "--headless", "--no-preflight"]);
    let mut run = Proc::start(cmd, format!("run against {base_url}"), home.join("run.out"));
    let conn = ws.conn();
    let why = paused_reason(
        &conn,
        "the session held as unreachable",
        Duration::from_secs(30),
    )
    .await;
    assert!(
        why.contains("provider main unreachable")
            && why.contains("did not reach the provider")
            && why.contains(host)
            && why.contains("no item is failed"),
        "{why}"
    );
    for word in cause {
        assert!(
            why.contains(word),
            "{word:?} missing from the reason: {why}"
        );
    }
    let held = poll(
        "the held line on the output",
        Duration::from_secs(10),
        || {
            run.output()
                .lines()
                .find(|l| l.starts_with("Held: provider main unreachable"))
                .map(str::to_string)
        },
    )
    .await;
    for word in cause {
        assert!(
            held.contains(word),
            "{word:?} missing from the held line: {held}"
        );
    }
    let sid = docket::ledger::store::latest_session(&db(&conn))
        .unwrap()
        .expect("a session");
    // Each failed send's own error says it too.
    let errors: Vec<String> = conn
        .prepare("SELECT error_message FROM llm_messages WHERE state = 'failed'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert!(!errors.is_empty());
    for e in &errors {
        assert!(cause.iter().all(|w| e.contains(w)), "{cause:?}: {e}");
    }
    let said = events_of(&conn, &sid, "unreachable");
    assert!(
        said.iter()
            .any(|e| cause.iter().all(|w| e.message.contains(w))),
        "{cause:?} missing from the events: {said:?}"
    );
    let clean = |when: &str| {
        let sent = count(&conn, "SELECT COUNT(*) FROM llm_messages", []);
        assert!(sent >= 10, "{when}: {sent} sends");
        assert_eq!(
            count(
                &conn,
                "SELECT COUNT(*) FROM llm_messages
                  WHERE state = 'failed' AND http_status IS NULL AND error_kind = 'transient'",
                []
            ),
            sent,
            "{when}: every send failed before anything was sent"
        );
        let (errors, ambiguous, cost): (i64, i64, f64) = conn
            .query_row(
                "SELECT error_count, ambiguous_count, cost_usd FROM llm_batch_session",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap();
        assert_eq!((errors, ambiguous, cost), (0, 0, 0.0), "{when}");
        assert_eq!(
            count(&conn, "SELECT COUNT(*) FROM llm_batch_result", []),
            0,
            "{when}"
        );
        assert_eq!(
            count(
                &conn,
                "SELECT COALESCE(MAX(transport_retries), 0) FROM llm_requests",
                []
            ),
            0,
            "{when}: no transport attempt spent"
        );
    };
    clean("held");
    // The breaker holds: no more sends pile up while it is open.
    let at_hold = count(&conn, "SELECT COUNT(*) FROM llm_messages", []);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        count(&conn, "SELECT COUNT(*) FROM llm_messages", []),
        at_hold,
        "sent while held"
    );
    run.assert_running();
    signal(run.pid(), "-INT");
    let (code, out) = tokio::task::block_in_place(|| run.wait(Duration::from_secs(30)));
    assert_eq!(code, Some(130), "{out}");
    assert!(out.contains("ambiguous attempts 0"), "{out}");
    clean("after the stop");
    why
}

/// Row S5 mid-run, DNS: a name that never resolves (`.invalid`). The
/// reason names the layer that failed and the resolver's words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s5_a_name_that_does_not_resolve_holds_the_run_with_nothing_ambiguous_or_billed() {
    let why = holds_mid_run(
        "http://docket-no-such-host.invalid:9/v1",
        "docket-no-such-host.invalid",
        &["DNS: "],
    )
    .await;
    // The resolver's own words follow ("failed to lookup address
    // information: ...", whatever this host's resolver says of it).
    let after = why.split("DNS: ").nth(1).unwrap_or_default();
    assert!(
        after.split(')').next().is_some_and(|w| w.trim().len() > 5),
        "{why}"
    );
}

/// Row S5 mid-run, TLS: `https://` to a server that speaks plain HTTP (the
/// mock): the handshake fails, so nothing reaches it and it bills nothing;
/// the reason says it was TLS, and that the server does not speak it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s5_tls_to_a_plain_http_server_holds_the_run_with_nothing_ambiguous_or_billed() {
    let plain = mock(MockConfig::default()).await;
    let url = plain.base_url().replace("http://", "https://");
    holds_mid_run(&url, &url, &["TLS: ", "does not seem to speak TLS"]).await;
    let stats = plain.stats();
    assert_eq!(
        (stats.requests, stats.ok, stats.prompt_tokens),
        (0, 0, 0),
        "{stats:?}"
    );
}

/// A TLS server on a loopback port whose certificate (for 127.0.0.1) is
/// self-signed, made for the test with the `openssl` command. It completes
/// whatever handshake a client lets it, then counts the bytes of any
/// request that reached it. Its thread lives as long as the test process.
struct SelfSigned {
    port: u16,
    handshakes: Arc<AtomicUsize>,
    request_bytes: Arc<AtomicUsize>,
    _dir: tempfile::TempDir,
}

impl SelfSigned {
    fn start() -> SelfSigned {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let dir = tempfile::tempdir().unwrap();
        let (key, cert) = (dir.path().join("key.pem"), dir.path().join("cert.pem"));
        let made = std::process::Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
            .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"])
            .args([
                "-subj",
                "/CN=127.0.0.1",
                "-addext",
                "subjectAltName=IP:127.0.0.1",
            ])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .output()
            .expect("this test makes its certificate with the `openssl` command");
        assert!(made.status.success(), "openssl: {}", said(&made));
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert)
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let key = PrivateKeyDer::from_pem_file(&key).unwrap();
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = Arc::new(
            rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(certs, key)
                .unwrap(),
        );
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let handshakes = Arc::new(AtomicUsize::new(0));
        let request_bytes = Arc::new(AtomicUsize::new(0));
        let (h, r) = (handshakes.clone(), request_bytes.clone());
        std::thread::spawn(move || {
            for tcp in listener.incoming() {
                let Ok(mut tcp) = tcp else { continue };
                let (config, h, r) = (config.clone(), h.clone(), r.clone());
                std::thread::spawn(move || {
                    use std::io::Read;
                    let _ = tcp.set_read_timeout(Some(Duration::from_secs(5)));
                    let Ok(mut conn) = rustls::ServerConnection::new(config) else {
                        return;
                    };
                    h.fetch_add(1, Ordering::SeqCst);
                    if conn.complete_io(&mut tcp).is_err() {
                        return;
                    }
                    let mut buf = [0u8; 4096];
                    let mut stream = rustls::Stream::new(&mut conn, &mut tcp);
                    while let Ok(n @ 1..) = stream.read(&mut buf) {
                        r.fetch_add(n, Ordering::SeqCst);
                    }
                });
            }
        });
        SelfSigned {
            port,
            handshakes,
            request_bytes,
            _dir: dir,
        }
    }
}

/// Row S5 mid-run, TLS: a provider whose certificate is self-signed. The
/// handshake is refused by docket (no trusted issuer), so no request
/// reaches the server and nothing is billed; the run holds, and the reason
/// names the certificate problem.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s5_a_self_signed_certificate_holds_the_run_naming_the_certificate() {
    let server = SelfSigned::start();
    let url = format!("https://127.0.0.1:{}/v1", server.port);
    let why = holds_mid_run(&url, &url, &["TLS: ", "certificate"]).await;
    assert!(why.contains("invalid peer certificate"), "{why}");
    assert!(
        server.handshakes.load(Ordering::SeqCst) >= 10,
        "the sends did reach a TLS server"
    );
    assert_eq!(
        server.request_bytes.load(Ordering::SeqCst),
        0,
        "no request got through the refused handshake"
    );
}

/// Row S5, the cap: a provider unreachable for longer than the give-up
/// (`DOCKET_UNREACHABLE_GIVE_UP_SECS`, here 3 s, else 15 minutes) stops
/// the run paused, exit 4, with a message naming the provider, the failure
/// and the command that resumes it; nothing is failed, ambiguous or
/// billed. Once the provider is back, that command (with its preflight)
/// completes every item, each answered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s5_after_the_give_up_the_run_stops_paused_and_resumes_once_the_provider_is_back() {
    const ITEMS: usize = 20;
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let ws = workspace(&Job::new(&format!("http://{addr}/v1")));
    import_demo_items(&ws, ITEMS);
    let home = home(&ws);
    let started = std::time::Instant::now();
    let mut cmd = docket_at(ws.path(), &home);
    cmd.args(["run", "--yes", "--headless", "--no-preflight"])
        .env("DOCKET_UNREACHABLE_GIVE_UP_SECS", "3");
    let mut run = Proc::start(cmd, "a run that gives up".into(), home.join("run.out"));
    let (code, text) = tokio::task::block_in_place(|| run.wait(Duration::from_secs(40)));
    assert_eq!(code, Some(4), "{text}");
    let took = started.elapsed();
    assert!(took >= Duration::from_secs(3), "gave up after {took:?}");
    let conn = ws.conn();
    let sid = docket::ledger::store::latest_session(&db(&conn))
        .unwrap()
        .expect("a session");
    let resume = format!("docket batch-adjudicate --resume {sid}");
    let paused = text
        .lines()
        .find(|l| l.starts_with("Paused: "))
        .unwrap_or_else(|| panic!("no Paused line:\n{text}"));
    for word in [
        "provider main unreachable for 3 s, given up",
        "did not reach the provider",
        &addr.to_string(),
        "connection refused",
        "no item is failed",
        "once the provider is back",
        &resume,
    ] {
        assert!(paused.contains(word), "{word:?} missing: {paused}");
    }
    let (state, why, errors, ambiguous, cost): (String, String, i64, i64, f64) = conn
        .query_row(
            "SELECT state, stop_reason, error_count, ambiguous_count, cost_usd
               FROM llm_batch_session WHERE session_id = ?1",
            [&sid],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
        )
        .unwrap();
    assert_eq!(state, "paused");
    assert!(why.contains("given up") && why.contains(&resume), "{why}");
    assert_eq!((errors, ambiguous, cost), (0, 0, 0.0));
    assert_eq!(count(&conn, "SELECT COUNT(*) FROM llm_batch_result", []), 0);
    assert_eq!(
        count(
            &conn,
            "SELECT COALESCE(MAX(transport_retries), 0) FROM llm_requests",
            []
        ),
        0,
        "no transport attempt spent"
    );

    // The provider is back, on the same address: the resume completes.
    let back = docket::mock::MockServer::start(MockConfig::default(), addr)
        .await
        .expect("the mock, on the address that was unreachable");
    let (code, text) = docket(
        &ws,
        &home,
        &["run", "--yes", "--headless", "--resume", &sid],
    );
    assert_eq!(code, Some(0), "{text}");
    check_complete(&conn, &sid);
    let stats = back.stats();
    assert_eq!(stats.ok, ITEMS as u64, "each item answered once: {stats:?}");
    assert_eq!(stats.models_requests, 1, "the resume's preflight");
    assert_eq!(
        count(
            &conn,
            "SELECT ambiguous_count FROM llm_batch_session WHERE session_id = ?1",
            [&sid]
        ),
        0
    );
}

// ------------------------------------------------------------------- S1

/// `rate limited (waiting Ns)` in `text`: N.
fn waiting_secs(text: &str) -> Option<u64> {
    let re = regex::Regex::new(r"rate limited \(waiting (\d+)s\)").unwrap();
    re.captures_iter(text).last()?[1].parse().ok()
}

/// A provider that allows 6 requests a minute (the mock, server side) and
/// a job with no limit of its own: the mock's 429s carry `retry-after`
/// and `retry-after-ms` of up to 10 s.
async fn rate_limited_job() -> (docket::mock::MockServer, Workspace) {
    mocked(
        MockConfig {
            rpm_limit: 6,
            ..Default::default()
        },
        10,
        |_| {},
    )
    .await
}

/// Row S1: during a retry-after hold, the session's gauges (what any
/// console shows) and the headless progress line say "rate limited
/// (waiting Ns)", N the hold's seconds left (at most the mock's 10 s hint),
/// and the refusals are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s1_a_retry_after_hold_shows_its_wait_in_the_gauges_and_the_progress_line() {
    let (m, ws) = rate_limited_job().await;
    let home = home(&ws);
    let mut cmd = docket_at(ws.path(), &home);
    cmd.args(["run", "--yes", "--headless"]);
    let mut run = Proc::start(cmd, "a rate-limited run".into(), home.join("run.out"));
    let sid = session_created(&ws).await;
    let conn = ws.conn();
    let gauge = poll(
        "the gauges to show the hold",
        Duration::from_secs(20),
        || live_gauges(&conn, &sid).filter(|g| g.slow_reason.starts_with("rate limited (waiting")),
    )
    .await;
    let secs = waiting_secs(&gauge.slow_reason).expect("a number of seconds");
    assert!((1..=11).contains(&secs), "{}", gauge.slow_reason);
    poll(
        "the progress line to show the hold",
        Duration::from_secs(10),
        || {
            run.output()
                .lines()
                .any(|l| l.starts_with('[') && waiting_secs(l).is_some_and(|s| s <= 11))
                .then_some(())
        },
    )
    .await;
    assert!(m.stats().rate_limited > 0);
    signal(run.pid(), "-INT");
    let (code, out) = tokio::task::block_in_place(|| run.wait(Duration::from_secs(30)));
    assert_eq!(code, Some(130), "{out}");
    let limited: i64 = count(
        &conn,
        "SELECT rate_limited_count FROM llm_batch_session WHERE session_id = ?1",
        [&sid],
    );
    assert!(limited > 0, "the refusals are counted");
}

/// Row S1 in a real terminal: the console of a run held by a retry-after
/// shows "rate limited (waiting Ns)" in its gauges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s1_the_console_shows_rate_limited_waiting_in_a_terminal() {
    use support::tmux::{Pane, env_line, sh_quote};
    let (m, ws) = rate_limited_job().await;
    let home = home(&ws);
    let p = |s: &str| home.join(s).display().to_string();
    let cmd = format!(
        "{} {} --workspace {} batch-adjudicate --yes",
        env_line([
            ("HOME", p("home")),
            ("XDG_DATA_HOME", p("data")),
            ("XDG_STATE_HOME", p("state")),
            ("XDG_CONFIG_HOME", p("config")),
        ]),
        sh_quote(support::procs::bin()),
        sh_quote(&ws.path().display().to_string()),
    );
    let pane = Pane::start("s1-console", &cmd, 120, 40);
    let screen = tokio::task::block_in_place(|| {
        pane.wait(
            "the console to show the hold",
            Duration::from_secs(30),
            |s| {
                s.lines()
                    .any(|l| l.contains("slow: rate limited (waiting") && waiting_secs(l).is_some())
            },
        )
    });
    let secs = waiting_secs(&screen).unwrap();
    assert!((1..=11).contains(&secs), "{screen}");
    assert!(m.stats().rate_limited > 0);
}
