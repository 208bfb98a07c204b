//! Where a `--requests` job lives: `FILE.docket/` beside the file, holding
//! the docket.toml made for it (one stage sending each line's body as
//! written), the stage's template and the ledger. The file's sha256 is kept
//! there too: a job is one file's lines, and a changed file is refused
//! rather than mixed with the answers of the old one.

use std::path::{Path, PathBuf};

use docket::config::{LoadedConfig, ProviderConfig};

use super::lines::RequestsFile;
use crate::cli::{RequestsArgs, RequestsMode};

/// The stage's template: the line's body, as JSON.
const TEMPLATE: &str = "{{ body | tojson }}\n";
const TEMPLATE_FILE: &str = "request.j2";
const SHA_FILE: &str = "requests.sha256";
/// The stage's name (in the console, the ledger and exports).
pub const STAGE: &str = "requests";

/// `FILE.docket` beside `file`.
pub fn dir_for(file: &Path) -> PathBuf {
    let mut name = file.file_name().unwrap_or_default().to_os_string();
    name.push(".docket");
    file.with_file_name(name)
}

/// `FILE.results.jsonl` beside `file` (`x.jsonl` -> `x.results.jsonl`).
pub fn default_output(file: &Path) -> PathBuf {
    let stem = match file.extension().and_then(|e| e.to_str()) {
        Some("jsonl") | Some("json") => file.file_stem().unwrap_or_default(),
        _ => file.file_name().unwrap_or_default(),
    };
    let mut name = stem.to_os_string();
    name.push(".results.jsonl");
    file.with_file_name(name)
}

/// A provider of a known kind, outside a workspace: its kind in
/// docket.toml, default model, key variable and base URL.
struct Known {
    kind: &'static str,
    model: &'static str,
    key_env: Option<&'static str>,
    base_url: Option<&'static str>,
}

fn known(name: &str) -> Option<Known> {
    use docket::workspace::RealProvider as Real;
    // The kinds `init --provider` knows keep its model and key variable.
    let real = |p: Real| Known {
        kind: p.kind(),
        model: p.model(),
        key_env: p.key_env(),
        base_url: None,
    };
    Some(match name {
        "openai" => real(Real::Openai),
        "anthropic" => real(Real::Anthropic),
        "gemini" => real(Real::Gemini),
        "openrouter" => real(Real::Openrouter),
        "azure" => Known {
            kind: "azure",
            model: "gpt-4o-mini",
            key_env: Some("AZURE_OPENAI_API_KEY"),
            base_url: None,
        },
        // Ollama's OpenAI-compatible endpoint takes a chat-completions body.
        "ollama" => Known {
            kind: "openai_compatible",
            model: Real::Ollama.model(),
            key_env: None,
            base_url: Some("http://localhost:11434/v1"),
        },
        "mock" => Known {
            kind: "mock",
            model: "gpt-4o-mini",
            key_env: None,
            base_url: None,
        },
        _ => return None,
    })
}

pub const KNOWN: &str = "openai, azure, anthropic, gemini, openrouter, ollama, mock";

/// The `[providers.NAME]` table of the job: from the workspace's docket.toml
/// when it has that provider, else a known kind's.
fn provider_table(
    ws: &Path,
    name: &str,
    args: &RequestsArgs,
    first_model: Option<&str>,
) -> Result<String, String> {
    let model = args.model.as_deref().or(first_model);
    let config = ws.join(docket::config::CONFIG_FILE);
    if config.exists() {
        let loaded = LoadedConfig::load(&config).map_err(|e| e.to_string())?;
        if let Some(p) = loaded.config.providers.get(name) {
            return Ok(from_workspace(name, p, args, model));
        }
        if known(name).is_none() {
            return Err(format!(
                "--provider {name}: no [providers.{name}] in {} and not a provider kind ({KNOWN})",
                config.display()
            ));
        }
    }
    let Some(k) = known(name) else {
        return Err(format!(
            "--provider {name}: not a provider kind ({KNOWN}); inside a workspace, a [providers.NAME] of its docket.toml"
        ));
    };
    let mut t = format!(
        "[providers.{name}]\nkind = \"{}\"\nmodel = {}\n",
        k.kind,
        quoted(model.unwrap_or(k.model))
    );
    if let Some(url) = args.base_url.as_deref().or(k.base_url) {
        t.push_str(&format!("base_url = {}\n", quoted(url)));
    }
    if let Some(var) = k.key_env {
        t.push_str(&format!("api_key_env = \"{var}\"\n"));
    }
    if k.kind == "azure" {
        t.push_str("api_version = \"2024-10-21\"\n");
    }
    Ok(t)
}

