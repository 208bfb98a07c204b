//! Unit tests of the translation, table-driven: the chat body's reading
//! (shared by both targets), each target's request and answer, and
//! round trips over a handful of realistic bodies.

mod anthropic;
mod chat;
mod gemini;
mod round_trip;

use serde_json::{Value, json};

use super::TranslateError;

/// A minimal valid chat body with `extra` merged in at the top level.
fn body(extra: Value) -> Value {
    let mut b = json!({
        "model": "m-1",
        "messages": [{"role": "user", "content": "Hello"}],
    });
    if let (Some(b), Some(extra)) = (b.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            b.insert(k.clone(), v.clone());
        }
    }
    b
}

/// Which kind of error, for tables.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Unsupported,
    Invalid,
}

fn kind_of(e: &TranslateError) -> Kind {
    match e {
        TranslateError::Unsupported { .. } => Kind::Unsupported,
        TranslateError::Invalid { .. } => Kind::Invalid,
    }
}

/// Both directions to both targets refuse `b` the same way, naming `path`.
fn assert_refused(b: &Value, kind: Kind, path: &str) {
    let a = super::chat_to_anthropic(b).expect_err(&format!("anthropic accepted {b}"));
    let g = super::chat_to_gemini(b).expect_err(&format!("gemini accepted {b}"));
    for e in [a, g] {
        assert_eq!((kind_of(&e), e.path()), (kind, path), "{b} gave {e}");
        assert!(e.to_string().starts_with(&format!("{path}: ")), "{e}");
    }
}
