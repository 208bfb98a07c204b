//! The correction form: instead of accepting or rejecting a suggestion, the
//! operator picks another of the evidence's candidates (its naming fields
//! fill the answer) or edits the answer's fields, then accepts that answer.
//! The ledger records it as an accept with the fields that changed
//! (`ReviewDecisions::correct`), and undo takes it back.

use ratatui::crossterm::event::{Event as TermEvent, KeyCode, KeyEvent};
use serde_json::{Map, Value};
use tui_input::Input;
use tui_input::backend::crossterm::EventHandler;

use super::{App, Effect, Overlay};
use docket_ledger::watch::ReviewDetail;

/// One editable field of the answer.
#[derive(Debug, Clone)]
pub struct FormField {
    pub key: String,
    pub input: Input,
    /// What the suggestion's value was; the edit must stay one (a number
    /// typed as "abc" would otherwise reach the exports as text, and fail
    /// the job's own parser on the next read).
    kind: FieldKind,
}

/// The JSON type an edited field keeps.
#[derive(Debug, Clone, Copy, PartialEq)]
enum FieldKind {
    Text,
    Number,
    Flag,
    /// The suggestion had null: any JSON value, else text.
    Any,
}

impl FieldKind {
    fn of(v: &Value) -> Self {
        match v {
            Value::String(_) => FieldKind::Text,
            Value::Number(_) => FieldKind::Number,
            Value::Bool(_) => FieldKind::Flag,
            _ => FieldKind::Any,
        }
    }

    /// The edit `v` as this kind's JSON value, or why it is not one.
    fn read(self, v: &str) -> Result<Value, &'static str> {
        let parsed = serde_json::from_str::<Value>(v.trim());
        match self {
            FieldKind::Text => Ok(Value::String(v.to_string())),
            FieldKind::Number => parsed
                .ok()
                .filter(Value::is_number)
                .ok_or("is not a number"),
            FieldKind::Flag => parsed
                .ok()
                .filter(Value::is_boolean)
                .ok_or("is not true or false"),
            FieldKind::Any => Ok(parsed.unwrap_or_else(|_| Value::String(v.to_string()))),
        }
    }
}

/// The form's state: the answer being built and where the cursor is.
#[derive(Debug, Clone)]
pub struct CorrectionForm {
    pub review_id: i64,
    pub item_id: String,
    /// The evidence's candidates (the list the suggestion picks from).
    pub candidates: Vec<Value>,
    /// The candidate now picked (None: the answer's own values).
    pub candidate: Option<usize>,
    pub fields: Vec<FormField>,
    /// Answer fields the form does not edit (lists, objects): kept as they are.
    fixed: Map<String, Value>,
    /// The row under the cursor: 0 is the candidate row when there are
    /// candidates, then one row per field.
    pub row: usize,
}

impl CorrectionForm {
    /// The form for a review item's card; `None` when its suggestion is not
    /// a JSON object (nothing to edit field by field).
    pub fn new(d: &ReviewDetail) -> Option<Self> {
        let evidence: Value = serde_json::from_str(&d.evidence_json).unwrap_or(Value::Null);
        let answer: Value = serde_json::from_str(&d.suggestion_json).ok()?;
        let Value::Object(map) = &answer else {
            return None;
        };
        let chosen = docket_model::review_card::chosen_candidate(&evidence, &answer);
        let candidates = chosen
            .as_ref()
            .and_then(|c| evidence.get(c.list))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let mut fields = Vec::new();
        let mut fixed = Map::new();
        for (k, v) in map {
            match v {
                Value::Array(_) | Value::Object(_) => {
                    fixed.insert(k.clone(), v.clone());
                }
                _ => fields.push(FormField {
                    key: k.clone(),
                    input: Input::new(docket_model::review_card::scalar_text(v)),
                    kind: FieldKind::of(v),
                }),
            }
        }
        Some(CorrectionForm {
            review_id: d.review_id,
            item_id: d.item_id.clone(),
            candidate: chosen.map(|c| c.index),
            candidates,
            fields,
            fixed,
            row: 0,
        })
    }

    fn rows(&self) -> usize {
        self.fields.len() + usize::from(!self.candidates.is_empty())
    }

    /// The field under the cursor, when the cursor is on one.
    fn field_mut(&mut self) -> Option<&mut FormField> {
        let skip = usize::from(!self.candidates.is_empty());
        let i = self.row.checked_sub(skip)?;
        self.fields.get_mut(i)
    }

