//! The console's options, shared by the commands that open it.

use std::path::PathBuf;

use clap::Args;

/// How the console looks and what it may do: options of `docket` (bare),
/// `console`, `review`, and `batch-adjudicate`/`demo` (they open the console
/// on a terminal), not global, so no other command's `--help` lists them.
#[derive(Debug, Args, Clone, Default)]
pub struct ConsoleArgs {
    /// Watch only: no decisions, no run controls.
    #[arg(long)]
    pub read_only: bool,
    /// No colour (also when NO_COLOR is set). States keep their words and glyphs.
    #[arg(long)]
    pub no_color: bool,
    /// A keymap.toml overriding the default bindings, binding by binding
    /// (default: keymap.toml in the config dir).
    #[arg(long, value_name = "PATH")]
    pub keymap: Option<PathBuf>,
    /// Clicks focus a pane and select a row, the wheel scrolls (off by
    /// default, so the terminal's text selection works; `mouse = true` in
    /// console.toml in the config dir turns it on too).
    #[arg(long)]
    pub mouse: bool,
    /// Print the effective keymap (defaults plus overrides) and exit.
    #[arg(long)]
    pub print_keymap: bool,
}

impl ConsoleArgs {
    /// The options given before the command name (`docket --read-only
    /// console`, as when they were global) joined with the command's own
    /// (`docket console --read-only`): a flag given either place counts, and
    /// the command's own `--keymap` wins.
    pub fn or(self, before: &ConsoleArgs) -> ConsoleArgs {
        ConsoleArgs {
            read_only: self.read_only || before.read_only,
            no_color: self.no_color || before.no_color,
            keymap: self.keymap.or_else(|| before.keymap.clone()),
            mouse: self.mouse || before.mouse,
            print_keymap: self.print_keymap || before.print_keymap,
        }
    }
}
