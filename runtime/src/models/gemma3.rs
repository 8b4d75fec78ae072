//! Gemma 3 (text): interleaved sliding-window and global attention layers,
//! RMS norms with gain `1 + w` before and after both attention and MLP,
//! per-head q/k norms, a GeGLU MLP, embeddings scaled by `sqrt(hidden)`, and
//! separate RoPE bases for local and global layers (Gemma Team 2025;
//! mlx-lm `models/gemma3_text.py`).

use mlxcel_mlx::{Array, Dtype, fast};

use super::{Attention, Config, LanguageModel, QkvProjection, rope_from_config};
use crate::error::{Error, Result};
use crate::kv_cache::KvCache;
use crate::nn::{Activation, Embedding, GateUp, GatedMlp, Linear, RmsNorm, Rope};
use crate::weights::Weights;

/// One Gemma 3 decoder layer.
struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    pre_feedforward_layernorm: RmsNorm,
    mlp: GatedMlp,
    post_feedforward_layernorm: RmsNorm,
    /// The attention window of a local layer; `None` for global layers.
    window: Option<usize>,
}

impl DecoderLayer {
    fn forward(&self, x: &Array, cache: &mut KvCache) -> Result<Array> {
        let r = self.self_attn.forward(&self.input_layernorm.forward(x)?, cache)?;
        let h = residual(x, &self.post_attention_layernorm.forward(&r)?)?;
        let r = self.mlp.forward(&self.pre_feedforward_layernorm.forward(&h)?)?;
        residual(&h, &self.post_feedforward_layernorm.forward(&r)?)
    }
}

/// `x + y`; in float16 the sum is taken in f32 and clipped to the f16 range
/// (Gemma's activations overflow f16 otherwise). In f32, `fast::add` folds
/// the sum into the post-norm that computes `y`.
fn residual(x: &Array, y: &Array) -> Result<Array> {
    if x.dtype() != Dtype::F16 {
        return Ok(fast::add(x, y)?);
    }
    let sum = x.astype(Dtype::F32)?.add(&y.astype(Dtype::F32)?)?;
    let bound = f32::from(half::f16::MAX);
    Ok(sum.minimum(&sum.scalar_like(bound)?)?.maximum(&sum.scalar_like(-bound)?)?.astype(Dtype::F16)?)
}

/// A Gemma 3 text model.
pub struct Gemma3 {
    embed_tokens: Embedding,
    /// `sqrt(hidden_size)` rounded to bf16, as the reference implementation does.
    embed_scale: f32,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
    vocab_size: i32,
    context_length: i32,
}

