use super::*;

fn kp(spec: &str) -> Vec<KeyPress> {
    parse_sequence(spec).unwrap()
}

#[test]
fn key_specs_round_trip() {
    for spec in [
        "a",
        "G",
        "?",
        "/",
        ":",
        "1",
        "-",
        "space",
        "enter",
        "esc",
        "tab",
        "backtab",
        "up",
        "down",
        "left",
        "right",
        "home",
        "end",
        "pgup",
        "pgdn",
        "backspace",
        "delete",
        "insert",
        "f1",
        "f12",
        "ctrl-c",
        "ctrl-u",
        "alt-x",
        "ctrl-alt-left",
        "shift-up",
        "alt-enter",
        "ctrl--",
        "ctrl-space",
        "g g",
        "ctrl-x ctrl-s",
        "g g G",
    ] {
        let seq = parse_sequence(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
        assert_eq!(display_sequence(&seq), spec, "{spec}");
    }
    for (alias, canonical) in [
        ("shift-tab", "backtab"),
        ("pageup", "pgup"),
        ("pagedown", "pgdn"),
        ("Enter", "enter"),
        ("CTRL-c", "ctrl-c"),
        ("alt-ctrl-x", "ctrl-alt-x"),
        (" ", "space"),
    ] {
        assert_eq!(display_sequence(&kp(alias)), canonical, "{alias}");
    }
    for bad in [
        "",
        "ctrl-",
        "ctrl-ctrl-c",
        "shift-a",
        "f13",
        "f0",
        "hello",
        "g  g",
        "a b c d",
        "ctrl-enterr",
    ] {
        assert!(parse_sequence(bad).is_err(), "{bad:?} should not parse");
    }
    assert!(
        parse_sequence("ctrl-")
            .unwrap_err()
            .to_string()
            .contains("needs a key")
    );
}
