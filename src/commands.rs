//! One function per command; each returns the process exit code.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use docket::engine::{self, Interrupts, RunOptions, StdoutReporter};
use docket::ledger::console::ConsoleReads;
use docket::ledger::control::RunControls;
use docket::ledger::{LEDGER_FILE, Ledger, LedgerLocation};
use docket::{items, report};

use docket::control::Desired;
use docket::tui::app::Pane;

use crate::cli::{
    Cli, Command, ConsoleArgs, DemoArgs, ExportFormat, ExportWhat, FormatArg, ImportFormatArg,
    LedgerAction, RunArgs,
};

pub const EXIT_USAGE: i32 = 2;

pub async fn run(cli: Cli) -> i32 {
    let ws = docket::workspace::resolve(cli.workspace.as_deref());
    let console_args = cli.console.clone();
    if console_args.print_keymap {
        let (keymap, warnings) = docket::tui::keymap::Keymap::load(console_args.keymap.as_deref());
        for w in &warnings {
            eprintln!("keymap: {w}");
        }
        print!("{}", keymap.to_toml());
        return 0;
    }
    let Some(command) = cli.command else {
        return crate::console::open(&ws, &console_args, Pane::Stages, None).await;
    };
    match command {
        Command::Demo(args) => demo(args, &console_args).await,
        Command::Console { session } => {
            crate::console::open(&ws, &console_args, Pane::Stages, session).await
        }
        Command::Review => crate::console::open(&ws, &console_args, Pane::Review, None).await,
        Command::Init {
            dir,
            force,
            example,
        } => init(dir.as_deref().unwrap_or(&ws), force, example),
        Command::Import {
            file,
            id_field,
            strict,
            format,
        } => import(&ws, &file, id_field, strict, format),
        Command::BatchAdjudicate(args) => {
            warn_about_the_place(&ws);
            batch_adjudicate(&ws, args, &console_args).await
        }
        Command::Worker(args) => {
            warn_about_the_place(&ws);
            worker(&ws, args).await
        }
        Command::Workers { session, format } => with_ledger_reading(&ws, |l| {
            let rows = l.workers(&session).map_err(|e| e.to_string())?;
            let out = match format {
                FormatArg::Json => workers_json(&rows),
                FormatArg::Table | FormatArg::Csv => workers_table(&session, &rows),
            };
            print!("{out}");
            Ok(())
        }),
        Command::BatchResults { session, format } => with_ledger_reading(&ws, |l| {
            let f = match format {
                FormatArg::Table => report::OutputFormat::Table,
                FormatArg::Csv => report::OutputFormat::Csv,
                FormatArg::Json => report::OutputFormat::Json,
            };
            report::write_results(l, &session, f, &mut data_out()).map_err(|e| e.to_string())
        }),
        Command::Sessions { format } => with_ledger_reading(&ws, |l| {
            let f = match format {
                FormatArg::Table | FormatArg::Csv => report::OutputFormat::Table,
                FormatArg::Json => report::OutputFormat::Json,
            };
            report::write_sessions(l, f, &mut data_out()).map_err(|e| e.to_string())
        }),
        Command::Export {
            session,
            what,
            format,
            output,
        } => export(&ws, session, what, format, output),
        Command::Pause { session } => control(&ws, &session, Some(Desired::Paused)),
        Command::Resume { session } => control(&ws, &session, Some(Desired::Running)),
        Command::Cancel { session } => cancel(&ws, &session).await,
        Command::StopAtStage { session } => control(&ws, &session, None),
        Command::Ledger {
            action: LedgerAction::Copy { to, from },
        } => tokio::task::block_in_place(|| ledger_copy(&ws, to, from)),
        Command::MockProvider { port, config } => {
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
            match docket::mock::serve_forever(*config, addr).await {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("docket mock-provider: {e}");
                    1
                }
            }
        }
    }
}

fn fail(msg: impl std::fmt::Display) -> i32 {
    say_error(msg);
    EXIT_USAGE
}

/// `docket: MESSAGE` on stderr, each line made safe for a terminal: a
/// message can quote an argument, a file's line or a provider's answer.
pub(crate) fn say_error(msg: impl std::fmt::Display) {
    let text = msg.to_string();
    let safe: Vec<String> = text.lines().map(docket::sanitize::for_terminal).collect();
    eprintln!("docket: {}", safe.join("\n"));
}

