use clap::{CommandFactory, Parser};

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

/// The console's own options, which only the commands that open it take.
const CONSOLE_FLAGS: [&str; 5] = [
    "--read-only",
    "--no-color",
    "--keymap",
    "--mouse",
    "--print-keymap",
];

#[test]
fn console_options_appear_only_in_the_help_of_commands_that_open_the_console() {
    let mut root = Cli::command();
    root.build();
    let mut all = Vec::new();
    leaves(&root, "", &mut all);
    let opens_console = ["console", "review", "demo", "batch-adjudicate"];
    let top = root.render_long_help().to_string();
    for flag in CONSOLE_FLAGS {
        assert!(top.contains(flag), "`docket --help` lacks {flag}");
    }
    // `build` adds clap's own `help` subcommands: they are not docket's.
    all.retain(|(name, _)| !name.split(' ').any(|w| w == "help"));
    assert!(all.len() >= 17, "{} commands", all.len());
    for (name, cmd) in &mut all {
        let help = cmd.render_long_help().to_string();
        for flag in CONSOLE_FLAGS {
            assert_eq!(
                help.contains(flag),
                opens_console.contains(&name.as_str()),
                "`docket {name} --help` and {flag}:\n{help}"
            );
        }
        // The workspace and ledger stay global, but not where no workspace
        // is read.
        let reads_none = ["mock-provider", "completions", "man"].contains(&name.as_str());
        for flag in ["--workspace", "--ledger"] {
            assert_eq!(
                help.contains(flag),
                !reads_none,
                "`docket {name} --help` and {flag}"
            );
        }
    }
}

#[test]
fn console_options_parse_before_and_after_the_command_and_nowhere_else() {
    for line in [
        "docket --read-only",
        "docket --read-only console",
        "docket console --read-only --no-color --keymap k.toml",
        "docket review --no-color --mouse",
        "docket --no-color review",
        "docket run --no-color -y",
        "docket demo --headless --no-color",
        "docket sessions --workspace ws --ledger postgres://u@h/db",
        "docket --workspace ws man",
        "docket completions bash --workspace ws",
    ] {
        let parsed = Cli::try_parse_from(line.split(' '));
        assert!(parsed.is_ok(), "{line}: {:?}", parsed.err());
    }
    for line in [
        "docket mock-provider --read-only",
        "docket sessions --no-color",
        "docket completions bash --mouse",
        "docket export --keymap k.toml",
    ] {
        let err = Cli::try_parse_from(line.split(' ')).expect_err(line);
        assert_eq!(
            err.kind(),
            clap::error::ErrorKind::UnknownArgument,
            "{line}"
        );
    }
}

#[test]
fn console_options_before_the_command_join_those_after_it() {
    let cli = Cli::try_parse_from(["docket", "--read-only", "review", "--no-color"]).unwrap();
    let Some(super::Command::Review { console }) = &cli.command else {
        panic!("{cli:?}")
    };
    let joined = console.clone().or(&cli.console);
    assert!(joined.read_only && joined.no_color && !joined.mouse);
}
