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
        for (line, id) in &report.differing_rows {
            writeln!(
                out,
                "  {file}:{line}: {} differs from the ledger's copy (kept as first imported)",
                printable(&format!("{:?}", docket_model::sanitize::for_terminal(id)))
            )?;
        }
        if report.differing > report.differing_rows.len() as u64 {
            writeln!(
                out,
                "  … and {} more with different content",
                group_thousands(report.differing - report.differing_rows.len() as u64)
            )?;
        }
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
    if report.bad_count > shown {
        writeln!(
            out,
            "  … and {} more",
            group_thousands(report.bad_count - shown)
        )?;
    }
    Ok(())
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
    for (line, id) in &report.differing_rows {
        writeln!(
            out,
            "  {file}:{line}: {} changed: evidence replaced",
            printable(&format!("{:?}", docket_model::sanitize::for_terminal(id)))
        )?;
    }
    if changed > report.differing_rows.len() as u64 {
        writeln!(
            out,
            "  … and {} more changed",
            group_thousands(changed - report.differing_rows.len() as u64)
        )?;
    }
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
    if n > shown {
        writeln!(out, "  … and {} more", group_thousands(n - shown))?;
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
}
