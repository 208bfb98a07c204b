//! Staged pipelines end to end (stub).
mod support;
#[test]
fn stub() {}
