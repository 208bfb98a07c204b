use super::toml_error::key_parts;
use super::*;

/// The `[routing]` audit shares and `[job] completion_mode`.
mod routing_and_job;

const BASE: &str = r#"
[providers.p]
kind = "openai"
model = "gpt-4o-mini"

[[stages]]
name = "s"
provider = "p"
template = "t.j2"

[stages.gate]
kind = "regex"
pattern = "(?P<confidence>[0-9.]+)"
"#;

fn parse(text: &str) -> Result<LoadedConfig, ConfigError> {
    LoadedConfig::parse(Path::new("ws/docket.toml"), text.to_string())
}

#[test]
fn a_minimal_config_takes_defaults() {
    let c = parse(BASE).unwrap();
    assert_eq!(*c.config.routing.auto_accept_threshold.get_ref(), 0.85);
    assert_eq!(*c.config.providers["p"].requests_per_minute.get_ref(), 500);
    assert_eq!(c.resolve(Path::new("t.j2")), Path::new("ws/t.j2"));
}

#[test]
fn unknown_keys_name_the_line_and_key() {
    let text = BASE.replace(
        "model = \"gpt-4o-mini\"",
        "model = \"gpt-4o-mini\"\nrate = 3",
    );
    let e = parse(&text).err().unwrap().to_string();
    assert!(e.starts_with("ws/docket.toml:5:"), "{e}");
    assert!(e.contains("rate"), "{e}");
    let e = parse(&format!("{BASE}\n[routing]\nauto_accept = 0.9\n"))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("auto_accept") && e.contains("docket.toml:16:"),
        "{e}"
    );
}

#[test]
fn wrong_types_and_ranges_name_the_key() {
    let e = parse(&BASE.replace(
        "model = \"gpt-4o-mini\"",
        "model = \"m\"\nmax_concurrency = -1",
    ))
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("docket.toml:5"), "{e}");
    let e = parse(&format!(
        "{BASE}\n[routing]\nreview_threshold = 0.9\nauto_accept_threshold = 0.8\n"
    ))
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("routing.review_threshold") && e.contains("above"),
        "{e}"
    );
    let e = parse(&BASE.replace(
        "template = \"t.j2\"",
        "template = \"t.j2\"\ntemperature = 3.0",
    ))
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("stages[0].temperature") && e.contains(":10:"),
        "{e}"
    );
}

#[test]
fn references_and_key_names_are_checked() {
    let e = parse(&BASE.replace("provider = \"p\"", "provider = \"q\""))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("no provider named \"q\""), "{e}");
    for bad in ["sk-live-abc", "gsk_abcDEF123", "1KEY", ""] {
        let text = BASE.replace(
            "model = \"gpt-4o-mini\"",
            &format!("model = \"m\"\napi_key_env = \"{bad}\""),
        );
        let e = parse(&text).err().unwrap().to_string();
        assert!(
            e.contains("api_key_env") && e.contains("not an environment variable name"),
            "{e}"
        );
        assert!(
            bad.len() < 5 || !e.contains(bad),
            "the would-be key is not echoed: {e}"
        );
    }
    let ok = BASE.replace(
        "model = \"gpt-4o-mini\"",
        "model = \"m\"\napi_key_env = \"OPENAI_API_KEY\"",
    );
    assert!(parse(&ok).is_ok());
    let e = parse(&BASE.replace("kind = \"openai\"", "kind = \"nope\""))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("nope"), "{e}");
    let two = format!(
        "{BASE}\n[[stages]]\nname = \"critic\"\nprovider = \"p\"\ntemplate = \"c.j2\"\n[stages.gate]\nkind = \"regex\"\npattern = \"(?P<confidence>.)\"\n"
    );
    assert!(parse(&two).is_ok(), "two stages are a pipeline");
    // A critic must judge an earlier stage that exists.
    let bad = two.replace(
        "name = \"critic\"\n",
        "name = \"critic\"\ncritic_of = \"nowhere\"\n",
    );
    let e = parse(&bad).err().unwrap().to_string();
    assert!(e.contains("critic_of") && e.contains("nowhere"), "{e}");
    let later = two.replace(
        "name = \"critic\"\n",
        "name = \"critic\"\ncritic_of = \"critic\"\n",
    );
    let e = parse(&later).err().unwrap().to_string();
    assert!(e.contains("does not come before"), "{e}");
    // A repair prompt needs its count, and leaves an attempt for itself.
    let repair = two.replace(
        "name = \"critic\"\n",
        "name = \"critic\"\nrepair_template = \"r.j2\"\n",
    );
    let e = parse(&repair).err().unwrap().to_string();
    assert!(e.contains("repair_after"), "{e}");
    let repair = two.replace(
        "name = \"critic\"\n",
        "name = \"critic\"\nrepair_template = \"r.j2\"\nrepair_after = 3\n",
    );
    let e = parse(&repair).err().unwrap().to_string();
    assert!(e.contains("leaves no attempt"), "{e}");
    let first_waits = BASE.replace("[stages.gate]", "wait_for_previous = true\n[stages.gate]");
    if first_waits != BASE {
        let e = parse(&first_waits).err().unwrap().to_string();
        assert!(e.contains("no previous stage"), "{e}");
    }
}

