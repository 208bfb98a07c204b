//! `docket report SESSION`: one self-contained HTML file about a run to
//! share: its header, stage table, outcome counts, a confidence histogram
//! per stage with the routing thresholds, the calibration against human
//! review decisions, throughput and cost over time,
//! errors by kind, provider batches and the config snapshot.
//!
//! Self-contained: the page's style is inline, its charts are inline SVG,
//! nothing is fetched and no script runs. Every text that came from an
//! item, a model, a provider or the config is HTML-escaped (`esc`). The
//! numbers come from the reads `batch-results` and the exports use
//! (`gather`), and each key number also sits in a `data-key` /
//! `data-value` pair so a script (or a test) can read it back exactly.

mod calibration;
mod config;
mod gather;
mod render;
mod sections;
mod series;
mod svg;

use std::io::{self, Write};
use std::path::Path;

use super::ReportError;
use crate::Ledger;

/// Write the report of `session_id` as HTML to `out`.
pub fn write_html(
    ledger: &Ledger,
    session_id: &str,
    out: &mut dyn Write,
) -> Result<(), ReportError> {
    let page = page(ledger, session_id)?;
    out.write_all(page.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// Write the report of `session_id` to the file `path`: whole or not at
/// all (written beside it and renamed over it), never over the ledger.
pub fn write_html_file(
    ledger: &Ledger,
    session_id: &str,
    workspace: &Path,
    path: &Path,
) -> Result<(), ReportError> {
    super::export::refuse_the_ledger(workspace, path)?;
    // Read first, so an unknown session leaves no file behind.
    let page = page(ledger, session_id)?;
    replace_file(path, page.as_bytes())
}

/// Write `bytes` to `path` as `export --output` does: beside it then
/// renamed over it once whole and on disk (a report written over keeps
/// its mode); a FIFO, a device or a link to one is written in place.
fn replace_file(path: &Path, bytes: &[u8]) -> Result<(), ReportError> {
    let named = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
    if std::fs::symlink_metadata(path).is_ok_and(|m| !m.file_type().is_file()) {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(named)?;
        f.write_all(bytes).map_err(named)?;
        return Ok(());
    }
    let partial = super::export::partial_path(path);
    let kept_mode = std::fs::metadata(path).ok().map(|m| m.permissions());
    let written = (|| -> io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&partial)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        if let Some(mode) = &kept_mode {
            std::fs::set_permissions(&partial, mode.clone())?;
        }
        std::fs::rename(&partial, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    written.map_err(named).map_err(Into::into)
}

fn page(ledger: &Ledger, session_id: &str) -> Result<String, ReportError> {
    let g = gather::gather(ledger, session_id)?;
    Ok(render::page(&g, crate::now_ts()))
}

/// `s` safe inside HTML text and a quoted attribute.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            // Control characters other than line breaks and tabs have no
            // business in a page (an escape sequence from a model).
            c if c.is_control() && c != '\n' && c != '\t' => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_quotes_and_controls() {
        assert_eq!(
            esc("<script>alert('x\")</script>&\u{1b}[2J\n"),
            "&lt;script&gt;alert(&#39;x&quot;)&lt;/script&gt;&amp;[2J\n"
        );
    }
}
