//! The feed-forward half of a decoder layer: a gated MLP (SwiGLU, GeGLU)
//! or a mixture of them ([`crate::moe`]).

use mlxcel_arch::{Activation, ModelConfig};

use crate::backend::{Backend, BackendResult, Ops};
use crate::moe::SparseMoe;
use crate::scope::Scope;

/// How a gated MLP projects its gate and its linear part.
pub enum GateUp<B: Backend> {
    /// Two projections (`gate_proj`, `up_proj`).
    Separate {
        /// The gate.
        gate: B::Linear,
        /// The linear part.
        up: B::Linear,
    },
    /// One projection whose output halves are gate and up (`gate_up_proj`, Phi-3).
    Fused(B::Linear),
}

/// The feed-forward block of Llama-style models: `down(act(gate(x)) · up(x))`.
pub struct GatedMlp<B: Backend> {
    /// The gate and up projections.
    pub gate_up: GateUp<B>,
    /// The down projection.
    pub down: B::Linear,
    /// The gate's activation.
    pub activation: Activation,
}

impl<B: Backend> GatedMlp<B> {
    /// The MLP with separate `gate_proj`, `up_proj` and `down_proj` under `w`
    /// (`model.layers.N.mlp`), of the config's sizes.
    pub fn new(w: &Scope<'_, B>, c: &ModelConfig) -> BackendResult<GatedMlp<B>, B> {
        let (h, m, bias) = (c.hidden_size, c.intermediate_size, c.mlp_bias);
        Ok(GatedMlp {
            gate_up: GateUp::Separate {
                gate: w.linear("gate_proj", h, m, bias)?,
                up: w.linear("up_proj", h, m, bias)?,
            },
            down: w.linear("down_proj", m, h, bias)?,
            activation: c.hidden_act,
        })
    }

    /// `down(act(gate(x)) · up(x))`.
    pub fn forward(&self, ops: &mut dyn Ops<B>, x: &B::Tensor) -> BackendResult<B::Tensor, B> {
        let hidden = match &self.gate_up {
            GateUp::Separate { gate, up } => ops.gated_linear(x, gate, up, self.activation)?,
            GateUp::Fused(gate_up) => {
                let both = ops.linear(x, gate_up)?;
                match &ops.split_last(&both, 2)?[..] {
                    [gate, up] => ops.gated(gate, up, self.activation)?,
                    _ => unreachable!("split into 2 gives two parts"),
                }
            }
        };
        ops.linear(&hidden, &self.down)
    }
}

/// The feed-forward half of a decoder layer.
pub enum FeedForward<B: Backend> {
    /// A gated MLP.
    Gated(GatedMlp<B>),
    /// A mixture of gated experts chosen per token by a router.
    Moe(SparseMoe<B>),
}

impl<B: Backend> FeedForward<B> {
    /// Applies the block to `x: [b, l, h]`.
    pub fn forward(&self, ops: &mut dyn Ops<B>, x: &B::Tensor) -> BackendResult<B::Tensor, B> {
        match self {
            FeedForward::Gated(mlp) => mlp.forward(ops, x),
            FeedForward::Moe(moe) => moe.forward(ops, x),
        }
    }
}
