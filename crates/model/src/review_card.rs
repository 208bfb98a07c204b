//! How an item reads in review: the job's `[review]` templates (a one-line
//! summary for the queue, a card for the detail view) and, where the answer
//! picks one of the evidence's candidates, which one and how it differs
//! from the item.
//!
//! Templates are minijinja, strict about undefined variables like the
//! prompt templates (crates/engine/src/template.rs), and live here so the
//! console (which may not depend on the engine) and the config checks both
//! reach them. What they render is item and model text: the caller
//! sanitizes it for the terminal ([`crate::sanitize`]) like all item text.

use crate::template_errors::{describe, undefined_variable};
use minijinja::{Environment, UndefinedBehavior};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// `[review]`: templates (minijinja, as prompts) for how an item reads in
/// the review queue and its card. Either may be left out: the queue then
/// shows the answer's fields, the card the evidence and answer as fields.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ReviewConfig {
    /// One line for the queue row, e.g. `{{ artist }} – {{ title }}`.
    #[serde(default)]
    pub summary: Option<String>,
    /// The card of the detail view (several lines).
    #[serde(default)]
    pub card: Option<String>,
}

impl ReviewConfig {
    pub fn is_empty(&self) -> bool {
        self.summary.is_none() && self.card.is_none()
    }
}

const SUMMARY: &str = "review.summary";
const CARD: &str = "review.card";

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReviewTemplateError {
    /// The template does not compile; `key` is `review.summary` or
    /// `review.card`, `line` the line inside the template.
    #[error("{key}: line {line}: template syntax error: {detail}")]
    Syntax {
        key: &'static str,
        line: usize,
        detail: String,
    },
    /// One item's card cannot be rendered (a field it lacks).
    #[error("{key}: line {line}: {detail}")]
    Render {
        key: &'static str,
        line: usize,
        detail: String,
    },
}

/// The compiled `[review]` templates.
pub struct ReviewTemplates {
    env: Environment<'static>,
    has_summary: bool,
    has_card: bool,
}

impl std::fmt::Debug for ReviewTemplates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReviewTemplates")
            .field("has_summary", &self.has_summary)
            .field("has_card", &self.has_card)
            .finish()
    }
}

impl ReviewTemplates {
    /// Compile the section's templates; a syntax error names its key and line.
    pub fn compile(cfg: &ReviewConfig) -> Result<Self, ReviewTemplateError> {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        // The same words in debug and release builds (see the prompts').
        env.set_debug(false);
        // Cards are terminal text, sanitized by the caller: no HTML escaping.
        env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
        for (key, src) in [(SUMMARY, &cfg.summary), (CARD, &cfg.card)] {
            if let Some(src) = src {
                env.add_template_owned(key, src.clone()).map_err(|e| {
                    ReviewTemplateError::Syntax {
                        key,
                        line: e.line().unwrap_or(0),
                        detail: describe(&e),
                    }
                })?;
            }
        }
        Ok(Self {
            env,
            has_summary: cfg.summary.is_some(),
            has_card: cfg.card.is_some(),
        })
    }

    /// The queue line of an item (`None`: no summary template). Newlines
    /// and control characters are gone; the caller truncates.
    pub fn summary(
        &self,
        item_id: &str,
        evidence: &Value,
        answer: &Value,
    ) -> Option<Result<String, ReviewTemplateError>> {
        self.has_summary.then(|| {
            self.render(SUMMARY, item_id, evidence, answer)
                .map(|s| crate::sanitize::for_terminal(s.trim()))
        })
    }

    /// The card of an item, several lines, each sanitized (`None`: no card
    /// template).
    pub fn card(
        &self,
        item_id: &str,
        evidence: &Value,
        answer: &Value,
    ) -> Option<Result<Vec<String>, ReviewTemplateError>> {
        self.has_card.then(|| {
            self.render(CARD, item_id, evidence, answer).map(|s| {
                s.trim_end()
                    .lines()
                    .map(crate::sanitize::for_terminal)
                    .collect()
            })
        })
    }

