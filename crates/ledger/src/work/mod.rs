//! What the batch engine asks of the ledger, behind three traits grouped by
//! who uses them:
//!
//! - [`WorkQueue`]: a worker's claims on a session's items (pages off the
//!   queue, the items of batch results) and its view of the other workers.
//! - [`RunSessions`]: planning and creating a session, resuming it (repair,
//!   rerun of stages), and what a running session reads back (its controls,
//!   counters and the work left).
//! - [`BatchLedger`]: the provider batches of a session: which are open,
//!   adopting those nobody holds, and their lines.
//!
//! The engine holds `Ledger` handles and calls these traits; it never sees
//! SQL or a connection, so another backend (PostgreSQL) can implement them
//! without touching the engine. Writes made while a session runs do not go
//! through them: they go through the writer (`ledger::writer`), in order
//! with every other write of the run.

mod batches;
mod queue;
mod sessions;

pub use batches::BatchLedger;
pub use queue::WorkQueue;
pub use sessions::RunSessions;
