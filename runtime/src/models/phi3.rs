//! Phi-3: the Llama decoder with one fused q/k/v projection, one fused
//! gate/up projection, optional partial rotary dimensions and LongRoPE
//! (mlx-lm `models/phi3.py`).

use mlxcel_arch::ModelConfig;

use super::attention::AttentionSpec;
use super::decoder::{Decoder, DecoderSpec, FeedForward};
use super::{build_decoder, global_rope};
use crate::error::Result;
use crate::nn::{GateUp, GatedMlp};
use crate::weights::Weights;

/// Builds a Phi-3 model.
pub fn build(c: &ModelConfig, w: &Weights) -> Result<Decoder> {
    let attention = AttentionSpec { fused_qkv: true, ..AttentionSpec::DEFAULT };
    let (h, m) = (c.hidden_size as i32, c.intermediate_size as i32);
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
