//! Qwen2 / Qwen2.5: the Llama decoder with biases on the query, key and value
//! projections (not on the output projection) (mlx-lm `models/qwen2.py`).

use mlxcel_arch::ModelConfig;

use super::attention::AttentionSpec;
use super::decoder::{Decoder, DecoderSpec};
use super::{build_decoder, gated_mlp, global_rope};
use crate::error::Result;
use crate::weights::Weights;

/// Builds a Qwen2 model.
pub fn build(c: &ModelConfig, w: &Weights) -> Result<Decoder> {
    let attention = AttentionSpec { qkv_bias: true, ..AttentionSpec::DEFAULT };
    build_decoder(w, c, &DecoderSpec::LLAMA, attention, |_| global_rope(c), |mlp, _| gated_mlp(mlp, c))
}
