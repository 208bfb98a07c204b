//! The flags of `docket run --requests FILE`: a file of requests sent as
//! written (OpenAI Batch API lines or bare chat-completions bodies).

use std::path::PathBuf;

use clap::{Args, ValueEnum};

/// How `--requests` sends its lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum RequestsMode {
    /// One request at a time under the provider's limits.
    #[default]
    Sync,
    /// Through the provider's Batch API (half price, within 24 h).
    Batch,
}

#[derive(Debug, Args, Clone, Default)]
pub struct RequestsArgs {
    /// Send every line of this JSONL file as written: OpenAI Batch API
    /// lines ({custom_id, method, url: "/v1/chat/completions", body}) or
    /// bare chat-completions bodies ({model, messages, ...}; their
    /// custom_id is line-N). The answers are written in the Batch API's
    /// output format (--output). The job lives in FILE.docket/ beside the
    /// file (its docket.toml and ledger): the same command again resumes
    /// it, or, once finished, writes the output again sending nothing.
    #[arg(long, value_name = "FILE")]
    pub requests: Option<PathBuf>,
    /// The provider: inside a workspace, one of its [providers.NAME];
    /// else a kind (openai, azure, anthropic, gemini, openrouter, ollama,
    /// mock) with its standard key variable and base URL.
    #[arg(long, value_name = "NAME", requires = "requests")]
    pub provider: Option<String>,
    /// Send every request to this model instead of its body's.
    #[arg(long, value_name = "MODEL", requires = "requests")]
    pub model: Option<String>,
    /// The provider's base URL instead of its standard one.
    #[arg(long, value_name = "URL", requires = "requests")]
    pub base_url: Option<String>,
    /// Where the results go (default: FILE.results.jsonl beside FILE),
    /// written whole at the end.
    #[arg(long, value_name = "OUT", requires = "requests")]
    pub output: Option<PathBuf>,
    /// A JSON schema each answer's content must pass (the stage's gate):
    /// an answer that fails is asked again up to 3 times, then kept, with
    /// the failure in its output line's `error`.
    #[arg(long, value_name = "FILE.json", requires = "requests")]
    pub schema: Option<PathBuf>,
    /// sync: one request at a time under the limits; batch: through the
    /// provider's Batch API.
    #[arg(long, value_enum, default_value_t = RequestsMode::Sync, requires = "requests")]
    pub mode: RequestsMode,
    /// With --mode batch: poll the provider's batches every SECS seconds
    /// instead of at its own cadence (30 s at first, then slower).
    #[arg(long, value_name = "SECS", requires = "requests")]
    pub poll_interval: Option<f64>,
    /// Send nothing if any line is bad (by default the good lines go and
    /// the exit code is 2).
    #[arg(long, requires = "requests")]
    pub strict: bool,
}
