//! `docket profile list|show|set`: named rate-limit profiles in the ledger.
//! A run takes one with `batch-adjudicate --profile NAME` (the engine's
//! `profile` module applies it).

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use docket::ledger::profiles::{Profiles, label};
use docket::ledger::{Ledger, LedgerLocation};
use docket::profile::{Profile, ProfileLimits, check_name};
use docket::report::{iso_time, table_time};

use super::ledger::with_ledger_reading;
use super::{data_out, fail, print_json};
use crate::cli::{FormatArg, ProfileAction, ProfileSetArgs, SummaryFormat};

pub(super) fn profile(ws: &Path, action: ProfileAction) -> i32 {
    match action {
        ProfileAction::List { format } => with_ledger_reading(ws, |l| {
            let all = l.profiles().map_err(|e| e.to_string())?;
            show(
                &all,
                format,
                "No rate-limit profiles yet. Make one with: docket profile set NAME --provider P --rpm N",
            )
        }),
        ProfileAction::Show { name, format } => with_ledger_reading(ws, |l| {
            let history = l.profile_history(&name).map_err(|e| e.to_string())?;
            if history.is_empty() {
                let known = l.profiles().map_err(|e| e.to_string())?;
                return Err(unknown(&name, &known));
            }
            show(&history, format, "")
        }),
        ProfileAction::Set(args) => set(ws, args),
    }
}

/// "no rate-limit profile NAME (known: a, b)".
fn unknown(name: &str, known: &[Profile]) -> String {
    let names: Vec<&str> = known.iter().map(|p| p.name.as_str()).collect();
    format!(
        "no rate-limit profile {name} (known: {})",
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    )
}

fn set(ws: &Path, args: ProfileSetArgs) -> i32 {
    let limits = ProfileLimits {
        requests_per_minute: args.rpm,
        tokens_per_minute: args.tpm,
        max_concurrency: args.concurrency,
        request_timeout_secs: args.timeout_secs,
        max_transport_attempts: args.transport_attempts,
        max_rate_limit_retries: args.rate_limit_retries,
        retry_wait_secs: args.retry_wait_secs,
    };
    if let Err(e) = check_name(&args.name).and_then(|()| limits.validate()) {
        return fail(format!("profile set {}: {e}", args.name));
    }
    warn_unknown_provider(ws, &args.provider);
    let location = match LedgerLocation::for_workspace(ws) {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    // A first profile may make the ledger, but only in a workspace.
    if !location.exists() && !ws.join(docket::config::CONFIG_FILE).exists() {
        return fail(format!(
            "{}: no docket.toml and no ledger here (create a workspace with `docket init`, or pass --workspace)",
            ws.display()
        ));
    }
    let actor = format!("cli:{}", docket::ledger::review::Operator::current().user);
    let saved = Ledger::open(location).and_then(|l| {
        l.set_profile(
            &args.name,
            &args.provider,
            args.model.as_deref(),
            &limits,
            &actor,
        )
    });
    match saved {
        Ok(p) if args.format == SummaryFormat::Json => {
            print_json(&json(&p));
            0
        }
        Ok(p) => {
            println!(
                "Saved rate-limit profile {} (provider {}{}): {}",
                label(&p.name, p.version),
                p.provider,
                p.model
                    .as_deref()
                    .map(|m| format!(", model {m}"))
                    .unwrap_or_default(),
                p.limits.describe()
            );
            0
        }
        Err(e) => fail(e),
    }
}

/// A profile names a provider by its docket.toml name: one this workspace
/// does not have is kept (the ledger may serve other workspaces) but said.
fn warn_unknown_provider(ws: &Path, provider: &str) {
    let path = ws.join(docket::config::CONFIG_FILE);
    if let Ok(c) = docket::config::LoadedConfig::load(&path)
        && !c.config.providers.contains_key(provider)
    {
        let known: Vec<&str> = c.config.providers.keys().map(String::as_str).collect();
        super::say_error(format!(
            "warning: {} has no [providers.{provider}] (it has: {}); a run with this profile here will be refused",
            path.display(),
            known.join(", ")
        ));
    }
}

fn show(list: &[Profile], format: FormatArg, empty: &str) -> Result<(), String> {
    let text = match format {
        FormatArg::Json => {
            let all: Vec<serde_json::Value> = list.iter().map(json).collect();
            format!("{}\n", serde_json::Value::Array(all))
        }
        FormatArg::Table | FormatArg::Csv if list.is_empty() => format!("{empty}\n"),
        FormatArg::Table | FormatArg::Csv => table(list),
    };
    let mut out = data_out();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .or_else(|e| match e.kind() {
            // A reader that went away (`| head`) got what it wanted.
            std::io::ErrorKind::BrokenPipe => Ok(()),
            _ => Err(e.to_string()),
        })
}

fn json(p: &Profile) -> serde_json::Value {
    serde_json::json!({
        "name": p.name, "version": p.version, "provider": p.provider, "model": p.model,
        "limits": p.limits, "created_at": iso_time(p.created_at),
    })
}

fn table(list: &[Profile]) -> String {
    let safe = docket::sanitize::for_terminal;
    let name_w = list.iter().map(|p| p.name.len()).max().unwrap_or(0).max(4);
    let prov_w = list
        .iter()
        .map(|p| p.provider.len())
        .max()
        .unwrap_or(0)
        .max(8);
    let model_w = list
        .iter()
        .map(|p| p.model.as_deref().map_or(1, str::len))
        .max()
        .unwrap_or(0)
        .max(5);
    let mut out = format!(
        "{:<name_w$}  {:>7}  {:<prov_w$}  {:<model_w$}  {:<19}  limits\n",
        "name", "version", "provider", "model", "created (UTC)"
    );
    for p in list {
        let _ = writeln!(
            out,
            "{:<name_w$}  {:>7}  {:<prov_w$}  {:<model_w$}  {:<19}  {}",
            safe(&p.name),
            p.version,
            safe(&p.provider),
            safe(p.model.as_deref().unwrap_or("-")),
            table_time(p.created_at),
            p.limits.describe()
        );
    }
    out
}
