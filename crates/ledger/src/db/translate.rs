//! The ledger's SQL, written for both engines, made PostgreSQL's: the few
//! spellings that differ are rewritten here once per statement, so each
//! module keeps one text.
//!
//! - `?1`, `?` parameters become `$1`, `$k`;
//! - `+col` (SQLite's way to keep an index out of a plan) becomes `col`;
//! - `LIKE` becomes `ILIKE` (SQLite's LIKE ignores ASCII case);
//! - `DESC` becomes `DESC NULLS LAST` (SQLite's NULL is the lowest value);
//! - `TOTAL(x)` becomes `COALESCE(SUM(x), 0)`;
//! - `MAX(a, b)` / `MIN(a, b)` with two or more arguments (SQLite's scalar
//!   forms) become `GREATEST` / `LEAST`.
//!
//! Quoted text and identifiers are copied untouched.

pub fn to_postgres(sql: &str) -> String {
    translate(sql).0
}

/// The statement in PostgreSQL's dialect, and the names of its `:name`
/// parameters in the order of their numbers (`:a ... :b ... :a` is
/// `$1 ... $2 ... $1`).
pub fn translate(sql: &str) -> (String, Vec<String>) {
    let mut t = Translation {
        chars: sql.chars().collect(),
        out: String::with_capacity(sql.len() + 16),
        names: Vec::new(),
        next_anonymous: 1,
    };
    let mut i = 0;
    while i < t.chars.len() {
        i = t.step(i);
    }
    (t.out, t.names)
}

/// A statement being rewritten, left to right.
struct Translation {
    chars: Vec<char>,
    out: String,
    /// The `:name` parameters met so far, in the order of their numbers.
    names: Vec<String>,
    /// The number the next bare `?` gets.
    next_anonymous: usize,
}

impl Translation {
    /// Rewrite what starts at `i`; returns the index after it.
    fn step(&mut self, i: usize) -> usize {
        let chars = &self.chars;
        match chars[i] {
            '\'' | '"' => {
                let end = quoted_end(chars, i);
                self.copy(i, end)
            }
            '-' if chars.get(i + 1) == Some(&'-') => {
                let end = chars[i..]
                    .iter()
                    .position(|&c| c == '\n')
                    .map_or(chars.len(), |p| i + p);
                self.copy(i, end)
            }
            '?' => self.positional(i),
            '+' if is_unary_plus(chars, i) => i + 1,
            ':' if i + 1 < chars.len()
                && (chars[i + 1].is_ascii_alphabetic() || chars[i + 1] == '_')
                && (i == 0 || chars[i - 1] != ':') =>
            {
                self.named(i)
            }
            _ if is_word_start(chars, i) => self.word(i),
            c => {
                self.out.push(c);
                i + 1
            }
        }
    }

    /// Copy `start..end` untouched (quoted text, a comment).
    fn copy(&mut self, start: usize, end: usize) -> usize {
        self.out.extend(&self.chars[start..end]);
        end
    }

    /// `?1` becomes `$1`; a bare `?` takes the next number.
    fn positional(&mut self, i: usize) -> usize {
        let digits: String = self.chars[i + 1..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        if digits.is_empty() {
            self.out.push_str(&format!("${}", self.next_anonymous));
            self.next_anonymous += 1;
        } else {
            self.out.push('$');
            self.out.push_str(&digits);
        }
        i + 1 + digits.len()
    }

    /// `:name` becomes `$k`, the same `k` wherever the name recurs.
    fn named(&mut self, i: usize) -> usize {
        let end = word_end(&self.chars, i + 1);
        let name: String = self.chars[i..end].iter().collect();
        let k = match self.names.iter().position(|n| *n == name) {
            Some(k) => k + 1,
            None => {
                self.names.push(name);
                self.names.len()
            }
        };
        self.out.push_str(&format!("${k}"));
        end
    }

    /// A keyword or function name whose spelling differs (see the module's
    /// list); any other word as it is.
    fn word(&mut self, i: usize) -> usize {
        let chars = &self.chars;
        let end = word_end(chars, i);
        let word: String = chars[i..end].iter().collect();
        let upper = word.to_ascii_uppercase();
        match upper.as_str() {
            "LIKE" => self.out.push_str("ILIKE"),
            // SQLite sorts NULL lowest, so last in a DESC order;
            // PostgreSQL sorts it highest.
            "DESC" if !next_word_is(chars, end, "NULLS") => {
                self.out.push_str(&word);
                self.out.push_str(" NULLS LAST");
            }
            // SQLite's `CROSS JOIN ... ON` is an inner join whose
            // order the planner keeps; PostgreSQL has no ON there.
            "CROSS" if next_word_is(chars, end, "JOIN") => {
                let mut i = end;
                while chars.get(i).is_some_and(|c| c.is_whitespace()) {
                    i += 1;
                }
                return i;
            }
            // SQLite's TOTAL is a SUM that is 0.0 over no rows.
            "TOTAL" if chars.get(end) == Some(&'(') => {
                let close = call_extent(chars, end).0;
                let inner: String = chars[end..close].iter().collect();
                self.out.push_str("COALESCE(SUM");
                self.out.push_str(&to_postgres(&inner));
                self.out.push_str(", 0)");
                return close;
            }
            "MAX" | "MIN" if has_two_arguments(chars, end) => self
                .out
                .push_str(if upper == "MAX" { "GREATEST" } else { "LEAST" }),
            _ => self.out.push_str(&word),
        }
        end
    }
}

/// The call whose `(` is at `open`: the index just after its `)`, and
/// whether it has a comma at its own depth (two or more arguments).
fn call_extent(chars: &[char], open: usize) -> (usize, bool) {
    let mut depth = 0;
    let mut comma = false;
    let mut i = open;
    while i < chars.len() {
        match chars[i] {
            '\'' | '"' => {
                i = quoted_end(chars, i);
                continue;
            }
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return (i + 1, comma);
                }
            }
            ',' if depth == 1 => comma = true,
            _ => {}
        }
        i += 1;
    }
    (chars.len(), comma)
}

