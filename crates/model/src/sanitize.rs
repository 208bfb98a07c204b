//! Make item and model text safe for a terminal: no control characters, no
//! escape sequences, bounded length.

/// Newlines, tabs and carriage returns become spaces. Escape sequences are
/// removed whole, not just their ESC: CSI (`ESC [` or C1 `CSI` up to the
/// final byte), OSC, DCS, SOS, PM and APC strings (up to BEL or ST) and
/// two-character escapes, so no `[2J` or `]0;title` leftovers reach the
/// screen either. Every other control character (C0, DEL, C1) is removed,
/// and so are the bidi overrides that reorder what the operator reads.
pub fn for_terminal(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => match chars.peek() {
                Some('[') => {
                    chars.next();
                    skip_csi(&mut chars);
                }
                Some(']' | 'P' | 'X' | '^' | '_') => {
                    chars.next();
                    skip_string(&mut chars);
                }
                Some(&n) if ('\u{20}'..='\u{2f}').contains(&n) => {
                    // nF escapes: intermediates, then one final byte.
                    while chars
                        .next_if(|c| ('\u{20}'..='\u{2f}').contains(c))
                        .is_some()
                    {}
                    chars.next_if(|c| ('\u{30}'..='\u{7e}').contains(c));
                }
                Some(&n) if ('\u{30}'..='\u{7e}').contains(&n) => {
                    chars.next();
                }
                _ => {}
            },
            '\u{9b}' => skip_csi(&mut chars),
            '\u{9d}' | '\u{90}' | '\u{98}' | '\u{9e}' | '\u{9f}' => skip_string(&mut chars),
            '\n' | '\r' | '\t' => out.push(' '),
            c if c.is_control() => {}
            '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' => {}
            c => out.push(c),
        }
    }
    out
}

/// Text of several lines made safe line by line: its newlines are kept,
/// everything else as [`for_terminal`]. What the engine reports goes out
/// through this, so a provider's words quoted in a line (an error body, a
/// batch's state) never reach the terminal raw.
pub fn lines_for_terminal(text: &str) -> String {
    text.split('\n')
        .map(for_terminal)
        .collect::<Vec<_>>()
        .join("\n")
}

/// A CSI's parameter and intermediate bytes, then its final byte.
fn skip_csi(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) {
    while chars
        .next_if(|c| ('\u{20}'..='\u{3f}').contains(c))
        .is_some()
    {}
    chars.next_if(|c| ('\u{40}'..='\u{7e}').contains(c));
}

/// A control string up to its terminator: BEL, ST (`ESC \\`) or C1 ST. An
/// unterminated one runs to the end, as a terminal would read it.
fn skip_string(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) {
    while let Some(c) = chars.next() {
        match c {
            '\u{7}' | '\u{9c}' => return,
            '\u{1b}' => {
                chars.next_if_eq(&'\\');
                return;
            }
            _ => {}
        }
    }
}

/// `for_terminal`, then cut to at most `max` characters with an ellipsis.
pub fn truncate(text: &str, max: usize) -> String {
    let clean = for_terminal(text);
    if clean.chars().count() <= max {
        return clean;
    }
    let mut s: String = clean.chars().take(max.saturating_sub(1)).collect();
    s.push('…');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_lines_keep_their_newlines_and_lose_the_rest() {
        let s = lines_for_terminal(
            "Batch b: its polls fail (\u{1b}]52;c;ZXZpbA==\u{7}boom\r)\nnext \u{1b}[31mline",
        );
        assert_eq!(s, "Batch b: its polls fail (boom )\nnext line");
    }

    #[test]
    fn strips_escape_sequences_and_controls() {
        let s = for_terminal("ok\u{1b}[2J\u{1b}]0;title\u{7}\u{9b}31m\nnext\u{0}");
        assert!(!s.chars().any(char::is_control), "{s:?}");
        assert!(s.starts_with("ok"));
        assert!(s.contains("next"));
    }

    #[test]
    fn removes_whole_sequences_not_just_their_escape() {
        let s = for_terminal(
            "a\u{1b}[2Jb\u{1b}[38;5;196mc\u{1b}]0;title\u{7}d\u{1b}]8;;http://x\u{1b}\\e\u{9b}31mf\u{1b}Pq#0\u{1b}\\g\u{1b}(Bh\u{1b}=i",
        );
        assert_eq!(s, "abcdefghi");
        // Text after an escape that ends the string is kept.
        assert_eq!(for_terminal("x\u{1b}"), "x");
        assert_eq!(for_terminal("[2J is fine as text"), "[2J is fine as text");
        assert_eq!(for_terminal("r\u{202E}tl\u{2066}"), "rtl");
        assert_eq!(for_terminal("é\u{1b}[1mñ"), "éñ");
    }

    #[test]
    fn truncates_by_chars() {
        assert_eq!(truncate("abcdef", 4), "abc…");
        assert_eq!(truncate("ab", 4), "ab");
        assert_eq!(truncate("ééééé", 3), "éé…");
    }
}

