//! The workspace job's `[review]` templates, read as the console opens:
//! the queue's summary line and the review card (crates/model/src/review_card.rs).

use crate::app::App;

/// The workspace job's `[review]` templates for the queue and the cards.
/// A workspace without a docket.toml has none; a docket.toml that does not
/// load is the returned warning (the cards then show plain fields).
pub(crate) fn load(app: &mut App, workspace: &std::path::Path) -> Option<String> {
    use docket_model::config::{CONFIG_FILE, LoadedConfig};
    use docket_model::review_card::ReviewTemplates;
    let path = workspace.join(CONFIG_FILE);
    if !path.exists() {
        return None;
    }
    let loaded = match LoadedConfig::load(&path) {
        Ok(l) => l,
        Err(e) => return Some(format!("review cards without [review]: {e}")),
    };
    match ReviewTemplates::compile(&loaded.config.review) {
        Ok(t) if !loaded.config.review.is_empty() => {
            app.review_templates = Some(std::sync::Arc::new(t));
            None
        }
        Ok(_) => None,
        Err(e) => Some(format!("review cards without [review]: {e}")),
    }
}
