//! Simulated power loss (fault-matrix row P7) without FUSE: docket runs with
//! `sync_log.c` preloaded, which records the size of every file as each
//! sync starts, with its inode. After a SIGKILL, `lose_unsynced` cuts the
//! ledger's WAL back to the last size synced of that very file (a WAL that
//! SQLite deleted and made again starts from nothing) and drops its `-shm`:
//! what a power loss at that moment could leave. SQLite only appends to the WAL until a checkpoint
//! restarts it, so a cut at the synced size loses exactly the commits that
//! were never synced (`synchronous = NORMAL`) and keeps every durable one.
//!
//! The one case it cannot model is a WAL restarted after a checkpoint (new
//! frames written over old ones below the synced size): those runs are
//! counted apart (`Loss::checkpointed`), and the simulation there can only
//! keep too much, never lose a synced commit.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const SOURCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src/sync_log.c");

/// The environment variable `sync_log.c` writes to.
pub const LOG_ENV: &str = "DOCKET_SYNC_LOG";

/// The recorder, compiled once per test process.
pub fn recorder() -> &'static Path {
    static SO: OnceLock<PathBuf> = OnceLock::new();
    SO.get_or_init(|| preload_library(SOURCE, "sync-log"))
}

/// A C source built into a shared library to preload, with the C compiler
/// Rust links with (`CC`, else `cc`), in the temp folder.
pub fn preload_library(source: &str, name: &str) -> PathBuf {
    let out = std::env::temp_dir().join(format!("docket-{name}-{}.so", std::process::id()));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&out)
        .arg(source)
        .arg("-ldl")
        .status()
        .unwrap_or_else(|e| panic!("run {cc} to build {source}: {e}"));
    assert!(status.success(), "{cc} could not build {source}");
    out
}

/// Preload the recorder into `cmd`, logging to `log`. The WAL's size and
/// inode now are on record first: a run that never syncs still keeps what
/// was on disk when it started.
pub fn arm(cmd: &mut Command, log: &Path, ledger: &Path) {
    use std::os::unix::fs::MetadataExt;
    let wal = wal_of(ledger);
    if let Ok(m) = std::fs::metadata(&wal) {
        let line = format!("{}\t{}\t{}\n", canonical(&wal).display(), m.len(), m.ino());
        append(log, &line);
    }
    cmd.env("LD_PRELOAD", recorder()).env(LOG_ENV, log);
}

/// What one simulated power loss did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Loss {
    /// WAL bytes written but never synced, now gone.
    pub wal_bytes_lost: u64,
    /// The killed run synced the database file itself (a checkpoint ran),
    /// so its WAL may have restarted: the cut there can keep unsynced
    /// frames (never lose synced ones).
    pub checkpointed: bool,
}

/// Cut the ledger's WAL to its last synced size and remove its `-shm`.
/// Call it after the process died and before anything opens the ledger
/// (a clean close checkpoints and deletes the WAL).
pub fn lose_unsynced(log: &Path, ledger: &Path) -> Loss {
    use std::os::unix::fs::MetadataExt;
    let wal = wal_of(ledger);
    let wal_name = canonical(&wal);
    let db_name = canonical(ledger);
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut loss = Loss::default();
    let Ok(meta) = std::fs::metadata(&wal) else {
        let _ = std::fs::remove_file(shm_of(ledger));
        let _ = std::fs::remove_file(log);
        return loss;
    };
    // The last size synced of this very file (its inode): a WAL that
    // SQLite deleted and made again during the run starts from nothing.
    let mut synced = 0;
    for line in text.lines() {
        let mut fields = line.rsplitn(3, '\t');
        let (Some(ino), Some(size), Some(path)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let (Ok(ino), Ok(size)) = (ino.parse::<u64>(), size.parse::<u64>()) else {
            continue;
        };
        if Path::new(path) == wal_name && ino == meta.ino() {
            synced = size;
        } else if Path::new(path) == db_name {
            loss.checkpointed = true;
        }
    }
    if meta.len() > synced {
        loss.wal_bytes_lost = meta.len() - synced;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&wal)
            .expect("open the WAL to cut it");
        f.set_len(synced).expect("cut the WAL");
    }
    let _ = std::fs::remove_file(shm_of(ledger));
    // The next run starts a new log.
    let _ = std::fs::remove_file(log);
    loss
}

fn wal_of(ledger: &Path) -> PathBuf {
    suffixed(ledger, "-wal")
}

fn shm_of(ledger: &Path) -> PathBuf {
    suffixed(ledger, "-shm")
}

fn suffixed(ledger: &Path, suffix: &str) -> PathBuf {
    let mut s = ledger.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// The path as `/proc/self/fd` shows it (temp folders may sit behind a
/// symlink); a file not there yet resolves through its folder.
fn canonical(p: &Path) -> PathBuf {
    if let Ok(c) = p.canonicalize() {
        return c;
    }
    match (
        p.parent().and_then(|d| d.canonicalize().ok()),
        p.file_name(),
    ) {
        (Some(d), Some(n)) => d.join(n),
        _ => p.to_path_buf(),
    }
}

fn append(log: &Path, line: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("open the sync log");
    f.write_all(line.as_bytes()).expect("write the sync log");
}
