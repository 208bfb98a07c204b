//! Every test binary starts with the developer's ledger settings cleared.
//!
//! docket takes its ledger from `DOCKET_LEDGER_URL` before the workspace's own
//! file, and libpq-style `PGPASSWORD` fills a URL's password. A developer who
//! exported them for a manual PostgreSQL run would otherwise point every test
//! (the commands they start, the tmux consoles, the in-process engines) at
//! that database. Tests that want PostgreSQL set the URL on their own
//! commands.
//!
//! The clearing runs from `.init_array`, before `main` and before the test
//! harness starts any thread, which is the one moment `remove_var` is sound.

#[cfg(target_os = "linux")]
#[used]
#[unsafe(link_section = ".init_array")]
static CLEAR_LEDGER_ENV: extern "C" fn() = clear_ledger_env;

#[cfg(target_os = "linux")]
extern "C" fn clear_ledger_env() {
    for name in [docket::ledger::location::LEDGER_URL_ENV, "PGPASSWORD"] {
        // SAFETY: runs before main, while the process has a single thread.
        unsafe { std::env::remove_var(name) };
    }
}

/// Whether the start-up clearing ran (a test asserts it, so a platform or
/// linker that drops `.init_array` entries is noticed, not trusted).
pub fn ledger_env_cleared() -> bool {
    std::env::var_os(docket::ledger::location::LEDGER_URL_ENV).is_none()
        && std::env::var_os("PGPASSWORD").is_none()
}
