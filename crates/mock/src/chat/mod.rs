//! The synchronous chat routes, one file per wire, and the pipeline they share.
//!
//! `pipeline` runs every chat request (latency, rate buckets, faults, modes,
//! deterministic answer, stats and log) and calls back into the wire's file
//! to render answers and errors: `openai` (OpenAI, Azure OpenAI and
//! OpenRouter), `anthropic`, `gemini`, `ollama`. `infer` picks the answer
//! format when a request has no schema field; `output_config` checks
//! Anthropic's structured-output parameter; `thinking` models Gemini 2.5's
//! thinking budget. The Batch APIs reuse the
//! renderers and the pipeline's event and answer types.

pub(crate) mod anthropic;
pub(crate) mod gemini;
pub(crate) mod infer;
pub(crate) mod ollama;
pub(crate) mod openai;
pub(crate) mod output_config;
pub(crate) mod pipeline;
pub(crate) mod thinking;
