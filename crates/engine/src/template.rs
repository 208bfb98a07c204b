//! Prompt templates (minijinja, strict): one rendered prompt per item.
//!
//! Undefined variables are errors, not empty strings, so a typo in a template
//! is caught while planning a session, before any request is sent. Errors name
//! the template file and line.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use docket_model::template_errors::{describe, undefined_variable};
use minijinja::{Environment, UndefinedBehavior};
use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("{path}: template file cannot be read: {source}")]
    Missing {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: template syntax error: {detail}")]
    Syntax {
        path: String,
        line: usize,
        detail: String,
    },
    /// One item's prompt cannot be rendered (a field it lacks): the item
    /// fails alone, and the message says how to get it out of the way.
    #[error("{path}:{line}: {detail} (item \"{item_id}\"); {}", fix_hint(item_id))]
    Render {
        path: String,
        line: usize,
        /// `undefined variable "item.title"` when the failing expression is
        /// known, else minijinja's own words.
        detail: String,
        item_id: String,
    },
}

impl TemplateError {
    /// Where and why, without the item and the hint: `FILE:LINE: DETAIL`
    /// (for lists that name many items at once).
    pub fn reason(&self) -> String {
        match self {
            TemplateError::Render {
                path, line, detail, ..
            } => format!("{path}:{line}: {detail}"),
            e => e.to_string(),
        }
    }
}

/// How to get an item whose prompt cannot be rendered out of the way. The
/// id is quoted for a shell when it needs it.
pub fn fix_hint(item_id: &str) -> String {
    format!(
        "remove it with `docket items rm {}` (then fix the row and import it again), or fix the template",
        shell_word(item_id)
    )
}

/// `word` as one shell word: as it is when plain, else single-quoted.
pub fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:/@+=,".contains(c));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// A stage's prompt: the user template and an optional system prompt, both
/// compiled once.
pub struct PromptTemplate {
    env: Environment<'static>,
    user_path: PathBuf,
    system_path: Option<PathBuf>,
    /// sha256 of the template sources, recorded on every request.
    pub hash: String,
    /// The system prompt rendered last: items whose system prompt renders
    /// the same share it instead of holding a copy each (a batch holds
    /// 50,000 prompts until the provider has them).
    last_system: std::sync::Mutex<Option<Arc<str>>>,
}

const USER: &str = "user";
const SYSTEM: &str = "system";

/// A rendered prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct Prompt {
    /// Shared: usually the same for every item of a stage.
    pub system: Option<Arc<str>>,
    pub user: String,
}

impl PromptTemplate {
    pub fn load(user_path: &Path, system_path: Option<&Path>) -> Result<Self, TemplateError> {
        let read = |p: &Path| {
            docket_model::files::read_text_file(p).map_err(|source| TemplateError::Missing {
                path: p.display().to_string(),
                source,
            })
        };
        let user_src = read(user_path)?;
        let system_src = system_path.map(read).transpose()?;
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        // The same words in debug and release builds (minijinja's debug
        // mode, on by default in debug builds, rewords undefined errors);
        // `undefined_variable` names the expression from the error's span.
        env.set_debug(false);
        // Prompts are plain text: no HTML escaping of evidence.
        env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
        // `{{ body | tojson }}`: a value as compact JSON (the template of a
        // stage that sends a request body as written).
        env.add_filter("tojson", tojson);
        let mut hasher_input = user_src.clone();
        env.add_template_owned(USER, user_src)
            .map_err(|e| syntax(user_path, &e))?;
        if let (Some(p), Some(src)) = (system_path, system_src) {
            hasher_input.push('\u{0}');
            hasher_input.push_str(&src);
            env.add_template_owned(SYSTEM, src)
                .map_err(|e| syntax(p, &e))?;
        }
        Ok(Self {
            env,
            user_path: user_path.to_path_buf(),
            system_path: system_path.map(Path::to_path_buf),
            hash: docket_model::ids::sha256_hex(hasher_input.as_bytes()),
            last_system: std::sync::Mutex::new(None),
        })
    }

    /// Render for one item. The context has `item` (the evidence object, also
    /// spread at top level for short templates) and `item_id`.
    pub fn render(&self, item_id: &str, evidence: &Value) -> Result<Prompt, TemplateError> {
        self.render_with(item_id, evidence, serde_json::Map::new())
    }

