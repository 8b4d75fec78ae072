//! A sparse mixture of gated experts (Qwen3-MoE; mlx-lm's
//! `Qwen3MoeSparseMoeBlock` and `SwitchGLU`): a router scores every expert,
//! each token goes through its `top_k` best SwiGLU experts, and their outputs
//! are summed with the routing weights.

use mlxcel_arch::{Activation, ModelConfig};

use crate::backend::{Backend, BackendResult, Ops};
use crate::error::Error;
use crate::scope::Scope;

/// One mixture-of-experts feed-forward block.
pub struct SparseMoe<B: Backend> {
    /// Scores the experts: `[experts, hidden]`.
    router: B::Linear,
    /// The experts' gate, up and down projections, stacked.
    gate: B::Experts,
    up: B::Experts,
    down: B::Experts,
    top_k: usize,
    norm_topk_prob: bool,
    activation: Activation,
}

impl<B: Backend> SparseMoe<B> {
    /// The block whose weights are under `w` (`model.layers.N.mlp`: the
    /// router `gate`, the experts `switch_mlp.{gate,up,down}_proj`).
    pub fn new(w: &Scope<'_, B>, c: &ModelConfig) -> BackendResult<SparseMoe<B>, B> {
        let moe =
            c.moe.as_ref().ok_or_else(|| Error::Config("a mixture-of-experts layer needs the moe config".into()))?;
        let (hidden, inner, experts) = (c.hidden_size, moe.moe_intermediate_size, moe.num_experts);
        let switch = w.scope("switch_mlp");
        Ok(SparseMoe {
            router: w.linear("gate", hidden, experts, false)?,
            gate: switch.experts("gate_proj", experts, hidden, inner)?,
            up: switch.experts("up_proj", experts, hidden, inner)?,
            down: switch.experts("down_proj", experts, inner, hidden)?,
            top_k: moe.num_experts_per_tok,
            norm_topk_prob: moe.norm_topk_prob,
            activation: c.hidden_act,
        })
    }

    /// Applies the block to `x: [b, l, hidden]`.
    pub fn forward(&self, ops: &mut dyn Ops<B>, x: &B::Tensor) -> BackendResult<B::Tensor, B> {
        // Routing weights over all experts, then the top k of each token.
        let router_logits = ops.linear(x, &self.router)?;
        let scores = ops.softmax(&router_logits)?;
        let (mut weights, chosen) = ops.top_k(&scores, self.top_k)?;
        if self.norm_topk_prob {
            weights = ops.normalize_sum(&weights)?;
        }
        // Each token through its k experts, summed with their weights.
        let ys = ops.switch_glu(x, [&self.gate, &self.up, &self.down], &chosen, self.activation)?;
        ops.weighted_sum(&ys, &weights)
    }
}
