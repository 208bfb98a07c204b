//! The console's charts: the ledger read behind them (a real SQLite file
//! with rows written as the engine writes them), the keys that open and
//! switch them, and insta snapshots at 80x24 (one chart a page) and 120x40
//! (every chart), plus NO_COLOR: the same words and glyphs without colour.

use docket::ledger::console::ConsoleReads;
use docket::ledger::store::SessionRow;
use docket::tui::app::{App, Effect, Mode, Overlay, Snapshot};
use docket::tui::keymap::Keymap;
use docket::tui::theme::Theme;
use docket::watch::{
    CONFIDENCE_BINS, ChartData, Engine, SessionView, StageHistogram, StageProgress, StateFacts,
    TIMELINE_SLICES, Timeline, Tune, shown_state,
};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::style::Color;

/// 2023-11-14 22:13:20 UTC.
const NOW: f64 = 1_700_000_000.0;
const SESSION: &str = "batch_20231114_221000";
const SNAPSHOT: &str = r#"{"config":{"routing":{"auto_accept_threshold":0.9,"review_threshold":0.5}},
    "flags":{"auto_accept_threshold":0.85,"review_threshold":0.6,"min_confidence":null}}"#;

// ---------------------------------------------------------------- fixtures

fn view() -> SessionView {
    SessionView {
        row: SessionRow {
            session_id: SESSION.into(),
            started_at: NOW - 754.0,
            completed_at: None,
            total_count: 1000,
            processed_count: 400,
            accepted_count: 300,
            reviewed_count: 60,
            rejected_count: 30,
            error_count: 10,
            state: "running".into(),
            desired_state: "running".into(),
            stop_reason: None,
            retry_count: 3,
            rate_limited_count: 2,
            ambiguous_count: 1,
            input_tokens: 120_000,
            output_tokens: 30_000,
            cost_usd: 0.4321,
            estimated_tokens: 600_000,
            estimated_cost_usd: 1.08,
            max_cost_usd: Some(2.0),
            config_snapshot_json: SNAPSHOT.into(),
        },
        tune: Tune::default(),
        gauges: None,
        stages: vec![
            StageProgress {
                name: "triage".into(),
                total: 1000,
                done: 400,
                ..StageProgress::default()
            },
            StageProgress {
                name: "verify".into(),
                total: 60,
                done: 12,
                ..StageProgress::default()
            },
        ],
        live: true,
        shown: shown_state(StateFacts {
            stored: "running",
            desired: "running",
            stop_after_stage: false,
            engine: Engine::Live,
        }),
        heartbeat_age_secs: Some(1.0),
        in_flight: 8,
        at_provider: 0,
        pending: 592,
        stop_after_stage: None,
        profile: None,
    }
}

/// A bell of confidences peaking at 0.85-0.90, and a flatter one.
fn charts() -> ChartData {
    let bell: Vec<u64> = (0..CONFIDENCE_BINS as i64)
        .map(|i| (40 - (i - 17).pow(2) * 3).max(0) as u64 + u64::from(i > 5))
        .collect();
    let flat: Vec<u64> = (0..CONFIDENCE_BINS as u64).map(|i| i % 4).collect();
    let n = TIMELINE_SLICES;
    let sent: Vec<u64> = (0..n).map(|i| 5 + (i % 30) as u64 / 3).collect();
    let throttled: Vec<u64> = (0..n).map(|i| u64::from(i % 50 == 7) * 2).collect();
    let errors: Vec<u64> = (0..n).map(|i| u64::from(i == 180)).collect();
    let cost: Vec<f64> = (0..n).map(|i| (i + 1) as f64 * 0.4321 / n as f64).collect();
    ChartData {
        confidence: vec![
            StageHistogram {
                stage: "triage".into(),
                bins: bell,
            },
            StageHistogram {
                // Hostile text from a config: made safe when drawn.
                stage: "verify\u{1b}[31m".into(),
                bins: flat,
            },
        ],
        timeline: Timeline {
            start: NOW - 754.0,
            slice_secs: 754.0 / n as f64,
            sent,
            throttled,
            errors,
            cost,
        },
        ..ChartData::default()
    }
}

fn app(charts_loaded: bool) -> App {
    let mut app = App::new(Keymap::default_map(), false);
    app.apply_snapshot(Snapshot {
        view: Some(view()),
        charts: charts_loaded.then(charts),
        now: NOW,
        ..Snapshot::default()
    });
    app
}

fn key(code: KeyCode) -> KeyEvent {
    KeyEvent::new(code, KeyModifiers::NONE)
}

fn render(app: &App, w: u16, h: u16, theme: Theme) -> Terminal<TestBackend> {
    let mut terminal = Terminal::new(TestBackend::new(w, h)).expect("terminal");
    terminal
        .draw(|frame| docket::tui::view::draw(frame, app, theme))
        .expect("draw");
    terminal
}

