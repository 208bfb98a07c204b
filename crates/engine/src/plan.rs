//! Planning a session: choose the items, render every prompt once, and
//! estimate tokens and cost. An item whose prompt cannot be rendered (a
//! field it lacks) is named and counted: it ends in `error` without a
//! request while the others run. A template that renders for no item at
//! all (a typo, a variable no item has) stops the run before anything is
//! sent, naming its file and line.

use std::ops::ControlFlow;

use serde_json::Value;

use super::{EngineError, Prepared};
use crate::cost::TokenCounter;
use crate::renders::Unrenderable;
use crate::template::Prompt;
use docket_ledger::Ledger;
use docket_ledger::store::{Candidate, CandidateError, CandidateFilter};
use docket_ledger::work::RunSessions;

mod duration;
pub use duration::RunDuration;

/// Above this many items the estimate tokenizes a uniform sample (every
/// k-th prompt, at least this many) and scales it, and says so; below it
/// every prompt is counted. Tokenizing is most of planning's time (about
/// 0.04 ms a prompt) and a sample this size is within a fraction of a
/// percent on prompts from one template. Every prompt is still rendered.
pub const EXACT_COUNT_MAX: u64 = 5_000;

#[derive(Debug, Clone)]
pub struct Estimate {
    pub items: u64,
    pub prompt_tokens: u64,
    pub expected_output_tokens: u64,
    pub max_output_tokens: u64,
    pub cost_usd: f64,
    /// If every answer used all of max_tokens.
    pub worst_cost_usd: f64,
    pub model: String,
    pub price_input: f64,
    pub price_output: f64,
    pub price_known: bool,
    /// Counted with the model's own tokenizer (else characters/4).
    pub exact_tokenizer: bool,
    /// Prompts actually tokenized (all, or a sample for large sessions).
    pub counted_prompts: u64,
    /// The batch price against the synchronous one when the requests go to
    /// a Batch API (the costs above include it); None: synchronous.
    pub batch_price_factor: Option<f64>,
    /// `auto` with fewer items than `min_batch_size`: synchronous.
    pub batch_mode: Option<docket_model::config::BatchMode>,
    /// Per stage, for a job of several (empty for one).
    pub stages: Vec<StageEstimate>,
    /// Items whose first request needs more tokens than the provider's
    /// tokens/min allows: they can never be sent and end in error at once
    /// (the first few, with why), and how many there are.
    pub unsendable: Vec<(String, String)>,
    pub unsendable_count: u64,
    /// Items whose prompt cannot be rendered (a field they lack): they end
    /// in error without a request. The first few (id, why), and how many.
    pub unrenderable: Vec<(String, String)>,
    pub unrenderable_count: u64,
    pub first_prompt: Option<Prompt>,
    /// The item `first_prompt` is for (the first one that renders).
    pub first_item: Option<String>,
    /// How long the run takes at least, under the providers' limits.
    pub duration: RunDuration,
}

/// One stage's share of the estimate. A later stage's prompts depend on
/// earlier answers: its size is measured on the first item's prompt with
/// stand-ins for them.
#[derive(Debug, Clone)]
pub struct StageEstimate {
    pub name: String,
    pub model: String,
    pub critic: bool,
    pub prompt_tokens: u64,
    pub expected_output_tokens: u64,
    pub cost_usd: f64,
    pub batch_price_factor: Option<f64>,
}

/// How many unsendable (or unrenderable) items the estimate names.
const UNSENDABLE_SHOWN: usize = 5;

pub struct Plan {
    /// Every item of the session, those that cannot be rendered included
    /// (they end in error, with why, once the session runs).
    pub item_ids: Vec<String>,
    pub estimate: Estimate,
}

