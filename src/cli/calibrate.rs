//! `docket calibrate`'s options.

use clap::Args;

use super::SummaryFormat;

#[derive(Debug, Args)]
pub struct CalibrateArgs {
    /// The session's id (default: the newest).
    #[arg(long)]
    pub session: Option<String>,
    /// The precision (share of auto-accepts a human would agree with) the
    /// suggested threshold must reach, at the lower 95% bound (default: the
    /// job's `[routing] target_precision` as the session recorded it, 0.98
    /// unless set).
    #[arg(long = "target-precision", value_name = "P")]
    pub target: Option<f64>,
    /// Write the suggested auto_accept_threshold into docket.toml (the rest
    /// of the file unchanged) and record it on the session.
    #[arg(long)]
    pub apply: bool,
    /// json: one JSON document on stdout (stable keys; see the README).
    #[arg(long, value_enum, default_value_t = SummaryFormat::Table)]
    pub format: SummaryFormat,
}