/// A workspace's provider, its settings as they are (the model and base
/// URL replaced when the flags say so).
fn from_workspace(
    name: &str,
    p: &ProviderConfig,
    args: &RequestsArgs,
    model: Option<&str>,
) -> String {
    let mut t = format!(
        "[providers.{name}]\nkind = \"{}\"\nmodel = {}\n",
        p.kind.as_str(),
        quoted(model.unwrap_or(&p.model))
    );
    if let Some(url) = args.base_url.as_deref().or(p.base_url.as_deref()) {
        t.push_str(&format!("base_url = {}\n", quoted(url)));
    }
    if let Some(var) = &p.api_key_env {
        t.push_str(&format!("api_key_env = {}\n", quoted(var)));
    }
    if let Some(v) = &p.api_version {
        t.push_str(&format!("api_version = {}\n", quoted(v.get_ref())));
    }
    t.push_str(&format!(
        "requests_per_minute = {}\ntokens_per_minute = {}\nmax_concurrency = {}\n\
         request_timeout_secs = {}\nmax_transport_attempts = {}\n",
        p.requests_per_minute.get_ref(),
        p.tokens_per_minute.get_ref(),
        p.max_concurrency.get_ref(),
        p.request_timeout_secs.get_ref(),
        p.max_transport_attempts.get_ref(),
    ));
    t
}

/// A TOML basic string.
fn quoted(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

/// The largest output a line asks for (its max_completion_tokens or
/// max_tokens), for the limiter's reservation and the worst-case cost.
fn max_output_tokens(file: &RequestsFile) -> u64 {
    file.requests
        .iter()
        .filter_map(|r| super::lines::body_of(&r.evidence))
        .filter_map(|b| {
            b.get("max_completion_tokens")
                .or_else(|| b.get("max_tokens"))
                .and_then(serde_json::Value::as_u64)
        })
        .max()
        .unwrap_or(1024)
}

/// Make (or find again) the job's folder for `file`; Err when it holds
/// another file's job, or cannot be written.
pub(super) fn prepare(
    ws: &Path,
    file: &Path,
    requests: &RequestsFile,
    args: &RequestsArgs,
    provider: &str,
) -> Result<PathBuf, String> {
    let dir = dir_for(file);
    let io = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
    std::fs::create_dir_all(&dir).map_err(|e| io(&dir, e))?;
    let sha_path = dir.join(SHA_FILE);
    match std::fs::read_to_string(&sha_path) {
        Ok(old) if old.trim() != requests.sha256 => {
            return Err(format!(
                "{} holds the job of another version of {} (the file changed since): \
                 remove {} to send the file as it is now, or restore the file to go on with that job",
                dir.display(),
                file.display(),
                dir.display()
            ));
        }
        Ok(_) => {}
        Err(_) => std::fs::write(&sha_path, format!("{}\n", requests.sha256))
            .map_err(|e| io(&sha_path, e))?,
    }
    let first_model = requests
        .requests
        .iter()
        .filter_map(|r| super::lines::body_of(&r.evidence))
        .find_map(|b| b.get("model").and_then(serde_json::Value::as_str));
    let toml = job_toml(ws, file, requests, args, provider, first_model)?;
    let template = dir.join(TEMPLATE_FILE);
    std::fs::write(&template, TEMPLATE).map_err(|e| io(&template, e))?;
    let config = dir.join(docket::config::CONFIG_FILE);
    std::fs::write(&config, toml).map_err(|e| io(&config, e))?;
    Ok(dir)
}

/// The job's docket.toml.
fn job_toml(
    ws: &Path,
    file: &Path,
    requests: &RequestsFile,
    args: &RequestsArgs,
    provider: &str,
    first_model: Option<&str>,
) -> Result<String, String> {
    let mut t = format!(
        "# Made by `docket run --requests {}`: each line's body sent as written.\n\
         # Run the same command again to resume (or, once finished, to write the output again).\n\n\
         [job]\nname = \"requests\"\n\n",
        file.display()
    );
    t.push_str(&provider_table(ws, provider, args, first_model)?);
    let max_tokens = max_output_tokens(requests);
    t.push_str(&format!(
        "\n[[stages]]\nname = \"{STAGE}\"\nprovider = {}\ntemplate = \"{TEMPLATE_FILE}\"\n\
         send_body = true\noverride_model = {}\nmax_tokens = {max_tokens}\nexpected_output_tokens = {}\nmax_attempts = 3\n",
        quoted(provider),
        args.model.is_some(),
        (max_tokens / 4).max(1),
    ));
    if args.mode == RequestsMode::Batch {
        // Every line is there at once: cut as soon as they are all queued.
        t.push_str("\n[stages.batch]\nmode = \"batch\"\nmax_wait_secs = 2.0\n");
        if let Some(secs) = args.poll_interval {
            if !(secs.is_finite() && secs > 0.0) {
                return Err(format!(
                    "--poll-interval {secs}: must be a positive number of seconds"
                ));
            }
            t.push_str(&format!("poll_interval_secs = {secs}\n"));
        }
    }
    t.push_str("\n[stages.gate]\n");
    match &args.schema {
        Some(schema) => {
            let abs =
                std::path::absolute(schema).map_err(|e| format!("{}: {e}", schema.display()))?;
            if !abs.exists() {
                return Err(format!("--schema {}: no such file", schema.display()));
            }
            t.push_str(&format!(
                "kind = \"json_schema\"\nschema = {}\n",
                quoted(&abs.display().to_string())
            ));
        }
        // Any answer passes: the provider's answer is the result.
        None => t.push_str("kind = \"regex\"\npattern = '(?s).*'\n"),
    }
    Ok(t)
}
