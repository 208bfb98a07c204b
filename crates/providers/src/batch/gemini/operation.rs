//! The Operation a poll answers (or a bare batch resource), read
//! leniently: camelCase or proto snake_case, int64 counts as strings or
//! numbers, and the inline results skipped unread.

use std::fmt;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::value::MapAccessDeserializer;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use crate::batch::BatchCounts;

/// The first of `keys` present (camelCase, then the proto snake_case).
pub(super) fn field<'v>(v: &'v Value, keys: &[&str]) -> Option<&'v Value> {
    keys.iter().find_map(|k| v.get(*k)).filter(|x| !x.is_null())
}

/// An int64 in proto JSON: a string, or a number.
pub(super) fn int64(v: Option<&Value>) -> u64 {
    match v {
        Some(Value::String(s)) => s.trim().parse().unwrap_or(0),
        Some(Value::Number(n)) => n.as_u64().unwrap_or(0),
        _ => 0,
    }
}

pub(super) fn op_name(op: &Value) -> Option<String> {
    op.get("name")
        .and_then(Value::as_str)
        .or_else(|| {
            op.get("metadata")
                .and_then(|m| m.get("name"))
                .and_then(Value::as_str)
        })
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

pub(super) enum Output {
    None,
    Inline,
    File(String),
}

/// An Operation (or a bare GenerateContentBatch) read leniently.
pub(super) struct OpView<'v> {
    pub(super) op: &'v Value,
    /// `metadata` of an Operation, or the batch resource itself.
    pub(super) batch: &'v Value,
}

impl<'v> OpView<'v> {
    pub(super) fn new(op: &'v Value) -> Self {
        let batch = op.get("metadata").filter(|m| m.is_object()).unwrap_or(op);
        OpView { op, batch }
    }

    /// Where the results are, in the reference's order: `response` inline,
    /// `metadata.output` inline, `response` file, `metadata.output` file.
    pub(super) fn places(&self) -> [Option<&'v Value>; 2] {
        [
            field(self.op, &["response"]),
            field(self.batch, &["output"]),
        ]
    }

    pub(super) fn inline(place: &'v Value) -> Option<&'v Vec<Value>> {
        let outer = field(place, &["inlinedResponses", "inlined_responses"])?;
        match outer {
            Value::Array(a) => Some(a),
            o => field(o, &["inlinedResponses", "inlined_responses"])?.as_array(),
        }
    }

    pub(super) fn inline_items(&self) -> &'v [Value] {
        self.places()
            .into_iter()
            .flatten()
            .find_map(Self::inline)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }
}

/// What a poll reads of an Operation, of its `metadata` (the batch
/// resource), or of a bare batch resource. Every other field is skipped
/// unread (serde builds nothing of it), above all the inline results, which
/// are read only by `results`. Each field is read as leniently as
/// `field` reads a `Value`.
#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct OpStatus {
    name: Loose<IgnoredAny>,
    done: Loose<IgnoredAny>,
    error: Option<Value>,
    state: Loose<IgnoredAny>,
    #[serde(rename = "batchStats")]
    stats: Loose<Stats>,
    #[serde(rename = "batch_stats")]
    stats_snake: Loose<Stats>,
    response: Loose<Place>,
    output: Loose<Place>,
    metadata: Loose<Box<OpStatus>>,
    #[serde(rename = "inputConfig")]
    input: Loose<InputConfig>,
    #[serde(rename = "input_config")]
    input_snake: Loose<InputConfig>,
}

/// `inputConfig`: the uploaded file a batch reads, when it reads one.
#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct InputConfig {
    #[serde(rename = "fileName")]
    file: Loose<IgnoredAny>,
    #[serde(rename = "file_name")]
    file_snake: Loose<IgnoredAny>,
}

