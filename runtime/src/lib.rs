//! `mlxcel-runtime`: from a bundle to generated text.
//!
//! - [`models`]: the architectures (Llama family, Qwen2, Qwen3, Gemma 3,
//!   Phi-3), one file each, built from [`weights::Weights`] with the layers of
//!   [`nn`] and the caches of [`kv_cache`];
//! - [`backend`]: the token-level seam ([`backend::Backend`]) that the
//!   generation loop and the server talk to, and its MLX implementation;
//! - [`sampler`], [`tokenizer`], [`chat`], [`generate`]: sampling, streaming
//!   detokenization, chat templates and the generation loop.

pub mod backend;
pub mod chat;
mod error;
pub mod generate;
pub mod kv_cache;
pub mod loader;
pub mod models;
pub mod nn;
pub mod sampler;
pub mod tokenizer;
pub mod weights;

pub use error::{Error, Result};
