//! The Anthropic chat adapter's unit tests: request bodies, answers, errors.

use super::*;
use crate::StructuredOutput;
use reqwest::header::HeaderValue;

fn req(schema: bool) -> ChatRequest {
    ChatRequest {
        model: "claude-sonnet-4-5".into(),
        system: Some("You are an adjudicator.".into()),
        user: "Is A the same as B?".into(),
        max_tokens: 512,
        temperature: Some(0.0),
        response_schema: schema.then(|| {
            std::sync::Arc::new((
                "verdict".to_string(),
                json!({"type":"object","properties":{"same":{"type":"boolean"}},"required":["same"]}),
            ))
        }),
        structured_output: Default::default(),
        thinking_budget: None,
        client_request_id: "r1".into(),
        timeout: Duration::from_secs(5),
        body: None,
    }
}

#[test]
fn request_body_matches_the_messages_shape() {
    let b = request_body(&req(false));
    assert_eq!(
        b,
        json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 512,
            "system": "You are an adjudicator.",
            "messages": [{"role": "user", "content": "Is A the same as B?"}],
            "temperature": 0.0
        })
    );
    // A model without structured outputs: the schema in the system prompt.
    let mut old_model = req(true);
    old_model.model = "claude-3-7-sonnet-20250219".into();
    let b = request_body(&old_model);
    let system = b["system"].as_str().unwrap();
    assert!(system.starts_with("You are an adjudicator.\n\nAnswer with one JSON object"));
    assert!(system.contains("\"required\":[\"same\"]"), "{system}");
    assert!(b.get("output_config").is_none());
    assert!(b.get("top_p").is_none());
}

#[test]
fn parses_a_doc_shaped_message() {
    let body = br#"{"id":"msg_01XFDUDYJgAACzvnptvVoYEL","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929",
      "content":[{"type":"thinking","thinking":"hmm","signature":"x"},{"type":"text","text":"{\"same\":"},{"type":"text","text":"true}"}],
      "stop_reason":"end_turn","stop_sequence":null,
      "usage":{"input_tokens":120,"output_tokens":48,"cache_creation_input_tokens":10,"cache_read_input_tokens":30,
               "cache_creation":{"ephemeral_5m_input_tokens":10,"ephemeral_1h_input_tokens":0},"service_tier":"standard"}}"#;
    let a = parse_success(body, RateHeaders::default(), Some("req_1".into()), 200).unwrap();
    assert_eq!(a.content.as_deref(), Some("{\"same\":true}"));
    assert_eq!(a.finish_reason, FinishReason::Stop);
    assert_eq!(
        a.usage,
        Some(Usage {
            input_tokens: 160,
            output_tokens: 48,
            cached_input_tokens: 30,
            reasoning_tokens: 0
        })
    );
    assert_eq!(a.provider_request_id.as_deref(), Some("req_1"));
    assert_eq!(a.model.as_deref(), Some("claude-sonnet-4-5-20250929"));
    assert_eq!(a.refusal, None);
}

#[test]
fn max_tokens_is_length_and_refusal_is_a_refusal() {
    let body = br#"{"id":"msg_2","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"{\"same\":tr"}],"stop_reason":"max_tokens","stop_sequence":null,"usage":{"input_tokens":5,"output_tokens":16}}"#;
    let a = parse_success(body, RateHeaders::default(), None, 200).unwrap();
    assert_eq!(a.finish_reason, FinishReason::Length);
    assert_eq!(a.usage.unwrap().input_tokens, 5);
    let body = br#"{"id":"msg_3","type":"message","role":"assistant","model":"m","content":[],"stop_reason":"refusal","stop_sequence":null,"usage":{"input_tokens":5,"output_tokens":0}}"#;
    let a = parse_success(body, RateHeaders::default(), None, 200).unwrap();
    assert_eq!(a.finish_reason, FinishReason::ContentFilter);
    assert!(a.refusal.unwrap().contains("refusal"));
    assert_eq!(a.content, None);
    let e = parse_success(b"{\"id\":\"msg", RateHeaders::default(), None, 200).unwrap_err();
    assert_eq!(e.class, ErrorClass::Ambiguous);
}

