//! A sparse mixture of gated experts (Qwen3-MoE; mlx-lm's
//! `Qwen3MoeSparseMoeBlock` and `SwitchGLU`): a router scores every expert,
//! each token goes through its `top_k` best SwiGLU experts, and their outputs
//! are summed with the routing weights.
//!
//! The experts are stacked tensors `[experts, out, in]` (float or quantized);
//! MLX's `gather_qmm`/`gather_mm` multiply each token by its chosen experts'
//! matrices without materialising anything per expert.

use mlxcel_arch::{Activation, ModelConfig};
use mlxcel_mlx::fast;
use mlxcel_mlx::{Array, Linear, Weight};

use crate::error::{Error, Result};
use crate::nn::gate_activation;
use crate::weights::Scope;

/// One mixture-of-experts feed-forward block.
pub struct SparseMoe {
    /// Scores the experts: `[experts, hidden]`.
    router: Linear,
    /// The experts' gate, up and down projections, stacked.
    gate: Weight,
    up: Weight,
    down: Weight,
    experts: i32,
    top_k: i32,
    norm_topk_prob: bool,
    activation: Activation,
}

impl SparseMoe {
    /// The block whose weights are under `w` (`model.layers.N.mlp`: the
    /// router `gate`, the experts `switch_mlp.{gate,up,down}_proj`).
    pub fn new(w: &Scope<'_>, c: &ModelConfig) -> Result<SparseMoe> {
        let moe =
            c.moe.as_ref().ok_or_else(|| Error::Config("a mixture-of-experts layer needs the moe config".into()))?;
        let (hidden, inner, experts) = (c.hidden_size as i32, moe.moe_intermediate_size as i32, moe.num_experts as i32);
        let switch = w.scope("switch_mlp");
        Ok(SparseMoe {
            router: w.linear("gate", hidden, experts, false)?,
            gate: switch.stacked("gate_proj", experts, hidden, inner)?,
            up: switch.stacked("up_proj", experts, hidden, inner)?,
            down: switch.stacked("down_proj", experts, inner, hidden)?,
            experts,
            top_k: moe.num_experts_per_tok as i32,
            norm_topk_prob: moe.norm_topk_prob,
            activation: c.hidden_act,
        })
    }

    /// Applies the block to `x: [batch, seq, hidden]`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let s = x.shape();
        let (b, l) = (s[0], s[1]);
        // Routing weights over all experts, then the top k of each token.
        let scores = fast::linear(x, &self.router)?.softmax(&[-1], true)?;
        let k = self.top_k;
        let chosen = scores.argpartition(self.experts - k, -1)?.slice(
            &[0, 0, self.experts - k],
            &[b, l, self.experts],
            &[1, 1, 1],
        )?;
        let mut weights = scores.take_along_axis(&chosen, -1)?;
        if self.norm_topk_prob {
            weights = weights.divide(&weights.sum(&[-1], true)?)?;
        }
        // [b, l, 1, 1, hidden] against each token's k experts: [b, l, k, 1, out].
        let x = x.expand_dims(&[-2, -3])?;
        let up = expert_products(&x, &self.up, &chosen)?;
        let gate = expert_products(&x, &self.gate, &chosen)?;
        let hidden = fast::gated_activation(gate_activation(self.activation), &gate, &up)?;
        let y = expert_products(&hidden, &self.down, &chosen)?.squeeze(&[-2])?;
        // Σ_k weight_k · expert_k(x): [b, l, hidden].
        Ok(y.multiply(&weights.expand_dims(&[-1])?)?.sum(&[-2], false)?.astype(y.dtype())?)
    }
}

/// `x @ W_eᵀ` for each token's chosen experts `e` (`chosen: [b, l, k]`).
fn expert_products(x: &Array, w: &Weight, chosen: &Array) -> Result<Array> {
    Ok(match w {
        Weight::Quantized(q) => q.gather_matmul(x, None, Some(chosen), true, false)?,
        Weight::Dense(d) => x.gather_mm(&d.swapaxes(-1, -2)?, None, Some(chosen), false)?,
    })
}
