//! How the engine reaches the built-in mock provider without depending on
//! it: a job whose provider is `kind = "mock"` asks the `StartMock` it was
//! given (`RunOptions::mock`) for a server on a free loopback port, talks to
//! it over real HTTP like any provider, and shuts it down at the end of the
//! run. The binary passes the mock crate's server; the engine never names it.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use docket_model::mock_config::MockConfig;

/// A started mock provider: where it listens, and how it stops.
pub trait RunningMock: Send + Sync {
    /// `http://127.0.0.1:PORT`, the base URL the provider clients are built with.
    fn base_url(&self) -> String;
    /// Stop listening and let in-flight answers finish.
    fn shutdown(self: Box<Self>) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

/// A mock provider on its way up (Err: why it could not listen, or its
/// settings were refused, as `InvalidInput`).
pub type Starting<'a> =
    Pin<Box<dyn Future<Output = std::io::Result<Box<dyn RunningMock>>> + Send + 'a>>;

/// Starts a mock provider with the job's `[providers.NAME.mock]` settings.
pub trait StartMock: Send + Sync {
    fn start(&self, config: MockConfig) -> Starting<'_>;
}

impl fmt::Debug for dyn StartMock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StartMock")
    }
}
