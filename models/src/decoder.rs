//! The decoder every architecture here is: token embeddings, a stack of
//! layers (attention then feed-forward, each with a residual connection and
//! RMS norms before and optionally after), a final norm and the output
//! projection. An architecture file says how its layers differ through a
//! [`DecoderSpec`] and builds each layer's attention and feed-forward.

use std::num::NonZeroUsize;

use mlxcel_arch::ModelConfig;

use crate::attention::{Attention, AttentionSpec};
use crate::backend::{Backend, BackendResult, Ops};
use crate::error::check_window;
use crate::feed_forward::FeedForward;
use crate::rope::RopeSpec;
use crate::scope::Scope;

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
    /// `x + y` in the activations' type.
    Plain,
    /// In float16, `x + y` taken in f32 and clipped to the f16 range (Gemma's
    /// activations overflow f16 otherwise); plain in other types.
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

/// One decoder layer:
/// `h = x + out_norm(attn(in_norm(x)))`, `out = h + out_norm(ff(in_norm(h)))`.
pub struct DecoderLayer<B: Backend> {
    attention_in: B::Norm,
    attention: Attention<B>,
    attention_out: Option<B::Norm>,
    feed_forward_in: B::Norm,
    feed_forward: FeedForward<B>,
    feed_forward_out: Option<B::Norm>,
    residual: Residual,
    /// The layer's attention window, if it slides (checked when the layer
    /// is built: zero or absurd windows are refused there).
    window: Option<NonZeroUsize>,
}

impl<B: Backend> DecoderLayer<B> {
    /// The layer whose norms are under `w` (`model.layers.N`), around the
    /// given attention and feed-forward blocks.
    pub fn new(
        w: &Scope<'_, B>,
        c: &ModelConfig,
        spec: &DecoderSpec,
        window: Option<usize>,
        attention: Attention<B>,
        feed_forward: FeedForward<B>,
    ) -> BackendResult<DecoderLayer<B>, B> {
        let norm = |name: &str| w.rms_norm(name, c.hidden_size, c.rms_norm_eps, spec.norm_offset);
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

    /// Runs the layer over `x: [b, l, hidden]`.
    pub fn forward(&self, ops: &mut dyn Ops<B>, x: &B::Tensor) -> BackendResult<B::Tensor, B> {
        let normed = ops.rms_norm(&self.attention_in, x)?;
        let mut r = self.attention.forward(ops, &normed)?;
        if let Some(norm) = &self.attention_out {
            r = ops.rms_norm(norm, &r)?;
        }
        let h = ops.residual(x, &r, self.residual)?;
        let normed = ops.rms_norm(&self.feed_forward_in, &h)?;
        let mut r = self.feed_forward.forward(ops, &normed)?;
        if let Some(norm) = &self.feed_forward_out {
            r = ops.rms_norm(norm, &r)?;
        }
        ops.residual(&h, &r, self.residual)
    }

    /// The layer's attention window, if it slides.
    pub fn window(&self) -> Option<NonZeroUsize> {
        self.window
    }
}

/// A decoder-only language model: embeddings, layers, final norm and the
/// (possibly tied) output projection.
pub struct Decoder<B: Backend> {
    embed_tokens: B::Embedding,
    layers: Vec<DecoderLayer<B>>,
    norm: B::Norm,
    /// Output projection, or `None` when tied to the embeddings.
    lm_head: Option<B::Linear>,
    vocab_size: usize,
    context_length: usize,
}

impl<B: Backend> Decoder<B> {
    /// The model whose weights are under `w` (`model.embed_tokens`,
    /// `model.norm`, `lm_head`), around `layers`.
    pub fn new(
        w: &Scope<'_, B>,
        c: &ModelConfig,
        spec: &DecoderSpec,
        layers: Vec<DecoderLayer<B>>,
    ) -> BackendResult<Decoder<B>, B> {
        let (vocab, hidden) = (c.vocab_size, c.hidden_size);
        let model = w.scope("model");
        // A bundle of an older compiler may carry lm_head although its config
        // says tied; the head it carries is the one to use.
        let lm_head = if !c.tie_word_embeddings || w.has("lm_head") {
            Some(w.linear("lm_head", hidden, vocab, false)?)
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

    /// The hidden states `[b, l, hidden]` after the last layer for token ids
    /// `[b, l]`, appending the pass's keys and values to each row's caches.
    pub fn hidden_states(&self, ops: &mut dyn Ops<B>, tokens: &B::Tensor) -> BackendResult<B::Tensor, B> {
        let mut h = ops.embed(&self.embed_tokens, tokens)?;
        for layer in &self.layers {
            h = layer.forward(ops, &h)?;
        }
        Ok(h)
    }

    /// Logits `[.., vocab]` of hidden states: the final norm and the output
    /// projection, position by position (so a caller that needs only the
    /// last position's logits projects only that one).
    pub fn logits(&self, ops: &mut dyn Ops<B>, hidden: &B::Tensor) -> BackendResult<B::Tensor, B> {
        let h = ops.rms_norm(&self.norm, hidden)?;
        match &self.lm_head {
            Some(head) => ops.linear(&h, head),
            None => ops.embedding_logits(&self.embed_tokens, &h),
        }
    }

    /// The layers, in order.
    pub fn layers(&self) -> &[DecoderLayer<B>] {
        &self.layers
    }

    /// Vocabulary size (the logits' last axis).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The longest context the model was trained for.
    pub fn context_length(&self) -> usize {
        self.context_length
    }
}

/// Builds a decoder whose layer `i` attends as `attention` says with the
/// RoPE `rope(i)` and whose feed-forward block is `feed_forward(mlp, i)`.
pub(crate) fn build_decoder<B: Backend>(
    w: &Scope<'_, B>,
    c: &ModelConfig,
    spec: &DecoderSpec,
    attention: AttentionSpec,
    rope: impl Fn(usize) -> crate::Result<RopeSpec>,
    feed_forward: impl Fn(&Scope<'_, B>, usize) -> BackendResult<FeedForward<B>, B>,
) -> BackendResult<Decoder<B>, B> {
    let layers = w.scope("model").scope("layers");
    let layers = (0..c.num_hidden_layers)
        .map(|i| {
            let layer = layers.scope(i);
            let rope = layer.rope(&rope(i)?)?;
            let attn = Attention::new(&layer.scope("self_attn"), i, c, attention, rope)?;
            let ff = feed_forward(&layer.scope("mlp"), i)?;
            DecoderLayer::new(&layer, c, spec, c.window(i), attn, ff)
        })
        .collect::<BackendResult<Vec<_>, B>>()?;
    Decoder::new(w, c, spec, layers)
}

/// The RoPE of the config's (global) layers: `rope_theta` and `rope_scaling`
/// over the rotated share of each head.
pub(crate) fn global_rope(c: &ModelConfig) -> crate::Result<RopeSpec> {
    RopeSpec::scaled(
        c.rope_dims(),
        c.rope_traditional,
        c.rope_theta,
        c.rope_scaling.as_ref(),
        c.max_position_embeddings,
    )
}