/// Line output bound for a terminal (`export`, `batch-results` and
/// `sessions` writing CSV or JSON to one), each line through
/// [`for_terminal`] on its way: a model's answer holding an OSC 52
/// clipboard write, a clear-screen or a right-to-left override reaches the
/// screen as text, not as a command. Output to a file or a pipe is not
/// wrapped: the data stays exact there.
pub struct TerminalLines<W: std::io::Write> {
    inner: W,
    pending: Vec<u8>,
}

impl<W: std::io::Write> TerminalLines<W> {
    pub fn new(inner: W) -> Self {
        TerminalLines {
            inner,
            pending: Vec::new(),
        }
    }

    fn emit(&mut self, line: &[u8]) -> std::io::Result<()> {
        let text = String::from_utf8_lossy(line);
        self.inner.write_all(for_terminal(&text).as_bytes())
    }
}

impl<W: std::io::Write> std::io::Write for TerminalLines<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.pending.extend_from_slice(buf);
        while let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            self.emit(&line[..line.len() - 1])?;
            self.inner.write_all(b"\n")?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if !self.pending.is_empty() {
            let rest = std::mem::take(&mut self.pending);
            self.emit(&rest)?;
        }
        self.inner.flush()
    }
}

impl<W: std::io::Write> Drop for TerminalLines<W> {
    fn drop(&mut self) {
        let _ = std::io::Write::flush(self);
    }
}

#[cfg(test)]
mod terminal_lines_tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn escapes_and_overrides_leave_as_text_a_line_at_a_time() {
        let mut out = Vec::new();
        {
            let mut w = TerminalLines::new(&mut out);
            // An answer with an OSC 52 clipboard write, a clear-screen, a
            // one-byte CSI and a right-to-left override, split across writes.
            w.write_all(b"id,answer\r\na,\"x\x1b]52;c;ZXZpbA==\x07y")
                .unwrap();
            w.write_all("\x1b[2Jz\u{9b}31m\u{202e}w\"\n".as_bytes())
                .unwrap();
            w.write_all(b"b,last").unwrap();
        }
        let text = String::from_utf8(out).unwrap();
        assert!(
            !text.contains('\x1b') && !text.contains('\u{9b}') && !text.contains('\u{202e}'),
            "{text:?}"
        );
        assert_eq!(text.lines().count(), 3, "{text:?}");
        assert!(
            text.starts_with("id,answer") && text.ends_with("b,last"),
            "{text:?}"
        );
    }
}

/// The most bytes one record of docket's log takes (fault-matrix row X4):
/// a record quoting a 10 MB item is cut here, with the size it had.
pub const LOG_RECORD_MAX: usize = 16 * 1024;

