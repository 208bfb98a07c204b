//! A new session: planned, estimated, confirmed by the operator, and
//! created in the ledger with its items and requests (or only described,
//! in a dry run).

use crate::session_keys::key_fingerprints;
use crate::{
    DryRunPlan, EngineError, Estimate, Plan, Prepared, Reporter, RunEnd, RunOptions,
    new_session_id, open_ledger, plan,
};
use docket_ledger::store::{self};
use docket_ledger::work::RunSessions;

pub(crate) enum Started {
    Session(String),
    /// Nothing to do, a dry run, or the operator said no.
    Ended(RunEnd),
}

/// Plan, estimate, ask, and create the session with its items and requests.
pub(crate) fn start_session(
    prepared: &Prepared,
    opts: &RunOptions,
    reporter: &dyn Reporter,
    confirm: impl FnOnce(&Estimate) -> bool,
) -> Result<Started, EngineError> {
    reporter.line("Batch LLM Adjudication");
    reporter.line("======================");
    reporter.line("");
    let plan =
        tokio::task::block_in_place(|| plan::plan(prepared, opts.limit, opts.rereview_pending))?;
    reporter.line(&format!(
        "Querying INDETERMINATE decisions... {} found",
        plan.item_ids.len()
    ));
    let awaiting = left_awaiting_review(prepared, opts)?;
    if awaiting > 0 {
        reporter.line(&format!(
            "  {awaiting} item(s) awaiting review left out (they have a pending review item; \
             --rereview-pending routes them again, the new suggestion replacing the old)"
        ));
    }
    say_stale_evidence(prepared, &plan, reporter)?;
    if plan.item_ids.is_empty() {
        reporter.line(if awaiting > 0 {
            "Nothing to do: every indeterminate item awaits review (decide them in `docket review`)."
        } else {
            "Nothing to do: no indeterminate items (import some with `docket import FILE`)."
        });
        return Ok(Started::Ended(RunEnd::NothingToDo));
    }
    for l in plan.estimate.describe() {
        reporter.line(&l);
    }
    if opts.dry_run {
        dry_run_report(prepared, &plan, awaiting, reporter);
        return Ok(Started::Ended(RunEnd::DryRun));
    }
    if let Some(max) = opts.max_cost {
        reporter.line(&format!(
            "Budget: at most ${max:.4} (dispatch pauses before the spend could pass it)"
        ));
    }
    say_profile(prepared, reporter);
    refuse_stale_answers(prepared, &plan)?;
    if !confirm(&plan.estimate) {
        reporter.line("Not started.");
        return Ok(Started::Ended(RunEnd::Declined));
    }
    let id = new_session_id();
    let taken = tokio::task::block_in_place(|| create_session(prepared, opts, &plan, &id))?;
    if taken == 0 {
        reporter.line(
            "Nothing to do: every planned item was taken or decided meanwhile by another session started at the same time \
             (see `docket sessions`).",
        );
        return Ok(Started::Ended(RunEnd::NothingToDo));
    }
    reporter.line("");
    if taken < plan.item_ids.len() {
        reporter.line(&format!(
            "{} of the {} planned items were taken or decided meanwhile by another session started at the same time; this session takes the other {taken}.",
            plan.item_ids.len() - taken,
            plan.item_ids.len()
        ));
    }
    reporter.line(&format!("Creating batch session: {id}"));
    Ok(Started::Session(id))
}

/// A dry run's missing keys, said, and its plan handed to the reporter.
fn dry_run_keys(prepared: &Prepared, plan: &Plan, awaiting: u64, reporter: &dyn Reporter) {
    let missing_keys = missing_keys(prepared);
    for m in &missing_keys {
        reporter.line(&format!("Warning: {m}"));
    }
    reporter.dry_run_planned(&DryRunPlan {
        estimate: &plan.estimate,
        awaiting_review: awaiting,
        missing_keys: &missing_keys,
    });
}

