//! What a Batch API results file can hand back besides results: the lines
//! docket could not use. The providers find them and the ledger keeps them.

/// A result line that could not be used: unparsable, an unknown
/// `custom_id`, or a second line for the same one. Reported, never applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quarantined {
    /// 1-based line in the results stream.
    pub line: u64,
    pub custom_id: Option<String>,
    pub reason: String,
}
