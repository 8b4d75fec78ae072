//! Decode steps recorded once as one CUDA graph of mlxcel's kernels and
//! replayed for the following steps (`cpp/nodes/gpu_graph.cc`).
//!
//! A GPU decode step built and evaluated node by node costs the host more
//! than the GPU's work (docs/cuda.md "Where a decode step's host time
//! goes"). Consecutive decode steps of the same sequences run the same
//! kernels on the same buffers; only the token ids and the cache positions
//! change. [`StepGraph::record`] evaluates a step as [`crate::fast::eval`]
//! would and, when every node of it is one of mlxcel's GPU nodes, keeps its
//! kernel launches as a CUDA graph; [`StepGraph::replay`] runs that graph
//! for the next token ids and positions and copies the logits out: no graph
//! of nodes is built or evaluated. A replay computes what the node-by-node
//! step would, bit for bit (the same kernels with the same arguments).
//!
//! The caller keeps the step's cache buffers as they are between replays
//! (written in place) and drops the graph before anything else evaluates
//! them: the graph holds every buffer it touches, and a held cache buffer
//! cannot be written in place by a node.

use std::pin::Pin;

use cxx::UniquePtr;

use super::CacheRow;
use crate::array::{Array, to_list};
use crate::error::{Error, Result};
use crate::ffi::bridge;

/// A recorded decode step (see the module docs).
pub struct StepGraph {
    inner: UniquePtr<bridge::StepGraph>,
}

/// What [`StepGraph::record`] made of a step (which it evaluated in every case).
pub enum Recorded {
    /// The step's graph, to replay.
    Graph(StepGraph),
    /// Steps of this shape cannot be replayed, for the reason given (a node
    /// that is not one of mlxcel's GPU nodes, a build without CUDA).
    Refused(String),
    /// This step could not be recorded (a cache buffer was copied rather
    /// than written in place); the next one may be.
    NotThisStep,
}

impl StepGraph {
    /// Evaluates `outputs` (a decode step's logits and cache buffers) and
    /// records the step when it can be replayed: `tokens` must be the
    /// evaluated array of 32-bit token ids its embedding gather reads, and
    /// `logits` one of `outputs`.
    pub fn record(outputs: &[&Array], tokens: &Array, logits: &Array) -> Result<Recorded> {
        let mut refusal = String::new();
        let graph = bridge::record_step(&to_list(outputs), &tokens.inner, &logits.inner, &mut refusal)
            .map_err(|e| Error::mlx("record_step", e))?;
        Ok(if !graph.is_null() {
            Recorded::Graph(StepGraph { inner: graph })
        } else if refusal.is_empty() {
            Recorded::NotThisStep
        } else {
            Recorded::Refused(refusal)
        })
    }

    /// Runs the step again for `tokens` (as many as recorded) with each
    /// sequence's cache at `rows` (its buffers, the recorded ones, and the
    /// new positions) and writes the logits into `logits` (the recorded
    /// logits' size). Returns false, having run nothing, when `rows` are
    /// not the recorded cache buffers one for one: record a step again.
    pub fn replay(&mut self, tokens: &[u32], rows: &[CacheRow<'_>], logits: &mut [f32]) -> Result<bool> {
        let (buffers, steps) = super::cache_steps("replay_step", rows)?;
        let graph: Pin<&mut bridge::StepGraph> =
            self.inner.as_mut().ok_or_else(|| Error::invalid("replay_step", "an empty step graph"))?;
        bridge::replay_step(graph, tokens, &to_list(&buffers), &steps, logits).map_err(|e| Error::mlx("replay_step", e))
    }
}
