//! Ingest: read a source model into one [`SourceModel`] view.
//!
//! Three sources are supported, told apart by [`SourceModel::open`]:
//! - a GGUF file (`*.gguf`, or any file starting with the `GGUF` magic);
//! - a Hugging Face directory (`config.json`, safetensors, `tokenizer.json`);
//! - an MLX-quantized directory as mlx-lm writes it (`quantization` in
//!   `config.json`, `weight`/`scales`/`biases` per quantized layer).
//!
//! Opening reads the configuration first and refuses an unsupported
//! architecture before any weight is touched; then it lists the tensors
//! (canonical Hugging Face names, logical shapes checked against the config)
//! without reading their data. The pipeline then loads one tensor at a time:
//! [`SourceModel::load`] gives the data as stored where that is lossless (an
//! MLX affine triple for GGUF Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K and MLX
//! layers, floats otherwise); [`SourceModel::load_float`] always gives floats.
//!
//! ```no_run
//! use mlxcel_compiler::ingest::{SourceModel, TensorData};
//! let model = SourceModel::open("SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! println!("{} {}", model.config().architecture, model.config().to_json());
//! for info in model.tensors() {
//!     match model.load(info)? {
//!         TensorData::Affine(q) => println!("{} {:?} {}-bit", info.name, q.shape, q.bits),
//!         TensorData::Float(f) => println!("{} {:?} {:?}", info.name, f.shape, f.dtype),
//!     }
//! }
//! # Ok::<(), mlxcel_compiler::ingest::IngestError>(())
//! ```

pub mod error;
pub mod export;
pub mod gguf;
mod hf;
pub(crate) mod mmap;
pub mod shapes;
pub mod tensor;
mod token_ids;

use std::io::Read;
use std::path::{Path, PathBuf};

pub use error::{IngestError, Result};
pub use hf::read_text;
pub use mlxcel_arch::{Architecture, ModelConfig};
pub use tensor::{AffineTensor, FloatDtype, FloatTensor, Storage, TensorData, TensorInfo};

use gguf::GgufSource;
use hf::SafetensorsSource;

/// Row blocks of one tensor as floats (see [`SourceModel::float_chunks`]).
pub struct FloatChunks<'a> {
    inner: ChunkSource<'a>,
}

