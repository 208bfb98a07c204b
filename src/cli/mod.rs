//! The command line (clap). Thin: every command calls into the library.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

pub mod about;
mod calibrate;
mod console_args;
mod examples;
mod items;
mod no_workspace;
mod profile;
mod requests;
mod values;

pub use calibrate::CalibrateArgs;
pub use console_args::ConsoleArgs;
pub use items::{ItemsAction, ItemsRmArgs};
pub use no_workspace::NoWorkspace;
pub use profile::{ProfileAction, ProfileSetArgs};
pub use requests::{RequestsArgs, RequestsMode};
pub use values::*;

/// The exit codes, for `--help` (the README's list).
const EXIT_CODES: &str = "Exit codes:
  0    done (a session completed with every item accepted, in review or rejected)
  1    docket doctor found a problem (a FAIL line)
  2    bad usage, config or input (a bad import row included)
  3    stopped by a provider error that retrying cannot fix (credentials, quota),
       or a provider that failed the preflight
  4    paused, resumable (the --max-cost budget, a stop at a stage, a gate that
       never passes, an unreachable provider, the console's \"quit, pause it\")
  5    completed, with items in error (see docket batch-results SESSION)
  6    the ledger could not be written (disk full, an I/O error); resumable
  130  interrupted or cancelled, resumable";

#[derive(Debug, Parser)]
#[command(
    name = "docket",
    version,
    about = "A terminal operations console for batch LLM adjudication",
    after_help = EXIT_CODES
)]
pub struct Cli {
    /// The workspace folder (docket.toml + docket.sqlite). Default: the current folder.
    #[arg(long, global = true, env = "DOCKET_WORKSPACE", value_name = "DIR")]
    pub workspace: Option<PathBuf>,

    /// The ledger on a PostgreSQL server (postgres://USER@HOST/DB), for a
    /// job that spans machines; default: docket.toml's [ledger] url, else
    /// the workspace's docket.sqlite. Put the password in PGPASSWORD.
    #[arg(
        long,
        global = true,
        env = "DOCKET_LEDGER_URL",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub ledger: Option<String>,

