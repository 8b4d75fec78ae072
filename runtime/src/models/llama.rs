//! Llama (2, 3, 3.x), SmolLM2 and Mistral: pre-norm decoder layers of
//! grouped-query attention with RoPE and a SwiGLU MLP, RMS norms throughout
//! (Touvron et al. 2023; mlx-lm `models/llama.py`).

use mlxcel_mlx::{Array, fast};

use super::{Attention, Config, LanguageModel, QkvProjection, rope_from_config};
use crate::error::Result;
use crate::kv_cache::KvCache;
use crate::nn::{Activation, Embedding, GateUp, GatedMlp, Linear, RmsNorm, Rope};
use crate::weights::Weights;

/// The hyperparameters Llama reads from its config.
pub struct LlamaConfig {
    /// Width of the residual stream.
    pub hidden_size: i32,
    /// Decoder layers.
    pub layers: i32,
    /// MLP hidden width.
    pub intermediate_size: i32,
    /// Query heads.
    pub heads: i32,
    /// Key/value heads.
    pub kv_heads: i32,
    /// Features per head.
    pub head_dim: i32,
    /// RMS norm epsilon.
    pub rms_norm_eps: f32,
    /// Vocabulary size.
    pub vocab_size: i32,
    /// Trained context length.
    pub max_position_embeddings: i32,
    /// Whether the output projection reuses the embedding table.
    pub tie_word_embeddings: bool,
    /// Whether q/k/v/o projections have biases.
    pub attention_bias: bool,
    /// Whether the MLP projections have biases.
    pub mlp_bias: bool,
    /// Sliding window of the layers marked `sliding_attention` (Mistral, SmolLM3-style configs).
    pub sliding_window: Option<i32>,
    /// Per layer: whether it attends over a sliding window.
    pub sliding: Vec<bool>,
}

impl LlamaConfig {
    /// Reads the config, applying Llama's defaults.
    pub fn from_config(c: &Config<'_>) -> Result<LlamaConfig> {
        let hidden_size = c.int("hidden_size")?;
        let heads = c.int("num_attention_heads")?;
        let layers = c.int("num_hidden_layers")?;
        let sliding_window = c.opt_int("sliding_window")?;
        let sliding = match c.opt_strings("layer_types")? {
            Some(types) => types.iter().map(|t| t == "sliding_attention").collect(),
            None => vec![false; layers as usize],
        };
        Ok(LlamaConfig {
            hidden_size,
            layers,
            intermediate_size: c.int("intermediate_size")?,
            heads,
            kv_heads: c.opt_int("num_key_value_heads")?.unwrap_or(heads),
            head_dim: c.opt_int("head_dim")?.unwrap_or(hidden_size / heads),
            rms_norm_eps: c.opt_f32("rms_norm_eps")?.unwrap_or(1e-6),
            vocab_size: c.int("vocab_size")?,
            max_position_embeddings: c.opt_int("max_position_embeddings")?.unwrap_or(4096),
            tie_word_embeddings: c.opt_bool("tie_word_embeddings")?.unwrap_or(true),
            attention_bias: c.opt_bool("attention_bias")?.unwrap_or(false),
            mlp_bias: c.opt_bool("mlp_bias")?.unwrap_or(false),
            sliding_window,
            sliding,
        })
    }
}

/// One decoder layer: `h = x + attn(norm(x)); out = h + mlp(norm(h))`.
pub struct DecoderLayer {
    /// Norm before attention.
    pub input_layernorm: RmsNorm,
    /// Self-attention.
    pub self_attn: Attention,
    /// Norm before the MLP.
    pub post_attention_layernorm: RmsNorm,
    /// The SwiGLU MLP.
    pub mlp: GatedMlp,
}

impl DecoderLayer {
    /// Builds layer `i` with the given attention and MLP (the parts Llama
    /// variants change).
    pub fn new(w: &Weights, cfg: &LlamaConfig, i: i32, self_attn: Attention, mlp: GatedMlp) -> Result<DecoderLayer> {
        let p = format!("model.layers.{i}");
        let h = cfg.hidden_size;
        Ok(DecoderLayer {
            input_layernorm: w.rms_norm(&format!("{p}.input_layernorm"), h, cfg.rms_norm_eps)?,
            self_attn,
            post_attention_layernorm: w.rms_norm(&format!("{p}.post_attention_layernorm"), h, cfg.rms_norm_eps)?,
            mlp,
        })
    }

    /// Runs the layer.
    pub fn forward(&self, x: &Array, cache: &mut KvCache) -> Result<Array> {
        // fast::add folds each residual into the projection before it (o_proj, down_proj).
        let h = fast::add(x, &self.self_attn.forward(&self.input_layernorm.forward(x)?, cache)?)?;
        Ok(fast::add(&h, &self.mlp.forward(&self.post_attention_layernorm.forward(&h)?)?)?)
    }
}