enum ChunkSource<'a> {
    /// One block, not yet taken.
    Whole(Option<FloatTensor<'a>>),
    /// Consecutive parts of one tensor, in order (a mixture's experts stored
    /// one tensor each, borrowed from the map).
    Parts(std::vec::IntoIter<FloatTensor<'a>>),
    /// GGUF blocks, dequantized `rows_per_chunk` rows at a time.
    Blocks {
        raw: std::borrow::Cow<'a, [u8]>,
        ty: gguf::quant::GgmlType,
        row_bytes: usize,
        rows: usize,
        rows_per_chunk: usize,
        next_row: usize,
        /// The shape of one row (the last dimension).
        row_shape: Vec<usize>,
        /// For errors.
        path: PathBuf,
        name: String,
        offset: u64,
    },
}

impl<'a> FloatChunks<'a> {
    pub(crate) fn whole(t: FloatTensor<'a>) -> FloatChunks<'a> {
        FloatChunks { inner: ChunkSource::Whole(Some(t)) }
    }

    pub(crate) fn parts(parts: Vec<FloatTensor<'a>>) -> FloatChunks<'a> {
        FloatChunks { inner: ChunkSource::Parts(parts.into_iter()) }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn blocks(
        raw: std::borrow::Cow<'a, [u8]>,
        ty: gguf::quant::GgmlType,
        shape: &[usize],
        max_chunk_bytes: usize,
        path: &Path,
        name: &str,
        offset: u64,
    ) -> FloatChunks<'a> {
        // Rows run along the last axis: a stack [experts, out, in] is
        // experts × out rows of `in`, blocked like one tall matrix.
        let (leading, last) = shape.split_at(shape.len().saturating_sub(1));
        let rows = leading.iter().product::<usize>().max(1);
        let row_shape = last.to_vec();
        let row_elems: usize = row_shape.iter().product::<usize>().max(1);
        let rows_per_chunk = (max_chunk_bytes / (4 * row_elems)).clamp(1, rows);
        FloatChunks {
            inner: ChunkSource::Blocks {
                row_bytes: raw.len() / rows,
                raw,
                ty,
                rows,
                rows_per_chunk,
                next_row: 0,
                row_shape,
                path: path.to_path_buf(),
                name: name.to_string(),
                offset,
            },
        }
    }
}

impl<'a> Iterator for FloatChunks<'a> {
    type Item = Result<FloatTensor<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        match &mut self.inner {
            ChunkSource::Whole(t) => t.take().map(Ok),
            ChunkSource::Parts(parts) => parts.next().map(Ok),
            ChunkSource::Blocks {
                raw,
                ty,
                row_bytes,
                rows,
                rows_per_chunk,
                next_row,
                row_shape,
                path,
                name,
                offset,
            } => {
                if *next_row >= *rows {
                    return None;
                }
                let end = (*next_row + *rows_per_chunk).min(*rows);
                let bytes = &raw[*next_row * *row_bytes..end * *row_bytes];
                let mut shape = vec![end - *next_row];
                shape.extend_from_slice(row_shape);
                *next_row = end;
                Some(gguf::quant::dequantize_to_bytes(*ty, bytes).map_or_else(
                    || {
                        Err(IngestError::tensor(
                            path,
                            name,
                            *offset,
                            format!("ggml type {ty} cannot be dequantized in row blocks"),
                        ))
                    },
                    |data| Ok(FloatTensor { dtype: FloatDtype::F32, shape, data: std::borrow::Cow::Owned(data) }),
                ))
            }
        }
    }
}

/// The kind of source a model came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceFormat {
    /// A GGUF file.
    Gguf,
    /// A Hugging Face directory of float safetensors.
    HuggingFace,
    /// An MLX-quantized directory (mlx-lm's output).
    MlxQuantized,
}

/// The tokenizer of a source model, in Hugging Face's formats.
#[derive(Clone, Debug)]
pub struct TokenizerAssets {
    /// `tokenizer.json` text (for GGUF: built from the metadata).
    pub tokenizer_json: String,
    /// The Jinja chat template, if the source has one.
    pub chat_template: Option<String>,
    /// `tokenizer_config.json` (for GGUF: `add_bos_token`, `add_eos_token`,
    /// the special tokens' texts and the chat template).
    pub tokenizer_config: serde_json::Value,
}

/// Generation defaults of a source model.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationDefaults {
    /// The beginning-of-sequence token.
    pub bos_token_id: Option<u32>,
    /// The tokens that end generation (EOS first; for GGUF also EOT and the
    /// control tokens llama.cpp treats as end of generation).
    pub eos_token_ids: Vec<u32>,
    /// The padding token.
    pub pad_token_id: Option<u32>,
    /// Whether encoding a prompt adds BOS.
    pub add_bos_token: bool,
    /// Whether encoding a prompt adds EOS.
    pub add_eos_token: bool,
    /// `generation_config.json` as the source has it (sampling defaults
    /// included), or synthesized from the ids above.
    pub generation_config: serde_json::Value,
}

enum Inner {
    Gguf(Box<GgufSource>),
    Safetensors(Box<SafetensorsSource>),
}

/// A source model opened for compilation: configuration, tokenizer,
/// generation defaults, and tensors loaded one at a time from memory maps.
pub struct SourceModel {
    path: PathBuf,
    format: SourceFormat,
    inner: Inner,
}

impl std::fmt::Debug for SourceModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceModel")
            .field("path", &self.path)
            .field("format", &self.format)
            .field("architecture", &self.config().architecture)
            .field("tensors", &self.tensors().len())
            .finish()
    }
}

