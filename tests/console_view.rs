//! The console's drawing: insta snapshots of `TestBackend` buffers at 80x24
//! and 120x40 (mono theme, fixed clock), a sanitizer test with hostile item
//! and model text, and a test that focus and selection show without colour.

use docket::ledger::console::WorkerRow;
use docket::ledger::store::SessionRow;
use docket::tui::app::{App, Dialog, Overlay, Pane, Snapshot};
use docket::tui::keymap::Keymap;
use docket::tui::theme::Theme;
use docket::watch::{
    Engine, Event, Level, LiveGauges, ProviderBatchRow, ProviderBatchSummary, ReviewDetail,
    ReviewPage, ReviewRow, SessionSummary, SessionView, ShownState, StageOutput, StageProgress,
    StageVerdict, StateFacts, Tune, shown_state,
};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::style::Modifier;

/// 2023-11-14 22:13:20 UTC.
const NOW: f64 = 1_700_000_000.0;
const SESSION: &str = "batch_20231114_221000";
const SIZES: [(u16, u16); 2] = [(80, 24), (120, 40)];
/// A big terminal: the panes grow, and the focused queue has a preview.
const WIDE: (u16, u16) = (200, 60);

// ---------------------------------------------------------------- fixtures

fn session_row(state: &str, desired: &str) -> SessionRow {
    SessionRow {
        session_id: SESSION.into(),
        started_at: NOW - 754.0,
        completed_at: None,
        total_count: 1000,
        processed_count: 400,
        accepted_count: 300,
        reviewed_count: 60,
        rejected_count: 30,
        error_count: 10,
        state: state.into(),
        desired_state: desired.into(),
        stop_reason: None,
        retry_count: 3,
        rate_limited_count: 2,
        ambiguous_count: 1,
        input_tokens: 120_000,
        output_tokens: 30_000,
        cost_usd: 0.4321,
        estimated_tokens: 600_000,
        estimated_cost_usd: 1.08,
        max_cost_usd: None,
        config_snapshot_json: "{}".into(),
    }
}

/// The state the ledger's reads would derive for these facts.
fn shown_of(state: &str, desired: &str, stop_after_stage: bool, live: bool) -> ShownState {
    shown_state(StateFacts {
        stored: state,
        desired,
        stop_after_stage,
        engine: if live { Engine::Live } else { Engine::Released },
    })
}

fn view(state: &str, desired: &str) -> SessionView {
    let stop_after_stage: Option<String> = Some("triage".into());
    SessionView {
        row: session_row(state, desired),
        tune: Tune::default(),
        gauges: Some(LiveGauges {
            in_flight: 8,
            concurrency_limit: 8,
            max_concurrency: 16,
            rpm_limit: 600,
            tpm_limit: 0,
            rpm_used: 412.0,
            tpm_used: 38_500.0,
            slow_reason: "rate limit (rpm)".into(),
            paused: state == "paused",
            stage: "triage".into(),
            elapsed_secs: 754.0,
            eta_secs: Some(1131.0),
            deadline_secs: 2.4,
            latency_p99_secs: Some(1.2),
            deadline_cuts: 3,
        }),
        stages: vec![
            StageProgress {
                name: "triage".into(),
                total: 1000,
                done: 400,
                failed: 10,
                in_flight: 8,
                ..StageProgress::default()
            },
            StageProgress {
                name: "verify".into(),
                total: 60,
                done: 12,
                failed: 0,
                in_flight: 0,
                ..StageProgress::default()
            },
        ],
        live: true,
        shown: shown_of(state, desired, stop_after_stage.is_some(), true),
        heartbeat_age_secs: Some(1.0),
        in_flight: 8,
        at_provider: 0,
        pending: 592,
        stop_after_stage,
        profile: None,
    }
}

fn summary(
    id: &str,
    state: &str,
    live: bool,
    started_ago: f64,
    done: (u64, u64),
    cost: f64,
) -> SessionSummary {
    SessionSummary {
        session_id: id.into(),
        state: state.into(),
        desired_state: state.into(),
        started_at: NOW - started_ago,
        completed_at: None,
        total: done.1,
        processed: done.0,
        accepted: done.0 * 3 / 4,
        review: done.0 / 8,
        rejected: done.0 / 16,
        errors: done.0 / 40,
        cost_usd: cost,
        estimated_cost_usd: cost * 2.0,
        stop_reason: None,
        live,
        // The watched session's view asks it to stop after a stage: its
        // line says so as its header does.
        shown: shown_of(state, state, id == SESSION, live),
    }
}

fn sessions() -> Vec<SessionSummary> {
    vec![
        summary(SESSION, "running", true, 754.0, (400, 1000), 0.4321),
        summary(
            "batch_20231113_090000",
            "completed",
            false,
            133_000.0,
            (250, 250),
            0.1175,
        ),
        summary(
            "batch_20231112_080000",
            "running",
            false,
            223_000.0,
            (80, 500),
            0.0402,
        ),
        summary(
            "batch_20231110_170000",
            "cancelled",
            false,
            365_000.0,
            (12, 300),
            0.0051,
        ),
    ]
}

fn events() -> Vec<Event> {
    let e = |ago: f64, level, kind: &str, message: &str| Event {
        at: NOW - ago,
        level,
        kind: kind.into(),
        message: message.into(),
        item_id: None,
    };
    vec![
        e(
            1.0,
            Level::Info,
            "review",
            "item-0007 queued for review (0.62)",
        ),
        e(
            12.0,
            Level::Warn,
            "rate_limit",
            "429 from mock: cooling down 2s",
        ),
        e(
            47.0,
            Level::Error,
            "error",
            "item-0003 failed after 3 attempts: invalid JSON",
        ),
        e(63.0, Level::Info, "retune", "concurrency 8 -> 16 (AIMD)"),
        e(754.0, Level::Info, "stage", "stage triage started"),
    ]
}

const LABELS: [&str; 4] = ["spam", "ham", "phishing", "unsure"];

fn review_row(i: u64) -> ReviewRow {
    ReviewRow {
        review_id: 100 + i as i64,
        item_id: format!("item-{i:04}"),
        session_id: Some(SESSION.into()),
        confidence: if i == 5 {
            None
        } else {
            Some(0.91 - i as f64 * 0.03)
        },
        suggestion: format!(
            r#"{{"label":"{}","reason":"sender not in contacts","rationale":"hidden","confidence":0.9}}"#,
            LABELS[i as usize % 4]
        ),
        rationale: Some("looks like a bulk mailing".into()),
        model_id: Some("mock-1".into()),
        claimed_by: if i == 3 { Some("bob@h:1".into()) } else { None },
        audit: false,
        stale: false,
        evidence: String::new(),
    }
}

fn page(total: u64) -> ReviewPage {
    ReviewPage {
        total,
        offset: 0,
        rows: (0..total).map(review_row).collect(),
        several_sessions: false,
    }
}

