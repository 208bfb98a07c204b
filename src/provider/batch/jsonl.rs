//! placeholder: JSONL building and splitting
