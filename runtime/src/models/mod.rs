//! The model code (`mlxcel_models`: every architecture, written once over a
//! backend seam) on MLX. [`Mlx`] says how MLX represents a model (arrays,
//! [`Linear`] maps, the layers of [`crate::nn`]); [`crate::weights::Weights`]
//! is its loader; [`MlxPass`] runs a forward pass's operations with the
//! fused kernels of `mlxcel_mlx::fast` over the batch's KV caches. Which
//! architecture a bundle holds comes from its normalized config
//! ([`mlxcel_arch::ModelConfig`]).

use std::num::NonZeroUsize;

use mlxcel_arch::{Activation, ModelConfig};
use mlxcel_mlx::fast;
use mlxcel_mlx::{Array, Dtype, Linear, Weight};
use mlxcel_models::decoder::Residual;
use mlxcel_models::{Backend, Decoder, Ops};

use crate::error::{Error, Result};
use crate::kv_cache::{BatchCaches, KvCache};
use crate::nn::{Embedding, RmsNorm, Rope, gate_activation};
use crate::weights::Weights;

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
    fn new_caches(&self, max_kv: Option<NonZeroUsize>) -> Vec<KvCache>;
    /// Vocabulary size (the logits' last axis).
    fn vocab_size(&self) -> usize;
    /// The longest context the model was trained for.
    fn context_length(&self) -> usize;
}

/// Builds the model `config` describes from `weights`, and checks that the
/// architecture used every tensor of the bundle.
pub fn build(config: &ModelConfig, weights: &Weights) -> Result<Box<dyn LanguageModel>> {
    let model = mlxcel_models::build::<Mlx>(config, weights)?;
    weights.check_all_used(config.architecture.name())?;
    weights.materialize()?;
    Ok(Box::new(model))
}

/// The model code's types on MLX.
pub struct Mlx;

impl Backend for Mlx {
    type Tensor = Array;
    type Linear = Linear;
    type Norm = RmsNorm;
    type Embedding = Embedding;
    type Rope = Rope;
    type Experts = Weight;
    type Error = Error;
}

impl LanguageModel for Decoder<Mlx> {
    fn hidden_states(&self, tokens: &Array, caches: &mut BatchCaches<'_, '_>) -> Result<Array> {
        Decoder::hidden_states(self, &mut MlxPass { caches: Some(caches) }, tokens)
    }

    fn logits(&self, hidden: &Array) -> Result<Array> {
        Decoder::logits(self, &mut MlxPass { caches: None }, hidden)
    }

    fn new_caches(&self, max_kv: Option<NonZeroUsize>) -> Vec<KvCache> {
        self.layers().iter().map(|l| KvCache::for_layer(l.window(), max_kv)).collect()
    }

    fn vocab_size(&self) -> usize {
        Decoder::vocab_size(self)
    }

    fn context_length(&self) -> usize {
        Decoder::context_length(self)
    }
}

/// One forward pass on MLX: the batch's caches, which attention reads and
/// appends to (none for the output projection alone).
pub struct MlxPass<'p, 'a, 'b> {
    caches: Option<&'p mut BatchCaches<'a, 'b>>,
}

