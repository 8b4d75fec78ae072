//! Phi-3: the Llama decoder with one fused q/k/v projection, one fused
//! gate/up projection, optional partial rotary dimensions and LongRoPE
//! (mlx-lm `models/phi3.py`).

use super::llama::{DecoderLayer, DecoderStack, LlamaConfig, llama_rope};
use super::{Attention, Config, QkvProjection};
use crate::error::{Error, Result};
use crate::nn::{Activation, GateUp, GatedMlp};
use crate::weights::Weights;

fn attention(w: &Weights, c: &Config<'_>, cfg: &LlamaConfig, i: i32) -> Result<Attention> {
    let p = format!("model.layers.{i}.self_attn");
    // Phi-3 derives the head size from the hidden size.
    let d = cfg.hidden_size / cfg.heads;
    let qkv_out = (cfg.heads + 2 * cfg.kv_heads) * d;
    let partial = c.opt_f32("partial_rotary_factor")?.unwrap_or(1.0);
    if !(0.0..=1.0).contains(&partial) || partial == 0.0 {
        return Err(Error::Config(format!("partial_rotary_factor must be in (0, 1], found {partial}")));
    }
    let rope_dims = (d as f32 * partial) as i32;
    Ok(Attention {
        qkv: QkvProjection::Fused(w.linear(&format!("{p}.qkv_proj"), cfg.hidden_size, qkv_out, false)?),
        o: w.linear(&format!("{p}.o_proj"), cfg.heads * d, cfg.hidden_size, false)?,
        heads: cfg.heads,
        kv_heads: cfg.kv_heads,
        head_dim: d,
        scale: (d as f32).powf(-0.5),
        rope: llama_rope(c, cfg, rope_dims)?,
        q_norm: None,
        k_norm: None,
    })
}

fn mlp(w: &Weights, cfg: &LlamaConfig, i: i32) -> Result<GatedMlp> {
    let p = format!("model.layers.{i}.mlp");
    let (h, m) = (cfg.hidden_size, cfg.intermediate_size);
    Ok(GatedMlp {
        gate_up: GateUp::Fused(w.linear(&format!("{p}.gate_up_proj"), h, 2 * m, false)?),
        down: w.linear(&format!("{p}.down_proj"), m, h, false)?,
        activation: Activation::Silu,
    })
}

/// Builds a Phi3 model from its config and weights.
pub fn build(c: &Config<'_>, w: &Weights) -> Result<DecoderStack> {
    let mut cfg = LlamaConfig::from_config(c)?;
    cfg.tie_word_embeddings = c.opt_bool("tie_word_embeddings")?.unwrap_or(false);
    cfg.sliding = vec![false; cfg.layers as usize];
    let layers = (0..cfg.layers)
        .map(|i| DecoderLayer::new(w, &cfg, i, attention(w, c, &cfg, i)?, mlp(w, &cfg, i)?))
        .collect::<Result<Vec<_>>>()?;
    DecoderStack::new(w, &cfg, layers)
}
