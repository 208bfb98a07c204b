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

#[cfg(test)]
mod tests {
    use super::*;

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
