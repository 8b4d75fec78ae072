//! `mlxcel-compiler`: turns a source model into a `.mlxb` bundle (issue [3]
//! builds it).
//!
//! [`ingest`] reads the source models (a GGUF file, a Hugging Face directory of
//! safetensors, an MLX-quantized directory) into one [`ingest::SourceModel`]
//! view that the rest of the pipeline walks tensor by tensor.

pub mod ingest;
