//! What a minijinja error says to an operator, shared by the prompt
//! templates (engine) and the review templates (`review_card`): the
//! expression an undefined variable came from, else the error's kind and
//! detail.

/// `undefined variable "item.title"`: an undefined-value error named by
/// the template text its span covers (the expression that failed); None
/// for another kind of error or one without a span.
pub fn undefined_variable(e: &minijinja::Error, source: &str) -> Option<String> {
    if e.kind() != minijinja::ErrorKind::UndefinedError {
        return None;
    }
    let text = source.get(e.range()?)?;
    let expr = text
        .trim()
        .trim_start_matches("{{")
        .trim_end_matches("}}")
        .trim();
    let expr: String = expr.split_whitespace().collect::<Vec<_>>().join(" ");
    if expr.is_empty() {
        return None;
    }
    let shown = crate::sanitize::truncate(&expr, 80);
    Some(format!("undefined variable \"{shown}\""))
}

/// The error's kind, and its detail when it has one.
pub fn describe(e: &minijinja::Error) -> String {
    match e.detail() {
        Some(d) => format!("{}: {d}", e.kind()),
        None => e.kind().to_string(),
    }
}
