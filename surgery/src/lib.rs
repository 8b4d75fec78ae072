//! `mlxcel-surgery`: weight edits described in YAML, validated against a
//! model before any weight is touched, and applied by the compiler tensor by
//! tensor on MLX.
//!
//! ```yaml
//! version: 1
//! operations:
//!   - op: scale
//!     targets: "model.layers.*.mlp.down_proj.weight"
//!     factor: 0.5
//!   - op: prune
//!     granularity: layer
//!     ids: [29]
//!     mode: remove
//! ```
//!
//! Operations: `scale`, `add` (task vectors from a safetensors file),
//! `prune` (layers, attention heads or MLP channels; zero or remove),
//! `replace` (from a donor file, with a wildcard key mapping) and
//! `interpolate` (lerp or slerp between the model and files). See
//! docs/surgery.md.

#![deny(unsafe_code)]

mod donor;
mod error;
mod plan;
mod schema;

pub use donor::Donor;
pub use error::{Result, SurgeryError};
pub use plan::{Edit, Endpoint, MAX_MULTIPLIER, ModelTensor, ModelView, OperationRecord, OutputTensor, Plan};
pub use schema::{Granularity, MAX_YAML_BYTES, Method, Operation, PruneMode, Surgery, Targets, VERSION, limits};
