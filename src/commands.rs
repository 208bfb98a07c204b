//! One function per command; each returns the process exit code.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use docket::engine::{self, Interrupts, RunOptions, StdoutReporter};
use docket::ledger::{self, LEDGER_FILE, store};
use docket::{items, report};

use crate::cli::{
    Cli, Command, DemoArgs, ExportFormat, ExportWhat, FormatArg, ImportFormatArg, RunArgs,
};

pub const EXIT_USAGE: i32 = 2;

pub async fn run(cli: Cli) -> i32 {
    let ws = docket::workspace::resolve(cli.workspace.as_deref());
    let Some(command) = cli.command else {
        // The console arrives with the console issue; until then say what to run.
        println!(
            "docket {}: batch LLM adjudication.",
            env!("CARGO_PKG_VERSION")
        );
        println!(
            "Try `docket demo`, or `docket init DIR` then `docket batch-adjudicate`. See `docket --help`."
        );
        return 0;
    };
    match command {
        Command::Demo(args) => demo(args).await,
        Command::Init { dir, force } => init(dir.as_deref().unwrap_or(&ws), force),
        Command::Import {
            file,
            id_field,
            strict,
            format,
        } => import(&ws, &file, id_field, strict, format),
        Command::BatchAdjudicate(args) => batch_adjudicate(&ws, args).await,
        Command::BatchResults { session, format } => with_ledger(&ws, |c| {
            let f = match format {
                FormatArg::Table => report::OutputFormat::Table,
                FormatArg::Csv => report::OutputFormat::Csv,
                FormatArg::Json => report::OutputFormat::Json,
            };
            report::write_results(c, &session, f, &mut std::io::stdout().lock())
                .map_err(|e| e.to_string())
        }),
        Command::Sessions { format } => with_ledger(&ws, |c| {
            let f = match format {
                FormatArg::Table | FormatArg::Csv => report::OutputFormat::Table,
                FormatArg::Json => report::OutputFormat::Json,
            };
            report::write_sessions(c, f, &mut std::io::stdout().lock()).map_err(|e| e.to_string())
        }),
        Command::Export {
            session,
            what,
            format,
            output,
        } => export(&ws, session, what, format, output),
        Command::Pause { session } => control(&ws, &session, "paused"),
        Command::Resume { session } => control(&ws, &session, "running"),
        Command::Cancel { session } => control(&ws, &session, "cancelled"),
        Command::MockProvider { port, config } => {
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
            match docket::mock::serve_forever(config, addr).await {
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
    eprintln!("docket: {msg}");
    EXIT_USAGE
}

fn with_ledger(ws: &Path, f: impl FnOnce(&rusqlite::Connection) -> Result<(), String>) -> i32 {
    let path = ws.join(LEDGER_FILE);
    if !path.exists() {
        return fail(format!(
            "{}: no ledger here yet (import items with `docket import FILE`)",
            path.display()
        ));
    }
    let conn = match ledger::open(&path) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    match f(&conn) {
        Ok(()) => 0,
        Err(e) => fail(e),
    }
}

fn init(dir: &Path, force: bool) -> i32 {
    match docket::workspace::init(dir, force) {
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
    let path = ws.join(LEDGER_FILE);
    let mut conn = match ledger::open(&path) {
        Ok(c) => c,
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
    match items::import_file(&mut conn, file, &opts) {
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
    with_ledger(ws, |c| {
        let opts = report::ExportOptions {
            session,
            what: match what {
                ExportWhat::Decisions => report::ExportWhat::Decisions,
                ExportWhat::Results => report::ExportWhat::Results,
                ExportWhat::Requests => report::ExportWhat::Requests,
            },
            format: match format {
                ExportFormat::Csv => report::ExportFormat::Csv,
                ExportFormat::Jsonl => report::ExportFormat::Jsonl,
            },
        };
        match &output {
            Some(p) => {
                let file = std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()))?;
                let mut w = std::io::BufWriter::new(file);
                let n = report::export(c, &opts, &mut w).map_err(|e| e.to_string())?;
                w.flush().map_err(|e| format!("{}: {e}", p.display()))?;
                println!("Exported {n} rows to {}", p.display());
                Ok(())
            }
            None => report::export(c, &opts, &mut std::io::stdout().lock())
                .map(|_| ())
                .map_err(|e| e.to_string()),
        }
    })
}

fn control(ws: &Path, session: &str, desired: &str) -> i32 {
    with_ledger(ws, |c| {
        let Some(s) = store::load_session(c, session).map_err(|e| e.to_string())? else {
            return Err(format!(
                "no session {session}; list them with `docket sessions`"
            ));
        };
        if matches!(s.state.as_str(), "completed") {
            return Err(format!(
                "session {session} is completed; nothing to {}",
                verb(desired)
            ));
        }
        store::set_desired_state(c, session, desired).map_err(|e| e.to_string())?;
        let live = if s.state == "running" || s.state == "paused" {
            "the engine running it obeys within a second"
        } else {
            "it is not running now; `docket batch-adjudicate --resume` continues it"
        };
        println!("Session {session}: asked to {} ({live}).", verb(desired));
        Ok(())
    })
}

fn verb(desired: &str) -> &'static str {
    match desired {
        "paused" => "pause",
        "running" => "resume",
        _ => "cancel",
    }
}

/// Ctrl-C / SIGTERM: the first asks for a graceful stop, a second abandons
/// in-flight requests. Installed only once the run is going (after the
/// confirmation): until then Ctrl-C keeps its ordinary meaning and simply
/// ends docket, with nothing created and nothing sent.
fn spawn_signal_handler(interrupts: &Interrupts) {
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
            tokio::select! {
                r = tokio::signal::ctrl_c() => if r.is_err() { return },
                _ = got => {}
            }
            count += 1;
            if count == 1 {
                i.stop.cancel()
            } else {
                i.abort.cancel()
            }
        }
    });
}

async fn batch_adjudicate(ws: &Path, args: RunArgs) -> i32 {
    if !(args.grace.is_finite() && args.grace >= 0.0) {
        return fail("--grace: must be a non-negative number of seconds");
    }
    let opts = RunOptions {
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
    };
    let ask = !args.yes && std::io::stdin().is_terminal() && std::io::stdout().is_terminal();
    let interrupts = Interrupts::default();
    let listen = interrupts.clone();
    if args.resume.is_some() {
        // A resume asks nothing: it is going from the start.
        spawn_signal_handler(&interrupts);
    }
    let result = engine::run(
        opts,
        Arc::new(StdoutReporter),
        move |_| {
            let go = if ask { confirm() } else { true };
            if go {
                spawn_signal_handler(&listen);
            }
            go
        },
        interrupts,
    )
    .await;
    match result {
        Ok(report) => report.end.exit_code(),
        Err(e) => fail(e),
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

async fn demo(args: DemoArgs) -> i32 {
    let dir = docket::workspace::demo_dir();
    // Line output is the only output until the console lands; --headless is
    // accepted now so scripts written for both keep working.
    let _ = args.headless;
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
        resume: None,
        force: false,
        skip_reviewed: false,
        auto_accept_threshold: None,
        review_threshold: None,
        yes: true,
        headless: true,
        max_cost: None,
        grace: 5.0,
    };
    let code = batch_adjudicate(&dir, args).await;
    if code == 0 {
        println!();
        println!("Explore it: docket --workspace {} sessions", dir.display());
    }
    code
}
