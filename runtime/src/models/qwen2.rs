//! Qwen2 / Qwen2.5: the Llama decoder with biases on the query, key and value
//! projections (not on the output projection) (mlx-lm `models/qwen2.py`).

use super::llama::{DecoderLayer, DecoderStack, LlamaConfig, llama_mlp, llama_rope};
use super::{Attention, Config, QkvProjection};
use crate::error::Result;
use crate::weights::Weights;

fn attention(w: &Weights, c: &Config<'_>, cfg: &LlamaConfig, i: i32) -> Result<Attention> {
    let p = format!("model.layers.{i}.self_attn");
    let (h, d) = (cfg.hidden_size, cfg.head_dim);
    Ok(Attention {
        qkv: QkvProjection::Separate {
            q: w.linear(&format!("{p}.q_proj"), h, cfg.heads * d, true)?,
            k: w.linear(&format!("{p}.k_proj"), h, cfg.kv_heads * d, true)?,
            v: w.linear(&format!("{p}.v_proj"), h, cfg.kv_heads * d, true)?,
        },
        o: w.linear(&format!("{p}.o_proj"), cfg.heads * d, h, false)?,
        heads: cfg.heads,
        kv_heads: cfg.kv_heads,
        head_dim: d,
        scale: (d as f32).powf(-0.5),
        rope: llama_rope(c, cfg, d)?,
        q_norm: None,
        k_norm: None,
    })
}

/// Builds a Qwen2 model from its config and weights.
pub fn build(c: &Config<'_>, w: &Weights) -> Result<DecoderStack> {
    let mut cfg = LlamaConfig::from_config(c)?;
    // Qwen2 configs enable sliding windows per layer only through
    // use_sliding_window, which released checkpoints leave off.
    cfg.sliding = vec![false; cfg.layers as usize];
    let layers = (0..cfg.layers)
        .map(|i| DecoderLayer::new(w, &cfg, i, attention(w, c, &cfg, i)?, llama_mlp(w, &cfg, i)?))
        .collect::<Result<Vec<_>>>()?;
    DecoderStack::new(w, &cfg, layers)
}
