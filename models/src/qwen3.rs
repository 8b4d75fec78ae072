//! Qwen3: the Llama decoder with RMS-normalised queries and keys per head
//! before RoPE, and no projection biases (mlx-lm `models/qwen3.py`).

use mlxcel_arch::ModelConfig;

use crate::attention::AttentionSpec;
use crate::backend::{Backend, BackendResult};
use crate::decoder::{Decoder, DecoderSpec, build_decoder, global_rope};
use crate::feed_forward::{FeedForward, GatedMlp};
use crate::scope::Scope;

/// Qwen3's attention (shared with Qwen3-MoE).
pub const ATTENTION: AttentionSpec = AttentionSpec { qk_norm: true, ..AttentionSpec::DEFAULT };

/// Builds a Qwen3 model.
pub fn build<B: Backend>(c: &ModelConfig, w: &Scope<'_, B>) -> BackendResult<Decoder<B>, B> {
    build_decoder(
        w,
        c,
        &DecoderSpec::LLAMA,
        ATTENTION,
        |_| global_rope(c),
        |mlp, _| Ok(FeedForward::Gated(GatedMlp::new(mlp, c)?)),
    )
}
