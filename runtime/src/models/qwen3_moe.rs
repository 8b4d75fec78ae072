//! Qwen3-MoE: Qwen3's attention with a sparse mixture of SwiGLU experts as
//! the feed-forward block of the layers the config marks sparse (a dense MLP
//! in the others) (mlx-lm `models/qwen3_moe.py`).

use mlxcel_arch::ModelConfig;

use super::decoder::{Decoder, DecoderSpec, FeedForward};
use super::moe::SparseMoe;
use super::{build_decoder, gated_mlp, global_rope, qwen3};
use crate::error::Result;
use crate::weights::Weights;

/// Builds a Qwen3-MoE model.
pub fn build(c: &ModelConfig, w: &Weights) -> Result<Decoder> {
    build_decoder(
        w,
        c,
        &DecoderSpec::LLAMA,
        qwen3::ATTENTION,
        |_| global_rope(c),
        |mlp, i| {
            if c.is_moe_layer(i) { Ok(FeedForward::Moe(SparseMoe::new(mlp, c)?)) } else { gated_mlp(mlp, c) }
        },
    )
}
