//! The decoder every architecture here is: token embeddings, a stack of
//! layers (attention then feed-forward, each with a residual connection and
//! RMS norms before and optionally after), a final norm and the output
//! projection. An architecture file says how its layers differ through a
//! [`DecoderSpec`] and builds each layer's attention and feed-forward.

use std::num::NonZeroUsize;

use mlxcel_arch::ModelConfig;
use mlxcel_mlx::fast;
use mlxcel_mlx::{Array, Dtype, Linear};

use super::LanguageModel;
use super::moe::SparseMoe;
use crate::error::Result;
use crate::kv_cache::{BatchCaches, KvCache, check_window};
use crate::models::attention::Attention;
use crate::nn::{Embedding, GatedMlp, RmsNorm};
use crate::weights::{Scope, Weights};

/// The feed-forward half of a decoder layer.
pub enum FeedForward {
    /// A gated MLP (SwiGLU, GeGLU).
    Gated(GatedMlp),
    /// A mixture of gated experts chosen per token by a router.
    Moe(SparseMoe),
}

impl FeedForward {
    /// Applies the block to `x: [batch, seq, hidden]`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            FeedForward::Gated(mlp) => mlp.forward(x),
            FeedForward::Moe(moe) => moe.forward(x),
        }
    }
}

/// The names of a layer's norms, and which of them exist.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NormNames {
    /// Before attention.
    pub attention_in: &'static str,
    /// After attention, before the residual add (Gemma's sandwich norms).
    pub attention_out: Option<&'static str>,
    /// Before the feed-forward block.
    pub feed_forward_in: &'static str,
    /// After the feed-forward block, before the residual add.
    pub feed_forward_out: Option<&'static str>,
}

/// Llama's pre-norm layer: `input_layernorm` before attention,
/// `post_attention_layernorm` before the MLP.
pub const PRE_NORM: NormNames = NormNames {
    attention_in: "input_layernorm",
    attention_out: None,
    feed_forward_in: "post_attention_layernorm",
    feed_forward_out: None,
};

/// How a residual connection adds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Residual {
    /// `x + y` in the compute dtype.
    Plain,
    /// In float16, `x + y` taken in f32 and clipped to the f16 range (Gemma's
    /// activations overflow f16 otherwise).
    ClipF16,
}

/// What distinguishes one architecture's decoder from another's, besides
/// its attention and feed-forward blocks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DecoderSpec {
    /// The layers' norms.
    pub norms: NormNames,
    /// Norm gains are stored as offsets from one (Gemma).
    pub norm_offset: bool,
    /// Embeddings are multiplied by this (Gemma: `sqrt(hidden)`).
    pub embed_scale: f32,
    /// How residual connections add.
    pub residual: Residual,
}

impl DecoderSpec {
    /// Llama's decoder: pre-norm layers, plain residuals, unscaled embeddings.
    pub const LLAMA: DecoderSpec =
        DecoderSpec { norms: PRE_NORM, norm_offset: false, embed_scale: 1.0, residual: Residual::Plain };
}

impl Residual {
    fn add(self, x: &Array, y: &Array) -> Result<Array> {
        if self == Residual::ClipF16 && x.dtype() == Dtype::F16 {
            let sum = x.astype(Dtype::F32)?.add(&y.astype(Dtype::F32)?)?;
            let bound = f32::from(half::f16::MAX);
            return Ok(sum
                .minimum(&sum.scalar_like(bound)?)?
                .maximum(&sum.scalar_like(-bound)?)?
                .astype(Dtype::F16)?);
        }
        // fast::add folds the sum into the projection or norm that computes `y`.
        Ok(fast::add(x, y)?)
    }
}

/// One decoder layer:
/// `h = x + out_norm(attn(in_norm(x)))`, `out = h + out_norm(ff(in_norm(h)))`.
pub struct DecoderLayer {
    attention_in: RmsNorm,
    attention: Attention,
    attention_out: Option<RmsNorm>,
    feed_forward_in: RmsNorm,
    feed_forward: FeedForward,
    feed_forward_out: Option<RmsNorm>,
    residual: Residual,
    /// The layer's attention window, if it slides (checked when the layer
    /// is built: zero or absurd windows are refused there).
    window: Option<NonZeroUsize>,
}