/// Each provider the job's stages use whose key variable is not set, said
/// once per provider: a dry run goes on without it, a real run would not.
fn missing_keys(p: &Prepared) -> Vec<String> {
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for stage in &p.config.config.stages {
        if !seen.insert(stage.provider.clone()) {
            continue;
        }
        let cfg = p.config.provider_for(stage);
        if let Err(e) = docket_providers::check_key(&stage.provider, cfg) {
            out.push(format!(
                "{e}. Nothing was sent; a real run refuses to start without it."
            ));
        }
    }
    out
}

/// Make the session row with its items and requests, and record the
/// rate-limit profile it runs with; returns how many items it took.
fn create_session(
    prepared: &Prepared,
    opts: &RunOptions,
    plan: &Plan,
    id: &str,
) -> Result<usize, EngineError> {
    let snapshot = session_snapshot(prepared, opts);
    let new_stages = new_stages(prepared);
    let mut ledger = open_ledger(&prepared.ledger)?;
    let taken = ledger.create_session(&store::NewSession {
        session_id: id,
        config_snapshot_json: &snapshot,
        stages: &new_stages,
        estimated_tokens: plan.estimate.prompt_tokens + plan.estimate.expected_output_tokens,
        estimated_cost_usd: plan.estimate.cost_usd,
        max_cost_usd: opts.max_cost,
        item_ids: &plan.item_ids,
        profile: prepared
            .profile
            .as_ref()
            .map(|p| (p.name.as_str(), p.version)),
    })?;
    Ok(taken)
}

/// `--profile`: which limits the run takes from it.
fn say_profile(prepared: &Prepared, reporter: &dyn Reporter) {
    if let Some(p) = &prepared.profile {
        reporter.line(&format!(
            "Rate limits: profile {} for provider {}: {}",
            docket_ledger::profiles::label(&p.name, p.version),
            p.provider,
            p.limits.describe()
        ));
    }
}

/// How many items the plan left out because they await review (none when
/// `--rereview-pending` takes them).
fn left_awaiting_review(prepared: &Prepared, opts: &RunOptions) -> Result<u64, EngineError> {
    if opts.rereview_pending {
        return Ok(0);
    }
    tokio::task::block_in_place(|| {
        let ledger = open_ledger(&prepared.ledger)?;
        Ok(ledger.count_awaiting_review()?)
    })
}

/// Items whose evidence `docket import --update` changed since their
/// answer: asked again as a new request version, said so (never silently).
fn say_stale_evidence(
    prepared: &Prepared,
    plan: &Plan,
    reporter: &dyn Reporter,
) -> Result<(), EngineError> {
    let stale = tokio::task::block_in_place(|| -> Result<_, EngineError> {
        let ledger = open_ledger(&prepared.ledger)?;
        Ok(ledger.count_stale_evidence(&plan.item_ids)?)
    })?;
    if stale > 0 {
        tracing::info!(stale, "items with changed evidence asked again");
        reporter.line(&format!(
            "  {stale} item(s) with changed evidence (docket import --update) asked again as a new request version; \
             their old answers stay in the history, marked stale"
        ));
    }
    Ok(())
}

/// Refuse to start over answers made with another template or parameters.
fn refuse_stale_answers(prepared: &Prepared, plan: &Plan) -> Result<(), EngineError> {
    // Answers made with another template or parameters are neither reused
    // nor asked again behind the operator's back.
    let stale = tokio::task::block_in_place(|| -> Result<_, EngineError> {
        let ledger = open_ledger(&prepared.ledger)?;
        Ok(ledger.stale_answers(&new_stages(prepared), &plan.item_ids)?)
    })?;
    if !stale.is_empty() {
        let list: Vec<String> = stale
            .iter()
            .map(|(stage, n)| format!("stage {stage}: {n} item(s)"))
            .collect();
        Err(EngineError::Usage(format!(
            "answers exist that were made with another prompt template or other stage parameters ({}). \
             They are not reused and not asked again silently: pass `--rerun-stage {}` to ask that stage (and the ones after it) again \
             with a new request_version, or restore the template and parameters to reuse them.",
            list.join("; "),
            stale[0].0
        )))
    } else {
        Ok(())
    }
}

