//! Output gates: the strict parser every answer passes before it is routed.
//!
//! A gate is deterministic: the same output always gives the same verdict.
//! JSON-schema gates validate the answer against the stage's schema; regex
//! gates match a pattern with named captures ("reasoning, then VERDICT: x").
//! Either way the confidence must be a number in [0, 1].

use std::path::Path;

use regex::Regex;
use serde_json::{Map, Value};

use docket_model::config::GateConfig;

#[derive(Debug, thiserror::Error)]
pub enum GateBuildError {
    #[error("{path}: schema file cannot be read: {source}")]
    SchemaRead {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: schema is not valid JSON: {detail}")]
    SchemaJson { path: String, detail: String },
    #[error("{path}: not a usable JSON schema: {detail}")]
    SchemaInvalid { path: String, detail: String },
    #[error("{path}: stages.gate.pattern does not compile: {detail}")]
    Pattern { path: String, detail: String },
    #[error("{path}: stages.gate.pattern has no named capture \"{field}\" (the confidence)")]
    NoConfidenceCapture { path: String, field: String },
}

/// Why a JSON value read as a schema cannot be one (`Gate::json_schema`).
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error("{0}")]
    NotASchema(String),
}

/// Why an answer failed its gate. Recorded as the attempt's error.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GateFailure {
    #[error("empty answer")]
    Empty,
    #[error("answer is not JSON: {0}")]
    NotJson(String),
    #[error("answer is not a JSON object")]
    NotObject,
    #[error("answer violates the schema at {path}: {message}")]
    Schema { path: String, message: String },
    #[error("answer does not match the gate pattern")]
    NoMatch,
    #[error("answer has no \"{0}\" (the confidence)")]
    MissingConfidence(String),
    #[error("confidence {0} is not a number in [0, 1]")]
    BadConfidence(String),
}

/// What a passing answer gives the router.
#[derive(Debug, Clone, PartialEq)]
pub struct GateOutput {
    pub answer: Value,
    /// Always there for a stage that needs one (a generator); a critic's
    /// is optional, checked when present.
    pub confidence: Option<f64>,
    pub rationale: Option<String>,
}

pub enum Gate {
    JsonSchema {
        schema: Value,
        validator: Box<jsonschema::Validator>,
        confidence_field: String,
        rationale_field: String,
        needs_confidence: bool,
    },
    Regex {
        regex: Regex,
        confidence_field: String,
        rationale_field: String,
        needs_confidence: bool,
    },
}

impl Gate {
    /// Build from config; paths resolve against the workspace `root`.
    pub fn build(
        cfg: &GateConfig,
        root: &Path,
        config_path: &Path,
    ) -> Result<Self, GateBuildError> {
        Self::build_for(cfg, root, config_path, true)
    }

    /// `build`, for a stage whose answers need a confidence (a generator)
    /// or may go without (a critic: its verdict is what counts).
    pub fn build_for(
        cfg: &GateConfig,
        root: &Path,
        config_path: &Path,
        needs_confidence: bool,
    ) -> Result<Self, GateBuildError> {
        match cfg {
            GateConfig::JsonSchema {
                schema,
                confidence_field,
                rationale_field,
            } => {
                let path = if schema.is_absolute() {
                    schema.clone()
                } else {
                    root.join(schema)
                };
                let shown = path.display().to_string();
                let text = docket_model::files::read_text_file(&path).map_err(|source| {
                    GateBuildError::SchemaRead {
                        path: shown.clone(),
                        source,
                    }
                })?;
                let schema: Value =
                    serde_json::from_str(&text).map_err(|e| GateBuildError::SchemaJson {
                        path: shown.clone(),
                        detail: e.to_string(),
                    })?;
                Self::json_schema(schema, confidence_field, rationale_field, needs_confidence)
                    .map_err(|e| GateBuildError::SchemaInvalid {
                        path: shown,
                        detail: e.to_string(),
                    })
            }
            GateConfig::Regex {
                pattern,
                confidence_field,
                rationale_field,
            } => {
                let shown = config_path.display().to_string();
                let regex = Regex::new(pattern).map_err(|e| GateBuildError::Pattern {
                    path: shown.clone(),
                    detail: e.to_string(),
                })?;
                if needs_confidence
                    && !regex
                        .capture_names()
                        .flatten()
                        .any(|n| n == confidence_field)
                {
                    return Err(GateBuildError::NoConfidenceCapture {
                        path: shown,
                        field: confidence_field.clone(),
                    });
                }
                Ok(Gate::Regex {
                    regex,
                    confidence_field: confidence_field.clone(),
                    rationale_field: rationale_field.clone(),
                    needs_confidence,
                })
            }
        }
    }

