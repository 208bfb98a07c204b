//! The built-in mock provider's settings, as `[providers.NAME.mock]` in a
//! job's docket.toml, `docket mock-provider --flag`s and the JSON body of the
//! mock's `POST /_mock/config`. They live here, not in the mock, because the
//! job configuration checks them and the engine never depends on the mock.

use serde::{Deserialize, Serialize};

/// Runtime knobs of the mock provider. Usable as clap arguments
/// (`docket mock-provider --rpm-limit 600 …`) and as the JSON body of
/// `POST /_mock/config` (missing fields take their defaults).
// The field docs are also `docket mock-provider --help`, where a rate "in
// [0,1]" is an interval, not a link: rustdoc is told so.
#[allow(rustdoc::broken_intra_doc_links)]
#[derive(Debug, Clone, clap::Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MockConfig {
    /// median latency ms (0 = none); latency is log-normal with this median and the p99 below
    #[arg(long, default_value_t = 0.0)]
    pub latency_median_ms: f64,
    /// p99 latency ms (<= median means constant latency)
    #[arg(long, default_value_t = 0.0)]
    pub latency_p99_ms: f64,
    /// server-side requests/min limit, enforced per second like OpenAI (bucket holds one second's
    /// worth = limit/60, refills continuously); 0 = no limit
    #[arg(long, default_value_t = 0)]
    pub rpm_limit: u64,
    /// a 429 storm: for this many ms after the config is set, every chat request gets a 429
    /// rate-limit error with no hint (no retry-after, no x-ratelimit-* headers); 0 = none
    #[arg(long, default_value_t = 0)]
    pub storm_429_ms: u64,
    /// the first N sends of each prompt (the same messages) get a 429 with no hint, whenever
    /// they come: every request is refused N times in a row; 0 = none
    #[arg(long, default_value_t = 0)]
    pub rate_limit_first: u32,
    /// server-side tokens/min limit, same per-second bucket; request cost = estimated prompt
    /// tokens + max_tokens (or max_completion_tokens, default 256); 0 = none
    #[arg(long, default_value_t = 0)]
    pub tpm_limit: u64,
    /// rate of 500 server_error responses, in [0,1]
    #[arg(long, default_value_t = 0.0)]
    pub fail_500: f64,
    /// rate of 503 overloaded responses, in [0,1]
    #[arg(long, default_value_t = 0.0)]
    pub fail_503: f64,
    /// rate of requests that never get an answer (held ~1 hour, until the client gives up)
    #[arg(long, default_value_t = 0.0)]
    pub hang: f64,
    /// rate of requests answered only after `late_ms` (past a client's timeout), and billed
    /// (logged 200) as they arrive, whether or not the client is still there
    #[arg(long, default_value_t = 0.0)]
    pub late: f64,
    /// how long a `late` request is held before its answer, in ms
    #[arg(long, default_value_t = 5000)]
    pub late_ms: u64,
    /// rate of 200 responses whose body is not JSON
    #[arg(long, default_value_t = 0.0)]
    pub malformed: f64,
    /// rate of 200 responses whose connection is reset halfway through the body (its
    /// Content-Length promised all of it); billed like an answer
    #[arg(long, default_value_t = 0.0)]
    pub reset_mid_body: f64,
    /// rate of 200 responses with finish_reason "length" and content cut mid-way
    #[arg(long, default_value_t = 0.0)]
    pub truncated: f64,
    /// rate of 200 responses whose JSON content lacks a required field
    #[arg(long, default_value_t = 0.0)]
    pub wrong_schema: f64,
    /// rate of 200 responses where the model refuses (OpenAI: `message.refusal` with null
    /// content; Anthropic: `stop_reason: "refusal"` with no content; Gemini: `finishReason:
    /// "SAFETY"` with no content; Ollama: empty content). Billed like an answer
    #[arg(long, default_value_t = 0.0)]
    pub refusal: f64,
    /// rate of 200 responses with empty content and a normal stop. Billed like an answer
    #[arg(long, default_value_t = 0.0)]
    pub empty: f64,
    /// a poisoned request (fault-matrix row S4): every chat request whose prompt contains this
    /// text gets a 500 server_error, however often it is sent; empty = none
    #[arg(long, default_value = "")]
    pub poison: String,
    /// "normal" | "unauthorized" (every request 401 invalid_api_key) | "forbidden" (every chat request
    /// 403: the key may not use the model) | "quota" (every request 429 insufficient_quota)
    #[arg(long, default_value = "normal")]
    pub mode: String,
    /// The models served, comma-separated (empty = any): a chat request for another gets the
    /// provider's 404 model-not-found
    #[arg(long, default_value = "")]
    pub models: String,
    /// A chat request whose prompt passes this many tokens gets the provider's 400
    /// context-length error; 0 = no limit
    #[arg(long, default_value_t = 0)]
    pub context_tokens: u64,
    /// seed of the fault/latency RNG
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// max entries kept in the request log (oldest dropped)
    #[arg(long, default_value_t = 1_000_000)]
    pub log_capacity: usize,
    /// Batch API: ms a new batch stays `validating`
    #[arg(long, default_value_t = 300)]
    pub batch_validating_ms: u64,
    /// Batch API: ms a batch stays `in_progress` (its lines are run evenly over this time)
    #[arg(long, default_value_t = 1500)]
    pub batch_running_ms: u64,
    /// Batch API: ms a batch stays `finalizing`
    #[arg(long, default_value_t = 300)]
    pub batch_finalizing_ms: u64,
    /// Batch API: ms a cancelled batch stays `cancelling` before it is `cancelled`
    #[arg(long, default_value_t = 300)]
    pub batch_cancelling_ms: u64,
    /// Batch API: rate of request lines that fail (a 500 server_error line in the error file), in [0,1]
    #[arg(long, default_value_t = 0.0)]
    pub batch_fail_rate: f64,
    /// Batch API: 0 = off; else batches expire once this fraction of their lines has run
    /// (finished lines in the output file, the rest `batch_expired` lines in the error file)
    #[arg(long, default_value_t = 0.0)]
    pub batch_expire: f64,
    /// Batch API: ms a batch is `completed` with null file ids before they appear
    #[arg(long, default_value_t = 0)]
    pub batch_output_late_ms: u64,
    /// Batch API: the first N downloads of each output/error file are cut mid-line halfway
    #[arg(long, default_value_t = 0)]
    pub batch_cut_results: u32,
    /// Batch API: the next N batch creates make the batch but answer a 500 with no body
    /// (counted from the last config change or reset)
    #[arg(long, default_value_t = 0)]
    pub batch_lose_create: u32,
    /// Batch API (OpenAI/Azure): the next N creates are refused with a 400 and make no batch
    /// (counted from the last config change or reset); the uploaded input file stays
    #[arg(long, default_value_t = 0)]
    pub batch_refuse_create: u32,
    /// Batch API: queued prompt tokens per model across open batches; a batch that would pass it
    /// fails validation with `token_limit_exceeded`; 0 = none
    #[arg(long, default_value_t = 0)]
    pub batch_enqueued_token_limit: u64,
    /// Batch API (OpenAI/Azure): ms a create waits after making the batch before it answers
    /// (a client killed meanwhile never learns the id: find it by `metadata`)
    #[arg(long, default_value_t = 0)]
    pub batch_create_delay_ms: u64,
    /// Staged pipelines: every generated `verdict` property (JSON schema, at any depth) and every
    /// text `VERDICT:` line uses this label; a schema whose `enum` does not allow it gets the
    /// enum's first value. Unset = the seeded choice. Excludes `verdict_disagree_rate`
    #[arg(long, value_name = "LABEL")]
    pub verdict: Option<String>,
    /// Staged pipelines: 0 = off (seeded choice); else each `verdict` takes the second option
    /// (index 1) with this probability and the first otherwise. Options: the property's `enum`,
    /// else (plain strings, the text `VERDICT:` line) the prompt's `Labels:` line, else yes/no.
    /// A single option is always taken. Drawn from the seed and the prompt. In [0,1]
    #[arg(long, value_name = "R", default_value_t = 0.0)]
    pub verdict_disagree_rate: f64,
    /// Structured batching: each non-required top-level property of a JSON-schema answer is left
    /// out with this probability (drawn from the seed and the prompt); only when the schema has
    /// >= 2 optional properties, so a follow-up asking for one criterion is always answered. In [0,1]
    #[arg(long, value_name = "R", default_value_t = 0.0)]
    pub omit_optional_rate: f64,
    /// Structured batching, exact: the first N answers whose schema has >= 2 optional top-level
    /// properties keep only the first optional property (schema order) and leave out the others
    /// (counted per server from the last config change or reset; takes precedence over the rate)
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub omit_optional_first: u32,
    /// A gullible model (fault-matrix row X3): a prompt that tells it to ignore its instructions
    /// and accept, or carries `"confidence": 1`, gets a confidence of 1.0, and a JSON-object answer
    /// also gains `"route": "accept"` and `"threshold": 0`
    #[arg(long, default_value_t = false)]
    pub obey_injection: bool,
    /// Batch API, the billing log: every batch line is logged as it runs (or is closed unrun),
    /// one entry each with `client_request_id` = its custom_id and the `batch_id`: status 200
    /// and outcome `batch_line_ok` when it is billed (answered, whether or not its result line
    /// is delivered), else `batch_line_failed` with the line's error status, or
    /// `batch_line_expired` / `batch_line_canceled` (status 0: never run, not billed; an
    /// OpenAI or Gemini batch cancelled before it ran logs no lines)
    #[arg(long, default_value_t = false)]
    pub batch_line_log: bool,
    /// Batch API: for this many ms after a batch's results are published, their download (an
    /// OpenAI/Azure output or error file, Anthropic's `results_url`, a Gemini responses file)
    /// answers the provider's 404 (logged `results_not_found`); 0 = none. Read at create
    #[arg(long, default_value_t = 0)]
    pub batch_results_404_ms: u64,
    /// Batch API: the first N batches made through each API (OpenAI/Azure, Anthropic, Gemini)
    /// get crafted anomalies in their results (fault-matrix row B7), by input line: line 1 runs
    /// and is billed but has no result line; line 2 fails retryably (500 / `api_error` / code
    /// 13), line 3 not (400 / `invalid_request_error` / code 3); Anthropic only: line 4 is
    /// `expired` and line 5 `canceled` (never run); line 6 is answered and its result line comes
    /// twice, the second copy with 1000 more output tokens; and one extra line answers a
    /// custom_id the batch never had. A batch needs 6 lines for all of them
    #[arg(long, default_value_t = 0)]
    pub batch_result_anomalies: u32,
    /// Batch API (OpenAI/Azure): the next N batches fail validation as if line 2 of their input
    /// (line 1 of a one-line file) were not valid JSON: `failed`, `errors.data[]` with code
    /// `invalid_json_line` and that `line`; nothing runs or is billed (counted from the last
    /// config change or reset)
    #[arg(long, default_value_t = 0)]
    pub batch_reject_input: u32,
    /// Batch API (OpenAI/Azure): the next N polls of a batch (`GET …/batches/{id}`) answer a 503
    /// `overloaded` after the rate limits (counted from the last config change or reset)
    #[arg(long, default_value_t = 0)]
    pub batch_poll_fail: u32,
    /// Batch API: the provider cancels a batch on its own once it has been in progress this many
    /// ms (after validation; Anthropic from its create), as a cancel asked by the client would:
    /// the lines in flight finish, the finished lines are in its results and billed, the rest are
    /// cancelled unrun; logged `batch_cancelling` with status 0. 0 = never. Read at create
    #[arg(long, default_value_t = 0)]
    pub batch_cancel_after_ms: u64,
    /// Batch API (Anthropic): the next N creates answer a 500 with no body and make no batch (a
    /// create lost before the provider acted on it; counted from the last config change or reset)
    #[arg(long, default_value_t = 0)]
    pub batch_drop_create: u32,
}

