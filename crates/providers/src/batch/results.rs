//! Reading a batch's results, shared by every adapter: one JSONL stream
//! reader (`stream_lines`, on top of `LineSplitter`) and one matcher of
//! result lines to the batch's requests (`Matcher`). An adapter keeps only
//! its own parsing of a line and its mapping of a line to a `LineOutcome`.
//!
//! The matcher quarantines lines with no id, an id not in the batch, or a
//! second line for an id; once a whole read is done (`Matcher::finish`) it
//! accounts for every expected id the provider wrote no line for.

use std::collections::HashSet;

use futures::StreamExt;

use super::{BatchState, LineOutcome, Quarantined, ResultLine, ResultSink, ResultsSummary};
use crate::ProviderError;
use crate::openai::transport_error;

/// The longest result line read (16 MiB). A longer one is quarantined and
/// skipped to its newline; it is never held whole.
pub const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

/// Quarantined lines whose reasons are kept in `ResultsSummary::quarantined`;
/// the rest are only counted (`ResultsSummary::quarantined_more`).
pub const MAX_QUARANTINE_KEPT: usize = 1_000;

/// Matching result lines to the requests of a batch while its results are read.
pub(crate) struct Matcher<'a> {
    expected: &'a HashSet<String>,
    seen: HashSet<String>,
    summary: ResultsSummary,
    sink: &'a mut dyn ResultSink,
    /// What the provider calls a request's id in a result (`custom_id`, `key`).
    id_word: &'static str,
    /// The provider writes a line for every request, run or not (see
    /// `one_line_per_request`).
    every_request_has_a_line: bool,
}

impl<'a> Matcher<'a> {
    pub(crate) fn new(
        expected: &'a HashSet<String>,
        sink: &'a mut dyn ResultSink,
        id_word: &'static str,
    ) -> Self {
        Matcher {
            expected,
            seen: HashSet::new(),
            summary: ResultsSummary::default(),
            sink,
            id_word,
            every_request_has_a_line: false,
        }
    }

    /// The provider writes a result line for every request of an ended
    /// batch, one it never ran included (Anthropic's `expired` and
    /// `canceled`): an id with no line at all is then `missing` whatever the
    /// state (its fate is unknown: it may have run and been billed), never
    /// taken as not run.
    pub(crate) fn one_line_per_request(mut self) -> Self {
        self.every_request_has_a_line = true;
        self
    }

    /// Result lines read so far (blank lines not counted).
    pub(crate) fn lines(&self) -> u64 {
        self.summary.lines
    }

    /// Wait until the sink can take more lines (see `ResultSink::room`).
    pub(crate) async fn room(&mut self) {
        self.sink.room().await
    }

    pub(crate) fn set_cut(&mut self) {
        self.summary.cut = true;
    }

    fn quarantine(&mut self, custom_id: Option<String>, reason: String) {
        if self.summary.quarantined.len() < MAX_QUARANTINE_KEPT {
            self.summary.quarantined.push(Quarantined {
                line: self.summary.lines,
                custom_id,
                reason,
            });
        } else {
            self.summary.quarantined_more = self.summary.quarantined_more.saturating_add(1);
        }
    }

    /// A line that is not a result at all (unparsable, too long). `reason`
    /// must already be safe to store (the adapter's key out of it).
    pub(crate) fn unreadable(&mut self, reason: String) {
        self.summary.lines += 1;
        self.quarantine(None, reason);
    }

    /// A result line for `id`, found at `at` (`"output file line 7"`).
    /// `outcome` is asked only for a known id seen for the first time; its
    /// `Err` quarantines the line without using up the id.
    pub(crate) fn entry(
        &mut self,
        at: &str,
        id: Option<String>,
        outcome: impl FnOnce() -> Result<LineOutcome, String>,
    ) {
        self.summary.lines += 1;
        let word = self.id_word;
        let Some(id) = id.filter(|s| !s.is_empty()) else {
            return self.quarantine(None, format!("{at}: no {word}"));
        };
        if !self.expected.contains(&id) {
            return self.quarantine(Some(id), format!("{at}: unknown {word}"));
        }
        if self.seen.contains(&id) {
            return self.quarantine(Some(id), format!("{at}: second result for this {word}"));
        }
        match outcome() {
            Ok(outcome) => {
                self.seen.insert(id.clone());
                self.deliver(id, outcome);
            }
            Err(reason) => self.quarantine(Some(id), format!("{at}: {reason}")),
        }
    }

