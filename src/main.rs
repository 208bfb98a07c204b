//! docket's entry point: parse the command line, set up logging and the
//! runtime, and call the library. The exit codes are listed by `--help`
//! (`cli::EXIT_CODES`) and the README.

mod cli;
mod commands;

use clap::FromArgMatches;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    private_files();
    let cli = match cli::Cli::from_arg_matches(&cli::about::command().get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    if let Some(url) = cli.ledger.clone().filter(|u| !u.trim().is_empty()) {
        docket::ledger::location::choose(url);
    }
    let _log_guard = init_logging();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("docket: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = runtime.block_on(commands::run(cli));
    // Do not wait for stray tasks (a hung provider connection) at exit.
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    if std::env::var_os("DOCKET_REPORT_PEAK_RSS").is_some() {
        report_peak_rss();
    }
    std::process::exit(code);
}

/// Everything docket creates (a ledger, its logs, an export, a new
/// workspace) is the user's alone whatever the umask (fault-matrix row X2):
/// files 0600, folders 0700. What exists keeps its mode, so a ledger shared
/// on purpose (`chmod g+rw`) stays shared.
fn private_files() {
    // SAFETY: umask(2) cannot fail; it only sets this process's mask.
    unsafe {
        libc::umask(0o077);
    }
}

/// For the benchmarks: the process's peak resident set and the CPU time it
/// used (user + system, every thread), from /proc.
fn report_peak_rss() {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    if let Some(line) = status.lines().find(|l| l.starts_with("VmHWM:")) {
        let kb = line.split_whitespace().nth(1).unwrap_or("0");
        eprintln!("peak_rss_kb={kb}");
    }
    // Fields 14 and 15 of /proc/self/stat (after the command in
    // parentheses), in clock ticks; Linux uses 100 ticks a second.
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok());
    if let (Some(user), Some(system)) = (ticks(11), ticks(12)) {
        eprintln!("cpu_secs={:.2}", (user + system) / 100.0);
    }
}

/// Logs go to a file in the XDG state dir, a new one each day (the oldest
/// beyond `LOG_FILES_KEPT` deleted as docket starts), never to the terminal.
/// One record is one line: what a record quotes (item ids, evidence, a
/// model's answer) is escaped and bounded (`sanitize::OneLineLog`, row X4).
fn init_logging() -> Option<tracing_appender::non_blocking::WorkerGuard> {
    use docket::workspace::{LOG_FILE_PREFIX, LOG_FILE_SUFFIX, LOG_FILES_KEPT};
    use tracing_appender::rolling::{RollingFileAppender, Rotation};
    let dir = docket::workspace::log_dir();
    std::fs::create_dir_all(&dir).ok()?;
    let appender = RollingFileAppender::builder()
        .rotation(Rotation::DAILY)
        .filename_prefix(LOG_FILE_PREFIX)
        .filename_suffix(LOG_FILE_SUFFIX)
        .max_log_files(LOG_FILES_KEPT)
        .build(&dir)
        .ok()?;
    let (writer, guard) = tracing_appender::non_blocking(appender);
    let filter = tracing_subscriber::EnvFilter::try_from_env("DOCKET_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // The PostgreSQL driver logs every statement's parameters at debug
    // (items' evidence, answers): never into docket's log.
    let filter = ["tokio_postgres=info", "postgres=info"]
        .into_iter()
        .filter_map(|d| d.parse().ok())
        .fold(filter, |f, d| f.add_directive(d));
    tracing_subscriber::fmt()
        .with_writer(writer)
        .with_ansi(false)
        .event_format(docket::sanitize::OneLineLog::new(
            tracing_subscriber::fmt::format(),
        ))
        .with_env_filter(filter)
        .try_init()
        .ok()?;
    Some(guard)
}
