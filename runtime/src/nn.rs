//! The layers transformer architectures are built from: linear projections
//! (dense or quantized), embeddings, RMS norms and rotary position embeddings.
//! They compute what mlx-lm's layers compute, so that a bundle and mlx-lm
//! agree token for token on the same weights. The fused operations come from
//! `mlxcel_mlx::fast`, which runs mlxcel's CPU kernels where they apply and
//! MLX's own ops elsewhere (the GPU, other dtypes).

use mlxcel_mlx::fast::{self, GateActivation};
use mlxcel_mlx::{Array, Quantized};

use crate::error::{Error, Result};

/// A linear projection `y = x Wᵀ (+ b)` with `W: [out, in]`.
pub enum Linear {
    /// Float weights.
    Dense {
        /// `[out, in]`.
        weight: Array,
        /// `[out]`.
        bias: Option<Array>,
    },
    /// Affine-quantized weights (packed along `in`).
    Quantized {
        /// Packed codes with their scales and biases.
        weight: Quantized,
        /// `[out]`.
        bias: Option<Array>,
    },
}

impl Linear {
    /// Applies the projection to the last axis of `x`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            Linear::Dense { weight, bias: None } => Ok(x.matmul(&weight.transpose(&[])?)?),
            Linear::Dense { weight, bias: Some(b) } => Ok(Array::addmm(b, x, &weight.transpose(&[])?, 1.0, 1.0)?),
            Linear::Quantized { weight, bias } => {
                let y = fast::quantized_linear(x, weight)?;
                Ok(match bias {
                    Some(b) => y.add(b)?,
                    None => y,
                })
            }
        }
    }

    /// Several projections of the same `x [batch, seq, in]`, each split into
    /// heads: `(linear, heads)` gives `[batch, heads, seq, out / heads]`.
    /// Quantized projections without biases run as one fused operation.
    pub fn forward_heads(x: &Array, projections: &[(&Linear, i32)]) -> Result<Vec<Array>> {
        let quantized: Option<Vec<(&Quantized, i32)>> = projections
            .iter()
            .map(|&(linear, heads)| match linear {
                Linear::Quantized { weight, bias: None } => Some((weight, heads)),
                _ => None,
            })
            .collect();
        if let Some(ws) = quantized {
            return Ok(fast::quantized_linear_heads(x, &ws)?);
        }
        let s = x.shape();
        projections
            .iter()
            .map(|&(linear, heads)| {
                let y = linear.forward(x)?;
                Ok(y.reshape(&[s[0], s[1], heads, linear.out_features() / heads])?.transpose(&[0, 2, 1, 3])?)
            })
            .collect()
    }

    /// The number of outputs.
    pub fn out_features(&self) -> i32 {
        match self {
            Linear::Dense { weight, .. } => weight.shape()[0],
            Linear::Quantized { weight, .. } => weight.weight.shape()[0],
        }
    }
}

/// A token embedding table `[vocab, dim]`, dense or quantized; it doubles as
/// the output projection of models with tied embeddings.
pub enum Embedding {
    /// Float table.
    Dense(Array),
    /// Quantized table (rows are gathered, then dequantized).
    Quantized(Quantized),
}

impl Embedding {
    /// The embeddings of `ids` (any shape of u32/i32 token ids), shaped `[..ids, dim]`.
    pub fn forward(&self, ids: &Array) -> Result<Array> {
        match self {
            Embedding::Dense(table) => Ok(table.take(ids, 0)?),
            Embedding::Quantized(q) => Ok(fast::quantized_embedding(ids, q)?),
        }
    }

    /// `forward(ids) * scale` (Gemma scales its embeddings by `sqrt(hidden)`);
    /// for a quantized table the kernel multiplies as it dequantizes, so the
    /// step needs no node of MLX's.
    pub fn forward_scaled(&self, ids: &Array, scale: f32) -> Result<Array> {
        match self {
            Embedding::Dense(table) => Ok(table.take(ids, 0)?.multiply_scalar(scale)?),
            Embedding::Quantized(q) => Ok(fast::quantized_embedding_scaled(ids, q, scale)?),
        }
    }

    /// `x Eᵀ`: logits over the vocabulary for tied embeddings.
    pub fn as_linear(&self, x: &Array) -> Result<Array> {
        match self {
            Embedding::Dense(table) => Ok(x.matmul(&table.transpose(&[])?)?),
            Embedding::Quantized(q) => Ok(fast::quantized_linear(x, q)?),
        }
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

/// The feed-forward block of Llama-style models: `down(act(gate(x)) * up(x))`.
pub struct GatedMlp {
    /// The gate and up projections.
    pub gate_up: GateUp,
    /// Down projection.
    pub down: Linear,
    /// The gate's activation.
    pub activation: Activation,
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

/// Activations of gated MLPs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `x * sigmoid(x)` (SwiGLU).
    Silu,
    /// The tanh approximation of GELU (GeGLU, Gemma).
    GeluApprox,
}

impl Activation {
    /// Applies the activation elementwise.
    pub fn apply(self, x: &Array) -> Result<Array> {
        Ok(match self {
            Activation::Silu => x.silu()?,
            Activation::GeluApprox => x.gelu_approx()?,
        })
    }

    /// `act(gate) * up` in one fused operation.
    pub fn gate(self, gate: &Array, up: &Array) -> Result<Array> {
        let act = match self {
            Activation::Silu => GateActivation::Silu,
            Activation::GeluApprox => GateActivation::GeluApprox,
        };
        Ok(fast::gated_activation(act, gate, up)?)
    }
}

impl GatedMlp {
    /// `down(act(gate(x)) * up(x))`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        if let GateUp::Separate {
            gate: Linear::Quantized { weight: gate, bias: None },
            up: Linear::Quantized { weight: up, bias: None },
        } = &self.gate_up
        {
            // Gate, up and the activation as one fused operation.
            let act = match self.activation {
                Activation::Silu => GateActivation::Silu,
                Activation::GeluApprox => GateActivation::GeluApprox,
            };
            return self.down.forward(&fast::quantized_gated_linear(x, gate, up, act)?);
        }
        let (gate, up) = match &self.gate_up {
            GateUp::Separate { gate, up } => (gate.forward(x)?, up.forward(x)?),
            GateUp::Fused(gate_up) => {
                let mut halves = gate_up.forward(x)?.split(2, -1)?.into_iter();
                match (halves.next(), halves.next()) {
                    (Some(gate), Some(up)) => (gate, up),
                    _ => unreachable!("split into 2 gives two parts"),
                }
            }
        };
        self.down.forward(&self.activation.gate(&gate, &up)?)
    }
}
