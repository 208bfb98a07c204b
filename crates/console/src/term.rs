//! The console's terminal loop: raw mode and the alternate screen, restored
//! on every way out (quit, error, panic, SIGTERM); an input thread and the
//! ledger worker feed one channel; frames are drawn only when something
//! changed, at most `MAX_FPS` a second, and at once after a key.

use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use ratatui::crossterm::event::{self, DisableMouseCapture, Event as TermEvent};
use ratatui::crossterm::terminal::{
    BeginSynchronizedUpdate, Clear, ClearType, EndSynchronizedUpdate, EnterAlternateScreen,
    LeaveAlternateScreen, disable_raw_mode, enable_raw_mode,
};
use ratatui::crossterm::{cursor, execute};

use super::app::{App, Dialog, Effect, Overlay, Pane, QuitChoice};
use super::data::{DataMsg, DataWorker};
use super::keymap::Keymap;
use super::settings::ConsoleSettings;
use super::theme::Theme;
use docket_ledger::review::Operator;

/// Frames per second at most while data keeps changing.
pub const MAX_FPS: u64 = 10;

pub struct ConsoleOptions {
    pub workspace: PathBuf,
    pub read_only: bool,
    pub no_color: bool,
    pub keymap_path: Option<PathBuf>,
    pub focus: Pane,
    /// Watch this session (None: the newest).
    pub session: Option<String>,
    /// The run this process started, when the console opened on it.
    pub in_process: Option<InProcessRun>,
    /// Set by a SIGTERM handler: leave now, restoring the terminal.
    pub terminate: Arc<AtomicBool>,
    /// Capture the mouse (`--mouse`); console.toml's `mouse = true` also does.
    pub mouse: bool,
    /// docket's log files, named on the help screen (the binary knows where).
    pub log_files: Option<String>,
}

pub struct InProcessRun {
    pub session_id: String,
    /// Set when the engine stopped dispatching.
    pub finished: Arc<AtomicBool>,
}

/// Figures for the console benchmarks (`DOCKET_CONSOLE_STATS=FILE`).
#[derive(Default)]
struct Figures {
    frames: u64,
    key_latency_us: Vec<u64>,
    first_loaded_frame: Option<Duration>,
}

enum UiEvent {
    Term(TermEvent),
    Data(DataMsg),
}

/// Counts the bytes written to the terminal (for the bandwidth figure).
struct CountingWriter {
    inner: io::Stdout,
    bytes: Arc<AtomicU64>,
}

impl Write for CountingWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bytes.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Restores the terminal when dropped, whatever the way out.
struct TerminalGuard;

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore_terminal();
    }
}

/// Ask for presses, releases and the wheel in SGR form (1000, 1006), not
/// every motion (1002/1003, what crossterm's `EnableMouseCapture` asks
/// for): the console acts on none, and over SSH each move would be a report.
fn enable_mouse_reports() -> io::Result<()> {
    let mut out = io::stdout();
    out.write_all(b"\x1b[?1000h\x1b[?1006h")?;
    out.flush()
}

/// The console asked the terminal for mouse events (given back on the way out).
static MOUSE_CAPTURED: AtomicBool = AtomicBool::new(false);

fn restore_terminal() {
    if MOUSE_CAPTURED.swap(false, Ordering::Relaxed) {
        let _ = execute!(io::stdout(), DisableMouseCapture);
    }
    let _ = disable_raw_mode();
    let _ = execute!(io::stdout(), LeaveAlternateScreen, cursor::Show);
}

/// The console's UI thread while it has the terminal (None: no console).
static UI_THREAD: std::sync::Mutex<Option<std::thread::ThreadId>> = std::sync::Mutex::new(None);

/// A panic on the UI thread restores the terminal, then reports as usual. A
/// panic elsewhere while the console is up (an engine task, which tokio
/// catches and the engine reports) is logged instead: printing it would
/// scribble over the console, and restoring the terminal under a console
/// that keeps running would leave it drawing on the normal screen.
fn install_panic_hook() {
    *UI_THREAD.lock().unwrap_or_else(|p| p.into_inner()) = Some(std::thread::current().id());
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let ui = *UI_THREAD.lock().unwrap_or_else(|p| p.into_inner());
        match ui {
            Some(id) if id != std::thread::current().id() => {
                tracing::error!("panic in a background thread while the console is open: {info}");
            }
            Some(_) => {
                restore_terminal();
                previous(info);
            }
            None => previous(info),
        }
    }));
}

