//! Splitting a batch's lines into input files a provider accepts, checked
//! locally before anything is uploaded.
//!
//! `split` encodes each line once to measure it and keeps only the sizes:
//! a chunk is a slice of the caller's lines, and its bytes are produced
//! again, streaming, when it is uploaded. Memory stays at one encoded line
//! however large the job.

use std::collections::HashSet;
use std::fmt;

use super::{BatchLimits, BatchLine};

/// Why a line could not be encoded (a schema or a number serde_json cannot
/// write). Each variant says it as the `String` it replaced did.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    /// An adapter's own encoding of a line, as it is sent.
    #[error("cannot encode the request: {0}")]
    Request(serde_json::Error),
    /// The provider-neutral size estimate (`neutral_encoding`).
    #[error("{0}")]
    Estimate(serde_json::Error),
    /// A request body sent as written has no translation for the
    /// provider (`translate`).
    #[error("cannot translate the request: {0}")]
    Translate(#[from] crate::translate::TranslateError),
}

/// One input file's worth of lines, in the caller's order.
#[derive(Debug, Clone, Copy)]
pub struct Chunk<'a> {
    /// Index in the caller's slice of `lines[0]`.
    pub first: usize,
    pub lines: &'a [BatchLine],
    /// The file's size: every encoded line plus its newline.
    pub bytes: u64,
}

impl Chunk<'_> {
    pub fn len(&self) -> usize {
        self.lines.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }
}

/// A line that cannot go to the provider, found before upload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineError {
    /// 0-based index in the caller's slice (the input file's line is `index + 1`
    /// when the lines go in one file).
    pub index: usize,
    pub custom_id: String,
    pub reason: String,
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "batch line {} (custom_id {:?}): {}",
            self.index + 1,
            docket_model::sanitize::for_terminal(&self.custom_id),
            self.reason
        )
    }
}

impl std::error::Error for LineError {}

/// Check every line and cut the lines into chunks that each respect
/// `limits` (requests per file, bytes per file counting each line's
/// newline). Refuses, naming the first bad line: an invalid or duplicate
/// `custom_id`, a line `encode` cannot encode, or a single line that would
/// not fit a file on its own. An empty slice gives no chunks.
pub fn split<'a, E: fmt::Display>(
    lines: &'a [BatchLine],
    limits: BatchLimits,
    encode: impl Fn(&BatchLine) -> Result<Vec<u8>, E>,
) -> Result<Vec<Chunk<'a>>, LineError> {
    let max_requests = limits.max_requests.max(1);
    let mut check = LineCheck::new(limits);
    let mut chunks = Vec::new();
    let mut start = 0usize;
    let mut bytes = 0u64;
    for (i, line) in lines.iter().enumerate() {
        let size = check.size(i, line, &encode)?;
        if i > start && (i - start >= max_requests || bytes + size > limits.max_bytes) {
            chunks.push(Chunk {
                first: start,
                lines: &lines[start..i],
                bytes,
            });
            start = i;
            bytes = 0;
        }
        bytes += size;
    }
    if start < lines.len() {
        chunks.push(Chunk {
            first: start,
            lines: &lines[start..],
            bytes,
        });
    }
    Ok(chunks)
}

/// The checks `split` makes of each line, for lines that come one at a
/// time: the `custom_id` valid and not seen before, the line encodable
/// without a newline, and small enough for a file on its own.
pub struct LineCheck {
    limits: BatchLimits,
    seen: HashSet<String>,
}

impl LineCheck {
    pub fn new(limits: BatchLimits) -> Self {
        LineCheck {
            limits,
            seen: HashSet::new(),
        }
    }

    /// Line `index`'s size in a file (its newline counted), or why it
    /// cannot go.
    pub fn size<E: fmt::Display>(
        &mut self,
        index: usize,
        line: &BatchLine,
        encode: impl Fn(&BatchLine) -> Result<Vec<u8>, E>,
    ) -> Result<u64, LineError> {
        let err = |reason: String| LineError {
            index,
            custom_id: line.custom_id.clone(),
            reason,
        };
        if !self.limits.custom_id_ok(&line.custom_id) {
            return Err(err(format!(
                "custom_id must be 1 to {} characters of A-Z a-z 0-9 _ -",
                self.limits.max_custom_id
            )));
        }
        if !self.seen.insert(line.custom_id.clone()) {
            return Err(err("duplicate custom_id".into()));
        }
        let encoded = encode(line).map_err(|e| err(e.to_string()))?;
        if encoded.contains(&b'\n') {
            return Err(err("encoded line contains a newline".into()));
        }
        let size = encoded.len() as u64 + 1;
        if size > self.limits.max_bytes {
            return Err(err(format!(
                "line is {size} bytes, over the {} bytes one input file may hold",
                self.limits.max_bytes
            )));
        }
        Ok(size)
    }
}

