//! The OpenAI chat adapter's unit tests: request bodies, answers, errors.

use super::*;
use reqwest::header::HeaderValue;

#[test]
fn parses_a_spec_shaped_completion() {
    let body = br#"{"id":"chatcmpl-1","object":"chat.completion","created":1711652795,"model":"gpt-4o-mini-2024-07-18",
      "choices":[{"index":0,"message":{"role":"assistant","content":"{\"a\":1}","refusal":null,"annotations":[]},"logprobs":null,"finish_reason":"length"}],
      "usage":{"prompt_tokens":24,"completion_tokens":8,"total_tokens":32,"prompt_tokens_details":{"cached_tokens":4,"audio_tokens":0},
               "completion_tokens_details":{"reasoning_tokens":2,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},
      "service_tier":"default","system_fingerprint":"fp_x"}"#;
    let a = parse_success(body, RateHeaders::default(), None, 200).unwrap();
    assert_eq!(a.finish_reason, FinishReason::Length);
    assert_eq!(a.content.as_deref(), Some("{\"a\":1}"));
    assert_eq!(
        a.usage,
        Some(Usage {
            input_tokens: 24,
            output_tokens: 8,
            cached_input_tokens: 4,
            reasoning_tokens: 2
        })
    );
    assert_eq!(a.provider_request_id.as_deref(), Some("chatcmpl-1"));
}

#[test]
fn usage_and_details_may_be_missing() {
    let body = br#"{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"logprobs":null,"finish_reason":"stop"}]}"#;
    let a = parse_success(body, RateHeaders::default(), None, 200).unwrap();
    assert_eq!(a.usage, None);
    let body = br#"{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}"#;
    let a = parse_success(body, RateHeaders::default(), None, 200).unwrap();
    assert_eq!(a.usage.unwrap().cached_input_tokens, 0);
}

#[test]
fn a_garbage_2xx_is_ambiguous_not_a_panic() {
    let e = parse_success(
        b"{\"id\":\"chatcmpl-x\",\"object\":\"chat.compl",
        RateHeaders::default(),
        None,
        200,
    )
    .unwrap_err();
    assert_eq!(e.class, ErrorClass::Ambiguous);
    let e = parse_success(b"{\"choices\":[]}", RateHeaders::default(), None, 200).unwrap_err();
    assert_eq!(e.class, ErrorClass::Ambiguous);
}

#[test]
fn classifies_openai_error_bodies() {
    let c = |status, body: &str| classify_error(status, body.as_bytes(), RateHeaders::default());
    let e = c(
        401,
        r#"{"error":{"message":"Incorrect API key provided: sk-abc12***. You can find your API key at x.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#,
    );
    assert_eq!(e.class, ErrorClass::Auth);
    assert!(!e.message.contains("sk-abc"), "{}", e.message);
    let e = c(
        429,
        r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#,
    );
    assert_eq!(e.class, ErrorClass::Quota);
    let e = c(
        429,
        r#"{"error":{"message":"You have no credits remaining.","type":"x","param":null,"code":"credit_balance_exhausted"}}"#,
    );
    assert_eq!(e.class, ErrorClass::Quota);
    let e = c(
        429,
        r#"{"error":{"message":"Rate limit reached for gpt-4o-mini on requests per min (RPM): Limit 3, Used 3, Requested 1.","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#,
    );
    assert_eq!(e.class, ErrorClass::RateLimited);
    let e = c(
        429,
        r#"{"error":{"message":"Request too large for gpt-4o on tokens per min (TPM): Limit 30000, Requested 50000.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}"#,
    );
    assert_eq!(e.class, ErrorClass::Request);
    assert_eq!(
        c(
            500,
            r#"{"error":{"message":"boom","type":"server_error","param":null,"code":null}}"#
        )
        .class,
        ErrorClass::Transient
    );
    assert_eq!(c(503, "Service Unavailable").class, ErrorClass::Overloaded);
    let e = c(
        400,
        r#"{"error":{"message":"maximum context length","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
    );
    assert_eq!(e.class, ErrorClass::Request);
    assert!(e.message.contains("context_length_exceeded"));
}

#[test]
fn reads_rate_limit_headers() {
    let mut h = HeaderMap::new();
    h.insert(
        "x-ratelimit-limit-requests",
        HeaderValue::from_static("6000"),
    );
    h.insert(
        "x-ratelimit-remaining-requests",
        HeaderValue::from_static("0"),
    );
    h.insert(
        "x-ratelimit-reset-requests",
        HeaderValue::from_static("1m30.5s"),
    );
    h.insert("retry-after", HeaderValue::from_static("2"));
    let r = rate_headers(&h);
    assert_eq!(r.limit_requests, Some(6000));
    assert_eq!(r.remaining_requests, Some(0));
    assert_eq!(
        r.reset_requests,
        Some(std::time::Duration::from_millis(90_500))
    );
    assert_eq!(r.retry_after, Some(std::time::Duration::from_secs(2)));
    // Row S1: an HTTP date, 30 s from now.
    let date = (chrono::Utc::now() + chrono::Duration::seconds(30))
        .format("%a, %d %b %Y %H:%M:%S GMT")
        .to_string();
    h.insert("retry-after", HeaderValue::from_str(&date).unwrap());
    let wait = rate_headers(&h).retry_after.expect("a date is a hint");
    assert!((28..=30).contains(&wait.as_secs()), "{wait:?} for {date}");
    h.insert("retry-after", HeaderValue::from_static("2"));
    h.insert("retry-after-ms", HeaderValue::from_static("250"));
    assert_eq!(
        rate_headers(&h).retry_after,
        Some(std::time::Duration::from_millis(250))
    );
}

