//! The content hash of an item's evidence: SHA-256 hex of its canonical
//! JSON (object keys sorted at every level, no spaces), so the same
//! evidence written with its keys in another order, or spaced otherwise,
//! has the same hash. `docket import --update` compares it to tell changed
//! evidence from unchanged, and every request records the hash of the
//! evidence it was made on.

use serde_json::Value;

use crate::ids::sha256_hex;

/// The hash of the evidence `json` (a JSON text). Text that is not JSON
/// (it never is in the ledger: import writes JSON) is hashed as it is.
pub fn evidence_hash(json: &str) -> String {
    match serde_json::from_str::<Value>(json) {
        Ok(v) => {
            let mut out = String::with_capacity(json.len());
            canonical(&v, &mut out);
            sha256_hex(out.as_bytes())
        }
        Err(_) => sha256_hex(json.as_bytes()),
    }
}

/// `v` as canonical JSON into `out`: objects' keys in byte order.
fn canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                if let Some(child) = map.get(k) {
                    canonical(child, out);
                }
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(item, out);
            }
            out.push(']');
        }
        // Scalars print the same whatever the source's spacing.
        scalar => out.push_str(&scalar.to_string()),
    }
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
