//! What a batch is made of: its lines, the limits they must keep, the
//! spec of a create, the paged source the lines are read from, and the
//! handle a create gives back.

use std::future::Future;
use std::pin::Pin;

use crate::ChatRequest;

/// One request attempt in a batch. `custom_id` is stable per attempt and
/// matches `BatchLimits::custom_id_ok`.
#[derive(Debug, Clone)]
pub struct BatchLine {
    pub custom_id: String,
    pub request: ChatRequest,
}

/// What one provider accepts in one batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    pub max_requests: usize,
    /// The whole input file (or inline body), in bytes.
    pub max_bytes: u64,
    /// Longest `custom_id` accepted.
    pub max_custom_id: usize,
}

impl BatchLimits {
    /// `[A-Za-z0-9_-]{1,max}`: the strictest pattern (Anthropic's), used for
    /// every provider so ids never need translating.
    pub fn custom_id_ok(&self, id: &str) -> bool {
        !id.is_empty()
            && id.len() <= self.max_custom_id
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    }
}

/// A batch to create. `tag` is docket's own id for it, sent where the
/// provider keeps one (OpenAI/Azure metadata, Gemini display name) so a
/// submission whose create answer was lost can be found again.
pub struct SubmitSpec<'a> {
    pub tag: &'a str,
    pub model: &'a str,
    /// Read a page at a time: checked and measured once, then read again
    /// as the body is sent.
    pub lines: &'a dyn LineSource,
}

/// A batch's lines, read a page at a time, so that a batch of 50,000 is
/// never held whole (the engine's come from the ledger, where they were
/// recorded before the upload).
pub trait LineSource: Send + Sync {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Up to `max` lines from position `from`, in order; fewer only at the
    /// end. The same positions give the same lines every time.
    fn read(&self, from: usize, max: usize) -> LinePage<'_>;
}

/// A page of a `LineSource`; an error says why the lines cannot be read.
pub type LinePage<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<BatchLine>, LineReadError>> + Send + 'a>>;

/// Why a page of a batch's lines could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LineReadError {
    /// A page asked for before the pages before it were read (a source
    /// that reads on by key cannot start in the middle).
    #[error("batch {batch}: line {line} read before the lines before it")]
    OutOfOrder { batch: String, line: usize },
    /// The store the lines are kept in (`store` names it) failed.
    #[error("{store}: {source}")]
    Store {
        store: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Lines already in memory (tests, tools).
impl LineSource for Vec<BatchLine> {
    fn len(&self) -> usize {
        Vec::len(self)
    }

    fn read(&self, from: usize, max: usize) -> LinePage<'_> {
        page_of(self, from, max)
    }
}

/// Borrowed lines already in memory, as a `LineSource`.
pub struct LineSlice<'a>(pub &'a [BatchLine]);

impl LineSource for LineSlice<'_> {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn read(&self, from: usize, max: usize) -> LinePage<'_> {
        page_of(self.0, from, max)
    }
}

/// Up to `max` of `lines` from `from`, copied.
fn page_of(lines: &[BatchLine], from: usize, max: usize) -> LinePage<'static> {
    let end = from.saturating_add(max).min(lines.len());
    let page = lines.get(from..end).map(<[BatchLine]>::to_vec);
    Box::pin(async move { Ok(page.unwrap_or_default()) })
}

/// The provider's handle on a created batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    pub provider_batch_id: String,
    /// The uploaded input file, when the provider takes one.
    pub input_file_id: Option<String>,
}