fn is_gguf(path: &Path) -> Result<bool> {
    if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
        return Ok(true);
    }
    let mut magic = [0u8; 4];
    let mut f = std::fs::File::open(path).map_err(|e| IngestError::io(path, e))?;
    Ok(f.read_exact(&mut magic).is_ok() && magic == gguf::reader::GGUF_MAGIC)
}

impl SourceModel {
    /// Opens a GGUF file, a Hugging Face directory or an MLX-quantized
    /// directory. Reads the configuration and refuses an unsupported
    /// architecture before any weight; then lists the tensors and checks their
    /// shapes against the configuration. No tensor data is read.
    pub fn open(path: impl AsRef<Path>) -> Result<SourceModel> {
        let path = path.as_ref();
        let meta = std::fs::metadata(path).map_err(|e| IngestError::io(path, e))?;
        let (format, inner) = if meta.is_dir() {
            let s = SafetensorsSource::open(path)?;
            let format = if s.mlx_quantized { SourceFormat::MlxQuantized } else { SourceFormat::HuggingFace };
            (format, Inner::Safetensors(Box::new(s)))
        } else if is_gguf(path)? {
            (SourceFormat::Gguf, Inner::Gguf(Box::new(GgufSource::open(path)?)))
        } else {
            return Err(IngestError::corrupt(
                path,
                0,
                "not a model: expected a GGUF file or a directory with config.json and safetensors",
            ));
        };
        let mut model = SourceModel { path: path.to_path_buf(), format, inner };
        model.reconcile_tied_embeddings()?;
        model.check_shapes()?;
        Ok(model)
    }

    /// Makes `tie_word_embeddings` say what the tensors say: a model with an
    /// `lm_head.weight` has its own output projection whatever its config
    /// claims; one without must tie it to the embedding table, and a config
    /// that says otherwise is refused (the runtime would have no output
    /// projection to load).
    fn reconcile_tied_embeddings(&mut self) -> Result<()> {
        let has_head = self.tensor("lm_head.weight").is_some();
        let config_path = self.config_path();
        let config = match &mut self.inner {
            Inner::Gguf(g) => &mut g.config,
            Inner::Safetensors(s) => &mut s.config,
        };
        if has_head {
            config.tie_word_embeddings = false;
        } else if !config.tie_word_embeddings {
            return Err(IngestError::invalid_config(
                &config_path,
                mlxcel_arch::ConfigError::Invalid {
                    key: "tie_word_embeddings".into(),
                    message: "is false, but the model has no lm_head.weight (no output projection of its own)".into(),
                },
            ));
        }
        Ok(())
    }

    fn check_shapes(&self) -> Result<()> {
        let config = self.config();
        for t in self.tensors() {
            shapes::check_tensor(config, &t.name, &t.shape).map_err(|expected| IngestError::ShapeMismatch {
                path: t.file.clone(),
                tensor: t.name.clone(),
                found: t.shape.clone(),
                expected,
            })?;
        }
        Ok(())
    }

    /// The path the model was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The kind of source.
    pub fn format(&self) -> SourceFormat {
        self.format
    }

    /// The normalized configuration: every default applied, every value
    /// checked, `tie_word_embeddings` as the tensors have it.
    pub fn config(&self) -> &ModelConfig {
        match &self.inner {
            Inner::Gguf(g) => &g.config,
            Inner::Safetensors(s) => &s.config,
        }
    }

    /// The configuration as a Hugging Face `config.json` spells it: the
    /// directory's own, or for GGUF the one its metadata describes
    /// (`architectures`, `model_type`, token ids, ...).
    pub fn source_config(&self) -> &serde_json::Value {
        match &self.inner {
            Inner::Gguf(g) => &g.hf_config,
            Inner::Safetensors(s) => &s.hf_config,
        }
    }

    /// The file the configuration comes from (`config.json`, or the GGUF).
    pub fn config_path(&self) -> PathBuf {
        match &self.inner {
            Inner::Gguf(_) => self.path.clone(),
            Inner::Safetensors(_) => self.path.join("config.json"),
        }
    }

