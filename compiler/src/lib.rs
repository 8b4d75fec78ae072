//! `mlxcel-compiler`: turns a source model into a `.mlxb` bundle (issue \[3\]
//! builds it).
//!
//! [`ingest`] reads the source models (a GGUF file, a Hugging Face directory of
//! safetensors, an MLX-quantized directory) into one [`ingest::SourceModel`]
//! view that the rest of the pipeline walks tensor by tensor.

#![warn(missing_docs)]
// The one exception, memmap2's `Mmap::map`, is allowed in `ingest::mmap`.
#![deny(unsafe_code)]

pub mod compile;
pub mod cuda;
pub mod hub;
pub mod ingest;
