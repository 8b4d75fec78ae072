//! The bridge between the engine's blocking event stream and async
//! handlers. Each request's [`Generating`] is drained on a blocking task
//! into a channel; the handler side ([`Events`]) holds the request's
//! [`Canceller`] and cancels on drop, so a client that goes away (its
//! response body dropped) frees its slot within a decode step. [`Events`]
//! also enforces `--timeout` and the end of the shutdown grace period, and
//! measures the latencies of the metrics.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mlxcel_runtime::Error;
use mlxcel_runtime::engine::{Canceller, Engine, Event, Request};
use tokio::sync::mpsc;

use crate::errors::ApiError;
use crate::state::AppState;

/// Cancels the request when dropped.
struct CancelOnDrop(Canceller);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// A request's events, as an async source.
pub struct Events {
    rx: mpsc::UnboundedReceiver<Event>,
    cancel: CancelOnDrop,
    deadline: Option<(tokio::time::Instant, u64)>,
    shutdown: Pin<Box<dyn Future<Output = ()> + Send>>,
    state: Arc<AppState>,
    submitted: Instant,
    last_token: Option<Instant>,
    /// Time from submission to the first token.
    pub time_to_first_token: Option<Duration>,
    /// Tokens received so far.
    pub tokens: usize,
    ended: bool,
}

impl Events {
    /// Submits `request`; the engine's refusals at submission (the queue is
    /// full, the KV budget, a token outside the vocabulary) come back at once.
    pub fn submit(engine: &Engine, state: Arc<AppState>, request: Request) -> Result<Events, Error> {
        let generating = engine.submit(request)?;
        let cancel = CancelOnDrop(generating.canceller());
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::task::spawn_blocking(move || {
            for event in generating {
                if tx.send(event).is_err() {
                    // Dropping `generating` cancels the request.
                    break;
                }
            }
        });
        let deadline = state.timeout.map(|t| (tokio::time::Instant::now() + t, t.as_secs()));
        let shutdown = Box::pin(state.shutdown.cancelled());
        Ok(Events {
            rx,
            cancel,
            deadline,
            shutdown,
            state,
            submitted: Instant::now(),
            last_token: None,
            time_to_first_token: None,
            tokens: 0,
            ended: false,
        })
    }

    /// The next event; `Err` for a timeout, the end of the shutdown grace,
    /// or an engine that stopped. `None` after the last.
    pub async fn next(&mut self) -> Option<Result<Event, ApiError>> {
        if self.ended {
            return None;
        }
        let deadline = self.deadline;
        let timeout = async move {
            match deadline {
                Some((at, _)) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let event = tokio::select! {
            event = self.rx.recv() => event,
            () = timeout => return Some(Err(self.abort(ApiError::timeout(deadline.map_or(0, |d| d.1))))),
            () = &mut self.shutdown => return Some(Err(self.abort(ApiError::shutting_down()))),
        };
        let Some(event) = event else {
            return Some(Err(self.abort(Error::EngineStopped.into())));
        };
        match &event {
            Event::Token { .. } => {
                self.tokens += 1;
                let now = Instant::now();
                let metrics = &self.state.metrics;
                match self.last_token {
                    None => {
                        let ttft = now - self.submitted;
                        self.time_to_first_token = Some(ttft);
                        metrics.time_to_first_token.observe(ttft.as_secs_f64());
                    }
                    Some(last) => metrics.inter_token_latency.observe((now - last).as_secs_f64()),
                }
                self.last_token = Some(now);
            }
            Event::Done { stats, .. } => {
                self.ended = true;
                self.state.metrics.prompt_tokens.inc_by(stats.prompt_tokens as u64);
                self.state.metrics.generation_tokens.inc_by(stats.generated_tokens as u64);
            }
            Event::Failed(_) => self.ended = true,
            Event::Text(_) => {}
        }
        Some(Ok(event))
    }

    fn abort(&mut self, error: ApiError) -> ApiError {
        self.ended = true;
        self.cancel.0.cancel();
        error
    }
}