#[test]
fn request_body_uses_structured_output() {
    let req = ChatRequest {
        model: "gpt-4o-mini".into(),
        system: Some("sys".into()),
        user: "u".into(),
        max_tokens: 100,
        temperature: Some(0.0),
        response_schema: Some(std::sync::Arc::new((
            "verdict".into(),
            json!({"type":"object"}),
        ))),
        structured_output: Default::default(),
        thinking_budget: None,
        client_request_id: "r1".into(),
        timeout: std::time::Duration::from_secs(1),
        body: None,
    };
    let b = request_body(&req);
    assert_eq!(b["messages"][0]["role"], "system");
    assert_eq!(b["messages"][1]["content"], "u");
    assert_eq!(b["response_format"]["type"], "json_schema");
    assert_eq!(b["response_format"]["json_schema"]["strict"], true);
    // Optional properties (criteria an answer may leave out): not strict.
    assert!(!strict_ok(
        &json!({"type":"object","properties":{"a":{"type":"string"},"b":{"type":"string"}},
        "required":["a"],"additionalProperties":false})
    ));
    assert!(strict_ok(
        &json!({"type":"object","properties":{"a":{"type":"object","properties":{"x":{"type":"number"}},
        "required":["x"],"additionalProperties":false}},"required":["a"],"additionalProperties":false})
    ));
    assert_eq!(b["max_completion_tokens"], 100);
    assert!(b.get("max_tokens").is_none());
    let mut b = b;
    use_max_tokens(&mut b);
    assert_eq!(b["max_tokens"], 100);
    assert!(b.get("max_completion_tokens").is_none());
}

#[test]
fn nonsense_numbers_from_the_server_never_panic() {
    let body = format!(
        r#"{{"id":"x","model":"m","choices":[{{"index":0,"message":{{"role":"assistant","content":"hi"}},"finish_reason":"stop"}}],"usage":{{"prompt_tokens":{m},"completion_tokens":{m},"prompt_tokens_details":{{"cached_tokens":{m}}},"completion_tokens_details":{{"reasoning_tokens":{m}}}}}}}"#,
        m = u64::MAX
    );
    let u = parse_success(body.as_bytes(), RateHeaders::default(), None, 200)
        .unwrap()
        .usage
        .unwrap();
    assert_eq!(u.input_tokens, MAX_TOKENS_REPORTED);
    assert_eq!(u.reasoning_tokens, MAX_TOKENS_REPORTED);
    for n in ["1e30", "-1", "18446744073709551616"] {
        let body = format!(
            r#"{{"choices":[{{"message":{{"content":"hi"}}}}],"usage":{{"prompt_tokens":{n}}}}}"#
        );
        let e = parse_success(body.as_bytes(), RateHeaders::default(), None, 200).unwrap_err();
        assert_eq!(e.class, ErrorClass::Ambiguous, "{n}");
    }
    let hour = std::time::Duration::from_secs(3600);
    for (ms, after, want) in [
        ("1e300", "", Some(hour)),
        ("NaN", "1e30", Some(hour)),
        ("-5", "-5", None),
        ("inf", "inf", None),
    ] {
        let mut h = HeaderMap::new();
        h.insert("retry-after-ms", HeaderValue::from_str(ms).unwrap());
        if !after.is_empty() {
            h.insert("retry-after", HeaderValue::from_str(after).unwrap());
        }
        h.insert(
            "x-ratelimit-reset-requests",
            HeaderValue::from_static("99999999999999999999999h"),
        );
        h.insert(
            "x-ratelimit-limit-requests",
            HeaderValue::from_static("99999999999999999999999"),
        );
        let r = rate_headers(&h);
        assert_eq!(r.retry_after, want, "{ms} / {after}");
        assert_eq!(r.limit_requests, None);
        assert_eq!(
            r.reset_requests,
            Some(std::time::Duration::from_secs(86_400))
        );
    }
}

#[test]
fn redacts_key_shaped_words() {
    assert_eq!(
        redact("bad key sk-abc123*** given"),
        "bad key [redacted] given"
    );
    assert_eq!(
        redact("key \"sk-abc123\"\nsk_live_99x: no"),
        "key \"[redacted]\"\n[redacted]: no"
    );
}
