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

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;

use super::ReportError;
use super::columns::{Cell, Kind};
use crate::report::reads::Reports;

mod fields;
mod schema;

use fields::{data_fields, gate_fields};

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

#[cfg(test)]
mod tests {
    use super::schema::{Ordered, schema_fields};
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
