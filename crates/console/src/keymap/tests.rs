use super::*;
use ratatui::crossterm::event::{KeyCode, KeyModifiers};

fn ev(code: KeyCode, mods: KeyModifiers) -> KeyEvent {
    KeyEvent::new(code, mods)
}

fn ch(c: char) -> KeyEvent {
    ev(KeyCode::Char(c), KeyModifiers::NONE)
}

fn kp(spec: &str) -> Vec<KeyPress> {
    parse_sequence(spec).unwrap()
}

fn merged(src: &str) -> (Keymap, Vec<String>) {
    let mut map = Keymap::default_map();
    let w = map.merge_str(src, "keymap.toml");
    (map, w)
}

fn resolve1(map: &Keymap, sections: &[Section], key: KeyEvent) -> KeyMatch {
    map.resolve(sections, &mut Vec::new(), key)
}

#[test]
fn default_parses_without_warnings() {
    let (map, warnings) = Keymap::from_toml_str(DEFAULT_KEYMAP, "keymap.toml");
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(map, Keymap::default_map());
    assert_eq!(map.keys_for(Section::Review, Action::Accept), vec!["a"]);
    assert_eq!(
        map.first_key(Section::Review, Action::Accept).as_deref(),
        Some("a")
    );
    assert_eq!(map.keys_for(Section::Global, Action::Help), vec!["?", "f1"]);
    assert_eq!(
        map.keys_for(Section::Global, Action::PageDown),
        vec!["pgdn", "ctrl-d"]
    );
    assert_eq!(
        map.keys_for(Section::Confirm, Action::ConfirmNo),
        vec!["n", "esc"]
    );
    assert_eq!(map.first_key(Section::Global, Action::Accept), None);
}

#[test]
fn every_action_is_bound_somewhere() {
    let map = Keymap::default_map();
    for &a in Action::ALL {
        let bound = Section::ALL.iter().any(|&s| !map.keys_for(s, a).is_empty());
        assert!(bound, "{a} has no default key");
    }
    assert_eq!(map.help_entries().len(), Action::ALL.len());
}

#[test]
fn shift_is_ignored_for_chars() {
    let map = Keymap::default_map();
    let g = [Section::Global];
    let shifted_g = ev(KeyCode::Char('G'), KeyModifiers::SHIFT);
    assert_eq!(
        resolve1(&map, &g, shifted_g),
        KeyMatch::Action(Action::Bottom)
    );
    assert_eq!(
        resolve1(&map, &g, ev(KeyCode::Char('G'), KeyModifiers::NONE)),
        KeyMatch::Action(Action::Bottom)
    );
    assert_eq!(
        resolve1(&map, &g, ev(KeyCode::Char('?'), KeyModifiers::SHIFT)),
        KeyMatch::Action(Action::Help)
    );
    assert_eq!(resolve1(&map, &g, ch('g')), KeyMatch::Action(Action::Top));
    assert_eq!(
        resolve1(&map, &g, ev(KeyCode::BackTab, KeyModifiers::SHIFT)),
        KeyMatch::Action(Action::FocusPrev)
    );
    assert_eq!(
        resolve1(&map, &g, ev(KeyCode::Tab, KeyModifiers::SHIFT)),
        KeyMatch::Action(Action::FocusPrev)
    );
    // Shift on a named key is significant.
    assert_eq!(
        resolve1(&map, &g, ev(KeyCode::Up, KeyModifiers::SHIFT)),
        KeyMatch::Unbound
    );
}

#[test]
fn ctrl_c_and_modifiers_match() {
    let map = Keymap::default_map();
    let g = [Section::Global];
    assert_eq!(
        resolve1(&map, &g, ev(KeyCode::Char('c'), KeyModifiers::CONTROL)),
        KeyMatch::Action(Action::ForceQuit)
    );
    assert_eq!(
        resolve1(&map, &g, ch('c')),
        KeyMatch::Action(Action::CancelRun)
    );
    assert_eq!(
        resolve1(&map, &g, ev(KeyCode::Char('c'), KeyModifiers::ALT)),
        KeyMatch::Unbound
    );
    assert_eq!(
        resolve1(
            &map,
            &[Section::Review],
            ev(KeyCode::Char(' '), KeyModifiers::NONE)
        ),
        KeyMatch::Action(Action::ToggleMark)
    );
}

