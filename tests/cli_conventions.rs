//! The conventions of a well-kept command line, on the real binary: shell
//! completions for every shell, man pages, `--version` with the commit and
//! docket's folders, `--help` naming every environment variable docket
//! reads, and the daily log files in the XDG state dir, pruned to a bound.

use docket_testkit as support;

use std::path::Path;
use std::process::{Command, Output};

/// `docket ARGS` in an empty workspace folder under `home`, with its
/// config, data and state folders under `home` too (`docket_at`).
fn docket(home: &Path, args: &[&str]) -> Output {
    let ws = home.join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    support::procs::docket_at(&ws, home)
        .args(args)
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env_remove("DOCKET_CONFIG_DIR")
        .current_dir(home)
        .output()
        .unwrap()
}

fn stdout_of(out: &Output) -> String {
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).expect("UTF-8 output")
}

/// The log files in `dir`, by name.
fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn completions_are_printed_for_every_shell() {
    let home = tempfile::tempdir().unwrap();
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = stdout_of(&docket(home.path(), &["completions", shell]));
        assert!(script.len() > 1000, "{shell}: {script}");
        assert!(
            script.contains("batch-adjudicate") && script.contains("max-cost"),
            "{shell}: no subcommand or flag in\n{script}"
        );
        // The same clap tree: the new commands and an option's values too.
        assert!(
            script.contains("completions") && script.contains("parquet"),
            "{shell}"
        );
    }
    // The bash script is one bash can read.
    let script = stdout_of(&docket(home.path(), &["completions", "bash"]));
    let file = home.path().join("docket.bash");
    std::fs::write(&file, script).unwrap();
    let check = Command::new("bash").arg("-n").arg(&file).output();
    if let Ok(check) = check {
        assert!(
            check.status.success(),
            "bash -n: {}",
            String::from_utf8_lossy(&check.stderr)
        );
    }
    // An unknown shell is bad usage, named.
    let out = docket(home.path(), &["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("tcsh"));
}

#[test]
fn man_prints_the_page_and_writes_one_per_command() {
    let home = tempfile::tempdir().unwrap();
    let page = stdout_of(&docket(home.path(), &["man"]));
    assert!(
        page.lines().any(|l| l.starts_with(".TH docket 1")),
        "no .TH header:\n{page}"
    );
    for sub in [
        "batch\\-adjudicate",
        "mock\\-provider",
        "completions",
        "export",
    ] {
        assert!(page.contains(sub), "the page does not name {sub}");
    }
    assert!(
        page.contains("DOCKET_LEDGER_URL"),
        "the environment is on the page"
    );

    let dir = home.path().join("man1");
    stdout_of(&docket(
        home.path(),
        &["man", "--out", dir.to_str().unwrap()],
    ));
    let pages = names_in(&dir);
    for want in [
        "docket.1",
        "docket-batch-adjudicate.1",
        "docket-ledger-copy.1",
        "docket-items-rm.1",
        "docket-completions.1",
        "docket-man.1",
    ] {
        assert!(pages.iter().any(|p| p == want), "{want} not in {pages:?}");
    }
    let run = std::fs::read_to_string(dir.join("docket-batch-adjudicate.1")).unwrap();
    assert!(
        run.contains(".TH docket\\-batch\\-adjudicate 1")
            || run.contains(".TH docket-batch-adjudicate 1"),
        "{run}"
    );
    assert!(run.contains("max\\-cost"), "{run}");

    // A folder that cannot be made is named, as bad usage, and no panic.
    let blocked = home.path().join("a-file");
    std::fs::write(&blocked, "").unwrap();
    let bad = blocked.join("man1");
    let out = docket(home.path(), &["man", "--out", bad.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&bad.display().to_string()), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn version_names_the_commit_and_the_config_data_and_log_folders() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path().display().to_string();
    let text = stdout_of(&docket(home.path(), &["--version"]));
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some(format!("docket {}", env!("CARGO_PKG_VERSION")).as_str()),
        "{text}"
    );
    let commit = lines
        .next()
        .and_then(|l| l.strip_prefix("commit: "))
        .unwrap_or_else(|| panic!("no commit line: {text}"));
    assert!(
        commit == "unknown" || (commit.len() >= 7 && commit.chars().all(|c| c.is_ascii_hexdigit())),
        "{commit:?}"
    );
    assert!(
        text.contains(&format!("config: {h}/config/docket\n")),
        "{text}"
    );
    assert!(
        text.contains(&format!("data:   {h}/data/docket\n")),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "logs:   {h}/state/docket/logs/docket.YYYY-MM-DD.log"
        )),
        "{text}"
    );
    // DOCKET_CONFIG_DIR moves the config folder, and --version says so.
    let ws = home.path().join("ws");
    let out = support::procs::docket_at(&ws, home.path())
        .arg("--version")
        .env("DOCKET_CONFIG_DIR", home.path().join("elsewhere"))
        .output()
        .unwrap();
    assert!(stdout_of(&out).contains(&format!("config: {h}/elsewhere\n")));
    // -V stays the short one line scripts parse.
    let short = stdout_of(&docket(home.path(), &["-V"]));
    assert_eq!(
        short.trim(),
        format!("docket {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn help_lists_every_environment_variable_the_exit_codes_and_the_log_files() {
    let home = tempfile::tempdir().unwrap();
    let text = stdout_of(&docket(home.path(), &["--help"]));
    for var in [
        "DOCKET_WORKSPACE",
        "DOCKET_LEDGER_URL",
        "PGPASSWORD",
        "PGSSLMODE",
        "PGSSLROOTCERT",
        "DOCKET_LOG",
        "NO_COLOR",
        "DOCKET_CONFIG_DIR",
        "XDG_STATE_HOME",
        "DOCKET_BUSY_TIMEOUT_MS",
        "DOCKET_MIN_FREE_MB",
        "DOCKET_LEASE_SECS",
        "DOCKET_CLOCK_SKEW_SECS",
        "DOCKET_UNREACHABLE_GIVE_UP_SECS",
        "DOCKET_GEMINI_INLINE_LIMIT_BYTES",
    ] {
        assert!(text.contains(var), "--help does not name {var}:\n{text}");
    }
    assert!(
        text.contains("Exit codes:") && text.contains("130"),
        "{text}"
    );
    let logs = format!(
        "{}/state/docket/logs/docket.YYYY-MM-DD.log",
        home.path().display()
    );
    assert!(text.contains(&logs), "{text}");
    assert!(
        text.contains("\n  completions ") && text.contains("\n  man "),
        "{text}"
    );

    let mock = stdout_of(&docket(home.path(), &["mock-provider", "--help"]));
    for served in [
        "OpenAI",
        "Azure",
        "Anthropic",
        "Gemini",
        "Ollama",
        "OpenRouter",
        "Batch APIs",
        "Files",
    ] {
        assert!(
            mock.contains(served),
            "mock-provider --help: no {served}:\n{mock}"
        );
    }
}

/// A run writes today's dated log file in the XDG state dir (not the data
/// dir), and docket starting with more old files than the bound deletes the
/// oldest: at most 14 files, today's among them.
#[test]
fn logs_go_to_the_state_dir_one_file_a_day_and_old_ones_are_pruned() {
    let home = tempfile::tempdir().unwrap();
    let dir = support::procs::log_dir(home.path());
    std::fs::create_dir_all(&dir).unwrap();
    // Twenty old days, written oldest first (pruning goes by creation time,
    // else the date in the name).
    let old: Vec<String> = (1..=20)
        .map(|d| format!("docket.2020-01-{d:02}.log"))
        .collect();
    for name in &old {
        std::fs::write(dir.join(name), "old\n").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(15));
    }
    // Something else in the folder is not docket's log: left alone.
    std::fs::write(dir.join("notes.txt"), "mine\n").unwrap();

    let ws = home.path().join("ws");
    let out = support::procs::docket_at(&ws, home.path())
        .args(["init", ws.to_str().unwrap()])
        .output()
        .unwrap();
    stdout_of(&out);
    let today = format!("docket.{}.log", chrono::Utc::now().format("%Y-%m-%d"));
    let names = names_in(&dir);
    assert!(names.contains(&today), "no {today} in {names:?}");
    assert!(names.contains(&"notes.txt".to_string()), "{names:?}");
    let kept: Vec<&String> = names.iter().filter(|n| n.starts_with("docket.")).collect();
    assert_eq!(kept.len(), docket::workspace::LOG_FILES_KEPT, "{names:?}");
    for gone in &old[..7] {
        assert!(!names.contains(gone), "{gone} was kept: {names:?}");
    }
    for stays in &old[7..] {
        assert!(names.contains(stays), "{stays} was deleted: {names:?}");
    }

    // A second run the same day writes on into today's file; the bound holds.
    let items = ws.join(docket::workspace::SAMPLE_ITEMS);
    let out = support::procs::docket_at(&ws, home.path())
        .env("DOCKET_LOG", "info")
        .args(["import", items.to_str().unwrap()])
        .output()
        .unwrap();
    stdout_of(&out);
    let names = names_in(&dir);
    assert!(names.contains(&today), "no {today} in {names:?}");
    let kept = names.iter().filter(|n| n.starts_with("docket.")).count();
    assert!(kept <= docket::workspace::LOG_FILES_KEPT, "{names:?}");
    assert_eq!(
        support::procs::log_file(home.path()),
        dir.join(&today),
        "the newest log is today's"
    );
    let log = std::fs::read_to_string(support::procs::log_file(home.path())).unwrap();
    assert!(log.contains("import finished"), "{log}");
    assert!(
        !home.path().join("data/docket/logs").exists(),
        "a log folder in the data dir"
    );
}

