//! A live run's numbers that cross between processes: the gauges an engine
//! writes with each heartbeat, and the operator's overrides of its limits.

/// The engine's own gauges, written with each heartbeat (`live_json`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct LiveGauges {
    /// Concurrency slots held (sent, or waiting for the rate limit). Not
    /// the console's "in flight": that is the ledger's count of requests
    /// sent and not answered.
    pub in_flight: u64,
    pub concurrency_limit: u64,
    pub max_concurrency: u64,
    /// Effective limits (ours or the server's, the lower); 0 = none.
    pub rpm_limit: u64,
    pub tpm_limit: u64,
    /// Requests and tokens the limiter let go over the last 60 seconds,
    /// counted when let go: never above the limits (batch lines are not
    /// counted: they are not requests against them).
    pub rpm_used: f64,
    pub tpm_used: f64,
    /// Empty when nothing is slowing the run; else a short reason.
    pub slow_reason: String,
    pub paused: bool,
    /// The stage being dispatched now.
    pub stage: String,
    /// Seconds since this engine started dispatching.
    pub elapsed_secs: f64,
    /// Its estimate of the time left, when it has one.
    pub eta_secs: Option<f64>,
    /// How long a request of the stage being dispatched may go unanswered
    /// before it is cut and sent again (0: an engine that did not say).
    pub deadline_secs: f64,
    /// The answer latency p99 the deadline was learned from; None while
    /// it is learning (the configured timeout applies).
    pub latency_p99_secs: Option<f64>,
    /// Requests cut at their deadline so far (each sent again).
    pub deadline_cuts: u64,
}

impl LiveGauges {
    /// The gauges an engine wrote; None for anything that does not parse
    /// (an engine of another version, a torn write): the console shows "no
    /// gauges", not an error.
    pub fn from_json(json: &str) -> Option<LiveGauges> {
        // Only an object: serde would also read a struct from an array.
        match serde_json::from_str::<serde_json::Value>(json).ok()? {
            v @ serde_json::Value::Object(_) => serde_json::from_value(v).ok(),
            _ => None,
        }
    }
}

/// Operator overrides of a live run's limits (NULL columns are None).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Tune {
    pub rpm: Option<u64>,
    pub tpm: Option<u64>,
    pub concurrency: Option<u64>,
}
