//! Review cards people can read: insta snapshots of the detail view with
//! the evidence and answer as fields (the chosen candidate marked, the
//! fields where it differs from the item named), with the job's `[review]`
//! card template, and the queue's `[review]` summary line (mono theme).

use std::sync::Arc;

use docket::review_card::ReviewTemplates;
use docket::tui::app::{App, Overlay, Pane, Snapshot};
use docket::tui::keymap::Keymap;
use docket::tui::theme::Theme;
use docket::watch::{ReviewDetail, ReviewPage, ReviewRow};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;

const SIZES: [(u16, u16); 2] = [(80, 24), (120, 40)];

/// A demo chart entry: the answer picks the second candidate (a remaster,
/// whose title differs from the entry's).
fn evidence() -> serde_json::Value {
    serde_json::json!({
        "chart": "UK Singles", "week": "1991-03-02", "position": 7,
        "artist": "Blur", "title": "There's No Other Way",
        "candidates": [
            {"crg_mbid": "a1", "title": "There's No Other Way", "artist": "Blur", "type": "Single", "first_release": 1991},
            {"crg_mbid": "b2", "title": "There's No Other Way (Remastered)", "artist": "Blur", "type": "Album", "first_release": 1994},
        ],
    })
}

fn answer() -> serde_json::Value {
    serde_json::json!({"crg_mbid": "b2", "rr_mbid": "r9", "confidence": 0.72, "rationale": "the remaster"})
}

fn detail() -> ReviewDetail {
    ReviewDetail {
        review_id: 100,
        item_id: "chart-000001".into(),
        session_id: Some("batch_20231114_221000".into()),
        status: "pending".into(),
        evidence_json: serde_json::to_string_pretty(&evidence()).unwrap(),
        suggestion_json: answer().to_string(),
        confidence: Some(0.72),
        rationale: Some("the remaster".into()),
        model_id: Some("mock-1".into()),
        ..ReviewDetail::default()
    }
}

fn row() -> ReviewRow {
    ReviewRow {
        review_id: 100,
        item_id: "chart-000001".into(),
        session_id: Some("batch_20231114_221000".into()),
        confidence: Some(0.72),
        suggestion: answer().to_string(),
        rationale: Some("the remaster".into()),
        model_id: Some("mock-1".into()),
        claimed_by: None,
        audit: false,
        stale: false,
        evidence: evidence().to_string(),
    }
}

fn app(templates: Option<&str>) -> App {
    let mut app = App::new(Keymap::default_map(), false);
    app.apply_snapshot(Snapshot {
        review: ReviewPage {
            total: 1,
            offset: 0,
            rows: vec![row()],
            several_sessions: false,
        },
        detail: Some(detail()),
        now: 1_700_000_000.0,
        ..Snapshot::default()
    });
    if let Some(t) = templates {
        let cfg: docket::config::ReviewConfig = toml::from_str(t).unwrap();
        app.review_templates = Some(Arc::new(ReviewTemplates::compile(&cfg).unwrap()));
    }
    app
}

fn render(app: &App, w: u16, h: u16) -> Terminal<TestBackend> {
    let mut terminal = Terminal::new(TestBackend::new(w, h)).expect("terminal");
    terminal
        .draw(|frame| docket::tui::view::draw(frame, app, Theme::mono()))
        .expect("draw");
    terminal
}

