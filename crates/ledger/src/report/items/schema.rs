//! A JSON Schema read in its own key order, with `$ref`s resolved, and
//! the flattened fields (with their column types) it describes.

use serde::Deserialize;

use super::{Field, FieldType};

/// JSON that keeps the order of object keys (serde_json's map sorts them
/// here), so fields come out in the schema's order.
#[derive(Debug)]
pub(super) enum Ordered {
    Null,
    Bool,
    /// A number; true when it was written as an integer.
    Num(bool),
    Str(String),
    Arr(Vec<Ordered>),
    Obj(Vec<(String, Ordered)>),
}

impl<'de> Deserialize<'de> for Ordered {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Ordered;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("JSON")
            }
            fn visit_unit<E>(self) -> Result<Ordered, E> {
                Ok(Ordered::Null)
            }
            fn visit_none<E>(self) -> Result<Ordered, E> {
                Ok(Ordered::Null)
            }
            fn visit_bool<E>(self, _: bool) -> Result<Ordered, E> {
                Ok(Ordered::Bool)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Ordered, E> {
                Ok(Ordered::Num(true))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Ordered, E> {
                Ok(Ordered::Num(true))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Ordered, E> {
                Ok(Ordered::Num(false))
            }
            fn visit_str<E>(self, s: &str) -> Result<Ordered, E> {
                Ok(Ordered::Str(s.to_string()))
            }
            fn visit_string<E>(self, s: String) -> Result<Ordered, E> {
                Ok(Ordered::Str(s))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<Ordered, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = a.next_element()? {
                    v.push(x);
                }
                Ok(Ordered::Arr(v))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<Ordered, A::Error> {
                let mut v: Vec<(String, Ordered)> = Vec::new();
                while let Some((k, x)) = a.next_entry::<String, Ordered>()? {
                    // A repeated key: the last one wins, as in serde_json.
                    v.retain(|(kk, _)| kk != &k);
                    v.push((k, x));
                }
                Ok(Ordered::Obj(v))
            }
        }
        d.deserialize_any(V)
    }
}

impl Ordered {
    fn get(&self, key: &str) -> Option<&Ordered> {
        match self {
            Ordered::Obj(v) => v.iter().find(|(k, _)| k == key).map(|(_, x)| x),
            _ => None,
        }
    }

    fn as_str(&self) -> Option<&str> {
        match self {
            Ordered::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// Follow a local `$ref` (`#/$defs/x`, `#/definitions/x`, any `#/a/b` pointer).
fn resolve<'a>(node: &'a Ordered, root: &'a Ordered) -> &'a Ordered {
    let mut cur = node;
    for _ in 0..16 {
        let Some(r) = cur.get("$ref").and_then(Ordered::as_str) else {
            return cur;
        };
        let Some(pointer) = r.strip_prefix('#') else {
            return cur;
        };
        let mut target = root;
        for part in pointer.split('/').filter(|p| !p.is_empty()) {
            let part = part.replace("~1", "/").replace("~0", "~");
            match target.get(&part) {
                Some(t) => target = t,
                None => return cur,
            }
        }
        cur = target;
    }
    cur
}

/// What a schema node holds: a leaf type, or an object with properties.
enum Shape {
    Leaf(FieldType),
    Object,
}

fn value_type(v: &Ordered) -> Option<FieldType> {
    match v {
        Ordered::Null => None,
        Ordered::Bool => Some(FieldType::Bool),
        Ordered::Num(true) => Some(FieldType::Int),
        Ordered::Num(false) => Some(FieldType::Float),
        Ordered::Str(_) => Some(FieldType::Text),
        Ordered::Arr(_) | Ordered::Obj(_) => Some(FieldType::JsonText),
    }
}

fn unify_all(types: impl IntoIterator<Item = FieldType>) -> Option<FieldType> {
    types.into_iter().reduce(FieldType::unify)
}

fn shape(node: &Ordered, root: &Ordered, depth: usize) -> Shape {
    let node = resolve(node, root);
    let has_props = matches!(node.get("properties"), Some(Ordered::Obj(p)) if !p.is_empty());
    let named = |t: &str| -> Option<Shape> {
        Some(match t {
            "integer" => Shape::Leaf(FieldType::Int),
            "number" => Shape::Leaf(FieldType::Float),
            "boolean" => Shape::Leaf(FieldType::Bool),
            "string" => Shape::Leaf(FieldType::Text),
            "object" if has_props => Shape::Object,
            "object" | "array" => Shape::Leaf(FieldType::JsonText),
            _ => return None,
        })
    };
    match node.get("type") {
        Some(Ordered::Str(t)) => {
            if let Some(s) = named(t) {
                return s;
            }
        }
        Some(Ordered::Arr(ts)) => {
            let ts: Vec<&str> = ts
                .iter()
                .filter_map(Ordered::as_str)
                .filter(|t| *t != "null")
                .collect();
            if ts.len() == 1
                && let Some(s) = named(ts[0])
            {
                return s;
            }
            let leaves = ts.iter().map(|t| match named(t) {
                Some(Shape::Leaf(f)) => f,
                _ => FieldType::JsonText,
            });
            if let Some(t) = unify_all(leaves) {
                return Shape::Leaf(t);
            }
        }
        _ => {}
    }
    if has_props {
        return Shape::Object;
    }
    if let Some(Ordered::Arr(vals)) = node.get("enum") {
        return Shape::Leaf(
            unify_all(vals.iter().filter_map(value_type)).unwrap_or(FieldType::Text),
        );
    }
    if let Some(c) = node.get("const") {
        return Shape::Leaf(value_type(c).unwrap_or(FieldType::Text));
    }
    if node.get("items").is_some() {
        return Shape::Leaf(FieldType::JsonText);
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(Ordered::Arr(branches)) = node.get(key) {
            if depth > 16 {
                break;
            }
            let leaves = branches
                .iter()
                .filter(|b| {
                    let b = resolve(b, root);
                    !matches!(b.get("type"), Some(Ordered::Str(t)) if t == "null")
                })
                .map(|b| match shape(b, root, depth + 1) {
                    Shape::Leaf(f) => f,
                    Shape::Object => FieldType::JsonText,
                });
            if let Some(t) = unify_all(leaves) {
                return Shape::Leaf(t);
            }
        }
    }
    Shape::Leaf(FieldType::JsonText)
}

pub(super) fn schema_fields(
    node: &Ordered,
    root: &Ordered,
    prefix: &mut Vec<String>,
    out: &mut Vec<Field>,
    depth: usize,
) {
    let node = resolve(node, root);
    let Some(Ordered::Obj(props)) = node.get("properties") else {
        return;
    };
    for (key, sub) in props {
        prefix.push(key.clone());
        match shape(sub, root, depth) {
            Shape::Object if depth < 16 => schema_fields(sub, root, prefix, out, depth + 1),
            Shape::Object => out.push(Field {
                path: prefix.clone(),
                ty: FieldType::JsonText,
            }),
            Shape::Leaf(ty) => out.push(Field {
                path: prefix.clone(),
                ty,
            }),
        }
        prefix.pop();
    }
}
