//! Running a session: `docket batch-adjudicate` and `docket worker`, and
//! the check that a resumed session still runs the job it started with.

use std::io::{BufRead, IsTerminal, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use docket::engine::{self, Interrupts, RunOptions, StdoutReporter};
use docket::ledger::{LEDGER_FILE, Ledger, LedgerLocation};
use docket::tui::app::Pane;

use super::signals::{BatchQuestion, spawn_signal_handler};
use super::{fail, say_error};
use crate::cli::{ConsoleArgs, RunArgs, SummaryFormat};

/// Line output that remembers the session (for the Ctrl-C question). With
/// `--format json` the lines go to standard error (stdout holds the JSON
/// document only) and a dry run's plan is kept for the document.
struct NotingReporter {
    session: Arc<std::sync::Mutex<Option<String>>>,
    json: Option<Arc<std::sync::Mutex<Option<serde_json::Value>>>>,
}

impl NotingReporter {
    fn lines(session: Arc<std::sync::Mutex<Option<String>>>) -> Self {
        NotingReporter {
            session,
            json: None,
        }
    }
}

impl engine::Reporter for NotingReporter {
    fn line(&self, text: &str) {
        if self.json.is_some() {
            let text = docket::sanitize::lines_for_terminal(text);
            let mut err = std::io::stderr().lock();
            let _ = writeln!(err, "{text}");
        } else {
            StdoutReporter.line(text)
        }
    }

    fn session_started(&self, session_id: &str) {
        if let Ok(mut s) = self.session.lock() {
            *s = Some(session_id.to_string());
        }
    }

    fn dry_run_planned(&self, plan: &engine::DryRunPlan<'_>) {
        if let Some(slot) = &self.json
            && let Ok(mut s) = slot.lock()
        {
            *s = Some(super::summary::dry_run_json(plan));
        }
    }
}

pub(super) async fn batch_adjudicate(ws: &Path, args: RunArgs, console: &ConsoleArgs) -> i32 {
    if args.requests.requests.is_some() {
        return super::requests::run(ws, args, console).await;
    }
    batch_adjudicate_then(ws, args, console, Box::new(|code| (code, None))).await
}

/// What runs once a run ended, before its closing JSON document (if any)
/// is said: given the run's exit code, the exit code to give, and what to
/// add to that document.
pub(super) type AfterRun<'a> = Box<dyn FnOnce(i32) -> (i32, Option<serde_json::Value>) + 'a>;

/// `batch-adjudicate`, then `after` (`docket run --requests` writes its
/// output there): its JSON object, when it gives one, goes into the
/// closing document under "requests".
pub(super) async fn batch_adjudicate_then<'a>(
    ws: &Path,
    args: RunArgs,
    console: &ConsoleArgs,
    after: AfterRun<'a>,
) -> i32 {
    if !(args.grace.is_finite() && args.grace >= 0.0) {
        return fail("--grace: must be a non-negative number of seconds");
    }
    let mut opts = run_options(ws, &args);
    let json = args.format == SummaryFormat::Json;
    if let Some(id) = &args.resume
        && let Err(e) = same_config_as_the_session(&mut opts, id, args.accept_changes, json)
    {
        return fail(e);
    }
    let tty = std::io::stdin().is_terminal() && std::io::stdout().is_terminal();
    let ask = !args.yes && tty;
    let interrupts = Interrupts::default();
    if args.cancel_remote {
        // Decided before any stop comes: a cancel takes the provider
        // batches with it, and nothing is asked.
        interrupts.cancel_batches.cancel();
    }
    let listen = interrupts.clone();
    let session = Arc::new(std::sync::Mutex::new(None));
    let question = (tty && !args.cancel_remote).then(|| BatchQuestion {
        ledger: LedgerLocation::for_workspace(ws)
            .unwrap_or_else(|_| LedgerLocation::File(ws.join(LEDGER_FILE))),
        session: session.clone(),
    });
    if args.resume.is_some() {
        // A resume asks nothing: it is going from the start.
        spawn_signal_handler(&interrupts, question.clone());
    }
    let confirm_then_listen = move |_: &engine::Estimate| {
        let go = if ask { confirm(json) } else { true };
        if go {
            spawn_signal_handler(&listen, question);
        }
        go
    };
    if tty && !args.headless && !args.dry_run && !json {
        let code = super::console::run_with_console(
            opts,
            console,
            confirm_then_listen,
            interrupts,
            Pane::Stages,
        )
        .await;
        return after(code).0;
    }
    let planned = json.then(|| Arc::new(std::sync::Mutex::new(None)));
    let reporter = NotingReporter {
        session,
        json: planned.clone(),
    };
    let result = engine::run(opts, Arc::new(reporter), confirm_then_listen, interrupts).await;
    say_the_end(result, planned, after)
}

/// The engine's options for `batch-adjudicate`'s flags.
fn run_options(ws: &Path, args: &RunArgs) -> RunOptions {
    RunOptions {
        workspace: ws.to_path_buf(),
        limit: args.limit,
        min_confidence: args.min_confidence,
        rate_limit: args.rate_limit,
        dry_run: args.dry_run,
        resume: args.resume.clone(),
        force: args.force,
        // `--skip-reviewed` is the default; only `--rereview-pending` changes it.
        rereview_pending: args.rereview_pending,
        auto_accept_threshold: args.auto_accept_threshold,
        review_threshold: args.review_threshold,
        max_cost: args.max_cost,
        completion_mode: args.completion_mode,
        base_url_override: None,
        grace: Some(Duration::from_secs_f64(args.grace)),
        rerun_stage: args.rerun_stage.clone(),
        join: false,
        preflight: !args.no_preflight,
        mock: Some(docket::local_mock::starter()),
        profile: args.profile.clone(),
    }
}

