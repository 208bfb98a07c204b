//! Named failpoints at each durable step (issue 12, fault-matrix row P4),
//! compiled in only with the `failpoints` feature (the tests and the soak
//! turn it on; a release build has none: `hit` is an empty inline function).
//!
//! `DOCKET_FAILPOINT=NAME:N` makes the process SIGKILL itself the Nth time it
//! passes `NAME` (N defaults to 1), exactly like `kill -9` at that step: no
//! destructor, no flush, no commit. `NAME:N:panic` panics there instead
//! (row P6: a bug in one request's handling); `NAME:N+:panic` panics at
//! the Nth pass and every pass after it. `NAME:N:oom` exhausts memory
//! there (row P6, memory pressure): it allocates 64 MiB blocks until an
//! allocation fails, which aborts the process the way Rust does on
//! allocation failure; it only runs under an address-space limit
//! (`ulimit -v`), and panics without one rather than take the machine's
//! memory. The names:
//!
//! | name | the step just done, the next not yet |
//! |---|---|
//! | `after_claim` | a page of items claimed and committed, no work started |
//! | `after_intent` | an attempt's row committed, its request not sent |
//! | `after_answer` | an answer received, not yet committed |
//! | `mid_ingest` | a batch's result lines read in part (each line is one pass) |
//! | `after_upload` | a batch's input file uploaded, the batch not created |
//! | `after_create` | a batch created at the provider, not yet recorded |
//! | `mid_migration` | one ledger migration applied in its transaction, not committed |
//! | `mid_export` | an export written in part (each row is one pass) |

/// Every failpoint, for the soak's plans.
pub const NAMES: &[&str] = &[
    "after_claim",
    "after_intent",
    "after_answer",
    "mid_ingest",
    "after_upload",
    "after_create",
    "mid_migration",
    "mid_export",
];

/// The environment variable that arms one failpoint.
pub const ENV: &str = "DOCKET_FAILPOINT";

#[cfg(feature = "failpoints")]
mod armed {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// One armed step: its name, the pass it fires at, whether it fires
    /// at every pass from then on (`N+`), whether it panics, and the
    /// passes so far.
    pub(super) struct Armed {
        name: String,
        at: u64,
        onward: bool,
        action: Action,
        passes: AtomicU64,
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(super) enum Action {
        Kill,
        Panic,
        Oom,
    }

    static ARMED: OnceLock<Option<Armed>> = OnceLock::new();

    pub(super) fn parse(spec: &str) -> Option<Armed> {
        let mut parts = spec.split(':').map(str::trim);
        let name = parts.next().filter(|n| !n.is_empty())?;
        let (at, onward) = match parts.next() {
            Some(n) => match n.strip_suffix('+') {
                Some(n) => (n.parse().ok()?, true),
                None => (n.parse().ok()?, false),
            },
            None => (1, false),
        };
        let action = match parts.next() {
            None => Action::Kill,
            Some("panic") => Action::Panic,
            Some("oom") => Action::Oom,
            Some(_) => return None,
        };
        Some(Armed {
            name: name.to_string(),
            at,
            onward,
            action,
            passes: AtomicU64::new(0),
        })
    }

    pub fn hit(name: &str) {
        let armed = ARMED.get_or_init(|| std::env::var(super::ENV).ok().and_then(|s| parse(&s)));
        let Some(a) = armed else {
            return;
        };
        if a.name != name {
            return;
        }
        let pass = a.passes.fetch_add(1, Ordering::SeqCst) + 1;
        if pass != a.at && !(a.onward && pass > a.at) {
            return;
        }
        match a.action {
            Action::Panic => panic!("failpoint {name}"),
            Action::Oom => exhaust_memory(name),
            Action::Kill => {}
        }
        // SAFETY: kill(2) on our own pid with SIGKILL; nothing after it runs.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
        // SIGKILL is delivered before kill returns to a single target
        // that is the caller; never reached.
        std::process::abort();
    }

    /// Allocate memory until the address-space limit refuses a
    /// block: `handle_alloc_error` then aborts the process (SIGABRT), as it
    /// would for any allocation under memory pressure.
    fn exhaust_memory(name: &str) -> ! {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit(2) writes the struct we pass.
        let got = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut limit) };
        if got != 0 || limit.rlim_cur == libc::RLIM_INFINITY {
            panic!("failpoint {name}: oom needs an address-space limit (ulimit -v)");
        }
        const BLOCK: usize = 64 << 20;
        let Ok(layout) = std::alloc::Layout::from_size_align(BLOCK, 4096) else {
            std::process::abort()
        };
        // Held, never freed: the process ends in this loop.
        let mut held: Vec<*mut u8> = Vec::new();
        loop {
            // SAFETY: a non-zero size; a null pointer is handled below.
            let p = unsafe { std::alloc::alloc(layout) };
            if p.is_null() {
                std::alloc::handle_alloc_error(layout);
            }
            // Not touched: the address-space limit counts what is
            // reserved, so the limit is met without taking real memory.
            held.push(p);
        }
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn a_spec_names_the_step_the_pass_and_the_action() {
            let a = super::parse("after_intent:37").unwrap();
            assert_eq!(
                (a.name.as_str(), a.at, a.onward, a.action),
                ("after_intent", 37, false, super::Action::Kill)
            );
            let a = super::parse("mid_export").unwrap();
            assert_eq!((a.name.as_str(), a.at, a.onward), ("mid_export", 1, false));
            let a = super::parse("after_answer:5:panic").unwrap();
            assert_eq!((a.at, a.onward, a.action), (5, false, super::Action::Panic));
            let a = super::parse("after_answer:5+:panic").unwrap();
            assert_eq!((a.at, a.onward, a.action), (5, true, super::Action::Panic));
            let a = super::parse("after_answer:3:oom").unwrap();
            assert_eq!((a.at, a.action), (3, super::Action::Oom));
            assert!(super::parse("after_claim:x").is_none());
            assert!(super::parse("after_claim:+").is_none());
            assert!(super::parse("after_claim:2:explode").is_none());
        }
    }
}

/// Passing the step `name` (one of `NAMES`).
#[cfg(feature = "failpoints")]
pub fn hit(name: &str) {
    debug_assert!(NAMES.contains(&name), "unknown failpoint {name}");
    armed::hit(name);
}

/// Passing the step `name`: nothing, without the `failpoints` feature.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_name: &str) {}
