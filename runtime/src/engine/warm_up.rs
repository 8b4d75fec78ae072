//! Warming the model up before the engine reports ready.
//!
//! A process's first request pays one-time costs that later ones do not:
//! the weights' pages are read in on first touch, allocators fill their
//! pools, and on a CUDA GPU the first prompt that takes MLX's operations
//! (more rows than mlxcel's decode kernels take) spends about 0.3 s in its
//! first launches (docs/cuda.md "The server's warm-up"). A
//! server that answers `/health` only once the model is warm moves that
//! cost from its first client to its start, as llama-server's warm-up run
//! does (`--no-warmup` skips it in both).

use std::time::{Duration, Instant};

use mlxcel_mlx::Device;
use mlxcel_mlx::device::default_device;

use crate::backend::Backend;
use crate::error::Result;

/// Prompt tokens of the warm-up prefill on a GPU: more than the 32 rows
/// mlxcel's GPU kernels take (docs/cuda.md), so that it runs MLX's
/// operations, the path a long prompt takes.
pub(crate) const GPU_WARM_UP_TOKENS: usize = 64;

/// On the CPU every prompt runs mlxcel's kernels, a multi-row product for
/// two rows as for two thousand, and there is no first-launch cost to move:
/// two tokens (as llama-server's warm-up) touch every weight for a fraction
/// of a 64-token prefill's time (SmolLM2 on two cores: 164-179 ms for 64).
pub(crate) const CPU_WARM_UP_TOKENS: usize = 2;

/// Prefills `min(N, prefill_chunk)` tokens (N by the device, above) on a
/// sequence of its own (one chunk, as the scheduler would read them), then
/// runs one decode step, and releases the sequence: the backend keeps no
/// trace of it but what it keeps of any finished request (allocator pools,
/// loaded kernels). Returns the time it took, or `None` when the context has
/// no room for it.
pub(crate) fn warm_up(backend: &mut dyn Backend, prefill_chunk: usize, context: usize) -> Result<Option<Duration>> {
    let tokens = match default_device() {
        Device::Gpu => GPU_WARM_UP_TOKENS,
        Device::Cpu => CPU_WARM_UP_TOKENS,
    };
    // Room for the prompt and the decode step's token.
    let prompt = tokens.min(prefill_chunk).min(context.saturating_sub(1));
    if prompt == 0 {
        return Ok(None);
    }
    let start = Instant::now();
    let seq = backend.new_sequence();
    // Token 0 exists in every vocabulary; what the tokens are does not
    // change which kernels run.
    let result = backend
        .prefill(seq, &vec![0; prompt], true)
        .and_then(|_| backend.decode(&[(seq, 0)]))
        .map(|_| Some(start.elapsed()));
    backend.release_sequence(seq);
    result
}
