//! Scoped weight names (candle's `VarBuilder::pp`): a layer's constructor
//! receives the scope of its prefix and names its weights relative to it,
//! so full names fall out of the model's structure.

use std::fmt::Display;

use crate::backend::{Backend, BackendResult, Loader};
use crate::rope::RopeSpec;

/// The weights under one name prefix. `scope("self_attn").linear("q_proj", ..)`
/// takes `<prefix>.self_attn.q_proj.weight`.
pub struct Scope<'l, B: Backend> {
    loader: &'l dyn Loader<B>,
    prefix: String,
}

impl<B: Backend> Clone for Scope<'_, B> {
    fn clone(&self) -> Self {
        Scope { loader: self.loader, prefix: self.prefix.clone() }
    }
}

impl<'l, B: Backend> Scope<'l, B> {
    /// The scope of every weight (no prefix).
    pub fn root(loader: &'l dyn Loader<B>) -> Scope<'l, B> {
        Scope { loader, prefix: String::new() }
    }

    /// The scope of `name` inside this one.
    pub fn scope(&self, name: impl Display) -> Scope<'l, B> {
        Scope { loader: self.loader, prefix: self.path(name) }
    }

    /// The full name of `name` inside this scope.
    pub fn path(&self, name: impl Display) -> String {
        if self.prefix.is_empty() { name.to_string() } else { format!("{}.{name}", self.prefix) }
    }

    /// Whether the layer `name` has a weight (`<name>.weight`).
    pub fn has(&self, name: &str) -> bool {
        self.loader.has_weight(&self.path(name))
    }

    /// The linear map `name` from `inputs` to `outputs` features, with a
    /// bias when `bias`.
    pub fn linear(&self, name: &str, inputs: usize, outputs: usize, bias: bool) -> BackendResult<B::Linear, B> {
        self.loader.linear(&self.path(name), inputs, outputs, bias)
    }

    /// `count` matrices from `inputs` to `outputs` stacked as `name`.
    pub fn experts(&self, name: &str, count: usize, inputs: usize, outputs: usize) -> BackendResult<B::Experts, B> {
        self.loader.experts(&self.path(name), count, inputs, outputs)
    }

    /// The embedding table `name`, rows scaled by `scale` when looked up.
    pub fn embedding(&self, name: &str, vocab: usize, dim: usize, scale: f32) -> BackendResult<B::Embedding, B> {
        self.loader.embedding(&self.path(name), vocab, dim, scale)
    }

    /// The RMS norm `name` over `dim` features (gain `1 + w` with `offset`).
    pub fn rms_norm(&self, name: &str, dim: usize, eps: f32, offset: bool) -> BackendResult<B::Norm, B> {
        self.loader.rms_norm(&self.path(name), dim, eps, offset)
    }

    /// The rotary embedding `spec` describes (no weights; the backend's form).
    pub fn rope(&self, spec: &RopeSpec) -> BackendResult<B::Rope, B> {
        self.loader.rope(spec)
    }
}