/// A provider-neutral size estimate for adapters without an exact encoder:
/// the request's text fields as JSON (the default of
/// `BatchProvider::split`). Real adapters encode exactly.
pub fn neutral_encoding(line: &BatchLine) -> Result<Vec<u8>, EncodeError> {
    let r = &line.request;
    serde_json::to_vec(&serde_json::json!({
        "custom_id": line.custom_id,
        "model": r.model,
        "system": r.system.as_deref(),
        "user": r.user,
        "max_tokens": r.max_tokens,
        "temperature": r.temperature,
        "schema": r.response_schema.as_deref().map(|(n, s)| (n, s)),
    }))
    .map_err(EncodeError::Estimate)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ChatRequest;
    use std::time::Duration;

    const OPENAI: BatchLimits = super::super::openai::OPENAI_LIMITS;

    fn line(id: &str) -> BatchLine {
        BatchLine {
            custom_id: id.to_string(),
            request: ChatRequest {
                model: "m".into(),
                system: None,
                user: "u".into(),
                max_tokens: 1,
                temperature: None,
                response_schema: None,
                structured_output: Default::default(),
                thinking_budget: None,
                client_request_id: id.to_string(),
                timeout: Duration::from_secs(1),
                body: None,
            },
        }
    }

    fn lines(n: usize) -> Vec<BatchLine> {
        (0..n).map(|i| line(&format!("r{i}"))).collect()
    }

    fn small(l: &BatchLine) -> Result<Vec<u8>, String> {
        Ok(format!("{{\"custom_id\":\"{}\"}}", l.custom_id).into_bytes())
    }

    #[test]
    fn fifty_thousand_and_one_lines_make_two_openai_files() {
        let all = lines(50_001);
        let chunks = split(&all, OPENAI, small).unwrap();
        assert_eq!(chunks.len(), 2);
        assert_eq!(chunks[0].len(), 50_000);
        assert_eq!(chunks[0].first, 0);
        assert_eq!(chunks[1].len(), 1);
        assert_eq!(chunks[1].first, 50_000);
        assert_eq!(chunks[1].lines[0].custom_id, "r50000");
        let exact: u64 = all[..50_000]
            .iter()
            .map(|l| small(l).unwrap().len() as u64 + 1)
            .sum();
        assert_eq!(chunks[0].bytes, exact);
        assert!(split(&[], OPENAI, small).unwrap().is_empty());
    }

    #[test]
    fn lines_are_split_by_size_counting_the_newline() {
        let limits = BatchLimits {
            max_requests: 1000,
            max_bytes: 30,
            max_custom_id: 64,
        };
        // Each line encodes to 9 bytes + newline = 10: three fit in 30.
        let fixed = |_: &BatchLine| Ok::<_, String>(vec![b'x'; 9]);
        let all = lines(7);
        let chunks = split(&all, limits, fixed).unwrap();
        let sizes: Vec<usize> = chunks.iter().map(|c| c.len()).collect();
        assert_eq!(sizes, vec![3, 3, 1]);
        assert!(chunks.iter().all(|c| c.bytes <= 30));
        assert_eq!(chunks[0].bytes, 30);
        // 10 bytes + newline = 11: only two fit in 30.
        let fixed = |_: &BatchLine| Ok::<_, String>(vec![b'x'; 10]);
        let sizes: Vec<usize> = split(&all, limits, fixed)
            .unwrap()
            .iter()
            .map(|c| c.len())
            .collect();
        assert_eq!(sizes, vec![2, 2, 2, 1]);
    }

    #[test]
    fn a_job_past_200_mb_is_split_without_holding_it() {
        // 201 lines of 1 MB with their newline against the real 200 MB
        // limit: only one line is ever allocated at a time.
        const MB: usize = 1_000_000;
        let all = lines(201);
        let chunks = split(&all, OPENAI, |_| Ok::<_, String>(vec![b'x'; MB - 1])).unwrap();
        assert_eq!(OPENAI.max_bytes, 200 * MB as u64);
        assert_eq!(chunks.len(), 2);
        assert_eq!(chunks[0].len(), 200);
        assert_eq!(chunks[0].bytes, 200 * MB as u64);
        assert_eq!(chunks[1].len(), 1);
        // One byte more per line and the first file holds 199.
        let chunks = split(&all, OPENAI, |_| Ok::<_, String>(vec![b'x'; MB])).unwrap();
        assert_eq!(chunks[0].len(), 199);
        assert!(chunks.iter().all(|c| c.bytes <= OPENAI.max_bytes));
        assert_eq!(chunks.iter().map(|c| c.len()).sum::<usize>(), 201);
    }

    #[test]
    fn a_line_larger_than_a_file_is_refused_with_its_index() {
        let limits = BatchLimits {
            max_requests: 10,
            max_bytes: 100,
            max_custom_id: 64,
        };
        let all = lines(5);
        let e = split(&all, limits, |l| {
            Ok::<_, String>(vec![b'x'; if l.custom_id == "r3" { 100 } else { 5 }])
        })
        .unwrap_err();
        assert_eq!(e.index, 3);
        assert_eq!(e.custom_id, "r3");
        assert!(e.reason.contains("101 bytes"), "{e}");
    }

    #[test]
    fn bad_and_duplicate_custom_ids_are_named() {
        let mut all = lines(4);
        all[2].custom_id = "r0".into();
        let e = split(&all, OPENAI, small).unwrap_err();
        assert_eq!((e.index, e.custom_id.as_str()), (2, "r0"));
        assert!(e.reason.contains("duplicate"));
        assert!(e.to_string().starts_with("batch line 3 "), "{e}");

        for bad in ["", "has space", "semi;colon", &"x".repeat(65), "é"] {
            let mut all = lines(3);
            all[1].custom_id = bad.to_string();
            let e = split(&all, OPENAI, small).unwrap_err();
            assert_eq!(e.index, 1, "{bad:?}");
            assert!(e.reason.contains("custom_id"), "{e}");
        }
        let e = split(&lines(2), OPENAI, |l| {
            if l.custom_id == "r1" {
                Err("cannot encode".into())
            } else {
                small(l)
            }
        })
        .unwrap_err();
        assert_eq!((e.index, e.reason.as_str()), (1, "cannot encode"));
    }
}
