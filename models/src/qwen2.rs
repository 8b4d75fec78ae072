//! Qwen2 / Qwen2.5: the Llama decoder with biases on the query, key and value
//! projections (not on the output projection) (mlx-lm `models/qwen2.py`).

use mlxcel_arch::ModelConfig;

use crate::attention::AttentionSpec;
use crate::backend::{Backend, BackendResult};
use crate::decoder::{Decoder, DecoderSpec, build_decoder, global_rope};
use crate::feed_forward::{FeedForward, GatedMlp};
use crate::scope::Scope;

/// Builds a Qwen2 model.
pub fn build<B: Backend>(c: &ModelConfig, w: &Scope<'_, B>) -> BackendResult<Decoder<B>, B> {
    let attention = AttentionSpec { qkv_bias: true, ..AttentionSpec::DEFAULT };
    build_decoder(
        w,
        c,
        &DecoderSpec::LLAMA,
        attention,
        |_| global_rope(c),
        |mlp, _| Ok(FeedForward::Gated(GatedMlp::new(mlp, c)?)),
    )
}
