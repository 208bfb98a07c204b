//! Opening the console from the command line: on the workspace (`docket`,
//! `console`, `review`) or on a run this process starts (`batch-adjudicate`
//! and `demo` on a terminal). The run goes on a tokio task; the console runs
//! on a blocking thread and never waits on it.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use docket::engine::{self, Estimate, Interrupts, Reporter, RunOptions, RunReport};
use docket::tui::app::{Pane, QuitChoice};
use docket::tui::term::{ConsoleOptions, InProcessRun};
use tokio::sync::oneshot;

use crate::cli::ConsoleArgs;

/// `SIGTERM` closes the console (restoring the terminal) like `q` would.
fn terminate_flag() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    #[cfg(unix)]
    {
        let f = flag.clone();
        tokio::spawn(async move {
            if let Ok(mut term) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            {
                term.recv().await;
                f.store(true, Ordering::Relaxed);
            }
        });
    }
    flag
}

fn options(ws: &Path, args: &ConsoleArgs, focus: Pane, session: Option<String>) -> ConsoleOptions {
    ConsoleOptions {
        workspace: ws.to_path_buf(),
        read_only: args.read_only,
        no_color: args.no_color,
        keymap_path: args.keymap.clone(),
        focus,
        session,
        in_process: None,
        terminate: terminate_flag(),
        mouse: args.mouse,
        log_files: Some(docket::workspace::log_files_described()),
    }
}

async fn run_console(opts: ConsoleOptions) -> Result<QuitChoice, String> {
    tokio::task::spawn_blocking(move || docket::tui::term::run(opts))
        .await
        .map_err(|e| format!("the console stopped: {e}"))?
        .map_err(|e| format!("the console stopped: {e}"))
}

/// `docket`, `docket console`, `docket review`.
pub async fn open(ws: &Path, args: &ConsoleArgs, focus: Pane, session: Option<String>) -> i32 {
    let config = ws.join(docket::config::CONFIG_FILE);
    let ledger = match docket::ledger::LedgerLocation::for_workspace(ws) {
        Ok(l) => l,
        Err(e) => {
            super::say_error(&e);
            return super::EXIT_USAGE;
        }
    };
    // A session named that the ledger does not hold is the error to report,
    // terminal or not.
    if let Some(id) = &session
        && ledger.exists()
        && let Err(e) = known_session(&ledger, id)
    {
        return super::fail(e);
    }
    if !std::io::stdout().is_terminal_checked() {
        eprintln!(
            "docket: the console needs a terminal; for line output use `docket sessions`, `docket batch-results` or `docket batch-adjudicate --headless`"
        );
        return super::EXIT_USAGE;
    }
    if !config.exists() && !ledger.exists() {
        eprintln!(
            "docket: {} is not a docket workspace (no docket.toml, no docket.sqlite). Try `docket demo`, or `docket init DIR`.",
            ws.display()
        );
        return super::EXIT_USAGE;
    }
    match run_console(options(ws, args, focus, session)).await {
        Ok(_) => 0,
        Err(e) => {
            super::say_error(&e);
            1
        }
    }
}

/// `--session ID` names a session of this ledger (checked before the
/// screen is taken, so a typo is an error, not an empty console).
fn known_session(ledger: &docket::ledger::LedgerLocation, id: &str) -> Result<(), String> {
    use docket::ledger::work::RunSessions;
    let l = docket::ledger::Ledger::open_read_only(ledger.clone()).map_err(|e| e.to_string())?;
    match l.load_session(id) {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(docket::ids::unknown_session(id)),
        Err(e) => Err(e.to_string()),
    }
}

trait TerminalCheck {
    fn is_terminal_checked(&self) -> bool;
}

impl TerminalCheck for std::io::Stdout {
    fn is_terminal_checked(&self) -> bool {
        use std::io::IsTerminal;
        self.is_terminal() && std::io::stdin().is_terminal()
    }
}

/// Prints the engine's lines until the console takes the screen, drops them
/// while it has it (what matters of them is in the session's events, which
/// the console shows), and prints again once it is gone.
struct Bridge {
    console_on: AtomicBool,
    started: std::sync::Mutex<Option<oneshot::Sender<String>>>,
}

impl Reporter for Bridge {
    fn line(&self, text: &str) {
        if self.console_on.load(Ordering::Relaxed) {
            tracing::debug!(target: "docket::run", "{text}");
            return;
        }
        let text = docket::sanitize::lines_for_terminal(text);
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{text}");
        let _ = out.flush();
    }