/// Pick and render the candidates. Rendering errors name the template file,
/// line and item.
pub fn plan(p: &Prepared, limit: Option<u64>, rereview_pending: bool) -> Result<Plan, EngineError> {
    let ledger = super::open_ledger(&p.ledger)?;
    let first = p.first();
    let counter = TokenCounter::for_model(&first.model);
    let filter = CandidateFilter {
        limit,
        rereview_pending,
    };
    let mut scan = Scan::candidates(p, &ledger, filter, &counter)?;
    scan.some_render()?;
    let items = scan.renderable;
    let prompt_tokens = if scan.counted == 0 {
        0
    } else {
        (scan.counted_tokens as f64 * items as f64 / scan.counted as f64).round() as u64
    };
    let first_item = scan.first_renderable.take();
    let mut stages = Vec::with_capacity(p.stages.len());
    for k in 0..p.stages.len() {
        let per_item = if k == 0 {
            None
        } else {
            Some(later_prompt_tokens(p, k, &ledger, first_item.as_deref())?)
        };
        let prompt = match per_item {
            None => prompt_tokens,
            Some(t) => t * items,
        };
        stages.push(stage_estimate(p, k, items, prompt));
    }
    let sum = |f: &dyn Fn(&(StageEstimate, f64, u64)) -> f64| stages.iter().map(f).sum::<f64>();
    let cost_usd = sum(&|s| s.0.cost_usd);
    let worst_cost_usd = sum(&|s| s.1);
    let all_prompt: u64 = stages.iter().map(|s| s.0.prompt_tokens).sum();
    let expected_output_tokens: u64 = stages.iter().map(|s| s.0.expected_output_tokens).sum();
    let max_output_tokens: u64 = stages.iter().map(|s| s.2).sum();
    let factor = stages[0].0.batch_price_factor;
    let several = stages.len() > 1;
    let duration = duration::run_duration(p, stages.iter().map(|s| &s.0), items);
    Ok(Plan {
        item_ids: scan.all_ids,
        estimate: Estimate {
            items,
            prompt_tokens: all_prompt,
            expected_output_tokens,
            max_output_tokens,
            cost_usd,
            worst_cost_usd,
            model: first.model.clone(),
            price_input: first.price.input,
            price_output: first.price.output,
            price_known: p.stages.iter().all(|s| s.price_known),
            exact_tokenizer: counter.is_exact(),
            counted_prompts: scan.counted,
            batch_price_factor: factor,
            batch_mode: (first.batch.mode != docket_model::config::BatchMode::Sync)
                .then_some(first.batch.mode),
            stages: if several {
                stages.into_iter().map(|s| s.0).collect()
            } else {
                Vec::new()
            },
            unsendable: scan.unsendable,
            unsendable_count: scan.unsendable_count,
            unrenderable: scan.unrenderable,
            unrenderable_count: scan.unrenderable_count,
            first_prompt: scan.first_prompt,
            first_item,
            duration,
        },
    })
}

/// What a pass over the candidates found: their ids, the first stage's
/// prompt tokens of a sample, and the prompts that cannot be sent or
/// rendered.
#[derive(Default)]
struct Scan {
    /// Every candidate, in order: the session's items.
    all_ids: Vec<String>,
    /// The candidates whose prompts render at every stage: how many, and
    /// the first. Not their ids: a second list of a million ids was 40 MB
    /// of a run's peak memory.
    renderable: u64,
    first_renderable: Option<String>,
    counted_tokens: u64,
    counted: u64,
    first_prompt: Option<Prompt>,
    unsendable: Vec<(String, String)>,
    unsendable_count: u64,
    unrenderable: Vec<(String, String)>,
    unrenderable_count: u64,
    /// The first item whose prompt cannot be rendered, and why.
    first_unrenderable: Option<(String, Unrenderable)>,
}

impl Scan {
    /// Render every candidate's prompts (the later stages' with stand-ins).
    fn candidates(
        p: &Prepared,
        ledger: &Ledger,
        filter: CandidateFilter,
        counter: &TokenCounter,
    ) -> Result<Scan, EngineError> {
        let first = p.first();
        let total: u64 = ledger.count_candidates(filter)?;
        // Sample every `stride`-th prompt for the token count when large.
        let stride = (total / EXACT_COUNT_MAX).max(1);
        let mut scan = Scan {
            all_ids: Vec::with_capacity(total as usize),
            ..Scan::default()
        };
        // Why the visit stopped, when this visitor stopped it.
        let mut stopped: Option<EngineError> = None;
        let mut each = |c: Candidate| {
            let evidence: Value = match serde_json::from_str(&c.evidence_json) {
                Ok(v) => v,
                Err(e) => {
                    let why = format!("item \"{}\": stored evidence is not JSON: {e}", c.item_id);
                    stopped = Some(EngineError::Ledger(why));
                    return ControlFlow::Break(());
                }
            };
            match crate::renders::render_job(p, &c.item_id, &evidence) {
                Ok(prompt) => {
                    if let Some(prompt) = prompt {
                        scan.take(first, &c.item_id, prompt, stride, counter);
                    }
                    if scan.first_renderable.is_none() {
                        scan.first_renderable = Some(c.item_id.clone());
                    }
                    scan.renderable += 1;
                }
                Err(why) => scan.unrenderable(&c.item_id, why),
            }
            scan.all_ids.push(c.item_id);
            ControlFlow::Continue(())
        };
        ledger
            .for_each_candidate(filter, &mut each)
            .map_err(|e| match (stopped.take(), e) {
                (Some(why), _) => why,
                (None, e @ CandidateError::Stopped) => EngineError::Ledger(e.to_string()),
                (None, CandidateError::Ledger(e)) => EngineError::Ledger(e.to_string()),
            })?;
        Ok(scan)
    }

