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

/// Whether arrays can borrow memory MLX did not allocate (zero-copy
/// [`crate::Array::from_shared_bytes`]). True on the CPU build, whose
/// allocator is probed once for the buffer layout this relies on; false on
/// the CUDA build, where such arrays are copies.
pub fn can_borrow() -> bool {
    bridge::borrowing_supported()
}
