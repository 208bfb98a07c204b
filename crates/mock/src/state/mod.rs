//! The server's shared state, in one place: `Shared`, which every handler
//! gets as axum state, with the live config (`Live`, `Mode`), the rate
//! buckets, fault RNG, stats recorder, id counter and shutdown flag, and the
//! stores of the Files/Batches APIs (children: `openai` for OpenAI/Azure
//! files and batches, `anthropic` for Message Batches, `gemini` for Gemini's
//! files and batches, which its routes carry as their own extension state).
//! Plus `lock` and `json_response`, the helpers every handler uses.
//!
//! Contract: the live config is an `Arc` swapped under an `RwLock`, so a
//! handler sees one consistent config for its whole life; the rate buckets
//! and fault RNG are one `Mutex` each, taken only when limits/faults are on.
//! `set_config` and `reset` (admin routes in `server`) clear the per-config
//! budgets here.

pub(crate) mod anthropic;
pub(crate) mod gemini;
pub(crate) mod openai;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::MockConfig;
use crate::faults::{FaultPlan, FaultRng};
use crate::limits::Limits;
use crate::stats::Recorder;
use crate::wire::splitmix;
use openai::Store;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Normal,
    Unauthorized,
    Forbidden,
    Quota,
}

/// A config plus what is derived from it once, instead of per request.
pub(crate) struct Live {
    pub config: MockConfig,
    pub mode: Mode,
    pub plan: FaultPlan,
    pub quiet: bool,
    pub limits_on: bool,
    /// When this config was set (the 429 storm runs from here).
    pub set_at: std::time::Instant,
}

impl Live {
    fn new(config: MockConfig) -> Live {
        let mode = match config.mode.as_str() {
            "unauthorized" => Mode::Unauthorized,
            "forbidden" => Mode::Forbidden,
            "quota" => Mode::Quota,
            // `set_config` cannot report errors; an unknown mode behaves like "normal".
            _ => Mode::Normal,
        };
        let plan = FaultPlan::from_config(&config);
        Live {
            mode,
            quiet: plan.is_quiet(),
            plan,
            limits_on: config.rpm_limit > 0 || config.tpm_limit > 0,
            set_at: std::time::Instant::now(),
            config,
        }
    }
}

pub(crate) struct Shared {
    live: RwLock<Arc<Live>>,
    pub limits: Mutex<Limits>,
    pub rng: Mutex<FaultRng>,
    /// files and batches of the Files/Batches APIs
    pub store: Mutex<Store>,
    /// Anthropic's Message Batches
    pub anthropic_batches: Mutex<anthropic::Store>,
    pub stats: Recorder,
    /// counter behind response and request ids
    pub ids: AtomicU64,
    /// makes ids differ between server instances
    pub salt: u64,
    /// answers that used up the `omit_optional_first` budget since the last config change or reset
    pub omit_first_used: AtomicU32,
    /// the bytes of every file deleted through the Files APIs (OpenAI/Azure ids, Gemini
    /// `files/…` names), for a test's billing oracle (`MockServer::deleted_file`)
    pub deleted_files: Mutex<std::collections::HashMap<String, axum::body::Bytes>>,
    /// polls failed by `batch_poll_fail` since the last config change or reset
    pub poll_failures: AtomicU32,
    /// 429s given per prompt (its hash) for `rate_limit_first`
    pub refused_first: Mutex<std::collections::HashMap<String, u32>>,
    pub(crate) shutdown: watch::Sender<bool>,
}

impl Shared {
    pub(crate) fn new(config: MockConfig) -> Shared {
        let now = Instant::now();
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Shared {
            limits: Mutex::new(Limits::new(config.rpm_limit, config.tpm_limit, now)),
            rng: Mutex::new(FaultRng::new(config.seed)),
            store: Mutex::new(Store::default()),
            anthropic_batches: Mutex::default(),
            stats: Recorder::new(now),
            ids: AtomicU64::new(0),
            salt: splitmix(nanos ^ config.seed),
            omit_first_used: AtomicU32::new(0),
            deleted_files: Mutex::default(),
            poll_failures: AtomicU32::new(0),
            refused_first: Mutex::new(std::collections::HashMap::new()),
            shutdown: watch::channel(false).0,
            live: RwLock::new(Arc::new(Live::new(config))),
        }
    }

    pub(crate) fn live(&self) -> Arc<Live> {
        Arc::clone(&self.live.read().unwrap_or_else(|e| e.into_inner()))
    }

    pub(crate) fn set_config(&self, config: MockConfig) {
        let now = Instant::now();
        let old_seed = self.live().config.seed;
        lock(&self.limits).reconfigure(config.rpm_limit, config.tpm_limit, now);
        if config.seed != old_seed {
            *lock(&self.rng) = FaultRng::new(config.seed);
        }
        self.stats.trim_log(config.log_capacity);
        {
            let mut store = lock(&self.store);
            store.lost_creates = 0;
            store.refused_creates = 0;
            store.rejected_inputs = 0;
            store.dropped_creates = 0;
        }
        self.omit_first_used.store(0, Relaxed);
        self.poll_failures.store(0, Relaxed);
        *self.live.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(Live::new(config));
    }

    /// Resolves once shutdown has begun; long sleeps race against it.
    pub(crate) async fn stopping(&self) {
        let mut rx = self.shutdown.subscribe();
        // An Err means the sender is gone, which also means we are stopping.
        let _ = rx.wait_for(|stop| *stop).await;
    }
}

/// Lock, ignoring poisoning: the guarded data stays consistent between statements.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn json_response(status: StatusCode, body: Vec<u8>) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}
