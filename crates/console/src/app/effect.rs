//! The work the console's state asks of the runner.

use super::{Control, QuitChoice};

/// Work for the runner: ledger reads and writes happen off the UI thread.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Watch this session (None: follow the newest).
    Watch(Option<String>),
    Query(docket_ledger::watch::ReviewQuery),
    /// Load the detail of this review item (None: none wanted).
    Detail(Option<i64>),
    /// Hold this review item while the cursor is on it (None: let go).
    Claim(Option<i64>),
    Accept(Vec<i64>),
    Reject(Vec<i64>),
    /// Accept the operator's own answer for one review item.
    Correct {
        review_id: i64,
        answer: serde_json::Value,
    },
    Undo,
    Control {
        session_id: String,
        control: Control,
    },
    /// `session`: the session on screen (decisions ignore it).
    Export {
        session: Option<String>,
        what: String,
        format: String,
        path: String,
    },
    Quit(QuitChoice),
    /// A key was pressed (the operator is here: keep holding the item).
    Activity,
    /// Read the charts' data (the charts are shown) or stop reading it.
    Charts(bool),
}