/// The decoder stack shared by Llama-family models: embeddings, layers, final
/// norm and the (possibly tied) output projection.
pub struct DecoderStack {
    /// Token embeddings.
    pub embed_tokens: Embedding,
    /// The layers.
    pub layers: Vec<DecoderLayer>,
    /// Final norm.
    pub norm: RmsNorm,
    /// Output projection, or `None` when tied to the embeddings.
    pub lm_head: Option<Linear>,
    /// Per layer: sliding window size, if any.
    pub windows: Vec<Option<usize>>,
    /// Vocabulary size.
    pub vocab_size: i32,
    /// Trained context length.
    pub context_length: i32,
}

impl DecoderStack {
    /// Loads embeddings, the final norm and head around `layers`.
    pub fn new(w: &Weights, cfg: &LlamaConfig, layers: Vec<DecoderLayer>) -> Result<DecoderStack> {
        let embed_tokens = w.embedding("model.embed_tokens", cfg.vocab_size, cfg.hidden_size)?;
        // A bundle may carry lm_head even for tied configs; use it when present.
        let lm_head = if !cfg.tie_word_embeddings || w.contains("lm_head.weight") {
            Some(w.linear("lm_head", cfg.hidden_size, cfg.vocab_size, false)?)
        } else {
            None
        };
        let windows =
            cfg.sliding.iter().map(|&s| if s { cfg.sliding_window.map(|w| w as usize) } else { None }).collect();
        Ok(DecoderStack {
            embed_tokens,
            layers,
            norm: w.rms_norm("model.norm", cfg.hidden_size, cfg.rms_norm_eps)?,
            lm_head,
            windows,
            vocab_size: cfg.vocab_size,
            context_length: cfg.max_position_embeddings,
        })
    }
}

impl LanguageModel for DecoderStack {
    fn hidden_states(&self, tokens: &Array, caches: &mut [KvCache]) -> Result<Array> {
        let mut h = self.embed_tokens.forward(tokens)?;
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
        self.windows.iter().map(|&w| KvCache::for_layer(w, max_kv)).collect()
    }

    fn vocab_size(&self) -> usize {
        self.vocab_size as usize
    }

    fn context_length(&self) -> usize {
        self.context_length as usize
    }
}

/// Llama's SwiGLU MLP: separate gate and up projections.
pub fn llama_mlp(w: &Weights, cfg: &LlamaConfig, i: i32) -> Result<GatedMlp> {
    let p = format!("model.layers.{i}.mlp");
    let (h, m) = (cfg.hidden_size, cfg.intermediate_size);
    Ok(GatedMlp {
        gate_up: GateUp::Separate {
            gate: w.linear(&format!("{p}.gate_proj"), h, m, cfg.mlp_bias)?,
            up: w.linear(&format!("{p}.up_proj"), h, m, cfg.mlp_bias)?,
        },
        down: w.linear(&format!("{p}.down_proj"), m, h, cfg.mlp_bias)?,
        activation: Activation::Silu,
    })
}

/// The RoPE of Llama-family configs (`rope_theta`, `rope_scaling`).
pub fn llama_rope(c: &Config<'_>, cfg: &LlamaConfig, dims: i32) -> Result<Rope> {
    rope_from_config(
        dims,
        c.opt_f32("rope_theta")?.unwrap_or(10_000.0),
        c.opt_bool("rope_traditional")?.unwrap_or(false),
        c.value("rope_scaling"),
        Some(cfg.max_position_embeddings),
    )
}

/// Llama's attention: separate q/k/v projections, RoPE from the config.
pub fn llama_attention(w: &Weights, c: &Config<'_>, cfg: &LlamaConfig, i: i32) -> Result<Attention> {
    let p = format!("model.layers.{i}.self_attn");
    let (h, d) = (cfg.hidden_size, cfg.head_dim);
    let rope = llama_rope(c, cfg, d)?;
    Ok(Attention {
        qkv: QkvProjection::Separate {
            q: w.linear(&format!("{p}.q_proj"), h, cfg.heads * d, cfg.attention_bias)?,
            k: w.linear(&format!("{p}.k_proj"), h, cfg.kv_heads * d, cfg.attention_bias)?,
            v: w.linear(&format!("{p}.v_proj"), h, cfg.kv_heads * d, cfg.attention_bias)?,
        },
        o: w.linear(&format!("{p}.o_proj"), cfg.heads * d, h, cfg.attention_bias)?,
        heads: cfg.heads,
        kv_heads: cfg.kv_heads,
        head_dim: d,
        scale: (d as f32).powf(-0.5),
        rope,
        q_norm: None,
        k_norm: None,
    })
}

/// Builds a Llama model from its config and weights.
pub fn build(c: &Config<'_>, w: &Weights) -> Result<DecoderStack> {
    let cfg = LlamaConfig::from_config(c)?;
    let layers = (0..cfg.layers)
        .map(|i| DecoderLayer::new(w, &cfg, i, llama_attention(w, c, &cfg, i)?, llama_mlp(w, &cfg, i)?))
        .collect::<Result<Vec<_>>>()?;
    DecoderStack::new(w, &cfg, layers)
}