impl Gemma3 {
    /// Builds the model from its config and weights.
    pub fn new(c: &Config<'_>, w: &Weights) -> Result<Gemma3> {
        let hidden = c.opt_int("hidden_size")?.unwrap_or(1152);
        let layers_n = c.opt_int("num_hidden_layers")?.unwrap_or(26);
        let inter = c.opt_int("intermediate_size")?.unwrap_or(6912);
        let heads = c.opt_int("num_attention_heads")?.unwrap_or(4);
        let kv_heads = c.opt_int("num_key_value_heads")?.unwrap_or(1);
        let head_dim = c.opt_int("head_dim")?.unwrap_or(256);
        let eps = c.opt_f32("rms_norm_eps")?.unwrap_or(1e-6);
        let vocab = c.opt_int("vocab_size")?.unwrap_or(262_144);
        let window = c.opt_int("sliding_window")?.unwrap_or(512) as usize;
        let max_pos = c.opt_int("max_position_embeddings")?.unwrap_or(32_768);
        let scale = c.opt_f32("query_pre_attn_scalar")?.unwrap_or(256.0).powf(-0.5);
        // Which layers are local: `layer_types` when given, else every layer
        // but each `sliding_window_pattern`-th.
        let sliding: Vec<bool> = match c.opt_strings("layer_types")? {
            Some(types) => types.iter().map(|t| t == "sliding_attention").collect(),
            None => {
                let pattern = c.opt_int("sliding_window_pattern")?.unwrap_or(6);
                (0..layers_n).map(|i| (i + 1) % pattern != 0).collect()
            }
        };
        if sliding.len() != layers_n as usize {
            return Err(Error::Config(format!("layer_types has {} entries for {layers_n} layers", sliding.len())));
        }
        let local_base = c.opt_f32("rope_local_base_freq")?.unwrap_or(10_000.0);
        let global_base = c.opt_f32("rope_theta")?.unwrap_or(1_000_000.0);
        let mut layers = Vec::with_capacity(layers_n as usize);
        for (i, &is_sliding) in sliding.iter().enumerate() {
            let p = format!("model.layers.{i}");
            let a = format!("{p}.self_attn");
            let rope = if is_sliding {
                Rope::new(head_dim, false, local_base, 1.0)
            } else {
                rope_from_config(head_dim, global_base, false, c.value("rope_scaling"), Some(max_pos))?
            };
            let norm = |name: &str, dim: i32| w.rms_norm_offset(&format!("{p}.{name}"), dim, eps);
            layers.push(DecoderLayer {
                input_layernorm: norm("input_layernorm", hidden)?,
                self_attn: Attention {
                    qkv: QkvProjection::Separate {
                        q: w.linear(&format!("{a}.q_proj"), hidden, heads * head_dim, false)?,
                        k: w.linear(&format!("{a}.k_proj"), hidden, kv_heads * head_dim, false)?,
                        v: w.linear(&format!("{a}.v_proj"), hidden, kv_heads * head_dim, false)?,
                    },
                    o: w.linear(&format!("{a}.o_proj"), heads * head_dim, hidden, false)?,
                    heads,
                    kv_heads,
                    head_dim,
                    scale,
                    rope,
                    q_norm: Some(norm("self_attn.q_norm", head_dim)?),
                    k_norm: Some(norm("self_attn.k_norm", head_dim)?),
                },
                post_attention_layernorm: norm("post_attention_layernorm", hidden)?,
                pre_feedforward_layernorm: norm("pre_feedforward_layernorm", hidden)?,
                mlp: GatedMlp {
                    gate_up: GateUp::Separate {
                        gate: w.linear(&format!("{p}.mlp.gate_proj"), hidden, inter, false)?,
                        up: w.linear(&format!("{p}.mlp.up_proj"), hidden, inter, false)?,
                    },
                    down: w.linear(&format!("{p}.mlp.down_proj"), inter, hidden, false)?,
                    activation: Activation::GeluApprox,
                },
                post_feedforward_layernorm: norm("post_feedforward_layernorm", hidden)?,
                window: is_sliding.then_some(window),
            });
        }
        let lm_head =
            if w.contains("lm_head.weight") { Some(w.linear("lm_head", hidden, vocab, false)?) } else { None };
        Ok(Gemma3 {
            embed_tokens: w.embedding("model.embed_tokens", vocab, hidden)?,
            embed_scale: half::bf16::from_f32((hidden as f32).sqrt()).to_f32(),
            layers,
            norm: w.rms_norm_offset("model.norm", hidden, eps)?,
            lm_head,
            vocab_size: vocab,
            context_length: max_pos,
        })
    }
}

impl LanguageModel for Gemma3 {
    fn hidden_states(&self, tokens: &Array, caches: &mut [KvCache]) -> Result<Array> {
        let mut h = self.embed_tokens.forward_scaled(tokens, self.embed_scale)?;
        for (layer, cache) in self.layers.iter().zip(caches.iter_mut()) {
            h = layer.forward(&h, cache)?;
        }
        Ok(h)
    }

    fn logits(&self, hidden: &Array) -> Result<Array> {
        let h = self.norm.forward(hidden)?;
        match &self.lm_head {
            Some(head) => head.forward(&h),
            None => self.embed_tokens.as_linear(&h),
        }
    }

    fn new_caches(&self, max_kv: Option<usize>) -> Vec<KvCache> {
        self.layers.iter().map(|l| KvCache::for_layer(l.window, max_kv)).collect()
    }

    fn vocab_size(&self) -> usize {
        self.vocab_size as usize
    }

    fn context_length(&self) -> usize {
        self.context_length as usize
    }
}
