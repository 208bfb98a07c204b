//! Live updates from a PostgreSQL ledger by LISTEN/NOTIFY: the transactions
//! that change a session's controls notify `docket_control` (payload: the
//! session id) and the ledger writer's groups notify `docket_change`, both
//! delivered when they commit. A worker wakes its control loop on the
//! first, a console re-reads on the second, within milliseconds instead of
//! at their next poll. Polling stays: a notification lost while the
//! listener reconnects costs only the poll's delay.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use postgres::fallible_iterator::FallibleIterator;

use super::{PgUrl, connect};

/// Run controls changed; the payload is the session's id.
pub const CONTROL_CHANNEL: &str = "docket_control";
/// Results, reviews or events were committed.
pub const CHANGE_CHANNEL: &str = "docket_change";

/// How long the listener waits for a notification before it checks
/// whether it should stop.
const WAIT: Duration = Duration::from_millis(250);
/// The wait before connecting again after the connection was lost.
const RECONNECT_WAIT: Duration = Duration::from_secs(1);

/// A notification: its channel and payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub channel: String,
    pub payload: String,
}

/// A listening thread; it stops when this is dropped.
pub struct Listener {
    stop: Arc<AtomicBool>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Listen on both channels of the ledger at `url` on a thread of its own
/// (with a connection of its own), calling `on` for each notification.
pub fn listen(url: PgUrl, on: impl Fn(Notice) + Send + 'static) -> Listener {
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    let spawned = std::thread::Builder::new()
        .name("ledger-listen".into())
        .spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                if let Err(e) = listen_once(&url, &stopped, &on) {
                    tracing::debug!("ledger notifications: {e}; listening again");
                }
                if !stopped.load(Ordering::Relaxed) {
                    std::thread::sleep(RECONNECT_WAIT);
                }
            }
        });
    if let Err(e) = spawned {
        // Polling still serves: the updates only come later.
        tracing::warn!("cannot start the ledger listener: {e}");
    }
    Listener { stop }
}

/// One connection's worth of listening; returns when the connection fails
/// or `stop` is set.
fn listen_once(url: &PgUrl, stop: &AtomicBool, on: &impl Fn(Notice)) -> Result<(), String> {
    let mut client = connect(url).map_err(|e| e.to_string())?;
    client
        .batch_execute(&format!(
            "LISTEN {CONTROL_CHANNEL}; LISTEN {CHANGE_CHANNEL}"
        ))
        .map_err(|e| super::detail(&e))?;
    while !stop.load(Ordering::Relaxed) {
        {
            let mut notices = client.notifications();
            let mut waiting = notices.timeout_iter(WAIT);
            while let Some(n) = waiting.next().map_err(|e| super::detail(&e))? {
                on(Notice {
                    channel: n.channel().to_string(),
                    payload: n.payload().to_string(),
                });
            }
        }
        if client.is_closed() {
            return Err("the connection was closed".into());
        }
    }
    Ok(())
}
