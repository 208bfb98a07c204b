//! Fuzz entry points for the readers of provider answers: each provider's
//! chat answers and error bodies, and each Batch API's result lines. Called
//! by `docket::fuzzing` (the cargo-fuzz targets and `tests/fuzz_props.rs`);
//! the one property is that none of them panics on any bytes.

use std::sync::OnceLock;

use crate::batch::results::Matcher;
use crate::batch::{BatchState, ResultLine};
use crate::limiter::RateHeaders;

/// The first byte picks the HTTP status (a success or an error body).
fn status(data: &[u8]) -> (u16, &[u8]) {
    const STATUSES: [u16; 8] = [200, 200, 200, 400, 401, 429, 500, 529];
    match data.split_first() {
        Some((b, rest)) => (STATUSES[usize::from(*b) % STATUSES.len()], rest),
        None => (200, data),
    }
}

pub fn answer_openai(data: &[u8]) {
    use crate::openai;
    let (code, body) = status(data);
    let _ = openai::parse_success(body, RateHeaders::default(), None, code);
    let _ = openai::classify_error(code, body, RateHeaders::default());
}

pub fn answer_anthropic(data: &[u8]) {
    use crate::anthropic;
    let (code, body) = status(data);
    let _ = anthropic::parse_success(body, RateHeaders::default(), None, code);
    let _ = anthropic::classify_error(code, body, RateHeaders::default());
}

pub fn answer_gemini(data: &[u8]) {
    use crate::gemini;
    let (code, body) = status(data);
    let _ = gemini::parse_success(body, RateHeaders::default(), code);
    let _ = gemini::classify_error(code, body, RateHeaders::default());
    let _ = gemini::parse_proto_duration(&String::from_utf8_lossy(body));
}

pub fn answer_ollama(data: &[u8]) {
    use crate::ollama;
    let (code, body) = status(data);
    let _ = ollama::parse_success(body, RateHeaders::default(), code);
    let _ = ollama::classify_error(code, body, RateHeaders::default());
}

pub fn answer_openrouter(data: &[u8]) {
    use crate::openrouter;
    let (code, body) = status(data);
    let _ = openrouter::failed_generation(body, RateHeaders::default());
    let _ = openrouter::classify_error(code, body, RateHeaders::default());
}

/// Feed `data` line by line to a batch adapter's result-line reader.
fn batch_lines(data: &[u8], id_word: &'static str, line: impl Fn(&mut Matcher<'_>, &[u8], &str)) {
    let expected: std::collections::HashSet<String> =
        ["a", "b", "req-1"].iter().map(|s| s.to_string()).collect();
    let mut sink = |_: ResultLine| {};
    let mut m = Matcher::new(&expected, &mut sink, id_word);
    for (i, raw) in data.split(|b| *b == b'\n').enumerate() {
        line(&mut m, raw, &format!("line {}", i + 1));
    }
    let _ = m.finish(&BatchState::Completed);
}

fn key() -> crate::ApiKey {
    crate::ApiKey::new("fuzzKEYcanary0001")
}

pub fn batch_line_openai(data: &[u8]) {
    static A: OnceLock<crate::batch::openai::OpenAiBatch> = OnceLock::new();
    let a = A.get_or_init(|| {
        crate::batch::openai::OpenAiBatch::openai(
            "openai",
            "https://api.openai.com/v1/",
            Some(key()),
        )
        .expect("adapter")
    });
    batch_lines(data, "custom_id", |m, raw, at| a.line(m, raw, at));
}

pub fn batch_line_anthropic(data: &[u8]) {
    static A: OnceLock<crate::batch::anthropic::AnthropicBatch> = OnceLock::new();
    let a = A.get_or_init(|| {
        crate::batch::anthropic::AnthropicBatch::new("https://api.anthropic.com/v1/", key())
            .expect("adapter")
    });
    batch_lines(data, "custom_id", |m, raw, at| a.line(m, raw, at));
}

pub fn batch_line_gemini(data: &[u8]) {
    static A: OnceLock<crate::batch::gemini::GeminiBatch> = OnceLock::new();
    let a = A.get_or_init(|| {
        crate::batch::gemini::GeminiBatch::new(
            "https://generativelanguage.googleapis.com/v1beta/",
            key(),
        )
        .expect("adapter")
    });
    batch_lines(data, "key", |m, raw, at| a.raw_line(m, raw, at));
}