/// `batchStats`, its int64 counts as strings or numbers.
#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct Stats {
    #[serde(rename = "requestCount")]
    total: Loose<IgnoredAny>,
    #[serde(rename = "request_count")]
    total_snake: Loose<IgnoredAny>,
    #[serde(rename = "successfulRequestCount")]
    completed: Loose<IgnoredAny>,
    #[serde(rename = "successful_request_count")]
    completed_snake: Loose<IgnoredAny>,
    #[serde(rename = "failedRequestCount")]
    failed: Loose<IgnoredAny>,
    #[serde(rename = "failed_request_count")]
    failed_snake: Loose<IgnoredAny>,
}

/// Where results may be (`response`, `metadata.output`): whether there are
/// inline results (never what they are), or the responses file's name.
#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct Place {
    #[serde(rename = "inlinedResponses")]
    inlined: Loose<Inlined>,
    #[serde(rename = "inlined_responses")]
    inlined_snake: Loose<Inlined>,
    #[serde(rename = "responsesFile")]
    file: Loose<IgnoredAny>,
    #[serde(rename = "responses_file")]
    file_snake: Loose<IgnoredAny>,
}

/// `inlinedResponses` as an object holding the array.
#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct Inlined {
    #[serde(rename = "inlinedResponses")]
    inlined: Loose<IgnoredAny>,
    #[serde(rename = "inlined_responses")]
    inlined_snake: Loose<IgnoredAny>,
}

impl OpStatus {
    /// `metadata` of an Operation, or the batch resource itself.
    pub(super) fn batch(&self) -> &OpStatus {
        match &self.metadata {
            Loose::Obj(m) => m,
            _ => self,
        }
    }

    /// `name`, or `metadata.name` (as `op_name` reads them).
    pub(super) fn name(&self) -> Option<String> {
        self.name
            .as_str()
            .or_else(|| self.metadata.as_obj().and_then(|m| m.name.as_str()))
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    }

    /// The state without its `BATCH_STATE_` / `JOB_STATE_` prefix.
    pub(super) fn state(&self) -> Option<String> {
        let s = first(&[&self.batch().state])?.as_str()?;
        let s = s
            .strip_prefix("BATCH_STATE_")
            .or_else(|| s.strip_prefix("JOB_STATE_"))
            .unwrap_or(s);
        Some(s.to_ascii_uppercase())
    }

    pub(super) fn done(&self) -> bool {
        matches!(self.done, Loose::Bool(true))
    }

    pub(super) fn error(&self) -> Option<&Value> {
        self.error.as_ref().or(self.batch().error.as_ref())
    }

    pub(super) fn failure(&self) -> String {
        match self.error() {
            Some(e) => {
                let msg = e
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("(no message)");
                let code = e.get("code").map(Value::to_string).unwrap_or_default();
                docket_model::sanitize::for_terminal(&format!("{msg} [code {code}]"))
            }
            None => "the batch failed (no error given)".into(),
        }
    }

    /// The input file the batch reads (None: its requests were inline).
    pub(super) fn input_file(&self) -> Option<String> {
        let b = self.batch();
        let Some(Loose::Obj(c)) = first(&[&b.input, &b.input_snake]) else {
            return None;
        };
        first(&[&c.file, &c.file_snake])
            .and_then(Loose::as_str)
            .filter(|f| !f.is_empty())
            .map(str::to_string)
    }

    pub(super) fn stats(&self) -> Option<&Loose<Stats>> {
        let b = self.batch();
        first(&[&b.stats, &b.stats_snake])
    }

    /// `batchStats` is there (proto JSON leaves out zero counts inside it).
    pub(super) fn has_counts(&self) -> bool {
        matches!(self.stats(), Some(Loose::Obj(_)))
    }

    pub(super) fn counts(&self) -> BatchCounts {
        let Some(Loose::Obj(s)) = self.stats() else {
            return BatchCounts::default();
        };
        BatchCounts {
            total: count(first(&[&s.total, &s.total_snake])),
            completed: count(first(&[&s.completed, &s.completed_snake])),
            failed: count(first(&[&s.failed, &s.failed_snake])),
        }
    }

