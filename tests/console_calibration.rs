//! The console's calibration page (charts overlay, `v` then tab): a
//! scripted set of reviewed items with known agreement, drawn at 80x24 and
//! 120x40 and without colour, with the figures `docket calibrate` computes
//! from the same inputs (`docket_model::calibration::Summary`).

use docket::ledger::calibration::CalibrationInput;
use docket::ledger::store::SessionRow;
use docket::tui::app::{App, Overlay, Snapshot};
use docket::tui::keymap::Keymap;
use docket::tui::theme::Theme;
use docket::watch::{ChartData, Engine, SessionView, StateFacts, Tune, shown_state};
use docket_model::calibration::Reviewed;
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::style::Color;

const NOW: f64 = 1_700_000_000.0;
const SESSION: &str = "batch_20231114_221000";
const SNAPSHOT: &str = r#"{"flags":{"auto_accept_threshold":0.85,"review_threshold":0.6}}"#;

fn view() -> SessionView {
    SessionView {
        row: SessionRow {
            session_id: SESSION.into(),
            started_at: NOW - 754.0,
            completed_at: Some(NOW - 10.0),
            total_count: 200,
            processed_count: 200,
            accepted_count: 120,
            reviewed_count: 60,
            rejected_count: 20,
            error_count: 0,
            state: "completed".into(),
            desired_state: "running".into(),
            stop_reason: None,
            retry_count: 0,
            rate_limited_count: 0,
            ambiguous_count: 0,
            input_tokens: 1,
            output_tokens: 1,
            cost_usd: 0.1,
            estimated_tokens: 1,
            estimated_cost_usd: 0.1,
            max_cost_usd: None,
            config_snapshot_json: SNAPSHOT.into(),
        },
        tune: Tune::default(),
        gauges: None,
        stages: Vec::new(),
        live: false,
        shown: shown_state(StateFacts {
            stored: "completed",
            desired: "running",
            stop_after_stage: false,
            engine: Engine::Gone,
        }),
        heartbeat_age_secs: None,
        in_flight: 0,
        at_provider: 0,
        pending: 0,
        stop_after_stage: None,
        profile: None,
    }
}

/// `n` reviewed items at `confidence`, the first `agreed` of them agreed,
/// the first `audit` of them from the audit sample.
fn band(confidence: f64, n: usize, agreed: usize, audit: usize) -> Vec<Reviewed> {
    (0..n)
        .map(|i| Reviewed {
            confidence,
            agreed: i < agreed,
            audit: i < audit,
        })
        .collect()
}

/// 60 reviewed items: the auto-accepted bands (audited) nearly always
/// right, the review band half right, the rejects (audited) mostly wrong.
fn reviewed() -> Vec<Reviewed> {
    [
        band(0.97, 20, 20, 20),
        band(0.91, 12, 12, 12),
        band(0.87, 8, 7, 8),
        band(0.72, 14, 7, 0),
        band(0.52, 6, 1, 6),
    ]
    .concat()
}

fn charts(reviewed: Vec<Reviewed>) -> ChartData {
    // Every routed item's confidence: the reviewed ones and 140 others.
    let mut confidences: Vec<f64> = reviewed.iter().map(|r| r.confidence).collect();
    confidences.extend((0..140).map(|i| 0.5 + f64::from(i % 50) / 100.0));
    let input = CalibrationInput {
        reviewed,
        confidences,
        snapshot_json: SNAPSHOT.into(),
    };
    ChartData {
        calibration: Some(input.summary(docket_model::calibration::DEFAULT_TARGET)),
        ..ChartData::default()
    }
}

fn app(data: ChartData) -> App {
    let mut app = App::new(Keymap::default_map(), false);
    app.apply_snapshot(Snapshot {
        view: Some(view()),
        charts: Some(data),
        now: NOW,
        ..Snapshot::default()
    });
    app
}

