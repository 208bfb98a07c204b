//! `docket doctor`: what could stop a run, checked before one. Each check
//! group lives in its own file: the workspace's config, templates and
//! schemas (`workspace`), each provider's key and a cheap request to it
//! (`providers`), the ledger's integrity and schema version (`ledger`),
//! the ledger disk's free space (`disk`) and the terminal (`terminal`).
//! Every line is `ok`, `warn` or `FAIL` with what was checked, and each
//! warn or FAIL says in one sentence how to fix it. Nothing is written:
//! the ledger is opened read-only and never migrated.

use std::path::Path;

use serde_json::json;

use crate::cli::SummaryFormat;

mod disk;
mod ledger;
mod providers;
mod terminal;
mod workspace;

/// A check's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    Ok,
    /// docket works, less well (the terminal), or the check could not run.
    Warn,
    /// A run would stop on it.
    Fail,
}

impl Status {
    /// The word in the table.
    fn word(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
        }
    }

    /// The value of `status` in `--format json` (stable).
    fn key(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// One line of the report.
#[derive(Debug, Clone)]
pub(crate) struct Check {
    /// A stable name: `config`, `provider.NAME.key`, `ledger.schema`...
    pub name: String,
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// For a warn or FAIL: what to do, in one sentence.
    pub fix: Option<String>,
}

impl Check {
    pub fn ok(name: impl Into<String>, detail: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            status: Status::Ok,
            detail: detail.into(),
            fix: None,
        }
    }

    pub fn warn(
        name: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Check {
        Check::with_fix(Status::Warn, name.into(), detail.into(), fix.into())
    }

    pub fn fail(
        name: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Check {
        Check::with_fix(Status::Fail, name.into(), detail.into(), fix.into())
    }

    fn with_fix(status: Status, name: String, detail: String, fix: String) -> Check {
        Check {
            name,
            status,
            detail,
            fix: Some(fix),
        }
    }
}

/// `docket doctor`: every check, printed; 0 when none FAILed, else 1.
pub(super) async fn doctor(ws: &Path, format: SummaryFormat, offline: bool) -> i32 {
    let mut checks = Vec::new();
    let job = workspace::check(ws, &mut checks);
    match &job {
        Some(prepared) => {
            checks.extend(providers::keys(prepared));
            if offline {
                checks.push(Check::ok("providers.reach", "not asked (--offline)"));
            } else {
                checks.extend(providers::reach(prepared).await);
            }
        }
        None => checks.push(Check::warn(
            "providers",
            "not checked: docket.toml must load first",
            "fix the config FAIL above, then run `docket doctor` again",
        )),
    }
    let location = tokio::task::block_in_place(|| ledger::check(ws, &mut checks));
    if let Some(location) = location {
        checks.push(disk::check(&location));
    }
    checks.extend(terminal::checks());
    print(&checks, format);
    if checks.iter().any(|c| c.status == Status::Fail) {
        1
    } else {
        0
    }
}

fn print(checks: &[Check], format: SummaryFormat) {
    let ok = !checks.iter().any(|c| c.status == Status::Fail);
    if format == SummaryFormat::Json {
        let list: Vec<serde_json::Value> = checks
            .iter()
            .map(|c| {
                json!({
                    "name": c.name,
                    "status": c.status.key(),
                    "detail": c.detail,
                    "fix": c.fix,
                })
            })
            .collect();
        super::print_json(&json!({ "ok": ok, "checks": list }));
        return;
    }
    print_table(checks);
}

/// The table: a line per check, an indented `fix:` line under each warn
/// and FAIL, and a last line counting them. A closed pipe (`| head`)
/// ends the output quietly.
fn print_table(checks: &[Check]) {
    use std::io::Write;
    let width = checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
    // Details quote files, URLs and providers' answers: made safe for a
    // terminal, a line each.
    let safe = |s: &str| docket::sanitize::for_terminal(&s.replace('\n', " "));
    let mut out = std::io::stdout().lock();
    for c in checks {
        let _ = writeln!(
            out,
            "{:<4}  {:<width$}  {}",
            c.status.word(),
            c.name,
            safe(&c.detail)
        );
        if let Some(fix) = &c.fix {
            let _ = writeln!(out, "{:<4}  {:<width$}  fix: {}", "", "", safe(fix));
        }
    }
    let failed = checks.iter().filter(|c| c.status == Status::Fail).count();
    let warned = checks.iter().filter(|c| c.status == Status::Warn).count();
    let _ = writeln!(
        out,
        "{}: {failed} failed, {warned} warning(s), {} ok",
        if failed == 0 {
            "healthy"
        } else {
            "not healthy"
        },
        checks.len() - failed - warned
    );
    let _ = out.flush();
}
