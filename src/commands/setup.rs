//! Setting a workspace up: `docket init`, `docket import` and `docket demo`.

use std::io::Write;
use std::path::{Path, PathBuf};

use docket::items;
use docket::ledger::{LEDGER_FILE, Ledger, LedgerLocation};

use super::{EXIT_USAGE, fail};
use crate::cli::{ConsoleArgs, DemoArgs, ImportFormatArg, RunArgs, SummaryFormat};

pub(super) fn init(
    dir: &Path,
    force: bool,
    example: Option<crate::cli::ExampleArg>,
    provider: Option<crate::cli::ProviderArg>,
) -> i32 {
    use crate::cli::ProviderArg;
    use docket::workspace::RealProvider;
    let example = example.map(|e| match e {
        crate::cli::ExampleArg::Critic => docket::workspace::Example::Critic,
        crate::cli::ExampleArg::JudgeGym => docket::workspace::Example::JudgeGym,
    });
    let provider = provider.map(|p| match p {
        ProviderArg::Openai => RealProvider::Openai,
        ProviderArg::Anthropic => RealProvider::Anthropic,
        ProviderArg::Gemini => RealProvider::Gemini,
        ProviderArg::Openrouter => RealProvider::Openrouter,
        ProviderArg::Ollama => RealProvider::Ollama,
    });
    match docket::workspace::init_for(dir, force, example, provider) {
        Ok(files) => {
            println!("Initialized a docket workspace in {}:", dir.display());
            for f in files {
                println!("  wrote {}", f.display());
            }
            println!();
            println!("Next:");
            if let Some(env) = provider.and_then(RealProvider::key_env) {
                println!(
                    "  export {env}=...   # your key: docket reads it from the environment only"
                );
            }
            println!(
                "  docket --workspace {} import {}",
                dir.display(),
                dir.join(docket::workspace::SAMPLE_ITEMS).display()
            );
            println!("  docket --workspace {} batch-adjudicate", dir.display());
            0
        }
        Err(e) => fail(e),
    }
}

