//! The operations console (ratatui + crossterm). A client of the engine: it
//! holds a ledger handle, reads through `ledger::console::ConsoleReads` into
//! the plain types of `watch`, writes decisions and controls through
//! `review` and `control`, and never speaks HTTP or SQL itself.
//!
//! `app` is the state (pure), `keys` turns keys into actions, `view` draws,
//! `data` is the ledger worker thread, `term` the terminal loop.
//!
//! This crate owns the terminal: ratatui and crossterm are used nowhere
//! else. It may reach the ledger only through the ledger API (never SQL),
//! and may not touch the engine or a provider's HTTP; it uses the providers
//! crate only for how a batch's state reads (its stall window).

pub mod action;
pub mod app;
pub mod cmdline;
pub mod data;
mod human;
pub mod keymap;
mod keys;
mod review_templates;
pub mod settings;
pub mod term;
pub mod theme;
pub mod view;
