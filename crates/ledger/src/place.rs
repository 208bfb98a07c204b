//! Where a SQLite ledger file lives, checked without opening it (fault-matrix
//! row D4). A second descriptor on a database file is never opened: closing
//! it would drop every POSIX lock this process holds on the file, SQLite's
//! included. And SQLite's WAL mode needs locks and shared memory that a
//! network filesystem does not give reliably.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Whether this process may write `path` (a file, or a folder to create
/// files in), by access(2): nothing is opened.
pub fn writable(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
    unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
}

/// Filesystems that are not this machine's disk, by `statfs` magic
/// number (linux/magic.h and the filesystems' own headers).
const NETWORK: &[(i64, &str)] = &[
    (0x6969, "NFS"),
    (0x517B, "SMB"),
    (0xFF53_4D42, "CIFS"),
    (0xFE53_4D42, "SMB2"),
    (0x0102_1997, "9P"),
    (0x00C3_6400, "Ceph"),
    (0x5346_414F, "AFS"),
    (0x7375_7245, "Coda"),
    (0x0116_1970, "GFS2"),
    (0x7461_636F, "OCFS2"),
    (
        0x6573_5546,
        "FUSE (sshfs, s3fs and other userspace filesystems)",
    ),
];

/// The network (or userspace) filesystem `dir` is on, if any.
pub fn network_filesystem(dir: &Path) -> Option<&'static str> {
    let c = CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statfs fills the zeroed struct we own; `c` outlives the call.
    let magic = unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        if libc::statfs(c.as_ptr(), &mut st) != 0 {
            return None;
        }
        st.f_type as i64
    };
    named(magic)
}

fn named(magic: i64) -> Option<&'static str> {
    // f_type is a signed word on some targets: CIFS's magic comes back
    // negative there.
    let magic = magic & 0xFFFF_FFFF;
    NETWORK
        .iter()
        .find(|(m, _)| *m == magic)
        .map(|(_, name)| *name)
}

/// What to tell the operator about a SQLite ledger in `dir`, if anything.
pub fn network_warning(dir: &Path) -> Option<String> {
    let fs = network_filesystem(dir)?;
    Some(format!(
        "{} is on a {fs} filesystem: SQLite's locks and WAL shared memory are not reliable there, and two \
         processes (or hosts) may corrupt the ledger. Keep the workspace on a local disk, or put the ledger on \
         PostgreSQL (DOCKET_LEDGER_URL) when several machines share a job",
        dir.display()
    ))
}

/// The WAL-index header SQLite keeps at the start of a `-shm` file (its
/// `wal.c`): two copies of a 48-byte header, then the checkpoint info, all
/// in the writer's native byte order.
const SHM_HEAD: usize = 136;
const WAL_INDEX_VERSION: u32 = 3_007_000;

/// Row D4, a `-wal` deleted after a crash: when the ledger's `-wal` is
/// gone but its `-shm` remains and says the log held committed frames not
/// yet copied into the database, those transactions were lost with it.
/// SQLite would open the file as of its last checkpoint and rebuild the
/// `-shm`, without a word; this says how many frames are missing.
///
/// The `-shm` is read only while the `-wal` is gone: SQLite keeps the
/// `-wal` while any connection has the ledger open, so no connection of
/// this process holds a lock on the `-shm` that closing the read drops.
pub fn lost_wal_frames(ledger: &Path) -> Option<u32> {
    let sibling = |suffix: &str| {
        let mut p = ledger.as_os_str().to_owned();
        p.push(suffix);
        std::path::PathBuf::from(p)
    };
    if std::fs::symlink_metadata(sibling("-wal")).is_ok() {
        return None;
    }
    let shm = sibling("-shm");
    if !std::fs::symlink_metadata(&shm).is_ok_and(|m| m.is_file()) {
        return None;
    }
    let mut head = [0u8; SHM_HEAD];
    // no connection holds it: its -wal is gone (see above), and only
    // the header is read.
    let mut f = std::fs::File::open(&shm).ok()?;
    std::io::Read::read_exact(&mut f, &mut head).ok()?;
    missing_frames(&head)
}

/// Frames the WAL-index header counts as committed (`mxFrame`) but not
/// checkpointed into the database (`nBackfill`), if any. A header that is
/// not initialised, or whose two copies differ (a write torn mid-way),
/// says nothing.
fn missing_frames(head: &[u8; SHM_HEAD]) -> Option<u32> {
    let u32_at =
        |at: usize| u32::from_ne_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]]);
    let initialised = head[12] == 1;
    if u32_at(0) != WAL_INDEX_VERSION || !initialised || head[0..48] != head[48..96] {
        return None;
    }
    let max_frame = u32_at(16);
    let backfilled = u32_at(96);
    (max_frame > backfilled).then(|| max_frame - backfilled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unbackfilled_wal_index_counts_its_missing_frames() {
        let mut head = [0u8; SHM_HEAD];
        head[0..4].copy_from_slice(&WAL_INDEX_VERSION.to_ne_bytes());
        head[12] = 1;
        head[16..20].copy_from_slice(&7u32.to_ne_bytes());
        let (a, b) = head.split_at_mut(48);
        b[..48].copy_from_slice(&a[..48]);
        head[96..100].copy_from_slice(&3u32.to_ne_bytes());
        assert_eq!(missing_frames(&head), Some(4));
        head[96..100].copy_from_slice(&7u32.to_ne_bytes());
        assert_eq!(missing_frames(&head), None, "all checkpointed");
        head[60] ^= 1;
        assert_eq!(missing_frames(&head), None, "torn copies say nothing");
    }

    #[test]
    fn network_magics_are_named_and_local_ones_are_not() {
        assert_eq!(named(0x6969), Some("NFS"));
        assert_eq!(named(0xFF53_4D42), Some("CIFS"));
        // CIFS as a sign-extended 32-bit word.
        assert_eq!(named(0xFFFF_FFFF_FF53_4D42_u64 as i64), Some("CIFS"));
        assert_eq!(named(0xEF53), None, "ext4");
        assert_eq!(named(0x0102_1994), None, "tmpfs");
        assert_eq!(named(0x5846_5342), None, "xfs");
    }

    #[test]
    fn a_local_folder_is_not_a_network_one_and_writability_opens_nothing() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(network_warning(dir.path()), None);
        assert!(writable(dir.path()));
        assert!(!writable(&dir.path().join("none")));
    }
}