/// The console is gone: panics report as usual again.
fn console_closed() {
    *UI_THREAD.lock().unwrap_or_else(|p| p.into_inner()) = None;
}

/// Open the console; returns how the operator left it.
pub fn run(opts: ConsoleOptions) -> color_eyre::Result<QuitChoice> {
    let started = Instant::now();
    let theme = Theme::detect(opts.no_color);
    let operator = Operator::current();
    let mut app = new_app(&opts, operator.claimant.clone());

    let (ui_tx, ui_rx) = mpsc::channel::<UiEvent>();
    let (fx_tx, fx_rx) = mpsc::channel::<Effect>();
    let worker = DataWorker::new(opts.workspace.clone(), operator, opts.read_only);
    let data_tx = ui_tx.clone();
    let worker_thread = std::thread::Builder::new()
        .name("console-ledger".into())
        .spawn(move || worker.run(fx_rx, move |m| data_tx.send(UiEvent::Data(m)).is_ok()))?;
    // The first read overlaps the terminal set-up.
    for fx in app.start() {
        let _ = fx_tx.send(fx);
    }

    let bytes = Arc::new(AtomicU64::new(0));
    install_panic_hook();
    enable_raw_mode()?;
    let _guard = TerminalGuard;
    // A plain clear: ratatui's `Terminal::clear` asks the terminal where its
    // cursor is, and waits for the answer (seconds, on a terminal that never
    // gives one).
    execute!(io::stdout(), EnterAlternateScreen, Clear(ClearType::All))?;
    if app.screen.mouse {
        MOUSE_CAPTURED.store(true, Ordering::Relaxed);
        enable_mouse_reports()?;
    }
    let backend = CrosstermBackend::new(CountingWriter {
        inner: io::stdout(),
        bytes: bytes.clone(),
    });
    let mut terminal = Terminal::new(backend)?;
    // Keys are read only once the terminal is set up, so no reply to a
    // terminal query is taken for a key, and none is waited for behind it.
    let stop_input = Arc::new(AtomicBool::new(false));
    let input_thread = spawn_input(ui_tx, stop_input.clone())?;
    let mut figures = Figures::default();
    let result = event_loop(
        &mut terminal,
        &mut app,
        &opts,
        theme,
        &ui_rx,
        &fx_tx,
        &mut figures,
        started,
    );

    stop_input.store(true, Ordering::Relaxed);
    drop(fx_tx);
    let _ = terminal.show_cursor();
    drop(terminal);
    drop(_guard);
    console_closed();
    let _ = input_thread.join();
    let _ = worker_thread.join();
    write_figures(&figures, bytes.load(Ordering::Relaxed), started.elapsed());
    result
}

/// The console's state as it opens: the keymap and console.toml read (a
/// problem in either is the first toast), the terminal's size, the pane
/// and session to open on.
fn new_app(opts: &ConsoleOptions, claimant: String) -> App {
    // With no --keymap, `load` reads the config dir's keymap.toml when present.
    let (keymap, warnings) = Keymap::load(opts.keymap_path.as_deref());
    let (settings, settings_warnings) = ConsoleSettings::load(None);
    for w in &settings_warnings {
        tracing::warn!("{w}");
    }
    for w in &warnings {
        tracing::warn!("keymap: {w}");
    }
    let mut app = App::new(keymap, opts.read_only);
    app.screen.mouse = opts.mouse || settings.mouse;
    if let Ok((width, height)) = ratatui::crossterm::terminal::size() {
        app.resized(width, height);
    }
    app.claimant = Some(claimant);
    let review_warning = crate::review_templates::load(&mut app, &opts.workspace);
    app.log_files = opts.log_files.clone();
    app.focus = opts.focus;
    app.chosen_session = opts.session.clone();
    if let Some(run) = &opts.in_process {
        app.in_process_session = Some(run.session_id.clone());
        app.chosen_session = Some(run.session_id.clone());
        app.in_process_live = !run.finished.load(Ordering::Relaxed);
    }
    if let Some(first) = warnings.first() {
        let more = if warnings.len() > 1 {
            format!(" (+{} more in the log)", warnings.len() - 1)
        } else {
            String::new()
        };
        app.set_toast(format!("keymap: {first}{more}; the default binding stays"));
    }
    if let (None, Some(first)) = (&app.toast, settings_warnings.first()) {
        app.set_toast(first.clone());
    }
    if let (None, Some(w)) = (&app.toast, review_warning) {
        app.set_toast(w);
    }
    app
}

