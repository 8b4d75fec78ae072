//! Gemma 3 (text): interleaved sliding-window and global attention layers,
//! RMS norms with gain `1 + w` before and after both attention and MLP,
//! per-head q/k norms, a GeGLU MLP, embeddings scaled by `sqrt(hidden)`, and
//! separate RoPE bases for local and global layers (Gemma Team 2025;
//! mlx-lm `models/gemma3_text.py`).

use mlxcel_arch::{LayerType, ModelConfig};

use crate::attention::AttentionSpec;
use crate::backend::{Backend, BackendResult};
use crate::decoder::{Decoder, DecoderSpec, NormNames, Residual, build_decoder, global_rope};
use crate::error::Error;
use crate::feed_forward::{FeedForward, GatedMlp};
use crate::rope::RopeSpec;
use crate::scope::Scope;

/// Gemma 3's sandwich norms.
const NORMS: NormNames = NormNames {
    attention_in: "input_layernorm",
    attention_out: Some("post_attention_layernorm"),
    feed_forward_in: "pre_feedforward_layernorm",
    feed_forward_out: Some("post_feedforward_layernorm"),
};

/// Builds a Gemma 3 text model.
pub fn build<B: Backend>(c: &ModelConfig, w: &Scope<'_, B>) -> BackendResult<Decoder<B>, B> {
    let spec = DecoderSpec {
        norms: NORMS,
        norm_offset: true,
        // sqrt(hidden_size) rounded to bf16, as the reference implementation does.
        embed_scale: half::bf16::from_f32((c.hidden_size as f32).sqrt()).to_f32(),
        residual: Residual::ClipF16,
    };
    let attention = AttentionSpec { qk_norm: true, norm_offset: true, ..AttentionSpec::DEFAULT };
    let local_base = c
        .rope_local_base_freq
        .ok_or_else(|| Error::Config("gemma3 needs rope_local_base_freq for its sliding layers".into()))?;
    let rope = |i: usize| match c.layer_types[i] {
        // Local layers rotate with their own base and no scaling.
        LayerType::SlidingAttention => Ok(RopeSpec::new(c.head_dim, false, local_base, 1.0)),
        LayerType::FullAttention => global_rope(c),
    };
    build_decoder(w, c, &spec, attention, rope, |mlp, _| Ok(FeedForward::Gated(GatedMlp::new(mlp, c)?)))
}
