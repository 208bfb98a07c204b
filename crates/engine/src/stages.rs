//! A job's stages, loaded and checked: each with its provider, template
//! (and repair prompt), gate, parameters and batching; which stage's answer
//! is routed, and the critic rule that bears on it.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};

use super::{EngineError, RunOptions};
use crate::cost::{Price, TokenCounter, price_of};
use crate::gate::{Gate, GateOutput};
use crate::template::PromptTemplate;
use docket_model::config::{
    BatchConfig, BatchMode, CriticConfidence, CriticRule, LoadedConfig, OnDisagree, ProviderKind,
    StageConfig, StructuredOutput,
};
use docket_model::routing::{Outcome, Thresholds};

/// One stage, ready to run.
pub struct Stage {
    pub index: usize,
    pub name: String,
    pub provider_name: String,
    pub provider_kind: ProviderKind,
    pub model: String,
    pub template: PromptTemplate,
    pub repair: Option<Repair>,
    pub gate: Gate,
    pub max_tokens: u64,
    pub expected_output_tokens: u64,
    pub temperature: Option<f64>,
    /// Gemini's thinking budget (None: the adapter's default).
    pub thinking_budget: Option<i64>,
    /// The output tokens a send may be billed beyond max_tokens (Gemini's
    /// thinking budget, added to its output limit): part of the worst cost.
    pub thinking_allowance: u64,
    /// How Anthropic is given the schema.
    pub structured_output: StructuredOutput,
    pub max_attempts: u32,
    pub max_transport_attempts: u32,
    /// Rate-limit refusals in a row before the request waits `retry_wait`.
    pub max_rate_limit_retries: u32,
    pub retry_wait: Duration,
    pub request_timeout: Duration,
    pub rpm: u64,
    pub tpm: u64,
    pub max_concurrency: usize,
    pub price: Price,
    pub price_known: bool,
    pub params_hash: String,
    /// The gate's schema, sent as the provider's structured output: built
    /// once and shared by every request.
    pub response_schema: Option<Arc<(String, Value)>>,
    /// The model's tokenizer, loaded only when a budget needs exact counts.
    pub budget_counter: Option<TokenCounter>,
    pub batch: BatchConfig,
    /// The batch price against the synchronous one when this stage's
    /// requests go to a Batch API (None: they go synchronously).
    pub batch_price_factor: Option<f64>,
    /// The stage this one judges (a critic).
    pub critic_of: Option<usize>,
    pub wait_for_previous: bool,
    /// Structured batching: the criteria judged in one request.
    pub criteria: Vec<String>,
    /// The rendered template is the request's whole body, sent as written
    /// (`docket run --requests`).
    pub send_body: bool,
    /// With `send_body`: the stage's model replaces the body's.
    pub override_model: bool,
}

/// The prompt sent after `after` answers failed the gate.
pub struct Repair {
    pub after: u32,
    pub template: PromptTemplate,
}

impl Stage {
    pub fn is_critic(&self) -> bool {
        self.critic_of.is_some()
    }

    /// The template for the next attempt, `gate_failures` answers in.
    pub fn template_for(&self, gate_failures: u32) -> (&PromptTemplate, bool) {
        match &self.repair {
            Some(r) if gate_failures >= r.after => (&r.template, true),
            _ => (&self.template, false),
        }
    }

    /// A stand-in for this stage's output, shaped by its gate: what a later
    /// stage's template sees while planning checks it renders.
    pub fn placeholder_output(&self) -> Value {
        placeholder_output_of(&self.gate, &self.criteria)
    }
}

/// A stand-in for the output of a stage with this gate and these criteria
/// (see [`Stage::placeholder_output`]).
pub fn placeholder_output_of(gate: &Gate, criteria: &[String]) -> Value {
    let mut m = Map::new();
    match gate.response_schema() {
        Some(schema) => {
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (k, v) in props {
                    m.insert(k.clone(), placeholder(v, schema, 0));
                }
            }
        }
        None => {
            for name in gate.capture_names() {
                m.insert(name, Value::String("…".into()));
            }
        }
    }
    let (c, r) = gate.fields();
    m.entry(c.to_string()).or_insert(Value::from(0.5));
    m.entry(r.to_string()).or_insert(Value::String("…".into()));
    for c in criteria {
        m.entry(c.clone()).or_insert(Value::Object(Map::new()));
    }
    Value::Object(m)
}

