//! `docket profile list|show|set`: the arguments of the named rate-limit
//! profiles' commands (kept beside the others' in `cli`).

use clap::{Args, Subcommand};

use super::examples;
use super::{FormatArg, SummaryFormat};

#[derive(Debug, Subcommand)]
pub enum ProfileAction {
    /// Every profile's newest version: name, version, provider, model, limits.
    #[command(after_help = examples::PROFILE_LIST)]
    List {
        #[arg(long, value_enum, default_value_t = FormatArg::Table)]
        format: FormatArg,
    },
    /// One profile's versions, oldest first (its history).
    #[command(after_help = examples::PROFILE_SHOW)]
    Show {
        /// The profile's name.
        name: String,
        #[arg(long, value_enum, default_value_t = FormatArg::Table)]
        format: FormatArg,
    },
    /// Store a new version of a profile (version 1 when the name is new).
    /// The limits are a provider section's keys; those not given are left
    /// to docket.toml's section when the profile is used.
    #[command(after_help = examples::PROFILE_SET)]
    Set(ProfileSetArgs),
}

#[derive(Debug, Args, Clone)]
pub struct ProfileSetArgs {
    /// The profile's name (letters, digits, '-', '_', '.').
    pub name: String,
    /// The provider's name in docket.toml (`[providers.NAME]`).
    #[arg(long, value_name = "NAME")]
    pub provider: String,
    /// Only for this model (a run whose provider has another is refused).
    #[arg(long, value_name = "MODEL")]
    pub model: Option<String>,
    /// requests_per_minute (0: no client-side limit).
    #[arg(long, value_name = "N")]
    pub rpm: Option<u64>,
    /// tokens_per_minute (0: no client-side limit).
    #[arg(long, value_name = "N")]
    pub tpm: Option<u64>,
    /// max_concurrency: requests in flight at once (at least 1).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub concurrency: Option<u64>,
    /// request_timeout_secs.
    #[arg(long, value_name = "SECS")]
    pub timeout_secs: Option<f64>,
    /// max_transport_attempts (at least 1).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub transport_attempts: Option<u64>,
    /// max_rate_limit_retries.
    #[arg(long, value_name = "N")]
    pub rate_limit_retries: Option<u64>,
    /// retry_wait_secs.
    #[arg(long, value_name = "SECS")]
    pub retry_wait_secs: Option<f64>,
    #[arg(long, value_enum, default_value_t = SummaryFormat::Table)]
    pub format: SummaryFormat,
}
