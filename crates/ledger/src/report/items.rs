//! `docket export --session ID --what items`: one row per item of a session,
//! with the item's outcome, the human decision, its totals, and for every
//! stage of the job its request, state, attempts, gate failures and every
//! field of its parsed output flattened into its own column.
//!
//! The columns and their types come from each stage's gate, never from the
//! data, so two runs of the same job export the same header with the same
//! types even when an answer lacks a field: a `json_schema` gate's schema
//! file gives the fields in schema order (JSON types mapped: integer → int,
//! number → float, boolean → bool, string / enum → string, object →
//! flattened with `__`, array → JSON text); a `regex` gate's named captures
//! are strings, its confidence capture a float. Only when the schema file
//! cannot be read do the fields fall back to the union of keys in the data,
//! sorted.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use super::ReportError;
use super::columns::{Cell, Kind};
use crate::report::reads::Reports;

/// The fixed columns of `export --what items`, before the per-stage ones.
pub const ITEM_COLUMNS: &[&str] = &[
    "item_id",
    "position",
    "outcome",
    "confidence",
    "rationale",
    "routing_note",
    "critic_verdict",
    "answer_stage",
    "error_message",
    "processed_at",
    "decision_state",
    "decided_by",
    "decided_at",
    "review_status",
    "review_decided_by",
    "review_decided_at",
    "attempts",
    "input_tokens",
    "output_tokens",
    "cost_usd",
];

const ITEM_KINDS: &[Kind] = &[
    Kind::Text,
    Kind::Int,
    Kind::Text,
    Kind::Float,
    Kind::Text,
    Kind::Text,
    Kind::Text,
    Kind::Text,
    Kind::Text,
    Kind::Ts,
    Kind::Text,
    Kind::Text,
    Kind::Ts,
    Kind::Text,
    Kind::Text,
    Kind::Ts,
    Kind::Int,
    Kind::Int,
    Kind::Int,
    Kind::Float,
];

const _: () = assert!(ITEM_COLUMNS.len() == ITEM_KINDS.len());

/// The fixed columns every stage has, after `<stage>__`.
pub const STAGE_COLUMNS: &[&str] = &["request_id", "state", "attempts", "gate_failures"];
const STAGE_KINDS: &[Kind] = &[Kind::Int, Kind::Text, Kind::Int, Kind::Int];

// Indexes into ITEM_COLUMNS filled from the stages when the item has any.
const COL_ATTEMPTS: usize = 16;
const COL_INPUT_TOKENS: usize = 17;
const COL_OUTPUT_TOKENS: usize = 18;
const COL_COST: usize = 19;

/// The type of one output field's column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FieldType {
    Int,
    Float,
    Bool,
    Text,
    /// Arrays and objects without declared properties: their JSON as a string.
    JsonText,
}

impl FieldType {
    fn kind(self) -> Kind {
        match self {
            FieldType::Int => Kind::Int,
            FieldType::Float => Kind::Float,
            FieldType::Bool => Kind::Bool,
            FieldType::Text | FieldType::JsonText => Kind::Text,
        }
    }

    /// The type both of two observed types fit in (the data fallback).
    fn unify(self, other: FieldType) -> FieldType {
        use FieldType::*;
        match (self, other) {
            (a, b) if a == b => a,
            (Int, Float) | (Float, Int) => Float,
            _ => JsonText,
        }
    }

    fn cell(self, v: &Value) -> Cell {
        match (self, v) {
            (_, Value::Null) => Cell::Null,
            (FieldType::Int, Value::Number(n)) => match n.as_i64() {
                Some(i) => Cell::Int(i),
                None => match n.as_f64() {
                    Some(f) if f.fract() == 0.0 && f.abs() < 9.0e18 => Cell::Int(f as i64),
                    _ => Cell::Null,
                },
            },
            (FieldType::Int, Value::String(s)) => {
                s.trim().parse().map(Cell::Int).unwrap_or(Cell::Null)
            }
            (FieldType::Float, Value::Number(n)) => {
                n.as_f64().map(Cell::Float).unwrap_or(Cell::Null)
            }
            (FieldType::Float, Value::String(s)) => {
                s.trim().parse().map(Cell::Float).unwrap_or(Cell::Null)
            }
            (FieldType::Bool, Value::Bool(b)) => Cell::Bool(*b),
            (FieldType::Bool, Value::String(s)) => match s.trim() {
                "true" => Cell::Bool(true),
                "false" => Cell::Bool(false),
                _ => Cell::Null,
            },
            (FieldType::Text, Value::String(s)) => Cell::Text(s.clone()),
            (FieldType::Int | FieldType::Float | FieldType::Bool, _) => Cell::Null,
            (FieldType::Text | FieldType::JsonText, v) => Cell::Text(v.to_string()),
        }
    }
}

