//! Multi-head attention with grouped-query heads, RoPE and a KV cache, as
//! every architecture here uses it. What varies between architectures is an
//! [`AttentionSpec`]: biases, per-head q/k norms, one fused q/k/v projection.

use mlxcel_arch::ModelConfig;

use crate::backend::{Backend, BackendResult, Ops};
use crate::error::Error;
use crate::scope::Scope;

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
enum QkvProjection<B: Backend> {
    /// Three projections.
    Separate { q: B::Linear, k: B::Linear, v: B::Linear },
    /// One projection split into q, k, v.
    Fused(B::Linear),
}

/// One attention block: projections, optional per-head q/k norms, RoPE, the
/// cached attention and the output projection.
pub struct Attention<B: Backend> {
    /// Which layer it is (its caches).
    layer: usize,
    qkv: QkvProjection<B>,
    o: B::Linear,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    scale: f32,
    rope: B::Rope,
    qk_norm: Option<(B::Norm, B::Norm)>,
}

impl<B: Backend> Attention<B> {
    /// The block of layer `layer` whose weights are under `w`
    /// (`model.layers.N.self_attn`), with the config's sizes, `spec`'s
    /// variations and `rope`.
    pub fn new(
        w: &Scope<'_, B>,
        layer: usize,
        c: &ModelConfig,
        spec: AttentionSpec,
        rope: B::Rope,
    ) -> BackendResult<Attention<B>, B> {
        let (hidden, d) = (c.hidden_size, c.head_dim);
        let (heads, kv_heads) = (c.num_attention_heads, c.num_key_value_heads);
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
            layer,
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

    /// `x: [b, l, hidden]` → `[b, l, hidden]`, appending this pass's keys and
    /// values to each row's cache.
    pub fn forward(&self, ops: &mut dyn Ops<B>, x: &B::Tensor) -> BackendResult<B::Tensor, B> {
        let heads = [self.heads, self.kv_heads, self.kv_heads];
        let parts = match &self.qkv {
            QkvProjection::Separate { q, k, v } => {
                ops.linear_heads(x, &[(q, heads[0]), (k, heads[1]), (v, heads[2])], self.head_dim)?
            }
            QkvProjection::Fused(qkv) => {
                let all = ops.linear(x, qkv)?;
                ops.split_heads(&all, &heads, self.head_dim)?
            }
        };
        let [q, k, v] = <[B::Tensor; 3]>::try_from(parts)
            .map_err(|parts| Error::Config(format!("the q/k/v projections gave {} parts, not three", parts.len())))?;
        let (q, k) = match &self.qk_norm {
            Some((q_norm, k_norm)) => (ops.rms_norm(q_norm, &q)?, ops.rms_norm(k_norm, &k)?),
            None => (q, k),
        };
        let out = ops.attend(self.layer, &q, &k, &v, &self.rope, self.scale)?;
        ops.linear(&out, &self.o)
    }
}
