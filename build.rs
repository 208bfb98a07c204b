//! Records the git commit docket is built from, for `docket --version`.
//! A build from a tarball, or without git installed, says "unknown" and
//! never fails.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    // Only docket's own checkout counts, not a repository a source tarball
    // happens to be unpacked in.
    // (Both canonical: a checkout reached through a symlink is still its own.)
    let real = |p: &std::ffi::OsStr| std::fs::canonicalize(p).ok();
    let own_checkout = git(&["rev-parse", "--show-toplevel"]).is_some_and(|top| {
        std::env::var_os("CARGO_MANIFEST_DIR")
            .is_some_and(|dir| real(&dir).is_some() && real(&dir) == real(top.as_ref()))
    });
    let commit = own_checkout
        .then(|| git(&["rev-parse", "--short", "HEAD"]))
        .flatten()
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=DOCKET_GIT_COMMIT={commit}");
    // Rebuild when HEAD moves: HEAD itself (a checkout), the branch it
    // names (a commit) and packed-refs. `--git-path` finds them in a
    // worktree too, where .git is a file. Only existing files are named:
    // cargo reruns on every build for a path that does not exist.
    let mut watched = vec!["HEAD".to_string(), "packed-refs".to_string()];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(branch);
    }
    for name in watched.into_iter().filter(|_| own_checkout) {
        if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", &name])
            && std::path::Path::new(&path).exists()
        {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}