impl DecoderLayer {
    /// The layer whose norms are under `w` (`model.layers.N`), around the
    /// given attention and feed-forward blocks.
    pub fn new(
        w: &Scope<'_>,
        c: &ModelConfig,
        spec: &DecoderSpec,
        window: Option<usize>,
        attention: Attention,
        feed_forward: FeedForward,
    ) -> Result<DecoderLayer> {
        let norm = |name: &str| w.rms_norm(name, c.hidden_size as i32, c.rms_norm_eps, spec.norm_offset);
        let optional = |name: Option<&str>| name.map(norm).transpose();
        Ok(DecoderLayer {
            attention_in: norm(spec.norms.attention_in)?,
            attention,
            attention_out: optional(spec.norms.attention_out)?,
            feed_forward_in: norm(spec.norms.feed_forward_in)?,
            feed_forward,
            feed_forward_out: optional(spec.norms.feed_forward_out)?,
            residual: spec.residual,
            window: window.map(|w| check_window("sliding_window", w)).transpose()?,
        })
    }

    /// Runs the layer over `x: [batch, seq, hidden]`.
    pub fn forward(&self, x: &Array, caches: &mut BatchCaches<'_, '_>, index: usize) -> Result<Array> {
        let mut r = self.attention.forward(&self.attention_in.forward(x)?, &mut caches.layer(index)?)?;
        if let Some(norm) = &self.attention_out {
            r = norm.forward(&r)?;
        }
        let h = self.residual.add(x, &r)?;
        let mut r = self.feed_forward.forward(&self.feed_forward_in.forward(&h)?)?;
        if let Some(norm) = &self.feed_forward_out {
            r = norm.forward(&r)?;
        }
        self.residual.add(&h, &r)
    }
}

/// A decoder-only language model: embeddings, layers, final norm and the
/// (possibly tied) output projection.
pub struct Decoder {
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    /// Output projection, or `None` when tied to the embeddings.
    lm_head: Option<Linear>,
    vocab_size: usize,
    context_length: usize,
}

impl Decoder {
    /// The model whose weights are under `w` (`model.embed_tokens`,
    /// `model.norm`, `lm_head`), around `layers`.
    pub fn new(w: &Weights, c: &ModelConfig, spec: &DecoderSpec, layers: Vec<DecoderLayer>) -> Result<Decoder> {
        let (vocab, hidden) = (c.vocab_size as i32, c.hidden_size as i32);
        let (root, model) = (w.root(), w.scope("model"));
        // A bundle of an older compiler may carry lm_head although its config
        // says tied; the head it carries is the one to use.
        let lm_head = if !c.tie_word_embeddings || root.has("lm_head") {
            Some(root.linear("lm_head", hidden, vocab, false)?)
        } else {
            None
        };
        Ok(Decoder {
            embed_tokens: model.embedding("embed_tokens", vocab, hidden, spec.embed_scale)?,
            layers,
            norm: model.rms_norm("norm", hidden, c.rms_norm_eps, spec.norm_offset)?,
            lm_head,
            vocab_size: c.vocab_size,
            context_length: c.max_position_embeddings,
        })
    }
}

impl LanguageModel for Decoder {
    fn hidden_states(&self, tokens: &Array, caches: &mut BatchCaches<'_, '_>) -> Result<Array> {
        let mut h = self.embed_tokens.forward(tokens)?;
        for (i, layer) in self.layers.iter().enumerate() {
            h = layer.forward(&h, caches, i)?;
        }
        Ok(h)
    }

    fn logits(&self, hidden: &Array) -> Result<Array> {
        let h = self.norm.forward(hidden)?;
        match &self.lm_head {
            Some(head) => Ok(fast::linear(&h, head)?),
            None => self.embed_tokens.as_linear(&h),
        }
    }

    fn new_caches(&self, max_kv: Option<NonZeroUsize>) -> Vec<KvCache> {
        self.layers.iter().map(|l| KvCache::for_layer(l.window, max_kv)).collect()
    }

    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn context_length(&self) -> usize {
        self.context_length
    }
}
