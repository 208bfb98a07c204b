//! The Gemini chat adapter's unit tests: request bodies, answers, errors.

use super::thinking::DEFAULT_THINKING_BUDGET;
use super::*;

fn req() -> ChatRequest {
    ChatRequest {
        model: "gemini-2.5-flash".into(),
        system: Some("You are an adjudicator.".into()),
        user: "Is A the same as B?".into(),
        max_tokens: 512,
        temperature: Some(0.0),
        response_schema: Some(std::sync::Arc::new((
            "verdict".into(),
            json!({"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object","properties":{"same":{"type":"boolean"}},"required":["same"]}),
        ))),
        structured_output: Default::default(),
        thinking_budget: None,
        client_request_id: "r1".into(),
        timeout: Duration::from_secs(5),
        body: None,
    }
}

#[test]
fn request_body_matches_generate_content() {
    assert_eq!(
        request_body(&req()),
        json!({
            "contents": [{"role": "user", "parts": [{"text": "Is A the same as B?"}]}],
            "systemInstruction": {"parts": [{"text": "You are an adjudicator."}]},
            "generationConfig": {
                "maxOutputTokens": 512 + DEFAULT_THINKING_BUDGET,
                "thinkingConfig": {"thinkingBudget": DEFAULT_THINKING_BUDGET},
                "temperature": 0.0,
                "responseMimeType": "application/json",
                "responseJsonSchema": {"type":"object","properties":{"same":{"type":"boolean"}},"required":["same"]}
            }
        })
    );
    let mut plain = req();
    plain.model = "gemini-2.0-flash".into();
    plain.response_schema = None;
    plain.system = None;
    plain.temperature = None;
    assert_eq!(
        request_body(&plain),
        json!({
            "contents": [{"role": "user", "parts": [{"text": "Is A the same as B?"}]}],
            "generationConfig": {"maxOutputTokens": 512}
        })
    );
}

/// A 2.5 Pro / Flash model gets the default budget on top of max_tokens;
/// a stage's budget replaces it; dynamic (-1) shares max_tokens; Flash-Lite
/// and other models get none unless the stage sets one.
#[test]
fn thinking_budget_is_added_to_the_output_limit() {
    let body = |model: &str, set: Option<i64>| {
        let mut r = req();
        r.model = model.into();
        r.thinking_budget = set;
        request_body(&r)["generationConfig"].clone()
    };
    let g = body("gemini-2.5-pro", None);
    assert_eq!(g["thinkingConfig"], json!({"thinkingBudget": 1024}));
    assert_eq!(g["maxOutputTokens"], json!(512 + 1024));
    let g = body("models/gemini-2.5-flash", Some(0));
    assert_eq!(g["thinkingConfig"], json!({"thinkingBudget": 0}));
    assert_eq!(g["maxOutputTokens"], json!(512));
    let g = body("gemini-2.5-flash", Some(4096));
    assert_eq!(g["maxOutputTokens"], json!(512 + 4096));
    let g = body("gemini-2.5-flash", Some(-1));
    assert_eq!(g["thinkingConfig"], json!({"thinkingBudget": -1}));
    assert_eq!(g["maxOutputTokens"], json!(512));
    let g = body("gemini-2.5-flash-lite", None);
    assert!(g.get("thinkingConfig").is_none());
    assert_eq!(g["maxOutputTokens"], json!(512));
    assert_eq!(thinking_allowance("gemini-2.5-flash", None), 1024);
    assert_eq!(thinking_allowance("gemini-2.5-flash", Some(-1)), 0);
    assert_eq!(thinking_allowance("gemini-3-pro-preview", None), 0);
}

#[test]
fn url_never_holds_the_key() {
    let g = GeminiChat::new(
        "https://generativelanguage.googleapis.com/",
        ApiKey::new("AIzaCanary"),
    )
    .unwrap();
    let url = g.url_for("models/gemini-2.5-flash");
    assert_eq!(
        url,
        "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:generateContent"
    );
    assert!(!url.contains("AIza") && !url.contains("key="));
}

