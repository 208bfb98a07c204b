//! Anthropic's Message Batches: `routes` (create, get, list, cancel, delete,
//! results), `run` (the lifecycle task), `lines` (request parsing and result lines).

pub(crate) mod lines;
pub(crate) mod routes;
pub(crate) mod run;