pub(super) fn import(
    ws: &Path,
    file: &Path,
    id_field: String,
    strict: bool,
    update: bool,
    format: Option<ImportFormatArg>,
    output_format: SummaryFormat,
) -> i32 {
    // Outside a workspace an import would leave a stray ledger behind
    // (and nothing could run its items): refuse, creating nothing.
    let config = ws.join(docket::config::CONFIG_FILE);
    if !config.exists() {
        return fail(format!(
            "{}: no docket.toml here, so this is not a docket workspace; nothing was imported. \
             Create one with `docket init {}` (or pass --workspace DIR to import into another)",
            ws.display(),
            ws.display()
        ));
    }
    let mut template_warning = None;
    let check = match items::TemplateCheck::load(&config) {
        Ok(check) => Some(check),
        Err(e) => {
            let warning = format!("warning: new rows not checked against the job's templates: {e}");
            super::say_error(&warning);
            template_warning = Some(warning);
            None
        }
    };
    let mut ledger = match LedgerLocation::for_workspace(ws).and_then(Ledger::open) {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    let opts = items::ImportOptions {
        id_field,
        strict,
        update,
        format: format.map(|f| match f {
            ImportFormatArg::Jsonl => items::ImportFormat::Jsonl,
            ImportFormatArg::Csv => items::ImportFormat::Csv,
        }),
    };
    match items::import_file_checked(&mut ledger, file, &opts, check.as_ref()) {
        Ok(r) => {
            match output_format {
                SummaryFormat::Table => {
                    let _ = items::render_import_report(&r, &mut std::io::stdout().lock());
                }
                SummaryFormat::Json => {
                    super::print_json(&import_json(&r, template_warning.as_deref()))
                }
            }
            if r.bad_count > 0 { EXIT_USAGE } else { 0 }
        }
        Err(e) => fail(e),
    }
}

/// `docket demo`: in `workspace` (`--workspace`) or docket's own demo
/// folder, the demo's scaffold (a generator and its critic, an audit
/// sample), fresh items and ledger, then a run.
pub(super) async fn demo(args: DemoArgs, workspace: Option<&Path>, console: &ConsoleArgs) -> i32 {
    let dir = workspace.map_or_else(docket::workspace::demo_dir, Path::to_path_buf);
    if let Err(e) = docket::workspace::init_demo(&dir, args.keep) {
        return fail(e);
    }
    let ledger_path = dir.join(LEDGER_FILE);
    if !args.keep {
        for suffix in ["", "-wal", "-shm"] {
            let _ =
                std::fs::remove_file(PathBuf::from(format!("{}{suffix}", ledger_path.display())));
        }
    }
    let items_path = dir.join("items/demo.jsonl");
    let written = (|| -> std::io::Result<()> {
        // not a ledger file: the demo's items.
        let mut f = std::io::BufWriter::new(std::fs::File::create(&items_path)?);
        docket::demo::write_chart_items(&mut f, args.items, 2026)?;
        f.flush()
    })();
    if let Err(e) = written {
        return fail(format!("{}: {e}", items_path.display()));
    }
    println!(
        "docket demo: workspace {} (built-in mock provider, no key, no network)",
        dir.display()
    );
    let code = import(
        &dir,
        &items_path,
        "id".into(),
        false,
        false,
        None,
        SummaryFormat::Table,
    );
    if code != 0 {
        return code;
    }
    println!();
    let args = RunArgs {
        limit: None,
        min_confidence: None,
        rate_limit: None,
        profile: None,
        dry_run: false,
        format: SummaryFormat::Table,
        no_preflight: false,
        resume: None,
        accept_changes: false,
        force: false,
        skip_reviewed: false,
        rereview_pending: false,
        auto_accept_threshold: None,
        review_threshold: None,
        yes: true,
        cancel_remote: false,
        headless: args.headless,
        max_cost: None,
        completion_mode: None,
        grace: 5.0,
        rerun_stage: None,
        requests: Default::default(),
    };
    let code = super::run::batch_adjudicate(&dir, args, console).await;
    if code == 0 || code == docket::engine::EXIT_COMPLETED_WITH_ERRORS {
        println!();
        println!("Explore it: docket --workspace {} sessions", dir.display());
    }
    code
}

/// `docket import --output-format json`: the report with every detail it
/// kept, file and line apart.
fn import_json(r: &items::ImportReport, template_warning: Option<&str>) -> serde_json::Value {
    let file = r.file.display().to_string();
    serde_json::json!({
        "file": file,
        "committed": r.committed,
        "rows_read": r.rows_read,
        "imported": r.imported,
        "already_present": r.already_present,
        "differing": r.differing,
        // new / changed / unchanged, as the text summary says them.
        "new": r.imported,
        "changed": r.differing,
        "unchanged": r.already_present - r.differing,
        "updated": r.updated,
        "stale": {
            "outcomes": r.stale.outcomes,
            "pending_reviews": r.stale.pending_reviews,
            "decided_reviews": r.stale.decided_reviews,
            "auto_accepts_undone": r.stale.auto_accepts_undone,
        },
        "differing_rows": r.differing_rows.iter()
            .map(|(line, id)| serde_json::json!({"file": file, "line": line, "item_id": id}))
            .collect::<Vec<_>>(),
        "bad_count": r.bad_count,
        "bad_rows": r.bad_rows.iter()
            .map(|b| serde_json::json!({"file": file, "line": b.line, "reason": b.reason}))
            .collect::<Vec<_>>(),
        "templates_checked": template_warning.is_none(),
        "template_warning": template_warning,
        "unrenderable_count": r.unrenderable_count,
        "unrenderable": r.unrenderable.iter()
            .map(|u| serde_json::json!({
                "file": file, "line": u.line, "item_id": u.item_id, "reason": u.reason,
            }))
            .collect::<Vec<_>>(),
    })
}