/// A stand-in value for `schema` (local `$ref`s resolved against `root`).
fn placeholder(schema: &Value, root: &Value, depth: usize) -> Value {
    if depth > 16 {
        return Value::Null;
    }
    if let Some(target) = schema
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix('#'))
        .and_then(|ptr| root.pointer(ptr))
    {
        return placeholder(target, root, depth + 1);
    }
    if let Some(first) = ["anyOf", "oneOf", "allOf"]
        .iter()
        .find_map(|k| schema.get(*k).and_then(Value::as_array))
        .and_then(|a| {
            a.iter()
                .find(|s| s.get("type").and_then(Value::as_str) != Some("null"))
        })
    {
        return placeholder(first, root, depth + 1);
    }
    if let Some(e) = schema
        .get("enum")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
    {
        return e.clone();
    }
    let ty = schema
        .get("type")
        .map(|t| match t {
            Value::Array(a) => a
                .iter()
                .filter_map(Value::as_str)
                .find(|s| *s != "null")
                .unwrap_or("string")
                .to_string(),
            other => other.as_str().unwrap_or("string").to_string(),
        })
        .unwrap_or_else(|| {
            if schema.get("properties").is_some() {
                "object".into()
            } else {
                "string".into()
            }
        });
    match ty.as_str() {
        "number" => Value::from(0.5),
        "integer" => Value::from(1),
        "boolean" => Value::Bool(true),
        "array" => Value::Array(Vec::new()),
        "object" => {
            let mut m = Map::new();
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (k, v) in props {
                    m.insert(k.clone(), placeholder(v, root, depth + 1));
                }
            }
            Value::Object(m)
        }
        _ => Value::String("…".into()),
    }
}

/// How a critic's verdict bears on the routing.
pub struct CriticRouting {
    pub stage: usize,
    pub rule: CriticRule,
}

/// Load and check every stage of the job.
pub fn load_stages(
    config: &LoadedConfig,
    cfg_path: &Path,
    opts: &RunOptions,
) -> Result<Vec<Stage>, EngineError> {
    let stages = &config.config.stages;
    let mut out = Vec::with_capacity(stages.len());
    for (index, sc) in stages.iter().enumerate() {
        out.push(load_stage(config, cfg_path, opts, index, sc)?);
    }
    Ok(out)
}