#[derive(Debug)]
struct Field {
    /// Keys from the output object down to the value.
    path: Vec<String>,
    ty: FieldType,
}

#[derive(Debug)]
struct Stage {
    name: String,
    fields: Vec<Field>,
}

/// The header and types of a session's items export.
pub(crate) struct ItemTable {
    pub(crate) columns: Vec<String>,
    pub(crate) kinds: Vec<Kind>,
    stages: Vec<Stage>,
}

/// A column name: lower-case, `[a-z0-9_]` only.
fn snake(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.trim().chars() {
        let c = c.to_ascii_lowercase();
        out.push(if c.is_ascii_alphanumeric() || c == '_' {
            c
        } else {
            '_'
        });
    }
    if out.is_empty() { "_".to_string() } else { out }
}

impl ItemTable {
    /// Work out the columns of `session`'s items from its job's stages and
    /// their gates; schema files are read relative to `workspace`.
    pub(crate) fn load(
        ledger: &dyn Reports,
        session: &str,
        workspace: &Path,
    ) -> Result<Self, ReportError> {
        let snapshot: Value = ledger
            .session_config(session)?
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or(Value::Null);
        let configured: Vec<&Value> = snapshot
            .pointer("/config/stages")
            .and_then(Value::as_array)
            .map(|a| a.iter().collect())
            .unwrap_or_default();

        // Job order from the config; then any stage the ledger knows that the
        // snapshot does not name, in its recorded position.
        let mut names: Vec<String> = configured
            .iter()
            .filter_map(|s| s.get("name").and_then(Value::as_str).map(String::from))
            .collect();
        for n in ledger.session_stages(session)? {
            // "STAGE:CRITERION": a criterion the stage's answer left out,
            // asked on its own and merged into the stage's output; not a
            // stage of the job (its costs count in the item's totals).
            let follow_up = n
                .split_once(':')
                .is_some_and(|(base, _)| names.iter().any(|x| x == base));
            if !follow_up && !names.contains(&n) {
                names.push(n);
            }
        }

        let mut stages = Vec::with_capacity(names.len());
        for name in names {
            let gate = configured
                .iter()
                .find(|s| s.get("name").and_then(Value::as_str) == Some(name.as_str()))
                .and_then(|s| s.get("gate"));
            let fields = match gate.and_then(|g| gate_fields(g, workspace)) {
                Some(f) => f,
                None => data_fields(ledger, session, &name)?,
            };
            stages.push(Stage { name, fields });
        }

        let mut columns: Vec<String> = ITEM_COLUMNS.iter().map(|c| c.to_string()).collect();
        let mut kinds: Vec<Kind> = ITEM_KINDS.to_vec();
        for stage in &stages {
            let prefix = snake(&stage.name);
            for (c, k) in STAGE_COLUMNS.iter().zip(STAGE_KINDS) {
                columns.push(format!("{prefix}__{c}"));
                kinds.push(*k);
            }
            for f in &stage.fields {
                let parts: Vec<String> = f.path.iter().map(|p| snake(p)).collect();
                let base = format!("{prefix}__{}", parts.join("__"));
                // A field that would repeat a column (`state`, or two keys
                // that snake_case alike) gets a numbered name, in schema order.
                let mut name = base.clone();
                let mut n = 2;
                while columns.contains(&name) {
                    name = format!("{base}_{n}");
                    n += 1;
                }
                columns.push(name);
                kinds.push(f.ty.kind());
            }
        }
        Ok(ItemTable {
            columns,
            kinds,
            stages,
        })
    }