#[test]
fn classifies_anthropic_error_bodies() {
    let c = |status, kind: &str, msg: &str| {
        let body =
            json!({"type":"error","error":{"type":kind,"message":msg},"request_id":"req_011"});
        classify_error(status, body.to_string().as_bytes(), RateHeaders::default())
    };
    assert_eq!(
        c(529, "overloaded_error", "Overloaded").class,
        ErrorClass::Overloaded
    );
    assert_eq!(
        c(
            429,
            "rate_limit_error",
            "Number of request tokens has exceeded your per-minute rate limit"
        )
        .class,
        ErrorClass::RateLimited
    );
    let e = c(
        400,
        "invalid_request_error",
        "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits.",
    );
    assert_eq!(e.class, ErrorClass::Quota);
    assert!(e.class.stops_session());
    assert_eq!(c(402, "billing_error", "billing").class, ErrorClass::Quota);
    assert_eq!(
        c(401, "authentication_error", "invalid x-api-key").class,
        ErrorClass::Auth
    );
    assert_eq!(
        c(403, "permission_error", "no access").class,
        ErrorClass::Auth
    );
    let e = c(400, "invalid_request_error", "max_tokens: Field required");
    assert_eq!(e.class, ErrorClass::Request);
    assert!(e.message.contains("invalid_request_error"));
    assert_eq!(
        c(404, "not_found_error", "model: nope").class,
        ErrorClass::Request
    );
    assert_eq!(c(500, "api_error", "Internal").class, ErrorClass::Transient);
    assert_eq!(
        c(504, "timeout_error", "timeout").class,
        ErrorClass::Transient
    );
    // 413 comes from the edge, before the API: not JSON.
    let e = classify_error(
        413,
        b"<html>Request Entity Too Large</html>",
        RateHeaders::default(),
    );
    assert_eq!(e.class, ErrorClass::Request);
    // An unknown type on a 5xx still retries.
    assert_eq!(c(502, "brand_new_error", "x").class, ErrorClass::Transient);
}

#[test]
fn reads_rfc3339_resets_and_retry_after() {
    let mut h = HeaderMap::new();
    for (k, v) in [
        ("anthropic-ratelimit-requests-limit", "50"),
        ("anthropic-ratelimit-requests-remaining", "0"),
        ("anthropic-ratelimit-requests-reset", "2025-08-21T12:40:59Z"),
        ("anthropic-ratelimit-tokens-limit", "40000"),
        ("anthropic-ratelimit-tokens-remaining", "39000"),
        (
            "anthropic-ratelimit-tokens-reset",
            "2025-08-21T12:40:30.500Z",
        ),
        ("anthropic-ratelimit-input-tokens-limit", "30000"),
        ("retry-after", "17"),
    ] {
        h.insert(k, HeaderValue::from_static(v));
    }
    let now = DateTime::parse_from_rfc3339("2025-08-21T12:40:29Z")
        .unwrap()
        .with_timezone(&Utc);
    let r = rate_headers_at(&h, now);
    assert_eq!(r.limit_requests, Some(50));
    assert_eq!(r.remaining_requests, Some(0));
    assert_eq!(r.reset_requests, Some(Duration::from_secs(30)));
    assert_eq!(r.limit_tokens, Some(40_000));
    assert_eq!(r.remaining_tokens, Some(39_000));
    assert_eq!(r.reset_tokens, Some(Duration::from_millis(1500)));
    assert_eq!(r.retry_after, Some(Duration::from_secs(17)));
    // A reset already past waits nothing; one with an offset is read too.
    let later = now + chrono::TimeDelta::seconds(120);
    assert_eq!(
        rate_headers_at(&h, later).reset_requests,
        Some(Duration::ZERO)
    );
    h.insert(
        "anthropic-ratelimit-requests-reset",
        HeaderValue::from_static("2025-08-21T14:41:29+02:00"),
    );
    assert_eq!(
        rate_headers_at(&h, now).reset_requests,
        Some(Duration::from_secs(60))
    );
    // Without tokens-*, the input-tokens limit stands in.
    h.remove("anthropic-ratelimit-tokens-limit");
    h.remove("anthropic-ratelimit-tokens-remaining");
    assert_eq!(rate_headers_at(&h, now).limit_tokens, Some(30_000));
}

