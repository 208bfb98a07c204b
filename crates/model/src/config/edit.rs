//! Changing one `[routing]` threshold in a docket.toml's text, leaving
//! every other byte as it was (comments, order, spacing): `docket
//! calibrate --apply`. A line edit, not a re-serialization: the file is the
//! user's. The caller parses the result with the config loader before it
//! writes anything.

/// Why the key could not be placed.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum EditError {
    #[error(
        "line {line}: `{key}` is written as a dotted key or an inline table; \
         change it by hand (docket edits only a `[routing]` table)"
    )]
    Unsupported { line: usize, key: String },
}

/// `source` with `[routing] <key> = value`: the key's value replaced where
/// the `[routing]` table has it (its comment kept), else the key added
/// under the table's header, else a `[routing]` table appended.
pub fn set_routing_value(source: &str, key: &str, value: f64) -> Result<String, EditError> {
    let text = toml_float(value);
    let lines: Vec<&str> = source.split_inclusive('\n').collect();
    let mut table: Option<String> = None;
    let mut header_at: Option<usize> = None;
    let mut in_string = false;
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        let was_in_string = in_string;
        // A `"""` or `'''` opens or closes a multi-line string: what is
        // inside it is no header and no key.
        if (t.matches("\"\"\"").count() + t.matches("'''").count()) % 2 == 1 {
            in_string = !in_string;
        }
        if was_in_string {
            continue;
        }
        if t.starts_with('[') {
            let name = t.trim_start_matches('[');
            let name = name.split(']').next().unwrap_or("").trim();
            table = Some(name.to_string());
            if name == "routing" && !t.starts_with("[[") {
                header_at = Some(i);
            }
            continue;
        }
        let k = t.split('=').next().unwrap_or("").trim();
        let in_routing = table.as_deref() == Some("routing");
        if in_routing && k == key {
            let mut out = lines.clone();
            let replaced = replace_value(line, &text);
            out[i] = &replaced;
            return Ok(out.concat());
        }
        let dotted = table.is_none() && (k == format!("routing.{key}") || k == "routing");
        if dotted {
            return Err(EditError::Unsupported {
                line: i + 1,
                key: format!("routing.{key}"),
            });
        }
    }
    let added = format!("{key} = {text}\n");
    Ok(match header_at {
        Some(h) => {
            let mut out: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
            if !out[h].ends_with('\n') {
                out[h].push('\n');
            }
            out.insert(h + 1, added);
            out.concat()
        }
        None => {
            let sep = if source.is_empty() || source.ends_with('\n') {
                ""
            } else {
                "\n"
            };
            format!("{source}{sep}\n[routing]\n{added}")
        }
    })
}

/// `key = old  # comment\n` with `new` in place of `old`.
fn replace_value(line: &str, new: &str) -> String {
    let Some(eq) = line.find('=') else {
        return line.to_string();
    };
    let (head, rest) = line.split_at(eq + 1);
    let lead = rest.len() - rest.trim_start().len();
    let value_and_tail = &rest[lead..];
    let end = value_and_tail
        .find(|c: char| c.is_whitespace() || c == '#')
        .unwrap_or(value_and_tail.len());
    format!("{head}{}{new}{}", &rest[..lead], &value_and_tail[end..])
}

/// A TOML float: always with a fraction (`1.0`, never the integer `1`).
fn toml_float(v: f64) -> String {
    let s = format!("{}", (v * 1e6).round() / 1e6);
    if s.contains('.') { s } else { format!("{s}.0") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_value_is_replaced_and_the_rest_kept() {
        let src = "# job\n[routing]\nreview_threshold = 0.6\nauto_accept_threshold   =  0.85 # tuned\n\n[job]\nname = \"x\"\n";
        let out = set_routing_value(src, "auto_accept_threshold", 0.9).unwrap();
        assert_eq!(
            out,
            src.replace("=  0.85 # tuned", "=  0.9 # tuned"),
            "only the value changes"
        );
    }

    #[test]
    fn a_missing_key_goes_under_the_header_and_a_missing_table_at_the_end() {
        let out = set_routing_value(
            "[routing]\nreview_threshold = 0.5\n",
            "auto_accept_threshold",
            1.0,
        )
        .unwrap();
        assert_eq!(
            out,
            "[routing]\nauto_accept_threshold = 1.0\nreview_threshold = 0.5\n"
        );
        let out = set_routing_value("[job]\nname = \"x\"", "auto_accept_threshold", 0.95).unwrap();
        assert_eq!(
            out,
            "[job]\nname = \"x\"\n\n[routing]\nauto_accept_threshold = 0.95\n"
        );
    }

    #[test]
    fn keys_of_other_tables_and_inside_strings_are_left_alone() {
        let src = "[routing.critic]\nauto_accept_threshold = 1\ndesc = \"\"\"\n[routing]\nauto_accept_threshold = 0.1\n\"\"\"\n";
        let out = set_routing_value(src, "auto_accept_threshold", 0.9).unwrap();
        assert!(out.starts_with(src), "{out}");
        assert!(
            out.ends_with("\n[routing]\nauto_accept_threshold = 0.9\n"),
            "{out}"
        );
    }

    #[test]
    fn a_dotted_key_is_refused() {
        let e = set_routing_value(
            "routing.auto_accept_threshold = 0.8\n",
            "auto_accept_threshold",
            0.9,
        );
        assert!(
            matches!(e, Err(EditError::Unsupported { line: 1, .. })),
            "{e:?}"
        );
    }
}