    fn session_started(&self, session_id: &str) {
        // The console takes the screen from here on.
        self.console_on.store(true, Ordering::Relaxed);
        if let Some(tx) = self
            .started
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            let _ = tx.send(session_id.to_string());
        }
    }
}

/// `batch-adjudicate` (and `demo`) on a terminal: the run in the background,
/// the console on it. Returns the run's exit code.
pub async fn run_with_console(
    opts: RunOptions,
    args: &ConsoleArgs,
    confirm: impl FnOnce(&Estimate) -> bool + Send + 'static,
    interrupts: Interrupts,
    focus: Pane,
) -> i32 {
    let (tx, rx) = oneshot::channel();
    let bridge = Arc::new(Bridge {
        console_on: AtomicBool::new(false),
        started: std::sync::Mutex::new(Some(tx)),
    });
    let finished = Arc::new(AtomicBool::new(false));
    let done = finished.clone();
    let reporter: Arc<dyn Reporter> = bridge.clone();
    let ws = opts.workspace.clone();
    let engine_interrupts = interrupts.clone();
    let mut engine_task = tokio::spawn(async move {
        let r = engine::run(opts, reporter, confirm, engine_interrupts).await;
        done.store(true, Ordering::Relaxed);
        r
    });
    // Until a session exists there is nothing to show: the estimate, the
    // question and any early error are plain lines.
    let session_id = tokio::select! {
        id = rx => id.ok(),
        r = &mut engine_task => return finish(r, false),
    };
    let Some(session_id) = session_id else {
        return finish(engine_task.await, false);
    };
    let mut console = options(&ws, args, focus, Some(session_id.clone()));
    console.in_process = Some(InProcessRun {
        session_id: session_id.clone(),
        finished: finished.clone(),
    });
    let choice = run_console(console).await;
    bridge.console_on.store(false, Ordering::Relaxed);
    let ended_under_console = finished.load(Ordering::Relaxed);
    match choice {
        Ok(QuitChoice::Pause) => {
            note(&ws, &session_id, "pause and quit requested");
            println!("Pausing {session_id}: in-flight requests finish, then it is saved.");
            interrupts.pause.cancel();
        }
        Ok(QuitChoice::Cancel) => {
            note(&ws, &session_id, "cancel and quit requested");
            println!(
                "Cancelling {session_id}: in-flight requests finish and its provider batches are cancelled (what they finished is collected), then it is saved."
            );
            interrupts.cancel_batches.cancel();
            interrupts.stop.cancel();
        }
        Ok(QuitChoice::KeepHeadless) if finished.load(Ordering::Relaxed) => {}
        Ok(QuitChoice::KeepHeadless) => {
            println!(
                "Console closed; {session_id} keeps running here with line output \
                 (Ctrl-C stops it, resumable; `docket` in another terminal watches it)."
            );
        }
        Ok(QuitChoice::Close) => {}
        Err(e) => {
            // The console failed: stop the run safely rather than run blind.
            super::say_error(&e);
            interrupts.stop.cancel();
        }
    }
    finish(engine_task.await, ended_under_console)
}

/// The quit dialog's choice, in the session's events with who made it.
fn note(ws: &Path, session_id: &str, what: &str) {
    let actor = format!("review:{}", docket::review::Operator::current().user);
    let written = docket::ledger::LedgerLocation::for_workspace(ws)
        .and_then(docket::ledger::Ledger::open)
        .map_err(|e| e.to_string())
        .and_then(|l| {
            use docket::ledger::control::RunControls;
            l.note(session_id, what, &actor).map_err(|e| e.to_string())
        });
    if let Err(e) = written {
        tracing::warn!("could not record {what:?} for {session_id}: {e}");
    }
}

/// The exit code, and the summary when the console hid the engine's own.
fn finish(
    r: Result<Result<RunReport, engine::EngineError>, tokio::task::JoinError>,
    print_summary: bool,
) -> i32 {
    match r {
        Ok(Ok(report)) => {
            if print_summary && let Some(s) = &report.session {
                for l in engine::format_summary(s, &report.end) {
                    println!("{l}");
                }
            }
            report.exit_code()
        }
        Ok(Err(e)) => {
            super::say_error(&e);
            e.exit_code()
        }
        Err(e) => {
            eprintln!("docket: the run stopped: {e}");
            1
        }
    }
}