    /// A JSON-schema gate from a schema already read (Err: why the schema
    /// is not one).
    pub fn json_schema(
        schema: Value,
        confidence_field: &str,
        rationale_field: &str,
        needs_confidence: bool,
    ) -> Result<Self, SchemaError> {
        let validator = jsonschema::validator_for(&schema)
            .map_err(|e| SchemaError::NotASchema(e.to_string()))?;
        Ok(Gate::JsonSchema {
            schema,
            validator: Box::new(validator),
            confidence_field: confidence_field.to_string(),
            rationale_field: rationale_field.to_string(),
            needs_confidence,
        })
    }

    /// The names of the confidence and rationale fields in a parsed answer.
    pub fn fields(&self) -> (&str, &str) {
        match self {
            Gate::JsonSchema {
                confidence_field,
                rationale_field,
                ..
            }
            | Gate::Regex {
                confidence_field,
                rationale_field,
                ..
            } => (confidence_field, rationale_field),
        }
    }

    /// The JSON schema to request as the provider's structured output, if any.
    /// A regex gate's named captures (the fields of its answers).
    pub fn capture_names(&self) -> Vec<String> {
        match self {
            Gate::Regex { regex, .. } => regex
                .capture_names()
                .flatten()
                .map(str::to_string)
                .collect(),
            Gate::JsonSchema { .. } => Vec::new(),
        }
    }

    pub fn response_schema(&self) -> Option<&Value> {
        match self {
            Gate::JsonSchema { schema, .. } => Some(schema),
            Gate::Regex { .. } => None,
        }
    }

    pub fn check(&self, output: &str) -> Result<GateOutput, GateFailure> {
        let text = output.trim();
        if text.is_empty() {
            return Err(GateFailure::Empty);
        }
        match self {
            Gate::JsonSchema {
                validator,
                confidence_field,
                rationale_field,
                needs_confidence,
                ..
            } => Self::check_json(
                text,
                validator,
                confidence_field,
                rationale_field,
                *needs_confidence,
            ),
            Gate::Regex {
                regex,
                confidence_field,
                rationale_field,
                needs_confidence,
            } => Self::check_regex(
                text,
                regex,
                confidence_field,
                rationale_field,
                *needs_confidence,
            ),
        }
    }

    /// A JSON-schema gate: the text is a JSON object the schema accepts.
    fn check_json(
        text: &str,
        validator: &jsonschema::Validator,
        confidence_field: &str,
        rationale_field: &str,
        needs_confidence: bool,
    ) -> Result<GateOutput, GateFailure> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| GateFailure::NotJson(e.to_string()))?;
        if !value.is_object() {
            return Err(GateFailure::NotObject);
        }
        if let Some(err) = validator.iter_errors(&value).next() {
            let path = err.instance_path().as_str().to_string();
            return Err(GateFailure::Schema {
                path: if path.is_empty() { "/".into() } else { path },
                message: err.to_string(),
            });
        }
        let confidence = match value.get(confidence_field) {
            None | Some(Value::Null) if needs_confidence => {
                return Err(GateFailure::MissingConfidence(confidence_field.to_string()));
            }
            None | Some(Value::Null) => None,
            Some(v) => Some(
                v.as_f64()
                    .ok_or_else(|| GateFailure::BadConfidence(v.to_string()))?,
            ),
        };
        if let Some(c) = confidence {
            check_confidence(c)?;
        }
        let rationale = value
            .get(rationale_field)
            .and_then(Value::as_str)
            .map(str::to_string);
        Ok(GateOutput {
            answer: value,
            confidence,
            rationale,
        })
    }

    /// A regex gate: the text matches, and its named groups are the answer.
    fn check_regex(
        text: &str,
        regex: &Regex,
        confidence_field: &str,
        rationale_field: &str,
        needs_confidence: bool,
    ) -> Result<GateOutput, GateFailure> {
        let caps = regex.captures(text).ok_or(GateFailure::NoMatch)?;
        let mut answer = Map::new();
        for name in regex.capture_names().flatten() {
            if let Some(m) = caps.name(name) {
                answer.insert(
                    name.to_string(),
                    Value::String(m.as_str().trim().to_string()),
                );
            }
        }
        let confidence = match caps.name(confidence_field).map(|m| m.as_str().trim()) {
            Some(raw) => {
                let c: f64 = raw
                    .parse()
                    .map_err(|_| GateFailure::BadConfidence(raw.to_string()))?;
                check_confidence(c)?;
                answer.insert(confidence_field.to_string(), serde_json::json!(c));
                Some(c)
            }
            None if needs_confidence => {
                return Err(GateFailure::MissingConfidence(confidence_field.to_string()));
            }
            None => None,
        };
        let rationale = caps
            .name(rationale_field)
            .map(|m| m.as_str().trim().to_string());
        Ok(GateOutput {
            answer: Value::Object(answer),
            confidence,
            rationale,
        })
    }
}

