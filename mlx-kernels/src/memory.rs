//! MLX's memory counters (bytes held by arrays and MLX's buffer cache).

use crate::ffi::bridge;

/// Bytes currently held by live arrays.
pub fn active() -> usize {
    bridge::active_memory()
}

/// The most bytes held at once since start or the last [`reset_peak`].
pub fn peak() -> usize {
    bridge::peak_memory()
}

/// Restarts [`peak`] from the current usage.
pub fn reset_peak() {
    bridge::reset_peak_memory()
}

/// Bytes MLX keeps cached for reuse.
pub fn cache() -> usize {
    bridge::cache_memory()
}

/// Returns MLX's cached buffers to the system.
pub fn clear_cache() {
    bridge::clear_cache()
}
