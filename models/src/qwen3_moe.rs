//! Qwen3-MoE: Qwen3's attention with a sparse mixture of SwiGLU experts as
//! the feed-forward block of the layers the config marks sparse (a dense MLP
//! in the others) (mlx-lm `models/qwen3_moe.py`).

use mlxcel_arch::ModelConfig;

use crate::backend::{Backend, BackendResult};
use crate::decoder::{Decoder, DecoderSpec, build_decoder, global_rope};
use crate::feed_forward::{FeedForward, GatedMlp};
use crate::moe::SparseMoe;
use crate::qwen3;
use crate::scope::Scope;

/// Builds a Qwen3-MoE model.
pub fn build<B: Backend>(c: &ModelConfig, w: &Scope<'_, B>) -> BackendResult<Decoder<B>, B> {
    build_decoder(
        w,
        c,
        &DecoderSpec::LLAMA,
        qwen3::ATTENTION,
        |_| global_rope(c),
        |mlp, i| {
            Ok(if c.is_moe_layer(i) {
                FeedForward::Moe(SparseMoe::new(mlp, c)?)
            } else {
                FeedForward::Gated(GatedMlp::new(mlp, c)?)
            })
        },
    )
}