fn check_confidence(c: f64) -> Result<(), GateFailure> {
    if c.is_finite() && (0.0..=1.0).contains(&c) {
        Ok(())
    } else {
        Err(GateFailure::BadConfidence(c.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema_gate() -> Gate {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("s.json");
        std::fs::write(
            &p,
            json!({"type":"object","required":["label","confidence","rationale"],
                   "properties":{"label":{"type":"string","enum":["match","no_match"]},
                                 "confidence":{"type":"number","minimum":0,"maximum":1},
                                 "rationale":{"type":"string"}},
                   "additionalProperties":false})
            .to_string(),
        )
        .unwrap();
        let cfg = GateConfig::JsonSchema {
            schema: p,
            confidence_field: "confidence".into(),
            rationale_field: "rationale".into(),
        };
        Gate::build(&cfg, d.path(), Path::new("docket.toml")).unwrap()
    }

    #[test]
    fn json_gate_passes_a_valid_answer() {
        let g = schema_gate();
        let out = g
            .check(r#" {"label":"match","confidence":0.9,"rationale":"same title"} "#)
            .unwrap();
        assert_eq!(out.confidence, Some(0.9));
        assert_eq!(out.rationale.as_deref(), Some("same title"));
        assert_eq!(out.answer["label"], "match");
    }

    #[test]
    fn json_gate_failures_are_specific() {
        let g = schema_gate();
        assert_eq!(g.check("  "), Err(GateFailure::Empty));
        assert!(matches!(
            g.check("{\"label\":"),
            Err(GateFailure::NotJson(_))
        ));
        assert_eq!(g.check("[1]"), Err(GateFailure::NotObject));
        match g.check(r#"{"label":"maybe","confidence":0.5,"rationale":"x"}"#) {
            Err(GateFailure::Schema { path, .. }) => assert_eq!(path, "/label"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            g.check(r#"{"label":"match","rationale":"x"}"#),
            Err(GateFailure::Schema { .. })
        ));
    }

    #[test]
    fn regex_gate_reads_named_captures() {
        let cfg = GateConfig::Regex {
            pattern: r"(?s)(?P<rationale>.*)VERDICT:\s*(?P<verdict>\w+)\s+CONFIDENCE:\s*(?P<confidence>[0-9.]+)".into(),
            confidence_field: "confidence".into(),
            rationale_field: "rationale".into(),
        };
        let g = Gate::build(&cfg, Path::new("."), Path::new("docket.toml")).unwrap();
        let out = g
            .check("Both list the same ISRC.\nVERDICT: match\nCONFIDENCE: 0.72")
            .unwrap();
        assert_eq!(out.answer["verdict"], "match");
        assert_eq!(out.confidence, Some(0.72));
        assert_eq!(out.rationale.as_deref(), Some("Both list the same ISRC."));
        assert_eq!(g.check("no verdict here"), Err(GateFailure::NoMatch));
        assert!(matches!(
            g.check("x VERDICT: a CONFIDENCE: 1.7"),
            Err(GateFailure::BadConfidence(_))
        ));
    }

    #[test]
    fn regex_gate_requires_a_confidence_capture() {
        let cfg = GateConfig::Regex {
            pattern: "VERDICT: (?P<v>\\w+)".into(),
            confidence_field: "confidence".into(),
            rationale_field: "rationale".into(),
        };
        let err = Gate::build(&cfg, Path::new("."), Path::new("docket.toml"))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("confidence"), "{err}");
    }
}
