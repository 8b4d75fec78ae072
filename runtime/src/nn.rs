//! The layers transformer architectures are built from: embeddings, RMS
//! norms, rotary position embeddings and gated feed-forward blocks. Linear
//! maps are [`mlxcel_mlx::Linear`], applied with [`fast::linear`] and friends,
//! which decide inside `mlx-kernels` whether a call becomes one of mlxcel's
//! fused CPU kernels or MLX's own ops; model code never knows which. They
//! compute what mlx-lm's layers compute, so that a bundle and mlx-lm agree
//! token for token on the same weights.

use mlxcel_arch::{Activation, RopeScaling};
use mlxcel_mlx::fast::{self, GateActivation};
use mlxcel_mlx::{Array, Linear, Weight};

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
    /// Plain RoPE (`scale` multiplies positions: linear scaling uses `1/factor`).
    pub fn new(dims: i32, traditional: bool, base: f32, scale: f32) -> Rope {
        Rope { dims, traditional, frequencies: RopeFrequencies::Base { base, scale }, input_scale: None }
    }

    /// RoPE with explicit wavelengths (`dims / 2` of them) and an optional
    /// scale applied to the rotated features first.
    pub fn with_wavelengths(
        dims: i32,
        traditional: bool,
        wavelengths: &[f32],
        input_scale: Option<f32>,
    ) -> Result<Rope> {
        if wavelengths.len() != (dims / 2) as usize {
            return Err(Error::Config(format!(
                "rope: {} frequencies for {} rotated dimensions (need {})",
                wavelengths.len(),
                dims,
                dims / 2
            )));
        }
        let freqs = Array::from_slice(wavelengths, &[wavelengths.len() as i32])?;
        Ok(Rope { dims, traditional, frequencies: RopeFrequencies::Explicit(freqs), input_scale })
    }

    /// The RoPE of `dims` rotated features with base `base` and the config's
    /// frequency scaling, mirroring mlx-lm's `initialize_rope`.
    pub fn scaled(
        dims: i32,
        traditional: bool,
        base: f32,
        scaling: Option<&RopeScaling>,
        max_position_embeddings: usize,
    ) -> Result<Rope> {
        let exponents = |d: i32| (0..d / 2).map(move |i| (2 * i) as f64 / d as f64);
        match scaling {
            None => Ok(Rope::new(dims, traditional, base, 1.0)),
            Some(RopeScaling::Linear { factor }) => Ok(Rope::new(dims, traditional, base, 1.0 / factor)),
            Some(&RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            }) => {
                let factor = f64::from(factor);
                let (low, high) = (f64::from(low_freq_factor), f64::from(high_freq_factor));
                let old = f64::from(original_max_position_embeddings);
                let (low_wavelen, high_wavelen) = (old / low, old / high);
                let freqs: Vec<f32> = exponents(dims)
                    .map(|e| {
                        let f = (f64::from(base) as f32).powf(e as f32);
                        let wavelen = 2.0 * std::f32::consts::PI * f;
                        let f = if f64::from(wavelen) > low_wavelen { f * factor as f32 } else { f };
                        let medium = f64::from(wavelen) > high_wavelen && f64::from(wavelen) < low_wavelen;
                        if medium {
                            let smooth = ((old / f64::from(wavelen)) - low) / (high - low);
                            (f64::from(f) / ((1.0 - smooth) / factor + smooth)) as f32
                        } else {
                            f
                        }
                    })
                    .collect();
                Rope::with_wavelengths(dims, traditional, &freqs, None)
            }
            Some(&RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                mscale,
                mscale_all_dim,
            }) => {
                let factor = f64::from(factor);
                let original = f64::from(original_max_position_embeddings);
                let (beta_fast, beta_slow) = (f64::from(beta_fast), f64::from(beta_slow));
                let (mscale, mscale_all_dim) = (f64::from(mscale), f64::from(mscale_all_dim));
                let b = f64::from(base);
                let d = f64::from(dims);
                let correction = |rot: f64| d * (original / (rot * 2.0 * std::f64::consts::PI)).ln() / (2.0 * b.ln());
                let low = correction(beta_fast).floor().max(0.0);
                let high = correction(beta_slow).ceil().min(d - 1.0);
                let high = if low == high { high + 0.001 } else { high };
                let get_mscale = |m: f64| if factor <= 1.0 { 1.0 } else { 0.1 * m * factor.ln() + 1.0 };
                let input_scale = get_mscale(mscale) / get_mscale(mscale_all_dim);
                let freqs: Vec<f32> = exponents(dims)
                    .enumerate()
                    .map(|(i, e)| {
                        let extra = (b as f32).powf(e as f32);
                        let inter = factor as f32 * extra;
                        let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0) as f32;
                        let mask = 1.0 - ramp;
                        (inter * extra) / (inter * mask + extra * (1.0 - mask))
                    })
                    .collect();
                let s = (input_scale != 1.0).then_some(input_scale as f32);
                Rope::with_wavelengths(dims, traditional, &freqs, s)
            }
            Some(RopeScaling::Longrope { long_factor, original_max_position_embeddings }) => {
                let freqs: Vec<f32> =
                    exponents(dims).zip(long_factor).map(|(e, l)| l * (base.powf(e as f32))).collect();
                let original = *original_max_position_embeddings as f64;
                let factor = max_position_embeddings as f64 / original;
                let scale = if factor <= 1.0 { 1.0 } else { (1.0 + factor.ln() / original.ln()).sqrt() };
                let s = (scale != 1.0).then_some(scale as f32);
                Rope::with_wavelengths(dims, traditional, &freqs, s)
            }
        }
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

/// How a gated MLP projects its gate and its linear part.
pub enum GateUp {
    /// Two projections (`gate_proj`, `up_proj`).
    Separate {
        /// The gate.
        gate: Linear,
        /// The linear part.
        up: Linear,
    },
    /// One projection whose output halves are gate and up (`gate_up_proj`, Phi-3).
    Fused(Linear),
}

/// The feed-forward block of Llama-style models: `down(act(gate(x)) * up(x))`.
pub struct GatedMlp {
    /// The gate and up projections.
    pub gate_up: GateUp,
    /// Down projection.
    pub down: Linear,
    /// The gate's activation.
    pub activation: Activation,
}

impl GatedMlp {
    /// `down(act(gate(x)) * up(x))`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let act = gate_activation(self.activation);
        let hidden = match &self.gate_up {
            GateUp::Separate { gate, up } => fast::gated_linear(x, gate, up, act)?,
            GateUp::Fused(gate_up) => {
                let mut halves = fast::linear(x, gate_up)?.split(2, -1)?.into_iter();
                match (halves.next(), halves.next()) {
                    (Some(gate), Some(up)) => fast::gated_activation(act, &gate, &up)?,
                    _ => unreachable!("split into 2 gives two parts"),
                }
            }
        };
        Ok(fast::linear(&hidden, &self.down)?)
    }
}
