//! docket: batch LLM adjudication engine.
//!
//! The engine (ledger, limiter, providers, routing, sessions) lives here; the
//! CLI in `main.rs` and the console sit on top and never speak HTTP or SQL.

pub mod config;
pub mod control;
pub mod cost;
pub mod demo;
pub mod engine;
pub mod failpoint;
#[doc(hidden)]
pub mod fuzzing;
pub mod gate;
pub mod ids;
pub mod injection;
pub mod items;
pub mod ledger;
pub mod limiter;
pub mod mock;
pub mod provider;
pub mod report;
pub mod retry;
pub mod review;
pub mod routing;
pub mod sanitize;
pub mod template;
pub mod tui;
pub mod watch;
pub mod workspace;
