//! Warming the model up before the engine reports ready.
//!
//! A process's first request pays one-time costs that later ones do not:
//! the weights' pages are read in on first touch, allocators fill their
//! pools, and on a CUDA GPU the first prompt that takes MLX's operations
//! (more rows than mlxcel's decode kernels take) spends about 0.3 s in its
//! first launches (docs/cuda.md "Where the first token's time goes"). A
//! server that answers `/health` only once the model is warm moves that
//! cost from its first client to its start, as llama-server's warm-up run
//! does (`--no-warmup` skips it in both).

use std::time::{Duration, Instant};

use crate::backend::Backend;
use crate::error::Result;

/// Prompt tokens of the warm-up prefill: more than the 32 rows mlxcel's GPU
/// kernels take (docs/cuda.md), so that it runs the path a long prompt
/// takes; small enough to cost tens of milliseconds on a CPU.
pub(crate) const WARM_UP_TOKENS: usize = 64;

/// Prefills `min(WARM_UP_TOKENS, prefill_chunk)` tokens on a sequence of its
/// own (one chunk, as the scheduler would read them), then runs one decode
/// step, and releases the sequence: the backend keeps no trace of it but
/// what it keeps of any finished request (allocator pools, loaded kernels).
/// Returns the time it took, or `None` when the context has no room for it.
pub(crate) fn warm_up(backend: &mut dyn Backend, prefill_chunk: usize, context: usize) -> Result<Option<Duration>> {
    // Room for the prompt and the decode step's token.
    let prompt = WARM_UP_TOKENS.min(prefill_chunk).min(context.saturating_sub(1));
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
