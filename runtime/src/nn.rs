//! The MLX form of the layers the model code (`mlxcel_models`) is built
//! from: embeddings, RMS norms and rotary position embeddings. Linear
//! maps are [`mlxcel_mlx::Linear`], applied with [`fast::linear`] and friends,
//! which decide inside `mlx-kernels` whether a call becomes one of mlxcel's
//! fused CPU kernels or MLX's own ops; model code never knows which. They
//! compute what mlx-lm's layers compute, so that a bundle and mlx-lm agree
//! token for token on the same weights.

use mlxcel_arch::Activation;
use mlxcel_mlx::fast::{self, GateActivation};
use mlxcel_mlx::{Array, Linear, Weight};
use mlxcel_models::rope::{Frequencies, RopeSpec};

use crate::error::{Error, Result};

/// A token embedding table `[vocab, dim]`, dense or quantized, whose rows are
/// multiplied by `scale` (Gemma's `sqrt(hidden)`); it doubles as the output
/// projection of models with tied embeddings.
pub struct Embedding {
    table: Weight,
    scale: f32,
    /// The table as a linear map (for tied output projections).
    head: Linear,
}

impl Embedding {
    /// A table whose rows are scaled by `scale` when looked up (1 for none).
    pub fn new(table: Weight, scale: f32) -> Embedding {
        let head = Linear { weight: table.clone(), bias: None };
        Embedding { table, scale, head }
    }

    /// The embeddings of `ids` (any shape of u32/i32 token ids), shaped `[..ids, dim]`.
    pub fn forward(&self, ids: &Array) -> Result<Array> {
        Ok(fast::embedding(ids, &self.table, self.scale)?)
    }

    /// `x Eᵀ`: logits over the vocabulary for tied embeddings.
    pub fn as_linear(&self, x: &Array) -> Result<Array> {
        Ok(fast::linear(x, &self.head)?)
    }
}

/// RMS normalisation over the last axis with a learned gain.
pub struct RmsNorm {
    /// The gain actually multiplied in (Gemma's `1 + w` is folded in at load).
    pub weight: Array,
    /// Added to the mean square.
    pub eps: f32,
}

impl RmsNorm {
    /// `x / sqrt(mean(x²) + eps) * weight`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        Ok(fast::rms_norm(x, Some(&self.weight), self.eps)?)
    }
}

/// Rotary position embedding of the first `dims` features of each head.
pub struct Rope {
    dims: i32,
    traditional: bool,
    frequencies: RopeFrequencies,
    /// Multiplies the rotated features first (YaRN's and LongRoPE's mscale).
    input_scale: Option<f32>,
}

enum RopeFrequencies {
    /// `base^(2i/dims)` wavelengths, positions multiplied by `scale`.
    Base { base: f32, scale: f32 },
    /// Explicit per-pair wavelengths (llama3, yarn, longrope).
    Explicit(Array),
}

impl Rope {
    /// The rotation `spec` describes (its wavelengths, if explicit, become
    /// an array the kernels read).
    pub fn new(spec: &RopeSpec) -> Result<Rope> {
        let dims =
            i32::try_from(spec.dims).map_err(|_| Error::Config(format!("rope: {} rotated dimensions", spec.dims)))?;
        let frequencies = match &spec.frequencies {
            Frequencies::Base { base, scale } => RopeFrequencies::Base { base: *base, scale: *scale },
            Frequencies::Wavelengths(w) => RopeFrequencies::Explicit(Array::from_slice(w, &[w.len() as i32])?),
        };
        Ok(Rope { dims, traditional: spec.traditional, frequencies, input_scale: spec.input_scale })
    }

    /// Rotates `x: [batch, heads, seq, head_dim]` for positions `offset..`.
    pub fn forward(&self, x: &Array, offset: usize) -> Result<Array> {
        let spec = self.spec();
        Ok(fast::rope(
            &self.prescale(x)?,
            spec.dims,
            spec.traditional,
            spec.base,
            spec.scale,
            offset as i32,
            spec.freqs,
        )?)
    }

    /// What [`Rope::forward`] does to `x` before rotating it: scales the
    /// rotated features by the input scale, if any.
    pub fn prescale(&self, x: &Array) -> Result<Array> {
        match self.input_scale {
            Some(s) => scale_leading_features(x, self.dims, s),
            None => Ok(x.clone()),
        }
    }

    /// The rotation itself, as the fused kernels take it (after [`Rope::prescale`]).
    pub fn spec(&self) -> fast::RopeSpec<'_> {
        let (base, scale, freqs) = match &self.frequencies {
            RopeFrequencies::Base { base, scale } => (*base, *scale, None),
            RopeFrequencies::Explicit(freqs) => (0.0, 1.0, Some(freqs)),
        };
        fast::RopeSpec { dims: self.dims, traditional: self.traditional, base, scale, freqs }
    }
}

/// `x[..., :dims] *= s` (as mlx-lm's `x.at[..., :dims].multiply(s)`).
fn scale_leading_features(x: &Array, dims: i32, s: f32) -> Result<Array> {
    let shape = x.shape();
    let last = *shape.last().ok_or_else(|| Error::Config("rope input has no dimensions".into()))?;
    let scaled_part = x.multiply_scalar(s)?;
    if dims >= last {
        return Ok(scaled_part);
    }
    let zeros = vec![0; shape.len()];
    let mut stop = shape.clone();
    *stop.last_mut().expect("checked non-empty") = dims;
    let ones = vec![1; shape.len()];
    let head = scaled_part.slice(&zeros, &stop, &ones)?;
    Ok(x.slice_update(&head, &zeros, &stop, &ones)?)
}

/// The fused kernels' name for a gated activation.
pub fn gate_activation(act: Activation) -> GateActivation {
    match act {
        Activation::Silu => GateActivation::Silu,
        Activation::GeluTanh => GateActivation::GeluApprox,
    }
}