fn text(buf: &Buffer) -> String {
    let area = buf.area;
    (0..area.height)
        .map(|y| {
            (0..area.width)
                .map(|x| buf[(x, y)].symbol().to_string())
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The charts open with `v` (and say so to the data side), tab and
/// backtab switch the chart, Esc closes them (and the reads stop).
#[test]
fn v_opens_the_charts_tab_switches_and_esc_closes() {
    let mut app = app(false);
    let fx = app.handle_key(key(KeyCode::Char('v')));
    assert!(fx.contains(&Effect::Charts(true)), "{fx:?}");
    assert_eq!(app.mode(), Mode::Charts);
    assert!(matches!(app.overlay, Overlay::Charts { page: 0 }));
    app.handle_key(key(KeyCode::Tab));
    app.handle_key(key(KeyCode::Tab));
    assert!(matches!(app.overlay, Overlay::Charts { page: 2 }));
    app.handle_key(key(KeyCode::Tab));
    assert!(
        matches!(app.overlay, Overlay::Charts { page: 3 }),
        "calibration"
    );
    app.handle_key(key(KeyCode::Tab));
    assert!(matches!(app.overlay, Overlay::Charts { page: 0 }));
    app.handle_key(key(KeyCode::BackTab));
    assert!(matches!(app.overlay, Overlay::Charts { page: 3 }));
    let fx = app.handle_key(key(KeyCode::Esc));
    assert!(fx.contains(&Effect::Charts(false)), "{fx:?}");
    assert_eq!(app.mode(), Mode::Normal);
    // v again opens, v once more closes.
    app.handle_key(key(KeyCode::Char('v')));
    let fx = app.handle_key(key(KeyCode::Char('v')));
    assert!(fx.contains(&Effect::Charts(false)), "{fx:?}");
    // The help overlay lists the binding.
    let help = Keymap::default_map().help_entries();
    assert!(
        help.iter()
            .any(|(_, a, keys, _)| a.name() == "charts" && keys == "v"),
        "{help:?}"
    );
}

#[test]
fn charts_at_80x24_one_chart_a_page() {
    let mut app = app(true);
    app.handle_key(key(KeyCode::Char('v')));
    for page in 0..3 {
        let t = render(&app, 80, 24, Theme::mono());
        insta::assert_snapshot!(format!("charts_80x24_page{page}"), t.backend());
        app.handle_key(key(KeyCode::Tab));
    }
}

#[test]
fn charts_at_120x40_all_at_once() {
    let mut app = app(true);
    app.handle_key(key(KeyCode::Char('v')));
    let t = render(&app, 120, 40, Theme::mono());
    let screen = text(t.backend().buffer());
    for want in [
        "review 0.60",
        "▲accept 0.85",
        "requests/s",
        "429s",
        "cost so far",
    ] {
        assert!(screen.contains(want), "{want} missing:\n{screen}");
    }
    insta::assert_snapshot!("charts_120x40", t.backend());
}

#[test]
fn charts_before_their_data_and_without_a_session() {
    let mut app = app(false);
    app.handle_key(key(KeyCode::Char('v')));
    let screen = text(render(&app, 80, 24, Theme::mono()).backend().buffer());
    assert!(screen.contains("reading the charts…"), "{screen}");
    let mut empty = App::new(Keymap::default_map(), false);
    empty.handle_key(key(KeyCode::Char('v')));
    let screen = text(render(&empty, 120, 40, Theme::mono()).backend().buffer());
    assert!(screen.contains("no session to chart"), "{screen}");
}

/// NO_COLOR: no cell has a colour, and every cell's text is the same as
/// with colour, so nothing (band, threshold) was said by colour alone.
#[test]
fn no_color_charts_say_everything_in_words_and_glyphs() {
    for (w, h, page) in [(80, 24, 0), (80, 24, 1), (80, 24, 2), (120, 40, 0)] {
        let mut app = app(true);
        app.handle_key(key(KeyCode::Char('v')));
        for _ in 0..page {
            app.handle_key(key(KeyCode::Tab));
        }
        let colour = render(&app, w, h, Theme { color: true });
        let mono = render(&app, w, h, Theme::mono());
        let (cb, mb) = (colour.backend().buffer(), mono.backend().buffer());
        assert_eq!(text(cb), text(mb), "{w}x{h} page {page}");
        assert!(
            cb.content().iter().any(|c| c.fg != Color::Reset),
            "the colour theme has colour"
        );
        for c in mb.content() {
            assert!(
                c.fg == Color::Reset && c.bg == Color::Reset,
                "{w}x{h}: a coloured cell {c:?}"
            );
        }
        let screen = text(mb);
        assert!(!screen.contains('\u{1b}'), "an escape reached a cell");
        if page == 0 {
            for want in [
                "✗ reject < 0.60 ≤ ? review < 0.85 ≤ ✓ accept",
                "▲accept 0.85",
            ] {
                assert!(screen.contains(want), "{want} missing:\n{screen}");
            }
        }
    }
    let mut app = app(true);
    app.handle_key(key(KeyCode::Char('v')));
    insta::assert_snapshot!(
        "charts_no_color_80x24",
        render(&app, 80, 24, Theme::mono()).backend()
    );
}

// ---------------------------------------------------------------- the read

/// An attempt: sent this long after the session started, its HTTP status,
/// its state and its cost.
type Attempt = (f64, &'static str, &'static str, f64);

/// When the fixture session started.
const T0: f64 = 1_000.0;

/// The fixture as SQL both engines run: session `s1` with 4 items over 2
/// stages, 3 with a confidence, 6 attempts (one 429, one 500, one failure
/// without a status) costing $0.875 in all.
fn fixture_sql() -> Vec<String> {
    let t0 = T0;
    let mut sql = vec![format!(
        "INSERT INTO llm_batch_session (session_id, started_at, completed_at, total_count,
             config_snapshot_json, state, updated_at)
         VALUES ('s1', {t0}, {}, 3, '{}', 'completed', {t0})",
        t0 + 100.0,
        SNAPSHOT.replace('\'', "''")
    )];
    let items: [(&str, &str, &str, &[Attempt]); 4] = [
        ("a", "triage", "0.95", &[(1.0, "200", "answered", 0.5)]),
        (
            "b",
            "triage",
            "0.62",
            &[(2.0, "429", "failed", 0.0), (50.0, "200", "answered", 0.25)],
        ),
        (
            "c",
            "verify",
            "1.0",
            &[
                (60.0, "500", "failed", 0.0),
                (90.0, "200", "answered", 0.125),
            ],
        ),
        ("d", "triage", "NULL", &[(95.0, "NULL", "failed", 0.0)]),
    ];
    // Job order is the checkpoint's, not the names': verify runs first here.
    for (stage, position) in [("verify", 0), ("triage", 1)] {
        sql.push(format!(
            "INSERT INTO run_stages (session_id, stage, position, role, updated_at)
             VALUES ('s1', '{stage}', {position}, 'generator', {t0})"
        ));
    }
    let mut mid = 0;
    for (rid, (item, stage, confidence, attempts)) in items.iter().enumerate() {
        let rid = rid + 1;
        sql.push(format!(
            "INSERT INTO decision (item_id, evidence_json, imported_at, updated_at)
             VALUES ('{item}', '{{}}', 1, 1)"
        ));
        sql.push(format!(
            "INSERT INTO llm_requests (request_id, item_id, stage, provider, model, template_hash,
                 params_hash, created_at, updated_at)
             VALUES ({rid}, '{item}', '{stage}', 'mock', 'm', 't', 'p', 1, 1)"
        ));
        for (n, (at, status, state, cost)) in attempts.iter().enumerate() {
            mid += 1;
            sql.push(format!(
                "INSERT INTO llm_messages (message_id, request_id, attempt, session_id,
                     client_request_id, state, user_prompt, http_status, cost_usd, sent_at, finished_at)
                 VALUES ({mid}, {rid}, {}, 's1', 'c{mid}', '{state}', 'p', {status}, {cost}, {}, {})",
                n + 1,
                t0 + at,
                t0 + at + 1.0
            ));
        }
        let outcome = if *confidence == "NULL" {
            "error"
        } else {
            "accepted"
        };
        sql.push(format!(
            "INSERT INTO llm_batch_result (session_id, item_id, processed_at, outcome, confidence, stage)
             VALUES ('s1', '{item}', {}, '{outcome}', {confidence}, '{stage}')",
            t0 + 99.0
        ));
    }
    sql
}