fn key(app: &mut App, code: KeyCode) {
    app.handle_key(KeyEvent::new(code, KeyModifiers::NONE));
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

/// The calibration page at `w` x `h`: `v`, a first frame (it tells the
/// keys whether every chart fits), then tab until the calibration shows.
fn calibration_app(data: ChartData, w: u16, h: u16) -> App {
    let mut app = app(data);
    key(&mut app, KeyCode::Char('v'));
    for _ in 0..4 {
        render(&app, w, h, Theme::mono());
        if matches!(app.overlay, Overlay::Charts { page: 3 }) {
            return app;
        }
        key(&mut app, KeyCode::Tab);
    }
    panic!("no calibration page at {w}x{h}");
}

/// The figures, worked by hand: 60 reviewed, 47 agreed; at 0.85 and up
/// 39 of 40 agreed; the lowest edge whose Wilson lower bound reaches 0.98
/// would be none (32 of 32 at 0.90 gives a lower bound of 89.3%).
#[test]
fn calibration_at_80x24_shows_the_bands_the_precision_and_the_suggestion() {
    let app = calibration_app(charts(reviewed()), 80, 24);
    let t = render(&app, 80, 24, Theme::mono());
    let screen = text(t.backend().buffer());
    for want in [
        "4/4 calibration",
        "60 reviewed (46 from the audit sample) · agreed 78.3%",
        "auto-accept ≥ 0.85 now: precision 97.5% (95% CI 87.1%–99.6%) on 40",
        "target 98.0%: no threshold reaches it with these reviews yet",
        "0.95–1.00 ✓ 20   20    100.0% 83.9–100.0% 20",
        "0.85–0.90 ✓ 8    7     87.5%  52.9–97.8%  8",
        "0.70–0.75 ? 14   7     50.0%  26.8–73.2%  0",
        "0.50–0.55 ✗ 6    1     16.7%  3.0–56.4%   6",
    ] {
        assert!(screen.contains(want), "{want:?} missing:\n{screen}");
    }
    insta::assert_snapshot!("calibration_80x24", t.backend());
}

/// At 120x40 every other chart shows at once, and one tab goes straight
/// to the calibration, which then has the room.
#[test]
fn calibration_at_120x40_one_tab_away() {
    let mut app = app(charts(reviewed()));
    key(&mut app, KeyCode::Char('v'));
    let first = text(render(&app, 120, 40, Theme::mono()).backend().buffer());
    assert!(first.contains("tab: calibration"), "{first}");
    key(&mut app, KeyCode::Tab);
    assert!(matches!(app.overlay, Overlay::Charts { page: 3 }));
    let t = render(&app, 120, 40, Theme::mono());
    let screen = text(t.backend().buffer());
    assert!(screen.contains("calibration (tab: charts)"), "{screen}");
    assert!(
        screen.contains("reliability: % agreed per band"),
        "{screen}"
    );
    insta::assert_snapshot!("calibration_120x40", t.backend());
    key(&mut app, KeyCode::Tab);
    assert!(matches!(app.overlay, Overlay::Charts { page: 0 }));
}

/// NO_COLOR: the same text with colour and without, no coloured cell.
#[test]
fn calibration_without_colour_says_it_all_in_text() {
    for (w, h) in [(80, 24), (120, 40)] {
        let app = calibration_app(charts(reviewed()), w, h);
        let colour = render(&app, w, h, Theme { color: true });
        let mono = render(&app, w, h, Theme::mono());
        let (cb, mb) = (colour.backend().buffer(), mono.backend().buffer());
        assert_eq!(text(cb), text(mb), "{w}x{h}");
        assert!(cb.content().iter().any(|c| c.fg != Color::Reset));
        assert!(
            mb.content()
                .iter()
                .all(|c| c.fg == Color::Reset && c.bg == Color::Reset),
            "{w}x{h}: a coloured cell"
        );
    }
    let app = calibration_app(charts(reviewed()), 80, 24);
    insta::assert_snapshot!(
        "calibration_no_color_80x24",
        render(&app, 80, 24, Theme::mono()).backend()
    );
}

/// Before any human decision the page says so and what to do; with too
/// few it shows the counts and says more are needed.
#[test]
fn calibration_with_no_or_few_decisions_says_so() {
    let app = calibration_app(charts(Vec::new()), 80, 24);
    let screen = text(render(&app, 80, 24, Theme::mono()).backend().buffer());
    assert!(
        screen.contains("No human decisions yet in this session."),
        "{screen}"
    );
    let app = calibration_app(charts(band(0.9, 3, 2, 0)), 80, 24);
    let screen = text(render(&app, 80, 24, Theme::mono()).backend().buffer());
    assert!(
        screen.contains("3 reviewed (0 from the audit sample)"),
        "{screen}"
    );
    assert!(
        screen.contains("at least 10 reviewed items are needed"),
        "{screen}"
    );
    // 200 of 200 agreed at 0.97 (Wilson lower bound 98.1%), none below:
    // the review threshold itself reaches the target, and the 75 routed
    // items in [0.60, 0.85) would not be reviewed.
    let app = calibration_app(charts(band(0.97, 200, 200, 0)), 80, 24);
    let screen = text(render(&app, 80, 24, Theme::mono()).backend().buffer());
    assert!(
        screen.contains("accept ≥ 0.60 reaches it (lower bound 98.1%) · 75 fewer reviews"),
        "{screen}"
    );
}
