//! `docket calibrate`: how often humans agreed with the model per
//! confidence band, the precision the session's auto-accept threshold gave,
//! and the lowest threshold whose measured precision reaches a target;
//! `--apply` writes that threshold into docket.toml. The arithmetic is
//! `docket_model::calibration`, the ledger reads `docket_ledger::calibration`.

use std::io::Write as _;
use std::path::Path;

use docket::config::{CONFIG_FILE, LoadedConfig, edit};
use docket::ledger::Ledger;
use docket::ledger::work::RunSessions;
use docket_model::calibration as cal;

use super::data_out;
use super::ledger::{with_ledger, with_ledger_reading};
use crate::cli::{CalibrateArgs, SummaryFormat};

mod render;

/// Everything calibrate found, for the text and the JSON: the session's
/// calibration summary (read through `Deref`), and what was asked.
pub(super) struct Calibration {
    pub session: String,
    pub summary: cal::Summary,
    /// `--apply` was given (the text then says what happened to docket.toml).
    pub apply: bool,
}

impl std::ops::Deref for Calibration {
    type Target = cal::Summary;

    fn deref(&self) -> &cal::Summary {
        &self.summary
    }
}

pub(super) fn calibrate(ws: &Path, args: CalibrateArgs) -> i32 {
    if let Some(target) = args.target
        && !(target > 0.0 && target <= 1.0)
    {
        return super::fail(format!(
            "--target-precision {target} is out of range (above 0, at most 1)"
        ));
    }
    let body = |l: &Ledger| -> Result<(), String> {
        let c = compute(l, &args)?;
        let applied = if args.apply { apply(ws, l, &c)? } else { None };
        let out = match args.format {
            SummaryFormat::Json => format!("{}\n", render::json(&c, applied.as_ref())),
            SummaryFormat::Table => render::text(&c, applied.as_ref()),
        };
        super::reports::quiet_when_unread(data_out().write_all(out.as_bytes()).map_err(Into::into))
    };
    if args.apply {
        with_ledger(ws, body)
    } else {
        with_ledger_reading(ws, body)
    }
}

fn compute(l: &Ledger, args: &CalibrateArgs) -> Result<Calibration, String> {
    let session = match &args.session {
        Some(s) => s.clone(),
        None => l
            .latest_session()
            .map_err(|e| e.to_string())?
            .ok_or_else(|| {
                "no session in this ledger yet: run `docket batch-adjudicate` first".to_string()
            })?,
    };
    let input = l
        .calibration_input(&session)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| docket::ids::unknown_session(&session))?;
    let target = args.target.unwrap_or_else(|| input.target_precision());
    Ok(Calibration {
        session,
        summary: input.summary(target),
        apply: args.apply,
    })
}

/// What `--apply` did.
pub(super) struct Applied {
    pub path: String,
    pub before: f64,
    pub after: f64,
}

/// Write the suggested threshold into docket.toml (every other byte kept),
/// after the loader accepted the new text; record it on the session.
/// `None`: nothing to write (no suggestion, or it is already the value).
fn apply(ws: &Path, l: &Ledger, c: &Calibration) -> Result<Option<Applied>, String> {
    let Some(s) = &c.suggestion else {
        return Ok(None);
    };
    let path = ws.join(CONFIG_FILE);
    let old = LoadedConfig::load(&path).map_err(|e| e.to_string())?;
    let before = *old.config.routing.auto_accept_threshold.get_ref();
    if (before - s.threshold).abs() < 1e-9 {
        return Ok(None);
    }
    let source = docket_model::files::read_text_file(&path)
        .map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
    let text = edit::set_routing_value(&source, "auto_accept_threshold", s.threshold)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let new = LoadedConfig::parse(&path, text.clone())
        .map_err(|e| format!("the new threshold was not written: {e}"))?;
    let written = *new.config.routing.auto_accept_threshold.get_ref();
    if (written - s.threshold).abs() > 1e-9 {
        return Err(format!(
            "{}: the edit did not take (the loader reads auto_accept_threshold = {written}); \
             nothing was written",
            path.display()
        ));
    }
    write_replacing(&path, &text)?;
    let message = format!(
        "docket calibrate --apply: routing.auto_accept_threshold {before} -> {} \
         (target precision {}, measured on session {})",
        s.threshold, c.target, c.session
    );
    let actor = docket::ledger::review::Operator::current().actor();
    l.record_config_change(&c.session, &message, &actor)
        .map_err(|e| e.to_string())?;
    Ok(Some(Applied {
        path: path.display().to_string(),
        before,
        after: s.threshold,
    }))
}

/// Replace the file whole: a temporary file beside it, renamed over it, so
/// a crash leaves the old file or the new one, never half of one.
fn write_replacing(path: &Path, text: &str) -> Result<(), String> {
    let io = |e: std::io::Error| format!("{}: cannot write: {e}", path.display());
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(".calibrate-tmp");
    let tmp = std::path::PathBuf::from(tmp_name);
    let written = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        if let Ok(meta) = std::fs::metadata(path) {
            std::fs::set_permissions(&tmp, meta.permissions())?;
        }
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map_err(io)
}
