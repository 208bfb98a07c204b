//! Resuming a session: the same job (refused when it changed), the same
//! keys, the session's own flags kept, and a rerun's stages reopened.

use crate::session_keys::check_same_keys;
use crate::{EngineError, Prepared, Reporter, RunOptions, open_ledger};
use docket_ledger::control::RunControls;
use docket_ledger::rerun::RerunError;
use docket_ledger::store::{RESUME_WINDOW_SECS, SessionRow};
use docket_ledger::work::{RunSessions, WorkQueue};
use docket_ledger::{Ledger, LedgerLocation, now_ts};

pub(crate) fn resume_session(
    p: &Prepared,
    id: &str,
    opts: &RunOptions,
    reporter: &dyn Reporter,
) -> Result<String, EngineError> {
    let max_cost = opts.max_cost;
    tokio::task::block_in_place(|| {
        let mut ledger = open_ledger(&p.ledger)?;
        let Some(s) = ledger.load_session(id)? else {
            let hint = ledger
                .latest_session()?
                .map(|l| format!(" (the newest is {l})"))
                .unwrap_or_default();
            let unknown = docket_model::ids::unknown_session(id);
            return Err(EngineError::Usage(format!("{unknown}{hint}")));
        };
        check_resumable(p, id, opts, &s)?;
        check_same_job(p, &s)?;
        check_same_keys(p, &s, ledger.open_provider_batches(id)?, reporter)?;
        if p.rerun_from.is_some() && ledger.live_workers(id)? > 0 {
            return Err(EngineError::Usage(format!(
                "session {id} is being worked on right now; --rerun-stage rewrites its requests and needs it to itself. \
                 Pause or cancel it first (`docket cancel {id}`), then resume it with --rerun-stage."
            )));
        }
        let repair = ledger.repair_interrupted(id, max_cost, !opts.join)?;
        let ambiguous = repair.ambiguous;
        if repair.live_workers > 0 {
            reporter.line(&format!(
                "Session {id} is being worked on by {} other worker(s): joining them (items are claimed from the ledger, \
                 so nothing is sent twice; the provider's limits are shared between the workers).",
                repair.live_workers
            ));
        }
        // Asked again only once this process holds the session (the repair
        // above claimed it under the write lock): no live engine runs it.
        if let Some(from) = p.rerun_from {
            rerun_from(&mut ledger, p, id, from, reporter)?;
        }
        // A worker joining records its flags too (other thresholds, from a
        // docket.toml it accepted the changes of): the workers already on
        // the session route with what it records (`control::obey`).
        record_flags(&ledger, p, id, opts, reporter)?;
        let s = ledger.load_session(id)?.unwrap_or(s);
        reporter.line(&format!(
            "Resuming session {id}: {} of {} items already processed{}",
            s.processed_count,
            s.total_count,
            if ambiguous > 0 {
                format!("; {ambiguous} request(s) were in flight at the stop and will be sent again (counted as ambiguous)")
            } else {
                String::new()
            }
        ));
        Ok(id.to_string())
    })
}

/// The flags a resume can run a session with otherwise than it started:
/// the routing thresholds, the confidence floor, the rate limit, the
/// completion mode and the rate-limit profile, and a budget when one is
/// passed (without `--max-cost` the session keeps its own).
const RESUMABLE_FLAGS: [&str; 6] = [
    "min_confidence",
    "rate_limit",
    "auto_accept_threshold",
    "review_threshold",
    "completion_mode",
    "profile",
];

