//! docket: batch LLM adjudication.
//!
//! This crate is the binary's home (`main.rs`, the CLI and its commands) and
//! a facade over the workspace's crates, so a test or a bench reaches every
//! part by one name (`docket::engine`, `docket::ledger`, ...). What each
//! part owns, and which way the arrows go, is in the README's Architecture
//! section; the parts themselves are:
//!
//! - [`docket_model`]: shared types and ids, no I/O beyond reading a job's files;
//! - [`docket_ledger`]: the ledger API, its SQLite and PostgreSQL stores, and
//!   the read models and reports built on it;
//! - [`docket_providers`]: the chat and Batch API clients, the limiter, retries;
//! - [`docket_engine`]: planning, the work queue, gates, routing, cost;
//! - [`docket_console`]: the terminal console;
//! - [`docket_mock`]: the built-in mock provider.
//!
//! Here live only what joins them: the workspace on disk (`docket init`),
//! the demo's items, and the fuzz targets' entry points.

pub use docket_console as tui;
pub use docket_engine as engine;
pub use docket_engine::{cost, gate, items, template};
pub use docket_ledger as ledger;
pub use docket_ledger::{control, report, review, watch};
pub use docket_mock as mock;
pub use docket_model::{
    config, failpoint, ids, injection, profile, review_card, routing, sanitize,
};
pub use docket_providers as provider;
pub use docket_providers::{limiter, retry};

pub mod demo;
#[doc(hidden)]
pub mod fuzzing;
pub mod local_mock;
pub mod workspace;
