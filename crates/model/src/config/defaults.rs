//! The values docket.toml's settings take when left out (serde's
//! `default = "..."` functions).

use toml::Spanned;

pub(super) fn default_verdict_field() -> String {
    "verdict".into()
}
pub(super) fn default_agree() -> Vec<String> {
    ["agree", "agrees", "correct", "yes", "pass", "accept"]
        .map(String::from)
        .to_vec()
}

pub(super) fn default_job_name() -> String {
    "docket-job".into()
}
pub(super) fn yes() -> bool {
    true
}
pub(super) fn unspanned<T>(v: T) -> Spanned<T> {
    Spanned::new(0..0, v)
}
pub(super) fn default_rpm() -> Spanned<u64> {
    unspanned(500)
}
pub(super) fn default_tpm() -> Spanned<u64> {
    unspanned(200_000)
}
pub(super) fn default_concurrency() -> Spanned<u64> {
    unspanned(16)
}
pub(super) fn default_timeout() -> Spanned<f64> {
    unspanned(120.0)
}
pub(super) fn default_transport_attempts() -> Spanned<u64> {
    unspanned(5)
}
pub(super) fn default_rate_limit_retries() -> Spanned<u64> {
    unspanned(30)
}
pub(super) fn default_retry_wait() -> Spanned<f64> {
    unspanned(60.0)
}
pub(super) fn default_max_tokens() -> Spanned<u64> {
    unspanned(512)
}
pub(super) fn default_expected_output() -> Spanned<u64> {
    unspanned(120)
}
pub(super) fn default_max_attempts() -> Spanned<u64> {
    unspanned(3)
}
pub(super) fn default_min_batch_size() -> Spanned<u64> {
    unspanned(100)
}
pub(super) fn default_max_wait() -> Spanned<f64> {
    unspanned(60.0)
}
pub(super) fn default_max_open_batches() -> Spanned<u64> {
    unspanned(4)
}
pub(super) fn default_confidence_field() -> String {
    "confidence".into()
}
pub(super) fn default_rationale_field() -> String {
    "rationale".into()
}
pub(super) fn default_auto_accept() -> Spanned<f64> {
    unspanned(0.85)
}
pub(super) fn default_review() -> Spanned<f64> {
    unspanned(0.60)
}
pub(super) fn default_target_precision() -> Spanned<f64> {
    unspanned(crate::calibration::DEFAULT_TARGET)
}
pub(super) fn default_no_share() -> Spanned<f64> {
    unspanned(0.0)
}

pub(super) fn default_true() -> bool {
    true
}
