//! Make item and model text safe for a terminal: no control characters, no
//! escape sequences, bounded length.

/// Newlines, tabs and carriage returns become spaces; every other control
/// character (C0, DEL, C1: ESC, CSI, BEL, NUL...) is removed, so no escape
/// sequence can start; bidi overrides, which reorder what the operator
/// reads, are removed too.
pub fn for_terminal(text: &str) -> String {
    text.chars()
        .filter_map(|c| match c {
            '\n' | '\r' | '\t' => Some(' '),
            c if c.is_control() => None,
            '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' => None,
            c => Some(c),
        })
        .collect()
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
    fn truncates_by_chars() {
        assert_eq!(truncate("abcdef", 4), "abc…");
        assert_eq!(truncate("ab", 4), "ab");
        assert_eq!(truncate("ééééé", 3), "éé…");
    }
}