fn next_word_is(chars: &[char], mut i: usize, word: &str) -> bool {
    while chars.get(i).is_some_and(|c| c.is_whitespace()) {
        i += 1;
    }
    let end = word_end(chars, i);
    chars[i..end]
        .iter()
        .collect::<String>()
        .eq_ignore_ascii_case(word)
}

/// The index after the quoted run starting at `start` (a doubled quote
/// stays inside).
fn quoted_end(chars: &[char], start: usize) -> usize {
    let q = chars[start];
    let mut i = start + 1;
    while i < chars.len() {
        if chars[i] == q {
            if chars.get(i + 1) == Some(&q) {
                i += 2;
                continue;
            }
            return i + 1;
        }
        i += 1;
    }
    chars.len()
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn is_word_start(chars: &[char], i: usize) -> bool {
    (chars[i].is_ascii_alphabetic() || chars[i] == '_')
        && (i == 0 || !is_ident(chars[i - 1]) && chars[i - 1] != '$')
}

fn word_end(chars: &[char], i: usize) -> usize {
    chars[i..]
        .iter()
        .position(|&c| !is_ident(c))
        .map_or(chars.len(), |p| i + p)
}

/// `+` right before a column name, after a space, `(`, `=` or `,`: SQLite's
/// no-index hint, not an addition.
fn is_unary_plus(chars: &[char], i: usize) -> bool {
    let before = i.checked_sub(1).map(|p| chars[p]);
    let after = chars.get(i + 1).copied();
    matches!(before, Some(' ' | '\n' | '\t' | '(' | '=' | ','))
        && after.is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
}

/// Whether the call whose name ends at `end` has a comma at its own depth.
fn has_two_arguments(chars: &[char], end: usize) -> bool {
    let mut i = end;
    while chars.get(i).is_some_and(|c| c.is_whitespace()) {
        i += 1;
    }
    chars.get(i) == Some(&'(') && call_extent(chars, i).1
}

#[cfg(test)]
mod tests {
    use super::to_postgres;

    #[test]
    fn parameters_are_numbered_as_postgres_wants() {
        assert_eq!(
            to_postgres("SELECT a FROM t WHERE b = ?2 AND c = ?1"),
            "SELECT a FROM t WHERE b = $2 AND c = $1"
        );
        assert_eq!(to_postgres("VALUES (?, ?, ?)"), "VALUES ($1, $2, $3)");
    }

    #[test]
    fn named_parameters_are_numbered_by_first_use() {
        assert_eq!(
            super::translate("WHERE a > :lo AND b = :session AND c < :lo LIMIT :limit"),
            (
                "WHERE a > $1 AND b = $2 AND c < $1 LIMIT $3".to_string(),
                vec![
                    ":lo".to_string(),
                    ":session".to_string(),
                    ":limit".to_string()
                ]
            )
        );
    }

    #[test]
    fn quoted_text_is_left_alone() {
        assert_eq!(
            to_postgres("SELECT '?1 +x LIKE max(a, b)' WHERE \"x?\" LIKE ?1"),
            "SELECT '?1 +x LIKE max(a, b)' WHERE \"x?\" ILIKE $1"
        );
        assert_eq!(to_postgres("SELECT 'it''s ?' , ?"), "SELECT 'it''s ?' , $1");
    }

    #[test]
    fn sqlite_only_spellings_are_rewritten() {
        assert_eq!(
            to_postgres("WHERE +session_id = ?1 AND (+m.x = 1)"),
            "WHERE session_id = $1 AND (m.x = 1)"
        );
        assert_eq!(
            to_postgres("SET n = n + 1, m = a+b"),
            "SET n = n + 1, m = a+b"
        );
        assert_eq!(
            to_postgres("SELECT MAX(a), max(b, COALESCE(c, 0)), MIN(x, y) FROM t"),
            "SELECT MAX(a), GREATEST(b, COALESCE(c, 0)), LEAST(x, y) FROM t"
        );
        assert_eq!(
            to_postgres("SELECT TOTAL(MAX(a - b, 0)), total FROM t"),
            "SELECT COALESCE(SUM(GREATEST(a - b, 0)), 0), total FROM t"
        );
        assert_eq!(
            to_postgres("ORDER BY a DESC, b desc NULLS FIRST, c"),
            "ORDER BY a DESC NULLS LAST, b desc NULLS FIRST, c"
        );
        assert_eq!(
            to_postgres("FROM a CROSS JOIN b ON b.x = a.x"),
            "FROM a JOIN b ON b.x = a.x"
        );
        assert_eq!(
            to_postgres("SELECT max_cost FROM t -- ?x\nWHERE a = ?"),
            "SELECT max_cost FROM t -- ?x\nWHERE a = $1"
        );
    }
}