/// The session's record of its job: the config, the flags, each stage's
/// template and parameters, and the keys' fingerprints.
fn session_snapshot(prepared: &Prepared, opts: &RunOptions) -> String {
    // Names of key variables only: no key is ever read into the config.
    serde_json::json!({
        "config": prepared.config.snapshot_json(),
        "flags": session_flags(prepared, opts),
        "template_hash": prepared.first().template.hash,
        "params_hash": prepared.first().params_hash,
        "stages": prepared.stages.iter().map(|s| serde_json::json!({
            "name": s.name, "provider": s.provider_name, "model": s.model,
            "template_hash": s.template.hash, "params_hash": s.params_hash,
        })).collect::<Vec<_>>(),
        "rerun_stage": prepared.rerun_from.map(|i| prepared.stages[i].name.clone()),
        "keys": key_fingerprints(prepared),
    })
    .to_string()
}

/// The flags a session records (and a resume runs with: `resume`).
pub(crate) fn session_flags(prepared: &Prepared, opts: &RunOptions) -> serde_json::Value {
    serde_json::json!({
        "limit": opts.limit, "min_confidence": opts.min_confidence, "rate_limit": opts.rate_limit,
        "rereview_pending": opts.rereview_pending, "force": opts.force,
        "auto_accept_threshold": prepared.thresholds.auto_accept,
        "review_threshold": prepared.thresholds.review, "max_cost": opts.max_cost,
        "completion_mode": prepared.completion_mode.as_str(),
        "profile": prepared.profile.as_ref().map(|p| serde_json::json!({
            "name": p.name, "version": p.version, "provider": p.provider,
            "model": p.model, "limits": p.limits,
        })),
    })
}

/// The stages as a new session records them.
fn new_stages(p: &Prepared) -> Vec<store::NewStage<'_>> {
    p.stages
        .iter()
        .map(|s| store::NewStage {
            name: &s.name,
            provider: &s.provider_name,
            model: &s.model,
            template_hash: &s.template.hash,
            params_hash: &s.params_hash,
            critic_of: s.critic_of.map(|c| p.stages[c].name.as_str()),
            rerun: p.rerun_from.is_some_and(|r| s.index >= r),
        })
        .collect()
}

fn dry_run_report(p: &Prepared, plan: &Plan, awaiting: u64, reporter: &dyn Reporter) {
    reporter.line("");
    let stages: Vec<String> = p
        .stages
        .iter()
        .map(|s| {
            format!(
                "\"{}\" ({} {}{})",
                s.name,
                s.provider_name,
                s.model,
                s.critic_of
                    .map(|c| format!(", critic of {}", p.stages[c].name))
                    .unwrap_or_default()
            )
        })
        .collect();
    reporter.line(&format!(
        "Dry run: nothing was sent. A session would run {} items through {} stage(s): {}; \
         routing on stage \"{}\": accept ≥ {:.2}, review ≥ {:.2}, reject below.",
        plan.estimate.items,
        p.stages.len(),
        stages.join(" → "),
        p.answer_stage().name,
        p.thresholds.effective_accept(),
        p.thresholds.review
    ));
    if let Some(prompt) = &plan.estimate.first_prompt {
        reporter.line(&format!(
            "First rendered prompt (item {}):",
            docket_model::sanitize::for_terminal(plan.estimate.first_item.as_deref().unwrap_or(""))
        ));
        if let Some(s) = &prompt.system {
            reporter.line("--- system ---");
            for l in s.lines() {
                reporter.line(&docket_model::sanitize::for_terminal(l));
            }
        }
        reporter.line("--- user ---");
        for l in prompt.user.lines() {
            reporter.line(&docket_model::sanitize::for_terminal(l));
        }
        reporter.line("--------------");
    }
    dry_run_keys(p, plan, awaiting, reporter);
}
