//! The batch module's own tests: stalled batches, key headers, the registry.

use super::registry::build_batch_with_key;
use super::*;
use docket_model::config::ProviderConfig;

#[test]
fn a_batch_past_its_window_and_not_done_is_stalled() {
    let h = |x: f64| x * 3600.0;
    let now = h(100.0);
    let day = Some(now - h(25.0));
    assert_eq!(
        stalled_for("in_progress", day, now, None),
        Some(Duration::from_secs(3600))
    );
    assert_eq!(
        stalled_for("in_progress", Some(now - h(23.0)), now, None),
        None
    );
    for done in ["completed", "ingested", "failed", "submitting", "unknown"] {
        assert_eq!(stalled_for(done, day, now, None), None, "{done}");
    }
    let short = Some(Duration::from_secs(60));
    assert_eq!(
        stalled_for("validating", Some(now - 90.0), now, short),
        Some(Duration::from_secs(30))
    );
    assert_eq!(stalled_for("in_progress", None, now, short), None);
    assert_eq!(stalled_for("in_progress", Some(f64::NAN), now, short), None);
    assert_eq!(human_duration(Duration::from_secs(45)), "45s");
    assert_eq!(human_duration(Duration::from_secs(12 * 60 + 5)), "12m");
    assert_eq!(human_duration(Duration::from_secs(3 * 3600 + 300)), "3h 5m");
    assert_eq!(
        human_duration(Duration::from_secs(2 * 86_400 + 4 * 3600)),
        "2d 4h"
    );
}

#[test]
fn key_headers_are_marked_sensitive() {
    let client = reqwest::Client::new();
    let key = ApiKey::new("k-sensitive-1");
    for name in ["api-key", "x-api-key", "x-goog-api-key"] {
        let req = with_key_header(client.get("http://127.0.0.1:9/"), name, &key)
            .unwrap()
            .build()
            .unwrap();
        let v = &req.headers()[name];
        assert!(v.is_sensitive(), "{name}");
        assert_eq!(v.to_str().unwrap(), "k-sensitive-1");
        assert!(!format!("{req:?}").contains("k-sensitive-1"), "{name}");
    }
    let bad = ApiKey::new("k-bad\nkey");
    let e = with_key_header(client.get("http://127.0.0.1:9/"), "x-api-key", &bad).unwrap_err();
    assert_eq!(e.class, super::super::ErrorClass::Auth);
    assert!(!e.message.contains("k-bad"), "{e}");
}

#[test]
fn the_batch_registry_knows_openai_and_azure_only_for_now() {
    let key = || Some(ApiKey::new("k-test"));
    for (kind, extra, label) in [
        ("openai", "", Some("openai")),
        (
            "openai_compatible",
            "base_url = \"http://x/v1\"",
            Some("openai_compatible"),
        ),
        ("mock", "", Some("mock")),
        (
            "azure",
            "base_url = \"https://r.openai.azure.com\"\napi_version = \"2024-10-21\"",
            Some("azure"),
        ),
        ("anthropic", "", Some("anthropic")),
        ("gemini", "", Some("gemini")),
        ("ollama", "", None),
        ("openrouter", "", None),
    ] {
        let c: ProviderConfig =
            toml::from_str(&format!("kind = \"{kind}\"\nmodel = \"m\"\n{extra}\n")).unwrap();
        let b = build_batch_with_key("p", &c, None, key()).unwrap();
        assert_eq!(b.as_ref().map(|b| b.name()), label, "{kind}");
    }
    let c: ProviderConfig =
        toml::from_str("kind = \"azure\"\nmodel = \"d\"\nbase_url = \"https://r\"\n").unwrap();
    let e = build_batch_with_key("p", &c, None, key()).err().unwrap();
    assert!(e.to_string().contains("api_version"), "{e}");
}