    /// The context: the evidence's fields (also as `item`), `item_id`, the
    /// `answer` and the `chosen` candidate (or none).
    fn render(
        &self,
        key: &'static str,
        item_id: &str,
        evidence: &Value,
        answer: &Value,
    ) -> Result<String, ReviewTemplateError> {
        let mut ctx = Map::new();
        if let Value::Object(fields) = evidence {
            ctx.extend(fields.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        ctx.insert("item".into(), evidence.clone());
        ctx.insert("item_id".into(), Value::String(item_id.to_string()));
        ctx.insert("answer".into(), answer.clone());
        let chosen = chosen_candidate(evidence, answer).map(|c| c.candidate.clone());
        ctx.insert("chosen".into(), chosen.unwrap_or(Value::Null));
        let ctx = minijinja::Value::from(minijinja::value::Serde(&ctx));
        let tpl = self
            .env
            .get_template(key)
            .map_err(|e| ReviewTemplateError::Syntax {
                key,
                line: e.line().unwrap_or(0),
                detail: describe(&e),
            })?;
        tpl.render(ctx).map_err(|e| ReviewTemplateError::Render {
            key,
            line: e.line().unwrap_or(0),
            detail: undefined_variable(&e, tpl.source()).unwrap_or_else(|| describe(&e)),
        })
    }
}

/// The candidate an answer picks, and where it is.
#[derive(Debug, Clone, PartialEq)]
pub struct Chosen<'a> {
    /// The evidence key of the candidates list (`candidates`).
    pub list: &'a str,
    /// Its place in the list.
    pub index: usize,
    pub candidate: &'a Value,
    /// The answer's fields that name it (`crg_mbid`).
    pub matched_by: Vec<&'a str>,
}

/// The candidate an answer picks: in a list of objects in the evidence, the
/// one whose fields share the most values with the answer's fields of the
/// same name (the demo's answer names its candidate by `crg_mbid` and
/// `rr_mbid`). `None` when no candidate shares any.
pub fn chosen_candidate<'a>(evidence: &'a Value, answer: &'a Value) -> Option<Chosen<'a>> {
    let (Value::Object(ev), Value::Object(ans)) = (evidence, answer) else {
        return None;
    };
    let mut best: Option<Chosen<'a>> = None;
    for (list, v) in ev {
        let Value::Array(items) = v else { continue };
        for (index, c) in items.iter().enumerate() {
            let Value::Object(fields) = c else { continue };
            let matched_by: Vec<&str> = ans
                .iter()
                .filter(|(k, a)| names_a_candidate(a) && fields.get(k.as_str()) == Some(a))
                .map(|(k, _)| k.as_str())
                .collect();
            if !matched_by.is_empty()
                && best
                    .as_ref()
                    .is_none_or(|b| matched_by.len() > b.matched_by.len())
            {
                best = Some(Chosen {
                    list,
                    index,
                    candidate: c,
                    matched_by,
                });
            }
        }
    }
    best
}

/// Values that can name a candidate: ids and names, not a flag or a small
/// number every candidate may share.
fn names_a_candidate(v: &Value) -> bool {
    matches!(v, Value::String(s) if !s.trim().is_empty())
}

/// A field of the chosen candidate that differs from the item's own field
/// of the same name: (field, the item's value, the candidate's).
pub type FieldDiff = (String, String, String);

/// The fields the candidate and the item both have (title, artist...) whose
/// values differ; a number and its text (`1991`, `"1991"`) are the same.
pub fn differing_fields(evidence: &Value, candidate: &Value) -> Vec<FieldDiff> {
    let (Value::Object(ev), Value::Object(c)) = (evidence, candidate) else {
        return Vec::new();
    };
    c.iter()
        .filter_map(|(k, cv)| {
            let ev_v = ev.get(k)?;
            if matches!(ev_v, Value::Array(_) | Value::Object(_)) {
                return None;
            }
            let (a, b) = (scalar_text(ev_v), scalar_text(cv));
            (a != b).then(|| (k.clone(), a, b))
        })
        .collect()
}

/// A value as a person reads it: a string without quotes, else JSON.
pub fn scalar_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests;
