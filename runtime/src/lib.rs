//! `mlxcel-runtime`: from a bundle to generated text.
//!
//! - [`models`]: the architectures (Llama family and Mistral, Qwen2, Qwen3,
//!   Qwen3-MoE, Gemma 3, Phi-3), whose code is `mlxcel_models`', on MLX:
//!   built from [`weights::Weights`] with the layers of [`nn`], run over the
//!   caches of [`kv_cache`];
//! - [`backend`]: the token-level seam ([`backend::Backend`]) that the
//!   generation loop and the server talk to, and its MLX implementation;
//! - [`sampler`], [`tokenizer`], [`chat`], [`generate`]: sampling, streaming
//!   detokenization, chat templates, and generation as tokens
//!   ([`generate::TokenGenerator`]) and as text ([`generate::TextStream`]);
//! - [`check`]: the whole-bundle check the compiler runs before renaming
//!   its output (what [`loader::load`] checks, without computing);
//! - [`constraint`]: grammars (JSON schemas, Lark) enforced on the output
//!   token by token with llguidance;
//! - [`engine`]: the model on a thread of its own behind a `Send + Sync`
//!   handle, batching requests continuously (what `mlxcel run` and the
//!   server drive);
//! - [`iree_backend`]: the second backend, the bundle's IREE module run by
//!   IREE's runtime (feature `iree`);
//! - [`gpu_kernels`]: MLX's CUDA kernels compiled ahead of time into the
//!   bundle, installed before the first GPU step.

pub mod backend;
pub mod chat;
pub mod check;
pub mod constraint;
pub mod engine;
mod error;
pub mod generate;
pub mod gpu_kernels;
pub mod iree_backend;
pub mod kv_cache;
pub mod loader;
pub mod models;
pub mod nn;
pub mod sampler;
pub mod tokenizer;
pub mod tool_grammar;
pub mod weights;

pub use error::{Error, Result};