/// Settings that would do nothing are named, with their line: the
/// mock's section under a real provider (left behind after switching
/// `kind`), and a base_url for the built-in mock.
#[test]
fn settings_with_no_effect_are_named() {
    let text = BASE.to_string() + "\n[providers.p.mock]\nlatency_median_ms = 5.0\n";
    let e = parse(&text).unwrap_err().to_string();
    let line = text
        .lines()
        .position(|l| l == "[providers.p.mock]")
        .unwrap()
        + 1;
    assert!(
        e.contains("providers.p.mock")
            && e.contains("kind = \"openai\"")
            && e.contains(&format!(":{line}")),
        "{e}"
    );
    let text = BASE.replace(
        "kind = \"openai\"",
        "kind = \"mock\"\nbase_url = \"http://x\"",
    );
    let e = parse(&text).unwrap_err().to_string();
    assert!(
        e.contains("providers.p.base_url") && e.contains("no effect"),
        "{e}"
    );
}

#[test]
fn mock_settings_are_strict_too() {
    let text = BASE.replace("kind = \"openai\"", "kind = \"mock\"")
        + "\n[providers.p.mock]\nlatency_median_ms = 5.0\nlatencyy = 1\n";
    let e = parse(&text).err().unwrap().to_string();
    assert!(e.contains("latencyy"), "{e}");
}

fn provider(kind: &str, lines: &str) -> String {
    BASE.replace(
        "kind = \"openai\"\nmodel = \"gpt-4o-mini\"",
        &format!("kind = \"{kind}\"\nmodel = \"m\"{lines}"),
    )
}

#[test]
fn credentials_in_base_url_are_refused() {
    let e = parse(&BASE.replace(
        "kind = \"openai\"",
        "kind = \"openai\"\nbase_url = \"https://me:secret@proxy.example/v1\"",
    ))
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("providers.p.base_url")
            && e.contains("user or password")
            && !e.contains("secret"),
        "{e}"
    );
}

#[test]
fn azure_needs_api_version_and_base_url() {
    // The provider table starts on line 2.
    let e = parse(&provider(
        "azure",
        "\nbase_url = \"https://r.openai.azure.com\"\napi_key_env = \"AZURE_OPENAI_API_KEY\"",
    ))
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("ws/docket.toml:2:")
            && e.contains("providers.p.api_version")
            && e.contains("required"),
        "{e}"
    );
    let e = parse(&provider(
        "azure",
        "\napi_version = \"2024-10-21\"\napi_key_env = \"AZURE_OPENAI_API_KEY\"",
    ))
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("ws/docket.toml:2:")
            && e.contains("providers.p.base_url")
            && e.contains("RESOURCE.openai.azure.com"),
        "{e}"
    );
    let ok = parse(&provider(
        "azure",
        "\nbase_url = \"https://r.openai.azure.com\"\napi_version = \"2024-10-21\"\napi_key_env = \"AZURE_OPENAI_API_KEY\"",
    ))
    .unwrap();
    let p = &ok.config.providers["p"];
    assert_eq!(p.kind, ProviderKind::Azure);
    assert_eq!(p.api_version.as_ref().unwrap().get_ref(), "2024-10-21");
    let e = parse(&provider(
        "azure",
        "\nbase_url = \"https://r.openai.azure.com\"\napi_version = \"2024-10-21\"",
    ))
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("providers.p.api_key_env") && e.contains("\"p\""),
        "{e}"
    );
}

