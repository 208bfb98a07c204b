//! Free space on the ledger's disk, against the floor a run's disk guard
//! holds sending at (`engine::disk`, `DOCKET_MIN_FREE_MB`), so doctor and
//! the run agree: under the floor a run sends nothing new; under the
//! room a held run needs to go on again, it is close.

use docket::engine::disk;
use docket::ledger::LedgerLocation;

use super::Check;

pub(super) fn check(location: &LedgerLocation) -> Check {
    let Some(dir) = disk::ledger_dir(location) else {
        return Check::ok(
            "disk",
            "the ledger is on PostgreSQL: its server's disk is not checked from here",
        );
    };
    let Some((free, size)) = disk::space(&dir) else {
        return Check::warn(
            "disk",
            format!("cannot read the free space of {}", dir.display()),
            format!("check that {} exists and can be read", dir.display()),
        );
    };
    let floor = disk::min_free_bytes();
    let room = disk::resume_room(floor, size);
    let said = format!(
        "{}: {} free (a run holds sending under {})",
        dir.display(),
        mb(free),
        mb(floor)
    );
    let fix = format!(
        "free space on the disk of {} (the floor is {}: {} MB)",
        dir.display(),
        disk::MIN_FREE_ENV,
        floor / (1024 * 1024)
    );
    if free < floor {
        Check::fail("disk", format!("{said}: a run would send nothing"), fix)
    } else if free < room {
        Check::warn("disk", format!("{said}: close to it"), fix)
    } else {
        Check::ok("disk", said)
    }
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / (1024.0 * 1024.0))
}