    fn deliver(&mut self, custom_id: String, outcome: LineOutcome) {
        self.summary.delivered += 1;
        self.sink.accept(ResultLine { custom_id, outcome });
    }

    /// The read is over. Unless it was cut, every expected id with no
    /// result line is accounted for by the batch's terminal `state`:
    /// Expired or Cancelled, the provider never ran it (OpenAI's cancelled
    /// batches and Gemini's expired or cancelled ones write no line for
    /// those) and it is delivered as `NotRun`; Completed or Failed (or any
    /// state, for a provider with `one_line_per_request`), it is listed in
    /// `ResultsSummary::missing` for the caller to decide.
    pub(crate) fn finish(mut self, state: &BatchState) -> ResultsSummary {
        if self.summary.cut || !state.is_terminal() {
            return self.summary;
        }
        let mut unseen: Vec<String> = self
            .expected
            .iter()
            .filter(|id| !self.seen.contains(*id))
            .cloned()
            .collect();
        unseen.sort();
        match state {
            BatchState::Expired | BatchState::Cancelled if !self.every_request_has_a_line => {
                let why = format!(
                    "no result line: the batch was {} before it ran",
                    state.as_str()
                );
                for id in unseen {
                    self.seen.insert(id.clone());
                    self.deliver(id, LineOutcome::NotRun(why.clone()));
                }
            }
            _ => self.summary.missing = unseen,
        }
        self.summary
    }
}

/// One piece of a byte stream cut at newlines.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Piece<'b> {
    /// A line without its newline, trimmed, never empty; `n` is its
    /// 1-based line in the stream (blank lines counted).
    Line { n: u64, bytes: &'b [u8] },
    /// A line longer than the limit, skipped; `bytes` is how much of it was seen.
    TooLong { n: u64, bytes: u64 },
}

/// Cuts a byte stream into lines, holding at most one line (up to the limit).
pub(crate) struct LineSplitter {
    pending: Vec<u8>,
    line: u64,
    max: usize,
    /// Inside a line over the limit: how many bytes of it were skipped.
    skipping: Option<u64>,
}

impl LineSplitter {
    pub(crate) fn new(max: usize) -> Self {
        LineSplitter {
            pending: Vec::new(),
            line: 0,
            max,
            skipping: None,
        }
    }

