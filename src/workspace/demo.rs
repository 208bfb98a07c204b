//! The demo's workspace: the critic example (a generator, then a critic of
//! every answer) with an audit sample and a readable review line, so a
//! first run shows critic verdicts on the review cards and a calibration
//! view. A marker file says the folder is the demo's: `docket demo` wipes
//! its ledger, so it never does that to a workspace it did not write.

use std::path::Path;

use super::{Example, WorkspaceError, init_example};

/// The file that marks a folder as `docket demo`'s.
pub const DEMO_MARKER: &str = ".docket-demo";

/// The share of would-be auto-accepts the demo also sends to review: on
/// 500 items about 35 audit items, enough for the calibration to measure
/// the accepted band.
const AUDIT_ACCEPT_SHARE: f64 = 0.1;
/// The same for would-be rejects (fewer: they are few).
const AUDIT_REJECT_SHARE: f64 = 0.1;

/// The demo's request rate: the example's 1200 a minute, doubled.
const DEMO_RPM: u64 = 2400;

/// The queue's line for a chart entry (the default workspace's).
const REVIEW_SUMMARY: &str = "\n# How an item reads in review: the queue's line.\n[review]\n\
    summary = \"{{ artist }} – {{ title }} · {{ chart }}, {{ week }}, {{ position }}\"\n";

/// Whether `dir` may be used by the demo: it has no docket.toml, or the
/// demo wrote it.
fn demo_may_use(dir: &Path) -> bool {
    !dir.join("docket.toml").exists() || dir.join(DEMO_MARKER).exists()
}

/// Write the demo's scaffold into `dir` (over an earlier demo's), unless
/// `keep` and there is one. Refused for a workspace the demo did not write,
/// unless `dir` is docket's own demo folder (`demo_dir`: a demo of an
/// older docket wrote no marker there).
pub fn init_demo(dir: &Path, keep: bool) -> Result<(), WorkspaceError> {
    if dir != super::demo_dir() && !demo_may_use(dir) {
        return Err(WorkspaceError::NotDemo(dir.display().to_string()));
    }
    if keep && dir.join("docket.toml").exists() {
        return Ok(());
    }
    init_example(dir, true, Some(Example::Critic))?;
    let path = dir.join("docket.toml");
    let io = |source| WorkspaceError::Io {
        path: path.display().to_string(),
        source,
    };
    let mut text = std::fs::read_to_string(&path).map_err(io)?;
    for (key, share) in [
        ("audit_reject_share", AUDIT_REJECT_SHARE),
        ("audit_accept_share", AUDIT_ACCEPT_SHARE),
    ] {
        text = crate::config::edit::set_routing_value(&text, key, share).map_err(|e| {
            WorkspaceError::Io {
                path: path.display().to_string(),
                source: std::io::Error::other(e.to_string()),
            }
        })?;
    }
    // The critic doubles the requests: twice the example's request rate
    // keeps the demo as quick as the one-stage job was (the mock takes it).
    text = text.replacen(
        "requests_per_minute = 1200",
        &format!("requests_per_minute = {DEMO_RPM}"),
        1,
    );
    text.push_str(REVIEW_SUMMARY);
    // not a ledger file: the demo's docket.toml.
    std::fs::write(&path, text).map_err(io)?;
    let marker = dir.join(DEMO_MARKER);
    // not a ledger file: the demo's marker.
    std::fs::write(
        &marker,
        "written by `docket demo`; its ledger is wiped on each demo\n",
    )
    .map_err(|source| WorkspaceError::Io {
        path: marker.display().to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The demo's job loads: two stages (the generator and its critic), an
    /// audit sample both ways, and a review summary template.
    #[test]
    fn the_demo_job_has_a_critic_an_audit_sample_and_a_review_line() {
        let d = tempfile::tempdir().unwrap();
        init_demo(d.path(), false).unwrap();
        let cfg = crate::config::LoadedConfig::load(&d.path().join("docket.toml")).unwrap();
        let names: Vec<&str> = cfg.config.stages.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["adjudicate", "critic"]);
        assert_eq!(*cfg.config.routing.audit_accept_share.get_ref(), 0.1);
        assert_eq!(*cfg.config.routing.audit_reject_share.get_ref(), 0.1);
        let main = &cfg.config.providers["main"];
        assert_eq!(*main.requests_per_minute.get_ref(), DEMO_RPM);
        assert!(!cfg.config.review.is_empty(), "a [review] section");
        // Again: the earlier demo's scaffold is rewritten, not refused.
        init_demo(d.path(), false).unwrap();
        // A workspace the demo did not write is refused, and left alone.
        let other = tempfile::tempdir().unwrap();
        crate::workspace::init(other.path(), false).unwrap();
        let before = std::fs::read(other.path().join("docket.toml")).unwrap();
        assert!(matches!(
            init_demo(other.path(), false),
            Err(WorkspaceError::NotDemo(_))
        ));
        assert_eq!(
            std::fs::read(other.path().join("docket.toml")).unwrap(),
            before
        );
    }
}
