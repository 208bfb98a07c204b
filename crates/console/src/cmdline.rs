//! The `:` command line: the rarer actions by name, with completion.
//!
//! `pause`, `resume`, `stop-at-stage`, `cancel`, `retune rpm=N tpm=N
//! concurrency=N`, `export [decisions|results|requests] [csv|jsonl] [PATH]`,
//! `session ID`, `quit`, and every key's action by its keymap name.

use super::action::Action;
use super::app::Control;
use docket_ledger::watch::{SessionSummary, Tune};

#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    Action(Action),
    Control(Control),
    Session(String),
    Export {
        what: String,
        format: String,
        path: String,
    },
    Nothing,
}

/// The command words, in the order completion offers them.
pub const WORDS: &[&str] = &[
    "pause",
    "resume",
    "stop-at-stage",
    "cancel",
    "retune",
    "export",
    "session",
    "quit",
];

const EXPORT_WHAT: &[&str] = &["decisions", "results", "requests", "items"];
const EXPORT_FORMAT: &[&str] = &["csv", "jsonl", "parquet"];
const RETUNE_KEYS: &[&str] = &["rpm=", "tpm=", "concurrency="];

/// What is wrong with a `:` command line; its text is the toast.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    #[error("usage: session SESSION_ID")]
    SessionUsage,
    /// The first word, as typed.
    #[error("unknown command {0:?} (Tab completes; `help` lists keys)")]
    Unknown(String),
    #[error(
        "usage: retune rpm=N tpm=N concurrency=N (any of them; 0 = no client limit for rpm/tpm)"
    )]
    RetuneUsage,
    /// The argument, as typed.
    #[error("retune: {0:?} is not key=value")]
    NotKeyValue(String),
    #[error("retune: {key}={value:?} is not a whole number")]
    NotWholeNumber { key: String, value: String },
    #[error("retune: concurrency must be 1..=10000")]
    ConcurrencyRange,
    #[error("retune: unknown key {0:?} (rpm, tpm, concurrency)")]
    UnknownRetuneKey(String),
    /// An argument after the path, as typed.
    #[error("export: unexpected {0:?}")]
    ExportUnexpected(String),
}

pub fn parse(text: &str) -> Result<Command, CommandError> {
    let mut words = text.split_whitespace();
    let Some(head) = words.next() else {
        return Ok(Command::Nothing);
    };
    let rest: Vec<&str> = words.collect();
    match head {
        "pause" => Ok(Command::Control(Control::Pause)),
        "resume" => Ok(Command::Control(Control::Resume)),
        "stop-at-stage" => Ok(Command::Control(Control::StopAtStage)),
        "cancel" => Ok(Command::Action(Action::CancelRun)),
        "q" | "quit" => Ok(Command::Action(Action::Quit)),
        "retune" => parse_retune(&rest),
        "session" => match rest.as_slice() {
            [id] => Ok(Command::Session((*id).to_string())),
            _ => Err(CommandError::SessionUsage),
        },
        "export" => parse_export(&rest),
        other => Action::from_name(&other.replace('-', "_"))
            .map(Command::Action)
            .ok_or_else(|| CommandError::Unknown(other.to_string())),
    }
}

fn parse_retune(args: &[&str]) -> Result<Command, CommandError> {
    if args.is_empty() {
        return Err(CommandError::RetuneUsage);
    }
    let mut tune = Tune::default();
    for a in args {
        let (key, value) = a
            .split_once('=')
            .ok_or_else(|| CommandError::NotKeyValue((*a).to_string()))?;
        let n: u64 = value.parse().map_err(|_| CommandError::NotWholeNumber {
            key: key.to_string(),
            value: value.to_string(),
        })?;
        match key {
            "rpm" => tune.rpm = Some(n),
            "tpm" => tune.tpm = Some(n),
            "concurrency" if (1..=10_000).contains(&n) => tune.concurrency = Some(n),
            "concurrency" => return Err(CommandError::ConcurrencyRange),
            _ => {
                return Err(CommandError::UnknownRetuneKey(key.to_string()));
            }
        }
    }
    Ok(Command::Control(Control::Retune(tune)))
}

