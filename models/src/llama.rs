//! Llama (2, 3, 3.x), SmolLM2 and Mistral: pre-norm decoder layers of
//! grouped-query attention with RoPE and a SwiGLU MLP, RMS norms throughout
//! (Touvron et al. 2023; mlx-lm `models/llama.py`). Mistral is the same
//! network whose layers attend over a sliding window (its normalized config
//! marks them `sliding_attention`).

use mlxcel_arch::ModelConfig;

use crate::attention::AttentionSpec;
use crate::backend::{Backend, BackendResult};
use crate::decoder::{Decoder, DecoderSpec, build_decoder, global_rope};
use crate::feed_forward::{FeedForward, GatedMlp};
use crate::scope::Scope;

/// Builds a Llama or Mistral model.
pub fn build<B: Backend>(c: &ModelConfig, w: &Scope<'_, B>) -> BackendResult<Decoder<B>, B> {
    // `attention_bias` puts biases on all four projections.
    let attention = AttentionSpec { qkv_bias: c.attention_bias, o_bias: c.attention_bias, ..AttentionSpec::DEFAULT };
    build_decoder(
        w,
        c,
        &DecoderSpec::LLAMA,
        attention,
        |_| global_rope(c),
        |mlp, _| Ok(FeedForward::Gated(GatedMlp::new(mlp, c)?)),
    )
}
