//! Whether a provider's models list names the configured model (the
//! preflight's check, fault-matrix row I4), each provider's way of naming
//! them taken into account, and the listed names closest to a model that
//! is not there (a typo's likely fix).

use docket_model::config::ProviderKind;

/// How much a kind's models list says about a model it leaves out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListSays {
    /// The provider's own list of what the key may call (OpenAI, Anthropic,
    /// Gemini, Ollama, the built-in mock serving a set of models): a model
    /// it leaves out will be refused, so the run is stopped before it
    /// starts.
    Authoritative,
    /// A compatible server or gateway, whose list may leave out models it
    /// routes (wildcards, aliases): said, and the run goes on (a model it
    /// really does not serve pauses the session at its first refusals).
    Indicative,
    /// Nothing to check against (OpenRouter: the preflight asks for the
    /// key; Azure: `model` is a deployment's name; the mock serving any
    /// model).
    Unchecked,
}

/// What a models list of `kind` says; `mock_serves_a_set`: the built-in
/// mock was told which models it serves (else it serves any).
pub fn list_says(kind: ProviderKind, mock_serves_a_set: bool) -> ListSays {
    match kind {
        ProviderKind::Openai
        | ProviderKind::Anthropic
        | ProviderKind::Gemini
        | ProviderKind::Ollama => ListSays::Authoritative,
        ProviderKind::Mock if mock_serves_a_set => ListSays::Authoritative,
        ProviderKind::OpenaiCompatible => ListSays::Indicative,
        ProviderKind::Mock | ProviderKind::Openrouter | ProviderKind::Azure => ListSays::Unchecked,
    }
}

/// Whether `listed` (the ids a `kind` provider's list gave) names `model`
/// as the provider would take it: Gemini's `models/` prefix, Ollama's
/// implicit `:latest` tag, Anthropic's aliases (`claude-sonnet-4-0`,
/// `claude-3-5-sonnet-latest`, `claude-opus-4-1`: the list has only the
/// dated ids they stand for). Lenient on purpose: a model let through here
/// and refused later pauses the session before any spend; one refused here
/// wrongly would stop a good run.
pub fn listed(kind: ProviderKind, model: &str, listed: &[String]) -> bool {
    let model = model.trim();
    if listed.iter().any(|id| id == model) {
        return true;
    }
    match kind {
        ProviderKind::Gemini => {
            let m = model.strip_prefix("models/").unwrap_or(model);
            // A tuned model is not in the base models' list.
            m.starts_with("tunedModels/") || listed.iter().any(|id| id == m)
        }
        ProviderKind::Ollama => {
            let m = ollama_tagged(model);
            listed
                .iter()
                .any(|id| ollama_tagged(id).eq_ignore_ascii_case(&m))
        }
        ProviderKind::Anthropic => {
            let mut stems = vec![model];
            stems.extend(model.strip_suffix("-latest"));
            stems.extend(model.strip_suffix("-0"));
            listed.iter().any(|id| {
                stems.iter().any(|stem| {
                    id.strip_prefix(stem)
                        .and_then(|rest| rest.strip_prefix('-'))
                        .is_some_and(|date| {
                            date.len() == 8 && date.bytes().all(|b| b.is_ascii_digit())
                        })
                })
            })
        }
        _ => false,
    }
}

/// `llama3.2` -> `llama3.2:latest`; a name with a tag stays as it is.
fn ollama_tagged(name: &str) -> String {
    let last = name.rsplit('/').next().unwrap_or(name);
    if last.contains(':') {
        name.to_string()
    } else {
        format!("{name}:latest")
    }
}

/// Up to `n` listed ids closest to `model` (edit distance, case ignored),
/// nearest first; only those near enough to be a likely fix.
pub fn close_to<'a>(model: &str, listed: &'a [String], n: usize) -> Vec<&'a str> {
    let want = model.to_ascii_lowercase();
    let near = want.chars().count() / 4 + 1;
    let mut scored: Vec<(usize, &str)> = listed
        .iter()
        .map(|id| {
            let have = id.to_ascii_lowercase();
            // Against the id as listed and as it is usually written (an
            // Anthropic id without its date, an Ollama tag without
            // `:latest`).
            let d = distance(&want, &have).min(distance(&want, bare(&have)));
            // A name that holds the other whole (a dated snapshot of it,
            // or its family's name) is close whatever its length.
            let d = if have.contains(&want) || want.contains(&have) {
                d.min(near)
            } else {
                d
            };
            (d, id.as_str())
        })
        .filter(|(d, _)| *d <= near)
        .collect();
    scored.sort();
    scored.dedup_by(|a, b| a.1 == b.1);
    scored.into_iter().take(n).map(|(_, id)| id).collect()
}

