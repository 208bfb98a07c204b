use clap::CommandFactory;

use super::Cli;

/// Every command a user can run, with its path (`ledger copy`).
fn leaves(cmd: &clap::Command, path: &str, out: &mut Vec<(String, clap::Command)>) {
    for sub in cmd.get_subcommands() {
        let name = format!("{path} {}", sub.get_name()).trim().to_string();
        if sub.has_subcommands() {
            leaves(sub, &name, out);
        } else {
            out.push((name, sub.clone()));
        }
    }
}

#[test]
fn every_command_has_an_example_and_describes_its_arguments() {
    let mut all = Vec::new();
    leaves(&Cli::command(), "", &mut all);
    assert!(all.len() >= 17, "{} commands", all.len());
    for (name, cmd) in &all {
        let after = cmd
            .get_after_help()
            .map(|h| h.to_string())
            .unwrap_or_default();
        assert!(
            after.starts_with("Examples:") && after.contains(&format!("docket {name}")),
            "`docket {name} --help` has no example of itself: {after:?}"
        );
        for arg in cmd.get_positionals() {
            assert!(
                arg.get_help()
                    .is_some_and(|h| !h.to_string().trim().is_empty()),
                "`docket {name}`: the argument <{}> is not described",
                arg.get_id()
            );
        }
    }
}
