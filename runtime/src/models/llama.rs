//! Llama (2, 3, 3.x), SmolLM2 and Mistral: pre-norm decoder layers of
//! grouped-query attention with RoPE and a SwiGLU MLP, RMS norms throughout
//! (Touvron et al. 2023; mlx-lm `models/llama.py`). Mistral is the same
//! network whose layers attend over a sliding window (its normalized config
//! marks them `sliding_attention`).

use mlxcel_arch::ModelConfig;

use super::attention::AttentionSpec;
use super::decoder::{Decoder, DecoderSpec};
use super::{build_decoder, gated_mlp, global_rope};
use crate::error::Result;
use crate::weights::Weights;

/// Builds a Llama or Mistral model.
pub fn build(c: &ModelConfig, w: &Weights) -> Result<Decoder> {
    // `attention_bias` puts biases on all four projections.
    let attention = AttentionSpec { qkv_bias: c.attention_bias, o_bias: c.attention_bias, ..AttentionSpec::DEFAULT };
    build_decoder(w, c, &DecoderSpec::LLAMA, attention, |_| global_rope(c), |mlp, _| gated_mlp(mlp, c))
}
