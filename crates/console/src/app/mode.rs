//! The footer's mode badge: what the keys act on now.

/// The badge in the footer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Normal,
    Detail,
    Help,
    Batches,
    Workers,
    Charts,
    Event,
    Filter,
    Command,
    Confirm,
    Correct,
}

impl Mode {
    pub fn label(self) -> &'static str {
        match self {
            Mode::Normal => "NORMAL",
            Mode::Detail => "DETAIL",
            Mode::Help => "HELP",
            Mode::Batches => "BATCHES",
            Mode::Workers => "WORKERS",
            Mode::Charts => "CHARTS",
            Mode::Event => "EVENT",
            Mode::Filter => "FILTER",
            Mode::Command => "CMD",
            Mode::Confirm => "CONFIRM",
            Mode::Correct => "CORRECT",
        }
    }
}
