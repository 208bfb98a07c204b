//! Structured-output answers: a JSON value that validates against the request's
//! `json_schema.schema`, the way a model under `strict: true` would write it.
//!
//! Contract: every property listed in `properties` is emitted, in schema order;
//! `enum`/`const` are respected; numbers and integers stay within
//! minimum/maximum (defaults 0..1 and 0..10); a property named `confidence`
//! gets the three-band spread of `Material::confidence`; strings are UUIDs from
//! the prompt for `*_id`/`*_mbid` names, a sentence or two for
//! rationale/reasoning/explanation names, a prompt label for label-like names,
//! else something short honouring `format`, minLength and maxLength; nullable
//! types are usually non-null; arrays get 1-3 items; `$ref` (local pointers),
//! `anyOf`/`oneOf` and the first `allOf` member are followed. Recursion is cut
//! at a fixed depth and a fixed number of values, so self-referential or
//! explosive schemas still terminate quickly (with nulls past the cut).
//!
//! Steering (see `answer::Steer`): a property named `verdict` (any depth,
//! case-insensitive) takes the forced label when its `enum` allows it (else the
//! enum's first value), or with a disagree rate the enum's value 1 / 0; without
//! an enum, string verdicts choose among the prompt's labels (else yes/no).
//! Optional (non-`required`) top-level properties may be left out, but only
//! when the schema has at least two of them.

use super::material::{Material, VerdictChoice};
use crate::json::Json;
use ids::{IdTuple, is_id_like};

mod ids;

const MAX_DEPTH: usize = 24;
/// Most values generated per answer: a schema with several recursive or large
/// array members would otherwise grow exponentially with depth.
const MAX_VALUES: usize = 5_000;

/// Compact JSON text for `schema`; with `drop_required`, one top-level required
/// property is left out (or, if the schema requires nothing, the value is `[]`).
pub(crate) fn generate(schema: &Json, m: &mut Material<'_>, drop_required: bool) -> String {
    let mut g = Gen {
        root: schema,
        m,
        budget: MAX_VALUES,
        ids: None,
    };
    let mut value = g.value(schema, None, 0);
    let optional = optional_properties(schema);
    let gone = g.m.omitted(&optional);
    if let Json::Obj(pairs) = &mut value
        && !gone.is_empty()
    {
        let before = pairs.len();
        pairs.retain(|(k, _)| !gone.contains(&k.as_str()));
        g.m.partial = pairs.len() < before;
    }
    if drop_required {
        let top = g.resolve(schema);
        let required: Vec<&str> = match (&value, top.get("required").and_then(Json::as_array)) {
            (Json::Obj(pairs), Some(req)) => req
                .iter()
                .filter_map(Json::as_str)
                .filter(|r| pairs.iter().any(|(k, _)| k == r))
                .collect(),
            _ => Vec::new(),
        };
        match (&mut value, required.is_empty()) {
            (Json::Obj(pairs), false) => {
                let gone = required[g.m.rng.below(required.len())];
                pairs.retain(|(k, _)| k != gone);
            }
            _ => value = Json::Arr(Vec::new()),
        }
    }
    value.to_compact()
}

/// The top-level properties the schema does not require, in schema order
/// (a top-level `$ref` is followed).
pub(crate) fn optional_properties(schema: &Json) -> Vec<&str> {
    let g = Resolver { root: schema };
    let top = g.resolve(schema);
    let Some(Json::Obj(props)) = top.get("properties") else {
        return Vec::new();
    };
    let required: Vec<&str> = top
        .get("required")
        .and_then(Json::as_array)
        .map(|r| r.iter().filter_map(Json::as_str).collect())
        .unwrap_or_default();
    props
        .iter()
        .map(|(k, _)| k.as_str())
        .filter(|k| !required.contains(k))
        .collect()
}

/// `$ref` resolution alone, for callers without a generator.
struct Resolver<'s> {
    root: &'s Json,
}