    /// Stream one row per item of `session`; returns the row count.
    pub(crate) fn stream(
        &self,
        ledger: &dyn Reports,
        session: &str,
        each: &mut dyn FnMut(&[Cell]) -> Result<(), ReportError>,
    ) -> Result<u64, ReportError> {
        // Where each stage's columns start in the row.
        let mut offsets = HashMap::with_capacity(self.stages.len());
        let mut at = ITEM_COLUMNS.len();
        for (i, s) in self.stages.iter().enumerate() {
            offsets.insert(s.name.clone(), (i, at));
            at += STAGE_COLUMNS.len() + s.fields.len();
        }

        let mut cells: Vec<Cell> = Vec::with_capacity(self.columns.len());
        ledger.for_each_item(session, ITEM_KINDS, STAGE_KINDS, &mut |item, stages| {
            cells.clear();
            cells.extend_from_slice(item);
            cells.resize(self.columns.len(), Cell::Null);
            let (mut attempts, mut input, mut output, mut cost) = (0i64, 0i64, 0i64, 0f64);
            for sr in stages {
                // Totals over every request of the item, criterion
                // follow-ups included; columns only for the job's stages.
                attempts += sr.attempts.unwrap_or(0);
                input += sr.input_tokens.unwrap_or(0);
                output += sr.output_tokens.unwrap_or(0);
                cost += sr.cost_usd.unwrap_or(0.0);
                let Some(&(si, off)) = offsets.get(&sr.stage) else {
                    continue;
                };
                for (j, cell) in sr.cells.iter().take(STAGE_COLUMNS.len()).enumerate() {
                    cells[off + j] = cell.clone();
                }
                let parsed: Option<Value> = sr
                    .output_json
                    .as_deref()
                    .and_then(|s| serde_json::from_str(s).ok());
                if let Some(v) = parsed {
                    let base = off + STAGE_COLUMNS.len();
                    for (k, f) in self.stages[si].fields.iter().enumerate() {
                        if let Some(x) = lookup(&v, &f.path) {
                            cells[base + k] = f.ty.cell(x);
                        }
                    }
                }
            }
            if !stages.is_empty() {
                cells[COL_ATTEMPTS] = Cell::Int(attempts);
                cells[COL_INPUT_TOKENS] = Cell::Int(input);
                cells[COL_OUTPUT_TOKENS] = Cell::Int(output);
                cells[COL_COST] = Cell::Float(cost);
            }
            each(&cells)
        })
    }
}

fn lookup<'v>(v: &'v Value, path: &[String]) -> Option<&'v Value> {
    let mut cur = v;
    for p in path {
        cur = cur.as_object()?.get(p)?;
    }
    Some(cur)
}

/// The fields a gate promises, or None when they cannot be known from it.
fn gate_fields(gate: &Value, workspace: &Path) -> Option<Vec<Field>> {
    match gate.get("kind").and_then(Value::as_str)? {
        "json_schema" => {
            let file = workspace.join(gate.get("schema").and_then(Value::as_str)?);
            let text = std::fs::read_to_string(file).ok()?;
            let schema: Ordered = serde_json::from_str(&text).ok()?;
            let mut out = Vec::new();
            schema_fields(&schema, &schema, &mut Vec::new(), &mut out, 0);
            Some(out)
        }
        "regex" => {
            let re = regex::Regex::new(gate.get("pattern").and_then(Value::as_str)?).ok()?;
            let confidence = gate
                .get("confidence_field")
                .and_then(Value::as_str)
                .unwrap_or("confidence");
            let mut out: Vec<Field> = Vec::new();
            for name in re.capture_names().flatten() {
                if out.iter().any(|f| f.path[0] == name) {
                    continue;
                }
                out.push(Field {
                    path: vec![name.to_string()],
                    ty: if name == confidence {
                        FieldType::Float
                    } else {
                        FieldType::Text
                    },
                });
            }
            Some(out)
        }
        _ => None,
    }
}