    /// Not one candidate renders: the template is wrong, not the items,
    /// and the run stops before anything is sent.
    fn some_render(&mut self) -> Result<(), EngineError> {
        let Some((item, why)) = self
            .first_unrenderable
            .take()
            .filter(|_| self.renderable == 0)
        else {
            return Ok(());
        };
        let n = self.unrenderable_count;
        Err(EngineError::Usage(format!(
            "{}: not one of the {n} item{} to run renders (the first: item \"{}\"), so nothing was sent; fix the template (or the items)",
            why.reason(),
            if n == 1 { "" } else { "s" },
            docket_model::sanitize::for_terminal(&item)
        )))
    }

    /// A candidate whose prompt cannot be rendered: named (the first few)
    /// and counted.
    fn unrenderable(&mut self, item_id: &str, why: Unrenderable) {
        self.unrenderable_count += 1;
        if self.unrenderable.len() < UNSENDABLE_SHOWN {
            self.unrenderable.push((item_id.to_string(), why.reason()));
        }
        if self.first_unrenderable.is_none() {
            self.first_unrenderable = Some((item_id.to_string(), why));
        }
    }

    /// One candidate's rendered prompt: checked against the token limit,
    /// counted when sampled, kept when it is the first.
    fn take(
        &mut self,
        first: &crate::stages::Stage,
        item_id: &str,
        prompt: Prompt,
        stride: u64,
        counter: &TokenCounter,
    ) {
        // Tokens never outnumber bytes: only a prompt whose bytes
        // pass the limit is counted to see whether it can be sent.
        let bytes = (prompt.user.len() + prompt.system.as_deref().map_or(0, str::len)) as u64;
        if first.tpm > 0
            && bytes + 12 + first.max_tokens > first.tpm
            && let Some(why) = super::attempt::over_token_limit(
                first,
                super::attempt::prompt_tokens(first, &prompt),
            )
        {
            self.unsendable_count += 1;
            if self.unsendable.len() < UNSENDABLE_SHOWN {
                self.unsendable.push((item_id.to_string(), why));
            }
        }
        if self.renderable.is_multiple_of(stride) {
            self.counted_tokens += counter.count_prompt(&prompt);
            self.counted += 1;
        }
        if self.first_prompt.is_none() {
            self.first_prompt = Some(prompt);
        }
    }
}

/// Stage `k`'s estimate for `items` items and `prompt` prompt tokens in
/// all; with its worst cost and its most output tokens.
fn stage_estimate(p: &Prepared, k: usize, items: u64, prompt: u64) -> (StageEstimate, f64, u64) {
    let st = &p.stages[k];
    let expected = st.expected_output_tokens.min(st.max_tokens) * items;
    // `auto` batches only when enough requests are pending.
    let factor = st.batch_price_factor.filter(|_| {
        st.batch.mode != docket_model::config::BatchMode::Auto
            || items >= *st.batch.min_batch_size.get_ref()
    });
    let f = factor.unwrap_or(1.0);
    (
        StageEstimate {
            name: st.name.clone(),
            model: st.model.clone(),
            critic: st.is_critic(),
            prompt_tokens: prompt,
            expected_output_tokens: expected,
            cost_usd: st.price.cost(prompt, 0, expected) * f,
            batch_price_factor: factor,
        },
        st.price
            .cost(prompt, 0, (st.max_tokens + st.thinking_allowance) * items)
            * f,
        (st.max_tokens + st.thinking_allowance) * items,
    )
}

/// Stage `k`'s prompt for the first item, with stand-ins for the earlier
/// stages' answers: planning checks that it renders (a typo in
/// `stages.NAME.FIELD` is caught before anything is sent) and measures it.
fn later_prompt_tokens(
    p: &Prepared,
    k: usize,
    ledger: &Ledger,
    item: Option<&str>,
) -> Result<u64, EngineError> {
    let Some(item) = item else { return Ok(0) };
    let evidence: Value = ledger
        .evidence_of(item)
        .ok()
        .flatten()
        .and_then(|e| serde_json::from_str(&e).ok())
        .unwrap_or(Value::Null);
    let st = &p.stages[k];
    let extra = p.stand_ins[k].clone();
    let prompt = st.template.render_with(item, &evidence, extra.clone())?;
    if let Some(r) = &st.repair {
        let mut extra = extra;
        extra.insert("failed_output".into(), Value::String("…".into()));
        extra.insert("gate_error".into(), Value::String("…".into()));
        r.template.render_with(item, &evidence, extra)?;
    }
    Ok(TokenCounter::for_model(&st.model).count_prompt(&prompt))
}