impl Ops<Mlx> for MlxPass<'_, '_, '_> {
    fn embed(&mut self, table: &Embedding, ids: &Array) -> Result<Array> {
        table.forward(ids)
    }

    fn embedding_logits(&mut self, table: &Embedding, x: &Array) -> Result<Array> {
        table.as_linear(x)
    }

    fn rms_norm(&mut self, norm: &RmsNorm, x: &Array) -> Result<Array> {
        norm.forward(x)
    }

    fn linear(&mut self, x: &Array, map: &Linear) -> Result<Array> {
        Ok(fast::linear(x, map)?)
    }

    fn linear_heads(&mut self, x: &Array, maps: &[(&Linear, usize)], _head_dim: usize) -> Result<Vec<Array>> {
        let maps = maps.iter().map(|&(l, heads)| Ok((l, i32_of(heads)?))).collect::<Result<Vec<_>>>()?;
        Ok(fast::linear_heads(x, &maps)?)
    }

    fn split_heads(&mut self, x: &Array, heads: &[usize], head_dim: usize) -> Result<Vec<Array>> {
        let shape = x.shape();
        let (b, l, d) = (shape[0], shape[1], i32_of(head_dim)?);
        // Split where each group of heads ends, all but the last.
        let mut ends = Vec::with_capacity(heads.len());
        let mut end = 0;
        for &n in &heads[..heads.len().saturating_sub(1)] {
            end += i32_of(n)? * d;
            ends.push(end);
        }
        x.split_at(&ends, -1)?
            .into_iter()
            .zip(heads)
            .map(|(t, &n)| Ok(t.reshape(&[b, l, i32_of(n)?, d])?.transpose(&[0, 2, 1, 3])?))
            .collect()
    }

    fn split_last(&mut self, x: &Array, parts: usize) -> Result<Vec<Array>> {
        Ok(x.split(i32_of(parts)?, -1)?)
    }

    fn residual(&mut self, x: &Array, y: &Array, how: Residual) -> Result<Array> {
        if how == Residual::ClipF16 && x.dtype() == Dtype::F16 {
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

    fn gated_linear(&mut self, x: &Array, gate: &Linear, up: &Linear, act: Activation) -> Result<Array> {
        Ok(fast::gated_linear(x, gate, up, gate_activation(act))?)
    }

    fn gated(&mut self, gate: &Array, up: &Array, act: Activation) -> Result<Array> {
        Ok(fast::gated_activation(gate_activation(act), gate, up)?)
    }

    fn attend(&mut self, layer: usize, q: &Array, k: &Array, v: &Array, rope: &Rope, scale: f32) -> Result<Array> {
        let caches =
            self.caches.as_mut().ok_or_else(|| Error::Config("attention outside a pass with KV caches".into()))?;
        caches.layer(layer)?.attend(q, k, v, rope, scale)
    }

    fn softmax(&mut self, x: &Array) -> Result<Array> {
        Ok(x.softmax(&[-1], true)?)
    }

    fn top_k(&mut self, x: &Array, k: usize) -> Result<(Array, Array)> {
        let shape = x.shape();
        let last = *shape.last().ok_or_else(|| Error::Config("top-k of a scalar".into()))?;
        let k = i32_of(k)?;
        // argpartition puts the k largest last, in no particular order.
        let mut start = vec![0; shape.len()];
        *start.last_mut().expect("checked non-empty") = last - k;
        let chosen = x.argpartition(last - k, -1)?.slice(&start, &shape, &vec![1; shape.len()])?;
        Ok((x.take_along_axis(&chosen, -1)?, chosen))
    }

    fn normalize_sum(&mut self, x: &Array) -> Result<Array> {
        Ok(x.divide(&x.sum(&[-1], true)?)?)
    }

    fn switch_glu(
        &mut self,
        x: &Array,
        [gate, up, down]: [&Weight; 3],
        chosen: &Array,
        act: Activation,
    ) -> Result<Array> {
        // [b, l, 1, 1, hidden] against each token's k experts: [b, l, k, 1, out].
        let x = x.expand_dims(&[-2, -3])?;
        let up = expert_products(&x, up, chosen)?;
        let gate = expert_products(&x, gate, chosen)?;
        let hidden = fast::gated_activation(gate_activation(act), &gate, &up)?;
        Ok(expert_products(&hidden, down, chosen)?.squeeze(&[-2])?)
    }

    fn weighted_sum(&mut self, ys: &Array, weights: &Array) -> Result<Array> {
        Ok(ys.multiply(&weights.expand_dims(&[-1])?)?.sum(&[-2], false)?.astype(ys.dtype())?)
    }
}

/// `x @ W_eᵀ` for each token's chosen experts `e` (`chosen: [b, l, k]`):
/// MLX's `gather_qmm`/`gather_mm` multiply each token by its chosen experts'
/// matrices without materialising anything per expert.
fn expert_products(x: &Array, w: &Weight, chosen: &Array) -> Result<Array> {
    Ok(match w {
        Weight::Quantized(q) => q.gather_matmul(x, None, Some(chosen), true, false)?,
        Weight::Dense(d) => x.gather_mm(&d.swapaxes(-1, -2)?, None, Some(chosen), false)?,
    })
}

/// A size as MLX's `i32`.
fn i32_of(n: usize) -> Result<i32> {
    i32::try_from(n).map_err(|_| Error::Config(format!("size {n} is beyond 32-bit shapes")))
}