    #[command(flatten)]
    pub console: ConsoleArgs,

    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Demo workspace + built-in mock provider + a live run in the console. No key, no network.
    #[command(after_help = examples::DEMO)]
    Demo {
        #[command(flatten)]
        args: DemoArgs,
        #[command(flatten)]
        console: ConsoleArgs,
    },
    /// The console on the workspace: live view of any running session (also plain `docket`).
    #[command(after_help = examples::CONSOLE)]
    Console {
        /// Watch this session (default: the newest).
        #[arg(long)]
        session: Option<String>,
        #[command(flatten)]
        console: ConsoleArgs,
    },
    /// The console opened on the review queue.
    #[command(after_help = examples::REVIEW)]
    Review {
        #[command(flatten)]
        console: ConsoleArgs,
    },
    /// Write a working workspace (docket.toml, prompt, schema, sample items).
    #[command(after_help = examples::INIT)]
    Init {
        /// Folder to create it in (default: the workspace, else the current folder).
        dir: Option<PathBuf>,
        /// Overwrite the scaffold files if a docket.toml is already there.
        #[arg(long)]
        force: bool,
        /// A staged-pipeline example instead of the one-stage job: `critic`
        /// (adjudicate, then a critic) or `judge-gym` (rubric_gen,
        /// rubric_critic, score_gen, score_critic).
        #[arg(long, value_enum)]
        example: Option<ExampleArg>,
        /// Point the job at a real provider instead of the built-in mock:
        /// its kind, a small model and the name of the environment variable
        /// its key is read from (the key itself is never written).
        #[arg(long, value_enum, value_name = "KIND")]
        provider: Option<ProviderArg>,
    },
    /// Check the workspace before a run: docket.toml, templates and schemas,
    /// each provider's key and a cheap request to it, the ledger's integrity
    /// and schema version, free disk space, and the terminal. One line per
    /// check (ok, warn or FAIL), each warn and FAIL with its fix. Nothing is
    /// written; exit 1 when a check FAILed.
    #[command(after_help = examples::DOCTOR)]
    Doctor {
        /// json: one JSON document on stdout (`ok` and `checks`: name,
        /// status ok/warn/fail, detail, fix).
        #[arg(long, value_enum, default_value_t = SummaryFormat::Table)]
        format: SummaryFormat,
        /// Do not send the providers their cheap request (no network).
        #[arg(long)]
        offline: bool,
    },
    /// Load JSONL or CSV items as undecided (indeterminate) decisions.
    ///
    /// Idempotent by item id: an id already in the ledger is left as it is
    /// (the summary counts those whose evidence changed); with --update
    /// changed evidence replaces the ledger's and the next run asks again
    /// for those items. Bad rows are reported as FILE:LINE: reason and skipped; the good rows
    /// are imported, and the exit code is 2 when any row was bad. With
    /// --strict nothing is imported when any row is bad.
    #[command(after_help = examples::IMPORT)]
    Import {
        /// The items: a .jsonl file (one JSON object per line) or a .csv
        /// file with a header row; each row's fields are its evidence.
        file: PathBuf,
        /// The field (JSONL) or column (CSV) holding the item id.
        #[arg(long, default_value = "id")]
        id_field: String,
        /// Import nothing if any row is bad.
        #[arg(long)]
        strict: bool,
        /// Replace the evidence of ids the ledger has when it changed (by
        /// content hash): their answers and pending review items are marked
        /// stale, and the next run asks again for them alone, as a new
        /// request version. Prints new / changed / unchanged counts.
        #[arg(long)]
        update: bool,
        /// Force the format instead of guessing from the extension.
        #[arg(long, value_enum)]
        format: Option<ImportFormatArg>,
        /// json: the summary as one JSON document on stdout (rows read,
        /// imported, already present, changed, bad rows with their line and
        /// reason).
        #[arg(long = "output-format", value_enum, default_value_t = SummaryFormat::Table)]
        output_format: SummaryFormat,
    },
    /// The workspace's items: `docket items rm` removes items nothing was sent for yet.
    Items {
        #[command(subcommand)]
        action: ItemsAction,
    },
    /// Adjudicate every indeterminate item: render, send, gate, route, record.
    #[command(visible_alias = "run", after_help = examples::RUN)]
    BatchAdjudicate {
        #[command(flatten)]
        args: RunArgs,
        #[command(flatten)]
        console: ConsoleArgs,
    },
    /// Join a running or paused session as one more worker (from any
    /// terminal on a machine that sees the ledger): it claims items from the
    /// ledger, shares the provider's limits with the other workers, obeys
    /// pause / stop-at-stage / cancel, and exits 0 once the session's work
    /// is done.
    #[command(after_help = examples::WORKER)]
    Worker(WorkerArgs),
    /// The workers of a session: id, host, claims held, requests sent and
    /// per second, orphaned answers, last heartbeat, alive or gone.
    #[command(after_help = examples::WORKERS)]
    Workers {
        /// The session's id (`docket sessions` lists them).
        session: String,
        #[arg(long, value_enum, default_value_t = FormatArg::Table)]
        format: FormatArg,
    },
    /// A session's results.
    #[command(visible_alias = "results", after_help = examples::RESULTS)]
    BatchResults {
        /// The session's id (`docket sessions` lists them).
        session: String,
        #[arg(long, value_enum, default_value_t = FormatArg::Table)]
        format: FormatArg,
    },
    /// Judge the judge: per confidence band, how often human reviewers
    /// agreed with the model (with 95% intervals), the precision the
    /// session's auto-accept threshold gave, and the lowest threshold whose
    /// measured precision reaches a target.
    #[command(after_help = examples::CALIBRATE)]
    Calibrate(CalibrateArgs),
    /// List sessions with state and counters.
    #[command(after_help = examples::SESSIONS)]
    Sessions {
        #[arg(long, value_enum, default_value_t = FormatArg::Table)]
        format: FormatArg,
    },
    /// Export decisions, results, requests, attempts or a session's items as CSV, JSONL
    /// or Parquet (stable snake_case columns; see the README's Exports).
    #[command(after_help = examples::EXPORT)]
    Export {
        /// Only this session (required for items).
        #[arg(long)]
        session: Option<String>,
        /// items: one row per item of the session, every stage's parsed
        /// output in its own `<stage>__<field>` column. attempts: one row
        /// per attempt, with the provider's raw answer text.
        #[arg(long, value_enum, default_value_t = ExportWhat::Results)]
        what: ExportWhat,
        /// parquet needs --output FILE.
        #[arg(long, value_enum, default_value_t = ExportFormat::Csv)]
        format: ExportFormat,
        /// Write here instead of standard output.
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
    /// Write a session's run report: one self-contained HTML file (stage
    /// table, outcomes, charts, errors, provider batches, config) to share.
    #[command(after_help = examples::REPORT)]
    Report {
        /// The session's id (`docket sessions` lists them).
        session: String,
        /// Write here (`-` for standard output); default
        /// `report-SESSION.html` in the current folder.
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
    /// Ask a running session to pause (in-flight requests finish).
    #[command(after_help = examples::PAUSE)]
    Pause {
        /// The session's id (`docket sessions` lists them).
        session: String,
        /// json: one JSON document on stdout (stable keys; see the README's
        /// Scripting), for scripts.
        #[arg(long, value_enum, default_value_t = SummaryFormat::Table)]
        format: SummaryFormat,
    },
    /// Ask a paused session to continue.
    #[command(after_help = examples::RESUME)]
    Resume {
        /// The session's id (`docket sessions` lists them).
        session: String,
        /// json: one JSON document on stdout (stable keys; see the README's
        /// Scripting), for scripts.
        #[arg(long, value_enum, default_value_t = SummaryFormat::Table)]
        format: SummaryFormat,
    },
    /// Ask a running session to stop; it stays resumable.
    #[command(after_help = examples::CANCEL)]
    Cancel {
        /// The session's id (`docket sessions` lists them).
        session: String,
        /// json: one JSON document on stdout (stable keys; see the README's
        /// Scripting), for scripts.
        #[arg(long, value_enum, default_value_t = SummaryFormat::Table)]
        format: SummaryFormat,
    },
    /// Ask a running session to finish its current stage, then stop.
    #[command(after_help = examples::STOP_AT_STAGE)]
    StopAtStage {
        /// The session's id (`docket sessions` lists them).
        session: String,
        /// json: one JSON document on stdout (stable keys; see the README's
        /// Scripting), for scripts.
        #[arg(long, value_enum, default_value_t = SummaryFormat::Table)]
        format: SummaryFormat,
    },
    /// Named rate-limit profiles kept in the ledger: `list`, `show NAME`,
    /// `set NAME --provider P ...` (each set is a new version). A run takes
    /// one with `batch-adjudicate --profile NAME`.
    Profile {
        #[command(subcommand)]
        action: ProfileAction,
    },
    /// The workspace's ledger itself: `copy` moves it between the SQLite
    /// file and a PostgreSQL database.
    Ledger {
        #[command(subcommand)]
        action: LedgerAction,
    },
    /// Serve the built-in mock provider on 127.0.0.1: the OpenAI, Azure
    /// OpenAI, Anthropic, Gemini, Ollama and OpenRouter chat routes and
    /// models lists, and the OpenAI/Azure, Anthropic and Gemini Batch APIs
    /// (with the Files routes OpenAI's and Gemini's batches use), each in
    /// its provider's wire format.
    #[command(after_help = examples::MOCK_PROVIDER)]
    MockProvider {
        #[arg(long, default_value_t = 8089)]
        port: u16,
        #[command(flatten)]
        config: Box<docket::mock::MockConfig>,
        #[command(flatten)]
        no_workspace: NoWorkspace,
    },
    /// Print a shell completion script for docket to standard output.
    #[command(after_help = examples::COMPLETIONS)]
    Completions {
        /// The shell: bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
        #[command(flatten)]
        no_workspace: NoWorkspace,
    },
    /// Print docket's man page (roff) to standard output, or with --out
    /// write one page per command into a folder.
    #[command(after_help = examples::MAN)]
    Man {
        /// Write docket.1 and a page per command (docket-batch-adjudicate.1, ...) here.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        #[command(flatten)]
        no_workspace: NoWorkspace,
    },
}

#[derive(Debug, Subcommand)]
pub enum LedgerAction {
    /// Copy the workspace's SQLite ledger into an empty PostgreSQL database
    /// (--to), or a PostgreSQL ledger into the workspace's empty SQLite file
    /// (--from): every item, session, request, attempt, result, review and
    /// event, in one transaction. The password comes from the URL or
    /// PGPASSWORD and is never printed.
    #[command(after_help = examples::LEDGER_COPY)]
    Copy {
        /// postgres://user[:password]@host[:port]/database
        #[arg(
            long,
            value_name = "URL",
            conflicts_with = "from",
            required_unless_present = "from"
        )]
        to: Option<String>,
        /// postgres://user[:password]@host[:port]/database
        #[arg(long, value_name = "URL")]
        from: Option<String>,
    },
}

