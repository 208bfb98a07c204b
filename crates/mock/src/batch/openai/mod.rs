//! The OpenAI and Azure Batches API: `routes` (create, get, list, cancel),
//! `input` (JSONL validation of the input file), `run` (the lifecycle task).
//! Its result lines and files are in `batch::lines`.

pub(crate) mod input;
pub(crate) mod routes;
pub(crate) mod run;
