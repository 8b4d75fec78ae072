//! `mlxcel-models`: the networks of the architectures mlxcel supports,
//! written once and generic over the backend that runs them.
//!
//! An architecture is a short file (`llama.rs`, `gemma3.rs`, ...) that says
//! how its attention ([`attention::AttentionSpec`]), its feed-forward blocks
//! and its layers ([`decoder::DecoderSpec`]) differ from Llama's; every one
//! of them is a [`decoder::Decoder`]. The model code names weights through a
//! [`Scope`] (candle's `VarBuilder::pp`: names fall out of the structure) and
//! computes through the [`Ops`] of a [`Backend`]:
//!
//! - the runtime implements them on MLX (its fused CPU kernels and MLX's
//!   ops), running a step;
//! - the StableHLO emitter implements them by recording ops into a function,
//!   so the graph IREE compiles is the same network, not a second copy.
//!
//! Why a trait at the granularity of layers (a linear map, an RMS norm,
//! cached attention) rather than of elementwise ops: that is where the
//! backends differ. MLX's CPU path fuses a norm into the next product and
//! RoPE into the cache write; StableHLO spells each out for IREE to fuse its
//! own way. The model code says *what* is computed; each backend decides how.

pub mod attention;
pub mod backend;
pub mod decoder;
mod error;
pub mod feed_forward;
mod gemma3;
mod llama;
pub mod moe;
mod phi3;
mod qwen2;
mod qwen3;
mod qwen3_moe;
pub mod rope;
mod scope;

pub use backend::{Backend, Loader, Ops};
pub use decoder::Decoder;
pub use error::{Error, MAX_WINDOW, Result, check_window};
pub use scope::Scope;

use mlxcel_arch::{Architecture, ModelConfig};

/// The model `config` describes, its weights from `loader`.
pub fn build<B: Backend>(config: &ModelConfig, loader: &dyn Loader<B>) -> std::result::Result<Decoder<B>, B::Error> {
    let w = Scope::root(loader);
    match config.architecture {
        Architecture::Llama | Architecture::Mistral => llama::build(config, &w),
        Architecture::Qwen2 => qwen2::build(config, &w),
        Architecture::Qwen3 => qwen3::build(config, &w),
        Architecture::Qwen3Moe => qwen3_moe::build(config, &w),
        Architecture::Gemma3 => gemma3::build(config, &w),
        Architecture::Phi3 => phi3::build(config, &w),
    }
}
