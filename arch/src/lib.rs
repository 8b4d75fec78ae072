//! `mlxcel-arch`: what an architecture is, in one place.
//!
//! - [`table`]: every supported architecture as one row of [`table::TABLE`]:
//!   the name bundles and the runtime use, its aliases, the Hugging Face
//!   `model_type`s and class names, the GGUF `general.architecture` names and
//!   the quirks ingest must undo. Ingest, the compiler, surgery and the
//!   runtime all look architectures up here; nothing else matches names.
//! - [`config`]: the normalized model config. The compiler turns a source
//!   config (Hugging Face `config.json`, GGUF metadata) into a
//!   [`config::ModelConfig`] with every default applied and every value
//!   checked, and writes it into the bundle; the runtime and surgery
//!   deserialize it with serde and never read keys by hand.
//!
//! This crate sits below the compiler, surgery and the runtime (it depends on
//! none of them), so the one-way flow compiler → bundle → runtime holds.

pub mod config;
pub mod table;

pub use config::{Activation, ConfigError, LayerType, ModelConfig, MoeConfig, RopeScaling};
pub use table::{ArchInfo, Architecture, Quirks};
