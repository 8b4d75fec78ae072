//! Evaluating a step: inline on the calling thread when it is all mlxcel
//! kernels, else MLX's eval; and what a step would run.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::array::{Array, to_list};
use crate::error::{Error, Result};
use crate::ffi::bridge;

/// Evaluates `outputs` like [`Array::eval_all`]. When every node still to
/// compute is one of mlxcel's CPU kernels (a decode step is), the nodes run
/// on the calling thread one after another, with the kernel pool, and never
/// pass through MLX's stream thread: no task queue, no wake-up of that thread
/// per node, no third thread competing for the cores (docs/kernels.md
/// "Evaluating a step inline"). Any other graph goes to MLX's eval, and so
/// does every graph after [`set_inline_eval`]`(false)`.
pub fn eval(outputs: &[&Array]) -> Result<()> {
    if inline_eval() && eval_inline(outputs)? {
        return Ok(());
    }
    Array::eval_all(outputs)
}

static INLINE_EVAL: AtomicBool = AtomicBool::new(true);

/// Whether [`eval`] tries [`eval_inline`] first (default true).
pub fn inline_eval() -> bool {
    INLINE_EVAL.load(Ordering::Relaxed)
}

/// Makes [`eval`] try inline evaluation (true) or send every graph to MLX's
/// eval (false: for comparison and debugging), process-wide.
pub fn set_inline_eval(on: bool) {
    INLINE_EVAL.store(on, Ordering::Relaxed);
}

static STEP_GRAPHS: AtomicBool = AtomicBool::new(true);

/// Whether GPU decode steps of mlxcel's kernels only are recorded once and
/// replayed as one CUDA graph ([`crate::fast::StepGraph`]). Default true
/// since the replay of SmolLM2's steps was checked on an H200 to compute
/// the node-by-node step's bits (docs/cuda.md "Decode steps replayed as
/// one CUDA graph"). The runtime's backend asks before recording.
pub fn step_graphs() -> bool {
    STEP_GRAPHS.load(Ordering::Relaxed)
}

/// Turns step graphs on or off (off: every step is built and evaluated node
/// by node, for comparison and debugging), process-wide.
pub fn set_step_graphs(on: bool) {
    STEP_GRAPHS.store(on, Ordering::Relaxed);
}

/// The inline half of [`eval`]: evaluates `outputs` on the calling thread and
/// returns true when every node still to compute is one of mlxcel's CPU
/// kernels (and none is traced); returns false, having computed nothing,
/// otherwise.
pub fn eval_inline(outputs: &[&Array]) -> Result<bool> {
    bridge::eval_inline(&to_list(outputs)).map_err(|e| Error::mlx("eval", e))
}

/// The operations (MLX primitive names) that evaluating `outputs` would run
/// now: one entry per graph node not yet computed.
pub fn pending_ops(outputs: &[&Array]) -> Vec<String> {
    bridge::pending_ops(&to_list(outputs))
}
