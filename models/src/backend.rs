//! The seam between the model code and what runs it: a [`Backend`] says how
//! tensors and weights are represented, a [`Loader`] makes weights from the
//! bundle's tensors, and [`Ops`] are the operations a forward pass is made of.
//!
//! Ops take `&mut self` because a forward pass has state besides its
//! tensors: the KV caches it reads and appends to (MLX), or the function it
//! records into (StableHLO). A model holds only weights and plain numbers,
//! so one built model serves any number of passes.

use mlxcel_arch::Activation;

use crate::decoder::Residual;
use crate::rope::RopeSpec;

/// How a backend represents a model.
pub trait Backend: Sized + 'static {
    /// Activations and the other values of a forward pass.
    type Tensor: Clone;
    /// A linear map: a weight matrix `[out, in]` (float or quantized) and
    /// an optional bias.
    type Linear;
    /// An RMS norm: its gain and epsilon.
    type Norm;
    /// A token embedding table `[vocab, dim]`, which doubles as the output
    /// projection of models with tied embeddings.
    type Embedding;
    /// A rotary position embedding.
    type Rope;
    /// Matrices stacked along a first axis (a mixture's experts,
    /// `[count, out, in]`).
    type Experts;
    /// The backend's errors; the model code's own convert into them.
    type Error: From<crate::Error>;
}

/// A backend's results.
pub type BackendResult<T, B> = std::result::Result<T, <B as Backend>::Error>;

/// Where a model's weights come from: the bundle's tensors by their full
/// names (`model.layers.0.self_attn.q_proj`), each made into what the
/// backend computes with. Model code reaches it through a [`crate::Scope`].
pub trait Loader<B: Backend> {
    /// Whether the layer `name` has a weight (`<name>.weight`).
    fn has_weight(&self, name: &str) -> bool;
    /// The linear map `name` from `inputs` to `outputs` features
    /// (`<name>.weight`, quantized or not), with `<name>.bias` when `bias`.
    fn linear(&self, name: &str, inputs: usize, outputs: usize, bias: bool) -> BackendResult<B::Linear, B>;
    /// `count` matrices from `inputs` to `outputs` features stacked as `name`.
    fn experts(&self, name: &str, count: usize, inputs: usize, outputs: usize) -> BackendResult<B::Experts, B>;
    /// The embedding table `name` of `vocab` rows of `dim`, rows scaled by
    /// `scale` when looked up.
    fn embedding(&self, name: &str, vocab: usize, dim: usize, scale: f32) -> BackendResult<B::Embedding, B>;
    /// The RMS norm `name` over `dim` features; with `offset` its stored
    /// gain is an offset from one (Gemma's `1 + w`).
    fn rms_norm(&self, name: &str, dim: usize, eps: f32, offset: bool) -> BackendResult<B::Norm, B>;
    /// The rotary embedding `spec` describes.
    fn rope(&self, spec: &RopeSpec) -> BackendResult<B::Rope, B>;
}

/// The operations of a forward pass. Shapes: `b` rows (sequences), `l`
/// positions each, `h` features; attention heads `[b, heads, l, head_dim]`.
pub trait Ops<B: Backend> {
    /// The embeddings `[b, l, dim]` of token ids `[b, l]`.
    fn embed(&mut self, table: &B::Embedding, ids: &B::Tensor) -> BackendResult<B::Tensor, B>;
    /// `x Eᵀ`: logits over the vocabulary through the embedding table.
    fn embedding_logits(&mut self, table: &B::Embedding, x: &B::Tensor) -> BackendResult<B::Tensor, B>;
    /// RMS normalisation over the last axis.
    fn rms_norm(&mut self, norm: &B::Norm, x: &B::Tensor) -> BackendResult<B::Tensor, B>;
    /// `x Wᵀ + bias` over the last axis.
    fn linear(&mut self, x: &B::Tensor, map: &B::Linear) -> BackendResult<B::Tensor, B>;
    /// `x [b, l, h]` through each map, each result split into its number of
    /// heads of `head_dim`: `[b, heads, l, head_dim]` each.
    fn linear_heads(
        &mut self,
        x: &B::Tensor,
        maps: &[(&B::Linear, usize)],
        head_dim: usize,
    ) -> BackendResult<Vec<B::Tensor>, B>;
    /// The last axis of `x [b, l, Σ heads·head_dim]` split into consecutive
    /// groups of `heads[i]` heads: `[b, heads[i], l, head_dim]` each.
    fn split_heads(&mut self, x: &B::Tensor, heads: &[usize], head_dim: usize) -> BackendResult<Vec<B::Tensor>, B>;
    /// The last axis of `x` split into `parts` equal parts.
    fn split_last(&mut self, x: &B::Tensor, parts: usize) -> BackendResult<Vec<B::Tensor>, B>;
    /// A residual connection: `x + y` as `how` says.
    fn residual(&mut self, x: &B::Tensor, y: &B::Tensor, how: Residual) -> BackendResult<B::Tensor, B>;
    /// `act(x Gᵀ) · (x Uᵀ)`: a gated MLP's hidden layer.
    fn gated_linear(
        &mut self,
        x: &B::Tensor,
        gate: &B::Linear,
        up: &B::Linear,
        act: Activation,
    ) -> BackendResult<B::Tensor, B>;
    /// `act(gate) · up`, elementwise.
    fn gated(&mut self, gate: &B::Tensor, up: &B::Tensor, act: Activation) -> BackendResult<B::Tensor, B>;
    /// Cached attention of layer `layer`: appends this pass's keys and values
    /// to each row's cache and attends the queries over the row's past and
    /// themselves (within the layer's window), queries and keys rotated by
    /// `rope` from each row's position, scores scaled by `scale`. Takes
    /// `q [b, heads, l, d]`, `k`, `v [b, kv_heads, l, d]`; returns
    /// `[b, l, heads·d]`, heads merged for the output projection.
    fn attend(
        &mut self,
        layer: usize,
        q: &B::Tensor,
        k: &B::Tensor,
        v: &B::Tensor,
        rope: &B::Rope,
        scale: f32,
    ) -> BackendResult<B::Tensor, B>;
    /// Softmax over the last axis (in f32 whatever the activations' type).
    fn softmax(&mut self, x: &B::Tensor) -> BackendResult<B::Tensor, B>;
    /// The `k` largest values along the last axis and their indices (in no
    /// particular order).
    fn top_k(&mut self, x: &B::Tensor, k: usize) -> BackendResult<(B::Tensor, B::Tensor), B>;
    /// `x / Σ x` along the last axis.
    fn normalize_sum(&mut self, x: &B::Tensor) -> BackendResult<B::Tensor, B>;
    /// A gated MLP per chosen expert (mlx-lm's `SwitchGLU`): each position of
    /// `x [b, l, h]` through each of its `chosen [b, l, k]` experts,
    /// `down_e(act(gate_e(x)) · up_e(x))`: `[b, l, k, h]`.
    fn switch_glu(
        &mut self,
        x: &B::Tensor,
        experts: [&B::Experts; 3],
        chosen: &B::Tensor,
        act: Activation,
    ) -> BackendResult<B::Tensor, B>;
    /// `Σ_k weights[.., k] · ys[.., k, :]`: `ys [b, l, k, h]`,
    /// `weights [b, l, k]` → `[b, l, h]` in the type of `ys`.
    fn weighted_sum(&mut self, ys: &B::Tensor, weights: &B::Tensor) -> BackendResult<B::Tensor, B>;
}