#[test]
fn api_version_is_only_for_azure() {
    let e = parse(&provider(
        "openai",
        "\napi_key_env = \"OPENAI_API_KEY\"\napi_version = \"2024-10-21\"",
    ))
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("ws/docket.toml:6:")
            && e.contains("providers.p.api_version")
            && e.contains("only for kind = \"azure\""),
        "{e}"
    );
}

#[test]
fn keyed_kinds_need_api_key_env_and_ollama_does_not() {
    for kind in ["anthropic", "gemini", "openrouter"] {
        let e = parse(&provider(kind, "")).err().unwrap().to_string();
        assert!(
            e.contains("ws/docket.toml:2:")
                && e.contains("providers.p.api_key_env")
                && e.contains(&format!("kind = \"{kind}\""))
                && e.contains("provider \"p\""),
            "{e}"
        );
        let var = format!("{}_API_KEY", kind.to_uppercase());
        assert!(parse(&provider(kind, &format!("\napi_key_env = \"{var}\""))).is_ok());
    }
    let c = parse(&provider("ollama", "")).unwrap();
    assert_eq!(c.config.providers["p"].kind, ProviderKind::Ollama);
    assert!(parse(&provider("mock", "")).is_ok());
    assert!(parse(&provider("openai", "")).is_ok());
    let e = parse(&provider("ollama", "\nbase_url = \"localhost:11434\""))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("not an http:// or https:// URL"), "{e}");
}

#[test]
fn default_base_urls_per_kind() {
    use ProviderKind::*;
    assert_eq!(Openai.default_base_url(), Some("https://api.openai.com/v1"));
    assert_eq!(
        Anthropic.default_base_url(),
        Some("https://api.anthropic.com")
    );
    assert_eq!(
        Gemini.default_base_url(),
        Some("https://generativelanguage.googleapis.com")
    );
    assert_eq!(Ollama.default_base_url(), Some("http://localhost:11434"));
    assert_eq!(
        Openrouter.default_base_url(),
        Some("https://openrouter.ai/api/v1")
    );
    assert_eq!(Azure.default_base_url(), None);
    assert_eq!(OpenaiCompatible.default_base_url(), None);
}

#[test]
fn anthropic_temperature_is_at_most_one() {
    let text = provider("anthropic", "\napi_key_env = \"ANTHROPIC_API_KEY\"").replace(
        "template = \"t.j2\"",
        "template = \"t.j2\"\ntemperature = 1.5",
    );
    let e = parse(&text).err().unwrap().to_string();
    assert!(
        e.contains("stages[0].temperature") && e.contains("0 to 1"),
        "{e}"
    );
}

/// `thinking_budget` is Gemini's (-1 to 32768), `structured_output`
/// other than auto is Anthropic's: elsewhere they would do nothing.
#[test]
fn provider_parameters_belong_to_their_kind() {
    let stage = |kind: &str, line: &str| {
        provider(kind, "\napi_key_env = \"K\"").replace(
            "template = \"t.j2\"",
            &format!("template = \"t.j2\"\n{line}"),
        )
    };
    let c = parse(&stage("gemini", "thinking_budget = -1")).unwrap();
    assert_eq!(
        c.config.stages[0]
            .thinking_budget
            .as_ref()
            .map(|b| *b.get_ref()),
        Some(-1)
    );
    let c = parse(&stage("anthropic", "structured_output = \"prompt\"")).unwrap();
    assert_eq!(
        c.config.stages[0].structured_output,
        StructuredOutput::Prompt
    );
    for (text, want) in [
        (stage("gemini", "thinking_budget = 40000"), "out of range"),
        (stage("gemini", "thinking_budget = -2"), "out of range"),
        (stage("anthropic", "thinking_budget = 512"), "only a gemini"),
        (
            stage("gemini", "structured_output = \"native\""),
            "only an anthropic",
        ),
        (
            stage("anthropic", "structured_output = \"always\""),
            "structured_output",
        ),
    ] {
        let e = parse(&text).err().unwrap().to_string();
        assert!(e.contains("stages[0].") && e.contains(want), "{want}: {e}");
    }
}