/// The run's exit code; with `--format json` (`planned` is where a dry run
/// left its plan) the JSON document is said first, an error's too.
fn say_the_end(
    result: Result<engine::RunReport, engine::EngineError>,
    planned: Option<Arc<std::sync::Mutex<Option<serde_json::Value>>>>,
    after: AfterRun<'_>,
) -> i32 {
    let (code, doc) = match result {
        Ok(report) => {
            let doc = planned.as_ref().map(|planned| {
                let plan = planned.lock().ok().and_then(|mut p| p.take());
                super::summary::run_json(&report, plan)
            });
            (report.exit_code(), doc)
        }
        Err(e) => {
            say_error(&e);
            let doc = planned.is_some().then(|| super::summary::error_json(&e));
            (e.exit_code(), doc)
        }
    };
    let (code, more) = after(code);
    if let Some(mut doc) = doc {
        if let (Some(more), Some(obj)) = (more, doc.as_object_mut()) {
            obj.insert("requests".into(), more);
        }
        super::print_json(&doc);
    }
    code
}

/// `docket worker --session ID`: one more worker on a session, with line
/// output (it is meant for a second terminal, a tmux pane or a service).
pub(super) async fn worker(ws: &Path, args: crate::cli::WorkerArgs) -> i32 {
    if !(args.grace.is_finite() && args.grace >= 0.0) {
        return fail("--grace: must be a non-negative number of seconds");
    }
    let mut opts = RunOptions {
        workspace: ws.to_path_buf(),
        resume: Some(args.session.clone()),
        join: true,
        grace: Some(Duration::from_secs_f64(args.grace)),
        preflight: !args.no_preflight,
        mock: Some(docket::local_mock::starter()),
        ..RunOptions::default()
    };
    if let Err(e) = same_config_as_the_session(&mut opts, &args.session, args.accept_changes, false)
    {
        return fail(e);
    }
    let interrupts = Interrupts::default();
    // Ctrl-C stops this worker only (the others carry on); `docket cancel`
    // stops them all.
    spawn_signal_handler(&interrupts, None);
    let session = Arc::new(std::sync::Mutex::new(None));
    match engine::run(
        opts,
        Arc::new(NotingReporter::lines(session)),
        |_| true,
        interrupts,
    )
    .await
    {
        Ok(report) => report.exit_code(),
        Err(e) => {
            say_error(&e);
            e.exit_code()
        }
    }
}

/// Ask on stdout, or on standard error when stdout is for the JSON document.
fn confirm(on_stderr: bool) -> bool {
    if on_stderr {
        eprint!("\nContinue? [y/N]: ");
    } else {
        print!("\nContinue? [y/N]: ");
        let _ = std::io::stdout().flush();
    }
    let mut line = String::new();
    if std::io::stdin().lock().read_line(&mut line).is_err() {
        return false;
    }
    matches!(line.trim().to_ascii_lowercase().as_str(), "y" | "yes")
}

/// A resumed (or joined) session runs the job it started with (row I4):
/// docket.toml is compared, setting by setting, with the snapshot the
/// session took when it started, and any change is refused, naming each,
/// unless the operator accepts them (`--accept-changes`). Accepted, they
/// are said, and a changed routing threshold applies from now on (the
/// session's own would otherwise win over the file). Whatever cannot be
/// read here (the config, the ledger, the session) is left to the run,
/// which names it.
fn same_config_as_the_session(
    opts: &mut RunOptions,
    session: &str,
    accept: bool,
    note_on_stderr: bool,
) -> Result<(), String> {
    use docket::ledger::work::RunSessions;
    let Ok(now) = docket::config::LoadedConfig::load(&engine::config_path(&opts.workspace)) else {
        return Ok(());
    };
    let Some(row) = LedgerLocation::for_workspace(&opts.workspace)
        .and_then(Ledger::open_read_only)
        .ok()
        .and_then(|l| l.load_session(session).ok().flatten())
    else {
        return Ok(());
    };
    let Some(then) = serde_json::from_str::<serde_json::Value>(&row.config_snapshot_json)
        .ok()
        .and_then(|s| s.get("config").cloned())
        .filter(serde_json::Value::is_object)
    else {
        // A session from before docket kept its config.
        return Ok(());
    };
    let changes = now.changes_since(&then);
    if changes.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = changes.iter().map(ToString::to_string).collect();
    let file = now.path.display();
    if !accept {
        return Err(format!(
            "session {session} was started with another {file}: {} changed since. \
             Restore it to go on with the session as it started, or pass --accept-changes to go on with the file as it is now \
             (a change of a stage's provider, model, prompt template or parameters is refused either way: \
             start a new session for that).",
            list.join("; ")
        ));
    }
    let note = docket::sanitize::for_terminal(&format!(
        "Note: {file} changed since session {session} started (--accept-changes): {}.",
        list.join("; ")
    ));
    if note_on_stderr {
        eprintln!("{note}");
    } else {
        println!("{note}");
    }
    let routing = &now.config.routing;
    for c in &changes {
        match c.key.as_str() {
            "routing.auto_accept_threshold" if opts.auto_accept_threshold.is_none() => {
                opts.auto_accept_threshold = Some(*routing.auto_accept_threshold.get_ref());
            }
            "routing.review_threshold" if opts.review_threshold.is_none() => {
                opts.review_threshold = Some(*routing.review_threshold.get_ref());
            }
            _ => {}
        }
    }
    Ok(())
}