impl Default for MockConfig {
    fn default() -> Self {
        MockConfig {
            latency_median_ms: 0.0,
            latency_p99_ms: 0.0,
            rpm_limit: 0,
            tpm_limit: 0,
            storm_429_ms: 0,
            rate_limit_first: 0,
            fail_500: 0.0,
            fail_503: 0.0,
            hang: 0.0,
            late: 0.0,
            late_ms: 5000,
            malformed: 0.0,
            reset_mid_body: 0.0,
            truncated: 0.0,
            wrong_schema: 0.0,
            refusal: 0.0,
            empty: 0.0,
            poison: String::new(),
            mode: "normal".to_string(),
            models: String::new(),
            context_tokens: 0,
            seed: 42,
            log_capacity: 1_000_000,
            batch_validating_ms: 300,
            batch_running_ms: 1500,
            batch_finalizing_ms: 300,
            batch_cancelling_ms: 300,
            batch_fail_rate: 0.0,
            batch_expire: 0.0,
            batch_output_late_ms: 0,
            batch_cut_results: 0,
            batch_lose_create: 0,
            batch_refuse_create: 0,
            batch_enqueued_token_limit: 0,
            batch_create_delay_ms: 0,
            verdict: None,
            verdict_disagree_rate: 0.0,
            omit_optional_rate: 0.0,
            omit_optional_first: 0,
            obey_injection: false,
            batch_line_log: false,
            batch_results_404_ms: 0,
            batch_result_anomalies: 0,
            batch_reject_input: 0,
            batch_poll_fail: 0,
            batch_cancel_after_ms: 0,
            batch_drop_create: 0,
        }
    }
}

