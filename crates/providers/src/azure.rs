//! Azure OpenAI Chat Completions: OpenAI's bodies under Azure's URLs and auth.
//!
//! `POST {base}/openai/deployments/{deployment}/chat/completions?api-version=V`
//! with the key in an `api-key` header (never the query string). The
//! deployment in the path picks the model; `ChatRequest::model` (the config's
//! `model`) is the deployment name. Answers, errors and `x-ratelimit-*` /
//! `retry-after(-ms)` headers are OpenAI's, so they are read by openai.rs.
//!
//! No client request id is sent: Azure's OpenAI reference documents no header
//! for one (`X-Client-Request-Id` is OpenAI's own).

#![allow(clippy::result_large_err)]

use super::openai::{classify_error, header_str, parse_success, rate_headers, request_body};
use super::{ApiKey, ChatAnswer, ChatFuture, ChatProvider, ChatRequest, ProviderError};

pub struct AzureChat {
    base: String,
    api_version: String,
    key: ApiKey,
    client: reqwest::Client,
}

impl AzureChat {
    /// `base_url` is the resource endpoint, `https://RESOURCE.openai.azure.com`.
    pub fn new(base_url: &str, api_version: &str, key: ApiKey) -> Result<Self, crate::ClientError> {
        let base = base_url.trim_end_matches('/');
        // Accept the endpoint with or without the `/openai` suffix.
        let base = base.strip_suffix("/openai").unwrap_or(base).to_string();
        Ok(Self {
            base,
            api_version: api_version.trim().to_string(),
            key,
            client: super::http_client()?,
        })
    }

    /// The full URL for one request (the deployment is per request).
    pub fn url_for(&self, deployment: &str) -> String {
        format!(
            "{}/openai/deployments/{}/chat/completions?api-version={}",
            self.base,
            super::path_segment(deployment),
            super::path_segment(&self.api_version)
        )
    }

    async fn send_inner(&self, req: &ChatRequest) -> Result<ChatAnswer, ProviderError> {
        let builder = self
            .client
            .post(self.url_for(&req.model))
            .timeout(req.timeout)
            .header("api-key", super::secret_header(self.key.expose())?)
            .json(&super::body_or(req, request_body));
        let raw = super::exchange(builder).await?;
        let headers = rate_headers(&raw.headers);
        let request_id = header_str(&raw.headers, "x-request-id")
            .or_else(|| header_str(&raw.headers, "apim-request-id"))
            .map(str::to_string);
        if raw.status == 200 {
            return parse_success(&raw.bytes, headers, request_id, raw.status)
                .map(|a| super::keep_body(a, req, &raw.bytes));
        }
        Err(classify_error(raw.status, &raw.bytes, headers))
    }
}

impl ChatProvider for AzureChat {
    fn name(&self) -> &str {
        "azure"
    }

    fn send<'a>(&'a self, request: &'a ChatRequest) -> ChatFuture<'a> {
        Box::pin(async move {
            self.send_inner(request)
                .await
                .map_err(|e| super::scrub(e, Some(&self.key)))
        })
    }

    /// `GET /openai/models?api-version=...` (the resource's models).
    fn preflight(&self) -> super::PreflightFuture<'_> {
        Box::pin(async move {
            let url = format!(
                "{}/openai/models?api-version={}",
                self.base,
                super::path_segment(&self.api_version)
            );
            let builder = self
                .client
                .get(url)
                .header("api-key", super::secret_header(self.key.expose())?);
            // It lists the models the resource may deploy, where `model`
            // is a deployment's own name: nothing to check it against.
            super::probe(builder, Some(&self.key)).await.map(|_| None)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::RateHeaders;
    use crate::{ErrorClass, FinishReason};
    use serde_json::json;

    #[test]
    fn url_carries_deployment_and_api_version_never_the_key() {
        let a = AzureChat::new(
            "https://res.openai.azure.com/openai/",
            "2024-10-21",
            ApiKey::new("azure-canary-key"),
        )
        .unwrap();
        let url = a.url_for("gpt-4o-mini-prod");
        assert_eq!(
            url,
            "https://res.openai.azure.com/openai/deployments/gpt-4o-mini-prod/chat/completions?api-version=2024-10-21"
        );
        assert!(!url.contains("canary"));
    }

    #[test]
    fn body_is_openai_chat_with_json_schema() {
        let req = ChatRequest {
            model: "dep".into(),
            system: None,
            user: "u".into(),
            max_tokens: 64,
            temperature: None,
            response_schema: Some(std::sync::Arc::new((
                "verdict".into(),
                json!({"type":"object"}),
            ))),
            structured_output: Default::default(),
            thinking_budget: None,
            client_request_id: "r".into(),
            timeout: std::time::Duration::from_secs(1),
            body: None,
        };
        let b = request_body(&req);
        assert_eq!(b["response_format"]["type"], "json_schema");
        assert_eq!(b["response_format"]["json_schema"]["name"], "verdict");
        assert_eq!(b["messages"], json!([{"role":"user","content":"u"}]));
    }

    #[test]
    fn azure_answers_and_errors_read_like_openai() {
        // Azure adds prompt_filter_results / content_filter_results.
        let body = br#"{"choices":[{"content_filter_results":{},"finish_reason":"content_filter","index":0,"logprobs":null,"message":{"content":null,"refusal":null,"role":"assistant"}}],"created":1,"id":"chatcmpl-a","model":"gpt-4o-mini-2024-07-18","object":"chat.completion","prompt_filter_results":[{"prompt_index":0,"content_filter_results":{}}],"usage":{"completion_tokens":0,"prompt_tokens":12,"total_tokens":12}}"#;
        let a = parse_success(body, RateHeaders::default(), None, 200).unwrap();
        assert_eq!(a.finish_reason, FinishReason::ContentFilter);
        let e = classify_error(
            429,
            br#"{"error":{"code":"429","message":"Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-10-21 have exceeded token rate limit of your current OpenAI S0 pricing tier. Please retry after 6 seconds."}}"#,
            RateHeaders::default(),
        );
        assert_eq!(e.class, ErrorClass::RateLimited);
        let e = classify_error(
            401,
            br#"{"error":{"code":"401","message":"Access denied due to invalid subscription key or wrong API endpoint."}}"#,
            RateHeaders::default(),
        );
        assert_eq!(e.class, ErrorClass::Auth);
    }
}
