//! Who is at the keyboard (or running the worker): the name the ledger
//! records with a review decision, a claim or a worker.

/// Who is deciding: `user` is recorded in the ledger (`review:<user>`);
/// `claimant` tells two consoles of the same user apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator {
    pub user: String,
    pub claimant: String,
}

impl Operator {
    /// The operator of this process: `$USER` and `user@host:pid`.
    pub fn current() -> Self {
        // $USER, else $LOGNAME, else the uid: two operators must never
        // merge into one "unknown" (they would share an undo history).
        let user = ["USER", "LOGNAME"]
            .iter()
            .filter_map(|v| std::env::var(v).ok())
            .map(|u| crate::sanitize::for_terminal(u.trim()))
            .find(|u| !u.is_empty())
            .or_else(uid)
            .unwrap_or_else(|| "unknown".to_string());
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".to_string());
        let claimant = format!("{user}@{host}:{}", std::process::id());
        Operator { user, claimant }
    }

    pub fn new(user: impl Into<String>, claimant: impl Into<String>) -> Self {
        Operator {
            user: user.into(),
            claimant: claimant.into(),
        }
    }

    /// What the ledger records as the decider: `review:<user>`.
    pub fn actor(&self) -> String {
        format!("review:{}", self.user)
    }
}

/// `uid:N` from /proc, for a process with no user name in its environment.
fn uid() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    let id = line.split_whitespace().nth(1)?;
    Some(format!("uid:{id}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operator_names() {
        let op = Operator::new("alice", "alice@box:1");
        assert_eq!(op.actor(), "review:alice");
        let me = Operator::current();
        assert!(!me.user.is_empty());
        assert!(me.claimant.starts_with(&format!("{}@", me.user)));
        assert!(me.claimant.ends_with(&format!(":{}", std::process::id())));
    }
}