fn parse_export(args: &[&str]) -> Result<Command, CommandError> {
    let mut what = "results".to_string();
    let mut format = "csv".to_string();
    let mut path = None;
    for a in args {
        if EXPORT_WHAT.contains(a) {
            what = (*a).to_string();
        } else if EXPORT_FORMAT.contains(a) {
            format = (*a).to_string();
        } else if path.is_none() {
            path = Some((*a).to_string());
        } else {
            return Err(CommandError::ExportUnexpected((*a).to_string()));
        }
    }
    let path = path.unwrap_or_else(|| format!("docket-{what}.{format}"));
    Ok(Command::Export { what, format, path })
}

/// Complete the last word: returns the new text and, when several fit, the
/// options.
pub fn complete(text: &str, sessions: &[SessionSummary]) -> (String, Vec<String>) {
    let (done, last) = match text.rfind(' ') {
        Some(i) => (&text[..=i], &text[i + 1..]),
        None => ("", text),
    };
    let head = text.split_whitespace().next().unwrap_or("");
    let candidates: Vec<String> = if done.is_empty() {
        WORDS
            .iter()
            .map(|w| (*w).to_string())
            // An action named like a command word (`stop_at_stage`) is that word.
            .chain(
                Action::ALL
                    .iter()
                    .map(|a| a.name().to_string())
                    .filter(|n| !WORDS.contains(&n.replace('_', "-").as_str())),
            )
            .collect()
    } else {
        match head {
            "session" => sessions.iter().map(|s| s.session_id.clone()).collect(),
            "export" => EXPORT_WHAT
                .iter()
                .chain(EXPORT_FORMAT)
                .map(|w| (*w).to_string())
                .collect(),
            "retune" => RETUNE_KEYS.iter().map(|w| (*w).to_string()).collect(),
            _ => Vec::new(),
        }
    };
    let fits: Vec<String> = candidates
        .into_iter()
        .filter(|c| c.starts_with(last))
        .collect();
    match fits.as_slice() {
        [] => (text.to_string(), Vec::new()),
        [one] => {
            let space = if one.ends_with('=') { "" } else { " " };
            (format!("{done}{one}{space}"), fits.clone())
        }
        many => {
            let prefix = common_prefix(many);
            (format!("{done}{prefix}"), fits.clone())
        }
    }
}

fn common_prefix(words: &[String]) -> String {
    let first = &words[0];
    let mut end = first.len();
    for w in &words[1..] {
        end = end.min(
            first
                .char_indices()
                .zip(w.chars())
                .take_while(|((_, a), b)| a == b)
                .last()
                .map(|((i, c), _)| i + c.len_utf8())
                .unwrap_or(0),
        );
    }
    first[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_controls_retune_export_and_actions() {
        assert_eq!(parse("pause"), Ok(Command::Control(Control::Pause)));
        assert_eq!(
            parse("retune rpm=120 concurrency=4"),
            Ok(Command::Control(Control::Retune(Tune {
                rpm: Some(120),
                tpm: None,
                concurrency: Some(4)
            })))
        );
        assert!(parse("retune concurrency=0").is_err());
        assert!(
            parse("retune rpm=fast")
                .unwrap_err()
                .to_string()
                .contains("rpm")
        );
        assert_eq!(
            parse("export requests jsonl /tmp/x.jsonl"),
            Ok(Command::Export {
                what: "requests".into(),
                format: "jsonl".into(),
                path: "/tmp/x.jsonl".into()
            })
        );
        assert_eq!(parse("accept"), Ok(Command::Action(Action::Accept)));
        assert_eq!(
            parse("focus-review"),
            Ok(Command::Action(Action::FocusReview))
        );
        assert_eq!(
            parse("session batch_1"),
            Ok(Command::Session("batch_1".into()))
        );
        assert!(
            parse("frobnicate")
                .unwrap_err()
                .to_string()
                .contains("frobnicate")
        );
        assert_eq!(parse("   "), Ok(Command::Nothing));
    }

    #[test]
    fn completes_words_sessions_and_keys() {
        assert_eq!(complete("ret", &[]).0, "retune ");
        let (text, options) = complete("re", &[]);
        assert_eq!(text, "re");
        assert!(options.contains(&"resume".to_string()) && options.contains(&"retune".to_string()));
        assert_eq!(complete("retune conc", &[]).0, "retune concurrency=");
        assert_eq!(complete("export req", &[]).0, "export requests ");
        assert_eq!(complete("stop", &[]).0, "stop-at-stage ");
        assert_eq!(complete("toggle", &[]).0, "toggle_mark ");
    }
}
