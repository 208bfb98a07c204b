//! The content hash of an item's evidence: SHA-256 hex of its canonical
//! JSON (object keys sorted at every level, no spaces), so the same
//! evidence written with its keys in another order, or spaced otherwise,
//! has the same hash. `docket import --update` compares it to tell changed
//! evidence from unchanged, and every request records the hash of the
//! evidence it was made on.

use serde_json::{Map, Value};

use crate::ids::sha256_hex;

/// An item's evidence as an import writes it: its JSON text and its
/// content hash. Both are made from the parsed object the row gave, so an
/// import never parses the text it has just written (that second parse was
/// a quarter of an import's time). Reused row after row.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Evidence {
    pub json: String,
    pub hash: String,
}

impl Evidence {
    /// `value` (an item's evidence, a JSON object) written and hashed.
    pub fn of_value(value: &Value) -> Evidence {
        Evidence {
            json: value.to_string(),
            hash: value_hash(value),
        }
    }

    /// Take `map` as the evidence: written compactly in its own key
    /// order (as the row had it), and hashed in canonical form.
    pub fn set_object(&mut self, map: &Map<String, Value>) -> Result<(), serde_json::Error> {
        let mut bytes = std::mem::take(&mut self.json).into_bytes();
        bytes.clear();
        serde_json::to_writer(&mut bytes, map)?;
        // serde_json writes UTF-8; a failure here would be its bug, told
        // as an error all the same.
        self.json = String::from_utf8(bytes).map_err(serde::ser::Error::custom)?;
        self.hash = object_hash(map);
        Ok(())
    }
}

/// The hash of the evidence `json` (a JSON text). Text that is not JSON
/// (it never is in the ledger: import writes JSON) is hashed as it is.
pub fn evidence_hash(json: &str) -> String {
    match serde_json::from_str::<Value>(json) {
        Ok(v) => value_hash(&v),
        Err(_) => sha256_hex(json.as_bytes()),
    }
}

/// The hash of parsed evidence: the same as [`evidence_hash`] of any text
/// of it.
pub fn value_hash(v: &Value) -> String {
    let mut out = Vec::with_capacity(256);
    canonical(v, &mut out);
    sha256_hex(&out)
}

fn object_hash(map: &Map<String, Value>) -> String {
    let mut out = Vec::with_capacity(256);
    canonical_object(map, &mut out);
    sha256_hex(&out)
}

/// `v` as canonical JSON into `out`: objects' keys in byte order, no
/// spaces; strings and scalars as serde_json writes them compactly.
fn canonical(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Object(map) => canonical_object(map, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical(item, out);
            }
            out.push(b']');
        }
        // Scalars print the same whatever the source's spacing; writing
        // into a Vec cannot fail.
        scalar => {
            let _ = serde_json::to_writer(&mut *out, scalar);
        }
    }
}

fn canonical_object(map: &Map<String, Value>, out: &mut Vec<u8>) {
    let mut entries: Vec<(&String, &Value)> = map.iter().collect();
    // Keys are unique within an object: no order among equals to keep.
    entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
    out.push(b'{');
    for (i, (key, child)) in entries.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let _ = serde_json::to_writer(&mut *out, key);
        out.push(b':');
        canonical(child, out);
    }
    out.push(b'}');
}

#[cfg(test)]
mod tests {
    use super::evidence_hash;

    #[test]
    fn key_order_and_spacing_do_not_change_the_hash() {
        let a =
            evidence_hash(r#"{"title":"Song","artist":"A","meta":{"y":1,"x":[1,{"b":2,"a":1}]}}"#);
        let b = evidence_hash(
            r#"{ "meta": {"x": [1, {"a": 1, "b": 2}], "y": 1}, "artist": "A", "title": "Song" }"#,
        );
        assert_eq!(a, b);
        assert_eq!(a.len(), 64);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn a_changed_value_or_array_order_changes_the_hash() {
        let base = evidence_hash(r#"{"title":"Song","tags":["a","b"]}"#);
        assert_ne!(base, evidence_hash(r#"{"title":"Song!","tags":["a","b"]}"#));
        assert_ne!(base, evidence_hash(r#"{"title":"Song","tags":["b","a"]}"#));
        assert_ne!(
            base,
            evidence_hash(r#"{"title":"Song","tags":["a","b"],"x":null}"#)
        );
        // A number and the string of it are different evidence.
        assert_ne!(evidence_hash(r#"{"n":1}"#), evidence_hash(r#"{"n":"1"}"#));
    }

    /// The hash an import makes from the parsed row is the hash of the
    /// text it writes (every request and the ledger compare the two).
    #[test]
    fn the_hash_of_a_parsed_row_is_the_hash_of_its_text() {
        let rows = [
            r#"{"b": [1, {"d": "\u00e9\"q", "c": null}], "a": "x"}"#,
            r#"{"n": -0.0, "f": 0.1, "big": 1e300, "i": -12, "u": 18446744073709551615}"#,
            r#"{"nested": {"z": {"y": [[], {}, [true, false]]}}, "": "empty key"}"#,
            r#"{"ctl": "tab\there\u0001", "emoji": "\ud83c\udfb5"}"#,
            "{}",
        ];
        for row in rows {
            let map: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(row).unwrap();
            let mut e = super::Evidence::default();
            e.set_object(&map).unwrap();
            assert_eq!(e.hash, evidence_hash(&e.json), "{row}");
            assert_eq!(e.hash, evidence_hash(row), "{row}");
            let v = serde_json::Value::Object(map);
            assert_eq!(super::Evidence::of_value(&v), e, "{row}");
        }
    }

    #[test]
    fn the_hash_is_stable_across_releases() {
        // Hashes are stored in ledgers: the canonical form must not drift.
        // The literal is `printf '%s' '{"a":"x","b":[1,{"c":null,"d":"é\"q"}]}' | sha256sum`.
        assert_eq!(
            evidence_hash(r#"{ "b": [1, {"d": "\u00e9\"q", "c": null}], "a": "x" }"#),
            "ea3b00176c9c1a6ffe54bd8cf57e40e065449429f7f993f39dbb1a2f4099a0ba"
        );
    }
}
