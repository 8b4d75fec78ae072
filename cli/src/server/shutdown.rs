//! Graceful shutdown: on SIGTERM or Ctrl-C the server stops accepting
//! connections and refuses new requests (503 "shutting_down"), lets the
//! requests in flight finish for `--shutdown-grace` seconds, then cancels
//! the rest (their streams end with an error event and `[DONE]`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::watch;

/// The shutdown state every request can see.
pub struct Shutdown {
    draining: AtomicBool,
    cancel: watch::Sender<bool>,
}

impl Shutdown {
    /// Running, not shutting down.
    pub fn new() -> Shutdown {
        Shutdown { draining: AtomicBool::new(false), cancel: watch::Sender::new(false) }
    }

    /// Whether shutdown has begun (new requests are refused).
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Begins the shutdown: new requests are refused from now on.
    pub fn begin(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Cancels every request still in flight.
    pub fn cancel_all(&self) {
        self.cancel.send_replace(true);
    }

    /// Resolves once [`Shutdown::cancel_all`] was called.
    pub fn cancelled(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.cancel.subscribe();
        async move {
            // An error means the sender is gone: the server is gone too.
            let _ = rx.wait_for(|&cancelled| cancelled).await;
        }
    }
}

/// Resolves on the first SIGTERM or Ctrl-C (SIGINT).
pub async fn signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = terminate => {},
    }
}

/// What the server's graceful shutdown waits on: the signal, then begins
/// draining and arms the grace period's end, after which everything still
/// running is cancelled.
pub async fn on_signal(state: std::sync::Arc<crate::state::AppState>, grace: Duration) {
    signal().await;
    tracing::info!(grace_seconds = grace.as_secs(), "shutting down: finishing the requests in flight");
    state.shutdown.begin();
    tokio::spawn(async move {
        tokio::time::sleep(grace).await;
        tracing::info!("shutdown grace period over: cancelling the requests still running");
        state.shutdown.cancel_all();
    });
}