#[test]
fn parses_a_doc_shaped_response() {
    let body = br#"{"candidates":[{"content":{"role":"model","parts":[{"text":"thinking...","thought":true},{"text":"{\"same\":"},{"text":"true}"}]},
        "finishReason":"STOP","index":0,"safetyRatings":[]}],
      "usageMetadata":{"promptTokenCount":50,"candidatesTokenCount":20,"totalTokenCount":95,"cachedContentTokenCount":8,"thoughtsTokenCount":25},
      "modelVersion":"gemini-2.5-flash","responseId":"resp-1"}"#;
    let a = parse_success(body, RateHeaders::default(), 200).unwrap();
    assert_eq!(a.content.as_deref(), Some("{\"same\":true}"));
    assert_eq!(a.finish_reason, FinishReason::Stop);
    assert_eq!(
        a.usage,
        Some(Usage {
            input_tokens: 50,
            output_tokens: 45,
            cached_input_tokens: 8,
            reasoning_tokens: 25
        })
    );
    assert_eq!(a.provider_request_id.as_deref(), Some("resp-1"));
    assert_eq!(a.model.as_deref(), Some("gemini-2.5-flash"));
}

#[test]
fn stop_reasons_map_to_truncation_and_filters() {
    let one = |reason: &str| {
        let body = format!(
            r#"{{"candidates":[{{"content":{{"role":"model","parts":[{{"text":"{{\"a\":"}}]}},"finishReason":"{reason}","index":0}}],"usageMetadata":{{"promptTokenCount":3,"candidatesTokenCount":2,"totalTokenCount":5}}}}"#
        );
        parse_success(body.as_bytes(), RateHeaders::default(), 200).unwrap()
    };
    assert_eq!(one("MAX_TOKENS").finish_reason, FinishReason::Length);
    let s = one("SAFETY");
    assert_eq!(s.finish_reason, FinishReason::ContentFilter);
    assert!(s.refusal.unwrap().contains("SAFETY"));
    assert_eq!(one("RECITATION").finish_reason, FinishReason::ContentFilter);
    assert_eq!(
        one("LANGUAGE").finish_reason,
        FinishReason::Other("language".into())
    );
    assert_eq!(
        one("SOMETHING_NEW").finish_reason,
        FinishReason::Other("something_new".into())
    );
    // The prompt blocked: no candidates, a refusal.
    let a = parse_success(
        br#"{"promptFeedback":{"blockReason":"SAFETY"},"usageMetadata":{"promptTokenCount":9,"totalTokenCount":9}}"#,
        RateHeaders::default(),
        200,
    )
    .unwrap();
    assert_eq!(a.content, None);
    assert_eq!(a.finish_reason, FinishReason::ContentFilter);
    assert!(a.refusal.unwrap().contains("blockReason SAFETY"));
    let e = parse_success(b"{}", RateHeaders::default(), 200).unwrap_err();
    assert_eq!(e.class, ErrorClass::Ambiguous);
}

fn body_429(quota_id: &str, delay: &str) -> String {
    json!({"error": {"code": 429,
        "message": "You exceeded your current quota, please check your plan and billing details. For more information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits.",
        "status": "RESOURCE_EXHAUSTED",
        "details": [
            {"@type": "type.googleapis.com/google.rpc.QuotaFailure",
             "violations": [{"quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
                             "quotaId": quota_id,
                             "quotaDimensions": {"location": "global", "model": "gemini-2.5-flash"},
                             "quotaValue": "10"}]},
            {"@type": "type.googleapis.com/google.rpc.Help", "links": [{"description": "Learn more", "url": "https://ai.google.dev/gemini-api/docs/rate-limits"}]},
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay}
        ]}})
    .to_string()
}

