//! The audit sample's shares and the run's completion mode, as read from
//! `docket.toml`.

use super::*;

#[test]
fn audit_shares_default_to_none_and_are_checked() {
    let c = parse(BASE).unwrap();
    assert_eq!(*c.config.routing.audit_accept_share.get_ref(), 0.0);
    let c = parse(&format!("{BASE}\n[routing]\naudit_accept_share = 0.1\n")).unwrap();
    assert_eq!(*c.config.routing.audit_accept_share.get_ref(), 0.1);
    let e = parse(&format!("{BASE}\n[routing]\naudit_reject_share = 1.5\n"))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("routing.audit_reject_share") && e.contains("out of range"),
        "{e}"
    );
}

#[test]
fn completion_mode_defaults_to_exact_and_names_the_allowed_values() {
    let c = parse(BASE).unwrap();
    assert_eq!(c.config.job.completion_mode, CompletionMode::Exact);
    let c = parse(&format!("[job]\ncompletion_mode = \"best_effort\"\n{BASE}")).unwrap();
    assert_eq!(c.config.job.completion_mode, CompletionMode::BestEffort);
    let e = parse(&format!("[job]\ncompletion_mode = \"fast\"\n{BASE}"))
        .err()
        .unwrap()
        .to_string();
    assert!(e.starts_with("ws/docket.toml:2"), "{e}");
    assert!(e.contains("completion_mode"), "{e}");
    for name in COMPLETION_MODES {
        assert!(e.contains(name), "{e}");
    }
}
