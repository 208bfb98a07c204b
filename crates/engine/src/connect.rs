//! The run's connections to its providers (their chat clients, their Batch
//! APIs where docket has one, the in-process mock), and the preflight that
//! checks each before a session exists.

use std::path::Path;
use std::sync::Arc;

use crate::{EngineError, Prepared, Reporter, RunOptions, mock};
use docket_model::config::ProviderKind;

/// Every provider the job's stages use: its chat client, its Batch API
/// (where docket has one), and the in-process mock for `kind = "mock"` (its
/// port is only known once it listens).
pub(crate) struct Connections {
    pub chat: std::collections::HashMap<String, Arc<dyn docket_providers::ChatProvider>>,
    pub batch: std::collections::HashMap<String, Arc<dyn docket_providers::batch::BatchProvider>>,
    pub mocks: Vec<Box<dyn mock::RunningMock>>,
}

pub(crate) async fn connect(
    prepared: &Prepared,
    opts: &RunOptions,
) -> Result<Connections, EngineError> {
    let mut out = Connections {
        chat: Default::default(),
        batch: Default::default(),
        mocks: Vec::new(),
    };
    for stage in &prepared.stages {
        let name = &stage.provider_name;
        if out.chat.contains_key(name) {
            continue;
        }
        let provider_cfg = &prepared.config.config.providers[name];
        let mut base_url = opts.base_url_override.clone();
        if base_url.is_none() && stage.provider_kind == ProviderKind::Mock {
            let start = opts.mock.as_ref().ok_or_else(|| {
                EngineError::Usage(format!(
                    "providers.{name}: kind = \"mock\" needs the built-in mock provider, which this program does not carry"
                ))
            })?;
            let server = start
                .start(provider_cfg.mock.clone().unwrap_or_default())
                .await
                .map_err(|e| {
                    EngineError::Usage(format!("cannot start the built-in mock provider: {e}"))
                })?;
            base_url = Some(server.base_url());
            out.mocks.push(server);
        }
        let chat = docket_providers::build(name, provider_cfg, base_url.as_deref())?;
        out.chat.insert(name.clone(), Arc::from(chat));
        if let Some(b) =
            docket_providers::batch::build_batch(name, provider_cfg, base_url.as_deref())?
        {
            out.batch.insert(name.clone(), Arc::from(b));
        }
    }
    Ok(out)
}

/// Ask each of the job's providers for its models list (see
/// `ChatProvider::preflight`), all at once. A provider that cannot be
/// reached or refuses its key stops the run; so does one whose own list
/// leaves out the configured model (row I4), naming `providers.NAME.model`
/// and the listed names closest to it. A compatible server's list may
/// leave models out: there it is said, and the run goes on.
pub(crate) async fn preflight(
    prepared: &Prepared,
    connections: &Connections,
    reporter: &dyn Reporter,
) -> Result<(), EngineError> {
    let checks = connections
        .chat
        .iter()
        .map(|(name, chat)| async move { (name, chat.preflight().await) });
    for (name, result) in futures::future::join_all(checks).await {
        let cfg = &prepared.config.config.providers[name];
        let place = cfg
            .base_url
            .as_deref()
            .or(cfg.kind.default_base_url())
            .map(|u| format!(" at {}", docket_model::sanitize::for_terminal(u)))
            .unwrap_or_default();
        let provider = format!("provider {name} (kind = \"{}\"){place}", cfg.kind.as_str());
        let listed = match result {
            Ok(listed) => listed,
            Err(e) => {
                let what = if e.class == docket_providers::ErrorClass::Auth {
                    "refused its key"
                } else {
                    "could not be reached"
                };
                return Err(EngineError::Preflight(format!(
                    "{provider} {what}: {e}. Nothing was created or sent. \
                     Check providers.{name} in docket.toml (base_url, api_key_env) and the network, \
                     or skip this check with --no-preflight"
                )));
            }
        };
        // An empty list names nothing to compare with.
        let Some(listed) = listed.filter(|l| !l.is_empty()) else {
            continue;
        };
        check_model_listed(prepared, name, &provider, &listed, reporter)?;
    }
    Ok(())
}

/// The provider's models list against the model the job asks of it: not
/// named, the run stops (or only warns, where the list is but indicative).
fn check_model_listed(
    prepared: &Prepared,
    name: &str,
    provider: &str,
    listed: &[String],
    reporter: &dyn Reporter,
) -> Result<(), EngineError> {
    use docket_providers::models::{self, ListSays};
    let cfg = &prepared.config.config.providers[name];
    let mock_serves_a_set = cfg
        .mock
        .as_ref()
        .is_some_and(|m| !m.models.trim().is_empty());
    let says = models::list_says(cfg.kind, mock_serves_a_set);
    if says == ListSays::Unchecked || models::listed(cfg.kind, &cfg.model, listed) {
        return Ok(());
    }
    let shown = |id: &str| {
        let id: String = docket_model::sanitize::for_terminal(id)
            .chars()
            .take(80)
            .collect();
        format!("\"{id}\"")
    };
    let close = models::close_to(&cfg.model, listed, 3);
    let hint = if close.is_empty() {
        let some: Vec<String> = listed.iter().take(5).map(|id| shown(id)).collect();
        format!("; it lists, among others, {}", some.join(", "))
    } else {
        let close: Vec<String> = close.into_iter().map(shown).collect();
        format!("; closest listed: {}", close.join(", "))
    };
    let model = shown(&cfg.model);
    let count = listed.len();
    let models_word = if count == 1 { "model" } else { "models" };
    if says == ListSays::Indicative {
        let warning = format!(
            "Warning: {provider} does not list model {model} among its {count} {models_word}{hint}. \
             Going on: a compatible server's list may leave out models it serves; if it refuses \
             them, the session pauses before any spend"
        );
        tracing::warn!("{warning}");
        reporter.line(&warning);
        return Ok(());
    }
    let key = format!("providers.{name}.model");
    let at = match model_line(&prepared.config.path, name) {
        Some(line) => format!("{}:{line}: {key}: ", prepared.config.path.display()),
        None => format!("{}: {key}: ", prepared.config.path.display()),
    };
    // A proxy or gateway behind `kind = "openai"` may list less than
    // it routes: say how to go on without the check.
    let proxy = match cfg.base_url.as_deref() {
        Some(url) if cfg.kind.default_base_url() != Some(url) => format!(
            " (if {} is a proxy or gateway whose list leaves out models it routes, set kind = \"openai_compatible\": \
             its list is then only a warning)",
            docket_model::sanitize::for_terminal(url)
        ),
        _ => String::new(),
    };
    Err(EngineError::Preflight(format!(
        "{at}{provider} does not serve model {model}: its models list ({count} {models_word}) \
         does not name it{hint}. Nothing was created or sent. Fix {key} in docket.toml, \
         or skip this check with --no-preflight{proxy}"
    )))
}

/// The line of `providers.NAME.model` in the config file, read again for
/// its position (the loaded config keeps none for it).
fn model_line(path: &Path, provider: &str) -> Option<usize> {
    #[derive(serde::Deserialize)]
    struct Doc {
        #[serde(default)]
        providers: std::collections::BTreeMap<String, Provider>,
    }
    #[derive(serde::Deserialize)]
    struct Provider {
        model: toml::Spanned<String>,
    }
    let text = std::fs::read_to_string(path).ok()?;
    let doc: Doc = toml::from_str(&text).ok()?;
    let start = doc.providers.get(provider)?.model.span().start;
    Some(text.get(..start)?.matches('\n').count() + 1)
}
