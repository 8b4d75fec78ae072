//! Phi-3: the Llama decoder with one fused q/k/v projection, one fused
//! gate/up projection, optional partial rotary dimensions and LongRoPE
//! (mlx-lm `models/phi3.py`).

use mlxcel_arch::ModelConfig;

use crate::attention::AttentionSpec;
use crate::backend::{Backend, BackendResult};
use crate::decoder::{Decoder, DecoderSpec, build_decoder, global_rope};
use crate::feed_forward::{FeedForward, GateUp, GatedMlp};
use crate::scope::Scope;

/// Builds a Phi-3 model.
pub fn build<B: Backend>(c: &ModelConfig, w: &Scope<'_, B>) -> BackendResult<Decoder<B>, B> {
    let attention = AttentionSpec { fused_qkv: true, ..AttentionSpec::DEFAULT };
    let (h, m) = (c.hidden_size, c.intermediate_size);
    build_decoder(
        w,
        c,
        &DecoderSpec::LLAMA,
        attention,
        |_| global_rope(c),
        |mlp, _| {
            Ok(FeedForward::Gated(GatedMlp {
                gate_up: GateUp::Fused(mlp.linear("gate_up_proj", h, 2 * m, false)?),
                down: mlp.linear("down_proj", m, h, false)?,
                activation: c.hidden_act,
            }))
        },
    )
}
