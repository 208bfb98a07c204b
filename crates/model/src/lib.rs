//! docket's shared types: what every other part of docket speaks.
//!
//! Owns the job configuration (`config`: docket.toml parsed, checked and
//! explained), the mock provider's settings (`mock_config`), routing
//! outcomes (`routing`), a live run's gauges and tuning (`live`), the one
//! vocabulary of session states (`session_state`), who is
//! deciding (`operator`), how an item reads in review (`review_card`), the Batch API's quarantined lines (`batch`), ids
//! and hashes (`ids`), making model and item text safe for a terminal or a
//! log (`sanitize`), spotting prompt injections in evidence (`injection`),
//! reading a job's files (`files`) and the crash tests' named failpoints
//! (`failpoint`).
//!
//! It may not touch the ledger, the network or the terminal: it depends on
//! no other docket crate, and every other docket crate may depend on it.

pub mod batch;
pub mod calibration;
pub mod config;
pub mod evidence;
pub mod failpoint;
pub mod files;
pub mod ids;
pub mod injection;
pub mod live;
pub mod mock_config;
pub mod operator;
pub mod profile;
pub mod review_card;
pub mod routing;
pub mod sanitize;
pub mod session_state;
pub mod template_errors;
