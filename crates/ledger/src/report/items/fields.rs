//! Where a stage's output fields come from: its gate (a `json_schema`
//! gate's schema file, a `regex` gate's named captures), else the union of
//! keys in the data.

use std::collections::BTreeMap;
use std::path::Path;

use super::schema::{Ordered, schema_fields};
use super::{Field, FieldType};
use crate::report::ReportError;
use crate::report::reads::Reports;
use serde_json::Value;

/// The fields a gate promises, or None when they cannot be known from it.
pub(super) fn gate_fields(gate: &Value, workspace: &Path) -> Option<Vec<Field>> {
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
pub(super) fn data_fields(
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