#[test]
fn nonsense_numbers_from_the_server_never_panic() {
    // Counts at u64::MAX: capped, never an overflow.
    let body = format!(
        r#"{{"id":"m","type":"message","role":"assistant","model":"m","content":[],"stop_reason":"end_turn","usage":{{"input_tokens":{m},"output_tokens":{m},"cache_creation_input_tokens":{m},"cache_read_input_tokens":{m}}}}}"#,
        m = u64::MAX
    );
    let u = parse_success(body.as_bytes(), RateHeaders::default(), None, 200)
        .unwrap()
        .usage
        .unwrap();
    assert_eq!(u.input_tokens, MAX_TOKENS_REPORTED);
    assert_eq!(u.cached_input_tokens, MAX_TOKENS_REPORTED);
    // Out of u64 range or negative: a garbage 2xx body, ambiguous.
    for n in ["1e30", "-1", "18446744073709551616"] {
        let body = format!(
            r#"{{"id":"m","type":"message","content":[],"usage":{{"input_tokens":{n},"output_tokens":1}}}}"#
        );
        let e = parse_success(body.as_bytes(), RateHeaders::default(), None, 200).unwrap_err();
        assert_eq!(e.class, ErrorClass::Ambiguous, "{n}");
    }
    // Resets at the ends of time, and retry-after nonsense.
    let now = DateTime::parse_from_rfc3339("2025-08-21T12:40:29Z")
        .unwrap()
        .with_timezone(&Utc);
    let mut h = HeaderMap::new();
    h.insert(
        "anthropic-ratelimit-requests-reset",
        HeaderValue::from_static("9999-12-31T23:59:59Z"),
    );
    h.insert(
        "anthropic-ratelimit-input-tokens-reset",
        HeaderValue::from_static("0001-01-01T00:00:00Z"),
    );
    h.insert("retry-after", HeaderValue::from_static("1e30"));
    h.insert("retry-after-ms", HeaderValue::from_static("1e300"));
    let r = rate_headers_at(&h, now);
    assert_eq!(r.reset_requests, Some(MAX_RESET));
    assert_eq!(r.reset_tokens, Some(Duration::ZERO));
    assert_eq!(r.retry_after, Some(Duration::from_secs(3600)));
    h.insert("retry-after-ms", HeaderValue::from_static("NaN"));
    h.insert("retry-after", HeaderValue::from_static("-inf"));
    assert_eq!(rate_headers_at(&h, now).retry_after, None);
}

fn rich_schema() -> Value {
    json!({"type": "object",
        "properties": {
            "label": {"type": "string", "enum": ["same", "different"], "minLength": 1},
            "confidence": {"type": "number", "minimum": 0, "maximum": 1}
        },
        "required": ["label", "confidence"]})
}

/// Sonnet 4.5 takes `output_config.format`: the schema goes there without
/// the keywords the API refuses (each said in the system prompt instead),
/// with `additionalProperties: false`, and not into the system prompt whole.
#[test]
fn a_structured_outputs_model_gets_output_config() {
    let mut r = req(true);
    r.response_schema = Some(std::sync::Arc::new(("verdict".into(), rich_schema())));
    let b = request_body(&r);
    assert_eq!(
        b["output_config"],
        json!({"format": {"type": "json_schema", "schema": {"type": "object",
            "properties": {
                "label": {"type": "string", "enum": ["same", "different"]},
                "confidence": {"type": "number"}
            },
            "required": ["label", "confidence"],
            "additionalProperties": false}}})
    );
    let system = b["system"].as_str().unwrap();
    assert!(
        system.starts_with("You are an adjudicator.\n\nThe answer must also keep"),
        "{system}"
    );
    assert!(
        system.contains("/properties/confidence: minimum 0"),
        "{system}"
    );
    assert!(
        system.contains("/properties/confidence: maximum 1"),
        "{system}"
    );
    assert!(
        system.contains("/properties/label: minLength 1"),
        "{system}"
    );
    assert!(!system.contains("Answer with one JSON object"), "{system}");
    // Nothing taken out: nothing added to the system prompt.
    let plain = request_body(&req(true));
    assert_eq!(plain["system"], json!("You are an adjudicator."));
    assert!(plain["output_config"]["format"]["schema"]["additionalProperties"] == json!(false));
}

/// `structured_output` overrides the model list both ways; a recursive
/// schema cannot be sent as a parameter and goes into the prompt.
#[test]
fn structured_output_mode_and_recursive_schemas() {
    let mut r = req(true);
    r.structured_output = StructuredOutput::Prompt;
    let b = request_body(&r);
    assert!(b.get("output_config").is_none());
    assert!(
        b["system"]
            .as_str()
            .unwrap()
            .contains("Answer with one JSON object")
    );
    r.structured_output = StructuredOutput::Native;
    r.model = "claude-3-7-sonnet-20250219".into();
    assert!(request_body(&r).get("output_config").is_some());
    r.structured_output = StructuredOutput::Auto;
    assert!(request_body(&r).get("output_config").is_none());
    r.model = "claude-opus-4-6".into();
    r.response_schema = Some(std::sync::Arc::new((
        "tree".into(),
        json!({"$ref": "#/$defs/node", "$defs": {"node": {"type": "object",
            "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}}}),
    )));
    let b = request_body(&r);
    assert!(b.get("output_config").is_none());
    assert!(
        b["system"]
            .as_str()
            .unwrap()
            .contains("Answer with one JSON object")
    );
}