/// A resume that runs the session with other flags than it recorded (a
/// flag passed again with another value) records them with the session,
/// so every view of it tells what it runs with, and says so.
fn record_flags(
    ledger: &docket_ledger::Ledger,
    p: &Prepared,
    id: &str,
    opts: &RunOptions,
    reporter: &dyn Reporter,
) -> Result<(), EngineError> {
    let serde_json::Value::Object(all) = crate::start::session_flags(p, opts) else {
        return Ok(());
    };
    let flags: serde_json::Map<String, serde_json::Value> = all
        .into_iter()
        .filter(|(name, value)| {
            RESUMABLE_FLAGS.contains(&name.as_str()) || (name == "max_cost" && !value.is_null())
        })
        .collect();
    let actor = format!("cli:{}", docket_ledger::review::Operator::current().user);
    let changes = ledger.record_flags(id, &flags, &actor, opts.join)?;
    if !changes.is_empty() {
        let listed: Vec<String> = changes.iter().map(ToString::to_string).collect();
        reporter.line(&format!(
            "Session {id} runs from now on with other flags than it recorded: {} (recorded with the session).",
            listed.join(", ")
        ));
    }
    Ok(())
}

/// Refuse a session too old to resume, already completed (unless a stage
/// is asked again), or not open to another worker joining it.
fn check_resumable(
    p: &Prepared,
    id: &str,
    opts: &RunOptions,
    s: &SessionRow,
) -> Result<(), EngineError> {
    let age = now_ts() - s.started_at;
    if age > RESUME_WINDOW_SECS {
        return Err(EngineError::Usage(format!(
            "session {id} started {:.1} days ago; sessions can be resumed for 7 days only. \
             Start a new session with `docket batch-adjudicate` (answered requests are reused, not paid again).",
            age / 86_400.0
        )));
    }
    if s.state == "completed" && p.rerun_from.is_none() {
        return Err(EngineError::Usage(format!(
            "session {id} is already completed ({} of {} items processed); see `docket batch-results {id}` \
             (or ask a stage again with `--rerun-stage NAME`)",
            s.processed_count, s.total_count
        )));
    }
    if opts.join && !matches!(s.state.as_str(), "running" | "paused") {
        return Err(EngineError::Usage(format!(
            "session {id} is {}: a worker joins a running or paused session only; \
             continue it with `docket batch-adjudicate --resume {id}`",
            s.state
        )));
    }
    Ok(())
}

/// Give the stage `from` and the stages after it a new request_version,
/// and say how much is asked again.
fn rerun_from(
    ledger: &mut Ledger,
    p: &Prepared,
    id: &str,
    from: usize,
    reporter: &dyn Reporter,
) -> Result<(), EngineError> {
    let actor = format!("cli:{}", docket_ledger::review::Operator::current().user);
    let r = ledger
        .rerun_stages(&rerun_stages(p), id, from, &actor)
        .map_err(|e| match e {
            RerunError::Refused(m) => EngineError::Usage(m),
            RerunError::Ledger(e) => e.into(),
        })?;
    reporter.line(&format!(
        "Asking stage \"{}\" and the stages after it again: {} requests for {} items get a new request_version \
         ({} outcomes moved to llm_batch_result_history; their auto-accepts undone).",
        p.stages[from].name, r.requests, r.items, r.outcomes_superseded
    ));
    Ok(())
}

/// A resumed session routes with the thresholds (and paces with the rate
/// limit) it started with, unless the operator passes the flag again.
pub(crate) fn keep_session_flags(opts: &mut RunOptions, id: &str) {
    let Ok(ledger) =
        LedgerLocation::for_workspace(&opts.workspace).and_then(Ledger::open_read_only)
    else {
        return;
    };
    let Ok(Some(s)) = ledger.load_session(id) else {
        return;
    };
    let Ok(snap) = serde_json::from_str::<serde_json::Value>(&s.config_snapshot_json) else {
        return;
    };
    let flag = |name: &str| {
        snap.pointer(&format!("/flags/{name}"))
            .and_then(serde_json::Value::as_f64)
    };
    opts.auto_accept_threshold = opts.auto_accept_threshold.or(flag("auto_accept_threshold"));
    opts.review_threshold = opts.review_threshold.or(flag("review_threshold"));
    opts.min_confidence = opts.min_confidence.or(flag("min_confidence"));
    opts.rate_limit = opts.rate_limit.or(flag("rate_limit").map(|r| r as u64));
    opts.completion_mode = opts.completion_mode.or_else(|| {
        snap.pointer("/flags/completion_mode")
            .and_then(serde_json::Value::as_str)
            .and_then(|m| m.parse().ok())
    });
    // And with the rate-limit profile it started with (the version it
    // recorded: `profile::resolve`).
    if opts.profile.is_none()
        && let Ok(Some((name, _))) = docket_ledger::profiles::Profiles::session_profile(&ledger, id)
    {
        opts.profile = Some(name);
    }
}