fn load_stage(
    config: &LoadedConfig,
    cfg_path: &Path,
    opts: &RunOptions,
    index: usize,
    stage: &StageConfig,
) -> Result<Stage, EngineError> {
    let provider = config.provider_for(stage).clone();
    let system = stage.system_prompt.as_ref().map(|p| config.resolve(p));
    let template = PromptTemplate::load(&config.resolve(&stage.template), system.as_deref())?;
    let repair = match (&stage.repair_after, &stage.repair_template) {
        (Some(after), Some(path)) => Some(Repair {
            after: (*after.get_ref()).min(u64::from(u32::MAX)) as u32,
            template: PromptTemplate::load(&config.resolve(path), system.as_deref())?,
        }),
        _ => None,
    };
    // A body sent as written needs no confidence, and gets no schema added.
    let needs_confidence = !stage.is_critic() && !stage.send_body;
    let gate = Gate::build_for(&stage.gate, &config.root, cfg_path, needs_confidence)?;
    let response_schema = response_schema(stage, &gate);
    // A missing key stops the run here, before planning creates anything;
    // a dry run sends nothing, so it goes on and names the key instead.
    if !opts.dry_run {
        docket_providers::check_key(&stage.provider, &provider)?;
    }
    let (price, price_known) = price_of(&provider.model);
    let params = stage_params(stage, repair.as_ref());
    let thinking_budget = stage.thinking_budget.as_ref().map(|b| *b.get_ref());
    let critic_of = stage
        .critic_of
        .as_ref()
        .and_then(|of| config.config.stages.iter().position(|s| &s.name == of));
    Ok(Stage {
        index,
        name: stage.name.clone(),
        provider_name: stage.provider.clone(),
        provider_kind: provider.kind,
        model: provider.model.clone(),
        template,
        repair,
        gate,
        max_tokens: *stage.max_tokens.get_ref(),
        expected_output_tokens: *stage.expected_output_tokens.get_ref(),
        temperature: stage.temperature.as_ref().map(|t| *t.get_ref()),
        thinking_budget,
        thinking_allowance: thinking_allowance(provider.kind, &provider.model, thinking_budget),
        structured_output: stage.structured_output,
        max_attempts: (*stage.max_attempts.get_ref()).min(u64::from(u32::MAX)) as u32,
        max_transport_attempts: (*provider.max_transport_attempts.get_ref())
            .min(u64::from(u32::MAX)) as u32,
        max_rate_limit_retries: (*provider.max_rate_limit_retries.get_ref())
            .min(u64::from(u32::MAX)) as u32,
        retry_wait: Duration::from_secs_f64(*provider.retry_wait_secs.get_ref()),
        request_timeout: Duration::from_secs_f64(*provider.request_timeout_secs.get_ref()),
        rpm: opts
            .rate_limit
            .unwrap_or(*provider.requests_per_minute.get_ref()),
        tpm: *provider.tokens_per_minute.get_ref(),
        max_concurrency: (*provider.max_concurrency.get_ref()).min(10_000) as usize,
        price,
        price_known,
        params_hash: crate::cost::sha256_hex(params.to_string().as_bytes()),
        response_schema,
        budget_counter: opts
            .max_cost
            .map(|_| TokenCounter::for_model(&provider.model)),
        batch_price_factor: (stage.batch.mode != BatchMode::Sync
            && docket_providers::batch::has_batch_api(provider.kind))
        .then_some(docket_providers::batch::BATCH_PRICE_FACTOR),
        batch: stage.batch.clone(),
        critic_of,
        wait_for_previous: stage.wait_for_previous,
        criteria: stage.criteria.clone(),
        send_body: stage.send_body,
        override_model: stage.override_model,
    })
}

/// The critic rule in force, if the answer stage has a critic.
pub fn critic_routing(config: &LoadedConfig) -> Option<CriticRouting> {
    let critic = config.critic_stage()?;
    let stage = config
        .config
        .stages
        .iter()
        .position(|s| s.name == critic.name)?;
    Some(CriticRouting {
        stage,
        rule: config.config.routing.critic.clone().unwrap_or_default(),
    })
}

/// An item's routing, from the answer stage's output and the critic's.
#[derive(Debug, Clone, PartialEq)]
pub struct Routed {
    pub outcome: Outcome,
    pub confidence: Option<f64>,
    pub verdict: Option<String>,
    pub note: Option<String>,
}