#[test]
fn release_events_are_ignored() {
    let map = Keymap::default_map();
    let mut release = ch('q');
    release.kind = KeyEventKind::Release;
    let mut pending = kp("x");
    assert_eq!(
        map.resolve(&[Section::Global], &mut pending, release),
        KeyMatch::Unbound
    );
    assert_eq!(pending, kp("x"));
}

#[test]
fn section_priority_review_shadows_global() {
    let (map, w) = merged("[review]\nquit = [\"c\"]\n");
    assert!(w.is_empty(), "{w:?}");
    let rg = [Section::Review, Section::Global];
    assert_eq!(resolve1(&map, &rg, ch('c')), KeyMatch::Action(Action::Quit));
    assert_eq!(
        resolve1(&map, &[Section::Global], ch('c')),
        KeyMatch::Action(Action::CancelRun)
    );
    assert_eq!(
        resolve1(&map, &rg, ch('a')),
        KeyMatch::Action(Action::Accept)
    );
    assert_eq!(resolve1(&map, &rg, ch('j')), KeyMatch::Action(Action::Down));
    assert_eq!(
        resolve1(&map, &[Section::Global], ch('a')),
        KeyMatch::Unbound
    );
}

#[test]
fn sequence_override_waits_then_fires() {
    let (map, w) = merged("[global]\ntop = [\"g g\", \"home\"]\n");
    assert!(w.is_empty(), "{w:?}");
    let g = [Section::Global];
    let mut pending = Vec::new();
    assert_eq!(map.resolve(&g, &mut pending, ch('g')), KeyMatch::Pending);
    assert_eq!(pending, kp("g"));
    assert_eq!(
        map.resolve(&g, &mut pending, ch('g')),
        KeyMatch::Action(Action::Top)
    );
    assert!(pending.is_empty());
    // A pending prefix followed by a non-continuing bound key: drop the prefix, fire the key.
    assert_eq!(map.resolve(&g, &mut pending, ch('g')), KeyMatch::Pending);
    assert_eq!(
        map.resolve(&g, &mut pending, ch('j')),
        KeyMatch::Action(Action::Down)
    );
    assert!(pending.is_empty());
    // ...or an unbound key: nothing, and nothing left pending.
    assert_eq!(map.resolve(&g, &mut pending, ch('g')), KeyMatch::Pending);
    assert_eq!(map.resolve(&g, &mut pending, ch('x')), KeyMatch::Unbound);
    assert!(pending.is_empty());
    assert_eq!(
        map.keys_for(Section::Global, Action::Top),
        vec!["g g", "home"]
    );
}

#[test]
fn unbound_first_key_then_bound_key_resolves_second() {
    let map = Keymap::default_map();
    let g = [Section::Global];
    let mut pending = Vec::new();
    assert_eq!(map.resolve(&g, &mut pending, ch('x')), KeyMatch::Unbound);
    assert!(pending.is_empty());
    assert_eq!(
        map.resolve(&g, &mut pending, ch('q')),
        KeyMatch::Action(Action::Quit)
    );
    // A stale pending key that leads nowhere is dropped and the new key tried alone.
    let mut pending = kp("x");
    assert_eq!(
        map.resolve(&g, &mut pending, ch('k')),
        KeyMatch::Action(Action::Up)
    );
    assert!(pending.is_empty());
}

#[test]
fn override_replaces_only_that_action() {
    let (map, w) = merged("[review]\naccept = [\"y\", \"enter\"]\n");
    assert!(w.is_empty(), "{w:?}");
    let default = Keymap::default_map();
    assert_eq!(
        map.keys_for(Section::Review, Action::Accept),
        vec!["y", "enter"]
    );
    for section in Section::ALL {
        for &a in Action::ALL {
            if (section, a) != (Section::Review, Action::Accept) {
                assert_eq!(
                    map.keys_for(section, a),
                    default.keys_for(section, a),
                    "{section}.{a}"
                );
            }
        }
    }
    assert_eq!(
        resolve1(&map, &[Section::Review, Section::Global], ch('a')),
        KeyMatch::Unbound
    );
}