/// The stages as a rerun records them.
fn rerun_stages(p: &Prepared) -> Vec<docket_ledger::rerun::RerunStage> {
    p.stages
        .iter()
        .map(|s| docket_ledger::rerun::RerunStage {
            name: s.name.clone(),
            index: s.index,
            provider_name: s.provider_name.clone(),
            model: s.model.clone(),
            template_hash: s.template.hash.clone(),
            params_hash: s.params_hash.clone(),
        })
        .collect()
}

/// A resumed session must send what it started with: the same stage,
/// provider, model, template and parameters. Mixing two jobs in one session
/// would make its results meaningless, so a change is refused, not followed.
fn check_same_job(p: &Prepared, s: &SessionRow) -> Result<(), EngineError> {
    let snap: serde_json::Value = serde_json::from_str(&s.config_snapshot_json).unwrap_or_default();
    // What the session started with, stage by stage; sessions from before
    // staged pipelines recorded one stage's hashes at the top level.
    let was: Vec<(String, String, String, String, String)> =
        match snap.get("stages").and_then(|v| v.as_array()) {
            Some(stages) => stages
                .iter()
                .map(|st| {
                    let f = |k: &str| st.get(k).and_then(|v| v.as_str()).unwrap_or("").to_string();
                    (
                        f("name"),
                        f("provider"),
                        f("model"),
                        f("template_hash"),
                        f("params_hash"),
                    )
                })
                .collect(),
            None => {
                let name = snap
                    .pointer("/config/stages/0/name")
                    .and_then(|v| v.as_str())
                    .unwrap_or("")
                    .to_string();
                let provider = snap
                    .pointer("/config/stages/0/provider")
                    .and_then(|v| v.as_str())
                    .unwrap_or("")
                    .to_string();
                let model = snap
                    .pointer(&format!("/config/providers/{provider}/model"))
                    .and_then(|v| v.as_str())
                    .unwrap_or("")
                    .to_string();
                let f = |k: &str| {
                    snap.get(k)
                        .and_then(|v| v.as_str())
                        .unwrap_or("")
                        .to_string()
                };
                vec![(name, provider, model, f("template_hash"), f("params_hash"))]
            }
        };
    let mut changes = Vec::new();
    let now: Vec<&str> = p.stages.iter().map(|s| s.name.as_str()).collect();
    let before: Vec<&str> = was.iter().map(|w| w.0.as_str()).collect();
    if now != before {
        changes.push(format!("stages {} -> {}", before.join(","), now.join(",")));
    } else {
        for (st, (name, provider, model, th, ph)) in p.stages.iter().zip(&was) {
            if *provider != st.provider_name || *model != st.model {
                changes.push(format!(
                    "stage {name}: provider/model {provider}/{model} -> {}/{}",
                    st.provider_name, st.model
                ));
            }
            if *th != st.template.hash {
                changes.push(format!("stage {name}: the prompt template"));
            }
            if *ph != st.params_hash {
                changes.push(format!(
                    "stage {name}: the stage parameters (max_tokens, temperature, gate, criteria or repair prompt)"
                ));
            }
        }
    }
    if changes.is_empty() {
        return Ok(());
    }
    Err(EngineError::Usage(format!(
        "session {} was started with a different job: {} changed in docket.toml since. \
         Restore them to resume it, or start a new session (answered requests are reused only when nothing changed; \
         `--rerun-stage NAME` asks a stage again).",
        s.session_id,
        changes.join(", ")
    )))
}
