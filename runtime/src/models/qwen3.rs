//! Qwen3: the Llama decoder with RMS-normalised queries and keys per head
//! before RoPE, and no projection biases (mlx-lm `models/qwen3.py`).

use mlxcel_arch::ModelConfig;

use super::attention::AttentionSpec;
use super::decoder::{Decoder, DecoderSpec};
use super::{build_decoder, gated_mlp, global_rope};
use crate::error::Result;
use crate::weights::Weights;

/// Qwen3's attention (shared with Qwen3-MoE).
pub const ATTENTION: AttentionSpec = AttentionSpec { qk_norm: true, ..AttentionSpec::DEFAULT };

/// Builds a Qwen3 model.
pub fn build(c: &ModelConfig, w: &Weights) -> Result<Decoder> {
    build_decoder(w, c, &DecoderSpec::LLAMA, ATTENTION, |_| global_rope(c), |mlp, _| gated_mlp(mlp, c))
}