impl<'s> Resolver<'s> {
    fn resolve(&self, mut s: &'s Json) -> &'s Json {
        for _ in 0..16 {
            let Some(target) = s.get("$ref").and_then(Json::as_str) else {
                return s;
            };
            match pointer(self.root, target) {
                Some(next) => s = next,
                None => return s,
            }
        }
        s
    }
}

fn pointer<'s>(root: &'s Json, target: &str) -> Option<&'s Json> {
    let path = target.strip_prefix('#')?;
    let mut node = root;
    for raw in path.split('/').skip(1) {
        let key = raw.replace("~1", "/").replace("~0", "~");
        node = match node {
            Json::Obj(_) => node.get(&key)?,
            Json::Arr(items) => items.get(key.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(node)
}

struct Gen<'s, 'm, 'p> {
    root: &'s Json,
    m: &'m mut Material<'p>,
    budget: usize,
    /// The id fields of the object being generated, answered as one
    /// candidate's ids (see `IdTuple`).
    ids: Option<IdTuple>,
}

fn is_null_schema(s: &Json) -> bool {
    s.get("type").and_then(Json::as_str) == Some("null")
}

impl<'s> Gen<'s, '_, '_> {
    /// Follow local `$ref`s ("#", "#/$defs/x", "#/definitions/x", any JSON pointer).
    fn resolve(&self, s: &'s Json) -> &'s Json {
        Resolver { root: self.root }.resolve(s)
    }

    /// A steered verdict instead of the seeded `value` (see the module docs).
    fn steer_verdict(&mut self, schema: &'s Json, value: Json) -> Json {
        let s = self.resolve(schema);
        let mut options: Vec<Json> = s
            .get("enum")
            .and_then(Json::as_array)
            .map(|o| o.iter().filter(|v| **v != Json::Null).cloned().collect())
            .unwrap_or_default();
        if options.is_empty() {
            for key in ["anyOf", "oneOf"] {
                let variants = s.get(key).and_then(Json::as_array).into_iter().flatten();
                for v in variants {
                    if let Some(o) = self.resolve(v).get("enum").and_then(Json::as_array)
                        && options.is_empty()
                    {
                        options = o.iter().filter(|v| **v != Json::Null).cloned().collect();
                    }
                }
            }
        }
        let has_enum = !options.is_empty();
        if !has_enum {
            if !matches!(value, Json::Str(_)) {
                return value;
            }
            options = match self.m.labels() {
                [] => vec![Json::Str("yes".into()), Json::Str("no".into())],
                labels => labels.iter().map(|l| Json::Str((*l).to_string())).collect(),
            };
        }
        match self.m.verdict_choice(options.len()) {
            VerdictChoice::Seeded => value,
            VerdictChoice::Label(l) => {
                let wanted = Json::Str(l.to_string());
                if !has_enum || options.contains(&wanted) {
                    wanted
                } else {
                    options.swap_remove(0)
                }
            }
            VerdictChoice::Index(i) => options.swap_remove(i.min(options.len() - 1)),
        }
    }

    fn value(&mut self, schema: &'s Json, name: Option<&str>, depth: usize) -> Json {
        if depth > MAX_DEPTH || self.budget == 0 {
            return Json::Null;
        }
        self.budget -= 1;
        let s = self.resolve(schema);
        if !matches!(s, Json::Obj(_)) {
            // `true` (or anything unexpected) accepts anything: a string is fine.
            return self.string(s, name);
        }
        if let Some(c) = s.get("const") {
            return c.clone();
        }
        if let Some(options) = s.get("enum").and_then(Json::as_array)
            && !options.is_empty()
        {
            let non_null: Vec<&Json> = options.iter().filter(|v| **v != Json::Null).collect();
            if non_null.is_empty() || (non_null.len() < options.len() && !self.m.rng.chance(0.9)) {
                return Json::Null;
            }
            return non_null[self.m.rng.below(non_null.len())].clone();
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(variants) = s.get(key).and_then(Json::as_array)
                && !variants.is_empty()
            {
                let non_null: Vec<&Json> = variants
                    .iter()
                    .filter(|v| !is_null_schema(self.resolve(v)))
                    .collect();
                if non_null.is_empty()
                    || (non_null.len() < variants.len() && !self.m.rng.chance(0.9))
                {
                    return Json::Null;
                }
                let pick = non_null[self.m.rng.below(non_null.len())];
                return self.value(pick, name, depth + 1);
            }
        }
        if let Some(first) = s
            .get("allOf")
            .and_then(Json::as_array)
            .and_then(|a| a.first())
        {
            return self.value(first, name, depth + 1);
        }
        match self.pick_type(s) {
            "object" => self.object(s, depth),
            "array" => self.array(s, name, depth),
            "number" => self.number(s, name, false),
            "integer" => self.number(s, name, true),
            "boolean" => Json::Bool(self.m.rng.chance(0.5)),
            "null" => Json::Null,
            _ => self.string(s, name),
        }
    }

    /// The JSON type to produce; nullable unions are non-null 90% of the time.
    fn pick_type(&mut self, s: &'s Json) -> &'s str {
        match s.get("type") {
            Some(Json::Str(t)) => t,
            Some(Json::Arr(types)) => {
                let all: Vec<&str> = types.iter().filter_map(Json::as_str).collect();
                let non_null: Vec<&str> = all.iter().copied().filter(|t| *t != "null").collect();
                if non_null.is_empty() || (non_null.len() < all.len() && !self.m.rng.chance(0.9)) {
                    "null"
                } else {
                    non_null[self.m.rng.below(non_null.len())]
                }
            }
            _ if s.get("properties").is_some() => "object",
            _ if s.get("items").is_some() => "array",
            _ if s.get("minimum").is_some() || s.get("maximum").is_some() => "number",
            _ => "string",
        }
    }

    fn object(&mut self, s: &'s Json, depth: usize) -> Json {
        let Some(Json::Obj(props)) = s.get("properties") else {
            return Json::Obj(Vec::new());
        };
        let width = props
            .iter()
            .filter(|(k, v)| {
                is_id_like(k) && v.get("type").and_then(Json::as_str) == Some("string")
            })
            .count();
        let outer = self.ids.replace(IdTuple {
            width,
            start: None,
            next: 0,
        });
        let pairs = props
            .iter()
            .map(|(k, v)| {
                let mut value = self.value(v, Some(k), depth + 1);
                if k.eq_ignore_ascii_case("verdict") {
                    value = self.steer_verdict(v, value);
                }
                (k.clone(), value)
            })
            .collect();
        self.ids = outer;
        Json::Obj(pairs)
    }

    fn array(&mut self, s: &'s Json, name: Option<&str>, depth: usize) -> Json {
        let count = |key: &str| {
            s.get(key)
                .and_then(Json::as_f64)
                .map(|n| n.max(0.0) as usize)
        };
        let max = count("maxItems").unwrap_or(usize::MAX);
        let lo = count("minItems").unwrap_or(1).clamp(1, 50).min(max);
        let hi = max.min(lo.max(3));
        let n = lo + self.m.rng.below(hi - lo + 1);
        let item_schema = s.get("items");
        let mut items: Vec<Json> = (0..n)
            .map(|_| match item_schema {
                Some(schema) => self.value(schema, name, depth + 1),
                None => Json::Str(self.short_word()),
            })
            .collect();
        if s.get("uniqueItems") == Some(&Json::Bool(true)) {
            let mut unique: Vec<Json> = Vec::with_capacity(items.len());
            for item in items.drain(..) {
                if !unique.contains(&item) {
                    unique.push(item);
                }
            }
            items = unique;
        }
        Json::Arr(items)
    }

    fn number(&mut self, s: &'s Json, name: Option<&str>, integer: bool) -> Json {
        let is_confidence = name.is_some_and(|n| {
            n.eq_ignore_ascii_case("confidence") || n.to_ascii_lowercase().ends_with("_confidence")
        });
        let bound = |inclusive: &str, exclusive: &str| {
            let inc = s.get(inclusive).and_then(Json::as_f64);
            let exc = s.get(exclusive).and_then(Json::as_f64);
            (inc, exc)
        };
        let (min, ex_min) = bound("minimum", "exclusiveMinimum");
        let (max, ex_max) = bound("maximum", "exclusiveMaximum");
        let (d_lo, d_hi) = match (integer, is_confidence) {
            (false, _) => (0.0, 1.0),
            (true, true) => (0.0, 100.0),
            (true, false) => (0.0, 10.0),
        };
        let span = d_hi - d_lo;
        let given_lo = min.or(ex_min);
        let given_hi = max.or(ex_max);
        let lo = given_lo.unwrap_or(match given_hi {
            Some(h) if h < d_lo => h - span,
            _ => d_lo,
        });
        let mut hi = given_hi.unwrap_or(if lo > d_hi { lo + span } else { d_hi });
        if !(lo.is_finite() && hi.is_finite()) {
            return if integer {
                Json::Int(0)
            } else {
                Json::Float(0.0)
            };
        }
        hi = hi.max(lo);
        let u = if is_confidence {
            self.m.confidence()
        } else {
            self.m.rng.unit()
        };
        if integer {
            let mut lo_i = lo.ceil();
            let mut hi_i = hi.floor();
            if min.is_none() && ex_min.is_some_and(|e| e == lo_i) {
                lo_i += 1.0;
            }
            if max.is_none() && ex_max.is_some_and(|e| e == hi_i) {
                hi_i -= 1.0;
            }
            let hi_i = hi_i.max(lo_i);
            Json::Int((lo_i + (u * (hi_i - lo_i)).round()) as i64)
        } else {
            // Exclusive bounds: keep 1% of the range away from them.
            let pad = (hi - lo) * 0.01;
            let a = if min.is_none() && ex_min.is_some() {
                lo + pad
            } else {
                lo
            };
            let b = if max.is_none() && ex_max.is_some() {
                hi - pad
            } else {
                hi
            };
            let v = ((a + u * (b - a)) * 100.0).round() / 100.0;
            // max/min rather than clamp: clamp panics if overflowed bounds cross.
            Json::Float(v.max(a).min(b))
        }
    }

    fn string(&mut self, s: &'s Json, name: Option<&str>) -> Json {
        let lname = name.unwrap_or("").to_ascii_lowercase();
        let mut out = if is_id_like(&lname) && !self.m.uuids().is_empty() {
            self.prompt_id()
        } else if ["rationale", "reason", "explanation", "justification"]
            .iter()
            .any(|k| lname.contains(k))
        {
            let sentences = 1 + self.m.rng.below(2);
            self.m.rationale(sentences)
        } else if ["label", "verdict", "answer", "decision", "category"]
            .iter()
            .any(|k| lname.contains(k))
            && !self.m.labels().is_empty()
        {
            self.m.label()
        } else if let Some(formatted) = self.formatted(s.get("format").and_then(Json::as_str)) {
            formatted
        } else if is_id_like(&lname) {
            format!("id-{:08x}", self.m.rng.next_u64() as u32)
        } else {
            self.short_word()
        };
        let count = |key: &str| {
            s.get(key)
                .and_then(Json::as_f64)
                .map(|n| n.max(0.0) as usize)
        };
        if let Some(max) = count("maxLength")
            && out.chars().count() > max
        {
            out = out.chars().take(max).collect();
        }
        if let Some(min) = count("minLength") {
            while out.chars().count() < min.min(10_000) {
                out.push('x');
            }
        }
        Json::Str(out)
    }

    fn formatted(&mut self, format: Option<&str>) -> Option<String> {
        let r = &mut self.m.rng;
        let date = |r: &mut super::material::AnswerRng| {
            format!(
                "20{:02}-{:02}-{:02}",
                10 + r.below(15),
                1 + r.below(12),
                1 + r.below(28)
            )
        };
        Some(match format? {
            "date" => date(r),
            "date-time" => format!("{}T{:02}:{:02}:00Z", date(r), r.below(24), r.below(60)),
            "time" => format!("{:02}:{:02}:00", r.below(24), r.below(60)),
            "email" => format!("user{}@example.com", r.below(1000)),
            "uri" | "url" => format!("https://example.com/item/{:x}", r.next_u64() as u32),
            "uuid" => {
                let (a, b) = (r.next_u64(), r.next_u64());
                format!(
                    "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
                    a >> 32,
                    (a >> 16) & 0xffff,
                    a & 0xfff,
                    0x8000 | (b >> 48 & 0x3fff),
                    b & 0xffff_ffff_ffff
                )
            }
            _ => return None,
        })
    }

    fn short_word(&mut self) -> String {
        const WORDS: [&str; 8] = [
            "consistent",
            "partial match",
            "confirmed",
            "likely",
            "unclear",
            "minor variation",
            "verified",
            "not stated",
        ];
        WORDS[self.m.rng.below(WORDS.len())].to_string()
    }
}

#[cfg(test)]
mod tests;
