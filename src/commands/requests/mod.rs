//! `docket run --requests FILE --provider NAME`: a file of requests
//! (OpenAI Batch API lines or bare chat-completions bodies) sent as written,
//! under docket's limiter, ledger, resume, console and cost estimate, and
//! the answers written in the Batch API's output format.
//!
//! Each line becomes an item (its id the custom_id, its evidence the line)
//! of a job made for the file in `FILE.docket/` beside it: one stage whose
//! template is the line's body (`send_body`), so a normal session runs it.
//! The same command again resumes that job's unfinished session, or, when
//! it finished, only writes the output again: nothing is sent twice.

mod lines;
mod output;
mod place;

use std::path::{Path, PathBuf};

use docket::ledger::import::Import;
use docket::ledger::work::RunSessions;
use docket::ledger::{Ledger, LedgerLocation};
use serde_json::json;

use super::{fail, say_error};
use crate::cli::{ConsoleArgs, RunArgs, SummaryFormat};
use lines::{BadLine, Request};

/// The job a file's lines make, once set up.
struct Job {
    file: PathBuf,
    dir: PathBuf,
    out: PathBuf,
    requests: Vec<Request>,
    bad: Vec<BadLine>,
    json: bool,
}

impl Job {
    /// A line for the operator: stdout, or stderr when stdout holds JSON.
    fn note(&self, text: &str) {
        let text = docket::sanitize::for_terminal(text);
        if self.json {
            eprintln!("{text}");
        } else {
            println!("{text}");
        }
    }

    /// The output written (once the run finished), said, and its JSON.
    fn finish(&self, code: i32, dry_run: bool) -> (i32, Option<serde_json::Value>) {
        let mut doc = json!({
            "file": self.file.display().to_string(),
            "workspace": self.dir.display().to_string(),
            "lines": self.requests.len(),
            "bad_count": self.bad.len(),
            "bad_lines": self.bad.iter().map(|b| json!({
                "file": self.file.display().to_string(), "line": b.line, "reason": b.reason,
            })).collect::<Vec<_>>(),
            "output": null,
        });
        let finished = code == 0 || code == docket::engine::EXIT_COMPLETED_WITH_ERRORS;
        if dry_run {
            return (self.with_bad_lines(code), Some(doc));
        }
        if !finished {
            self.note(&format!(
                "Not finished: run the same command again to resume; {} is written once the run ends.",
                self.out.display()
            ));
            return (code, Some(doc));
        }
        match tokio::task::block_in_place(|| output::write(&self.dir, &self.requests, &self.out)) {
            Ok(w) => {
                self.note(&format!(
                    "Wrote {}: {} line(s), {} answered, {} not (see each line's error).",
                    self.out.display(),
                    self.requests.len(),
                    w.answered,
                    w.failed
                ));
                doc["output"] = json!({
                    "path": self.out.display().to_string(),
                    "answered": w.answered, "failed": w.failed,
                });
                let code = if code == 0 && w.failed > 0 {
                    docket::engine::EXIT_COMPLETED_WITH_ERRORS
                } else {
                    code
                };
                (self.with_bad_lines(code), Some(doc))
            }
            Err(e) => {
                say_error(format!("the output could not be written: {e}"));
                (super::EXIT_USAGE, Some(doc))
            }
        }
    }

    /// A bad line makes the exit code 2 (as for `docket import`) unless
    /// something worse happened.
    fn with_bad_lines(&self, code: i32) -> i32 {
        if code == 0 && !self.bad.is_empty() {
            super::EXIT_USAGE
        } else {
            code
        }
    }
}

