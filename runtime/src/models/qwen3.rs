//! Qwen3: the Llama decoder with RMS-normalised queries and keys per head
//! before RoPE, and no projection biases (mlx-lm `models/qwen3.py`).

use super::llama::{DecoderLayer, DecoderStack, LlamaConfig, llama_mlp, llama_rope};
use super::{Attention, Config, QkvProjection};
use crate::error::Result;
use crate::weights::Weights;

fn attention(w: &Weights, c: &Config<'_>, cfg: &LlamaConfig, i: i32) -> Result<Attention> {
    let p = format!("model.layers.{i}.self_attn");
    let (h, d, eps) = (cfg.hidden_size, cfg.head_dim, cfg.rms_norm_eps);
    Ok(Attention {
        qkv: QkvProjection::Separate {
            q: w.linear(&format!("{p}.q_proj"), h, cfg.heads * d, false)?,
            k: w.linear(&format!("{p}.k_proj"), h, cfg.kv_heads * d, false)?,
            v: w.linear(&format!("{p}.v_proj"), h, cfg.kv_heads * d, false)?,
        },
        o: w.linear(&format!("{p}.o_proj"), cfg.heads * d, h, false)?,
        heads: cfg.heads,
        kv_heads: cfg.kv_heads,
        head_dim: d,
        scale: (d as f32).powf(-0.5),
        rope: llama_rope(c, cfg, d)?,
        q_norm: Some(w.rms_norm(&format!("{p}.q_norm"), d, eps)?),
        k_norm: Some(w.rms_norm(&format!("{p}.k_norm"), d, eps)?),
    })
}

/// Builds a Qwen3 model from its config and weights.
pub fn build(c: &Config<'_>, w: &Weights) -> Result<DecoderStack> {
    let cfg = LlamaConfig::from_config(c)?;
    let layers = (0..cfg.layers)
        .map(|i| DecoderLayer::new(w, &cfg, i, attention(w, c, &cfg, i)?, llama_mlp(w, &cfg, i)?))
        .collect::<Result<Vec<_>>>()?;
    DecoderStack::new(w, &cfg, layers)
}
