//! The terminal the console would draw on: standard output a terminal,
//! its size against the console's minimum (`tui::view::MIN_WIDTH` x
//! `MIN_HEIGHT`), colour (NO_COLOR, TERM, COLORTERM) and a UTF-8 locale
//! (LC_ALL, LC_CTYPE, LANG, in the order libc reads them). Warnings only:
//! docket works without any of them (line output, no colour).

use std::io::IsTerminal;

use docket::tui::view::{MIN_HEIGHT, MIN_WIDTH};

use super::Check;

pub(super) fn checks() -> Vec<Check> {
    let tty = std::io::stdout().is_terminal();
    vec![
        tty_check(tty),
        size_check(tty),
        colour_check(),
        utf8_check(),
    ]
}

fn tty_check(tty: bool) -> Check {
    if tty {
        Check::ok("terminal.tty", "standard output is a terminal")
    } else {
        Check::warn(
            "terminal.tty",
            "standard output is not a terminal: runs print lines, not the console",
            "run docket in a terminal for the console (batch-adjudicate --headless works anywhere)",
        )
    }
}

fn size_check(tty: bool) -> Check {
    let Some((cols, rows)) = tty.then(size).flatten() else {
        return Check::warn(
            "terminal.size",
            "not known: standard output is not a terminal",
            "run `docket doctor` in the terminal the console will use",
        );
    };
    if cols >= MIN_WIDTH && rows >= MIN_HEIGHT {
        Check::ok("terminal.size", format!("{cols}x{rows}"))
    } else {
        Check::warn(
            "terminal.size",
            format!(
                "{cols}x{rows}, under the console's {MIN_WIDTH}x{MIN_HEIGHT}: it shows only a \"too small\" notice"
            ),
            format!("make the window at least {MIN_WIDTH} columns by {MIN_HEIGHT} rows"),
        )
    }
}

/// Columns and rows of the terminal on standard output.
fn size() -> Option<(u16, u16)> {
    // SAFETY: TIOCGWINSZ fills the zeroed winsize we own; fd 1 is ours.
    let ws = unsafe {
        let mut ws: libc::winsize = std::mem::zeroed();
        if libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) != 0 {
            return None;
        }
        ws
    };
    (ws.ws_col > 0 && ws.ws_row > 0).then_some((ws.ws_col, ws.ws_row))
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn colour_check() -> Check {
    const FIX_TERM: &str = "set TERM to your terminal's type (e.g. export TERM=xterm-256color)";
    if env("NO_COLOR").is_some() {
        return Check::warn(
            "terminal.colour",
            "NO_COLOR is set: the console draws without colour (states keep their words and glyphs)",
            "unset NO_COLOR for colour",
        );
    }
    let Some(term) = env("TERM") else {
        return Check::warn(
            "terminal.colour",
            "TERM is not set: colour and cursor control are unknown",
            FIX_TERM,
        );
    };
    if term == "dumb" {
        return Check::warn(
            "terminal.colour",
            "TERM=dumb: no colour or cursor control",
            FIX_TERM,
        );
    }
    let depth = match env("COLORTERM").as_deref() {
        Some("truecolor" | "24bit") => "24-bit colour",
        _ if term.contains("256color") => "256 colours",
        _ => "colour",
    };
    let colorterm = env("COLORTERM")
        .map(|c| format!(", COLORTERM={c}"))
        .unwrap_or_default();
    Check::ok(
        "terminal.colour",
        format!("TERM={term}{colorterm}: {depth}"),
    )
}

fn utf8_check() -> Check {
    let found = ["LC_ALL", "LC_CTYPE", "LANG"]
        .into_iter()
        .find_map(|name| env(name).map(|v| (name, v)));
    let fix = "export LANG=C.UTF-8 (or another UTF-8 locale; LC_ALL and LC_CTYPE override LANG)";
    match found {
        Some((name, value)) => {
            let lower = value.to_ascii_lowercase();
            if lower.contains("utf-8") || lower.contains("utf8") {
                Check::ok("terminal.utf8", format!("{name}={value}"))
            } else {
                Check::warn(
                    "terminal.utf8",
                    format!(
                        "{name}={value}: not UTF-8, the console's lines and glyphs may show as garbage"
                    ),
                    fix,
                )
            }
        }
        None => Check::warn(
            "terminal.utf8",
            "no LC_ALL, LC_CTYPE or LANG: the C locale, not UTF-8",
            fix,
        ),
    }
}