/// The console's help screen (`?`) names the log files, where
/// `--version` says they are.
#[test]
fn the_console_help_screen_names_the_log_files() {
    use support::tmux::{Pane, env_line, sh_quote};
    let home = tempfile::tempdir().unwrap();
    let ws = home.path().join("ws");
    stdout_of(
        &support::procs::docket_at(&ws, home.path())
            .args(["init", ws.to_str().unwrap()])
            .output()
            .unwrap(),
    );
    let p = |s: &str| home.path().join(s).display().to_string();
    let vars = [
        ("HOME", p("")),
        ("XDG_DATA_HOME", p("data")),
        ("XDG_STATE_HOME", p("state")),
        ("XDG_CONFIG_HOME", p("config")),
        ("DOCKET_CONFIG_DIR", p("config/docket")),
    ];
    let cmd = format!(
        "{} {} --workspace {}",
        env_line(vars),
        sh_quote(support::procs::bin()),
        sh_quote(&ws.display().to_string())
    );
    // Tall enough for the whole help screen without scrolling.
    let pane = Pane::start("helplogs", &cmd, 160, 150);
    pane.wait("the console loaded", WAIT, |s| s.contains(" NORMAL "));
    pane.keys(&["?"]);
    let logs = format!("{}/docket.YYYY-MM-DD.log", p("state/docket/logs"));
    let s = pane.wait("the help screen", WAIT, |s| s.contains("[logs]"));
    assert!(s.contains(&logs), "no {logs} on the help screen:\n{s}");
    pane.keys(&["Escape"]);
    pane.wait("the help closed", WAIT, |s| !s.contains("[logs]"));
    pane.keys(&["q"]);
    pane.wait_for("EXIT=0", WAIT);
}

const WAIT: std::time::Duration = std::time::Duration::from_secs(20);