/// A workspace whose SQLite ledger holds the fixture.
fn charted_workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let conn = docket::ledger::open(&dir.path().join("docket.sqlite")).expect("open ledger");
    for statement in fixture_sql() {
        conn.execute_batch(&statement).expect(&statement);
    }
    dir
}

/// The fixture's charts, as every engine must read them.
fn assert_fixture_charts(data: &ChartData) {
    let t0 = T0;
    let stages: Vec<(&str, u64)> = data
        .confidence
        .iter()
        .map(|h| (h.stage.as_str(), h.total()))
        .collect();
    assert_eq!(stages, vec![("verify", 1), ("triage", 2)]);
    assert_eq!(data.confidence[1].bins[19], 1, "0.95 is in the last bin");
    assert_eq!(data.confidence[1].bins[12], 1, "0.62 is in 0.60-0.65");
    assert_eq!(data.confidence[0].bins[19], 1, "1.0 is in the last bin");
    let t = &data.timeline;
    assert_eq!(t.sent.iter().sum::<u64>(), 6);
    assert_eq!(t.throttled.iter().sum::<u64>(), 1);
    assert_eq!(
        t.errors.iter().sum::<u64>(),
        2,
        "the 500 and the failure without status"
    );
    assert_eq!(t.cost.last().copied(), Some(0.875));
    assert_eq!(t.start, t0);
    // The 429 finished at t0+3, in the first slices; the 500 at t0+61.
    let slice = |at: f64| ((at - t0) / t.slice_secs) as usize;
    assert_eq!(t.throttled[slice(t0 + 3.0)], 1);
    assert_eq!(t.errors[slice(t0 + 61.0)], 1);
}