/// Standard output for data (CSV, JSON): on a terminal, a line at a time
/// through the terminal sanitizer; to a file or a pipe, exact.
fn data_out() -> Box<dyn Write> {
    let out = std::io::stdout();
    if out.is_terminal() {
        Box::new(docket::sanitize::TerminalLines::new(out.lock()))
    } else {
        Box::new(out.lock())
    }
}

fn with_ledger(ws: &Path, f: impl FnOnce(&Ledger) -> Result<(), String>) -> i32 {
    with_ledger_as(ws, Access::Write, f)
}

/// A command that only reads the ledger: it works in a read-only folder.
fn with_ledger_reading(ws: &Path, f: impl FnOnce(&Ledger) -> Result<(), String>) -> i32 {
    with_ledger_as(ws, Access::Read, f)
}

#[derive(Clone, Copy, PartialEq)]
enum Access {
    Read,
    Write,
}

fn with_ledger_as(ws: &Path, access: Access, f: impl FnOnce(&Ledger) -> Result<(), String>) -> i32 {
    let path = match LedgerLocation::for_workspace(ws) {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    if !path.exists() {
        return fail(format!(
            "{path}: no ledger here yet (import items with `docket import FILE`)"
        ));
    }
    let ledger = match Ledger::open(&path) {
        Ok(l) => l,
        Err(e) => match path.file().filter(|f| !writable_place(f)) {
            // Reading needs no write: open it as it is.
            Some(file) if access == Access::Read => match open_unwritable(file) {
                Ok(l) => l,
                Err(e) => return fail(e),
            },
            Some(file) => {
                return fail(format!(
                    "{e}: {} or its folder is read-only, and this command writes to the ledger \
                     (read-only commands such as `sessions`, `export` and `batch-results` still work)",
                    file.display()
                ));
            }
            None => return fail(e),
        },
    };
    match f(&ledger) {
        Ok(()) => 0,
        Err(e) => fail(e),
    }
}

/// A ledger in a place docket cannot write, for reading. With every
/// change in the file itself (no `-wal` left, or an empty one) it is read
/// as immutable; changes still in a `-wal` file need SQLite's own
/// read-only WAL access, which needs its `-shm` file there too.
fn open_unwritable(file: &Path) -> Result<Ledger, String> {
    let mut wal = file.as_os_str().to_owned();
    wal.push("-wal");
    let pending = std::fs::metadata(Path::new(&wal)).is_ok_and(|m| m.len() > 0);
    if !pending {
        return Ledger::open_immutable(file).map_err(|e| e.to_string());
    }
    Ledger::open_read_only(file)
        .and_then(|l| docket::ledger::work::RunSessions::latest_session(&l).map(|_| l))
        .map_err(|e| {
            format!(
                "{e}: {} is in a read-only place and has changes not yet written into it (its -wal file); \
                 open it once where it can be written (any docket command there merges them), or copy the folder",
                file.display()
            )
        })
}

/// Before a run: a workspace others may write to (row X2), and a SQLite
/// ledger on a network filesystem (row D4).
fn warn_about_the_place(ws: &Path) {
    warn_if_others_can_write(ws);
    if let Ok(docket::ledger::location::LedgerLocation::File(file)) =
        docket::ledger::location::LedgerLocation::for_workspace(ws)
    {
        let dir = file
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        if let Some(w) = docket::ledger::place::network_warning(dir) {
            eprintln!("docket: warning: {}", docket::sanitize::for_terminal(&w));
        }
    }
}

/// A workspace others may write to can have its prompts, schemas or
/// ledger changed under a run (fault-matrix row X2): say so before a run.
fn warn_if_others_can_write(ws: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let mut shared = Vec::new();
    for p in [ws.to_path_buf(), ws.join(LEDGER_FILE)] {
        if let Ok(m) = std::fs::metadata(&p)
            && m.permissions().mode() & 0o022 != 0
        {
            shared.push(format!(
                "{} (mode {:04o})",
                p.display(),
                m.permissions().mode() & 0o7777
            ));
        }
    }
    if !shared.is_empty() {
        eprintln!(
            "docket: warning: others can write to {}: they could change the prompts, schemas or ledger under this run (chmod go-w to stop it)",
            shared.join(" and ")
        );
    }
}

/// Whether docket may write the ledger file `file` and its folder (SQLite
/// writes `-wal` and `-shm` files beside it). The file itself is never
/// opened here: closing a second descriptor would drop SQLite's locks.
fn writable_place(file: &Path) -> bool {
    let file_ok = docket::ledger::place::writable(file);
    let dir = file
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let probe = dir.join(format!(".docket-write-probe-{}", std::process::id()));
    // not a ledger file: a probe of its own, removed at once.
    let dir_ok = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .map(|_| std::fs::remove_file(&probe))
        .is_ok();
    file_ok && dir_ok
}

/// `docket ledger copy --to URL | --from URL`.
fn ledger_copy(ws: &Path, to: Option<String>, from: Option<String>) -> i32 {
    use docket::ledger::copy;
    use docket::ledger::postgres::PgUrl;
    let file = ws.join(LEDGER_FILE);
    let (written, to_postgres) = match (to, from) {
        (Some(to), None) => (to, true),
        (None, Some(from)) => (from, false),
        _ => return fail("give one of --to URL or --from URL"),
    };
    if to_postgres && !file.exists() {
        return fail(format!("{}: no ledger here to copy", file.display()));
    }
    let url = match PgUrl::parse(&written) {
        Ok(u) => u,
        Err(e) => return fail(e),
    };
    let (file_name, url_name) = (file.display().to_string(), url.to_string());
    let (source, target, result) = if to_postgres {
        (file_name, url_name, copy::sqlite_to_postgres(&file, &url))
    } else {
        (url_name, file_name, copy::postgres_to_sqlite(&url, &file))
    };
    match result {
        Ok(report) => {
            println!("copied {} rows from {source} to {target}", report.rows());
            for (table, rows) in &report.tables {
                println!("  {table:<26} {rows:>10}");
            }
            0
        }
        Err(e) => {
            say_error(&e);
            1
        }
    }
}

fn init(dir: &Path, force: bool, example: Option<crate::cli::ExampleArg>) -> i32 {
    let example = example.map(|e| match e {
        crate::cli::ExampleArg::Critic => docket::workspace::Example::Critic,
        crate::cli::ExampleArg::JudgeGym => docket::workspace::Example::JudgeGym,
    });
    match docket::workspace::init_example(dir, force, example) {
        Ok(files) => {
            println!("Initialized a docket workspace in {}:", dir.display());
            for f in files {
                println!("  wrote {}", f.display());
            }
            println!();
            println!("Next:");
            println!(
                "  docket --workspace {} import {}",
                dir.display(),
                dir.join(docket::workspace::SAMPLE_ITEMS).display()
            );
            println!("  docket --workspace {} batch-adjudicate", dir.display());
            0
        }
        Err(e) => fail(e),
    }
}

fn import(
    ws: &Path,
    file: &Path,
    id_field: String,
    strict: bool,
    format: Option<ImportFormatArg>,
) -> i32 {
    let mut ledger = match LedgerLocation::for_workspace(ws).and_then(Ledger::open) {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    let opts = items::ImportOptions {
        id_field,
        strict,
        format: format.map(|f| match f {
            ImportFormatArg::Jsonl => items::ImportFormat::Jsonl,
            ImportFormatArg::Csv => items::ImportFormat::Csv,
        }),
    };
    match items::import_file(&mut ledger, file, &opts) {
        Ok(r) => {
            let _ = items::render_import_report(&r, &mut std::io::stdout().lock());
            if r.bad_count > 0 { EXIT_USAGE } else { 0 }
        }
        Err(e) => fail(e),
    }
}

fn export(
    ws: &Path,
    session: Option<String>,
    what: ExportWhat,
    format: ExportFormat,
    output: Option<PathBuf>,
) -> i32 {
    let opts = report::ExportOptions {
        session,
        what: match what {
            ExportWhat::Decisions => report::ExportWhat::Decisions,
            ExportWhat::Results => report::ExportWhat::Results,
            ExportWhat::Requests => report::ExportWhat::Requests,
            ExportWhat::Items => report::ExportWhat::Items,
        },
        format: match format {
            ExportFormat::Csv => report::ExportFormat::Csv,
            ExportFormat::Jsonl => report::ExportFormat::Jsonl,
            ExportFormat::Parquet => report::ExportFormat::Parquet,
        },
    };
    // Refused before the ledger is touched: Parquet is binary, never for a
    // terminal or a pipe, and items are one session's.
    if opts.format == report::ExportFormat::Parquet && output.is_none() {
        return fail(report::ReportError::ParquetNeedsFile);
    }
    if opts.what == report::ExportWhat::Items && opts.session.is_none() {
        return fail(report::ReportError::ItemsNeedSession);
    }
    with_ledger_reading(ws, |l| match &output {
        Some(p) => {
            let n = report::export_file(l, &opts, ws, p).map_err(|e| e.to_string())?;
            println!("Exported {n} rows to {}", p.display());
            Ok(())
        }
        None => match report::export_in(l, &opts, ws, &mut data_out()) {
            Ok(_) => Ok(()),
            Err(e) if e.is_broken_pipe() => Ok(()),
            Err(e) => Err(e.to_string()),
        },
    })
}

/// `pause`, `resume`, `cancel` (a desired state) or `stop-at-stage` (None),
/// written to the ledger with who asked; the engine running the session, in
/// whatever process, obeys within a second.
fn control(ws: &Path, session: &str, desired: Option<Desired>) -> i32 {
    let actor = format!("cli:{}", docket::review::Operator::current().user);
    with_ledger(ws, |l| {
        let live = if l.run_by_live_process(session).map_err(|e| e.to_string())? {
            "the engine running it obeys within a second"
        } else {
            "it is not running now; `docket batch-adjudicate --resume` continues it"
        };
        match desired {
            Some(d) => {
                l.set_desired(session, d, &actor)
                    .map_err(|e| e.to_string())?;
                let verb = match d {
                    Desired::Paused => "pause",
                    Desired::Running => "resume",
                    Desired::Cancelled => "cancel",
                };
                println!("Session {session}: asked to {verb} ({live}).");
            }
            None => {
                let stage = l
                    .stop_after_stage(session, &actor)
                    .map_err(|e| e.to_string())?;
                println!("Session {session}: asked to stop after stage {stage} ({live}).");
            }
        }
        Ok(())
    })
}

/// `docket cancel`: asked through the ledger like the other controls; when
/// no process runs the session, its provider batches are cancelled here
/// (nobody else would, and the provider bills them until they stop).
async fn cancel(ws: &Path, session: &str) -> i32 {
    let code = control(ws, session, Some(Desired::Cancelled));
    if code != 0 {
        return code;
    }
    let idle = LedgerLocation::for_workspace(ws)
        .and_then(Ledger::open)
        .ok()
        .and_then(|l| l.run_by_live_process(session).ok())
        .is_some_and(|live| !live);
    if !idle {
        return 0;
    }
    let actor = format!("cli:{}", docket::review::Operator::current().user);
    match engine::cancel_open_batches(ws, session, &actor).await {
        Ok(r) => {
            for (tag, id, state) in &r.cancelled {
                println!(
                    "Provider batch {tag} ({}): cancelled at the provider (now {state}).",
                    docket::sanitize::for_terminal(id)
                );
            }
            for tag in &r.without_id {
                println!(
                    "Provider batch {tag}: its create answer was never recorded; `docket batch-adjudicate --resume {session}` looks for it at the provider."
                );
            }
            for (tag, why) in &r.failed {
                eprintln!(
                    "docket: provider batch {tag} could not be cancelled: {}",
                    docket::sanitize::for_terminal(why)
                );
            }
            if !r.cancelled.is_empty() {
                println!(
                    "What they finished before stopping is paid for: `docket batch-adjudicate --resume {session}` collects it."
                );
            }
            if r.failed.is_empty() { 0 } else { 1 }
        }
        Err(e) => fail(e),
    }
}

/// Ctrl-C / SIGTERM: the first asks for a graceful stop, a second abandons
/// in-flight requests. Installed only once the run is going (after the
/// confirmation): until then Ctrl-C keeps its ordinary meaning and simply
/// ends docket, with nothing created and nothing sent.
fn spawn_signal_handler(interrupts: &Interrupts, batches: Option<BatchQuestion>) {
    let i = interrupts.clone();
    tokio::spawn(async move {
        #[cfg(unix)]
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        let mut count = 0;
        loop {
            #[cfg(unix)]
            let got = async {
                match term.as_mut() {
                    Some(t) => t.recv().await.map(|_| ()),
                    None => std::future::pending().await,
                }
            };
            #[cfg(not(unix))]
            let got = std::future::pending::<Option<()>>();
            // Only a Ctrl-C typed at the terminal is asked about; SIGTERM
            // stops without a question.
            let typed = tokio::select! {
                r = tokio::signal::ctrl_c() => if r.is_err() { return } else { true },
                _ = got => false,
            };
            count += 1;
            if count > 1 {
                i.abort.cancel();
                continue;
            }
            let ask = batches.as_ref().filter(|_| typed);
            match ask.and_then(BatchQuestion::open_batches) {
                // Provider batches keep running (and billing) after a stop:
                // on a terminal, ask whether they go too.
                Some(n) if n > 0 => {
                    let i = i.clone();
                    tokio::spawn(async move {
                        let yes = tokio::task::spawn_blocking(move || ask_cancel_batches(n))
                            .await
                            .unwrap_or(false);
                        if yes {
                            i.cancel_batches.cancel();
                        }
                        i.stop.cancel();
                    });
                }
                _ => i.stop.cancel(),
            }
        }
    });
}

/// Where a headless run on a terminal looks for its open provider batches
/// when Ctrl-C comes.
#[derive(Clone)]
struct BatchQuestion {
    ledger: LedgerLocation,
    session: Arc<std::sync::Mutex<Option<String>>>,
}

impl BatchQuestion {
    fn open_batches(&self) -> Option<u64> {
        let id = self.session.lock().ok()?.clone()?;
        let ledger = Ledger::open_read_only(&self.ledger).ok()?;
        ledger.open_provider_batches(&id).ok()
    }
}

fn ask_cancel_batches(n: u64) -> bool {
    print!(
        "\nStopping. {n} provider batch(es) of this session are still open: the provider keeps running them (and bills for them) unless they are cancelled.\nCancel them too, collecting what they finished? [y/N]: "
    );
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    if std::io::stdin().lock().read_line(&mut line).is_err() {
        return false;
    }
    matches!(line.trim().to_ascii_lowercase().as_str(), "y" | "yes")
}

/// Line output that remembers the session (for the Ctrl-C question).
struct NotingReporter {
    session: Arc<std::sync::Mutex<Option<String>>>,
}

impl engine::Reporter for NotingReporter {
    fn line(&self, text: &str) {
        StdoutReporter.line(text)
    }

    fn session_started(&self, session_id: &str) {
        if let Ok(mut s) = self.session.lock() {
            *s = Some(session_id.to_string());
        }
    }
}

async fn batch_adjudicate(ws: &Path, args: RunArgs, console: &ConsoleArgs) -> i32 {
    if !(args.grace.is_finite() && args.grace >= 0.0) {
        return fail("--grace: must be a non-negative number of seconds");
    }
    let mut opts = RunOptions {
        workspace: ws.to_path_buf(),
        limit: args.limit,
        min_confidence: args.min_confidence,
        rate_limit: args.rate_limit,
        dry_run: args.dry_run,
        resume: args.resume.clone(),
        force: args.force,
        skip_reviewed: args.skip_reviewed,
        auto_accept_threshold: args.auto_accept_threshold,
        review_threshold: args.review_threshold,
        max_cost: args.max_cost,
        base_url_override: None,
        grace: Some(Duration::from_secs_f64(args.grace)),
        rerun_stage: args.rerun_stage.clone(),
        join: false,
        preflight: !args.no_preflight,
        mock: Some(docket::local_mock::starter()),
    };
    if let Some(id) = &args.resume
        && let Err(e) = same_config_as_the_session(&mut opts, id, args.accept_changes)
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
        let go = if ask { confirm() } else { true };
        if go {
            spawn_signal_handler(&listen, question);
        }
        go
    };
    if tty && !args.headless && !args.dry_run {
        return crate::console::run_with_console(
            opts,
            console,
            confirm_then_listen,
            interrupts,
            Pane::Stages,
        )
        .await;
    }
    let result = engine::run(
        opts,
        Arc::new(NotingReporter { session }),
        confirm_then_listen,
        interrupts,
    )
    .await;
    match result {
        Ok(report) => report.exit_code(),
        Err(e) => {
            say_error(&e);
            e.exit_code()
        }
    }
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
    println!(
        "{}",
        docket::sanitize::for_terminal(&format!(
            "Note: {file} changed since session {session} started (--accept-changes): {}.",
            list.join("; ")
        ))
    );
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

/// `docket workers SESSION` as a table; ids and hosts made safe for a
/// terminal.
fn workers_table(session: &str, rows: &[docket::ledger::queue::WorkerRow]) -> String {
    use std::fmt::Write as _;
    let safe = docket::sanitize::for_terminal;
    if rows.is_empty() {
        return format!("no worker has worked on session {} yet\n", safe(session));
    }
    let mut out = format!(
        "{:<40} {:<16} {:>7} {:>7} {:>8} {:>7} {:>8} {:>11}  state\n",
        "worker", "host", "pid", "claims", "sent", "req/s", "orphaned", "heartbeat"
    );
    for w in rows {
        let _ = writeln!(
            out,
            "{:<40} {:<16} {:>7} {:>7} {:>8} {:>7.1} {:>8} {:>9.1} s  {}",
            safe(&w.worker_id),
            safe(&w.host),
            w.pid,
            w.claims,
            w.sent,
            w.requests_per_sec,
            w.orphaned,
            w.heartbeat_age_secs,
            if w.alive { "alive" } else { "gone" }
        );
    }
    out
}

fn workers_json(rows: &[docket::ledger::queue::WorkerRow]) -> String {
    let list: Vec<serde_json::Value> = rows
        .iter()
        .map(|w| {
            serde_json::json!({
                "worker_id": w.worker_id, "host": w.host, "pid": w.pid, "claims": w.claims,
                "sent": w.sent, "requests_per_sec": w.requests_per_sec, "orphaned": w.orphaned,
                "heartbeat_age_secs": w.heartbeat_age_secs, "alive": w.alive,
            })
        })
        .collect();
    format!("{}\n", serde_json::Value::Array(list))
}

/// `docket worker --session ID`: one more worker on a session, with line
/// output (it is meant for a second terminal, a tmux pane or a service).
async fn worker(ws: &Path, args: crate::cli::WorkerArgs) -> i32 {
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
    if let Err(e) = same_config_as_the_session(&mut opts, &args.session, args.accept_changes) {
        return fail(e);
    }
    let interrupts = Interrupts::default();
    // Ctrl-C stops this worker only (the others carry on); `docket cancel`
    // stops them all.
    spawn_signal_handler(&interrupts, None);
    let session = Arc::new(std::sync::Mutex::new(None));
    match engine::run(
        opts,
        Arc::new(NotingReporter { session }),
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

fn confirm() -> bool {
    print!("\nContinue? [y/N]: ");
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    if std::io::stdin().lock().read_line(&mut line).is_err() {
        return false;
    }
    matches!(line.trim().to_ascii_lowercase().as_str(), "y" | "yes")
}

async fn demo(args: DemoArgs, console: &ConsoleArgs) -> i32 {
    let dir = docket::workspace::demo_dir();
    if !dir.join("docket.toml").exists()
        && let Err(e) = docket::workspace::init(&dir, true)
    {
        return fail(e);
    }
    let ledger_path = dir.join(LEDGER_FILE);
    if !args.keep {
        for suffix in ["", "-wal", "-shm"] {
            let _ =
                std::fs::remove_file(PathBuf::from(format!("{}{suffix}", ledger_path.display())));
        }
    }
    let items_path = dir.join("items/demo.jsonl");
    let written = (|| -> std::io::Result<()> {
        // not a ledger file: the demo's items.
        let mut f = std::io::BufWriter::new(std::fs::File::create(&items_path)?);
        docket::demo::write_chart_items(&mut f, args.items, 2026)?;
        f.flush()
    })();
    if let Err(e) = written {
        return fail(format!("{}: {e}", items_path.display()));
    }
    println!(
        "docket demo: workspace {} (built-in mock provider, no key, no network)",
        dir.display()
    );
    let code = import(&dir, &items_path, "id".into(), false, None);
    if code != 0 {
        return code;
    }
    println!();
    let args = RunArgs {
        limit: None,
        min_confidence: None,
        rate_limit: None,
        dry_run: false,
        no_preflight: false,
        resume: None,
        accept_changes: false,
        force: false,
        skip_reviewed: false,
        auto_accept_threshold: None,
        review_threshold: None,
        yes: true,
        cancel_remote: false,
        headless: args.headless,
        max_cost: None,
        grace: 5.0,
        rerun_stage: None,
    };
    let code = batch_adjudicate(&dir, args, console).await;
    if code == 0 || code == docket::engine::EXIT_COMPLETED_WITH_ERRORS {
        println!();
        println!("Explore it: docket --workspace {} sessions", dir.display());
    }
    code
}