    /// `render` with more context: a later stage's `stages` (the parsed
    /// outputs of the stages before it), a critic's `target`, `criteria`,
    /// a repair prompt's `failed_output` and `gate_error`. These names win
    /// over evidence fields of the same name.
    pub fn render_with(
        &self,
        item_id: &str,
        evidence: &Value,
        extra: serde_json::Map<String, Value>,
    ) -> Result<Prompt, TemplateError> {
        let ctx = context(item_id, evidence, extra);
        let mut user = self.render_one(USER, &self.user_path, item_id, &ctx)?;
        let system = match &self.system_path {
            Some(p) => Some(self.shared_system(self.render_one(SYSTEM, p, item_id, &ctx)?)),
            None => None,
        };
        // A batch holds its prompts until the provider has them: no spare
        // capacity from rendering rides along.
        user.shrink_to_fit();
        Ok(Prompt { system, user })
    }

    /// `rendered`, shared with the last item's system prompt when equal.
    fn shared_system(&self, rendered: String) -> Arc<str> {
        let mut last = self.last_system.lock().unwrap_or_else(|p| p.into_inner());
        match last.as_ref() {
            Some(l) if **l == *rendered => l.clone(),
            _ => {
                let fresh: Arc<str> = Arc::from(rendered);
                *last = Some(fresh.clone());
                fresh
            }
        }
    }

    fn render_one(
        &self,
        name: &str,
        path: &Path,
        item_id: &str,
        ctx: &minijinja::Value,
    ) -> Result<String, TemplateError> {
        let tpl = self.env.get_template(name).map_err(|e| syntax(path, &e))?;
        tpl.render(ctx).map_err(|e| TemplateError::Render {
            path: path.display().to_string(),
            line: e.line().unwrap_or(0),
            detail: undefined_variable(&e, tpl.source()).unwrap_or_else(|| describe(&e)),
            item_id: item_id.to_string(),
        })
    }
}

/// What a template sees: `extra` first, then `item` and `item_id`, then
/// the item's own fields at the top level. The evidence is converted once
/// and shared by `item` and the top level (no copy of it per render).
fn context(
    item_id: &str,
    evidence: &Value,
    extra: serde_json::Map<String, Value>,
) -> minijinja::Value {
    let item = minijinja::Value::from(minijinja::value::Serde(evidence));
    // `merge_maps` looks a name up from its last layer to its first.
    let mut layers = Vec::with_capacity(3);
    if evidence.is_object() {
        layers.push(item.clone());
    }
    layers.push(minijinja::context! { item => item, item_id => item_id });
    if !extra.is_empty() {
        layers.push(minijinja::Value::from(minijinja::value::Serde(&extra)));
    }
    minijinja::value::merge_maps(layers)
}

/// The `tojson` filter: the value as compact JSON.
fn tojson(value: minijinja::Value) -> Result<String, minijinja::Error> {
    serde_json::to_string(&value)
        .map_err(|e| minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, e.to_string()))
}

