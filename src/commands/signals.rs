//! Ctrl-C and SIGTERM during a run, and the question about open provider
//! batches a typed Ctrl-C asks.

use std::io::{BufRead, Write};
use std::sync::Arc;

use docket::engine::Interrupts;
use docket::ledger::control::RunControls;
use docket::ledger::{Ledger, LedgerLocation};

/// Ctrl-C / SIGTERM: the first asks for a graceful stop, a second abandons
/// in-flight requests. Installed only once the run is going (after the
/// confirmation): until then Ctrl-C keeps its ordinary meaning and simply
/// ends docket, with nothing created and nothing sent.
pub(super) fn spawn_signal_handler(interrupts: &Interrupts, batches: Option<BatchQuestion>) {
    let i = interrupts.clone();
    tokio::spawn(async move {
        #[cfg(unix)]
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        let mut count = 0;
        loop {
            #[cfg(unix)]
            let got = async {
                match term.as_mut() {
                    Some(t) => t.recv().await.map(|_| ()),
                    None => std::future::pending().await,
                }
            };
            #[cfg(not(unix))]
            let got = std::future::pending::<Option<()>>();
            // Only a Ctrl-C typed at the terminal is asked about; SIGTERM
            // stops without a question.
            let typed = tokio::select! {
                r = tokio::signal::ctrl_c() => if r.is_err() { return } else { true },
                _ = got => false,
            };
            count += 1;
            if count > 1 {
                i.abort.cancel();
                continue;
            }
            let ask = batches.as_ref().filter(|_| typed);
            match ask.and_then(BatchQuestion::open_batches) {
                // Provider batches keep running (and billing) after a stop:
                // on a terminal, ask whether they go too.
                Some(n) if n > 0 => {
                    let i = i.clone();
                    tokio::spawn(async move {
                        let yes = tokio::task::spawn_blocking(move || ask_cancel_batches(n))
                            .await
                            .unwrap_or(false);
                        if yes {
                            i.cancel_batches.cancel();
                        }
                        i.stop.cancel();
                    });
                }
                _ => i.stop.cancel(),
            }
        }
    });
}

/// Where a headless run on a terminal looks for its open provider batches
/// when Ctrl-C comes.
#[derive(Clone)]
pub(super) struct BatchQuestion {
    pub(super) ledger: LedgerLocation,
    pub(super) session: Arc<std::sync::Mutex<Option<String>>>,
}

impl BatchQuestion {
    fn open_batches(&self) -> Option<u64> {
        let id = self.session.lock().ok()?.clone()?;
        let ledger = Ledger::open_read_only(&self.ledger).ok()?;
        ledger.open_provider_batches(&id).ok()
    }
}

fn ask_cancel_batches(n: u64) -> bool {
    print!(
        "\nStopping. {n} provider batch(es) of this session are still open: the provider keeps running them (and bills for them) unless they are cancelled.\nCancel them too, collecting what they finished? [y/N]: "
    );
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    if std::io::stdin().lock().read_line(&mut line).is_err() {
        return false;
    }
    matches!(line.trim().to_ascii_lowercase().as_str(), "y" | "yes")
}