/// `id` without a trailing `-YYYYMMDD` or `:latest`.
fn bare(id: &str) -> &str {
    if let Some(name) = id.strip_suffix(":latest") {
        return name;
    }
    match id.rsplit_once('-') {
        Some((name, date)) if date.len() == 8 && date.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => id,
    }
}

/// Levenshtein distance over chars (names are short).
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let here = row[j + 1];
            row[j + 1] = if ca == *cb {
                prev
            } else {
                1 + prev.min(row[j]).min(here)
            };
            prev = here;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn each_provider_names_its_models_its_own_way() {
        use ProviderKind::*;
        let openai = ids(&["gpt-4o-mini", "gpt-4o", "gpt-4.1-mini"]);
        assert!(listed(Openai, "gpt-4o-mini", &openai));
        assert!(!listed(Openai, "gpt-4o-mni", &openai));
        assert!(!listed(Openai, "gpt-4", &openai), "no prefix match");
        let gemini = ids(&["gemini-2.5-flash", "gemini-2.5-pro"]);
        assert!(listed(Gemini, "models/gemini-2.5-flash", &gemini));
        assert!(listed(Gemini, "gemini-2.5-pro", &gemini));
        assert!(listed(Gemini, "tunedModels/mine-123", &gemini));
        assert!(!listed(Gemini, "gemini-2.5-flesh", &gemini));
        let ollama = ids(&["llama3.2:latest", "qwen2.5:7b"]);
        assert!(listed(Ollama, "llama3.2", &ollama));
        assert!(listed(Ollama, "llama3.2:latest", &ollama));
        assert!(listed(Ollama, "qwen2.5:7b", &ollama));
        assert!(
            !listed(Ollama, "qwen2.5", &ollama),
            "qwen2.5:latest is not there"
        );
        let anthropic = ids(&[
            "claude-sonnet-4-20250514",
            "claude-opus-4-1-20250805",
            "claude-3-5-sonnet-20241022",
            "claude-haiku-4-5-20251001",
        ]);
        for alias in [
            "claude-sonnet-4-0",
            "claude-opus-4-1",
            "claude-3-5-sonnet-latest",
            "claude-haiku-4-5",
            "claude-sonnet-4-20250514",
        ] {
            assert!(listed(Anthropic, alias, &anthropic), "{alias}");
        }
        assert!(!listed(Anthropic, "claude-sonet-4-0", &anthropic));
        assert!(
            !listed(Anthropic, "claude-opus-4", &anthropic),
            "not a family name"
        );
    }

    #[test]
    fn close_names_are_the_likely_fixes() {
        let list = ids(&[
            "gpt-4o-mini",
            "gpt-4o",
            "gpt-4.1-mini",
            "mock-1",
            "text-embedding-3-small",
        ]);
        assert_eq!(
            close_to("gpt-4o-mni", &list, 3),
            ["gpt-4o-mini", "gpt-4.1-mini", "gpt-4o"]
        );
        assert_eq!(close_to("GPT-4O-MINI", &list, 1), ["gpt-4o-mini"]);
        assert!(close_to("claude-haiku", &list, 3).is_empty());
        let dated = ids(&["claude-haiku-4-5-20251001", "claude-opus-4-1-20250805"]);
        assert_eq!(
            close_to("claude-haiku-4-6", &dated, 3),
            ["claude-haiku-4-5-20251001"]
        );
        let tags = ids(&["llama3.2:latest", "qwen2.5:7b"]);
        assert_eq!(close_to("llama3.3", &tags, 3), ["llama3.2:latest"]);
        assert_eq!(distance("kitten", "sitting"), 3);
    }

    #[test]
    fn what_a_list_says_depends_on_the_kind() {
        use ProviderKind::*;
        assert_eq!(list_says(Openai, false), ListSays::Authoritative);
        assert_eq!(list_says(OpenaiCompatible, true), ListSays::Indicative);
        assert_eq!(list_says(Mock, true), ListSays::Authoritative);
        assert_eq!(list_says(Mock, false), ListSays::Unchecked);
        assert_eq!(list_says(Azure, false), ListSays::Unchecked);
        assert_eq!(list_says(Openrouter, false), ListSays::Unchecked);
    }
}