fn syntax(path: &Path, e: &minijinja::Error) -> TemplateError {
    TemplateError::Syntax {
        path: path.display().to_string(),
        line: e.line().unwrap_or(0),
        detail: describe(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn write(dir: &Path, name: &str, body: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        p
    }

    #[test]
    fn renders_item_fields_without_escaping() {
        let d = tempfile::tempdir().unwrap();
        let p = write(
            d.path(),
            "t.j2",
            "Title: {{ item.title }} <{{ artist }}> id={{ item_id }}",
        );
        let t = PromptTemplate::load(&p, None).unwrap();
        let out = t
            .render("x1", &json!({"title": "A & B", "artist": "Z"}))
            .unwrap();
        assert_eq!(out.user, "Title: A & B <Z> id=x1");
        assert_eq!(out.system, None);
    }

    /// What a template sees, in order: the extras (`stages`, `target`,
    /// `criteria`), then `item` and `item_id`, then the item's own fields;
    /// an item's field never hides the real id, the item or an extra.
    #[test]
    fn extras_then_item_then_its_fields_take_each_name() {
        let d = tempfile::tempdir().unwrap();
        let body =
            "{{ item_id }}|{{ item.title }}|{{ stages.first.ok }}|{{ title }}|{{ item.item_id }}";
        let t = PromptTemplate::load(&write(d.path(), "t.j2", body), None).unwrap();
        let evidence =
            json!({"title": "T", "item_id": "forged", "item": "shadow", "stages": "field"});
        let mut extra = serde_json::Map::new();
        extra.insert("stages".into(), json!({"first": {"ok": "yes"}}));
        let out = t.render_with("x1", &evidence, extra).unwrap();
        assert_eq!(out.user, "x1|T|yes|T|forged");
        // Evidence that is not an object is still the item.
        let list = PromptTemplate::load(
            &write(d.path(), "l.j2", "{{ item[1] }} {{ item_id }}"),
            None,
        )
        .unwrap();
        assert_eq!(list.render("x2", &json!(["a", "b"])).unwrap().user, "b x2");
    }

    /// `tojson`: a value as compact JSON (what a `send_body` stage sends).
    #[test]
    fn tojson_renders_a_value_as_compact_json() {
        let d = tempfile::tempdir().unwrap();
        let t =
            PromptTemplate::load(&write(d.path(), "t.j2", "{{ body | tojson }}"), None).unwrap();
        let body = json!({"model": "m", "messages": [{"role": "user", "content": "a \"q\" <b>"}], "temperature": 0.5, "n": 2});
        let out = t.render("x", &json!({ "body": body })).unwrap();
        assert_eq!(serde_json::from_str::<Value>(&out.user).unwrap(), body);
        assert!(!out.user.contains('\n'), "{}", out.user);
    }

    #[test]
    fn undefined_variable_names_file_line_and_item() {
        let d = tempfile::tempdir().unwrap();
        let p = write(d.path(), "t.j2", "line one\n{{ item.nope }}\n");
        let t = PromptTemplate::load(&p, None).unwrap();
        let err = t
            .render("item-7", &json!({"title": "x"}))
            .unwrap_err()
            .to_string();
        assert!(err.contains("t.j2:2"), "{err}");
        assert!(err.contains("undefined variable \"item.nope\""), "{err}");
        assert!(err.contains("(item \"item-7\")"), "{err}");
        assert!(err.contains("docket items rm item-7"), "{err}");
    }

    #[test]
    fn the_missing_variable_is_named_wherever_it_is_used() {
        let d = tempfile::tempdir().unwrap();
        let p = write(
            d.path(),
            "t.j2",
            "a\nb {{ evidence.title }}\n{% if item.flag %}x{% endif %}\n",
        );
        let t = PromptTemplate::load(&p, None).unwrap();
        let err = t.render("ok 1", &json!({"item_title": "x"})).unwrap_err();
        assert_eq!(
            err.reason(),
            format!("{}:2: undefined variable \"evidence.title\"", p.display())
        );
        // An id that is not one shell word is quoted in the hint.
        assert!(err.to_string().contains("docket items rm 'ok 1'"), "{err}");
        let err = t
            .render("x", &json!({"evidence": {"title": "t"}}))
            .unwrap_err();
        assert!(
            err.reason()
                .ends_with(":3: undefined variable \"item.flag\""),
            "{err}"
        );
    }

    #[test]
    fn syntax_error_and_missing_file_are_named() {
        let d = tempfile::tempdir().unwrap();
        let p = write(d.path(), "bad.j2", "ok\n{% if %}\n");
        let err = PromptTemplate::load(&p, None).err().unwrap().to_string();
        assert!(err.contains("bad.j2:2") && err.contains("syntax"), "{err}");
        let err = PromptTemplate::load(&d.path().join("none.j2"), None)
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("none.j2") && err.contains("cannot be read"),
            "{err}"
        );
    }

    #[test]
    fn hash_changes_with_the_template() {
        let d = tempfile::tempdir().unwrap();
        let a = PromptTemplate::load(&write(d.path(), "a.j2", "A"), None).unwrap();
        let b = PromptTemplate::load(&write(d.path(), "b.j2", "B"), None).unwrap();
        assert_ne!(a.hash, b.hash);
        assert_eq!(a.hash.len(), 64);
    }
}
