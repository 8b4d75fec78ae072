//! Multi-head attention with grouped-query heads, RoPE and a KV cache, as the
//! Llama family, Qwen, Gemma 3 and Phi-3 use it (they differ in how q, k and v
//! are projected and whether queries and keys are normalised per head).

use mlxcel_mlx::Array;
use mlxcel_mlx::fast::{CacheRow, CacheSlot, cached_attention, merge_heads, scaled_dot_product_attention};

use crate::error::Result;
use crate::kv_cache::KvCache;
use crate::nn::{Linear, RmsNorm, Rope};

/// How the queries, keys and values are projected from the hidden state.
pub enum QkvProjection {
    /// Three projections (`q_proj`, `k_proj`, `v_proj`).
    Separate {
        /// Queries.
        q: Linear,
        /// Keys.
        k: Linear,
        /// Values.
        v: Linear,
    },
    /// One fused projection split into q, k, v (`qkv_proj`, Phi-3).
    Fused(Linear),
}

/// One attention block: projections, optional per-head q/k norms, RoPE, the
/// cached attention and the output projection.
pub struct Attention {
    /// q/k/v projections.
    pub qkv: QkvProjection,
    /// Output projection.
    pub o: Linear,
    /// Query heads.
    pub heads: i32,
    /// Key/value heads (divides `heads`).
    pub kv_heads: i32,
    /// Features per head.
    pub head_dim: i32,
    /// Multiplies `q·k` (usually `head_dim^-1/2`).
    pub scale: f32,
    /// Rotary embedding of queries and keys.
    pub rope: Rope,
    /// Per-head RMS norm of queries (Qwen3, Gemma 3).
    pub q_norm: Option<RmsNorm>,
    /// Per-head RMS norm of keys (Qwen3, Gemma 3).
    pub k_norm: Option<RmsNorm>,
}

impl Attention {
    /// `x: [batch, seq, hidden]` → `[batch, seq, hidden]`, appending this step's
    /// keys and values to `cache`.
    pub fn forward(&self, x: &Array, cache: &mut KvCache) -> Result<Array> {
        // [b, l, hidden] -> q [b, heads, l, d], k and v [b, kv_heads, l, d],
        // queries and keys normalised per head.
        let (q, k, v) = self.project_heads(x)?;
        let per_head = |t: Array, norm: &Option<RmsNorm>| -> Result<Array> {
            match norm {
                Some(norm) => norm.forward(&t),
                None => Ok(t),
            }
        };
        let q = per_head(q, &self.q_norm)?;
        let k = per_head(k, &self.k_norm)?;
        let offset = cache.offset();
        let out = match cache.reserve(&k, &v)? {
            // Rotate, write the keys and values into the cache and attend:
            // one node on the CPU.
            Some(w) => {
                let (q, k) = (self.rope.prescale(&q)?, self.rope.prescale(&k)?);
                let cache_slot =
                    CacheSlot { keys: &w.keys, values: &w.values, slot: w.slot, visible: w.visible, causal: w.causal };
                let rows = [CacheRow { offset, cache: cache_slot }];
                let step = cached_attention(&q, &k, &v, &self.rope.spec(), &rows, self.scale)?;
                let (keys, values) = step.caches.into_iter().next().expect("one row gives one cache");
                cache.commit(keys, values, v.shape()[2] as usize);
                step.out
            }
            // A sliding-window prefill chunk attends over the cached window
            // and itself, with a window mask.
            None => {
                let q = self.rope.forward(&q, offset)?;
                let k = self.rope.forward(&k, offset)?;
                let step = cache.update(&k, &v)?;
                let out = scaled_dot_product_attention(
                    &q,
                    &step.keys,
                    &step.values,
                    self.scale,
                    step.mask.as_attention_mask(),
                )?;
                // [b, heads, l, d] -> [b, l, heads * d]
                merge_heads(&out)?
            }
        };
        self.o.forward(&out)
    }

    /// The q, k and v heads of `x [b, l, hidden]`, each `[b, heads, l, head_dim]`.
    fn project_heads(&self, x: &Array) -> Result<(Array, Array, Array)> {
        let parts = match &self.qkv {
            QkvProjection::Separate { q, k, v } => {
                Linear::forward_heads(x, &[(q, self.heads), (k, self.kv_heads), (v, self.kv_heads)])?
            }
            QkvProjection::Fused(qkv) => {
                let shape = x.shape();
                let (b, l) = (shape[0], shape[1]);
                let q_end = self.heads * self.head_dim;
                let k_end = q_end + self.kv_heads * self.head_dim;
                let parts = qkv.forward(x)?.split_at(&[q_end, k_end], -1)?;
                parts
                    .into_iter()
                    .zip([self.heads, self.kv_heads, self.kv_heads])
                    .map(|(t, n)| Ok(t.reshape(&[b, l, n, self.head_dim])?.transpose(&[0, 2, 1, 3])?))
                    .collect::<Result<Vec<_>>>()?
            }
        };
        let mut parts = parts.into_iter();
        match (parts.next(), parts.next(), parts.next()) {
            (Some(q), Some(k), Some(v)) => Ok((q, k, v)),
            _ => unreachable!("three projections give three parts"),
        }
    }
}
