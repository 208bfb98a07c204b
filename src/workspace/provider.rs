//! `docket init --provider KIND`: the scaffold's job pointed at a real
//! provider instead of the built-in mock, with the name of the variable
//! that holds its key (the key itself never goes in a file).

/// The providers `init` can point a new job at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RealProvider {
    Openai,
    Anthropic,
    Gemini,
    Openrouter,
    Ollama,
}

impl RealProvider {
    /// `kind` in docket.toml.
    pub fn kind(self) -> &'static str {
        match self {
            RealProvider::Openai => "openai",
            RealProvider::Anthropic => "anthropic",
            RealProvider::Gemini => "gemini",
            RealProvider::Openrouter => "openrouter",
            RealProvider::Ollama => "ollama",
        }
    }

    /// A small, cheap model of that provider, priced in `assets/prices.toml`
    /// where the provider bills by token.
    pub fn model(self) -> &'static str {
        match self {
            RealProvider::Openai => "gpt-4o-mini",
            RealProvider::Anthropic => "claude-haiku-4-5",
            RealProvider::Gemini => "gemini-2.5-flash",
            RealProvider::Openrouter => "openai/gpt-4o-mini",
            RealProvider::Ollama => "llama3.1",
        }
    }

    /// The environment variable docket reads the key from (Ollama needs none).
    pub fn key_env(self) -> Option<&'static str> {
        match self {
            RealProvider::Openai => Some("OPENAI_API_KEY"),
            RealProvider::Anthropic => Some("ANTHROPIC_API_KEY"),
            RealProvider::Gemini => Some("GEMINI_API_KEY"),
            RealProvider::Openrouter => Some("OPENROUTER_API_KEY"),
            RealProvider::Ollama => None,
        }
    }
}

/// `toml` (a scaffold's docket.toml) with every provider of kind "mock"
/// turned into `p`: its kind, model and key variable, and the mock's own
/// settings left out. Comments and everything else stay as written.
pub fn point_at(toml: &str, p: RealProvider) -> String {
    let mut out = String::with_capacity(toml.len());
    let mut in_mock_settings = false;
    let mut model_due = false;
    for line in toml.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('[') {
            in_mock_settings = trimmed.starts_with("[providers.") && trimmed.ends_with(".mock]");
        }
        if in_mock_settings || trimmed.starts_with("# How the built-in mock behaves") {
            continue;
        }
        if trimmed == "kind = \"mock\"" {
            out.push_str(&format!("kind = \"{}\"\n", p.kind()));
            if let Some(env) = p.key_env() {
                out.push_str(&format!(
                    "api_key_env = \"{env}\"   # the variable's name: the key stays in your environment\n"
                ));
            }
            model_due = true;
            continue;
        }
        if model_due && trimmed.starts_with("model = ") {
            out.push_str(&format!("model = \"{}\"\n", p.model()));
            model_due = false;
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}