#[test]
fn unknown_action_warns_with_line() {
    let src = "# mine\n\n[review]\nreject = [\"x\"]\nacept = [\"z\"]\n";
    let (map, w) = merged(src);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].starts_with("keymap.toml:5: review.acept: no such action"),
        "{}",
        w[0]
    );
    assert!(w[0].contains("did you mean accept?"), "{}", w[0]);
    assert_eq!(map.keys_for(Section::Review, Action::Accept), vec!["a"]);
    assert_eq!(map.keys_for(Section::Review, Action::Reject), vec!["x"]);
}

#[test]
fn unknown_section_warns_with_line() {
    let src = "[global]\nquit = [\"Q\"]\n[revew]\naccept = [\"z\"]\n";
    let (map, w) = merged(src);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].starts_with(
            "keymap.toml:3: no section [revew]; sections are global, review, confirm, input"
        ),
        "{}",
        w[0]
    );
    assert!(w[0].contains("did you mean [review]?"), "{}", w[0]);
    assert_eq!(map.keys_for(Section::Review, Action::Accept), vec!["a"]);
    assert_eq!(map.keys_for(Section::Global, Action::Quit), vec!["Q"]);
    // A binding outside any section.
    let (_, w) = merged("quit = [\"Q\"]\n");
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].starts_with("keymap.toml:1: quit: "), "{}", w[0]);
}

#[test]
fn bad_key_warns_with_line_and_keeps_default() {
    let src = "[global]\nup = [\"z\"]\n\n\n\n\n\n\nquit = [\"x\",\n  \"ctrl-\"]\n";
    let (map, w) = merged(src);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].starts_with("keymap.toml:10: global.quit: \"ctrl-\" is not a key: "),
        "{}",
        w[0]
    );
    assert_eq!(map.keys_for(Section::Global, Action::Quit), vec!["q"]);
    assert_eq!(map.keys_for(Section::Global, Action::Up), vec!["z"]);
    let (map, w) = merged("[global]\nquit = [\"ctrl-\"]\n");
    assert!(
        w[0].starts_with("keymap.toml:2: global.quit: \"ctrl-\" is not a key: "),
        "{w:?}"
    );
    assert_eq!(map, Keymap::default_map());
}

#[test]
fn wrong_type_warns_with_line_and_keeps_default() {
    let (map, w) = merged("\n[review]\n\naccept = 5\n");
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].starts_with("keymap.toml:4: review.accept: "),
        "{}",
        w[0]
    );
    assert!(w[0].contains("integer"), "{}", w[0]);
    assert_eq!(map, Keymap::default_map());
    let (map, w) = merged("[review]\naccept = [\"b\", true]\n");
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].starts_with("keymap.toml:2: review.accept: "),
        "{}",
        w[0]
    );
    assert_eq!(map, Keymap::default_map());
    let (_, w) = merged("review = 3\n");
    assert!(
        w[0].starts_with("keymap.toml:1: review must be a table"),
        "{w:?}"
    );
    // A bare string is accepted as a one-key list.
    let (map, w) = merged("[review]\naccept = \"b\"\n");
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(map.keys_for(Section::Review, Action::Accept), vec!["b"]);
}

#[test]
fn syntax_error_warns_with_line_and_keeps_default() {
    let src = "[review]\naccept = [\"b\"]\n\nreject = [\"x\"\nskip = [\"z\"]\n";
    let (map, w) = merged(src);
    // The unclosed array on line 4 is noticed at line 5; one warning, not echoes.
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].starts_with("keymap.toml:5: TOML syntax error"),
        "{w:?}"
    );
    assert!(w[0].contains("not applied"), "{w:?}");
    assert_eq!(map, Keymap::default_map());
    let (map, w) = merged("[global]\nquit = [\"Q\"]\nup = = \n");
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].starts_with("keymap.toml:3: TOML syntax error"),
        "{w:?}"
    );
    assert_eq!(map, Keymap::default_map());
}

