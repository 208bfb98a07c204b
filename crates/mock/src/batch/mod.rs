//! The Batch APIs, one folder per wire, each with its routes (`routes`), its
//! lifecycle task (`run`) and its result lines; the lifecycle is compressed to
//! seconds and faults come by switch (the `batch_*` config fields).
//!
//! Shared by all three: `clock` (the schedule of lifecycle transitions) and
//! `lines` (result-line anomalies, and OpenAI's result lines and files).
//! The stores live in `state`, the gates in `gate`.

pub(crate) mod anthropic;
pub(crate) mod clock;
pub(crate) mod gemini;
pub(crate) mod lines;
pub(crate) mod openai;
