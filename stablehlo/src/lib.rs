//! `mlxcel-stablehlo`: model graphs as StableHLO (MLIR text), and driving
//! `iree-compile` to turn them into IREE executables.
//!
//! - [`builder`]: a typed builder of StableHLO modules. Ops check their
//!   operands and compute their result types; weights are IREE named
//!   parameters bound to the bundle's tensor names, never constants.
//! - [`layers`]: the layers of mlxcel's models (RMS norm, affine-quantized
//!   and dense linear maps with the dequantization in the graph, RoPE,
//!   attention over an explicit KV cache, gated MLPs, embeddings) in those
//!   ops, computing what the MLX runtime's kernels compute.
//! - [`model`]: the model code of `mlxcel-models` traced into those ops
//!   (a backend whose weights are parameters and whose pass records).
//! - [`graphs`]: the functions a bundle exports (bucketed prefill, decode
//!   batches) traced from it, the KV caches written in place.
//! - [`iree`]: `iree-compile` from the pinned `iree-base-compiler` package,
//!   and the targets (`iree-llvm-cpu`, `iree-cuda-smNN`) it builds for.
//!
//! Why MLIR text: it is the input every StableHLO consumer accepts
//! (`iree-compile`, XLA, the StableHLO reference interpreter), it needs no
//! native MLIR library at compile time, and golden files of it are readable
//! in review.

pub mod builder;
pub mod error;
pub mod graphs;
pub mod iree;
pub mod layers;
pub mod model;
pub mod types;

pub use builder::{Comparison, Function, Module, PARAMETER_SCOPE, Reduction, Value};
pub use error::{Error, Result};
pub use graphs::GraphPlan;
pub use iree::{IreeCompiler, Target};
pub use types::{ElementType, TensorType};