    /// Whether the cursor is on the candidate row.
    pub fn on_candidates(&self) -> bool {
        !self.candidates.is_empty() && self.row == 0
    }

    /// Pick the next (`step` 1) or previous (-1) candidate: every answer
    /// field the candidate also has takes the candidate's value.
    fn pick(&mut self, step: isize) {
        let n = self.candidates.len();
        if n == 0 {
            return;
        }
        let next = match self.candidate {
            Some(i) => (i as isize + step).rem_euclid(n as isize) as usize,
            None => 0,
        };
        self.candidate = Some(next);
        let Some(Value::Object(c)) = self.candidates.get(next) else {
            return;
        };
        for f in &mut self.fields {
            if let Some(v) = c.get(&f.key) {
                f.input = Input::new(docket_model::review_card::scalar_text(v));
            }
        }
    }

    /// The answer as the form holds it, or the first field whose edit is
    /// not of its kind (its index and what is wrong).
    pub fn answer(&self) -> Result<Value, (usize, String)> {
        let mut out = Map::new();
        for (i, f) in self.fields.iter().enumerate() {
            let v = f.input.value();
            let value = f
                .kind
                .read(v)
                .map_err(|why| (i, format!("{}: {v:?} {why}", f.key)))?;
            out.insert(f.key.clone(), value);
        }
        out.extend(self.fixed.clone());
        Ok(Value::Object(out))
    }
}

impl App {
    /// Open the correction form on the item under the cursor (its card must
    /// be loaded: the form starts from its suggestion and evidence).
    pub(crate) fn open_correction(&mut self) -> Vec<Effect> {
        if self.read_only {
            self.set_toast("Read-only console: decisions are off.");
            return Vec::new();
        }
        let Some(row) = self.cursor_row() else {
            return Vec::new();
        };
        if let Some(who) = self.held_by_other(row.claimed_by.as_deref()) {
            let msg = format!("{} is held by {who}", row.item_id);
            self.set_toast(msg);
            return Vec::new();
        }
        let card = self
            .snap
            .detail
            .as_ref()
            .filter(|d| d.review_id == row.review_id);
        match card.map(CorrectionForm::new) {
            Some(Some(form)) => self.overlay = Overlay::Correct(Box::new(form)),
            Some(None) => self.set_toast("This suggestion has no fields to correct."),
            None => {
                // The form starts from the card: open it, and ask again.
                self.overlay = Overlay::Detail { scroll: 0 };
                self.detail_wanted = None;
                self.set_toast("Loading the card: press the correct key again.");
                return self.after_cursor_move();
            }
        }
        Vec::new()
    }

    /// A key in the correction form: Up/Down (Tab) move between rows,
    /// Left/Right pick a candidate on its row, Enter accepts the corrected
    /// answer, Esc leaves it unchanged; anything else edits the field.
    pub(crate) fn handle_correction_key(&mut self, key: KeyEvent) -> Vec<Effect> {
        let Overlay::Correct(form) = &mut self.overlay else {
            return Vec::new();
        };
        let rows = form.rows().max(1);
        match key.code {
            KeyCode::Esc => {
                self.overlay = Overlay::Detail { scroll: 0 };
                self.set_toast("Not corrected.");
            }
            KeyCode::Enter => {
                let answer = match form.answer() {
                    Ok(answer) => answer,
                    Err((field, why)) => {
                        // The form stays open on the field to fix.
                        form.row = field + usize::from(!form.candidates.is_empty());
                        self.set_toast(format!("Not corrected: {why}."));
                        return Vec::new();
                    }
                };
                let review_id = form.review_id;
                self.overlay = Overlay::None;
                let mut fx = vec![Effect::Correct { review_id, answer }];
                fx.extend(self.move_review_cursor(1));
                return fx;
            }
            KeyCode::Down | KeyCode::Tab => form.row = (form.row + 1) % rows,
            KeyCode::Up | KeyCode::BackTab => form.row = (form.row + rows - 1) % rows,
            KeyCode::Left if form.on_candidates() => form.pick(-1),
            KeyCode::Right if form.on_candidates() => form.pick(1),
            _ => {
                if let Some(f) = form.field_mut() {
                    f.input.handle_event(&TermEvent::Key(key));
                }
            }
        }
        Vec::new()
    }
}