/// The union of the keys in the stage's outputs in this session, sorted,
/// nested objects flattened, types unified over the values seen.
fn data_fields(
    ledger: &dyn Reports,
    session: &str,
    stage: &str,
) -> Result<Vec<Field>, ReportError> {
    let mut seen: BTreeMap<Vec<String>, Option<FieldType>> = BTreeMap::new();
    ledger.for_each_stage_output(session, stage, &mut |text| {
        if let Ok(Value::Object(map)) = serde_json::from_str::<Value>(text) {
            observe(&map, &mut Vec::new(), &mut seen);
        }
    })?;
    Ok(seen
        .into_iter()
        .map(|(path, ty)| Field {
            path,
            ty: ty.unwrap_or(FieldType::Text),
        })
        .collect())
}

fn observe(
    map: &serde_json::Map<String, Value>,
    prefix: &mut Vec<String>,
    seen: &mut BTreeMap<Vec<String>, Option<FieldType>>,
) {
    for (k, v) in map {
        prefix.push(k.clone());
        let ty = match v {
            Value::Object(m) if !m.is_empty() && prefix.len() < 16 => {
                observe(m, prefix, seen);
                prefix.pop();
                continue;
            }
            Value::Null => None,
            Value::Bool(_) => Some(FieldType::Bool),
            Value::Number(n) if n.is_i64() || n.is_u64() => Some(FieldType::Int),
            Value::Number(_) => Some(FieldType::Float),
            Value::String(_) => Some(FieldType::Text),
            Value::Array(_) | Value::Object(_) => Some(FieldType::JsonText),
        };
        let slot = seen.entry(prefix.clone()).or_insert(None);
        *slot = match (*slot, ty) {
            (Some(a), Some(b)) => Some(a.unify(b)),
            (a, b) => a.or(b),
        };
        prefix.pop();
    }
}

// ------------------------------------------------------------ JSON Schema

/// JSON that keeps the order of object keys (serde_json's map sorts them
/// here), so fields come out in the schema's order.
#[derive(Debug)]
enum Ordered {
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

fn schema_fields(
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

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(schema: &str) -> Vec<(String, FieldType)> {
        let s: Ordered = serde_json::from_str(schema).unwrap();
        let mut out = Vec::new();
        schema_fields(&s, &s, &mut Vec::new(), &mut out, 0);
        out.into_iter().map(|f| (f.path.join("."), f.ty)).collect()
    }

    #[test]
    fn schema_order_and_types() {
        let got = fields(
            r##"{"type":"object","properties":{
                "zeta":{"type":"string"},
                "alpha":{"type":["number","null"]},
                "n":{"type":"integer"},
                "ok":{"type":"boolean"},
                "tags":{"type":"array","items":{"type":"string"}},
                "label":{"enum":["yes","no"]},
                "meta":{"type":"object","properties":{"b":{"type":"integer"},"a":{"$ref":"#/$defs/s"}}},
                "free":{"type":"object"},
                "either":{"anyOf":[{"type":"integer"},{"type":"number"},{"type":"null"}]}
            },"$defs":{"s":{"type":"string"}}}"##,
        );
        use FieldType::*;
        assert_eq!(
            got,
            vec![
                ("zeta".into(), Text),
                ("alpha".into(), Float),
                ("n".into(), Int),
                ("ok".into(), Bool),
                ("tags".into(), JsonText),
                ("label".into(), Text),
                ("meta.b".into(), Int),
                ("meta.a".into(), Text),
                ("free".into(), JsonText),
                ("either".into(), Float),
            ]
        );
    }

    #[test]
    fn cells_follow_the_column_type() {
        use serde_json::json;
        assert_eq!(FieldType::Float.cell(&json!(1)), Cell::Float(1.0));
        assert_eq!(FieldType::Int.cell(&json!(2.0)), Cell::Int(2));
        assert_eq!(FieldType::Int.cell(&json!("x")), Cell::Null);
        assert_eq!(FieldType::Text.cell(&json!(3)), Cell::Text("3".into()));
        assert_eq!(
            FieldType::JsonText.cell(&json!(["a", 1])),
            Cell::Text(r#"["a",1]"#.into())
        );
        assert_eq!(snake("Score Gen-2"), "score_gen_2");
    }
}
