//! What every handler shares: the engine (once loaded), the options that
//! shape answers, the metrics and the shutdown state.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use mlxcel_runtime::engine::{Engine, ModelInfo};

use crate::errors::ApiError;
use crate::metrics::Metrics;
use crate::shutdown::Shutdown;

/// The server's shared state.
pub struct AppState {
    /// The engine, set once the bundle has loaded.
    pub engine: OnceLock<Arc<Engine>>,
    /// The model's name in responses until (and if) the bundle has none:
    /// the bundle file's stem.
    pub fallback_name: String,
    /// API keys (empty: no authentication).
    pub api_keys: Vec<Vec<u8>>,
    /// How long a request may run (`None`: no limit).
    pub timeout: Option<Duration>,
    /// Whether `/metrics` is served.
    pub metrics_enabled: bool,
    /// The metrics.
    pub metrics: Metrics,
    /// The shutdown state.
    pub shutdown: Shutdown,
    /// When the server started (Unix seconds: /v1/models' `created`).
    pub started: u64,
    next_id: AtomicU64,
}

impl AppState {
    /// The state of a server still loading its bundle.
    pub fn new(
        fallback_name: String,
        api_keys: Vec<Vec<u8>>,
        timeout: Option<Duration>,
        metrics_enabled: bool,
    ) -> AppState {
        AppState {
            engine: OnceLock::new(),
            fallback_name,
            api_keys,
            timeout,
            metrics_enabled,
            metrics: Metrics::new(),
            shutdown: Shutdown::new(),
            started: unix_now(),
            next_id: AtomicU64::new(1),
        }
    }

    /// The engine, or 503 while the bundle loads.
    pub fn engine(&self) -> Result<&Arc<Engine>, ApiError> {
        self.engine.get().ok_or_else(ApiError::loading)
    }

    /// The model, or 503 while the bundle loads.
    pub fn model(&self) -> Result<&Arc<ModelInfo>, ApiError> {
        Ok(self.engine()?.model())
    }

    /// The engine for a new generation: 503 while loading or shutting down.
    pub fn engine_for_request(&self) -> Result<&Arc<Engine>, ApiError> {
        if self.shutdown.is_draining() {
            return Err(ApiError::shutting_down());
        }
        self.engine()
    }

    /// The model's name in responses.
    pub fn model_name(&self) -> &str {
        match self.engine.get() {
            Some(engine) if !engine.model().name.is_empty() => &engine.model().name,
            _ => &self.fallback_name,
        }
    }

    /// A fresh request number (log lines, response ids).
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The shared state as handlers take it.
pub type Shared = Arc<AppState>;
