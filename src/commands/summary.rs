//! `docket batch-adjudicate --format json`: the end of a run, or a dry
//! run's estimate, as one JSON document with stable keys.

use docket::engine::{DryRunPlan, EngineError, RunDuration, RunEnd, RunReport};

/// What an exit code means, for a script reading the JSON.
fn exit_meaning(code: i32) -> &'static str {
    match code {
        0 => "ok",
        2 => "usage, configuration, input or ledger error",
        3 => "stopped by a provider error (resumable), or a provider that cannot be used",
        4 => "paused (resumable)",
        5 => "completed with items in error",
        6 => "the ledger could not be written (resumable)",
        130 => "cancelled (resumable)",
        _ => "failed",
    }
}

/// The run's end as a word, and why, when it says.
fn end_of(end: &RunEnd) -> (&'static str, Option<&str>) {
    match end {
        RunEnd::Completed => ("completed", None),
        RunEnd::Cancelled => ("cancelled", None),
        RunEnd::Stopped(why) => ("stopped", Some(why)),
        RunEnd::LedgerFailed(why) => ("ledger_failed", Some(why)),
        RunEnd::Paused(why) => ("paused", Some(why)),
        RunEnd::DryRun => ("dry_run", None),
        RunEnd::NothingToDo => ("nothing_to_do", None),
        RunEnd::Declined => ("declined", None),
    }
}

/// The summary of a run that ended (`dry_run`: the plan a dry run found).
pub(super) fn run_json(
    report: &RunReport,
    dry_run: Option<serde_json::Value>,
) -> serde_json::Value {
    let code = report.exit_code();
    let (end, reason) = end_of(&report.end);
    let session = report.session.as_ref().map(|s| {
        serde_json::json!({
            "state": s.state,
            "stop_reason": s.stop_reason,
            "counters": {
                "total": s.total_count, "processed": s.processed_count,
                "accepted": s.accepted_count, "review": s.reviewed_count,
                "rejected": s.rejected_count, "error": s.error_count,
                "retries": s.retry_count, "rate_limited": s.rate_limited_count,
                "ambiguous": s.ambiguous_count,
            },
            "tokens": {"input": s.input_tokens, "output": s.output_tokens},
            "cost_usd": s.cost_usd,
            "estimate": {"tokens": s.estimated_tokens, "cost_usd": s.estimated_cost_usd},
            "max_cost_usd": s.max_cost_usd,
        })
    });
    serde_json::json!({
        "session_id": report.session_id,
        "end": end,
        "reason": reason,
        "exit_code": code,
        "exit_meaning": exit_meaning(code),
        "session": session,
        "dry_run": dry_run,
    })
}

/// A run that could not go on (bad config, missing key, ledger...).
pub(super) fn error_json(e: &EngineError) -> serde_json::Value {
    let code = e.exit_code();
    serde_json::json!({
        "session_id": null,
        "end": "error",
        "reason": e.to_string(),
        "exit_code": code,
        "exit_meaning": exit_meaning(code),
        "session": null,
        "dry_run": null,
    })
}

/// A dry run's plan: what a session would take, cost and last.
pub(super) fn dry_run_json(plan: &DryRunPlan<'_>) -> serde_json::Value {
    let e = plan.estimate;
    let duration = match &e.duration {
        RunDuration::AtLeast { secs, binding } => {
            serde_json::json!({"kind": "at_least", "secs": secs, "binding": binding})
        }
        RunDuration::ProviderSpeed { provider } => {
            serde_json::json!({"kind": "provider_speed", "provider": provider})
        }
        RunDuration::BatchWindow => serde_json::json!({"kind": "batch_window"}),
    };
    let pairs = |v: &[(String, String)]| -> Vec<serde_json::Value> {
        v.iter()
            .map(|(id, why)| serde_json::json!({"item_id": id, "reason": why}))
            .collect()
    };
    serde_json::json!({
        "items": e.items,
        "model": e.model,
        "prompt_tokens": e.prompt_tokens,
        "expected_output_tokens": e.expected_output_tokens,
        "max_output_tokens": e.max_output_tokens,
        "cost_usd": e.cost_usd,
        "worst_cost_usd": e.worst_cost_usd,
        "price_known": e.price_known,
        "exact_tokenizer": e.exact_tokenizer,
        "batch_price_factor": e.batch_price_factor,
        "stages": e.stages.iter().map(|s| serde_json::json!({
            "name": s.name, "model": s.model, "critic": s.critic,
            "prompt_tokens": s.prompt_tokens, "expected_output_tokens": s.expected_output_tokens,
            "cost_usd": s.cost_usd,
        })).collect::<Vec<_>>(),
        "duration": duration,
        "awaiting_review_left_out": plan.awaiting_review,
        "unsendable_count": e.unsendable_count,
        "unsendable": pairs(&e.unsendable),
        "unrenderable_count": e.unrenderable_count,
        "unrenderable": pairs(&e.unrenderable),
        "first_item": e.first_item,
        "first_prompt": e.first_prompt.as_ref().map(|p| serde_json::json!({
            "system": p.system.as_deref(), "user": &*p.user,
        })),
        "missing_keys": plan.missing_keys,
    })
}
