//! Model architectures. Every architecture here is one [`decoder::Decoder`];
//! an architecture file says, in a few lines, how its attention
//! ([`attention::AttentionSpec`]), its feed-forward blocks and its layers
//! ([`decoder::DecoderSpec`]) differ from Llama's. Which architecture a
//! bundle holds comes from its normalized config
//! ([`mlxcel_arch::ModelConfig`]); the table of names lives in `mlxcel-arch`.

pub mod attention;
pub mod decoder;
mod gemma3;
mod llama;
pub mod moe;
mod phi3;
mod qwen2;
mod qwen3;
mod qwen3_moe;

use mlxcel_arch::{Architecture, ModelConfig};
use mlxcel_mlx::Array;

use crate::error::Result;
use crate::kv_cache::{BatchCaches, KvCache};
use crate::nn::{GateUp, GatedMlp, Rope};
use crate::weights::{Scope, Weights};
use attention::{Attention, AttentionSpec};
use decoder::{Decoder, DecoderLayer, DecoderSpec, FeedForward};

/// A decoder-only language model on MLX.
pub trait LanguageModel {
    /// The hidden states `[batch, seq, hidden]` after the last layer for
    /// `tokens: [batch, seq]` (u32), appending the step's keys and values to
    /// each row's caches (`caches` holds one sequence per row of `tokens`).
    fn hidden_states(&self, tokens: &Array, caches: &mut BatchCaches<'_, '_>) -> Result<Array>;
    /// Logits `[.., vocab]` of hidden states: the final norm and the output
    /// projection, position by position (so a caller that needs only the last
    /// position's logits projects only that one).
    fn logits(&self, hidden: &Array) -> Result<Array>;
    /// Fresh caches for one sequence, one per layer; `max_kv` caps global
    /// layers to a window.
    fn new_caches(&self, max_kv: Option<std::num::NonZeroUsize>) -> Vec<KvCache>;
    /// Vocabulary size (the logits' last axis).
    fn vocab_size(&self) -> usize;
    /// The longest context the model was trained for.
    fn context_length(&self) -> usize;
}

/// Builds the model `config` describes from `weights`, and checks that the
/// architecture used every tensor of the bundle.
pub fn build(config: &ModelConfig, weights: &Weights) -> Result<Box<dyn LanguageModel>> {
    let model = match config.architecture {
        Architecture::Llama | Architecture::Mistral => llama::build(config, weights)?,
        Architecture::Qwen2 => qwen2::build(config, weights)?,
        Architecture::Qwen3 => qwen3::build(config, weights)?,
        Architecture::Qwen3Moe => qwen3_moe::build(config, weights)?,
        Architecture::Gemma3 => gemma3::build(config, weights)?,
        Architecture::Phi3 => phi3::build(config, weights)?,
    };
    weights.check_all_used(config.architecture.name())?;
    weights.materialize()?;
    Ok(Box::new(model))
}

/// Builds a decoder whose layer `i` attends as `attention` says with
/// `rope(i)` and whose feed-forward block is `feed_forward(mlp_weights, i)`.
fn build_decoder(
    w: &Weights,
    c: &ModelConfig,
    spec: &DecoderSpec,
    attention: AttentionSpec,
    rope: impl Fn(usize) -> Result<Rope>,
    feed_forward: impl Fn(&Scope<'_>, usize) -> Result<FeedForward>,
) -> Result<Decoder> {
    let layers = w.scope("model").scope("layers");
    let layers = (0..c.num_hidden_layers)
        .map(|i| {
            let layer = layers.scope(i);
            let attn = Attention::new(&layer.scope("self_attn"), c, attention, rope(i)?)?;
            let ff = feed_forward(&layer.scope("mlp"), i)?;
            DecoderLayer::new(&layer, c, spec, c.window(i), attn, ff)
        })
        .collect::<Result<Vec<_>>>()?;
    Decoder::new(w, c, spec, layers)
}

/// The RoPE of the config's (global) layers: `rope_theta` and `rope_scaling`
/// over the rotated share of each head.
fn global_rope(c: &ModelConfig) -> Result<Rope> {
    Rope::scaled(
        c.rope_dims() as i32,
        c.rope_traditional,
        c.rope_theta,
        c.rope_scaling.as_ref(),
        c.max_position_embeddings,
    )
}

/// A gated MLP with separate `gate_proj`, `up_proj` and `down_proj`.
fn gated_mlp(w: &Scope<'_>, c: &ModelConfig) -> Result<FeedForward> {
    let (h, m, bias) = (c.hidden_size as i32, c.intermediate_size as i32, c.mlp_bias);
    Ok(FeedForward::Gated(GatedMlp {
        gate_up: GateUp::Separate { gate: w.linear("gate_proj", h, m, bias)?, up: w.linear("up_proj", h, m, bias)? },
        down: w.linear("down_proj", m, h, bias)?,
        activation: c.hidden_act,
    }))
}