fn screen_text(buf: &Buffer) -> String {
    (0..buf.area.height)
        .map(|y| {
            (0..buf.area.width)
                .map(|x| buf[(x, y)].symbol().to_string())
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

const TEMPLATES: &str = r#"
summary = "{{ artist }} – {{ title }} · {{ chart }}, {{ week }}, {{ position }}"
card = """
{{ artist }} – {{ title }}
{{ chart }} · week {{ week }} · #{{ position }}
picked: {{ chosen.title }} ({{ chosen.type }}, {{ chosen.first_release }})
"""
"#;

#[test]
fn the_default_card_shows_fields_and_marks_the_chosen_candidate() {
    let mut a = app(None);
    a.overlay = Overlay::Detail { scroll: 0 };
    for (w, h) in SIZES {
        let t = render(&a, w, h);
        let text = screen_text(t.backend().buffer());
        assert!(!text.contains('{'), "no JSON braces on the card:\n{text}");
        assert!(
            text.contains("▶"),
            "the chosen candidate is marked:\n{text}"
        );
        insta::assert_snapshot!(format!("default_card_{w}x{h}"), t.backend());
    }
    // Scrolled to its end at 80x24: the chosen candidate's differences.
    a.overlay = Overlay::Detail { scroll: 20 };
    let t = render(&a, 80, 24);
    let text = screen_text(t.backend().buffer());
    assert!(text.contains("title differs"), "{text}");
}

#[test]
fn a_templated_card_with_a_chosen_candidate_and_its_differing_fields() {
    let mut a = app(Some(TEMPLATES));
    a.overlay = Overlay::Detail { scroll: 0 };
    let t = render(&a, 120, 40);
    let text = screen_text(t.backend().buffer());
    assert!(
        text.contains("picked: There's No Other Way (Remastered) (Album, 1994)"),
        "{text}"
    );
    assert!(text.contains("Blur – There's No Other Way · UK Singles, 1991-03-02, 7"));
    assert!(text.contains("* title differs"), "{text}");
    insta::assert_snapshot!("templated_card_120x40", t.backend());
}

#[test]
fn the_queue_row_shows_the_summary_template_or_a_named_error() {
    let mut a = app(Some(TEMPLATES));
    a.focus = Pane::Review;
    let text = screen_text(render(&a, 120, 40).backend().buffer());
    assert!(
        text.contains("›  0.72 chart-000001 Blur – There's No Other Way · UK Singles, 1991-…"),
        "{text}"
    );
    let mut a = app(Some("summary = \"{{ label }}\""));
    a.focus = Pane::Review;
    let text = screen_text(render(&a, 160, 40).backend().buffer());
    assert!(
        text.contains("review.summary: line 1: undefined variable \"label\""),
        "{text}"
    );
}

/// An item whose evidence `docket import --update` replaced: its queue row
/// and its card say "stale", at 80 columns too; a fresh one says nothing.
#[test]
fn a_stale_suggestion_is_marked_in_the_queue_and_on_the_card() {
    let stale_app = |stale: bool| {
        let mut a = app(Some(TEMPLATES));
        a.apply_snapshot(Snapshot {
            review: ReviewPage {
                total: 1,
                offset: 0,
                rows: vec![ReviewRow { stale, ..row() }],
                several_sessions: false,
            },
            detail: Some(ReviewDetail { stale, ..detail() }),
            now: 1_700_000_000.0,
            ..Snapshot::default()
        });
        a
    };
    for (w, h) in SIZES {
        let mut a = stale_app(true);
        a.focus = Pane::Review;
        let queue = screen_text(render(&a, w, h).backend().buffer());
        let row_line = queue
            .lines()
            .find(|l| l.contains("chart-000001"))
            .unwrap_or_else(|| panic!("no queue row at {w}x{h}:\n{queue}"));
        assert!(row_line.contains("stale"), "{w}x{h}: {row_line}");
        a.overlay = Overlay::Detail { scroll: 0 };
        let card = screen_text(render(&a, w, h).backend().buffer());
        assert!(
            card.contains("stale: made on evidence replaced since"),
            "{w}x{h}:\n{card}"
        );
        let mut fresh = stale_app(false);
        fresh.focus = Pane::Review;
        let queue = screen_text(render(&fresh, w, h).backend().buffer());
        assert!(!queue.contains("stale"), "{w}x{h}:\n{queue}");
        fresh.overlay = Overlay::Detail { scroll: 0 };
        let card = screen_text(render(&fresh, w, h).backend().buffer());
        assert!(!card.contains("stale"), "{w}x{h}:\n{card}");
    }
}

fn press(a: &mut App, code: ratatui::crossterm::event::KeyCode) -> Vec<docket::tui::app::Effect> {
    use ratatui::crossterm::event::{KeyEvent, KeyModifiers};
    a.handle_key(KeyEvent::new(code, KeyModifiers::NONE))
}

/// `e` on the card opens the correction form; ←→ on its first row picks
/// another candidate (whose naming fields fill the answer), ↓ and typing
/// edit a field, Enter accepts the corrected answer.
#[test]
fn the_correction_form_picks_another_candidate_and_edits_a_field() {
    use docket::tui::app::Effect;
    use ratatui::crossterm::event::KeyCode;
    let mut a = app(None);
    a.focus = Pane::Review;
    a.overlay = Overlay::Detail { scroll: 0 };
    assert!(press(&mut a, KeyCode::Char('e')).is_empty());
    assert!(matches!(a.overlay, Overlay::Correct(_)), "{:?}", a.overlay);
    // The answer picked candidate 2; → wraps to candidate 1.
    press(&mut a, KeyCode::Right);
    // Down to the second field (rr_mbid), cleared and typed anew.
    press(&mut a, KeyCode::Down);
    press(&mut a, KeyCode::Down);
    for _ in 0..2 {
        press(&mut a, KeyCode::Backspace);
    }
    for c in "r1".chars() {
        press(&mut a, KeyCode::Char(c));
    }
    for (w, h) in SIZES {
        let t = render(&a, w, h);
        let text = screen_text(t.backend().buffer());
        assert!(text.contains("candidate 1/2"), "{text}");
        insta::assert_snapshot!(format!("correction_form_{w}x{h}"), t.backend());
    }
    let fx = press(&mut a, KeyCode::Enter);
    let answer = fx
        .iter()
        .find_map(|f| match f {
            Effect::Correct {
                review_id: 100,
                answer,
            } => Some(answer.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no correction in {fx:?}"));
    assert_eq!(
        answer,
        serde_json::json!({"crg_mbid": "a1", "rr_mbid": "r1", "confidence": 0.72, "rationale": "the remaster"})
    );
    assert!(matches!(a.overlay, Overlay::None));
}

/// A field that was a number must stay one: "0.72x" keeps the form open
/// on that field with a toast naming it, and nothing is sent; fixed, the
/// number goes as a number.
#[test]
fn the_correction_form_refuses_a_number_field_that_is_not_a_number() {
    use docket::tui::app::Effect;
    use ratatui::crossterm::event::KeyCode;
    let mut a = app(None);
    a.focus = Pane::Review;
    a.overlay = Overlay::Detail { scroll: 0 };
    press(&mut a, KeyCode::Char('e'));
    // Rows: candidates, crg_mbid, rr_mbid, confidence.
    for _ in 0..3 {
        press(&mut a, KeyCode::Down);
    }
    press(&mut a, KeyCode::End);
    press(&mut a, KeyCode::Char('x'));
    // Away from the field and back: Enter must bring the cursor to it.
    press(&mut a, KeyCode::Up);
    let fx = press(&mut a, KeyCode::Enter);
    assert!(
        !fx.iter().any(|f| matches!(f, Effect::Correct { .. })),
        "{fx:?}"
    );
    let toast = a.toast.clone().unwrap_or_default();
    assert!(
        toast.contains("confidence") && toast.contains("not a number"),
        "{toast}"
    );
    let Overlay::Correct(form) = &a.overlay else {
        panic!("the form stays open: {:?}", a.overlay);
    };
    assert_eq!(form.row, 3, "the cursor is on the field to fix");
    press(&mut a, KeyCode::Backspace);
    let fx = press(&mut a, KeyCode::Enter);
    let answer = fx
        .iter()
        .find_map(|f| match f {
            Effect::Correct { answer, .. } => Some(answer.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no correction in {fx:?}"));
    assert_eq!(answer["confidence"], serde_json::json!(0.72));
}

/// Esc leaves the form with nothing sent; a read-only console never opens it.
#[test]
fn the_correction_form_closes_unsent_and_is_off_when_read_only() {
    use ratatui::crossterm::event::KeyCode;
    let mut a = app(None);
    a.focus = Pane::Review;
    press(&mut a, KeyCode::Char('e'));
    assert!(matches!(a.overlay, Overlay::Correct(_)));
    assert!(press(&mut a, KeyCode::Esc).is_empty());
    assert!(matches!(a.overlay, Overlay::Detail { .. }));
    let mut ro = App::new(Keymap::default_map(), true);
    ro.apply_snapshot(Snapshot {
        review: ReviewPage {
            total: 1,
            offset: 0,
            rows: vec![row()],
            several_sessions: false,
        },
        detail: Some(detail()),
        ..Snapshot::default()
    });
    ro.focus = Pane::Review;
    press(&mut ro, KeyCode::Char('e'));
    assert!(!matches!(ro.overlay, Overlay::Correct(_)));
}