#[derive(Debug, Args, Clone)]
pub struct WorkerArgs {
    /// The session to join.
    #[arg(long, value_name = "ID")]
    pub session: String,
    /// Seconds in-flight requests may take to finish after Ctrl-C.
    #[arg(long, default_value_t = 10.0, value_name = "SECS")]
    pub grace: f64,
    /// Do not ask the providers for their models list before joining (by
    /// default one that cannot be reached, or refuses its key, stops the
    /// worker before it claims anything).
    #[arg(long)]
    pub no_preflight: bool,
    /// Join though docket.toml here differs from the one the session
    /// started with (limits, timeouts, thresholds...); by default the
    /// worker refuses, naming each setting that differs.
    #[arg(long)]
    pub accept_changes: bool,
}

#[derive(Debug, Args, Clone)]
pub struct RunArgs {
    /// Process at most N items.
    #[arg(long, value_name = "N")]
    pub limit: Option<u64>,
    /// A floor on auto-accept: an answer is accepted only when its confidence
    /// is at least max(auto-accept threshold, this). Review and reject are
    /// unchanged.
    #[arg(long, value_name = "FLOAT")]
    pub min_confidence: Option<f64>,
    /// Max requests per minute (overrides the provider's requests_per_minute).
    #[arg(long, value_name = "N")]
    pub rate_limit: Option<u64>,
    /// Run with a named rate-limit profile (`docket profile list`): its
    /// newest version's limits override its provider's section for this
    /// run (--rate-limit still wins over its rpm). The session records the
    /// profile and version; a resume keeps that version.
    #[arg(long, value_name = "NAME")]
    pub profile: Option<String>,
    /// Show what would be done (counts, estimate, first prompt); send
    /// nothing. Needs no API key: a missing one is said as a warning.
    #[arg(long)]
    pub dry_run: bool,
    /// json: the end-of-run summary (or the dry run's estimate) as one JSON
    /// document on stdout; the progress lines go to standard error.
    #[arg(long, value_enum, default_value_t = SummaryFormat::Table)]
    pub format: SummaryFormat,
    /// Do not ask the providers for their models list first (by default a
    /// provider that cannot be reached, or refuses its key, stops the run
    /// before a session is created or an item touched).
    #[arg(long)]
    pub no_preflight: bool,
    /// Resume a session (within 7 days of its start). A docket.toml edited
    /// since the session started is refused, naming each setting that
    /// changed, unless --accept-changes is given.
    #[arg(long, value_name = "SESSION_ID")]
    pub resume: Option<String>,
    /// With --resume: go on with docket.toml as it is now, though settings
    /// changed since the session started (limits, timeouts, thresholds...).
    /// A change of what a stage sends (its provider, model, prompt template
    /// or parameters) is still refused: that is a new job, not this session.
    #[arg(long, requires = "resume")]
    pub accept_changes: bool,
    /// Run even when job.enabled = false.
    #[arg(long)]
    pub force: bool,
    /// Leave out items that already have a pending review item. This is
    /// now the default (they await a human; asking again would make a
    /// second suggestion for one item): the flag is kept for scripts.
    #[arg(long, conflicts_with = "rereview_pending")]
    pub skip_reviewed: bool,
    /// Take items that already have a pending review item too: the new
    /// answer supersedes the old suggestion (kept in the ledger as history,
    /// named on the new one's review card). A completed answer made with the
    /// same template and parameters is reused, not paid again; add
    /// --rerun-stage to ask the provider anew.
    #[arg(long)]
    pub rereview_pending: bool,
    /// Auto-accept at or above this confidence (default: routing.auto_accept_threshold).
    #[arg(long, value_name = "FLOAT")]
    pub auto_accept_threshold: Option<f64>,
    /// Review at or above this confidence, reject below (default: routing.review_threshold).
    #[arg(long, value_name = "FLOAT")]
    pub review_threshold: Option<f64>,
    /// Do not ask for confirmation.
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Line output instead of the console (the default when not on a terminal).
    #[arg(long)]
    pub headless: bool,
    /// A hard budget in USD: dispatch pauses (resumable) before the spend could pass it.
    #[arg(long, value_name = "USD")]
    pub max_cost: Option<f64>,
    /// When the session is finished: exact (every item, a batch line the
    /// provider never ran goes again until it runs), best_effort (such a
    /// line spends a transport attempt; past them the item ends in error),
    /// throughput (as exact; an `auto` stage batches even small cuts).
    /// Overrides `[job] completion_mode`.
    #[arg(long, value_name = "MODE")]
    pub completion_mode: Option<docket::config::CompletionMode>,
    /// Seconds in-flight requests may take to finish after Ctrl-C.
    #[arg(long, default_value_t = 10.0, value_name = "SECS")]
    pub grace: f64,
    /// A stop by Ctrl-C or SIGTERM also cancels this session's provider
    /// batches still open, collecting what they finished, without asking
    /// (by default they keep running at the provider, and billing, for a
    /// resume to collect; on a terminal Ctrl-C asks).
    #[arg(long)]
    pub cancel_remote: bool,
    /// Ask this stage, and every stage after it, again: new requests (a new
    /// request_version) instead of the answered ones. With --resume, for
    /// every item of that session (its outcomes are kept as history).
    #[arg(long, value_name = "STAGE")]
    pub rerun_stage: Option<String>,
    /// Boxed: the flags of `--requests` are many, and seldom there.
    #[command(flatten)]
    pub requests: Box<RequestsArgs>,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Line output instead of the console.
    #[arg(long)]
    pub headless: bool,
    /// How many demo items.
    #[arg(long, default_value_t = 500)]
    pub items: usize,
    /// Keep the previous demo ledger and docket.toml instead of starting fresh.
    #[arg(long)]
    pub keep: bool,
}

#[cfg(test)]
mod tests;
