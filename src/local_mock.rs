//! The built-in mock provider, handed to the engine for `kind = "mock"`:
//! the engine knows only its `StartMock` trait, so it never depends on the
//! mock crate; this is where the two meet.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use docket_engine::mock::{RunningMock, StartMock, Starting};
use docket_mock::{MockConfig, MockServer};

/// Starts `docket_mock::MockServer` on a free loopback port.
struct BuiltIn;

/// A started built-in mock.
struct Running(MockServer);

impl RunningMock for Running {
    fn base_url(&self) -> String {
        self.0.base_url()
    }

    fn shutdown(self: Box<Self>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(self.0.shutdown())
    }
}

impl StartMock for BuiltIn {
    fn start(&self, config: MockConfig) -> Starting<'_> {
        Box::pin(async move {
            let server = MockServer::start(config, SocketAddr::from(([127, 0, 0, 1], 0))).await?;
            Ok(Box::new(Running(server)) as Box<dyn RunningMock>)
        })
    }
}

/// What `RunOptions::mock` is set to by every command that runs a job.
pub fn starter() -> Arc<dyn StartMock> {
    Arc::new(BuiltIn)
}
