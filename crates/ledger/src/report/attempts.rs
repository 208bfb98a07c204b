//! `docket export --what attempts`: one row per attempt (send) of every
//! request, with what the provider answered, raw, as the ledger kept it.
//!
//! The raw output is the answer's text exactly as it came back, a rejected
//! or malformed one too: the only place it lives besides the ledger's
//! tables. No header or key is ever stored, so none can be exported.

use super::columns::Kind;

/// `export --what attempts`, in order. `latency_secs` is from the send to
/// its outcome (`finished_at`: answered, failed or found ambiguous); empty
/// while the attempt is still `sent`.
pub const ATTEMPT_COLUMNS: &[&str] = &[
    "session_id",
    "item_id",
    "stage",
    "request_id",
    "attempt",
    "state",
    "http_status",
    "finish_reason",
    "raw_output",
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "latency_secs",
    "error_kind",
    "error_message",
    "sent_at",
    "finished_at",
    "provider",
    "model",
    "model_reported",
    "client_request_id",
    "provider_request_id",
];

/// The kinds of `ATTEMPT_COLUMNS`, column by column.
pub const ATTEMPT_KINDS: &[Kind] = &[
    Kind::Text,
    Kind::Text,
    Kind::Text,
    Kind::Int,
    Kind::Int,
    Kind::Text,
    Kind::Int,
    Kind::Text,
    Kind::Text,
    Kind::Int,
    Kind::Int,
    Kind::Float,
    Kind::Float,
    Kind::Text,
    Kind::Text,
    Kind::Ts,
    Kind::Ts,
    Kind::Text,
    Kind::Text,
    Kind::Text,
    Kind::Text,
    Kind::Text,
];

const _: () = assert!(ATTEMPT_COLUMNS.len() == ATTEMPT_KINDS.len());