#[test]
fn conflict_names_both_actions_and_user_wins() {
    let (map, w) = merged("[review]\naccept = [\"r\"]\n");
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(
        w[0].starts_with("keymap.toml:2: review.accept: "),
        "{}",
        w[0]
    );
    assert!(w[0].contains("review.reject"), "{}", w[0]);
    assert!(w[1].contains("reject is now unbound"), "{}", w[1]);
    assert_eq!(map.keys_for(Section::Review, Action::Accept), vec!["r"]);
    assert!(map.keys_for(Section::Review, Action::Reject).is_empty());
    assert_eq!(
        resolve1(&map, &[Section::Review], ch('r')),
        KeyMatch::Action(Action::Accept)
    );
    // An alias is taken from the other action, which keeps its remaining keys.
    let (map, w) = merged("[global]\nquit = [\"q\", \"end\"]\n");
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].contains("quit") && w[0].contains("bottom"), "{}", w[0]);
    assert_eq!(map.keys_for(Section::Global, Action::Bottom), vec!["G"]);
    assert_eq!(
        map.keys_for(Section::Global, Action::Quit),
        vec!["q", "end"]
    );
    // A prefix clash: "g g" for bottom would be hidden by top's "g".
    let (map, w) = merged("[global]\nbottom = [\"g g\"]\n");
    assert!(
        w.iter().any(|w| w.contains("bottom") && w.contains("top")),
        "{w:?}"
    );
    assert_eq!(map.keys_for(Section::Global, Action::Top), vec!["home"]);
    // The same key in review and global is shadowing, not a conflict.
    let (_, w) = merged("[review]\nundo = [\"q\"]\n");
    assert!(w.is_empty(), "{w:?}");
}

#[test]
fn to_toml_round_trips() {
    let (map, w) = merged(
        "[global]\ntop = [\"g g\", \"home\"]\nquit = [\"q\", \"ctrl-q\"]\n\
         [review]\naccept = [\"\\\"\", \"\\\\\"]\nreject = []\n",
    );
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(
        map.keys_for(Section::Review, Action::Accept),
        vec!["\"", "\\"]
    );
    for m in [Keymap::default_map(), map] {
        let text = m.to_toml();
        let (back, w) = Keymap::from_toml_str(&text, "printed");
        assert!(w.is_empty(), "{w:?}\n{text}");
        assert_eq!(back, m, "{text}");
    }
}

#[test]
fn help_entries_are_ordered() {
    let map = Keymap::default_map();
    let entries = map.help_entries();
    assert_eq!(
        entries[0],
        (Section::Global, Action::Up, "k, up".to_string(), "move up")
    );
    let sections: Vec<Section> = entries.iter().map(|e| e.0).collect();
    let mut sorted = sections.clone();
    sorted.sort();
    assert_eq!(sections, sorted);
    assert!(entries.contains(&(
        Section::Review,
        Action::Accept,
        "a".to_string(),
        "accept the suggestion"
    )));
}

#[test]
fn load_reports_missing_explicit_file_and_merges_present_one() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.toml");
    let (map, w) = Keymap::load(Some(&missing));
    assert_eq!(map, Keymap::default_map());
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].contains("nope.toml"), "{}", w[0]);
    let file = dir.path().join("keymap.toml");
    std::fs::write(&file, "[global]\nquit = [\"Q\"]\nbogus = [\"x\"]\n").unwrap();
    let (map, w) = Keymap::load(Some(&file));
    assert_eq!(map.keys_for(Section::Global, Action::Quit), vec!["Q"]);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].starts_with(&format!("{}:3: global.bogus", file.display())),
        "{}",
        w[0]
    );
}

#[test]
fn default_path_ends_in_keymap_toml() {
    if let Some(p) = default_path() {
        assert!(p.ends_with("keymap.toml"), "{}", p.display());
    }
}