#[test]
fn a_429_reads_retry_delay_from_the_body() {
    let e = classify_error(
        429,
        body_429(
            "GenerateRequestsPerMinutePerProjectPerModel-FreeTier",
            "17s",
        )
        .as_bytes(),
        RateHeaders::default(),
    );
    assert_eq!(e.class, ErrorClass::RateLimited);
    assert_eq!(e.headers.retry_after, Some(Duration::from_secs(17)));
    assert!(e.message.contains("RESOURCE_EXHAUSTED"));
    let e = classify_error(
        429,
        body_429("GenerateRequestsPerMinutePerProjectPerModel", "27.4s").as_bytes(),
        RateHeaders::default(),
    );
    assert_eq!(e.headers.retry_after, Some(Duration::from_millis(27_400)));
    // Per-day quota: it will not clear within the job.
    let e = classify_error(
        429,
        body_429("GenerateRequestsPerDayPerProjectPerModel-FreeTier", "3600s").as_bytes(),
        RateHeaders::default(),
    );
    assert_eq!(e.class, ErrorClass::Quota);
    let e = classify_error(
        429,
        br#"{"error":{"code":429,"message":"Your prepayment credits are depleted. Please go to AI Studio to manage your project and billing.","status":"RESOURCE_EXHAUSTED"}}"#,
        RateHeaders::default(),
    );
    assert_eq!(e.class, ErrorClass::Quota);
    assert_eq!(
        parse_proto_duration("900ms"),
        Some(Duration::from_millis(900))
    );
    assert_eq!(parse_proto_duration("x"), None);
}

#[test]
fn nonsense_retry_delays_never_panic() {
    // Too big for a Duration: capped, not a panic.
    assert_eq!(parse_proto_duration("1e30s"), Some(MAX_RETRY_DELAY));
    assert_eq!(parse_proto_duration("1e30ms"), Some(MAX_RETRY_DELAY));
    assert_eq!(
        parse_proto_duration("99999999999999999999999s"),
        Some(MAX_RETRY_DELAY)
    );
    assert_eq!(
        parse_proto_duration("1.7976931348623157e308s"),
        Some(MAX_RETRY_DELAY)
    );
    // Negative, NaN and infinite: no server delay (our own backoff applies).
    assert_eq!(parse_proto_duration("-5s"), None);
    assert_eq!(parse_proto_duration("-0.001ms"), None);
    assert_eq!(parse_proto_duration("NaNs"), None);
    assert_eq!(parse_proto_duration("nanms"), None);
    assert_eq!(parse_proto_duration("inf"), None);
    assert_eq!(parse_proto_duration("infs"), None);
    assert_eq!(parse_proto_duration("-infs"), None);
    assert_eq!(parse_proto_duration("1e999s"), None);
    assert_eq!(parse_proto_duration("-0s"), Some(Duration::ZERO));
    assert_eq!(parse_proto_duration("1e-30s"), Some(Duration::ZERO));
    // Through the whole 429 path.
    for delay in ["1e30s", "-5s", "NaNs", "inf", "1e308s"] {
        let e = classify_error(
            429,
            body_429("GenerateRequestsPerMinutePerProjectPerModel", delay).as_bytes(),
            RateHeaders::default(),
        );
        assert_eq!(e.class, ErrorClass::RateLimited, "{delay}");
        assert!(
            e.headers.retry_after.is_none_or(|d| d <= MAX_RETRY_DELAY),
            "{delay}: {:?}",
            e.headers.retry_after
        );
    }
}

#[test]
fn classifies_the_other_google_rpc_errors() {
    let c = |status: u16, rpc: &str, extra: Value| {
        let body =
            json!({"error": {"code": status, "message": "m", "status": rpc, "details": extra}});
        classify_error(status, body.to_string().as_bytes(), RateHeaders::default()).class
    };
    assert_eq!(c(400, "INVALID_ARGUMENT", json!([])), ErrorClass::Request);
    assert_eq!(
        c(
            400,
            "INVALID_ARGUMENT",
            json!([{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID",
                    "domain": "googleapis.com", "metadata": {"service": "generativelanguage.googleapis.com"}}])
        ),
        ErrorClass::Auth
    );
    assert_eq!(c(403, "PERMISSION_DENIED", json!([])), ErrorClass::Auth);
    assert_eq!(c(404, "NOT_FOUND", json!([])), ErrorClass::Request);
    assert_eq!(c(400, "FAILED_PRECONDITION", json!([])), ErrorClass::Quota);
    assert_eq!(c(500, "INTERNAL", json!([])), ErrorClass::Transient);
    assert_eq!(c(503, "UNAVAILABLE", json!([])), ErrorClass::Overloaded);
    assert_eq!(
        c(504, "DEADLINE_EXCEEDED", json!([])),
        ErrorClass::Transient
    );
    let e = classify_error(502, b"<html>bad gateway</html>", RateHeaders::default());
    assert_eq!(e.class, ErrorClass::Transient);
}