    fn emit(n: u64, bytes: &[u8], out: &mut dyn FnMut(Piece<'_>)) {
        let bytes = bytes.trim_ascii();
        if !bytes.is_empty() {
            out(Piece::Line { n, bytes });
        }
    }

    pub(crate) fn feed(&mut self, mut rest: &[u8], out: &mut dyn FnMut(Piece<'_>)) {
        while let Some(pos) = rest.iter().position(|&b| b == b'\n') {
            self.line += 1;
            let part = &rest[..pos];
            if let Some(skipped) = self.skipping.take() {
                let bytes = skipped + part.len() as u64;
                out(Piece::TooLong {
                    n: self.line,
                    bytes,
                });
            } else if self.pending.len() + part.len() > self.max {
                let bytes = (self.pending.len() + part.len()) as u64;
                self.pending.clear();
                out(Piece::TooLong {
                    n: self.line,
                    bytes,
                });
            } else if self.pending.is_empty() {
                Self::emit(self.line, part, out);
            } else {
                self.pending.extend_from_slice(part);
                Self::emit(self.line, &self.pending, out);
                self.pending.clear();
            }
            rest = &rest[pos + 1..];
        }
        if let Some(skipped) = &mut self.skipping {
            *skipped += rest.len() as u64;
        } else if self.pending.len() + rest.len() > self.max {
            self.skipping = Some((self.pending.len() + rest.len()) as u64);
            self.pending = Vec::new();
        } else {
            self.pending.extend_from_slice(rest);
        }
    }

    /// The stream ended: `true` when it ended on a whole line. A last line
    /// without a newline is whole when it is a whole JSON value (files may
    /// end without one); any other fragment is a line cut short, not applied.
    pub(crate) fn finish(self, out: &mut dyn FnMut(Piece<'_>)) -> bool {
        if let Some(bytes) = self.skipping {
            // Over the limit however it ends: reading it again cannot help.
            out(Piece::TooLong {
                n: self.line + 1,
                bytes,
            });
            return true;
        }
        let last = self.pending.trim_ascii();
        if last.is_empty() {
            return true;
        }
        if serde_json::from_slice::<serde::de::IgnoredAny>(last).is_ok() {
            out(Piece::Line {
                n: self.line + 1,
                bytes: last,
            });
            true
        } else {
            false
        }
    }
}

/// A result line parsed as `T`; one that is not is quarantined (the reason
/// cleaned of `key`) and gives None.
pub(crate) fn parse_line<T: serde::de::DeserializeOwned>(
    m: &mut Matcher<'_>,
    raw: &[u8],
    at: &str,
    key: Option<&crate::ApiKey>,
) -> Option<T> {
    match serde_json::from_slice(raw) {
        Ok(l) => Some(l),
        Err(e) => {
            let reason = format!(
                "{at}: not a result line ({e}); starts {}",
                crate::openai::preview(raw)
            );
            m.unreadable(super::clean(&reason, key));
            None
        }
    }
}

/// How a results stream ended.
pub(crate) enum StreamEnd {
    /// Every line was read.
    Whole,
    /// It ended early, mid-line (the partial line was not applied).
    Cut,
    /// A transport error broke it (not yet scrubbed of the key).
    Broken(ProviderError),
}

/// Read a 200 answer's body as JSONL into `m`: each non-blank line goes to
/// `on_line` with where it is (`"{label} {n}"`), a line over
/// `MAX_LINE_BYTES` is quarantined. What was delivered before a cut stands.
pub(crate) async fn stream_lines<'a>(
    response: reqwest::Response,
    label: &str,
    m: &mut Matcher<'a>,
    on_line: impl Fn(&mut Matcher<'a>, &[u8], &str),
) -> StreamEnd {
    let mut splitter = LineSplitter::new(MAX_LINE_BYTES);
    let out = |m: &mut Matcher<'a>, p: Piece<'_>| {
        match p {
        Piece::Line { n, bytes } => on_line(m, bytes, &format!("{label} {n}")),
        Piece::TooLong { n, bytes } => m.unreadable(format!(
            "{label} {n}: a line of {bytes} bytes or more, over the {MAX_LINE_BYTES} bytes a result line may hold"
        )),
    }
    };
    let mut stream = response.bytes_stream();
    while let Some(piece) = stream.next().await {
        match piece {
            Ok(bytes) => splitter.feed(&bytes, &mut |p| out(m, p)),
            Err(e) => return StreamEnd::Broken(transport_error(&e)),
        }
        // The lines of one piece of the download are out: read on only
        // when the sink has room for more.
        m.room().await;
    }
    if splitter.finish(&mut |p| out(m, p)) {
        StreamEnd::Whole
    } else {
        StreamEnd::Cut
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(pieces: &[&[u8]], max: usize) -> (Vec<String>, bool) {
        let mut s = LineSplitter::new(max);
        let mut got = Vec::new();
        let mut out = |p: Piece<'_>| {
            got.push(match p {
                Piece::Line { n, bytes } => format!("{n}:{}", String::from_utf8_lossy(bytes)),
                Piece::TooLong { n, bytes } => format!("{n}:too long ({bytes})"),
            })
        };
        for p in pieces {
            s.feed(p, &mut out);
        }
        let whole = s.finish(&mut out);
        (got, whole)
    }

    #[test]
    fn lines_across_pieces_blank_lines_and_the_last_line() {
        let (got, whole) = split(&[b"{\"a\":1}\n{\"b\"", b":2}\n\n  \n{\"c\":3}"], 100);
        assert_eq!(got, vec!["1:{\"a\":1}", "2:{\"b\":2}", "5:{\"c\":3}"]);
        assert!(whole, "a whole JSON value without its newline is a line");
        let (got, whole) = split(&[b"{\"a\":1}\n{\"b\":"], 100);
        assert_eq!(got, vec!["1:{\"a\":1}"]);
        assert!(!whole, "a fragment is a cut");
        assert!(split(&[b""], 100).1);
    }

    #[test]
    fn a_line_over_the_limit_is_skipped_to_its_newline() {
        // Over the limit in one piece, and built up over several.
        let (got, whole) = split(&[b"{\"a\":1}\n0123456789012\n{\"b\":2}\n"], 10);
        assert_eq!(got, vec!["1:{\"a\":1}", "2:too long (13)", "3:{\"b\":2}"]);
        assert!(whole);
        let (got, whole) = split(&[b"01234", b"56789", b"0123", b"45\n{\"b\":2}\n"], 10);
        assert_eq!(got, vec!["1:too long (16)", "2:{\"b\":2}"]);
        assert!(whole);
        // Exactly at the limit is fine; a long last line is still reported.
        let (got, _) = split(&[b"\"12345678\"\n", b"0123456789abc"], 10);
        assert_eq!(got, vec!["1:\"12345678\"", "2:too long (13)"]);
    }

    fn matcher_run(
        expected: &[&str],
        state: BatchState,
        cut: bool,
        ids: &[&str],
    ) -> (Vec<ResultLine>, ResultsSummary) {
        let expected: HashSet<String> = expected.iter().map(|s| s.to_string()).collect();
        let mut got = Vec::new();
        let mut sink = |l: ResultLine| got.push(l);
        let mut m = Matcher::new(&expected, &mut sink, "custom_id");
        for (i, id) in ids.iter().enumerate() {
            m.entry(&format!("line {}", i + 1), Some(id.to_string()), || {
                Ok(LineOutcome::NotRun("x".into()))
            });
        }
        if cut {
            m.set_cut();
        }
        let summary = m.finish(&state);
        (got, summary)
    }

    #[test]
    fn ids_with_no_line_are_not_run_or_missing_by_state() {
        let all = ["a", "b", "c", "d"];
        for state in [BatchState::Expired, BatchState::Cancelled] {
            let (got, s) = matcher_run(&all, state.clone(), false, &["b", "zz"]);
            let ids: Vec<&str> = got.iter().map(|l| l.custom_id.as_str()).collect();
            assert_eq!(ids, vec!["b", "a", "c", "d"], "{state:?}");
            assert!(
                got.iter()
                    .all(|l| matches!(l.outcome, LineOutcome::NotRun(_)))
            );
            assert_eq!((s.delivered, s.missing.len()), (4, 0));
        }
        for state in [BatchState::Completed, BatchState::Failed("x".into())] {
            let (got, s) = matcher_run(&all, state, false, &["c"]);
            assert_eq!(got.len(), 1);
            assert_eq!(s.missing, vec!["a", "b", "d"]);
        }
        // A cut read, or a batch still running: nothing is made up.
        let (got, s) = matcher_run(&all, BatchState::Expired, true, &["c"]);
        assert_eq!((got.len(), s.missing.len()), (1, 0));
        let (got, s) = matcher_run(&all, BatchState::InProgress, false, &["c"]);
        assert_eq!((got.len(), s.missing.len()), (1, 0));
    }

    #[test]
    fn where_every_request_has_a_line_one_with_none_is_missing_in_any_state() {
        let expected: HashSet<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        for state in [
            BatchState::Expired,
            BatchState::Cancelled,
            BatchState::Completed,
        ] {
            let mut got = Vec::new();
            let mut sink = |l: ResultLine| got.push(l);
            let mut m = Matcher::new(&expected, &mut sink, "custom_id").one_line_per_request();
            m.entry("line 1", Some("b".into()), || {
                Ok(LineOutcome::NotRun("expired".into()))
            });
            let s = m.finish(&state);
            assert_eq!(got.len(), 1, "{state:?}: nothing made up");
            assert_eq!(s.missing, vec!["a", "c"], "{state:?}");
            assert_eq!(s.delivered, 1);
        }
    }

    #[test]
    fn quarantine_reasons_are_capped_and_the_rest_counted() {
        let expected: HashSet<String> = HashSet::new();
        let mut sink = |_: ResultLine| panic!("nothing expected");
        let mut m = Matcher::new(&expected, &mut sink, "key");
        for i in 0..MAX_QUARANTINE_KEPT + 5 {
            m.entry(
                &format!("line {i}"),
                Some(format!("k{i}")),
                || unreachable!(),
            );
        }
        let s = m.finish(&BatchState::Completed);
        assert_eq!(s.quarantined.len(), MAX_QUARANTINE_KEPT);
        assert_eq!(s.quarantined_more, 5);
        assert_eq!(s.lines, MAX_QUARANTINE_KEPT as u64 + 5);
        assert!(s.quarantined[0].reason.ends_with("unknown key"));
    }
}