/// Row I4: an error toml reports (a wrong type, a negative count, an
/// unknown key or table) names the key's whole path, not only its line.
#[test]
fn parse_errors_name_the_whole_key_path() {
    let two_stages = format!(
        "{BASE}\n[[stages]]\nname = \"t\"\nprovider = \"p\"\ntemplate = \"t.j2\"\n\n[stages.gate]\nkind = \"regex\"\npattern = \"x\"\nflavour = 1\n"
    );
    for (text, path) in [
        (
            BASE.replace(
                "model = \"gpt-4o-mini\"",
                "model = \"m\"\nrequests_per_minute = -5",
            ),
            "providers.p.requests_per_minute: ",
        ),
        (
            BASE.replace(
                "template = \"t.j2\"",
                "template = \"t.j2\"\nmax_tokens = -1",
            ),
            "stages[0].max_tokens: ",
        ),
        (
            BASE.replace(
                "model = \"gpt-4o-mini\"",
                "model = \"m\"\nbackoff_max_secs = 1",
            ),
            "providers.p.backoff_max_secs: ",
        ),
        (two_stages, "stages[1].gate.flavour: "),
        (
            format!("{BASE}\n[retry]\nbackoff_base_secs = 2\n"),
            "retry: ",
        ),
        (
            BASE.replace("[providers.p]", "[providers.\"p.q\"]\nkind = 1"),
            "providers.p.q.kind: ",
        ),
    ] {
        let e = parse(&text).err().unwrap().to_string();
        assert!(e.contains(path), "{path:?} missing from {e}");
        assert!(e.starts_with("ws/docket.toml:"), "{e}");
    }
    assert_eq!(key_parts("a.\"b.c\" . d"), vec!["a", "b.c", "d"]);
}

/// Row I4: what a resume compares, key by key: a changed value, a key
/// added or taken out; not comments, layout or a default spelled out.
#[test]
fn changes_since_a_snapshot_are_named_key_by_key() {
    let then = parse(BASE).unwrap().snapshot_json();
    let same = parse(&format!("# a comment\n{}", BASE.replace("\n\n", "\n\n\n")))
        .unwrap()
        .changes_since(&then);
    assert_eq!(same, vec![]);
    // The default written out is no change.
    let spelled = parse(&BASE.replace(
        "model = \"gpt-4o-mini\"",
        "model = \"gpt-4o-mini\"\nmax_concurrency = 16",
    ))
    .unwrap();
    assert_eq!(spelled.changes_since(&then), vec![]);
    let edited = parse(&format!(
        "{}\n[routing]\nauto_accept_threshold = 0.9\n",
        BASE.replace("model = \"gpt-4o-mini\"", "model = \"gpt-4o\"")
            .replace(
                "template = \"t.j2\"",
                "template = \"t.j2\"\ntemperature = 0.5"
            )
    ))
    .unwrap();
    let changes: Vec<String> = edited
        .changes_since(&then)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        changes,
        vec![
            "providers.p.model \"gpt-4o-mini\" -> \"gpt-4o\"",
            "routing.auto_accept_threshold 0.85 -> 0.9",
            "stages[0].temperature (not set) -> 0.5",
        ]
    );
    // A snapshot that leaves out a key with a default (one written
    // before the key existed) reads it as the default.
    let mut old = then.clone();
    old["routing"]
        .as_object_mut()
        .unwrap()
        .remove("flag_injection");
    old["providers"]["p"]
        .as_object_mut()
        .unwrap()
        .remove("max_transport_attempts");
    assert_eq!(parse(BASE).unwrap().changes_since(&old), vec![]);
}
