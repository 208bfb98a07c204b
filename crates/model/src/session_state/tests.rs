//! Every combination of stored state, wish, stop-after-stage and engine.

use super::*;

const STORED: [&str; 6] = [
    "running",
    "paused",
    "completed",
    "cancelled",
    "error",
    "mystery",
];
const DESIRED: [&str; 3] = ["running", "paused", "cancelled"];
const ENGINES: [Engine; 3] = [Engine::Live, Engine::Gone, Engine::Released];

/// The expected word for one combination, written out as a table would say
/// it rather than as the function computes it.
fn expected(stored: &str, desired: &str, stop: bool, engine: Engine) -> ShownState {
    use ShownState::*;
    match (stored, engine) {
        ("completed", _) => Completed,
        ("cancelled", _) => Cancelled,
        ("error", _) => Failed,
        ("running" | "paused", Engine::Gone) => Interrupted,
        ("running", Engine::Released) => Interrupted,
        ("paused", Engine::Released) => Paused,
        ("running", Engine::Live) => match (desired, stop) {
            ("cancelled", _) => Cancelling,
            ("paused", _) => Pausing,
            (_, true) => StoppingAtStage,
            _ => Running,
        },
        ("paused", Engine::Live) if desired == "cancelled" => Cancelling,
        ("paused", Engine::Live) => Paused,
        _ => Unknown,
    }
}

#[test]
fn every_combination_has_its_word() {
    let mut seen = std::collections::HashSet::new();
    for stored in STORED {
        for desired in DESIRED {
            for stop in [false, true] {
                for engine in ENGINES {
                    let got = shown_state(StateFacts {
                        stored,
                        desired,
                        stop_after_stage: stop,
                        engine,
                    });
                    assert_eq!(
                        got,
                        expected(stored, desired, stop, engine),
                        "{stored} / asked {desired} / stop {stop} / {engine:?}"
                    );
                    seen.insert(got);
                }
            }
        }
    }
    assert_eq!(seen.len(), ALL_STATES.len(), "every word is reachable");
}

#[test]
fn the_reported_cases() {
    let facts = |stored, desired, stop_after_stage, engine| StateFacts {
        stored,
        desired,
        stop_after_stage,
        engine,
    };
    // kill -9: the engine's heartbeat goes stale with `running` left behind.
    let killed = shown_state(facts("running", "running", false, Engine::Gone));
    assert_eq!(killed.word(), "interrupted");
    // `S` finished its stage: paused, let go, a resume asked by nobody.
    let stopped = shown_state(facts("paused", "running", true, Engine::Released));
    assert_eq!(stopped.word(), "paused");
    // `p` pressed, the engine not yet obeying.
    let asked = shown_state(facts("running", "paused", false, Engine::Live));
    assert_eq!(asked.word(), "pausing");
    assert_eq!(
        shown_state(facts("running", "running", true, Engine::Live)).word(),
        "stopping at stage"
    );
}

#[test]
fn words_are_distinct_and_fit_the_longest() {
    let words: std::collections::HashSet<_> = ALL_STATES.iter().map(|s| s.word()).collect();
    assert_eq!(words.len(), ALL_STATES.len());
    let longest = ALL_STATES.iter().map(|s| s.word().chars().count()).max();
    assert_eq!(longest, Some(LONGEST_WORD));
    for s in ALL_STATES {
        assert_eq!(s.glyph().chars().count(), 1, "{s:?}");
    }
}

#[test]
fn heartbeats_name_the_engine() {
    assert_eq!(Engine::from_heartbeat(None, 100.0, 5.0), Engine::Released);
    assert_eq!(Engine::from_heartbeat(Some(96.0), 100.0, 5.0), Engine::Live);
    assert_eq!(Engine::from_heartbeat(Some(95.0), 100.0, 5.0), Engine::Live);
    assert_eq!(Engine::from_heartbeat(Some(94.9), 100.0, 5.0), Engine::Gone);
}

#[test]
fn stage_rows_carry_the_sessions_word() {
    use ShownState::*;
    for session in ALL_STATES {
        assert_eq!(stage_word("done", session), "done");
        assert_eq!(stage_word("running", session), session.word());
        let pending = stage_word("pending", session);
        if session.is_active() {
            assert_eq!(pending, "pending", "{session:?}");
        } else {
            assert_eq!(pending, session.word(), "{session:?}");
        }
    }
    assert_eq!(stage_word("running", Paused), "paused");
    assert_eq!(stage_word("running", Cancelled), "cancelled");
    assert_eq!(stage_word("running", Interrupted), "interrupted");
}