fn spawn_input(
    tx: mpsc::Sender<UiEvent>,
    stop: Arc<AtomicBool>,
) -> io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("console-input".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                // Poll with a timeout so the thread notices the stop and no
                // keystroke is stolen from the shell after the console closes.
                match event::poll(Duration::from_millis(100)) {
                    Ok(true) => match event::read() {
                        Ok(ev) => {
                            if tx.send(UiEvent::Term(ev)).is_err() {
                                return;
                            }
                        }
                        Err(_) => return,
                    },
                    Ok(false) => {}
                    Err(_) => return,
                }
            }
        })
}

#[allow(clippy::too_many_arguments)]
fn event_loop<W: Write>(
    terminal: &mut Terminal<CrosstermBackend<W>>,
    app: &mut App,
    opts: &ConsoleOptions,
    theme: Theme,
    rx: &mpsc::Receiver<UiEvent>,
    fx_tx: &mpsc::Sender<Effect>,
    figures: &mut Figures,
    started: Instant,
) -> color_eyre::Result<QuitChoice> {
    let mut pacing = Pacing::new();
    // A PostgreSQL ledger going away (or coming back) is news for the
    // footer even when no data arrives: the reader is busy reconnecting.
    let mut shown_unreachable = docket_ledger::db::unreachable();
    loop {
        let unreachable = docket_ledger::db::unreachable();
        if unreachable != shown_unreachable {
            shown_unreachable = unreachable;
            pacing.dirty = true;
        }
        if let Some(choice) = watch_the_run(app, opts, &mut pacing) {
            return Ok(choice);
        }
        if pacing.draw_now() {
            draw_frame(terminal, app, theme, &mut pacing, figures, started)?;
        }
        let ev = match rx.recv_timeout(pacing.wait()) {
            Ok(ev) => ev,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return Ok(QuitChoice::Close),
        };
        let fx = apply_event(ev, terminal, app, fx_tx, &mut pacing)?;
        pacing.dirty = true;
        for f in fx {
            if let Effect::Quit(choice) = f {
                return Ok(choice);
            }
            let _ = fx_tx.send(f);
        }
        if let Some(choice) = app.quit {
            return Ok(choice);
        }
    }
}

/// When to draw: at most [`MAX_FPS`] frames a second, but a key's answer
/// and the first data without waiting for the next frame slot.
struct Pacing {
    frame_gap: Duration,
    dirty: bool,
    last_draw: Instant,
    /// When the oldest key not yet answered on screen came.
    key_at: Option<Instant>,
    /// Draw without waiting for the next frame slot (a key, the first data).
    urgent: bool,
}

impl Pacing {
    fn new() -> Pacing {
        let frame_gap = Duration::from_millis(1000 / MAX_FPS);
        Pacing {
            frame_gap,
            dirty: true,
            last_draw: Instant::now() - frame_gap,
            key_at: None,
            urgent: false,
        }
    }

    fn due(&self) -> Instant {
        self.last_draw + self.frame_gap
    }

    fn draw_now(&self) -> bool {
        self.dirty && (self.urgent || self.key_at.is_some() || Instant::now() >= self.due())
    }

    /// How long to wait for an event before looking again.
    fn wait(&self) -> Duration {
        if self.dirty {
            self.due().saturating_duration_since(Instant::now())
        } else {
            Duration::from_millis(500)
        }
    }
}