fn detail() -> ReviewDetail {
    ReviewDetail {
        review_id: 100,
        item_id: "item-0000".into(),
        session_id: Some(SESSION.into()),
        status: "pending".into(),
        evidence_json: "{\n  \"from\": \"promo@example.com\",\n  \"subject\": \"You won!\",\n  \"body\": \"Click here to claim your prize.\"\n}".into(),
        suggestion_json: "{\n  \"label\": \"spam\",\n  \"confidence\": 0.91\n}".into(),
        confidence: Some(0.91),
        rationale: Some(
            "Unknown sender, prize language and a link: a classic bulk mailing.".into(),
        ),
        model_id: Some("mock-1".into()),
        stages: vec![StageOutput {
            stage: "triage".into(),
            provider: "mock".into(),
            model: "mock-1".into(),
            status: "ok".into(),
            attempts: 1,
            parsed_output_json: Some(r#"{"label":"spam","confidence":0.91}"#.into()),
            raw_output: Some(
                "```json\n{\"label\":\"spam\",\"confidence\":0.91}\n```".into(),
            ),
            finish_reason: Some("stop".into()),
            input_tokens: 312,
            output_tokens: 24,
            cost_usd: 0.00042,
        }],
        decided_by: None,
        decided_at: None,
        claimed_by: None,
        audit: false,
        ..ReviewDetail::default()
    }
}

/// The card of review row `i` (the detail fixture under its id).
fn detail_of(i: i64) -> ReviewDetail {
    ReviewDetail {
        review_id: 100 + i,
        item_id: format!("item-{i:04}"),
        ..detail()
    }
}

fn snapshot() -> Snapshot {
    Snapshot {
        sessions: sessions(),
        view: Some(view("running", "running")),
        events: events(),
        review: page(12),
        detail: None,
        now: NOW,
        ..Snapshot::default()
    }
}

fn app_with(read_only: bool, snap: Snapshot) -> App {
    let mut app = App::new(Keymap::default_map(), read_only);
    app.apply_snapshot(snap);
    app
}

fn app() -> App {
    app_with(false, snapshot())
}

fn key(c: char) -> KeyEvent {
    KeyEvent::new(KeyCode::Char(c), KeyModifiers::NONE)
}

fn render(app: &App, w: u16, h: u16) -> Terminal<TestBackend> {
    let mut terminal = Terminal::new(TestBackend::new(w, h)).expect("terminal");
    terminal
        .draw(|frame| docket::tui::view::draw(frame, app, Theme::mono()))
        .expect("draw");
    terminal
}

/// Snapshot `app` at both sizes as `{name}_{w}x{h}`.
fn snap_both(name: &str, app: &App) {
    snap_sizes(name, app, &SIZES);
}

fn snap_sizes(name: &str, app: &App, sizes: &[(u16, u16)]) {
    for &(w, h) in sizes {
        let terminal = render(app, w, h);
        insta::assert_snapshot!(format!("{name}_{w}x{h}"), terminal.backend());
    }
}

fn row_text(buf: &Buffer, y: u16) -> String {
    (0..buf.area.width)
        .map(|x| buf[(x, y)].symbol().to_string())
        .collect()
}

fn screen_text(buf: &Buffer) -> String {
    (0..buf.area.height)
        .map(|y| row_text(buf, y))
        .collect::<Vec<_>>()
        .join("\n")
}

// ---------------------------------------------------------------- snapshots

#[test]
fn dashboard_focused_on_each_pane() {
    for pane in Pane::ORDER {
        let mut a = app();
        a.focus = pane;
        if pane == Pane::Review {
            // The cursor on the second item; the held row (3) shows its holder.
            a.handle_key(key('j'));
            // Its card, as the data worker reads it for the preview.
            a.snap.detail = Some(detail_of(1));
        }
        if pane == Pane::Sessions {
            a.sessions_cursor = 1;
        }
        let name = format!(
            "dashboard_{}",
            pane.title().to_lowercase().replace(' ', "_")
        );
        snap_sizes(&name, &a, &[SIZES[0], SIZES[1], WIDE]);
    }
}

#[test]
fn detail_view() {
    let mut snap = snapshot();
    snap.detail = Some(detail());
    let mut a = app_with(false, snap);
    a.handle_key(key('5'));
    a.handle_key(KeyEvent::new(KeyCode::Enter, KeyModifiers::NONE));
    assert!(matches!(a.overlay, Overlay::Detail { scroll: 0 }));
    snap_both("detail", &a);
}

#[test]
fn help_overlay() {
    let mut a = app();
    a.handle_key(key('?'));
    snap_both("help", &a);
}

#[test]
fn cancel_dialog() {
    let mut a = app();
    a.handle_key(key('c'));
    assert!(matches!(
        a.overlay,
        Overlay::Dialog(Dialog::CancelRun { .. })
    ));
    snap_both("dialog_cancel", &a);
}

#[test]
fn quit_live_dialog() {
    let mut a = app();
    a.in_process_session = Some(SESSION.into());
    a.in_process_live = true;
    a.handle_key(key('q'));
    assert!(matches!(a.overlay, Overlay::Dialog(Dialog::QuitLive)));
    snap_both("dialog_quit_live", &a);
}

#[test]
fn paused_session() {
    let mut snap = snapshot();
    snap.view = Some(view("paused", "paused"));
    snap.sessions[0].state = "paused".into();
    snap.sessions[0].live = true;
    snap.sessions[0].shown = ShownState::Paused;
    let a = app_with(false, snap);
    assert!(a.paused());
    snap_both("paused", &a);
    let text = screen_text(render(&a, 80, 24).backend().buffer());
    assert!(text.lines().last().unwrap().contains(" PAUSED "), "{text}");
}

#[test]
fn read_only_footer() {
    let a = app_with(true, snapshot());
    snap_both("read_only", &a);
    let text = screen_text(render(&a, 80, 24).backend().buffer());
    assert!(text.lines().last().unwrap().contains("READ-ONLY"), "{text}");
}

#[test]
fn filter_mode_footer() {
    let mut a = app();
    a.handle_key(key('/'));
    for c in "spam".chars() {
        a.handle_key(key(c));
    }
    // The runner's answer to the filtered query.
    let mut snap = snapshot();
    snap.review = ReviewPage {
        total: 3,
        offset: 0,
        rows: vec![review_row(0), review_row(4), review_row(8)],
        several_sessions: false,
    };
    a.apply_snapshot(snap);
    snap_both("filter_mode", &a);
    let text = screen_text(render(&a, 80, 24).backend().buffer());
    let footer = text.lines().last().unwrap();
    assert!(
        footer.contains("FILTER") && footer.contains("/spam"),
        "{footer}"
    );
}

#[test]
fn empty_workspace() {
    let a = app_with(
        false,
        Snapshot {
            now: NOW,
            ..Snapshot::default()
        },
    );
    assert!(a.loaded);
    snap_both("empty_workspace", &a);
}

#[test]
fn too_small_screen() {
    let a = app();
    for (w, h) in [(79, 24), (60, 15)] {
        let terminal = render(&a, w, h);
        insta::assert_snapshot!(format!("too_small_{w}x{h}"), terminal.backend());
    }
}

// ---------------------------------------------------------------- style

#[test]
fn focus_and_selection_show_without_colour() {
    let mut a = app();
    a.handle_key(key('5'));
    a.handle_key(key('j'));
    for (w, h) in SIZES {
        let terminal = render(&a, w, h);
        let buf = terminal.backend().buffer();
        // The selected review row: every cell REVERSED; the others not.
        let rows: Vec<u16> = (0..h)
            .filter(|&y| row_text(buf, y).contains("item-0001"))
            .collect();
        assert_eq!(rows.len(), 1, "{w}x{h}");
        let y = rows[0];
        let line = row_text(buf, y);
        assert!(line.contains('›'), "{line}");
        let x0 = line.chars().position(|c| c == '›').unwrap() as u16;
        for x in x0..x0 + 30 {
            assert!(
                buf[(x, y)].modifier.contains(Modifier::REVERSED),
                "{w}x{h}: cell ({x},{y}) of the selected row is not reversed"
            );
        }
        let other = (0..h)
            .find(|&y| row_text(buf, y).contains("item-0002"))
            .unwrap();
        assert!(
            !buf[(x0 + 5, other)].modifier.contains(Modifier::REVERSED),
            "{w}x{h}: an unselected row is reversed"
        );
        // The focused pane's border is double-line, the others single.
        let title_y = (0..h)
            .find(|&y| row_text(buf, y).contains("▶ 5 Review queue"))
            .expect("focused review title");
        let title_row = row_text(buf, title_y);
        assert!(
            title_row.trim_start_matches('│').starts_with('╔')
                && title_row.contains('═')
                && title_row.contains('╗'),
            "{w}x{h}: {title_row}"
        );
        let below = row_text(buf, title_y + 1);
        assert!(below.contains('║'), "{w}x{h}: {below}");
        let stages_y = (0..h)
            .find(|&y| row_text(buf, y).contains(" 1 Stages"))
            .expect("stages title");
        let stages_row = row_text(buf, stages_y);
        assert!(
            stages_row.starts_with('┌') && stages_row.contains('─') && !stages_row.contains('═'),
            "{w}x{h}: {stages_row}"
        );
        // Only one pane is marked focused.
        let text = screen_text(buf);
        let marked: Vec<usize> = (1..=6)
            .filter(|n| text.contains(&format!("▶ {n} ")))
            .collect();
        assert_eq!(marked, vec![5], "{w}x{h}");
    }
}

#[test]
fn held_rows_show_their_holder() {
    let mut a = app();
    a.handle_key(key('5'));
    let text = screen_text(render(&a, 120, 40).backend().buffer());
    assert!(text.contains("[held: bob@h:1]"), "{text}");
}

/// The cursor row names another operator's hold, even once we asked for it.
#[test]
fn held_cursor_row_shows_its_holder() {
    let mut a = app();
    a.handle_key(key('5'));
    for _ in 0..3 {
        a.handle_key(key('j'));
    }
    assert_eq!(a.cursor_row().map(|r| r.review_id), Some(103));
    let text = screen_text(render(&a, 120, 40).backend().buffer());
    assert!(text.contains("[held: bob@h:1]"), "{text}");
}

/// The detail names another holder; "held by you" is only for our own claim.
#[test]
fn detail_names_another_holder() {
    let mut snap = snapshot();
    let mut d = detail();
    d.claimed_by = Some("bob@h:1".into());
    snap.detail = Some(d);
    let mut a = app_with(false, snap);
    a.handle_key(key('5'));
    a.handle_key(KeyEvent::new(KeyCode::Enter, KeyModifiers::NONE));
    let text = screen_text(render(&a, 120, 40).backend().buffer());
    assert!(text.contains("held by bob@h:1"), "{text}");
    assert!(!text.contains("held by you"), "{text}");
}

/// After `S`, the stages pane marks the stage the run stops after, at 80x24 too.
#[test]
fn stop_after_stage_marker_shows_at_80x24() {
    let a = app();
    assert_eq!(
        a.snap.view.as_ref().unwrap().stop_after_stage.as_deref(),
        Some("triage")
    );
    for (w, h) in SIZES {
        let text = screen_text(render(&a, w, h).backend().buffer());
        assert!(text.contains("stop after"), "{w}x{h}:\n{text}");
    }
}

/// Row S1: a session held by a provider's `retry-after` shows, in its
/// gauges, "rate limited (waiting Ns)" as the engine's limiter words it,
/// whole at both sizes.
#[test]
fn s1_a_retry_after_hold_shows_rate_limited_waiting() {
    use docket::limiter::{SlowReason, Slowdown};
    let hold = Slowdown {
        reason: SlowReason::Cooldown,
        wait: Some(std::time::Duration::from_millis(11_200)),
    };
    let mut snap = snapshot();
    if let Some(g) = snap.view.as_mut().and_then(|v| v.gauges.as_mut()) {
        g.slow_reason = hold.describe();
    }
    let a = app_with(false, snap);
    snap_both("rate_limited", &a);
    for (w, h) in SIZES {
        let text = screen_text(render(&a, w, h).backend().buffer());
        assert!(
            text.contains("slow: rate limited (waiting 12s)"),
            "{w}x{h}:\n{text}"
        );
    }
}

// ---------------------------------------------------------------- sanitizer

/// Everything an item or a model might smuggle into a terminal.
fn hostile(tag: &str) -> String {
    format!(
        "{tag} \u{1b}[2J\u{1b}[31mred\u{1b}[0m \u{1b}]0;pwned title\u{7} csi\u{9b}31m nul\u{0}bel\u{7} \
         bidi\u{202E}txet desrever\u{202C} iso\u{2066}late\u{2069} del\u{7f} cr\rlf\n\
         second line\ttab \u{1b}P+q\u{1b}\\ {tag}-end"
    )
}

fn is_bad(c: char) -> bool {
    c.is_control()
        || c == '\u{1b}'
        || ('\u{202A}'..='\u{202E}').contains(&c)
        || ('\u{2066}'..='\u{2069}').contains(&c)
}

fn hostile_detail() -> ReviewDetail {
    let long: String = "x".repeat(5_000);
    ReviewDetail {
        review_id: 100,
        item_id: hostile("item"),
        session_id: Some(hostile("sess")),
        status: "pending".into(),
        evidence_json: format!(
            "{{\n  \"body\": \"{}\",\n  \"blob\": \"{long}\",\n  \"after\": \"{}\"\n}}",
            hostile("evidence"),
            hostile("evidence2")
        ),
        suggestion_json: format!("{{\"label\": \"{}\"}}", hostile("suggestion")),
        confidence: Some(0.5),
        rationale: Some(format!("{} {long}", hostile("rationale"))),
        model_id: Some(hostile("model")),
        stages: vec![StageOutput {
            stage: hostile("stage"),
            provider: hostile("prov"),
            model: hostile("mdl"),
            status: "ok".into(),
            attempts: 2,
            parsed_output_json: Some(hostile("parsed")),
            raw_output: Some(format!("{}\n{long}\n{}", hostile("raw"), hostile("raw2"))),
            finish_reason: Some(hostile("finish")),
            input_tokens: 1,
            output_tokens: 2,
            cost_usd: 0.0,
        }],
        decided_by: Some(hostile("decider")),
        decided_at: Some(NOW),
        claimed_by: Some(hostile("claimer")),
        audit: false,
        ..ReviewDetail::default()
    }
}

fn hostile_snapshot() -> Snapshot {
    let mut snap = snapshot();
    snap.detail = Some(hostile_detail());
    snap.review.rows[0].item_id = hostile("rowitem");
    snap.review.rows[0].suggestion = serde_json::json!({ "label": hostile("rowsugg") }).to_string();
    snap.review.rows[1].suggestion = hostile("rawsugg");
    snap.review.rows[2].claimed_by = Some(hostile("holder"));
    snap.events[0].message = hostile("event");
    snap.view.as_mut().unwrap().stages[0].name = hostile("stagename");
    snap.sessions[1].session_id = hostile("othersession");
    snap
}

fn assert_clean(buf: &Buffer, ctx: &str) {
    for y in 0..buf.area.height {
        for x in 0..buf.area.width {
            let sym = buf[(x, y)].symbol();
            assert!(
                !sym.chars().any(is_bad),
                "{ctx}: cell ({x},{y}) holds {sym:?}; row: {:?}",
                row_text(buf, y)
            );
        }
    }
}

#[test]
fn hostile_text_never_reaches_a_cell() {
    let mut a = app_with(false, hostile_snapshot());
    a.handle_key(key('5'));
    a.handle_key(KeyEvent::new(KeyCode::Enter, KeyModifiers::NONE));
    a.set_toast(hostile("toast"));
    for (w, h) in SIZES {
        // Scroll through the whole detail (the 5,000-char lines wrap to many rows).
        let mut saw_raw_end = false;
        let mut saw_evidence = false;
        for scroll in (0..400).step_by(usize::from(h) - 4) {
            a.overlay = Overlay::Detail {
                scroll: scroll as u16,
            };
            let terminal = render(&a, w, h);
            let buf = terminal.backend().buffer();
            let ctx = format!("detail {w}x{h} scroll {scroll}");
            assert_clean(buf, &ctx);
            let text = screen_text(buf);
            saw_raw_end |= text.contains("raw2-end");
            saw_evidence |= text.contains("evidence-end");
            // The detail frame: header row, then the double border from the
            // first body row to the row above the footer (the long toast
            // wraps onto more than one footer row).
            let footer = (0..h)
                .rev()
                .find(|&y| row_text(buf, y).starts_with(" DETAIL "))
                .unwrap_or_else(|| panic!("{ctx}: no footer: {text}"));
            let top = row_text(buf, 1);
            let bottom = row_text(buf, footer - 1);
            assert!(
                top.starts_with('╔') && top.ends_with('╗'),
                "{ctx}: top {top:?}"
            );
            assert!(
                bottom.starts_with('╚') && bottom.ends_with('╝'),
                "{ctx}: bottom {bottom:?}"
            );
            for y in 2..footer - 1 {
                let row = row_text(buf, y);
                assert!(
                    row.starts_with('║') && row.ends_with('║'),
                    "{ctx}: row {y} border broken: {row:?}"
                );
                assert_eq!(row.chars().count(), usize::from(w), "{ctx}: row {y}");
            }
        }
        assert!(saw_evidence, "{w}x{h}: the evidence was never shown");
        assert!(saw_raw_end, "{w}x{h}: the raw output's end was never shown");
    }
    // The dashboard with the same rows, events and toast, every pane focused.
    a.overlay = Overlay::None;
    for pane in Pane::ORDER {
        a.focus = pane;
        // At 200x60 the focused queue previews the hostile item's card.
        for (w, h) in [SIZES[0], SIZES[1], WIDE] {
            let terminal = render(&a, w, h);
            let buf = terminal.backend().buffer();
            let ctx = format!("dashboard {pane:?} {w}x{h}");
            assert_clean(buf, &ctx);
            if pane == Pane::Review && (w, h) == WIDE {
                let text = screen_text(buf);
                assert!(
                    text.contains(" Preview (Enter opens it) ")
                        && text.contains("── Suggested answer"),
                    "{ctx}: no preview of the hostile card: {text}"
                );
            }
            // Every pane border row keeps its corners where it started.
            let first = row_text(buf, 1);
            assert!(
                first.starts_with('┌') || first.starts_with('╔'),
                "{ctx}: {first:?}"
            );
        }
    }
}

#[test]
fn hostile_text_in_the_header_is_sanitized() {
    // Session ids are generated by docket, but the ledger is a shared file:
    // the header shows the watched id as it is stored.
    let mut snap = snapshot();
    snap.view.as_mut().unwrap().row.session_id = hostile("sess");
    snap.view.as_mut().unwrap().row.desired_state = hostile("desired");
    let a = app_with(false, snap);
    for (w, h) in SIZES {
        let terminal = render(&a, w, h);
        let buf = terminal.backend().buffer();
        assert_clean(buf, &format!("header {w}x{h}"));
    }
}

// ---------------------------------------------------------------- provider batches

fn batch(
    id: i64,
    provider: &str,
    state: &str,
    provider_id: Option<&str>,
    lines: (u64, u64, u64),
    created_ago: f64,
    next_poll_in: Option<f64>,
) -> ProviderBatchRow {
    ProviderBatchRow {
        batch_id: id,
        tag: format!("dkt-{SESSION}-{id}"),
        stage: "triage".into(),
        provider: provider.into(),
        provider_kind: "openai".into(),
        model: "gpt-4o-mini".into(),
        state: state.into(),
        provider_batch_id: provider_id.map(str::to_string),
        request_count: lines.1,
        completed_count: lines.0,
        failed_count: lines.2,
        ingested_count: lines.0,
        created_at: Some(NOW - created_ago),
        next_poll_at: next_poll_in.map(|s| NOW + s),
        ..ProviderBatchRow::default()
    }
}

/// The error a hostile provider might send back: an escape sequence that
/// would clear the screen, then a long explanation.
const HOSTILE_BATCH_ERROR: &str = "\u{1b}[2J\u{1b}[31mquota exceeded\u{1b}[0m for organization org-abc: \
     the batch could not be validated because the input file contains lines whose model does not \
     match the batch's model; see https://platform.example.com/docs/batch for details\u{7}";

fn batches() -> (Vec<ProviderBatchRow>, ProviderBatchSummary) {
    let mut unknown = batch(
        5,
        "openai-main",
        "unknown",
        None,
        (0, 120, 0),
        1_900.0,
        None,
    );
    unknown.provider_kind = "openai".into();
    let mut failed = batch(
        4,
        "openai-main",
        "failed",
        Some("batch_67a0f3c2d8e48190b4c2f57e0d5a1c3e"),
        (0, 40, 40),
        2_700.0,
        None,
    );
    failed.error_message = Some(HOSTILE_BATCH_ERROR.into());
    // In progress: the provider has finished 117 of 300 (3 of them failed),
    // nothing read back yet, and the counts last moved 4 s ago.
    let mut running = batch(
        6,
        "openai-main",
        "in_progress",
        Some("batch_6f1e2d3c4b5a69788796a5b4c3d2e1f0"),
        (0, 300, 0),
        720.0,
        Some(12.0),
    );
    running.completed_count = 114;
    running.failed_count = 3;
    running.submitted_at = Some(NOW - 700.0);
    running.counts_changed_at = Some(NOW - 4.0);
    let mut cancelling = batch(
        3,
        "anthropic",
        "cancelling",
        Some("msgbatch_01HkcTjaV5uDC8jWR4ZsDV8d"),
        (10, 100, 0),
        3_600.0 * 3.0,
        Some(-4.0),
    );
    cancelling.provider_kind = "anthropic".into();
    cancelling.model = "claude-3-5-haiku".into();
    cancelling.cancel_requested_at = Some(NOW - 95.0);
    let rows = vec![
        batch(
            7,
            "openai-main",
            "submitting",
            None,
            (0, 200, 0),
            45.0,
            None,
        ),
        running,
        unknown,
        failed,
        cancelling,
        batch(
            2,
            "openai-main",
            "ingested",
            Some("batch_0123456789abcdef0123456789abcdef"),
            (500, 500, 0),
            90_000.0,
            None,
        ),
        batch(
            1,
            "openai-main",
            "ingested",
            Some("batch_1"),
            (80, 80, 0),
            95_000.0,
            None,
        ),
        batch(
            0,
            "openai-main",
            "ingested",
            Some("batch_0"),
            (20, 20, 0),
            99_000.0,
            None,
        ),
    ];
    let summary = ProviderBatchSummary {
        total: 8,
        open: vec![
            ("submitting".into(), 1),
            ("in_progress".into(), 1),
            ("failed".into(), 1),
            ("cancelling".into(), 1),
            ("unknown".into(), 1),
        ],
        ingested: 3,
        lines_waiting: 200 + 300 + 120 + 40 + 90,
    };
    (rows, summary)
}

fn batches_app() -> App {
    let mut snap = snapshot();
    (snap.batches, snap.batch_summary) = batches();
    app_with(false, snap)
}

#[test]
fn dashboard_with_batches_shows_a_summary_line() {
    let a = batches_app();
    snap_both("dashboard_batches", &a);
    // The gauges pane is narrow: the compact forms, the unknown one named.
    let wide = screen_text(render(&a, 120, 40).backend().buffer());
    assert!(
        wide.contains("batches 8: 5 open · ⚠ 1 unknown · 750 waiting"),
        "{wide}"
    );
    let narrow = screen_text(render(&a, 80, 24).backend().buffer());
    assert!(
        narrow.contains("batches 8 · ⚠ 1 unknown · 750 waiting"),
        "{narrow}"
    );
    // Without batches the gauges pane says nothing about them.
    let plain = screen_text(render(&app(), 120, 40).backend().buffer());
    assert!(!plain.contains("batches"), "{plain}");
}

#[test]
fn batches_overlay() {
    let mut a = batches_app();
    a.handle_key(key('b'));
    assert!(matches!(a.overlay, Overlay::Batches { scroll: 0 }));
    snap_both("batches_overlay", &a);
    for (w, h) in SIZES {
        let terminal = render(&a, w, h);
        let buf = terminal.backend().buffer();
        let ctx = format!("batches {w}x{h}");
        assert_clean(buf, &ctx);
        let text = screen_text(buf);
        assert!(text.contains("creating…"), "{ctx}: {text}");
        assert!(
            text.contains("cannot tell which provider batch is ours"),
            "{ctx}: {text}"
        );
        assert!(text.contains("in 12s") && text.contains("due"), "{ctx}");
        assert!(
            text.contains("45s") && text.contains("12m") && text.contains("3h"),
            "{ctx}"
        );
        assert!(text.contains("BATCHES"), "{ctx}: the mode badge");
    }
    // The overlay is wide enough at 120 for every state by name.
    let wide = screen_text(render(&a, 120, 40).backend().buffer());
    assert!(
        wide.contains(
            "batches 8: 1 submitting · 1 in_progress · 1 failed · 1 cancelling · 1 unknown · \
             3 ingested · 750 lines waiting"
        ),
        "{wide}"
    );
    // Scrolled to the end (G), the hostile error shows, without its escapes,
    // and the frame keeps its borders at every row.
    for (w, h) in SIZES {
        a.overlay = Overlay::Batches { scroll: 0 };
        let first = screen_text(render(&a, w, h).backend().buffer());
        if h == 24 {
            assert!(
                !first.contains("batch_0 "),
                "80x24 needs scrolling: {first}"
            );
        }
        a.handle_key(key('G'));
        let terminal = render(&a, w, h);
        let buf = terminal.backend().buffer();
        let ctx = format!("batches end {w}x{h}");
        assert_clean(buf, &ctx);
        let text = screen_text(buf);
        assert!(
            text.contains("quota exceeded for organization"),
            "{ctx}: {text}"
        );
        assert!(
            text.contains("for details"),
            "{ctx}: the whole error shows: {text}"
        );
        assert!(
            text.contains("batch_0 "),
            "{ctx}: the last batch shows: {text}"
        );
        for y in 2..h - 2 {
            let row = row_text(buf, y);
            assert!(row.contains('║'), "{ctx}: row {y} border broken: {row:?}");
        }
    }
}

#[test]
fn batches_overlay_end_snapshot() {
    let mut a = batches_app();
    a.handle_key(key('b'));
    render(&a, 80, 24);
    a.handle_key(key('G'));
    let terminal = render(&a, 80, 24);
    insta::assert_snapshot!("batches_overlay_end_80x24", terminal.backend());
}

#[test]
fn batches_overlay_without_batches() {
    let mut a = app();
    a.handle_key(key('b'));
    let text = screen_text(render(&a, 80, 24).backend().buffer());
    assert!(
        text.contains("no provider batches in this session"),
        "{text}"
    );
}

#[test]
fn odd_batch_rows_draw_without_panicking() {
    let mut snap = snapshot();
    let mut odd = batch(
        9,
        "\u{1b}[31mprov",
        "mystery_state",
        Some("\u{1b}]0;x\u{7}id"),
        (0, 0, 0),
        0.0,
        None,
    );
    odd.created_at = Some(f64::NAN);
    odd.next_poll_at = Some(f64::NEG_INFINITY);
    odd.cancel_requested_at = Some(NOW + 1e12);
    snap.batches = vec![odd];
    snap.batch_summary = ProviderBatchSummary {
        total: 1,
        open: vec![("mystery_state".into(), 1)],
        ingested: 0,
        lines_waiting: u64::MAX,
    };
    let mut a = app_with(false, snap);
    a.handle_key(key('b'));
    for (w, h) in SIZES {
        let terminal = render(&a, w, h);
        let buf = terminal.backend().buffer();
        assert_clean(buf, &format!("odd {w}x{h}"));
        let text = screen_text(buf);
        assert!(text.contains("· mystery_st…"), "{text}");
        assert!(
            text.contains("0/0      0     ?        —  due"),
            "no age from NaN: {text}"
        );
        assert!(text.contains("id id ·"), "sanitized id: {text}");
    }
}

// ---------------------------------------------------------------- workers

fn worker(id: &str, host: &str, alive: bool, claims: u64, rate: f64, age: f64) -> WorkerRow {
    WorkerRow {
        worker_id: id.into(),
        host: host.into(),
        pid: 4242,
        claims,
        sent: claims.saturating_mul(30),
        requests_per_sec: rate,
        orphaned: 0,
        heartbeat_age_secs: age,
        alive,
    }
}

/// Three workers newest first: one that just joined, the run's own engine,
/// and one gone for 12 minutes that lost two answers to a takeover.
fn workers() -> Vec<WorkerRow> {
    let mut gone = worker("bob@build-02:5150#k2x9", "build-02", false, 3, 4.0, 754.0);
    gone.orphaned = 2;
    vec![
        worker("carol@build-03:777#p0q1", "build-03", true, 12, 3.3, 0.4),
        worker(
            "alice@a-very-long-hostname.example.internal:31337#a1b2c3",
            "a-very-long-hostname.example.internal",
            true,
            40,
            12.5,
            1.2,
        ),
        gone,
    ]
}

fn workers_app() -> App {
    let mut snap = snapshot();
    snap.workers = workers();
    app_with(false, snap)
}

#[test]
fn workers_overlay() {
    let mut a = workers_app();
    a.handle_key(key('w'));
    assert!(matches!(a.overlay, Overlay::Workers { scroll: 0 }));
    snap_both("workers_overlay", &a);
    for (w, h) in SIZES {
        let ctx = format!("workers {w}x{h}");
        let text = screen_text(render(&a, w, h).backend().buffer());
        // The live ones are summed; the gone one's figures are history.
        assert!(
            text.contains("workers 3: 2 alive · 1 gone · 52 claims held · 15.8 req/s"),
            "{ctx}: {text}"
        );
        assert!(text.contains("● alive") && text.contains("✗ gone"), "{ctx}");
        assert!(text.contains("12m ago") && text.contains("0s ago"), "{ctx}");
        assert!(text.contains("2 answer(s) refused"), "{ctx}: {text}");
        assert!(text.contains("WORKERS"), "{ctx}: the mode badge");
    }
    // Long ids are cut to their column, never wrapped into the next.
    let narrow = screen_text(render(&a, 80, 24).backend().buffer());
    assert!(
        narrow.contains("alice@a-very-long-hostname.ex… a-very-long-h…"),
        "{narrow}"
    );
}

#[test]
fn workers_overlay_without_workers() {
    let mut a = app();
    a.handle_key(key('w'));
    let text = screen_text(render(&a, 80, 24).backend().buffer());
    assert!(
        text.contains("no worker has worked on this session yet"),
        "{text}"
    );
}

#[test]
fn hostile_worker_text_never_reaches_a_cell() {
    let mut snap = snapshot();
    let mut odd = worker(
        &hostile("wid"),
        &hostile("host"),
        true,
        u64::MAX,
        f64::NAN,
        f64::INFINITY,
    );
    odd.orphaned = u64::MAX;
    snap.workers = vec![odd, worker("w2", "h", true, u64::MAX, f64::INFINITY, -5.0)];
    let mut a = app_with(false, snap);
    a.handle_key(key('w'));
    for (w, h) in SIZES {
        let terminal = render(&a, w, h);
        let buf = terminal.backend().buffer();
        assert_clean(buf, &format!("workers {w}x{h}"));
        let text = screen_text(buf);
        assert!(text.contains("wid "), "{text}");
        assert!(text.contains("?"), "no rate from NaN: {text}");
    }
}

// ---------------------------------------------------------------- staged pipelines

fn stage(
    name: &str,
    position: u64,
    critic_of: Option<&str>,
    (total, done, failed, skipped, in_flight): (u64, u64, u64, u64, u64),
    state: &str,
) -> StageProgress {
    StageProgress {
        name: name.into(),
        total,
        done,
        failed,
        in_flight,
        skipped,
        position,
        role: if critic_of.is_some() {
            "critic"
        } else {
            "generator"
        }
        .into(),
        critic_of: critic_of.map(str::to_string),
        state: Some(state.into()),
        at_provider: 0,
    }
}

/// A generator and its critic: the critic runs behind it, with items
/// skipped where the generator failed; the run stops after the critic.
fn two_stage_snapshot() -> Snapshot {
    let mut snap = snapshot();
    let v = snap.view.as_mut().unwrap();
    v.stop_after_stage = Some("critic".into());
    v.gauges.as_mut().unwrap().stage = "critic".into();
    v.stages = vec![
        stage("adjudicate", 0, None, (1000, 1000, 10, 0, 0), "done"),
        stage(
            "critic",
            1,
            Some("adjudicate"),
            (1000, 400, 2, 10, 8),
            "running",
        ),
    ];
    snap
}

/// judge-gym's four stages: two done (one critic skipping items), the third
/// running with the run asked to stop after it, the last pending.
fn four_stage_snapshot() -> Snapshot {
    let mut snap = snapshot();
    let v = snap.view.as_mut().unwrap();
    v.stop_after_stage = Some("score_gen".into());
    v.gauges.as_mut().unwrap().stage = "score_gen".into();
    v.stages = vec![
        stage("rubric_gen", 0, None, (1000, 1000, 4, 0, 0), "done"),
        stage(
            "rubric_critic",
            1,
            Some("rubric_gen"),
            (1000, 1000, 1, 4, 0),
            "done",
        ),
        stage("score_gen", 2, None, (1000, 400, 10, 5, 8), "running"),
        stage(
            "score_critic",
            3,
            Some("score_gen"),
            (1000, 0, 0, 0, 0),
            "pending",
        ),
    ];
    snap
}

#[test]
fn dashboard_with_two_stages() {
    let a = app_with(false, two_stage_snapshot());
    snap_both("dashboard_two_stages", &a);
    for (w, h) in SIZES {
        let text = screen_text(render(&a, w, h).backend().buffer());
        assert!(text.contains("adjudicate"), "{w}x{h}:\n{text}");
        assert!(text.contains("↳ critic"), "{w}x{h}:\n{text}");
        assert!(text.contains("stop after"), "{w}x{h}:\n{text}");
        assert!(text.contains("10 skip"), "{w}x{h}:\n{text}");
        // The finished generator is at 100%; the critic is not.
        assert!(text.contains("100.0%"), "{w}x{h}:\n{text}");
        assert_eq!(text.matches("100.0%").count(), 1, "{w}x{h}:\n{text}");
    }
}

#[test]
fn dashboard_with_four_stages() {
    let a = app_with(false, four_stage_snapshot());
    snap_both("dashboard_four_stages", &a);
    for (w, h) in SIZES {
        let text = screen_text(render(&a, w, h).backend().buffer());
        for name in ["rubric_gen", "score_gen"] {
            assert!(text.contains(name), "{w}x{h} {name}:\n{text}");
        }
        assert!(text.contains("⏹"), "{w}x{h}:\n{text}");
        // The review queue keeps rows to read at 80x24.
        assert!(text.contains("item-0003"), "{w}x{h}:\n{text}");
    }
}

/// Never 100% while anything of a stage is pending or in flight, whatever
/// its counts say.
#[test]
fn a_stage_is_never_full_while_unfinished() {
    for (counts, state) in [
        ((100, 100, 0, 0, 1), "running"),
        ((100, 100, 0, 0, 0), "running"),
        ((100, 100, 0, 0, 0), "pending"),
        ((100, 120, 0, 0, 0), "running"),
    ] {
        let mut snap = snapshot();
        let v = snap.view.as_mut().unwrap();
        v.stop_after_stage = None;
        v.stages = vec![
            stage("gen", 0, None, counts, state),
            stage("crit", 1, Some("gen"), counts, state),
        ];
        let a = app_with(false, snap.clone());
        for (w, h) in SIZES {
            let text = screen_text(render(&a, w, h).backend().buffer());
            assert!(!text.contains("100.0%"), "{counts:?} {state}:\n{text}");
            assert!(text.contains("99.9%"), "{counts:?} {state}:\n{text}");
        }
        // Compact rows: the bar is never full either.
        let v = snap.view.as_mut().unwrap();
        v.stages.push(stage("third", 2, None, counts, state));
        v.stages.push(stage("fourth", 3, None, counts, state));
        let a = app_with(false, snap.clone());
        let text = screen_text(render(&a, 80, 24).backend().buffer());
        assert!(text.contains('░'), "{counts:?} {state}:\n{text}");
    }
}

fn critic_detail(rationale: &str) -> ReviewDetail {
    ReviewDetail {
        routing_note: Some("critic disagreed: accept -> review".into()),
        generator: Some(StageVerdict {
            stage: "adjudicate".into(),
            output_json: Some(
                r#"{"label":"spam","confidence":0.91,"rationale":"Unknown sender, prize language and a link."}"#
                    .into(),
            ),
            confidence: Some(0.91),
            rationale: Some("Unknown sender, prize language and a link.".into()),
            verdict: None,
        }),
        critic: Some(StageVerdict {
            stage: "critic".into(),
            output_json: Some(
                r#"{"verdict":"disagree","confidence":0.7,"label":"ham","rationale":"x"}"#.into(),
            ),
            confidence: Some(0.7),
            rationale: Some(rationale.into()),
            verdict: Some("disagree".into()),
        }),
        ..detail()
    }
}

fn critic_app(d: ReviewDetail) -> App {
    let mut snap = snapshot();
    snap.detail = Some(d);
    let mut a = app_with(false, snap);
    a.handle_key(key('5'));
    a.handle_key(KeyEvent::new(KeyCode::Enter, KeyModifiers::NONE));
    assert!(matches!(a.overlay, Overlay::Detail { scroll: 0 }));
    a
}

/// The generator's answer and the critic's verdict: side by side at 120
/// columns, stacked at 80, with why the item is in review above them.
#[test]
fn detail_with_critic() {
    let hostile_rationale = format!(
        "The sender is a known newsletter.\u{1b}[2J\u{1b}]0;pwned\u{7} {}",
        hostile("critic")
    );
    let a = critic_app(critic_detail(&hostile_rationale));
    snap_both("detail_critic", &a);
    for (w, h) in SIZES {
        let buf = render(&a, w, h).backend().buffer().clone();
        assert_clean(&buf, &format!("critic detail {w}x{h}"));
        let text = screen_text(&buf);
        assert!(
            text.contains("critic disagreed: accept -> review"),
            "{text}"
        );
        assert!(text.contains("VERDICT: DISAGREE"), "{text}");
        assert!(!text.contains("pwned"), "{text}");
        let gen_row = (0..h)
            .find(|&y| row_text(&buf, y).contains("generator: adjudicate"))
            .expect("generator heading");
        let critic_row = (0..h)
            .find(|&y| row_text(&buf, y).contains("critic: critic"))
            .expect("critic heading");
        if w >= 100 {
            assert_eq!(gen_row, critic_row, "side by side at {w}");
        } else {
            assert!(critic_row > gen_row, "stacked at {w}");
        }
    }
    // Scrolled to the end the raw outputs follow, the frame intact.
    let mut a = a;
    for (w, h) in SIZES {
        a.overlay = Overlay::Detail { scroll: 1000 };
        let buf = render(&a, w, h).backend().buffer().clone();
        for y in 2..h - 2 {
            let row = row_text(&buf, y);
            assert!(row.starts_with('║') && row.ends_with('║'), "{row:?}");
        }
    }
}

/// A long unbroken critic rationale wraps inside its column, never past it.
#[test]
fn critic_columns_keep_to_their_width() {
    let long = "y".repeat(700);
    let a = critic_app(critic_detail(&format!("{long} end-of-rationale")));
    let buf = render(&a, 120, 40).backend().buffer().clone();
    let divider = (0..40)
        .map(|y| row_text(&buf, y))
        .find(|r| r.contains("generator: adjudicate"))
        .and_then(|r| r.chars().position(|c| c == '┬'))
        .expect("divider");
    let heading = (0..40)
        .find(|&y| row_text(&buf, y).contains("generator: adjudicate"))
        .unwrap();
    let evidence = (0..40)
        .find(|&y| row_text(&buf, y).contains("── Evidence"))
        .unwrap_or(38);
    let mut rows_with_y = 0;
    for y in heading + 1..evidence {
        let row: Vec<char> = row_text(&buf, y).chars().collect();
        if row.contains(&'y') {
            rows_with_y += 1;
            assert_eq!(
                row[divider],
                '│',
                "row {y}: {}",
                row.iter().collect::<String>()
            );
            assert!(
                !row[..divider].contains(&'y'),
                "left column holds the critic's text"
            );
        }
    }
    assert!(rows_with_y > 5, "the rationale wraps in its column");
}

// ---------------------------------------------------------------- issue 16: text you can read

/// The text of the rows inside the (double-bordered) overlay box, between
/// its side borders.
fn inner_rows(buf: &Buffer) -> Vec<String> {
    (1..buf.area.height.saturating_sub(1))
        .map(|y| row_text(buf, y))
        .filter_map(|r| {
            let chars: Vec<char> = r.chars().collect();
            let first = chars.iter().position(|&c| c == '║')?;
            let last = chars.iter().rposition(|&c| c == '║')?;
            (last > first).then(|| chars[first + 1..last].iter().collect())
        })
        .collect()
}

/// The review detail wraps long JSON under its own indent (never back at
/// column 0), as aligned fields one key per line, so the parsed answer's
/// values are never cut at the border.
#[test]
fn review_detail_wraps_json_under_its_indent() {
    let mut d = detail();
    let long_reason = "the sender is not in the contacts and the message body links to a domain registered yesterday with a prize claim";
    d.stages[0].parsed_output_json = Some(format!(
        r#"{{"label":"spam","reason":"{long_reason}","confidence":0.91}}"#
    ));
    d.evidence_json = format!(
        r#"{{"from":"promo@example.com","body":"{}"}}"#,
        "Click here ".repeat(20)
    );
    let mut snap = snapshot();
    snap.detail = Some(d);
    let mut a = app_with(false, snap);
    a.handle_key(key('5'));
    a.handle_key(KeyEvent::new(KeyCode::Enter, KeyModifiers::NONE));
    for (w, h) in [(80u16, 60u16), (120, 60)] {
        let rows = inner_rows(render(&a, w, h).backend().buffer());
        let text = rows.join("\n");
        // Every key of the parsed answer on its own line, its value whole.
        assert!(text.contains("    confidence  0.91"), "{w}: {text}");
        assert!(text.contains("    label       spam"), "{w}: {text}");
        // The long value wraps; every row after its first is indented past
        // the key, and no word of it is cut.
        let start = rows
            .iter()
            .position(|r| r.contains("    reason      the sender"))
            .unwrap_or_else(|| panic!("{w}: no reason line: {text}"));
        let mut joined = rows[start].trim().to_string();
        for r in &rows[start + 1..] {
            // The next field (a key at the same indent) or the next part.
            let at = r.len() - r.trim_start().len();
            if at <= 4 || r.trim_start().starts_with("raw output") {
                break;
            }
            assert!(r.starts_with("      "), "{w}: continuation at column {r:?}");
            joined.push(' ');
            joined.push_str(r.trim());
        }
        assert!(joined.contains(long_reason), "{w}: {joined}");
        // Below the item's summary nothing starts at column 0 but the
        // headings.
        let body = rows.iter().position(|r| r.starts_with("── ")).unwrap();
        for r in &rows[body..] {
            assert!(
                r.starts_with(' ') || r.starts_with("── ") || r.trim().is_empty(),
                "{w}: a row back at column 0: {r:?}"
            );
        }
    }
}

fn long_event() -> Event {
    Event {
        at: NOW - 3.0,
        level: Level::Warn,
        kind: "attempt_failed".into(),
        message: format!(
            "item item-0042 attempt 1: http 503 server_error: {}END-OF-MESSAGE",
            "upstream temporarily unavailable, retry later; ".repeat(6)
        ),
        item_id: Some("item-0042".into()),
    }
}

/// Enter on an event draws it whole: its message word-wrapped inside the
/// overlay, continuation rows indented, to its last word.
#[test]
fn an_event_opens_in_full_with_its_message_wrapped() {
    let mut snap = snapshot();
    snap.events.insert(0, long_event());
    let mut a = app_with(false, snap);
    a.handle_key(key('4'));
    a.handle_key(KeyEvent::new(KeyCode::Enter, KeyModifiers::NONE));
    assert!(matches!(a.overlay, Overlay::Event { .. }));
    for (w, h) in SIZES {
        let buf = render(&a, w, h).backend().buffer().clone();
        let text = screen_text(&buf);
        assert!(text.contains("Event (Esc closes)"), "{w}x{h}: {text}");
        assert!(text.contains("item item-0042"), "{w}x{h}: {text}");
        let rows: Vec<String> = inner_rows(&buf)
            .into_iter()
            .map(|r| r.trim_end().to_string())
            .collect();
        let first = rows
            .iter()
            .position(|r| r.starts_with("item item-0042 attempt 1"))
            .unwrap_or_else(|| panic!("{w}x{h}: {text}"));
        let last = rows
            .iter()
            .position(|r| r.ends_with("END-OF-MESSAGE"))
            .unwrap_or_else(|| panic!("{w}x{h}: the message is cut: {text}"));
        assert!(last > first, "{w}x{h}: not wrapped: {text}");
        for r in &rows[first + 1..=last] {
            assert!(
                r.starts_with("  ") && !r.starts_with("   "),
                "{w}x{h}: {r:?}"
            );
        }
        let words: String = rows[first..=last]
            .iter()
            .map(|r| r.trim())
            .collect::<Vec<_>>()
            .join(" ");
        assert_eq!(words, long_event().message, "{w}x{h}");
        assert!(
            text.lines().last().unwrap().contains(" EVENT "),
            "{w}x{h}: {text}"
        );
    }
}

/// An event opened in full, with hostile text in every field (kind, item,
/// message with escapes, bidi overrides and newlines), draws none of it.
#[test]
fn a_hostile_event_opened_in_full_reaches_no_cell() {
    let mut snap = hostile_snapshot();
    snap.events[0].kind = hostile("kind");
    snap.events[0].item_id = Some(hostile("eventitem"));
    snap.events[0].message = format!("{}\n{}", hostile("event"), hostile("second"));
    let mut a = app_with(false, snap);
    a.handle_key(key('4'));
    a.handle_key(KeyEvent::new(KeyCode::Enter, KeyModifiers::NONE));
    assert!(matches!(a.overlay, Overlay::Event { .. }));
    for (w, h) in SIZES {
        let buf = render(&a, w, h).backend().buffer().clone();
        assert_clean(&buf, &format!("event {w}x{h}"));
        let text = screen_text(&buf);
        assert!(text.contains("Event (Esc closes)"), "{text}");
    }
}

/// A message wider than the footer wraps onto more footer rows: the
/// session id in it is never cut, and the panes make room.
#[test]
fn a_long_footer_message_wraps_and_keeps_the_session_id() {
    let mut a = app();
    a.set_toast(format!(
        "No engine runs {SESSION} now; continue it with `docket batch-adjudicate --resume {SESSION}`"
    ));
    for (w, h) in SIZES {
        let text = screen_text(render(&a, w, h).backend().buffer());
        let lines: Vec<&str> = text.lines().collect();
        let footer_start = lines
            .iter()
            .rposition(|l| l.starts_with(" NORMAL "))
            .unwrap_or_else(|| panic!("{w}x{h}: {text}"));
        let footer: Vec<&str> = lines[footer_start..].to_vec();
        if w == 80 {
            assert!(footer.len() >= 2, "{w}x{h}: one row: {text}");
        }
        let joined = footer
            .iter()
            .map(|l| l.trim())
            .collect::<Vec<_>>()
            .join(" ");
        assert!(
            joined.contains(&format!("--resume {SESSION}`")),
            "{w}x{h}: {joined}"
        );
        // Both mentions of the session id whole, each on one row.
        let whole: usize = footer.iter().map(|l| l.matches(SESSION).count()).sum();
        assert_eq!(whole, 2, "{w}x{h}: the session id is split: {footer:?}");
        assert!(!joined.contains('…'), "{w}x{h}: {joined}");
        // The panes are still drawn above it.
        assert!(text.contains("Review queue"), "{w}x{h}: {text}");
    }
    // A short message keeps the one-row footer with its key hints.
    a.set_toast("Resume asked.");
    let text = screen_text(render(&a, 80, 24).backend().buffer());
    let last = text.lines().last().unwrap();
    assert!(
        last.contains("Resume asked.") && last.contains("p pause"),
        "{last}"
    );
}

/// Marking every item shows the count once in the footer.
#[test]
fn mark_all_counts_once_in_the_footer() {
    let mut a = app();
    a.handle_key(key('5'));
    a.handle_key(KeyEvent::new(KeyCode::Char('V'), KeyModifiers::SHIFT));
    let text = screen_text(render(&a, 120, 40).backend().buffer());
    let footer = text.lines().last().unwrap();
    assert_eq!(footer.matches("12 marked").count(), 1, "{footer}");
}

/// Issue 16: with items of two sessions in the queue, each row names its
/// session's tail (at 80 columns, the answer still readable); with one
/// session the rows stay as they were. A re-asked item's card names the
/// suggestion it replaced: session, confidence and answer.
#[test]
fn queue_rows_name_their_session_when_several_share_the_queue() {
    const OTHER: &str = "batch_20231115_x9y8z7";
    let mut snap = snapshot();
    snap.review = page(6);
    for r in snap.review.rows.iter_mut().skip(3) {
        r.session_id = Some(OTHER.into());
    }
    snap.review.several_sessions = true;
    let mut a = app_with(false, snap.clone());
    a.focus = Pane::Review;
    let text = screen_text(render(&a, 80, 24).backend().buffer());
    let rows: Vec<&str> = text.lines().filter(|l| l.contains("item-00")).collect();
    assert_eq!(rows.len(), 6, "{text}");
    for (i, row) in rows.iter().enumerate() {
        let tail = if i < 3 { "…221000 " } else { "…x9y8z7 " };
        assert!(row.contains(tail), "row {i} names no session:\n{text}");
        assert!(row.contains("label="), "row {i} lost its answer:\n{text}");
    }
    snap.review.several_sessions = false;
    let a = app_with(false, snap.clone());
    let text = screen_text(render(&a, 80, 24).backend().buffer());
    assert!(
        !text.contains("…221000") && !text.contains("…x9y8z7"),
        "{text}"
    );

    snap.detail = Some(ReviewDetail {
        replaced: vec![docket::watch::ReplacedSuggestion {
            review_id: 7,
            session_id: Some(OTHER.into()),
            suggestion: r#"{"label":"ham"}"#.into(),
            confidence: Some(0.84),
            created_at: NOW - 60.0,
        }],
        ..detail()
    });
    let mut a = app_with(false, snap);
    a.handle_key(key('5'));
    a.handle_key(KeyEvent::new(KeyCode::Enter, KeyModifiers::NONE));
    let text = screen_text(render(&a, 80, 24).backend().buffer());
    // (Wrapped at 80 columns: the answer comes on the next line, indented.)
    assert!(
        text.contains(&format!(
            "replaces an earlier suggestion: session {OTHER} · 0.84 ·"
        )) && text.contains("║  label=ham"),
        "{text}"
    );
}

// ---------------------------------------------------------------- space

/// The pane whose title row holds `title`, as (x, y) of its top-left corner.
fn pane_corner(buf: &Buffer, title: &str) -> (u16, u16) {
    for y in 0..buf.area.height {
        let row = row_text(buf, y);
        if let Some(at) = row.find(title) {
            // The corner is the last border corner before the title.
            let before = &row[..at];
            let x = before
                .char_indices()
                .filter(|(_, c)| matches!(c, '┌' | '╔'))
                .map(|(i, _)| before[..i].chars().count())
                .next_back()
                .unwrap_or_else(|| panic!("no corner before {title:?} in {row:?}"));
            return (x as u16, y);
        }
    }
    panic!("{title:?} not on the screen:\n{}", screen_text(buf));
}

#[test]
fn at_200x60_the_panes_use_their_width() {
    let mut a = app();
    a.focus = Pane::Sessions;
    let terminal = render(&a, WIDE.0, WIDE.1);
    let buf = terminal.backend().buffer();
    let text = screen_text(buf);
    // The outcome bars are wider than the 30 cells they were held to.
    let bar_row = text
        .lines()
        .find(|l| l.contains("✓ accepted"))
        .expect("accepted row");
    let longest_bar = bar_row
        .split(|c| c != '█' && c != '░')
        .map(|run| run.chars().count())
        .max()
        .unwrap_or(0);
    assert!(
        longest_bar > 50,
        "outcome bar {longest_bar} cells: {bar_row}"
    );
    // The gauges pane has two columns: the counts beside the limits.
    assert!(
        text.lines()
            .any(|l| l.contains("req/min") && l.contains("429s")),
        "gauges in one column:\n{text}"
    );
    // The sessions pane lists when each session started, and why it stopped.
    assert!(
        text.contains("started (UTC)") && text.contains("stop reason"),
        "{text}"
    );
    assert!(text.contains("2023-11-14"), "{text}");
    // 120 columns keep the base columns.
    let narrow = screen_text(render(&a, 120, 40).backend().buffer());
    assert!(!narrow.contains("started (UTC)"), "{narrow}");
}

#[test]
fn the_preview_follows_the_cursor_and_only_where_it_fits() {
    use docket::tui::app::{Effect, PREVIEW_MIN_WIDTH};
    let mut a = app();
    let _ = a.resized(WIDE.0, WIDE.1);
    // Focusing the queue asks for its cursor item's card; moving, the next.
    let fx = a.handle_key(key('5'));
    assert!(fx.contains(&Effect::Detail(Some(100))), "{fx:?}");
    let fx = a.handle_key(key('j'));
    assert!(fx.contains(&Effect::Detail(Some(101))), "{fx:?}");
    // Until that card is read the preview says so (not the old card).
    a.snap.detail = Some(detail_of(0));
    let text = screen_text(render(&a, WIDE.0, WIDE.1).backend().buffer());
    assert!(text.contains(" Preview (Enter opens it) "), "{text}");
    assert!(text.contains("loading..."), "{text}");
    assert!(!text.contains("Unknown sender, prize language"), "{text}");
    a.snap.detail = Some(detail_of(1));
    let text = screen_text(render(&a, WIDE.0, WIDE.1).backend().buffer());
    assert!(
        text.contains("── Suggested answer") && text.contains("Unknown sender, prize language"),
        "{text}"
    );
    // The events pane makes way while the queue has the focus.
    assert!(!text.contains("4 Events"), "{text}");
    // Another pane focused: no preview, no card wanted, the events are back.
    let fx = a.handle_key(key('4'));
    assert!(fx.contains(&Effect::Detail(None)), "{fx:?}");
    let text = screen_text(render(&a, WIDE.0, WIDE.1).backend().buffer());
    assert!(
        !text.contains(" Preview ") && text.contains("4 Events"),
        "{text}"
    );
    // One column short of the threshold: no preview and no read for it.
    let mut b = app();
    let _ = b.resized(PREVIEW_MIN_WIDTH - 1, 60);
    let fx = b.handle_key(key('5'));
    assert!(
        !fx.iter().any(|f| matches!(f, Effect::Detail(Some(_)))),
        "{fx:?}"
    );
    b.snap.detail = Some(detail_of(0));
    let text = screen_text(render(&b, PREVIEW_MIN_WIDTH - 1, 60).backend().buffer());
    assert!(!text.contains(" Preview "), "{text}");
    let text = screen_text(render(&b, PREVIEW_MIN_WIDTH, 60).backend().buffer());
    assert!(text.contains(" Preview "), "{text}");
}

fn mouse(
    kind: ratatui::crossterm::event::MouseEventKind,
    x: u16,
    y: u16,
) -> ratatui::crossterm::event::MouseEvent {
    ratatui::crossterm::event::MouseEvent {
        kind,
        column: x,
        row: y,
        modifiers: KeyModifiers::NONE,
    }
}

#[test]
fn clicks_focus_and_select_and_the_wheel_scrolls_only_with_the_mouse_on() {
    use ratatui::crossterm::event::{MouseButton, MouseEventKind as K};
    let click = |x, y| mouse(K::Down(MouseButton::Left), x, y);
    for (w, h) in [SIZES[0], SIZES[1], WIDE] {
        let mut a = app();
        let ctx = format!("{w}x{h}");
        let terminal = render(&a, w, h);
        let buf = terminal.backend().buffer().clone();
        let (qx, qy) = pane_corner(&buf, "5 Review queue");
        // Off (the default): a click does nothing.
        a.handle_mouse(click(qx + 5, qy + 3));
        assert_eq!((a.focus, a.review_cursor), (Pane::Stages, 0), "{ctx}");
        a.screen.mouse = true;
        // The third row of the queue: focused, and its item selected.
        a.handle_mouse(click(qx + 5, qy + 3));
        assert_eq!((a.focus, a.review_cursor), (Pane::Review, 2), "{ctx}");
        // The border selects nothing.
        a.handle_mouse(click(qx + 5, qy));
        assert_eq!(a.review_cursor, 2, "{ctx}");
        // The wheel: three rows a notch, within the list.
        a.handle_mouse(mouse(K::ScrollDown, qx + 5, qy + 2));
        assert_eq!(a.review_cursor, 5, "{ctx}");
        for _ in 0..5 {
            a.handle_mouse(mouse(K::ScrollDown, qx + 5, qy + 2));
        }
        assert_eq!(a.review_cursor, 11, "{ctx}: the last of 12");
        a.handle_mouse(mouse(K::ScrollUp, qx + 5, qy + 2));
        assert_eq!(a.review_cursor, 8, "{ctx}");
        let (sx, sy) = pane_corner(&buf, "1 Stages");
        a.handle_mouse(click(sx + 3, sy + 1));
        assert_eq!(a.focus, Pane::Stages, "{ctx}");
        if (w, h) != SIZES[0] {
            // The sessions pane: its rows start under the column header.
            let terminal = render(&a, w, h);
            let buf = terminal.backend().buffer().clone();
            let (x, y) = pane_corner(&buf, "6 Sessions");
            a.handle_mouse(click(x + 4, y + 3));
            assert_eq!((a.focus, a.sessions_cursor), (Pane::Sessions, 1), "{ctx}");
            a.handle_mouse(click(x + 4, y + 1));
            assert_eq!(a.sessions_cursor, 1, "{ctx}: the header selects nothing");
        }
    }
}

#[test]
fn an_audit_item_says_so_in_the_queue_and_on_its_card() {
    let mut snap = snapshot();
    snap.review = page(3);
    snap.review.rows[1].audit = true;
    snap.detail = Some(ReviewDetail {
        audit: true,
        ..detail()
    });
    let mut a = app_with(false, snap);
    a.focus = Pane::Review;
    let text = screen_text(render(&a, 80, 24).backend().buffer());
    let rows: Vec<&str> = text.lines().filter(|l| l.contains("item-00")).collect();
    assert_eq!(rows.len(), 3, "{text}");
    assert!(rows[1].contains("item-0001 audit "), "{text}");
    assert!(
        !rows[0].contains("audit") && !rows[2].contains("audit"),
        "{text}"
    );
    a.handle_key(KeyEvent::new(KeyCode::Enter, KeyModifiers::NONE));
    let text = screen_text(render(&a, 80, 24).backend().buffer());
    assert!(text.contains("audit sample"), "{text}");
}

/// The header names the run's settings that are not the defaults: its
/// completion mode and the rate-limit profile (with its version) it ran
/// with.
#[test]
fn the_header_names_the_completion_mode_and_the_profile() {
    let mut snap = snapshot();
    if let Some(v) = snap.view.as_mut() {
        v.profile = Some(("tier\u{1b}[31m1".into(), 3));
        v.row.config_snapshot_json = r#"{"flags":{"completion_mode":"best_effort"}}"#.into();
    }
    let app = app_with(false, snap);
    let header = row_text(render(&app, 120, 40).backend().buffer(), 0);
    assert!(
        header.contains("· best_effort · profile tier1 v3"),
        "{header}"
    );
    assert!(!header.contains('\u{1b}'), "{header}");
}
