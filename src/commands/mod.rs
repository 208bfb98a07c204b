//! One function per command; each returns the process exit code. The
//! commands live in groups: the ledger's opening and copying (`ledger`),
//! setting a workspace up (`setup`), checking one (`doctor`), removing items (`items`), reading results out (`reports`),
//! steering a session (`control`) and running one (`run`, `signals`).

use std::io::{IsTerminal, Write};

use docket::control::Desired;
use docket::tui::app::Pane;

use crate::cli::{Cli, Command, ConsoleArgs, ItemsAction, LedgerAction};

mod calibrate;
mod console;
mod control;
mod docs;
mod doctor;
mod items;
mod ledger;
mod profile;
mod reports;
mod requests;
mod run;
mod setup;
mod signals;
mod summary;

pub const EXIT_USAGE: i32 = 2;

pub async fn run(cli: Cli) -> i32 {
    let ws = docket::workspace::resolve(cli.workspace.as_deref());
    let console_args = console_args(&cli);
    if console_args.print_keymap {
        let (keymap, warnings) = docket::tui::keymap::Keymap::load(console_args.keymap.as_deref());
        for w in &warnings {
            eprintln!("keymap: {w}");
        }
        print!("{}", keymap.to_toml());
        return 0;
    }
    let Some(command) = cli.command else {
        return console::open(&ws, &console_args, Pane::Stages, None).await;
    };
    match command {
        Command::Demo { args, .. } => {
            setup::demo(args, cli.workspace.as_deref(), &console_args).await
        }
        Command::Console { session, .. } => {
            console::open(&ws, &console_args, Pane::Stages, session).await
        }
        Command::Review { .. } => console::open(&ws, &console_args, Pane::Review, None).await,
        Command::Init {
            dir,
            force,
            example,
            provider,
        } => setup::init(dir.as_deref().unwrap_or(&ws), force, example, provider),
        Command::Doctor { format, offline } => doctor::doctor(&ws, format, offline).await,
        Command::Import {
            file,
            id_field,
            strict,
            update,
            format,
            output_format,
        } => setup::import(&ws, &file, id_field, strict, update, format, output_format),
        Command::Items {
            action: ItemsAction::Rm(args),
        } => items::rm(&ws, args),
        Command::BatchAdjudicate { args, .. } => {
            ledger::warn_about_the_place(&ws);
            run::batch_adjudicate(&ws, args, &console_args).await
        }
        Command::Worker(args) => {
            ledger::warn_about_the_place(&ws);
            run::worker(&ws, args).await
        }
        Command::Workers { session, format } => reports::workers(&ws, &session, format),
        Command::BatchResults { session, format } => reports::batch_results(&ws, &session, format),
        Command::Sessions { format } => reports::sessions(&ws, format),
        Command::Calibrate(args) => calibrate::calibrate(&ws, args),
        Command::Export {
            session,
            what,
            format,
            output,
        } => reports::export(&ws, session, what, format, output),
        Command::Report { session, output } => reports::run_report(&ws, &session, output),
        Command::Pause { session, format } => {
            control::control(&ws, &session, Some(Desired::Paused), format)
        }
        Command::Resume { session, format } => {
            control::control(&ws, &session, Some(Desired::Running), format)
        }
        Command::Cancel { session, format } => control::cancel(&ws, &session, format).await,
        Command::StopAtStage { session, format } => control::control(&ws, &session, None, format),
        Command::Profile { action } => profile::profile(&ws, action),
        Command::Ledger {
            action: LedgerAction::Copy { to, from },
        } => tokio::task::block_in_place(|| ledger::ledger_copy(&ws, to, from)),
        Command::MockProvider { port, config, .. } => mock_provider(port, *config).await,
        Command::Completions { shell, .. } => docs::completions(shell),
        Command::Man { out, .. } => docs::man(out.as_deref()),
    }
}

/// The console's options of the command (`docket review --no-color`)
/// joined with those given before it (`docket --no-color review`, which
/// worked when they were global).
fn console_args(cli: &Cli) -> ConsoleArgs {
    match &cli.command {
        Some(
            Command::Demo { console, .. }
            | Command::Console { console, .. }
            | Command::Review { console }
            | Command::BatchAdjudicate { console, .. },
        ) => console.clone().or(&cli.console),
        _ => cli.console.clone(),
    }
}

/// `docket mock-provider`: the built-in mock on a loopback port until killed.
async fn mock_provider(port: u16, config: docket::mock::MockConfig) -> i32 {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    match docket::mock::serve_forever(config, addr).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("docket mock-provider: {e}");
            1
        }
    }
}

/// One JSON document on standard output, for `--format json`: exact to a
/// file or a pipe, through the sanitizer on a terminal (like all data).
fn print_json(doc: &serde_json::Value) {
    let mut out = data_out();
    let _ = writeln!(out, "{doc}");
    let _ = out.flush();
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
