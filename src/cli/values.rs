//! The values some flags take (`--format`, `--what`, `--example`,
//! `--provider`...), each a closed list clap checks.

use clap::ValueEnum;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ExampleArg {
    Critic,
    JudgeGym,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ProviderArg {
    Openai,
    Anthropic,
    Gemini,
    Openrouter,
    Ollama,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum FormatArg {
    Table,
    Csv,
    Json,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ExportFormat {
    Csv,
    Jsonl,
    Parquet,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ExportWhat {
    Decisions,
    Results,
    Requests,
    Items,
    Attempts,
}

/// How a command that does something says what it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SummaryFormat {
    Table,
    Json,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ImportFormatArg {
    Jsonl,
    Csv,
}