/// The documented rule: route on the answer's confidence (or, with
/// `confidence = "min"`, on the lower of it and the critic's); a critic that
/// does not agree turns an auto-accept into `on_disagree` (review, by
/// default), and with `on_disagree = "reject"` any outcome into a reject.
pub fn route(
    thresholds: &Thresholds,
    answer: &GateOutput,
    critic: Option<(&CriticRule, &Value)>,
) -> Routed {
    let Some(gen_conf) = answer.confidence else {
        return Routed {
            outcome: Outcome::Error,
            confidence: None,
            verdict: None,
            note: Some("the answer stage gave no confidence".into()),
        };
    };
    let Some((rule, out)) = critic else {
        return Routed {
            outcome: thresholds.route(gen_conf),
            confidence: Some(gen_conf),
            verdict: None,
            note: None,
        };
    };
    let verdict = out.get(&rule.verdict_field).map(|v| match v {
        Value::String(s) => s.trim().to_string(),
        other => other.to_string(),
    });
    let agrees = verdict
        .as_deref()
        .is_some_and(|v| rule.agree.iter().any(|a| a.trim().eq_ignore_ascii_case(v)));
    let critic_conf = out.get(&rule.confidence_field).and_then(Value::as_f64);
    let confidence = match (rule.confidence, critic_conf) {
        (CriticConfidence::Min, Some(c)) if c.is_finite() => gen_conf.min(c.clamp(0.0, 1.0)),
        _ => gen_conf,
    };
    let base = thresholds.route(confidence);
    let mut note = (confidence < gen_conf).then(|| {
        format!(
            "routed on the critic's confidence {confidence:.2} (the generator said {gen_conf:.2})"
        )
    });
    let outcome = if agrees {
        base
    } else {
        let shown = verdict.as_deref().unwrap_or("(none)");
        let to = match (rule.on_disagree, base) {
            (OnDisagree::Review, Outcome::Accepted) => Outcome::Review,
            (OnDisagree::Reject, Outcome::Accepted | Outcome::Review) => Outcome::Rejected,
            (_, other) => other,
        };
        if to != base {
            note = Some(format!(
                "critic verdict \"{}\" does not agree: {} -> {}",
                docket_model::sanitize::truncate(shown, 60),
                base.as_str(),
                to.as_str()
            ));
        }
        to
    };
    Routed {
        outcome,
        confidence: Some(confidence),
        verdict,
        note,
    }
}

mod params;
use params::{response_schema, stage_params, thinking_allowance};

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn out(conf: f64) -> GateOutput {
        GateOutput {
            answer: json!({"confidence": conf}),
            confidence: Some(conf),
            rationale: None,
        }
    }

    fn th() -> Thresholds {
        Thresholds::new(0.85, 0.6, None).unwrap()
    }

    #[test]
    fn without_a_critic_the_confidence_routes() {
        assert_eq!(route(&th(), &out(0.9), None).outcome, Outcome::Accepted);
        assert_eq!(route(&th(), &out(0.7), None).outcome, Outcome::Review);
        assert_eq!(route(&th(), &out(0.1), None).outcome, Outcome::Rejected);
    }

    #[test]
    fn a_disagreeing_critic_sends_an_accept_to_review() {
        let rule = CriticRule::default();
        let r = route(
            &th(),
            &out(0.95),
            Some((&rule, &json!({"verdict": "disagree"}))),
        );
        assert_eq!(r.outcome, Outcome::Review);
        assert_eq!(r.verdict.as_deref(), Some("disagree"));
        assert!(r.note.unwrap().contains("accepted -> review"));
        let r = route(
            &th(),
            &out(0.95),
            Some((&rule, &json!({"verdict": "Agree"}))),
        );
        assert_eq!(r.outcome, Outcome::Accepted);
        assert_eq!(r.note, None);
        // Review and reject stay as they are.
        let r = route(&th(), &out(0.7), Some((&rule, &json!({"verdict": "no"}))));
        assert_eq!(r.outcome, Outcome::Review);
        assert_eq!(r.note, None);
        // No verdict at all is not agreement.
        let r = route(&th(), &out(0.95), Some((&rule, &json!({}))));
        assert_eq!(r.outcome, Outcome::Review);
    }

    #[test]
    fn reject_on_disagree_and_min_confidence() {
        let rule = CriticRule {
            on_disagree: OnDisagree::Reject,
            ..CriticRule::default()
        };
        let r = route(
            &th(),
            &out(0.7),
            Some((&rule, &json!({"verdict": "disagree"}))),
        );
        assert_eq!(r.outcome, Outcome::Rejected);
        let rule = CriticRule {
            confidence: CriticConfidence::Min,
            ..CriticRule::default()
        };
        let r = route(
            &th(),
            &out(0.95),
            Some((&rule, &json!({"verdict": "agree", "confidence": 0.7}))),
        );
        assert_eq!(r.outcome, Outcome::Review);
        assert_eq!(r.confidence, Some(0.7));
        assert!(r.note.unwrap().contains("critic's confidence"));
    }
}