    /// Where the results are, in the reference's order: `response` inline,
    /// `metadata.output` inline, `response` file, `metadata.output` file.
    pub(super) fn output(&self) -> Output {
        let places = [self.response.as_obj(), self.batch().output.as_obj()];
        if places.iter().flatten().any(|p| p.inline()) {
            return Output::Inline;
        }
        for p in places.iter().flatten() {
            if let Some(f) = first(&[&p.file, &p.file_snake])
                .and_then(Loose::as_str)
                .filter(|f| !f.is_empty())
            {
                return Output::File(f.to_string());
            }
        }
        Output::None
    }
}

impl Place {
    /// `inlinedResponses` is an array, or an object holding one.
    pub(super) fn inline(&self) -> bool {
        match first(&[&self.inlined, &self.inlined_snake]) {
            Some(Loose::Array) => true,
            Some(Loose::Obj(o)) => {
                matches!(first(&[&o.inlined, &o.inlined_snake]), Some(Loose::Array))
            }
            _ => false,
        }
    }
}

/// An int64 in proto JSON: a string, or a number (as `int64` reads it).
pub(super) fn count(v: Option<&Loose<IgnoredAny>>) -> u64 {
    match v {
        Some(Loose::Str(s)) => s.trim().parse().unwrap_or(0),
        Some(Loose::Num(n)) => n.unwrap_or(0),
        _ => 0,
    }
}

/// The first of `keys` present, unless it is null (as `field` reads a
/// `Value`).
pub(super) fn first<'l, T>(keys: &[&'l Loose<T>]) -> Option<&'l Loose<T>> {
    keys.iter()
        .copied()
        .find(|k| !matches!(k, Loose::Absent))
        .filter(|k| !matches!(k, Loose::Null))
}

/// A JSON value read only as far as a poll needs: a scalar kept, an object
/// read as `T` (which skips the fields it does not name), an array's items
/// skipped unread.
#[derive(Default)]
pub(super) enum Loose<T> {
    #[default]
    Absent,
    Null,
    Bool(bool),
    Str(String),
    /// A number as `Value::as_u64` reads it.
    Num(Option<u64>),
    Array,
    Obj(T),
}

impl<T> Loose<T> {
    pub(super) fn as_str(&self) -> Option<&str> {
        match self {
            Loose::Str(s) => Some(s),
            _ => None,
        }
    }

    pub(super) fn as_obj(&self) -> Option<&T> {
        match self {
            Loose::Obj(o) => Some(o),
            _ => None,
        }
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Loose<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);

        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Loose<T>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }

            fn visit_unit<E>(self) -> Result<Loose<T>, E> {
                Ok(Loose::Null)
            }

            fn visit_none<E>(self) -> Result<Loose<T>, E> {
                Ok(Loose::Null)
            }

            fn visit_bool<E>(self, v: bool) -> Result<Loose<T>, E> {
                Ok(Loose::Bool(v))
            }

            fn visit_u64<E>(self, v: u64) -> Result<Loose<T>, E> {
                Ok(Loose::Num(Some(v)))
            }

            fn visit_i64<E>(self, v: i64) -> Result<Loose<T>, E> {
                Ok(Loose::Num(u64::try_from(v).ok()))
            }

            fn visit_f64<E>(self, _: f64) -> Result<Loose<T>, E> {
                Ok(Loose::Num(None))
            }

            fn visit_str<E>(self, v: &str) -> Result<Loose<T>, E> {
                Ok(Loose::Str(v.to_string()))
            }

            fn visit_string<E>(self, v: String) -> Result<Loose<T>, E> {
                Ok(Loose::Str(v))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Loose<T>, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Loose::Array)
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Loose<T>, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map)).map(Loose::Obj)
            }
        }

        d.deserialize_any(V(PhantomData))
    }
}
