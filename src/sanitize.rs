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