    /// The tensors, in file order, with canonical Hugging Face names.
    pub fn tensors(&self) -> &[TensorInfo] {
        match &self.inner {
            Inner::Gguf(g) => &g.tensors,
            Inner::Safetensors(s) => &s.tensors,
        }
    }

    /// The tensor with canonical name `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors().iter().find(|t| t.name == name)
    }

    /// Loads one tensor as stored where that is lossless: an MLX affine
    /// triple for GGUF Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K matrices (f32 scales
    /// and biases, group 32) and for MLX-quantized layers; floats otherwise
    /// (GGUF Q2_K/Q3_K/Q6_K dequantized to f32). Source-format transforms
    /// (llama.cpp's q/k permutation, Gemma's norm offset) are undone.
    pub fn load(&self, info: &TensorInfo) -> Result<TensorData<'_>> {
        match &self.inner {
            Inner::Gguf(g) => g.load(info),
            Inner::Safetensors(s) => s.load(info),
        }
    }

    /// Loads one tensor as floats: as stored for float tensors, f32 for GGUF
    /// quantized types, the scales' dtype for MLX-quantized layers.
    pub fn load_float(&self, info: &TensorInfo) -> Result<FloatTensor<'_>> {
        match &self.inner {
            Inner::Gguf(g) => g.load_float(info),
            Inner::Safetensors(s) => s.load_float(info),
        }
    }

    /// A tensor as floats in blocks of whole rows (along the last axis) of
    /// about `max_chunk_bytes` of f32 each, so that the compiler never holds
    /// a large dequantized tensor at once. GGUF block types are dequantized
    /// one row block at a time; experts stored one tensor each come expert
    /// by expert, borrowed from the map; other sources (already floats in a
    /// memory map) come as one block.
    pub fn float_chunks(&self, info: &TensorInfo, max_chunk_bytes: usize) -> Result<FloatChunks<'_>> {
        match &self.inner {
            Inner::Gguf(g) => g.float_chunks(info, max_chunk_bytes),
            Inner::Safetensors(s) => s.float_chunks(info),
        }
    }

    /// The tokenizer (for GGUF this builds `tokenizer.json` from the
    /// metadata: call it once).
    pub fn tokenizer(&self) -> Result<TokenizerAssets> {
        let assets = match &self.inner {
            Inner::Gguf(g) => g.tokenizer()?,
            Inner::Safetensors(s) => s.tokenizer()?,
        };
        token_ids::check_tokenizer(&self.file_of("tokenizer.json"), &assets.tokenizer_json, self.config().vocab_size)?;
        Ok(assets)
    }

    /// The file a part of the source comes from: the GGUF itself, or the
    /// directory's file `name`.
    fn file_of(&self, name: &str) -> PathBuf {
        match self.inner {
            Inner::Gguf(_) => self.path.clone(),
            Inner::Safetensors(_) => self.path.join(name),
        }
    }

    /// The generation defaults.
    pub fn generation(&self) -> Result<GenerationDefaults> {
        let g = match &self.inner {
            Inner::Gguf(g) => g.generation(),
            Inner::Safetensors(s) => s.generation()?,
        };
        let file = self.file_of("generation_config.json");
        token_ids::check_special_ids(&file, g.bos_token_id, &g.eos_token_ids, self.config().vocab_size)?;
        Ok(g)
    }

    /// The files the model was read from (for provenance hashes).
    pub fn source_files(&self) -> Vec<PathBuf> {
        match &self.inner {
            Inner::Gguf(_) => vec![self.path.clone()],
            Inner::Safetensors(s) => s.source_files(),
        }
    }

    /// The GGUF metadata, for a GGUF source.
    pub fn gguf(&self) -> Option<&gguf::reader::GgufFile> {
        match &self.inner {
            Inner::Gguf(g) => Some(&g.file),
            Inner::Safetensors(_) => None,
        }
    }
}