/// One record of docket's log as one line (fault-matrix row X4): an item
/// id, evidence or a model's answer quoted in a message or a field can
/// neither start a line of its own (a forged record) nor reach whoever
/// reads the log with `less` or `tail -f` as a terminal command. Unlike
/// [`for_terminal`] nothing is dropped: newline, carriage return and tab
/// become `\n`, `\r` and `\t`, every other control character (C0, DEL, C1)
/// and the bidi overrides become `\u{..}`. Then the record is cut to at
/// most `max` bytes (on a character boundary), saying how much was cut.
pub fn for_log(text: &str, max: usize) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(text.len().min(max) + 16);
    let mut chars = text.char_indices();
    for (at, c) in chars.by_ref() {
        let before = out.len();
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
        if out.len() > max {
            out.truncate(before);
            let _ = write!(out, " [… {} more bytes cut]", text.len() - at);
            break;
        }
    }
    out
}

/// A log event format that writes each record as one line through
/// [`for_log`]: whatever `F` (tracing's own formats) writes for an event
/// (its message, fields, spans) is escaped and bounded as a whole, so no
/// caller needs to remember to escape what it quotes.
pub struct OneLineLog<F> {
    inner: F,
    max: usize,
}

impl<F> OneLineLog<F> {
    pub fn new(inner: F) -> Self {
        OneLineLog {
            inner,
            max: LOG_RECORD_MAX,
        }
    }
}

impl<S, N, F> tracing_subscriber::fmt::FormatEvent<S, N> for OneLineLog<F>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
    F: tracing_subscriber::fmt::FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let mut record = String::new();
        self.inner.format_event(
            ctx,
            tracing_subscriber::fmt::format::Writer::new(&mut record),
            event,
        )?;
        let record = record.strip_suffix('\n').unwrap_or(&record);
        writer.write_str(&for_log(record, self.max))?;
        writer.write_char('\n')
    }
}

#[cfg(test)]
mod log_tests {
    use super::*;

    #[test]
    fn log_text_stays_on_one_line_and_keeps_what_it_escapes() {
        let s = for_log(
            "id\n2026-01-01T00:00:00Z ERROR forged\r\tx\u{1b}[2J\u{7}\u{9b}\u{202e}é",
            1024,
        );
        assert_eq!(
            s,
            "id\\n2026-01-01T00:00:00Z ERROR forged\\r\\tx\\u{1b}[2J\\u{7}\\u{9b}\\u{202e}é"
        );
        assert!(!s.chars().any(char::is_control));
    }

    #[test]
    fn a_long_record_is_cut_on_a_character_and_says_so() {
        let long = "é".repeat(10_000);
        let s = for_log(&long, 101);
        let kept = s.split(" [").next().unwrap();
        assert_eq!(kept, "é".repeat(50));
        assert!(
            s.ends_with(&format!("[… {} more bytes cut]", 20_000 - 100)),
            "{s}"
        );
        // Escapes count toward the bound too.
        let s = for_log(&"\n".repeat(1000), 10);
        assert!(s.starts_with("\\n\\n\\n\\n\\n ["), "{s}");
    }

    /// The whole record through tracing: a message and a field quoting
    /// hostile text come out as one line with no control byte.
    #[test]
    fn a_tracing_record_quoting_hostile_text_is_one_line() {
        use std::sync::{Arc, Mutex};
        #[derive(Clone, Default)]
        struct Sink(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Sink {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let sink = Sink::default();
        let out = sink.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || sink.clone())
            .with_ansi(false)
            .event_format(OneLineLog::new(tracing_subscriber::fmt::format()))
            .finish();
        let hostile = "a\n2026-01-01T00:00:00Z ERROR forged\r\u{1b}]0;t\u{7}";
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(item = %hostile, "lease lost: {hostile}");
            tracing::warn!(answer = ?hostile, "{}", "x".repeat(LOG_RECORD_MAX * 2));
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        for l in &lines {
            assert!(l.contains(" WARN "), "{l}");
            assert!(!l.chars().any(char::is_control), "{l:?}");
            assert!(l.len() <= LOG_RECORD_MAX + 40, "{}", l.len());
        }
        assert!(lines[0].contains("forged"));
        assert!(lines[1].contains("more bytes cut]"));
    }
}
