//! `docket completions SHELL` and `docket man`: docket's command line
//! described for shells and for man(1), from the same clap command that
//! parses it (so they cannot drift from the real flags).

use std::io::Write;
use std::path::Path;

use crate::cli::about;

/// The completion script for `shell` on standard output.
pub fn completions(shell: clap_complete::Shell) -> i32 {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut about::command(), "docket", &mut script);
    print_all(&script)
}

/// The top command's man page on standard output, or with `out` a page per
/// command (docket.1, docket-batch-adjudicate.1, ...) written into `out`.
pub fn man(out: Option<&Path>) -> i32 {
    let Some(dir) = out else {
        let mut page = Vec::new();
        if let Err(e) = clap_mangen::Man::new(about::command()).render(&mut page) {
            return super::fail(format!("man: {e}"));
        }
        return print_all(&page);
    };
    if let Err(e) = std::fs::create_dir_all(dir) {
        return super::fail(format!("{}: {e}", dir.display()));
    }
    match clap_mangen::generate_to(about::command(), dir) {
        Ok(()) => {
            println!("man pages written to {}", dir.display());
            0
        }
        Err(e) => super::fail(format!("{}: {e}", dir.display())),
    }
}

/// Standard output, exact; a closed pipe (`| head`) is not an error.
fn print_all(bytes: &[u8]) -> i32 {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => 0,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(e) => super::fail(format!("standard output: {e}")),
    }
}
