//! The operations console (ratatui + crossterm). A client of the engine: it
//! reads the ledger through `watch`, writes decisions and controls through
//! `review` and `control`, and never speaks HTTP or SQL itself.

pub mod action;
pub mod keymap;