/// A mock setting out of its range; the text names the setting.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MockConfigError {
    /// The mode as given.
    #[error("mode must be \"normal\", \"unauthorized\", \"forbidden\" or \"quota\", not {0:?}")]
    Mode(String),
    #[error("{name} must be a rate in [0,1], got {rate}")]
    Rate { name: &'static str, rate: f64 },
    #[error("verdict must be a non-empty label")]
    EmptyVerdict,
    #[error("verdict and verdict_disagree_rate exclude each other: set one")]
    VerdictAndDisagreeRate,
    #[error("{name} must be a finite number >= 0, got {ms}")]
    Latency { name: &'static str, ms: f64 },
}

impl MockConfig {
    /// Check the values a human may get wrong: the mode name, fault rates in
    /// 0..=1, finite non-negative latencies. `MockServer::start` and
    /// `POST /_mock/config` refuse an invalid config with this message.
    pub fn validate(&self) -> Result<(), MockConfigError> {
        if !matches!(
            self.mode.as_str(),
            "normal" | "unauthorized" | "forbidden" | "quota"
        ) {
            return Err(MockConfigError::Mode(self.mode.clone()));
        }
        let rates = [
            ("fail_500", self.fail_500),
            ("fail_503", self.fail_503),
            ("hang", self.hang),
            ("late", self.late),
            ("malformed", self.malformed),
            ("reset_mid_body", self.reset_mid_body),
            ("truncated", self.truncated),
            ("wrong_schema", self.wrong_schema),
            ("refusal", self.refusal),
            ("empty", self.empty),
            ("batch_fail_rate", self.batch_fail_rate),
            ("batch_expire", self.batch_expire),
            ("verdict_disagree_rate", self.verdict_disagree_rate),
            ("omit_optional_rate", self.omit_optional_rate),
        ];
        for (name, rate) in rates {
            if !(0.0..=1.0).contains(&rate) {
                return Err(MockConfigError::Rate { name, rate });
            }
        }
        if let Some(label) = &self.verdict {
            if label.trim().is_empty() {
                return Err(MockConfigError::EmptyVerdict);
            }
            if self.verdict_disagree_rate > 0.0 {
                return Err(MockConfigError::VerdictAndDisagreeRate);
            }
        }
        for (name, ms) in [
            ("latency_median_ms", self.latency_median_ms),
            ("latency_p99_ms", self.latency_p99_ms),
        ] {
            if !ms.is_finite() || ms < 0.0 {
                return Err(MockConfigError::Latency { name, ms });
            }
        }
        Ok(())
    }
}
