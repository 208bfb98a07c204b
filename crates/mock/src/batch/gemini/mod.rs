//! Gemini's Batch API: `routes` (create through `:batchGenerateContent`, get,
//! list, cancel, delete; the router also carries the Gemini Files routes),
//! `run` (the lifecycle task), `answer` (one request's answer).

pub(crate) mod answer;
pub(crate) mod routes;
pub(crate) mod run;