impl Estimate {
    /// The seed's estimate lines.
    pub fn describe(&self) -> Vec<String> {
        let avg = self.prompt_tokens.checked_div(self.items).unwrap_or(0);
        let mut lines = vec![format!(
            "Estimating cost: ~${:.4} ({} items × ~{} prompt tokens × ${}/1M in, ~{} output tokens × ${}/1M out; model {})",
            self.cost_usd,
            self.items,
            avg,
            self.price_input,
            self.expected_output_tokens / self.items.max(1),
            self.price_output,
            self.model
        )];
        lines.push(format!(
            "  tokens: ~{} in, ~{} out expected (at most {} out: worst case ${:.4})",
            self.prompt_tokens,
            self.expected_output_tokens,
            self.max_output_tokens,
            self.worst_cost_usd
        ));
        lines.extend(self.duration.describe());
        match (self.batch_price_factor, self.batch_mode) {
            (Some(f), _) => lines.push(format!(
                "  batch: requests go to the provider's Batch API at {:.0}% of the synchronous price (included above); results come when the provider finishes (up to 24 h)",
                f * 100.0
            )),
            (None, Some(mode)) => lines.push(format!(
                "  batch: mode = \"{}\" but these requests go synchronously at the full price (no Batch API for this provider, or fewer than min_batch_size)",
                mode.as_str()
            )),
            (None, None) => {}
        }
        for st in &self.stages {
            lines.push(format!(
                "  stage {}{} ({}): ~{} prompt + ~{} output tokens, ~${:.4}{}",
                st.name,
                if st.critic { " (critic)" } else { "" },
                st.model,
                st.prompt_tokens,
                st.expected_output_tokens,
                st.cost_usd,
                if st.batch_price_factor.is_some() {
                    " at the batch price"
                } else {
                    ""
                }
            ));
        }
        self.describe_unrenderable(&mut lines);
        if self.unsendable_count > 0 {
            lines.push(format!(
                "  warning: {} item(s) can never be sent under tokens_per_minute; they will end in error without a request:",
                self.unsendable_count
            ));
            for (item, why) in &self.unsendable {
                lines.push(format!(
                    "    item {}: {why}",
                    docket_model::sanitize::for_terminal(item)
                ));
            }
        }
        let notes = self.notes();
        if !notes.is_empty() {
            lines.push(format!("  note: {}", notes.join("; ")));
        }
        lines
    }

    /// The items whose prompt cannot be rendered: how many, the first few
    /// with why, and how to deal with them.
    fn describe_unrenderable(&self, lines: &mut Vec<String>) {
        if self.unrenderable_count == 0 {
            return;
        }
        let n = self.unrenderable_count;
        lines.push(format!(
            "  warning: {n} item{} cannot be rendered: {} end in error without a request (nothing is sent for {}); the others run:",
            if n == 1 { "" } else { "s" },
            if n == 1 { "it will" } else { "they will" },
            if n == 1 { "it" } else { "them" },
        ));
        for (item, why) in &self.unrenderable {
            lines.push(format!(
                "    item {}: {}",
                docket_model::sanitize::for_terminal(item),
                docket_model::sanitize::for_terminal(why)
            ));
        }
        let named = self.unrenderable.len() as u64;
        if n > named {
            lines.push(format!("    ... and {} more", n - named));
        }
        let ids: Vec<String> = self
            .unrenderable
            .iter()
            .map(|(id, _)| crate::template::shell_word(&docket_model::sanitize::for_terminal(id)))
            .collect();
        lines.push(format!(
            "  to take {} out: `docket items rm {}{}` (then fix the rows and import them again), or fix the template",
            if n == 1 { "it" } else { "them" },
            ids.join(" "),
            if n > named { " ..." } else { "" }
        ));
    }

    /// What the estimate rests on that the operator should know: counted
    /// approximately, on a sample, or at default prices.
    fn notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        if !self.exact_tokenizer {
            notes.push(
                "token counts approximate (characters/4): no tokenizer for this model".to_string(),
            );
        }
        if self.counted_prompts < self.items {
            notes.push(format!(
                "tokens counted on a sample of {} prompts",
                self.counted_prompts
            ));
        }
        if !self.price_known {
            notes.push(
                "model not in the price table: default prices used (assets/prices.toml)"
                    .to_string(),
            );
        }
        notes
    }
}
