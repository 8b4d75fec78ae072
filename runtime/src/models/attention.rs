//! Multi-head attention with grouped-query heads, RoPE and a KV cache, as
//! every architecture here uses it. What varies between architectures is an
//! [`AttentionSpec`]: biases, per-head q/k norms, one fused q/k/v projection.

use mlxcel_arch::ModelConfig;
use mlxcel_mlx::fast;
use mlxcel_mlx::{Array, Linear};

use crate::error::Result;
use crate::kv_cache::LayerCaches;
use crate::nn::{RmsNorm, Rope};
use crate::weights::Scope;

/// What distinguishes one architecture's attention block from another's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionSpec {
    /// The q, k and v projections have biases (Qwen2; Llama's `attention_bias`).
    pub qkv_bias: bool,
    /// The output projection has a bias (Llama's `attention_bias`).
    pub o_bias: bool,
    /// Queries and keys are RMS-normalised per head before RoPE (`q_norm`,
    /// `k_norm`: Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// One `qkv_proj` instead of `q_proj`, `k_proj`, `v_proj` (Phi-3).
    pub fused_qkv: bool,
    /// Norm gains are stored as offsets from one (Gemma).
    pub norm_offset: bool,
}

impl AttentionSpec {
    /// Llama's attention: no biases, no q/k norms, separate projections.
    pub const DEFAULT: AttentionSpec =
        AttentionSpec { qkv_bias: false, o_bias: false, qk_norm: false, fused_qkv: false, norm_offset: false };
}

/// How the queries, keys and values are projected from the hidden state.
enum QkvProjection {
    /// Three projections.
    Separate { q: Linear, k: Linear, v: Linear },
    /// One projection split into q, k, v.
    Fused(Linear),
}

/// One attention block: projections, optional per-head q/k norms, RoPE, the
/// cached attention and the output projection.
pub struct Attention {
    qkv: QkvProjection,
    o: Linear,
    heads: i32,
    kv_heads: i32,
    head_dim: i32,
    scale: f32,
    rope: Rope,
    qk_norm: Option<(RmsNorm, RmsNorm)>,
}

impl Attention {
    /// The block whose weights are under `w` (`model.layers.N.self_attn`),
    /// with the config's sizes, `spec`'s variations and `rope`.
    pub fn new(w: &Scope<'_>, c: &ModelConfig, spec: AttentionSpec, rope: Rope) -> Result<Attention> {
        let (hidden, d) = (c.hidden_size as i32, c.head_dim as i32);
        let (heads, kv_heads) = (c.num_attention_heads as i32, c.num_key_value_heads as i32);
        let qkv = if spec.fused_qkv {
            QkvProjection::Fused(w.linear("qkv_proj", hidden, (heads + 2 * kv_heads) * d, spec.qkv_bias)?)
        } else {
            QkvProjection::Separate {
                q: w.linear("q_proj", hidden, heads * d, spec.qkv_bias)?,
                k: w.linear("k_proj", hidden, kv_heads * d, spec.qkv_bias)?,
                v: w.linear("v_proj", hidden, kv_heads * d, spec.qkv_bias)?,
            }
        };
        let qk_norm = if spec.qk_norm {
            let eps = c.rms_norm_eps;
            Some((w.rms_norm("q_norm", d, eps, spec.norm_offset)?, w.rms_norm("k_norm", d, eps, spec.norm_offset)?))
        } else {
            None
        };
        Ok(Attention {
            qkv,
            o: w.linear("o_proj", heads * d, hidden, spec.o_bias)?,
            heads,
            kv_heads,
            head_dim: d,
            scale: c.attention_scale(),
            rope,
            qk_norm,
        })
    }

    /// `x: [batch, seq, hidden]` → `[batch, seq, hidden]`, appending this
    /// step's keys and values to each row's cache.
    pub fn forward(&self, x: &Array, cache: &mut LayerCaches<'_>) -> Result<Array> {
        let (q, k, v) = self.project_heads(x)?;
        let (q, k) = match &self.qk_norm {
            Some((q_norm, k_norm)) => (q_norm.forward(&q)?, k_norm.forward(&k)?),
            None => (q, k),
        };
        let out = cache.attend(&q, &k, &v, &self.rope, self.scale)?;
        Ok(fast::linear(&out, &self.o)?)
    }

    /// The q, k and v heads of `x [b, l, hidden]`, each `[b, heads, l, head_dim]`.
    fn project_heads(&self, x: &Array) -> Result<(Array, Array, Array)> {
        let parts = match &self.qkv {
            QkvProjection::Separate { q, k, v } => {
                fast::linear_heads(x, &[(q, self.heads), (k, self.kv_heads), (v, self.kv_heads)])?
            }
            QkvProjection::Fused(qkv) => {
                let shape = x.shape();
                let (b, l) = (shape[0], shape[1]);
                let q_end = self.heads * self.head_dim;
                let k_end = q_end + self.kv_heads * self.head_dim;
                let parts = fast::linear(x, qkv)?.split_at(&[q_end, k_end], -1)?;
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