/// A termination signal ends the console (cancelling a run this process
/// drives); a run in this process ending changes what quitting asks.
fn watch_the_run(app: &mut App, opts: &ConsoleOptions, pacing: &mut Pacing) -> Option<QuitChoice> {
    if opts.terminate.load(Ordering::Relaxed) {
        return Some(if app.in_process_live {
            QuitChoice::Cancel
        } else {
            QuitChoice::Close
        });
    }
    if let Some(run) = &opts.in_process {
        let live = !run.finished.load(Ordering::Relaxed);
        if live != app.in_process_live {
            app.in_process_live = live;
            pacing.dirty = true;
            // Its choices are about a run that is over now.
            if !live && matches!(app.overlay, Overlay::Dialog(Dialog::QuitLive)) {
                app.overlay = Overlay::None;
                app.set_toast("The run has ended; q quits.");
            }
        }
    }
    None
}

fn draw_frame<W: Write>(
    terminal: &mut Terminal<CrosstermBackend<W>>,
    app: &App,
    theme: Theme,
    pacing: &mut Pacing,
    figures: &mut Figures,
    started: Instant,
) -> color_eyre::Result<()> {
    pacing.urgent = false;
    terminal.backend_mut().execute_sync(true);
    terminal.draw(|f| super::view::draw(f, app, theme))?;
    terminal.backend_mut().execute_sync(false);
    figures.frames += 1;
    if let Some(t) = pacing.key_at.take() {
        figures.key_latency_us.push(t.elapsed().as_micros() as u64);
    }
    if figures.first_loaded_frame.is_none() && app.loaded {
        figures.first_loaded_frame = Some(started.elapsed());
    }
    pacing.dirty = false;
    pacing.last_draw = Instant::now();
    Ok(())
}

/// One event into the state: a key, a resize, or data from the reader.
fn apply_event<W: Write>(
    ev: UiEvent,
    terminal: &mut Terminal<CrosstermBackend<W>>,
    app: &mut App,
    fx_tx: &mpsc::Sender<Effect>,
    pacing: &mut Pacing,
) -> color_eyre::Result<Vec<Effect>> {
    Ok(match ev {
        UiEvent::Term(TermEvent::Key(k)) => {
            pacing.key_at.get_or_insert_with(Instant::now);
            let _ = fx_tx.send(Effect::Activity);
            app.handle_key(k)
        }
        UiEvent::Term(TermEvent::Resize(width, height)) => {
            terminal.autoresize()?;
            app.resized(width, height)
        }
        UiEvent::Term(TermEvent::Mouse(m)) if app.screen.mouse => {
            pacing.key_at.get_or_insert_with(Instant::now);
            let _ = fx_tx.send(Effect::Activity);
            app.handle_mouse(m)
        }
        UiEvent::Term(_) => Vec::new(),
        UiEvent::Data(DataMsg::Snapshot(s)) => {
            // The first data is drawn at once, like a key's answer.
            pacing.urgent |= !app.loaded;
            app.apply_snapshot(*s)
        }
        UiEvent::Data(DataMsg::Toast(t)) => {
            app.set_toast(t);
            Vec::new()
        }
        UiEvent::Data(DataMsg::Undone(ids)) => app.undone(ids),
    })
}

trait SyncUpdate {
    fn execute_sync(&mut self, begin: bool);
}

impl<W: Write> SyncUpdate for CrosstermBackend<W> {
    /// DEC 2026 synchronized output: the terminal shows a frame whole, which
    /// stops tearing over slow SSH links (ignored by terminals without it).
    fn execute_sync(&mut self, begin: bool) {
        let _ = if begin {
            execute!(self, BeginSynchronizedUpdate)
        } else {
            execute!(self, EndSynchronizedUpdate)
        };
    }
}

fn write_figures(f: &Figures, bytes: u64, elapsed: Duration) {
    let Some(path) = std::env::var_os("DOCKET_CONSOLE_STATS") else {
        return;
    };
    let mut lat = f.key_latency_us.clone();
    lat.sort_unstable();
    let pick = |q: f64| -> u64 {
        if lat.is_empty() {
            0
        } else {
            lat[((lat.len() - 1) as f64 * q).round() as usize]
        }
    };
    let text = format!(
        "frames={}\nbytes={}\nelapsed_ms={}\nkeys={}\nkey_latency_p50_us={}\nkey_latency_max_us={}\nfirst_loaded_frame_ms={}\n",
        f.frames,
        bytes,
        elapsed.as_millis(),
        lat.len(),
        pick(0.5),
        pick(1.0),
        f.first_loaded_frame.map_or(-1, |d| d.as_millis() as i64),
    );
    let _ = std::fs::write(path, text);
}
