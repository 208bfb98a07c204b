//! Provider batches in the ledger (migration 0004): what the batch engine
//! writes (through the ledger writer, in order with every other write) and
//! what a resume reads back to re-attach open batches.
//!
//! A batch is keyed by its `tag` (docket's own id, unique): the writer's
//! answers carry no values, so the engine names its batches itself.

mod apply;
mod ops;
mod reads;

pub(crate) use apply::apply;
pub use ops::{BatchOp, NewBatch, NewBatchLine};
pub use reads::{LineId, OpenBatch, WaitingLine, batch_custom_ids};
pub(crate) use reads::{
    adopt, batch_count, is_settled, known_provider_ids, line_ids, open_batch_count, open_batches,
    waiting_ids, waiting_lines_after,
};