/// The histograms count each outcome's confidence in its stage and bin,
/// the time line each attempt, each 429, each other failure and the spend.
#[test]
fn the_charts_read_counts_confidences_attempts_429s_errors_and_spend() {
    let dir = charted_workspace();
    let path = dir.path().join("docket.sqlite");
    let db = docket::ledger::Ledger::open_read_only(&path).expect("console handle");
    assert_fixture_charts(&db.charts("s1").expect("charts"));
    // No such session: nothing to chart, not an error.
    assert_eq!(db.charts("nope").expect("charts"), ChartData::default());
}

/// The console's ledger worker reads the charts only once told they are
/// shown, and stops when told they are not.
#[test]
fn the_data_worker_reads_the_charts_only_while_they_are_shown() {
    use docket::tui::data::{DataMsg, DataWorker};
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    let dir = charted_workspace();
    let (fx_tx, fx_rx) = mpsc::channel();
    let (out_tx, out_rx) = mpsc::channel();
    let operator = docket::review::Operator::new("alice", "alice@host-a:100");
    let worker = DataWorker::new(dir.path().to_path_buf(), operator, true);
    let handle = std::thread::spawn(move || worker.run(fx_rx, move |m| out_tx.send(m).is_ok()));
    let next_snapshot = |want: &dyn Fn(&Snapshot) -> bool| -> Snapshot {
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if let Ok(DataMsg::Snapshot(s)) = out_rx.recv_timeout(Duration::from_millis(200))
                && want(&s)
            {
                return *s;
            }
        }
        panic!("no such snapshot within 10 s");
    };
    let first = next_snapshot(&|s| s.view.is_some());
    assert_eq!(first.charts, None, "not read while not shown");
    fx_tx.send(Effect::Charts(true)).expect("send");
    let shown = next_snapshot(&|s| s.charts.is_some());
    let charts = shown.charts.expect("charts");
    assert_eq!(charts.timeline.sent.iter().sum::<u64>(), 6);
    assert_eq!(charts.confidence.len(), 2);
    fx_tx.send(Effect::Charts(false)).expect("send");
    next_snapshot(&|s| s.charts.is_none());
    drop(fx_tx);
    handle.join().expect("the worker ends when the UI is gone");
}

/// Three stages do not fit 80x24: the first two show, the third is named.
#[test]
fn stages_that_do_not_fit_are_named() {
    let mut data = charts();
    data.confidence.push(StageHistogram {
        stage: "score_critic".into(),
        bins: vec![1; CONFIDENCE_BINS],
    });
    let mut app = App::new(Keymap::default_map(), false);
    app.apply_snapshot(Snapshot {
        view: Some(view()),
        charts: Some(data),
        now: NOW,
        ..Snapshot::default()
    });
    app.handle_key(key(KeyCode::Char('v')));
    let small = text(render(&app, 80, 24, Theme::mono()).backend().buffer());
    assert!(
        small.contains("… not shown (a taller terminal): score_critic"),
        "{small}"
    );
    let big = text(render(&app, 120, 40, Theme::mono()).backend().buffer());
    assert!(big.contains("score_critic · 20 answers"), "{big}");
}

/// The charts read from PostgreSQL as from SQLite: the same rows, the
/// same charts.
#[test]
fn the_charts_read_from_postgres() {
    use docket::ledger::{Ledger, LedgerLocation};
    use docket_testkit::pg::PgServer;

    let server = PgServer::start();
    let url = server.fresh_database();
    // Opening migrates the new database.
    let ledger = Ledger::open(LedgerLocation::parse(&url).expect("url")).expect("open");
    server.psql(&url, &format!("{};", fixture_sql().join(";\n")));
    assert_fixture_charts(&ledger.charts("s1").expect("the charts read"));
    assert_eq!(ledger.charts("nope").expect("charts"), ChartData::default());
}
