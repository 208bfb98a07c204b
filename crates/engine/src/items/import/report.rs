//! The import's report as the operator reads it: counts grouped in
//! thousands, and the bad rows shown printable.

use std::io;

use super::{ImportReport, RENDERED_BAD_ROWS};

pub(super) fn plural(n: u64, one: &'static str, many: &'static str) -> &'static str {
    if n == 1 { one } else { many }
}

/// 1234567 -> "1,234,567".
pub(crate) fn group_thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// What `docket import` prints: one summary line, then up to 20 bad rows.
pub fn render_import_report(report: &ImportReport, out: &mut dyn io::Write) -> io::Result<()> {
    // A file's name is the operator's, but may hold anything (row X4).
    let file = docket_model::sanitize::for_terminal(&report.file.display().to_string());
    let read = format!(
        "{} {} read",
        group_thousands(report.rows_read),
        plural(report.rows_read, "row", "rows")
    );
    if report.committed && report.updated {
        render_update(report, &file, &read, out)?;
    } else if report.committed {
        let differing = if report.differing > 0 {
            format!(
                " ({} of them with different content: the ledger keeps what it has)",
                group_thousands(report.differing)
            )
        } else {
            String::new()
        };
        writeln!(
            out,
            "Imported {} new {} from {file} ({read}; {} already present{differing}; {} bad {} skipped)",
            group_thousands(report.imported),
            plural(report.imported, "item", "items"),
            group_thousands(report.already_present),
            group_thousands(report.bad_count),
            plural(report.bad_count, "row", "rows"),
        )?;
        render_differing(
            report,
            file.as_str(),
            "differs from the ledger's copy (kept as first imported)",
            "with different content",
            out,
        )?;
        if report.differing > 0 {
            writeln!(
                out,
                "  `docket import --update` replaces their evidence: what was made on the old one is marked stale, and the next run asks again for those items alone"
            )?;
        }
    } else {
        writeln!(
            out,
            "Imported nothing from {file} ({read}; {} bad {}; strict mode rolls back on any bad row)",
            group_thousands(report.bad_count),
            plural(report.bad_count, "row", "rows"),
        )?;
    }
    render_unrenderable(report, &file, out)?;
    for bad in report.bad_rows.iter().take(RENDERED_BAD_ROWS) {
        writeln!(out, "  {file}:{}: {}", bad.line, printable(&bad.reason))?;
    }
    let shown = report.bad_rows.len().min(RENDERED_BAD_ROWS) as u64;
    and_more(out, report.bad_count, shown, "")
}

/// `--update`: new / changed / unchanged, and what the changed evidence
/// made stale.
fn render_update(
    report: &ImportReport,
    file: &str,
    read: &str,
    out: &mut dyn io::Write,
) -> io::Result<()> {
    let changed = report.differing;
    writeln!(
        out,
        "Imported from {file}: {} new, {} changed, {} unchanged ({read}; {} bad {} skipped)",
        group_thousands(report.imported),
        group_thousands(changed),
        group_thousands(report.already_present - changed),
        group_thousands(report.bad_count),
        plural(report.bad_count, "row", "rows"),
    )?;
    render_differing(report, file, "changed: evidence replaced", "changed", out)?;
    if changed > 0 {
        let s = &report.stale;
        writeln!(
            out,
            "  marked stale: {} {}, {} pending and {} decided review {} (decisions stand); {} auto-accept(s) undone. \
             The next `docket run` asks again for the changed items only, as a new request version",
            group_thousands(s.outcomes),
            plural(s.outcomes, "outcome", "outcomes"),
            group_thousands(s.pending_reviews),
            group_thousands(s.decided_reviews),
            plural(s.pending_reviews + s.decided_reviews, "item", "items"),
            group_thousands(s.auto_accepts_undone),
        )?;
    }
    Ok(())
}

