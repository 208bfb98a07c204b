//! The console's state machine without a terminal: keys go in, state changes
//! and `Effect`s (data for the runner) come out. Fixtures are hand-built
//! ledger snapshots with fixed times.

use docket::ledger::store::SessionRow;
use docket::tui::app::{
    App, BULK_CONFIRM, Control, Dialog, Effect, Mode, Overlay, Pane, QuitChoice, REVIEW_WINDOW,
    Snapshot,
};
use docket::tui::keymap::Keymap;
use docket::watch::{
    Engine, Event, Level, LiveGauges, ReviewPage, ReviewQuery, ReviewRow, SessionSummary,
    SessionView, ShownState, StageProgress, StateFacts, Tune, shown_state,
};
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

/// 2023-11-14 22:13:20 UTC.
const NOW: f64 = 1_700_000_000.0;
const SESSION: &str = "batch_20231114_221000";
const OTHER_SESSION: &str = "batch_20231113_090000";

// ---------------------------------------------------------------- fixtures

fn session_row(id: &str, state: &str, desired: &str) -> SessionRow {
    SessionRow {
        session_id: id.into(),
        started_at: NOW - 200.0,
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
    let stop_after_stage: Option<String> = None;
    SessionView {
        row: session_row(SESSION, state, desired),
        tune: Tune::default(),
        gauges: Some(LiveGauges {
            in_flight: 8,
            concurrency_limit: 8,
            max_concurrency: 16,
            rpm_limit: 600,
            tpm_limit: 0,
            rpm_used: 412.0,
            tpm_used: 38_500.0,
            slow_reason: String::new(),
            paused: state == "paused",
            stage: "triage".into(),
            elapsed_secs: 200.0,
            eta_secs: Some(300.0),
            ..LiveGauges::default()
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
                done: 0,
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

fn summary(id: &str, state: &str, live: bool, started_ago: f64) -> SessionSummary {
    SessionSummary {
        session_id: id.into(),
        state: state.into(),
        desired_state: state.into(),
        started_at: NOW - started_ago,
        completed_at: None,
        total: 1000,
        processed: 400,
        accepted: 300,
        review: 60,
        rejected: 30,
        errors: 10,
        cost_usd: 0.4321,
        estimated_cost_usd: 1.08,
        stop_reason: None,
        live,
        shown: shown_of(state, state, false, live),
    }
}

fn review_row(i: u64) -> ReviewRow {
    ReviewRow {
        review_id: 100 + i as i64,
        item_id: format!("item-{i:04}"),
        session_id: Some(SESSION.into()),
        confidence: Some(0.5),
        suggestion: r#"{"label":"spam"}"#.into(),
        rationale: Some("looks like spam".into()),
        model_id: Some("mock-1".into()),
        claimed_by: None,
        audit: false,
        stale: false,
        evidence: String::new(),
    }
}

fn id_at(i: u64) -> i64 {
    100 + i as i64
}

/// A page of the queue: `total` pending items, rows `offset..offset+len`.
fn page(total: u64, offset: u64, len: u64) -> ReviewPage {
    let end = (offset + len).min(total);
    ReviewPage {
        total,
        offset,
        rows: (offset..end).map(review_row).collect(),
        several_sessions: false,
    }
}

fn snapshot_with(review: ReviewPage, view: Option<SessionView>) -> Snapshot {
    Snapshot {
        sessions: vec![
            summary(SESSION, "running", true, 200.0),
            summary(OTHER_SESSION, "completed", false, 90_000.0),
            summary("batch_20231112_080000", "cancelled", false, 180_000.0),
        ],
        view,
        events: vec![Event {
            at: NOW - 5.0,
            level: Level::Info,
            kind: "stage".into(),
            message: "stage triage started".into(),
            item_id: None,
        }],
        review,
        detail: None,
        now: NOW,
        ..Snapshot::default()
    }
}

fn snapshot(total: u64) -> Snapshot {
    snapshot_with(
        page(total, 0, REVIEW_WINDOW),
        Some(view("running", "running")),
    )
}

fn app_with(keymap: Keymap, read_only: bool, snap: Snapshot) -> App {
    let mut app = App::new(keymap, read_only);
    let fx = app.apply_snapshot(snap);
    // Focus starts on Stages: no claim is asked for yet.
    assert!(
        !fx.iter().any(|e| matches!(e, Effect::Claim(Some(_)))),
        "{fx:?}"
    );
    app
}

fn app(total: u64) -> App {
    app_with(Keymap::default_map(), false, snapshot(total))
}

/// An app focused on the review queue, cursor on the first item.
fn review_app(total: u64) -> App {
    let mut a = app(total);
    let fx = a.handle_key(ch('5'));
    assert_eq!(a.focus, Pane::Review);
    assert_eq!(fx, vec![Effect::Claim(Some(id_at(0)))]);
    a
}

// ---------------------------------------------------------------- keys

fn key(code: KeyCode) -> KeyEvent {
    KeyEvent::new(code, KeyModifiers::NONE)
}

fn ch(c: char) -> KeyEvent {
    let mods = if c.is_ascii_uppercase() {
        KeyModifiers::SHIFT
    } else {
        KeyModifiers::NONE
    };
    KeyEvent::new(KeyCode::Char(c), mods)
}

fn ctrl(c: char) -> KeyEvent {
    KeyEvent::new(KeyCode::Char(c), KeyModifiers::CONTROL)
}

fn esc() -> KeyEvent {
    key(KeyCode::Esc)
}

fn enter() -> KeyEvent {
    key(KeyCode::Enter)
}

/// Type text key by key; returns every key's effects.
fn type_text(app: &mut App, text: &str) -> Vec<Vec<Effect>> {
    text.chars().map(|c| app.handle_key(ch(c))).collect()
}

fn query(filter: Option<&str>, offset: u64) -> Effect {
    Effect::Query(ReviewQuery {
        filter: filter.map(str::to_string),
        session: None,
        offset,
        limit: REVIEW_WINDOW,
    })
}

fn control(c: Control) -> Effect {
    Effect::Control {
        session_id: SESSION.into(),
        control: c,
    }
}

fn input_text(app: &App) -> String {
    match &app.overlay {
        Overlay::Filter(i) | Overlay::Command(i) => i.value().to_string(),
        other => panic!("no input open: {other:?}"),
    }
}

fn dialog(app: &App) -> Option<Dialog> {
    match &app.overlay {
        Overlay::Dialog(d) => Some(d.clone()),
        _ => None,
    }
}

fn toast(app: &App) -> String {
    app.toast.clone().unwrap_or_default()
}

// ---------------------------------------------------------------- focus

#[test]
fn start_watches_and_queries() {
    let mut a = App::new(Keymap::default_map(), false);
    assert!(!a.loaded);
    assert_eq!(a.start(), vec![Effect::Watch(None), query(None, 0)]);
    a.apply_snapshot(snapshot(3));
    assert!(a.loaded);
    assert_eq!(a.mode(), Mode::Normal);
}

#[test]
fn tab_and_backtab_cycle_through_all_six_panes() {
    let mut a = app(3);
    assert_eq!(a.focus, Pane::Stages);
    let mut seen = Vec::new();
    for _ in 0..6 {
        a.handle_key(key(KeyCode::Tab));
        seen.push(a.focus);
    }
    assert_eq!(
        seen,
        vec![
            Pane::Outcomes,
            Pane::Gauges,
            Pane::Events,
            Pane::Review,
            Pane::Sessions,
            Pane::Stages
        ]
    );
    let mut back = Vec::new();
    for _ in 0..6 {
        a.handle_key(KeyEvent::new(KeyCode::BackTab, KeyModifiers::SHIFT));
        back.push(a.focus);
    }
    assert_eq!(
        back,
        vec![
            Pane::Sessions,
            Pane::Review,
            Pane::Events,
            Pane::Gauges,
            Pane::Outcomes,
            Pane::Stages
        ]
    );
}

#[test]
fn number_keys_jump_to_panes() {
    let mut a = app(3);
    for (c, pane) in ['6', '2', '4', '3', '5', '1'].into_iter().zip([
        Pane::Sessions,
        Pane::Outcomes,
        Pane::Events,
        Pane::Gauges,
        Pane::Review,
        Pane::Stages,
    ]) {
        a.handle_key(ch(c));
        assert_eq!(a.focus, pane, "key {c}");
        assert_eq!(pane.number(), c.to_digit(10).unwrap() as usize);
    }
}

#[test]
fn leaving_the_review_pane_releases_the_claim() {
    let mut a = review_app(3);
    assert_eq!(a.handle_key(key(KeyCode::Tab)), vec![Effect::Claim(None)]);
    assert_eq!(a.focus, Pane::Sessions);
}

// ---------------------------------------------------------------- review cursor

#[test]
fn j_k_g_and_bottom_move_within_total_and_claim_the_new_item() {
    let mut a = review_app(3);
    assert_eq!(a.handle_key(ch('j')), vec![Effect::Claim(Some(id_at(1)))]);
    assert_eq!(a.review_cursor, 1);
    assert_eq!(a.handle_key(ch('k')), vec![Effect::Claim(Some(id_at(0)))]);
    assert_eq!(a.review_cursor, 0);
    // Already at the top: nothing moves, nothing is claimed again.
    assert_eq!(a.handle_key(ch('k')), vec![]);
    assert_eq!(a.review_cursor, 0);
    assert_eq!(a.handle_key(ch('G')), vec![Effect::Claim(Some(id_at(2)))]);
    assert_eq!(a.review_cursor, 2);
    assert_eq!(a.handle_key(ch('j')), vec![], "stays on the last item");
    assert_eq!(a.review_cursor, 2);
    assert_eq!(a.handle_key(ch('g')), vec![Effect::Claim(Some(id_at(0)))]);
    assert_eq!(a.review_cursor, 0);
    assert_eq!(a.cursor_row().map(|r| r.review_id), Some(id_at(0)));
}

#[test]
fn page_down_moves_ten_and_clamps_at_the_end() {
    let mut a = review_app(15);
    assert_eq!(
        a.handle_key(key(KeyCode::PageDown)),
        vec![Effect::Claim(Some(id_at(10)))]
    );
    assert_eq!(a.review_cursor, 10);
    assert_eq!(
        a.handle_key(key(KeyCode::PageDown)),
        vec![Effect::Claim(Some(id_at(14)))]
    );
    assert_eq!(a.review_cursor, 14);
    assert_eq!(
        a.handle_key(key(KeyCode::PageUp)),
        vec![Effect::Claim(Some(id_at(4)))]
    );
    assert_eq!(a.review_cursor, 4);
}

#[test]
fn moving_beyond_the_loaded_window_queries_a_new_offset() {
    // 500 pending, the first REVIEW_WINDOW loaded.
    let mut a = review_app(500);
    assert_eq!(a.snap.review.rows.len() as u64, REVIEW_WINDOW);
    let fx = a.handle_key(ch('G'));
    assert_eq!(a.review_cursor, 499);
    assert_eq!(fx, vec![query(None, 499 - REVIEW_WINDOW / 2)]);
    assert!(a.cursor_row().is_none());
    // The page arrives: the cursor item is claimed.
    let fx = a.apply_snapshot(snapshot_with(
        page(500, 399, REVIEW_WINDOW),
        Some(view("running", "running")),
    ));
    assert_eq!(fx, vec![Effect::Claim(Some(id_at(499)))]);
    assert_eq!(a.review_cursor, 499);

    // Paging down across the window's end from inside it.
    let mut a = review_app(500);
    a.review_cursor = REVIEW_WINDOW - 5;
    let fx = a.handle_key(key(KeyCode::PageDown));
    assert_eq!(a.review_cursor, REVIEW_WINDOW + 5);
    assert_eq!(fx, vec![query(None, REVIEW_WINDOW + 5 - REVIEW_WINDOW / 2)]);
}

// ---------------------------------------------------------------- decisions

#[test]
fn accept_reject_skip_and_undo_on_the_cursor() {
    let mut a = review_app(3);
    // A decision moves the cursor on at once (a quick second key must not
    // land on the item just decided) and holds the next item.
    assert_eq!(
        a.handle_key(ch('a')),
        vec![
            Effect::Accept(vec![id_at(0)]),
            Effect::Claim(Some(id_at(1)))
        ]
    );
    assert_eq!(a.review_cursor, 1);
    assert_eq!(
        a.handle_key(ch('r')),
        vec![
            Effect::Reject(vec![id_at(1)]),
            Effect::Claim(Some(id_at(2)))
        ]
    );
    assert_eq!(a.handle_key(ch('k')), vec![Effect::Claim(Some(id_at(1)))]);
    assert_eq!(a.handle_key(ch('s')), vec![Effect::Claim(Some(id_at(2)))]);
    assert_eq!(a.review_cursor, 2);
    assert_eq!(a.handle_key(ch('u')), vec![Effect::Undo]);
}

#[test]
fn decided_item_leaving_the_queue_advances_to_the_next() {
    let mut a = review_app(4);
    a.handle_key(ch('j'));
    assert_eq!(
        a.handle_key(ch('a')),
        vec![
            Effect::Accept(vec![id_at(1)]),
            Effect::Claim(Some(id_at(2)))
        ]
    );
    // The ledger no longer lists item 1: the cursor stays on item 2, now
    // one row up, and already holds it.
    let mut next = page(4, 0, REVIEW_WINDOW);
    next.rows.retain(|r| r.review_id != id_at(1));
    next.total = 3;
    let fx = a.apply_snapshot(snapshot_with(next, Some(view("running", "running"))));
    assert_eq!(a.review_cursor, 1);
    assert_eq!(a.cursor_row().map(|r| r.review_id), Some(id_at(2)));
    assert_eq!(a.review_cursor_id, Some(id_at(2)));
    assert_eq!(fx, vec![]);
}

#[test]
fn cursor_follows_its_item_when_rows_above_leave() {
    let mut a = review_app(4);
    a.handle_key(ch('j'));
    a.handle_key(ch('j'));
    assert_eq!(a.review_cursor_id, Some(id_at(2)));
    // Someone else decided item 0.
    let mut next = page(4, 0, REVIEW_WINDOW);
    next.rows.remove(0);
    next.total = 3;
    let fx = a.apply_snapshot(snapshot_with(next, Some(view("running", "running"))));
    assert_eq!(a.review_cursor, 1);
    assert_eq!(a.cursor_row().map(|r| r.review_id), Some(id_at(2)));
    assert_eq!(fx, vec![], "still on the same claimed item");
}

#[test]
fn space_marks_and_moves_down_and_accept_takes_all_marks() {
    let mut a = review_app(4);
    assert_eq!(
        a.handle_key(key(KeyCode::Char(' '))),
        vec![Effect::Claim(Some(id_at(1)))]
    );
    assert_eq!(a.review_cursor, 1);
    a.handle_key(key(KeyCode::Char(' ')));
    assert_eq!(a.review_cursor, 2);
    assert_eq!(
        a.marks.iter().copied().collect::<Vec<_>>(),
        vec![id_at(0), id_at(1)]
    );
    assert_eq!(
        a.handle_key(ch('a')),
        vec![Effect::Accept(vec![id_at(0), id_at(1)])]
    );
    assert!(a.marks.is_empty(), "marks are cleared once used");
}

#[test]
fn space_on_a_marked_item_unmarks_it() {
    let mut a = review_app(4);
    a.handle_key(key(KeyCode::Char(' ')));
    a.handle_key(ch('k'));
    a.handle_key(key(KeyCode::Char(' ')));
    assert!(a.marks.is_empty());
}

fn mark_five(a: &mut App) -> Vec<i64> {
    for _ in 0..BULK_CONFIRM {
        a.handle_key(key(KeyCode::Char(' ')));
    }
    let ids: Vec<i64> = (0..BULK_CONFIRM as u64).map(id_at).collect();
    assert_eq!(a.marks.iter().copied().collect::<Vec<_>>(), ids);
    ids
}

#[test]
fn bulk_reject_asks_and_y_confirms() {
    let mut a = review_app(10);
    let ids = mark_five(&mut a);
    assert_eq!(a.handle_key(ch('r')), vec![]);
    assert_eq!(dialog(&a), Some(Dialog::BulkReject { ids: ids.clone() }));
    assert_eq!(a.mode(), Mode::Confirm);
    assert_eq!(a.handle_key(ch('y')), vec![Effect::Reject(ids)]);
    assert!(dialog(&a).is_none());
    assert!(a.marks.is_empty());
}

#[test]
fn bulk_reject_n_or_esc_does_nothing() {
    for no in [ch('n'), esc(), enter()] {
        let mut a = review_app(10);
        let ids = mark_five(&mut a);
        a.handle_key(ch('r'));
        assert_eq!(dialog(&a), Some(Dialog::BulkReject { ids: ids.clone() }));
        assert_eq!(a.handle_key(no), vec![], "{no:?}");
        assert!(dialog(&a).is_none(), "{no:?} closes the dialog");
        assert_eq!(a.marks.len(), BULK_CONFIRM, "the marks stay");
        assert_eq!(a.quit, None);
    }
}

#[test]
fn accepting_many_marks_does_not_ask() {
    let mut a = review_app(10);
    let ids = mark_five(&mut a);
    assert_eq!(a.handle_key(ch('a')), vec![Effect::Accept(ids)]);
    assert!(dialog(&a).is_none());
}

/// An item another operator holds (a live lease under another claimant) is
/// not ours to decide, even with the cursor on it.
#[test]
fn held_item_is_not_decided() {
    let mut snap = snapshot(3);
    snap.review.rows[0].claimed_by = Some("bob@h:1".into());
    let mut a = app_with(Keymap::default_map(), false, snap);
    a.handle_key(ch('5'));
    assert_eq!(a.cursor_row().map(|r| r.review_id), Some(id_at(0)));
    let fx = a.handle_key(ch('a'));
    assert!(
        !fx.iter().any(|e| matches!(e, Effect::Accept(_))),
        "accepted an item bob holds: {fx:?}"
    );
    assert!(toast(&a).contains("held by"), "toast: {:?}", a.toast);
    assert!(toast(&a).contains("bob@h:1"), "toast: {:?}", a.toast);
}

// ---------------------------------------------------------------- run controls

#[test]
fn c_opens_cancel_dialog_and_default_is_no() {
    for no in [enter(), ch('n'), esc()] {
        let mut a = app(3);
        assert_eq!(a.handle_key(ch('c')), vec![]);
        assert_eq!(
            dialog(&a),
            Some(Dialog::CancelRun {
                session_id: SESSION.into(),
                pending: 600
            })
        );
        assert_eq!(a.handle_key(no), vec![], "{no:?}");
        assert!(dialog(&a).is_none(), "{no:?} closes the dialog");
        assert_eq!(a.quit, None);
    }
    let mut a = app(3);
    a.handle_key(ch('c'));
    assert_eq!(a.handle_key(ch('y')), vec![control(Control::Cancel)]);
    assert!(dialog(&a).is_none());
}

#[test]
fn p_pauses_and_resumes_and_capital_s_stops_at_stage() {
    let mut a = app(3);
    assert_eq!(a.handle_key(ch('p')), vec![control(Control::Pause)]);
    assert_eq!(a.handle_key(ch('S')), vec![control(Control::StopAtStage)]);

    // Pause asked, not yet reached: p resumes.
    let mut a = app_with(
        Keymap::default_map(),
        false,
        snapshot_with(page(3, 0, 3), Some(view("running", "paused"))),
    );
    assert!(a.paused());
    assert_eq!(a.handle_key(ch('p')), vec![control(Control::Resume)]);
}

#[test]
fn completed_session_takes_no_controls() {
    let mut a = app_with(
        Keymap::default_map(),
        false,
        snapshot_with(page(3, 0, 3), Some(view("completed", "completed"))),
    );
    for c in ['p', 'S', 'c'] {
        assert_eq!(a.handle_key(ch(c)), vec![], "{c}");
        assert!(dialog(&a).is_none());
        assert!(toast(&a).contains("completed"), "{c}: {:?}", a.toast);
    }
}

// ---------------------------------------------------------------- quitting

#[test]
fn q_closes_when_nothing_of_ours_runs() {
    let mut a = app(3);
    assert_eq!(a.handle_key(ch('q')), vec![Effect::Quit(QuitChoice::Close)]);
    assert_eq!(a.quit, Some(QuitChoice::Close));
}

#[test]
fn q_with_a_live_in_process_run_asks_how() {
    for (k, choice) in [
        (ch('k'), QuitChoice::KeepHeadless),
        (ch('p'), QuitChoice::Pause),
        (ch('c'), QuitChoice::Cancel),
        (ctrl('c'), QuitChoice::Cancel),
    ] {
        let mut a = app(3);
        a.in_process_session = Some(SESSION.into());
        a.in_process_live = true;
        assert_eq!(a.handle_key(ch('q')), vec![]);
        assert_eq!(dialog(&a), Some(Dialog::QuitLive));
        assert_eq!(a.quit, None);
        assert_eq!(a.handle_key(k), vec![Effect::Quit(choice)], "{k:?}");
        assert_eq!(a.quit, Some(choice));
        assert!(dialog(&a).is_none());
    }
    // Esc goes back without quitting.
    let mut a = app(3);
    a.in_process_live = true;
    a.handle_key(ch('q'));
    assert_eq!(a.handle_key(esc()), vec![]);
    assert!(dialog(&a).is_none());
    assert_eq!(a.quit, None);
    // A key that means nothing here leaves the question open.
    a.handle_key(ch('q'));
    assert_eq!(a.handle_key(ch('x')), vec![]);
    assert_eq!(dialog(&a), Some(Dialog::QuitLive));
    assert_eq!(a.quit, None);
}

#[test]
fn ctrl_c_quits_like_q() {
    let mut a = app(3);
    assert_eq!(
        a.handle_key(ctrl('c')),
        vec![Effect::Quit(QuitChoice::Close)]
    );
    let mut a = app(3);
    a.in_process_live = true;
    assert_eq!(a.handle_key(ctrl('c')), vec![]);
    assert_eq!(dialog(&a), Some(Dialog::QuitLive));
}

fn assert_no_quit(a: &App, fx: &[Effect], ctx: &str) {
    assert_eq!(a.quit, None, "{ctx}");
    assert!(
        !fx.iter().any(|e| matches!(e, Effect::Quit(_))),
        "{ctx}: {fx:?}"
    );
}

#[test]
fn esc_never_quits() {
    // Normal mode, every pane, several times.
    let mut a = review_app(3);
    for pane in ['1', '2', '3', '4', '5', '6'] {
        a.handle_key(ch(pane));
        for _ in 0..3 {
            let fx = a.handle_key(esc());
            assert_no_quit(&a, &fx, &format!("normal, pane {pane}"));
        }
    }
    // Every overlay.
    let openers: Vec<(&str, Vec<KeyEvent>)> = vec![
        ("help", vec![ch('?')]),
        ("detail", vec![ch('5'), enter()]),
        ("filter", vec![ch('/'), ch('x')]),
        ("command", vec![ch(':'), ch('q')]),
        ("cancel dialog", vec![ch('c')]),
        (
            "bulk reject dialog",
            vec![
                ch('5'),
                key(KeyCode::Char(' ')),
                key(KeyCode::Char(' ')),
                key(KeyCode::Char(' ')),
                key(KeyCode::Char(' ')),
                key(KeyCode::Char(' ')),
                ch('r'),
            ],
        ),
    ];
    for (name, keys) in openers {
        let mut a = app(10);
        for k in keys {
            a.handle_key(k);
        }
        assert_ne!(a.mode(), Mode::Normal, "{name} did not open");
        let fx = a.handle_key(esc());
        assert_no_quit(&a, &fx, name);
        assert_eq!(a.mode(), Mode::Normal, "Esc closes {name}");
        let fx = a.handle_key(esc());
        assert_no_quit(&a, &fx, name);
    }
    // The quit dialog itself.
    let mut a = app(3);
    a.in_process_live = true;
    a.handle_key(ch('q'));
    let fx = a.handle_key(esc());
    assert_no_quit(&a, &fx, "quit dialog");
}

// ---------------------------------------------------------------- filter

#[test]
fn filter_queries_on_each_change_enter_keeps_esc_clears() {
    let mut a = review_app(3);
    a.handle_key(ch('j'));
    let fx = a.handle_key(ch('/'));
    assert!(!fx.iter().any(|e| matches!(e, Effect::Query(_))), "{fx:?}");
    assert_eq!(a.mode(), Mode::Filter);
    assert_eq!(a.focus, Pane::Review);
    let typed = type_text(&mut a, "abc");
    assert_eq!(
        typed,
        vec![
            vec![query(Some("a"), 0)],
            vec![query(Some("ab"), 0)],
            vec![query(Some("abc"), 0)],
        ]
    );
    assert_eq!(a.review_cursor, 0, "a new filter starts at the top");
    assert_eq!(input_text(&a), "abc");
    // Backspace is a change too.
    assert_eq!(
        a.handle_key(key(KeyCode::Backspace)),
        vec![query(Some("ab"), 0)]
    );
    a.handle_key(ch('c'));
    // Enter keeps the filter.
    assert_eq!(a.handle_key(enter()), vec![]);
    assert_eq!(a.mode(), Mode::Normal);
    assert_eq!(a.filter.as_deref(), Some("abc"));
    // Esc in the list clears it.
    assert_eq!(a.handle_key(esc()), vec![query(None, 0)]);
    assert_eq!(a.filter, None);
    assert_eq!(a.quit, None);
}

#[test]
fn esc_while_typing_the_filter_clears_it() {
    let mut a = review_app(3);
    a.handle_key(ch('/'));
    type_text(&mut a, "sp");
    assert_eq!(a.handle_key(esc()), vec![query(None, 0)]);
    assert_eq!(a.filter, None);
    assert_eq!(a.mode(), Mode::Normal);
}

#[test]
fn filter_reopens_with_the_current_text() {
    let mut a = review_app(3);
    a.handle_key(ch('/'));
    type_text(&mut a, "spam");
    a.handle_key(enter());
    a.handle_key(ch('/'));
    assert_eq!(input_text(&a), "spam");
    // Keys that are bindings elsewhere are text here.
    assert_eq!(
        type_text(&mut a, "q").concat(),
        vec![query(Some("spamq"), 0)]
    );
    assert_eq!(a.quit, None);
}

// ---------------------------------------------------------------- command line

fn command(a: &mut App, text: &str) -> Vec<Effect> {
    assert_eq!(a.handle_key(ch(':')), vec![]);
    assert_eq!(a.mode(), Mode::Command);
    for fx in type_text(a, text) {
        assert_eq!(fx, vec![], "typing {text:?} has no effect yet");
    }
    assert_eq!(input_text(a), text);
    let fx = a.handle_key(enter());
    assert!(
        !matches!(a.overlay, Overlay::Command(_)),
        "Enter closes the command line"
    );
    fx
}

#[test]
fn command_retune() {
    let mut a = app(3);
    assert_eq!(
        command(&mut a, "retune concurrency=4"),
        vec![control(Control::Retune(Tune {
            rpm: None,
            tpm: None,
            concurrency: Some(4),
        }))]
    );
    assert_eq!(
        command(&mut a, "retune rpm=120 tpm=0"),
        vec![control(Control::Retune(Tune {
            rpm: Some(120),
            tpm: Some(0),
            concurrency: None,
        }))]
    );
}

#[test]
fn command_export() {
    let mut a = app(3);
    assert_eq!(
        command(&mut a, "export requests jsonl out.jsonl"),
        vec![Effect::Export {
            session: Some(SESSION.into()),
            what: "requests".into(),
            format: "jsonl".into(),
            path: "out.jsonl".into(),
        }]
    );
}

#[test]
fn command_runs_actions_by_name() {
    let mut a = app(3);
    assert_eq!(
        command(&mut a, "focus_review"),
        vec![Effect::Claim(Some(id_at(0)))]
    );
    assert_eq!(a.focus, Pane::Review);
    assert_eq!(command(&mut a, "pause"), vec![control(Control::Pause)]);
    assert_eq!(command(&mut a, "cancel"), vec![]);
    assert!(matches!(dialog(&a), Some(Dialog::CancelRun { .. })));
}

#[test]
fn command_session_watches_a_known_session() {
    let mut a = app(3);
    assert_eq!(
        command(&mut a, &format!("session {OTHER_SESSION}")),
        vec![Effect::Watch(Some(OTHER_SESSION.into()))]
    );
    assert_eq!(a.chosen_session.as_deref(), Some(OTHER_SESSION));
    assert_eq!(command(&mut a, "session nope"), vec![]);
    assert!(toast(&a).contains("nope"));
}

#[test]
fn tab_completes_the_command_word() {
    let mut a = app(3);
    a.handle_key(ch(':'));
    type_text(&mut a, "ret");
    assert_eq!(a.handle_key(key(KeyCode::Tab)), vec![]);
    assert_eq!(input_text(&a), "retune ");
    assert_eq!(a.mode(), Mode::Command, "Tab does not submit");
    type_text(&mut a, "conc");
    a.handle_key(key(KeyCode::Tab));
    assert_eq!(input_text(&a), "retune concurrency=");
    // Several fit: the options are listed.
    let mut a = app(3);
    a.handle_key(ch(':'));
    type_text(&mut a, "re");
    a.handle_key(key(KeyCode::Tab));
    assert!(
        toast(&a).contains("resume") && toast(&a).contains("retune"),
        "{:?}",
        a.toast
    );
}

#[test]
fn bad_command_toasts_the_error_and_does_nothing() {
    let mut a = app(3);
    assert_eq!(command(&mut a, "frobnicate now"), vec![]);
    assert!(toast(&a).contains("frobnicate"), "{:?}", a.toast);
    assert!(toast(&a).contains("unknown command"), "{:?}", a.toast);
    assert_eq!(command(&mut a, "retune concurrency=0"), vec![]);
    assert!(toast(&a).contains("concurrency"), "{:?}", a.toast);
    assert_eq!(a.quit, None);
}

#[test]
fn esc_abandons_the_command_line() {
    let mut a = app(3);
    a.handle_key(ch(':'));
    type_text(&mut a, "pause");
    assert_eq!(a.handle_key(esc()), vec![]);
    assert_eq!(a.mode(), Mode::Normal);
}

// ---------------------------------------------------------------- help, detail

#[test]
fn question_mark_toggles_help_and_esc_closes_it() {
    let mut a = app(3);
    a.handle_key(ch('?'));
    assert!(matches!(a.overlay, Overlay::Help { scroll: 0 }));
    // As if the last frame measured more help than fits.
    a.scroll_max.set(10);
    a.handle_key(ch('j'));
    assert!(
        matches!(a.overlay, Overlay::Help { scroll: 1 }),
        "j scrolls the help"
    );
    a.handle_key(ch('?'));
    assert_eq!(a.mode(), Mode::Normal);
    a.handle_key(key(KeyCode::F(1)));
    assert_eq!(a.mode(), Mode::Help);
    a.handle_key(esc());
    assert_eq!(a.mode(), Mode::Normal);
    assert_eq!(a.quit, None);
}

#[test]
fn enter_opens_the_detail_and_a_accepts_that_item() {
    let mut a = review_app(3);
    a.handle_key(ch('j'));
    assert_eq!(a.handle_key(enter()), vec![Effect::Detail(Some(id_at(1)))]);
    assert_eq!(a.mode(), Mode::Detail);
    // j/k scroll the detail (as far as the last frame measured), the
    // cursor stays.
    a.scroll_max.set(5);
    assert_eq!(a.handle_key(ch('j')), vec![]);
    assert!(matches!(a.overlay, Overlay::Detail { scroll: 1 }));
    a.handle_key(ch('G'));
    assert!(
        matches!(a.overlay, Overlay::Detail { scroll: 5 }),
        "G stops at the end"
    );
    assert_eq!(a.review_cursor, 1);
    // `a` decides this item and the detail moves on to the next at once.
    assert_eq!(
        a.handle_key(ch('a')),
        vec![
            Effect::Accept(vec![id_at(1)]),
            Effect::Claim(Some(id_at(2))),
            Effect::Detail(Some(id_at(2)))
        ]
    );
    assert!(matches!(a.overlay, Overlay::Detail { scroll: 0 }));
    // The item leaves the ledger's queue: the cursor stays on item 2.
    let mut next = page(3, 0, 3);
    next.rows.remove(1);
    next.total = 2;
    let fx = a.apply_snapshot(snapshot_with(next, Some(view("running", "running"))));
    assert_eq!(fx, vec![]);
    assert_eq!(a.cursor_row().map(|r| r.review_id), Some(id_at(2)));
    assert!(matches!(a.overlay, Overlay::Detail { scroll: 0 }));
    // Esc goes back to the list and lets the detail go.
    assert_eq!(a.handle_key(esc()), vec![Effect::Detail(None)]);
    assert_eq!(a.mode(), Mode::Normal);
}

#[test]
fn enter_on_an_empty_queue_opens_nothing() {
    let mut a = app(0);
    a.handle_key(ch('5'));
    assert_eq!(a.handle_key(enter()), vec![]);
    assert_eq!(a.mode(), Mode::Normal);
    assert_eq!(a.handle_key(ch('a')), vec![]);
}

// ---------------------------------------------------------------- read-only

#[test]
fn read_only_console_decides_and_controls_nothing() {
    let mut a = app_with(Keymap::default_map(), true, snapshot(5));
    let fx = a.handle_key(ch('5'));
    assert_eq!(fx, vec![], "no claim in read-only");
    for c in ['j', 'k', 'G', 'g', 's'] {
        let fx = a.handle_key(ch(c));
        assert!(
            !fx.iter().any(|e| matches!(e, Effect::Claim(_))),
            "{c}: {fx:?}"
        );
    }
    for c in ['a', 'r', 'u', 'p', 'c', 'S'] {
        a.toast = None;
        assert_eq!(a.handle_key(ch(c)), vec![], "{c}");
        assert!(dialog(&a).is_none(), "{c} opened a dialog");
        assert!(
            toast(&a).to_lowercase().contains("read-only"),
            "{c}: {:?}",
            a.toast
        );
    }
    // Marks do not turn into decisions either.
    a.handle_key(key(KeyCode::Char(' ')));
    assert_eq!(a.handle_key(ch('a')), vec![]);
    // Opening the detail still works (reading is fine) and claims nothing.
    assert_eq!(a.review_cursor, 2);
    assert_eq!(a.handle_key(enter()), vec![Effect::Detail(Some(id_at(2)))]);
    // The command line too.
    a.handle_key(esc());
    assert_eq!(command(&mut a, "retune concurrency=2"), vec![]);
    assert!(toast(&a).to_lowercase().contains("read-only"));
    // Quitting never asks: the run is not ours to stop.
    a.in_process_live = true;
    assert_eq!(
        a.handle_key(ch('q')),
        vec![Effect::Quit(QuitChoice::KeepHeadless)]
    );
}

// ---------------------------------------------------------------- sessions

#[test]
fn enter_on_a_session_watches_it() {
    let mut a = app(3);
    a.handle_key(ch('6'));
    assert_eq!(a.handle_key(ch('j')), vec![]);
    assert_eq!(a.sessions_cursor, 1);
    let fx = a.handle_key(enter());
    assert_eq!(fx, vec![Effect::Watch(Some(OTHER_SESSION.into()))]);
    assert_eq!(a.chosen_session.as_deref(), Some(OTHER_SESSION));
    assert!(toast(&a).contains(OTHER_SESSION));
    // The cursor stays inside the list.
    a.handle_key(ch('6'));
    a.handle_key(ch('G'));
    a.handle_key(ch('j'));
    assert_eq!(a.sessions_cursor, 2);
}

#[test]
fn events_pane_scrolls_within_its_events() {
    let mut snap = snapshot(3);
    snap.events = (0..4)
        .map(|i| Event {
            at: NOW - i as f64,
            level: Level::Info,
            kind: "x".into(),
            message: format!("event {i}"),
            item_id: None,
        })
        .collect();
    let mut a = app_with(Keymap::default_map(), false, snap);
    a.handle_key(ch('4'));
    for _ in 0..10 {
        assert_eq!(a.handle_key(ch('j')), vec![]);
    }
    assert_eq!(a.events_scroll, 3);
    a.handle_key(ch('g'));
    assert_eq!(a.events_scroll, 0);
}

// ---------------------------------------------------------------- keymap

#[test]
fn user_keymap_override_rebinds_accept() {
    let mut km = Keymap::default_map();
    let warnings = km.merge_str("[review]\naccept = [\"y\"]\n", "test");
    assert!(warnings.is_empty(), "{warnings:?}");
    let mut a = app_with(km, false, snapshot(3));
    a.handle_key(ch('5'));
    assert_eq!(a.handle_key(ch('a')), vec![], "a is no longer accept");
    assert_eq!(
        a.handle_key(ch('y')),
        vec![
            Effect::Accept(vec![id_at(0)]),
            Effect::Claim(Some(id_at(1)))
        ]
    );
    // The rest of the review section keeps its defaults.
    assert_eq!(
        a.handle_key(ch('r')),
        vec![
            Effect::Reject(vec![id_at(1)]),
            Effect::Claim(Some(id_at(2)))
        ]
    );
}

#[test]
fn key_release_is_ignored() {
    let mut a = review_app(3);
    let mut release = ch('a');
    release.kind = ratatui::crossterm::event::KeyEventKind::Release;
    assert_eq!(a.handle_key(release), vec![]);
}

/// With the help overlay open over the review queue, review keys still act
/// on the hidden queue: `a` accepts an item the operator cannot see.
#[test]
fn review_keys_do_nothing_under_the_help_overlay() {
    let mut a = review_app(3);
    a.handle_key(ch('?'));
    assert_eq!(a.mode(), Mode::Help);
    let fx = a.handle_key(ch('a'));
    assert!(
        !fx.iter().any(|e| matches!(e, Effect::Accept(_))),
        "accepted under the help overlay: {fx:?}"
    );
    a.handle_key(key(KeyCode::Char(' ')));
    assert!(a.marks.is_empty(), "marked under the help overlay");
}

/// Marks on items that left the queue are dropped, also when the queue
/// emptied completely.
#[test]
fn marks_are_dropped_when_the_queue_empties() {
    let mut a = review_app(3);
    a.handle_key(key(KeyCode::Char(' ')));
    a.handle_key(key(KeyCode::Char(' ')));
    assert_eq!(a.marks.len(), 2);
    // Another operator decided everything.
    a.apply_snapshot(snapshot_with(
        page(0, 0, 0),
        Some(view("running", "running")),
    ));
    assert!(a.marks.is_empty(), "stale marks: {:?}", a.marks);
    assert_eq!(a.handle_key(ch('a')), vec![]);
}

/// Marks stay when their rows are not in the loaded window (scrolled away,
/// or decided elsewhere: the bulk action then reports those as skipped).
#[test]
fn marks_survive_leaving_the_loaded_window() {
    let mut a = review_app(4);
    a.handle_key(key(KeyCode::Char(' ')));
    a.handle_key(key(KeyCode::Char(' ')));
    let mut next = page(4, 0, REVIEW_WINDOW);
    next.rows.remove(0);
    next.total = 3;
    a.apply_snapshot(snapshot_with(next, Some(view("running", "running"))));
    assert_eq!(
        a.marks.iter().copied().collect::<Vec<_>>(),
        vec![id_at(0), id_at(1)]
    );
    assert_eq!(
        a.handle_key(ch('a')),
        vec![Effect::Accept(vec![id_at(0), id_at(1)])]
    );
}

// ------------------------------------------------------- review findings

/// In the detail view, skip, mark and n/N move between items (j/k scroll).
#[test]
fn skip_mark_and_next_move_the_cursor_in_the_detail_view() {
    let mut a = review_app(4);
    a.handle_key(enter());
    assert_eq!(a.mode(), Mode::Detail);
    assert_eq!(
        a.handle_key(ch('s')),
        vec![
            Effect::Claim(Some(id_at(1))),
            Effect::Detail(Some(id_at(1)))
        ]
    );
    a.handle_key(key(KeyCode::Char(' ')));
    assert!(a.marks.contains(&id_at(1)));
    assert_eq!(a.review_cursor, 2);
    a.handle_key(ch('N'));
    assert_eq!(a.review_cursor, 1);
    a.handle_key(ch('n'));
    assert_eq!(a.review_cursor, 2);
    assert_eq!(a.mode(), Mode::Detail);
}

/// A session no engine runs: controls say what would run it instead of
/// writing a wish nothing obeys.
#[test]
fn controls_on_a_session_without_an_engine_point_to_resume() {
    let mut v = view("paused", "paused");
    v.live = false;
    v.shown = shown_of("paused", "paused", false, false);
    let mut a = app_with(
        Keymap::default_map(),
        false,
        snapshot_with(page(3, 0, 3), Some(v)),
    );
    assert_eq!(a.handle_key(ch('p')), vec![]);
    let t = toast(&a);
    assert!(t.contains("No engine runs"), "{t}");
    assert!(t.contains("--resume"), "{t}");
    assert_eq!(a.handle_key(ch('S')), vec![]);
}

/// The quit dialog's three ways out come from the keymap ([confirm]).
#[test]
fn quit_dialog_choices_can_be_rebound() {
    let mut km = Keymap::default_map();
    let warnings = km.merge_str("[confirm]\nquit_keep = [\"h\"]\n", "test");
    assert!(warnings.is_empty(), "{warnings:?}");
    let mut a = app_with(km, false, snapshot(3));
    a.in_process_live = true;
    a.handle_key(ch('q'));
    assert_eq!(dialog(&a), Some(Dialog::QuitLive));
    assert_eq!(a.handle_key(ch('k')), vec![], "k is no longer keep");
    assert_eq!(
        a.handle_key(ch('h')),
        vec![Effect::Quit(QuitChoice::KeepHeadless)]
    );
}

// ---------------------------------------------------------------- provider batches

#[test]
fn b_opens_the_batches_overlay_and_esc_closes_it() {
    let mut a = app(3);
    assert_eq!(
        a.keymap.keys_for(
            docket::tui::keymap::Section::Global,
            docket::tui::action::Action::Batches
        ),
        vec!["b"]
    );
    a.handle_key(ch('b'));
    assert!(
        matches!(a.overlay, Overlay::Batches { scroll: 0 }),
        "{:?}",
        a.overlay
    );
    assert_eq!(a.mode(), Mode::Batches);
    // j scrolls within what the last frame measured; nothing else moves.
    a.scroll_max.set(5);
    a.handle_key(ch('j'));
    a.handle_key(ch('j'));
    assert!(
        matches!(a.overlay, Overlay::Batches { scroll: 2 }),
        "{:?}",
        a.overlay
    );
    a.handle_key(ch('G'));
    assert!(
        matches!(a.overlay, Overlay::Batches { scroll: 5 }),
        "{:?}",
        a.overlay
    );
    assert_eq!(a.focus, Pane::Stages);
    a.handle_key(esc());
    assert!(matches!(a.overlay, Overlay::None), "{:?}", a.overlay);
    assert_eq!(a.mode(), Mode::Normal);
    // b again toggles it: open, then b closes.
    a.handle_key(ch('b'));
    a.handle_key(ch('b'));
    assert!(matches!(a.overlay, Overlay::None), "{:?}", a.overlay);
}

#[test]
fn review_keys_do_nothing_under_the_batches_overlay() {
    let mut a = review_app(3);
    a.handle_key(ch('b'));
    assert!(matches!(a.overlay, Overlay::Batches { .. }));
    // `a` would accept in the queue; over the overlay it is not the queue's.
    let fx = a.handle_key(ch('a'));
    assert!(!fx.iter().any(|e| matches!(e, Effect::Accept(_))), "{fx:?}");
    a.handle_key(esc());
    assert!(matches!(a.overlay, Overlay::None));
    assert_eq!(a.focus, Pane::Review);
}

#[test]
fn command_line_batches_opens_the_overlay() {
    let mut a = app(3);
    a.handle_key(ch(':'));
    type_text(&mut a, "batches");
    a.handle_key(enter());
    assert!(
        matches!(a.overlay, Overlay::Batches { scroll: 0 }),
        "{:?}",
        a.overlay
    );
    a.handle_key(esc());
    assert!(matches!(a.overlay, Overlay::None), "{:?}", a.overlay);
    // Completion knows the word.
    a.handle_key(ch(':'));
    type_text(&mut a, "batc");
    a.handle_key(key(KeyCode::Tab));
    assert_eq!(input_text(&a), "batches ");
}

#[test]
fn a_batch_countdown_makes_every_second_new_data() {
    let base = snapshot(3);
    let mut later = base.clone();
    later.now = NOW + 1.0;
    // Without batches a new second alone is the same data (nothing redraws).
    assert!(base.same_data(&later));
    let mut polling = base.clone();
    polling.batches = vec![docket::watch::ProviderBatchRow {
        state: "in_progress".into(),
        next_poll_at: Some(NOW + 30.0),
        ..Default::default()
    }];
    let mut polling_later = polling.clone();
    polling_later.now = NOW + 1.0;
    assert!(
        !polling.same_data(&polling_later),
        "`in 30s` becomes `in 29s`"
    );
    // A finished batch shows no countdown.
    let mut done = polling.clone();
    done.batches[0].state = "ingested".into();
    let mut done_later = done.clone();
    done_later.now = NOW + 1.0;
    assert!(done.same_data(&done_later));
}

// ---------------------------------------------------------------- workers

fn worker(id: &str, alive: bool, heartbeat_age_secs: f64) -> docket::ledger::console::WorkerRow {
    docket::ledger::console::WorkerRow {
        worker_id: id.into(),
        host: "build-01".into(),
        pid: 4242,
        claims: 40,
        sent: 1200,
        requests_per_sec: 12.5,
        orphaned: 0,
        heartbeat_age_secs,
        alive,
    }
}

#[test]
fn w_opens_the_workers_overlay_and_esc_closes_it() {
    let mut a = app(3);
    assert_eq!(
        a.keymap.keys_for(
            docket::tui::keymap::Section::Global,
            docket::tui::action::Action::Workers
        ),
        vec!["w"]
    );
    let fx = a.handle_key(ch('w'));
    assert!(
        matches!(a.overlay, Overlay::Workers { scroll: 0 }),
        "{:?}",
        a.overlay
    );
    assert_eq!(a.mode(), Mode::Workers);
    assert!(
        !fx.iter().any(|e| matches!(e, Effect::Claim(Some(_)))),
        "opening it claims nothing: {fx:?}"
    );
    // j scrolls within what the last frame measured; the panes do not move.
    a.scroll_max.set(3);
    a.handle_key(ch('j'));
    assert!(
        matches!(a.overlay, Overlay::Workers { scroll: 1 }),
        "{:?}",
        a.overlay
    );
    a.handle_key(ch('G'));
    assert!(
        matches!(a.overlay, Overlay::Workers { scroll: 3 }),
        "{:?}",
        a.overlay
    );
    assert_eq!(a.focus, Pane::Stages);
    a.handle_key(esc());
    assert!(matches!(a.overlay, Overlay::None), "{:?}", a.overlay);
    assert_eq!(a.mode(), Mode::Normal);
    // w toggles it; b over it swaps to the batches.
    a.handle_key(ch('w'));
    a.handle_key(ch('w'));
    assert!(matches!(a.overlay, Overlay::None), "{:?}", a.overlay);
    a.handle_key(ch('w'));
    a.handle_key(ch('b'));
    assert!(
        matches!(a.overlay, Overlay::Batches { .. }),
        "{:?}",
        a.overlay
    );
}

#[test]
fn review_keys_do_nothing_under_the_workers_overlay() {
    let mut a = review_app(3);
    a.handle_key(ch('w'));
    assert!(matches!(a.overlay, Overlay::Workers { .. }));
    let fx = a.handle_key(ch('a'));
    assert!(!fx.iter().any(|e| matches!(e, Effect::Accept(_))), "{fx:?}");
    a.handle_key(esc());
    assert!(matches!(a.overlay, Overlay::None));
    assert_eq!(a.focus, Pane::Review);
}

#[test]
fn command_line_workers_opens_the_overlay() {
    let mut a = app(3);
    a.handle_key(ch(':'));
    type_text(&mut a, "workers");
    a.handle_key(enter());
    assert!(
        matches!(a.overlay, Overlay::Workers { scroll: 0 }),
        "{:?}",
        a.overlay
    );
    a.handle_key(esc());
    assert!(matches!(a.overlay, Overlay::None), "{:?}", a.overlay);
}

#[test]
fn a_worker_age_is_new_data_only_when_its_drawn_age_changes() {
    let mut base = snapshot(3);
    base.workers = vec![worker("alice@build-01:1#a", false, 125.0)];
    // 2m 5s and 2m 40s both draw as `2m`: nothing to redraw.
    let mut later = base.clone();
    later.now = NOW + 35.0;
    later.workers[0].heartbeat_age_secs = 160.0;
    assert!(base.same_data(&later));
    // `3m` is.
    later.workers[0].heartbeat_age_secs = 185.0;
    assert!(!base.same_data(&later));
    // A live worker's age is always a second or two: not news by itself.
    let mut live = base.clone();
    live.workers[0].alive = true;
    live.workers[0].heartbeat_age_secs = 0.3;
    let mut live_later = live.clone();
    live_later.workers[0].heartbeat_age_secs = 1.4;
    assert!(live.same_data(&live_later));
    // Going from alive to gone is, and so is a new worker joining.
    assert!(!base.same_data(&live));
    let mut joined = base.clone();
    joined.workers.push(worker("bob@build-02:2#b", true, 0.4));
    assert!(!base.same_data(&joined));
}

// ---------------------------------------------------------------- issue 16: text you can read

fn event(i: usize, message: &str) -> Event {
    Event {
        at: NOW - i as f64,
        level: Level::Warn,
        kind: "attempt_failed".into(),
        message: message.into(),
        item_id: Some(format!("item-{i:04}")),
    }
}

/// Enter on the events pane opens the selected event in full (a copy: the
/// pane's list moves on underneath); j/k scroll it; Esc closes it.
#[test]
fn enter_on_the_events_pane_opens_the_selected_event() {
    let mut snap = snapshot(3);
    let long = format!(
        "item item-0001 attempt 1: http 503 {}",
        "upstream busy ".repeat(30)
    );
    snap.events = vec![event(0, "first"), event(1, &long), event(2, "third")];
    let mut a = app_with(Keymap::default_map(), false, snap.clone());
    a.handle_key(ch('4'));
    a.handle_key(ch('j'));
    assert_eq!(a.handle_key(enter()), vec![]);
    assert_eq!(a.mode(), Mode::Event);
    match &a.overlay {
        Overlay::Event { event, scroll } => {
            assert_eq!(event.message, long);
            assert_eq!(*scroll, 0);
        }
        other => panic!("no event open: {other:?}"),
    }
    // New events arrive: the open one stays what it was.
    snap.events.insert(0, event(9, "newer"));
    a.apply_snapshot(snap);
    assert!(matches!(&a.overlay, Overlay::Event { event, .. } if event.message == long));
    // Review keys do nothing here.
    assert_eq!(a.handle_key(ch('a')), vec![]);
    a.handle_key(esc());
    assert_eq!(a.mode(), Mode::Normal);
    assert_eq!(a.focus, Pane::Events);
    assert_eq!(a.quit, None);
}

/// `/` filters the focused pane: the events pane and the sessions pane
/// filter their own lists (no ledger query, focus stays); anywhere else it
/// searches the review queue. Esc clears the focused pane's filter.
#[test]
fn slash_filters_the_focused_pane() {
    let mut snap = snapshot(3);
    snap.events = vec![
        event(0, "item item-0000 attempt 1: http 429"),
        event(1, "stage triage started"),
        event(2, "item item-0002 attempt 2: http 429"),
    ];
    let mut a = app_with(Keymap::default_map(), false, snap);
    a.handle_key(ch('4'));
    a.handle_key(ch('G'));
    assert_eq!(a.events_scroll, 2);
    assert_eq!(a.handle_key(ch('/')), vec![]);
    assert_eq!(a.mode(), Mode::Filter);
    assert_eq!(a.focus, Pane::Events, "the filter stays on the events pane");
    for fx in type_text(&mut a, "HTTP 429") {
        assert_eq!(fx, vec![], "an events filter asks the ledger nothing");
    }
    a.handle_key(enter());
    assert_eq!(a.events_filter.as_deref(), Some("HTTP 429"));
    assert_eq!(a.filter, None, "the review queue's filter is untouched");
    let shown: Vec<&str> = a
        .visible_events()
        .iter()
        .map(|e| e.message.as_str())
        .collect();
    assert_eq!(
        shown,
        vec![
            "item item-0000 attempt 1: http 429",
            "item item-0002 attempt 2: http 429"
        ]
    );
    assert_eq!(a.events_scroll, 0, "a new filter starts at the top");
    a.handle_key(ch('j'));
    a.handle_key(ch('j'));
    assert_eq!(
        a.events_scroll, 1,
        "the cursor stays inside the filtered list"
    );
    a.handle_key(enter());
    assert!(
        matches!(&a.overlay, Overlay::Event { event, .. } if event.message.contains("item-0002"))
    );
    a.handle_key(esc());
    assert_eq!(a.handle_key(esc()), vec![]);
    assert_eq!(a.events_filter, None, "Esc clears the events filter");

    // The sessions pane: Enter watches the filtered list's session.
    a.handle_key(ch('6'));
    a.handle_key(ch('/'));
    type_text(&mut a, "complete");
    a.handle_key(enter());
    assert_eq!(a.visible_sessions().len(), 1);
    assert_eq!(
        a.handle_key(enter()),
        vec![Effect::Watch(Some(OTHER_SESSION.into()))]
    );

    // From the stages pane, `/` is still the review queue's search.
    let mut a = app(3);
    a.handle_key(ch('/'));
    assert_eq!(a.focus, Pane::Review);
    assert_eq!(type_text(&mut a, "x"), vec![vec![query(Some("x"), 0)]]);
}

/// After `u` the cursor goes to the item the undo made pending again, as
/// soon as a read shows it back in the queue.
#[test]
fn the_cursor_returns_to_the_item_an_undo_restored() {
    let mut a = review_app(6);
    a.handle_key(ch('j'));
    a.handle_key(ch('j'));
    let fx = a.handle_key(ch('a'));
    assert!(fx.contains(&Effect::Accept(vec![id_at(2)])), "{fx:?}");
    // The ledger's answer: item 2 left the queue; the cursor is on item 3.
    let mut gone = page(6, 0, 6);
    gone.rows.remove(2);
    gone.total = 5;
    a.apply_snapshot(snapshot_with(gone, Some(view("running", "running"))));
    assert_eq!(a.cursor_row().map(|r| r.review_id), Some(id_at(3)));
    assert_eq!(a.handle_key(ch('u')), vec![Effect::Undo]);
    // The worker says what came back, then the next read has it again.
    assert_eq!(a.undone(vec![id_at(2)]), vec![]);
    let fx = a.apply_snapshot(snapshot_with(
        page(6, 0, 6),
        Some(view("running", "running")),
    ));
    assert_eq!(a.review_cursor, 2);
    assert_eq!(a.cursor_row().map(|r| r.review_id), Some(id_at(2)));
    assert!(fx.contains(&Effect::Claim(Some(id_at(2)))), "{fx:?}");
    // Later reads keep it there (the restore was used up).
    a.handle_key(ch('j'));
    a.apply_snapshot(snapshot_with(
        page(6, 0, 6),
        Some(view("running", "running")),
    ));
    assert_eq!(a.review_cursor, 3);
}

/// Marking everything says how many once (the footer badge and the queue
/// title), not again in a message.
#[test]
fn mark_all_is_counted_once() {
    let mut a = review_app(7);
    a.handle_key(ch('V'));
    assert_eq!(a.marks.len(), 7);
    assert_eq!(a.toast, None);
}