/// `docket run --requests FILE --provider NAME`.
pub(super) async fn run(ws: &Path, mut args: RunArgs, console: &ConsoleArgs) -> i32 {
    let r = args.requests.clone();
    let Some(file) = r.requests.clone() else {
        return fail("--requests FILE: no file given");
    };
    let Some(provider) = r.provider.clone() else {
        return fail(format!(
            "--requests needs --provider NAME: one of {}, or inside a workspace one of its [providers.NAME]",
            place::KNOWN
        ));
    };
    if args.resume.is_some() || args.rerun_stage.is_some() {
        return fail(
            "--requests finds its own session (the same command again resumes it): leave out --resume and --rerun-stage",
        );
    }
    let json = args.format == SummaryFormat::Json;
    let job = match set_up(ws, &file, &r, &provider, json) {
        Ok(job) => job,
        Err(e) => return fail(e),
    };
    let never_sent =
        match tokio::task::block_in_place(|| output::never_sent(&job.dir, &job.requests)) {
            Ok(n) => n,
            Err(e) => return fail(e),
        };
    match latest_session(&job.dir) {
        Err(e) => return fail(e),
        Ok(Some((id, state))) if state == "completed" && never_sent > 0 => {
            job.note(&format!(
                "Session {id} finished with {never_sent} line(s) never sent (--limit): a new session sends them \
                 (and the lines that ended in error, again)."
            ));
        }
        Ok(Some((id, state))) if state == "completed" => {
            job.note(&format!(
                "Session {id} of {} has finished: nothing is sent (remove {} to send the file anew).",
                file.display(),
                job.dir.display()
            ));
            let (code, doc) = job.finish(0, args.dry_run);
            if let (true, Some(doc)) = (json, doc) {
                super::print_json(&json!({ "session_id": id, "requests": doc }));
            }
            return code;
        }
        Ok(Some((id, _))) => {
            job.note(&format!("Resuming session {id} of {}.", file.display()));
            args.resume = Some(id);
        }
        Ok(None) => {}
    }
    let dir = job.dir.clone();
    let dry_run = args.dry_run;
    let after = Box::new(move |code| job.finish(code, dry_run));
    super::run::batch_adjudicate_then(&dir, args, console, after).await
}

/// Read the file, say its bad lines, make its job's folder and import its
/// good lines. Err when nothing can go.
fn set_up(
    ws: &Path,
    file: &Path,
    r: &crate::cli::RequestsArgs,
    provider: &str,
    json: bool,
) -> Result<Job, String> {
    let read = tokio::task::block_in_place(|| lines::read(file))?;
    for b in &read.bad {
        say_error(format!("{}:{}: {}", file.display(), b.line, b.reason));
    }
    if !read.bad.is_empty() && r.strict {
        return Err(format!(
            "{}: {} bad line(s): nothing was sent (--strict)",
            file.display(),
            read.bad.len()
        ));
    }
    if read.requests.is_empty() {
        return Err(format!("{}: no request to send", file.display()));
    }
    let dir = place::prepare(ws, file, &read, r, provider)?;
    let job = Job {
        file: file.to_path_buf(),
        out: r
            .output
            .clone()
            .unwrap_or_else(|| place::default_output(file)),
        dir,
        requests: read.requests,
        bad: read.bad,
        json,
    };
    job.note(&format!(
        "Requests: {} line(s) of {} ({} bad); the job and its ledger are in {}",
        job.requests.len(),
        file.display(),
        job.bad.len(),
        job.dir.display()
    ));
    tokio::task::block_in_place(|| import(&job))?;
    Ok(job)
}

/// The good lines as items of the job's ledger (an id already there is
/// left as it is).
fn import(job: &Job) -> Result<(), String> {
    let mut ledger = LedgerLocation::for_workspace(&job.dir)
        .and_then(Ledger::open)
        .map_err(|e| e.to_string())?;
    let mut batch = ledger
        .begin_import(&job.file.display().to_string())
        .map_err(|e| e.to_string())?;
    for r in &job.requests {
        batch
            .add(
                &r.custom_id,
                &docket_model::evidence::Evidence::of_value(&r.evidence),
                r.line,
            )
            .map_err(|e| e.to_string())?;
    }
    batch.commit().map_err(|e| e.to_string())
}

/// The job's newest session and its state, if it has one.
fn latest_session(dir: &Path) -> Result<Option<(String, String)>, String> {
    let ledger = LedgerLocation::for_workspace(dir)
        .and_then(Ledger::open_read_only)
        .map_err(|e| e.to_string())?;
    let Some(id) = ledger.latest_session().map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    Ok(ledger
        .load_session(&id)
        .map_err(|e| e.to_string())?
        .map(|row| (id, row.state)))
}