/// The rows whose content differs from the ledger's copy, up to the first
/// few (`report.differing_rows`): `{file}:{line}: {id} {what}`, then how
/// many more (`… and N more {more}`).
fn render_differing(
    report: &ImportReport,
    file: &str,
    what: &str,
    more: &str,
    out: &mut dyn io::Write,
) -> io::Result<()> {
    for (line, id) in &report.differing_rows {
        writeln!(
            out,
            "  {file}:{line}: {} {what}",
            printable(&format!("{:?}", docket_model::sanitize::for_terminal(id)))
        )?;
    }
    and_more(
        out,
        report.differing,
        report.differing_rows.len() as u64,
        &format!(" {more}"),
    )
}

/// The new rows the job's templates cannot render: imported, but a run
/// will fail them (each alone); how many, the first few, and the way out.
fn render_unrenderable(
    report: &ImportReport,
    file: &str,
    out: &mut dyn io::Write,
) -> io::Result<()> {
    let n = report.unrenderable_count;
    if n == 0 {
        return Ok(());
    }
    writeln!(
        out,
        "warning: {} new {} cannot be rendered by the job's templates: a run ends {} in error without a request \
         (remove with `docket items rm ID...`, then fix the rows and import again; or fix the template; --strict refuses such rows)",
        group_thousands(n),
        plural(n, "item", "items"),
        plural(n, "it", "them"),
    )?;
    for row in report.unrenderable.iter().take(RENDERED_BAD_ROWS) {
        writeln!(
            out,
            "  {file}:{}: item {}: {}",
            row.line,
            printable(&format!(
                "{:?}",
                docket_model::sanitize::for_terminal(&row.item_id)
            )),
            printable(&row.reason)
        )?;
    }
    let shown = report.unrenderable.len().min(RENDERED_BAD_ROWS) as u64;
    and_more(out, n, shown, "")
}

/// `  … and N more{what}` under a list that showed `shown` of `total`;
/// nothing when it showed them all.
fn and_more(out: &mut dyn io::Write, total: u64, shown: u64, what: &str) -> io::Result<()> {
    if total > shown {
        writeln!(out, "  … and {} more{what}", group_thousands(total - shown))?;
    }
    Ok(())
}

/// Reasons quote bits of the input; keep terminal escapes out of them.
fn printable(s: &str) -> String {
    s.chars()
        .filter_map(|c| match c {
            '\n' | '\t' | '\r' => Some(' '),
            c if c.is_control() => None,
            c => Some(c),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands() {
        assert_eq!(group_thousands(0), "0");
        assert_eq!(group_thousands(999), "999");
        assert_eq!(group_thousands(1000), "1,000");
        assert_eq!(group_thousands(1234567), "1,234,567");
    }

    /// Differing rows read alike with and without `--update`: each shown
    /// row by file and line, then the count beyond them.
    #[test]
    fn differing_rows_then_how_many_more() {
        let mut report = ImportReport::new(std::path::Path::new("items.jsonl"));
        report.committed = true;
        report.rows_read = 1_502;
        report.already_present = 1_502;
        report.differing = 1_502;
        report.differing_rows = vec![(3, "a".into()), (9, "b\u{1b}[2J".into())];
        let text = |report: &ImportReport| {
            let mut out = Vec::new();
            render_import_report(report, &mut out).unwrap();
            String::from_utf8(out).unwrap()
        };
        let kept = text(&report);
        assert!(
            kept.contains(
                "  items.jsonl:3: \"a\" differs from the ledger's copy (kept as first imported)\n"
            ),
            "{kept}"
        );
        assert!(kept.contains("  items.jsonl:9: \"b\" differs"), "{kept}");
        assert!(
            kept.contains("  … and 1,500 more with different content\n"),
            "{kept}"
        );
        report.updated = true;
        let replaced = text(&report);
        assert!(
            replaced.contains("  items.jsonl:3: \"a\" changed: evidence replaced\n"),
            "{replaced}"
        );
        assert!(
            replaced.contains("  … and 1,500 more changed\n"),
            "{replaced}"
        );
        assert!(!replaced.contains('\u{1b}'), "{replaced}");
    }
}
