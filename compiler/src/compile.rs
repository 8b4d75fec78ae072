//! The compile pipeline: walk a [`SourceModel`] tensor by tensor, decide each
//! tensor's stored form (kept, transcoded, converted or quantized), and stream
//! it into a bundle together with the tokenizer, chat template, generation
//! defaults and provenance.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant};

use std::borrow::Cow;

use mlxcel_bundle::{
    BundleWriter, Dtype as BundleDtype, ModelInfo, Provenance, Quantization, SectionSpec, SourceFile, SurgeryOperation,
    SurgeryRecord, TensorSpec, WrittenBundle, kinds,
};
use mlxcel_mlx::{Array, Dtype, QuantMode};
use mlxcel_surgery::{ModelTensor, ModelView, OutputTensor, Surgery};
use serde_json::{Value, json};

use crate::ingest::gguf::quant::GgmlType;
use crate::ingest::{
    AffineTensor, Architecture, FloatDtype, FloatTensor, SourceModel, Storage, TensorData, TensorInfo,
};

/// Errors of the compile pipeline.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// Reading the source model failed.
    #[error(transparent)]
    Ingest(#[from] crate::ingest::IngestError),
    /// Writing the bundle failed.
    #[error("writing the bundle: {0}")]
    Bundle(#[from] mlxcel_bundle::BundleError),
    /// An MLX operation (quantization) failed on a tensor.
    #[error("tensor {tensor}: {source}")]
    Mlx {
        /// The tensor being processed.
        tensor: String,
        /// MLX's error.
        source: mlxcel_mlx::Error,
    },
    /// The options cannot be applied to this model.
    #[error("{0}")]
    Options(String),
    /// The surgery is invalid for this model, or failed.
    #[error(transparent)]
    Surgery(#[from] mlxcel_surgery::SurgeryError),
    /// Reading a source file for its digest failed.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// The compile pipeline's result type.
pub type Result<T> = std::result::Result<T, CompileError>;

/// What `--quantize` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantizeTarget {
    /// Keep each tensor as close to its source as the bundle allows: float
    /// stays float, GGUF blocks that are affine transcode without loss, other
    /// GGUF blocks are requantized at the nearest MLX bit width.
    Auto,
    /// Every weight as float (dequantized sources in f32).
    None,
    /// Every float tensor as bfloat16.
    Bf16,
    /// Every float tensor as float16.
    F16,
    /// Matrices quantized affinely at this many bits (2, 3, 4, 5, 6 or 8).
    Affine(u32),
}

impl FromStr for QuantizeTarget {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Ok(match s {
            "auto" => QuantizeTarget::Auto,
            "none" => QuantizeTarget::None,
            "bf16" => QuantizeTarget::Bf16,
            "f16" => QuantizeTarget::F16,
            "q8" => QuantizeTarget::Affine(8),
            "q6" => QuantizeTarget::Affine(6),
            "q5" => QuantizeTarget::Affine(5),
            "q4" => QuantizeTarget::Affine(4),
            "q3" => QuantizeTarget::Affine(3),
            "q2" => QuantizeTarget::Affine(2),
            other => {
                return Err(format!(
                    "unknown quantization {other:?}: use auto, none, bf16, f16, q8, q6, q5, q4, q3 or q2"
                ));
            }
        })
    }
}

impl fmt::Display for QuantizeTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuantizeTarget::Auto => f.write_str("auto"),
            QuantizeTarget::None => f.write_str("none"),
            QuantizeTarget::Bf16 => f.write_str("bf16"),
            QuantizeTarget::F16 => f.write_str("f16"),
            QuantizeTarget::Affine(b) => write!(f, "q{b}"),
        }
    }
}

/// How to compile.
#[derive(Clone, Debug)]
pub struct CompileOptions {
    /// The quantization of weight matrices.
    pub quantize: QuantizeTarget,
    /// Inputs per quantization group (32, 64 or 128).
    pub group_size: u32,
    /// Keep GGUF blocks that are affine (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K,
    /// Q5_K) as they are even when `quantize` names another width.
    pub keep_source_quant: bool,
    /// Bits of the embedding table and output projection when quantizing (by
    /// default those of `quantize`).
    pub embedding_bits: Option<u32>,
    /// Measure each quantized tensor's error against its source values.
    pub report: bool,
    /// The model name recorded in the bundle.
    pub name: Option<String>,
    /// A chat template (Jinja source) replacing the source's.
    pub chat_template: Option<String>,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            quantize: QuantizeTarget::Auto,
            group_size: 64,
            keep_source_quant: false,
            embedding_bits: None,
            report: false,
            name: None,
            chat_template: None,
        }
    }
}

impl CompileOptions {
    fn validate(&self) -> Result<()> {
        if ![32, 64, 128].contains(&self.group_size) {
            return Err(CompileError::Options(format!(
                "--group-size {} is not supported: use 32, 64 or 128",
                self.group_size
            )));
        }
        for bits in [self.embedding_bits, if let QuantizeTarget::Affine(b) = self.quantize { Some(b) } else { None }]
            .into_iter()
            .flatten()
        {
            if ![2, 3, 4, 5, 6, 8].contains(&bits) {
                return Err(CompileError::Options(format!(
                    "{bits}-bit quantization is not supported: use 2, 3, 4, 5, 6 or 8"
                )));
            }
        }
        if self.embedding_bits.is_some() && !matches!(self.quantize, QuantizeTarget::Affine(_)) {
            return Err(CompileError::Options("--embedding-bits needs --quantize q2..q8".into()));
        }
        Ok(())
    }

    fn to_json(&self) -> Value {
        json!({
            "quantize": self.quantize.to_string(),
            "group_size": self.group_size,
            "keep_source_quant": self.keep_source_quant,
            "embedding_bits": self.embedding_bits,
            "chat_template_given": self.chat_template.is_some(),
        })
    }
}

/// The stored form chosen for one tensor.
#[derive(Clone, Debug, PartialEq)]
pub enum TensorPlan {
    /// Floats in this dtype.
    Float(FloatDtype),
    /// Affine quantization through MLX.
    Quantize {
        /// Bits per code.
        bits: u32,
        /// Inputs per group.
        group_size: u32,
    },
    /// The source's own affine blocks, without loss.
    KeepAffine,
}

impl fmt::Display for TensorPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TensorPlan::Float(d) => write!(f, "{}", d.name().to_lowercase()),
            TensorPlan::Quantize { bits, group_size } => write!(f, "q{bits} g{group_size}"),
            TensorPlan::KeepAffine => f.write_str("kept"),
        }
    }
}

fn is_embedding_or_head(name: &str) -> bool {
    name == "model.embed_tokens.weight" || name == "lm_head.weight"
}

/// The form a tensor takes under `options`.
pub fn plan(info: &TensorInfo, options: &CompileOptions) -> TensorPlan {
    let matrix = info.shape.len() == 2 && info.name.ends_with(".weight") && !info.name.contains("norm");
    let source_float = match &info.storage {
        Storage::Float(d) => Some(*d),
        Storage::Gguf(GgmlType::F32) => Some(FloatDtype::F32),
        Storage::Gguf(GgmlType::F16) => Some(FloatDtype::F16),
        Storage::Gguf(GgmlType::BF16) => Some(FloatDtype::BF16),
        _ => None,
    };
    let lossless = info.lossless_affine();
    // Vectors (norm gains, biases) and other small tensors stay float.
    if !matrix {
        return match options.quantize {
            QuantizeTarget::Bf16 => TensorPlan::Float(FloatDtype::BF16),
            QuantizeTarget::F16 => TensorPlan::Float(FloatDtype::F16),
            // Norm gains and biases are tiny: f32 whatever the source.
            _ => TensorPlan::Float(FloatDtype::F32),
        };
    }
    if lossless.is_some() && (options.keep_source_quant || options.quantize == QuantizeTarget::Auto) {
        return TensorPlan::KeepAffine;
    }
    match options.quantize {
        QuantizeTarget::Auto => match (source_float, &info.storage) {
            (Some(d), _) => TensorPlan::Float(d),
            // Blocks with no lossless affine form: the nearest MLX width.
            (None, Storage::Gguf(t)) => TensorPlan::Quantize { bits: nearest_bits(*t), group_size: 32 },
            (None, _) => TensorPlan::Float(FloatDtype::F32),
        },
        QuantizeTarget::None => TensorPlan::Float(source_float.unwrap_or(FloatDtype::F32)),
        QuantizeTarget::Bf16 => TensorPlan::Float(FloatDtype::BF16),
        QuantizeTarget::F16 => TensorPlan::Float(FloatDtype::F16),
        QuantizeTarget::Affine(bits) => {
            let bits = if is_embedding_or_head(&info.name) { options.embedding_bits.unwrap_or(bits) } else { bits };
            TensorPlan::Quantize { bits, group_size: options.group_size }
        }
    }
}

/// The MLX bit width closest to a GGUF block type without a lossless form.
fn nearest_bits(t: GgmlType) -> u32 {
    use GgmlType::*;
    match t {
        Q2_K | IQ2_XXS | IQ2_XS | IQ2_S | IQ1_S | IQ1_M | TQ1_0 => 2,
        Q3_K | IQ3_XXS | IQ3_S => 3,
        IQ4_NL | IQ4_XS => 4,
        Q6_K => 6,
        _ => 8,
    }
}

/// What happened to one tensor.
#[derive(Clone, Debug)]
pub struct TensorReport {
    /// Canonical name.
    pub name: String,
    /// How it was stored.
    pub plan: TensorPlan,
    /// How it was stored in the source (`F32`, `Q4_1`, `affine q4 g64`, ...).
    pub source: String,
    /// Bytes written (weight, scales and biases together).
    pub bytes: u64,
    /// Relative RMS error of the stored values against the source values
    /// (with `report`, for quantized tensors; 0 for lossless ones).
    pub rel_rms_error: Option<f64>,
}

/// The outcome of [`compile`].
#[derive(Debug)]
pub struct CompileReport {
    /// The bundle written.
    pub written: WrittenBundle,
    /// What became of the tokenizer.
    pub tokenizer: TokenizerReport,
    /// One entry per source tensor, in source order.
    pub tensors: Vec<TensorReport>,
    /// Wall time.
    pub elapsed: Duration,
}

/// Whether the bundle carries a compiled tokenizer beside `tokenizer.json`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenizerReport {
    /// Compiled and checked against the `tokenizers` library.
    Compiled {
        /// Bytes of the section.
        bytes: usize,
    },
    /// Only `tokenizer.json`: the runtime parses it with `tokenizers` at load.
    JsonOnly {
        /// Why it was not compiled.
        reason: String,
    },
}

impl fmt::Display for TokenizerReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenizerReport::Compiled { bytes } => {
                write!(f, "compiled ({:.1} MB, token-exact with tokenizer.json)", *bytes as f64 / 1e6)
            }
            TokenizerReport::JsonOnly { reason } => write!(f, "tokenizer.json only ({reason})"),
        }
    }
}

/// Progress of a compile, one call per tensor.
pub struct Progress<'a> {
    /// The tensor about to be processed.
    pub tensor: &'a str,
    /// Its source bytes.
    pub source_bytes: u64,
}

/// The chat template a model family uses, for sources that ship none (the
/// Gemma 3 GGUFs carry no `tokenizer.chat_template`): Google's template for
/// Gemma 3, as published with the Hugging Face checkpoints.
pub fn builtin_chat_template(a: Architecture) -> Option<&'static str> {
    match a {
        Architecture::Gemma3 => Some(include_str!("../templates/gemma3.jinja")),
        _ => None,
    }
}

/// The default model name: the source file's stem or directory name.
fn default_name(path: &Path) -> String {
    let p = if path.is_dir() { path.file_name() } else { path.file_stem() };
    p.map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
}

/// blake3 of a file, streamed.
fn file_digest(path: &Path) -> Result<(u64, String)> {
    let io = |source| CompileError::Io { path: path.to_path_buf(), source };
    let mut f = std::fs::File::open(path).map_err(io)?;
    let mut hasher = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        size += n as u64;
        hasher.update(&buf[..n]);
    }
    Ok((size, format!("blake3:{}", hasher.finalize().to_hex())))
}

fn bundle_dtype(d: FloatDtype) -> BundleDtype {
    match d {
        FloatDtype::F32 => BundleDtype::F32,
        FloatDtype::F16 => BundleDtype::F16,
        FloatDtype::BF16 => BundleDtype::Bf16,
    }
}

fn shape_u64(shape: &[usize]) -> Vec<u64> {
    shape.iter().map(|&d| d as u64).collect()
}

/// Converts float bytes between dtypes (one output allocation).
fn convert_float(t: &FloatTensor<'_>, to: FloatDtype) -> Vec<u8> {
    if t.dtype == to {
        return t.data.to_vec();
    }
    let values = t.data.chunks_exact(t.dtype.size()).map(|c| match t.dtype {
        FloatDtype::F32 => f32::from_le_bytes([c[0], c[1], c[2], c[3]]),
        FloatDtype::F16 => half::f16::from_le_bytes([c[0], c[1]]).to_f32(),
        FloatDtype::BF16 => half::bf16::from_le_bytes([c[0], c[1]]).to_f32(),
    });
    let mut out = Vec::with_capacity(t.data.len() / t.dtype.size() * to.size());
    match to {
        FloatDtype::F32 => values.for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        FloatDtype::F16 => values.for_each(|v| out.extend_from_slice(&half::f16::from_f32(v).to_le_bytes())),
        FloatDtype::BF16 => values.for_each(|v| out.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes())),
    }
    out
}

/// An affine triple's bytes, ready to write.
struct AffineParts<'a> {
    shape: &'a [usize],
    bits: u32,
    group_size: u32,
    weight: &'a [u8],
    scales: (&'a [u8], BundleDtype),
    biases: (&'a [u8], BundleDtype),
}

/// Bytes of f32 per row block when dequantizing or quantizing a large tensor.
const CHUNK_BYTES: usize = 16 << 20;

impl AffineParts<'_> {
    /// Shapes of the packed codes and of the per-group scales.
    fn shapes(shape: &[usize], bits: u32, group_size: u32) -> (Vec<usize>, Vec<usize>) {
        let (mut packed, mut groups) = (shape.to_vec(), shape.to_vec());
        if let (Some(p), Some(g)) = (packed.last_mut(), groups.last_mut()) {
            *p = *p * bits as usize / 32;
            *g /= group_size as usize;
        }
        (packed, groups)
    }

    fn weight_spec(prefix: &str, shape: &[usize], bits: u32, group_size: u32) -> TensorSpec {
        let (packed, _) = Self::shapes(shape, bits, group_size);
        let quant = Quantization {
            mode: "affine".into(),
            bits,
            group_size,
            scales: format!("{prefix}.scales"),
            biases: Some(format!("{prefix}.biases")),
        };
        TensorSpec::new(format!("{prefix}.weight"), BundleDtype::U32, shape_u64(&packed)).quantized(quant)
    }

    /// Writes `<prefix>.weight` from chunks of packed codes; returns its bytes.
    fn write_streamed(
        w: &mut BundleWriter,
        prefix: &str,
        shape: &[usize],
        bits: u32,
        group_size: u32,
        chunks: impl IntoIterator<Item = Vec<u8>>,
    ) -> Result<u64> {
        let spec = Self::weight_spec(prefix, shape, bits, group_size);
        let bytes = spec.byte_len().unwrap_or(0);
        w.add_tensor_chunks(spec, chunks)?;
        Ok(bytes)
    }

    /// Writes `<prefix>.scales` and `.biases`.
    fn write_groups(&self, w: &mut BundleWriter, prefix: &str) -> Result<u64> {
        let (_, groups) = Self::shapes(self.shape, self.bits, self.group_size);
        let (scales, sd) = self.scales;
        let (biases, bd) = self.biases;
        w.add_tensor_bytes(TensorSpec::new(format!("{prefix}.scales"), sd, shape_u64(&groups)), scales)?;
        w.add_tensor_bytes(TensorSpec::new(format!("{prefix}.biases"), bd, shape_u64(&groups)), biases)?;
        Ok((scales.len() + biases.len()) as u64)
    }

    /// Writes the whole triple.
    fn write(&self, w: &mut BundleWriter, prefix: &str) -> Result<u64> {
        let spec = Self::weight_spec(prefix, self.shape, self.bits, self.group_size);
        w.add_tensor_bytes(spec, self.weight)?;
        Ok(self.weight.len() as u64 + self.write_groups(w, prefix)?)
    }
}

/// `(Σ (approx - exact)², Σ exact²)` over f32 MLX arrays.
fn squared_error(approx: &Array, exact: &Array) -> mlxcel_mlx::Result<(f64, f64)> {
    let total =
        |a: Array| -> mlxcel_mlx::Result<f64> { Ok(f64::from(a.reshape(&[-1])?.sum(&[0], false)?.item::<f32>()?)) };
    let num = total(approx.subtract(exact)?.square()?)?;
    let den = total(exact.square()?)?;
    Ok((num, den))
}

fn source_description(info: &TensorInfo) -> String {
    match &info.storage {
        Storage::Float(d) => d.name().to_string(),
        Storage::Gguf(t) => t.to_string(),
        Storage::MlxAffine { bits, group_size, .. } => format!("affine q{bits} g{group_size}"),
    }
}

/// One output tensor: its name, its source and stored form, and the surgery
/// edits it gets.
struct Job<'a> {
    name: String,
    info: &'a TensorInfo,
    plan: TensorPlan,
    edits: Option<&'a OutputTensor>,
}

/// Compiles `source` into a bundle at `output`, applying `surgery` when given,
/// calling `progress` before each tensor.
pub fn compile(
    source: &SourceModel,
    output: &Path,
    options: &CompileOptions,
    surgery: Option<&Surgery>,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<CompileReport> {
    let start = Instant::now();
    options.validate()?;
    let config = source.config();
    // The surgery is validated against the model before any weight is read.
    let surgery_plan = match surgery {
        Some(s) => {
            let tensors: Vec<ModelTensor> =
                source.tensors().iter().map(|t| ModelTensor { name: t.name.clone(), shape: t.shape.clone() }).collect();
            Some(s.plan(ModelView { config, tensors: &tensors })?)
        }
        None => None,
    };
    let jobs: Vec<Job<'_>> = match &surgery_plan {
        Some(sp) => sp
            .outputs
            .iter()
            .map(|out| {
                let info = source.tensor(&out.source).expect("the plan's sources are the model's tensors");
                Job { name: out.name.clone(), info, plan: plan(info, options), edits: Some(out) }
            })
            .collect(),
        None => source
            .tensors()
            .iter()
            .map(|info| Job { name: info.name.clone(), info, plan: plan(info, options), edits: None })
            .collect(),
    };
    // Every plan is checked before the first byte is written.
    for job in &jobs {
        if let TensorPlan::Quantize { group_size, .. } = job.plan {
            let cols = job.info.shape.last().copied().unwrap_or(0);
            if cols % group_size as usize != 0 {
                return Err(CompileError::Options(format!(
                    "tensor {}: its {cols} columns are not a multiple of the group size {group_size} (try --group-size 32)",
                    job.info.name
                )));
            }
        }
    }
    // The normalized config, after surgery: what the runtime builds the model from.
    let config_json = surgery_plan.as_ref().map_or(config, |p| &p.config).to_json();
    let tokenizer = source.tokenizer()?;
    let generation = source.generation()?;
    let model = ModelInfo {
        architecture: config.architecture.name().to_string(),
        name: options.name.clone().unwrap_or_else(|| default_name(source.path())),
        config_json,
    };
    // The tokenizer compiles, and is checked against `tokenizers` (about a
    // second for a 262k vocabulary), on a second thread while tensors stream.
    std::thread::scope(|scope| {
        let compiled_tokenizer =
            scope.spawn(|| mlxcel_tokenizer::verify::compile_checked(tokenizer.tokenizer_json.as_bytes()));
        let mut w = BundleWriter::create(output, model)?;
        w.add_tokenizer_json(tokenizer.tokenizer_json.as_bytes())?;
        let (template, template_origin) = match (&options.chat_template, &tokenizer.chat_template) {
            (Some(t), _) => (Some(t.clone()), "given"),
            (None, Some(t)) => (Some(t.clone()), "source"),
            (None, None) => match builtin_chat_template(config.architecture) {
                Some(t) => (Some(t.to_string()), "built-in"),
                None => (None, "none"),
            },
        };
        if let Some(t) = template {
            w.set_chat_template(t);
        }
        w.add_metadata("chat_template.origin", template_origin);
        let mut defaults = match &generation.generation_config {
            Value::Object(m) => m.clone(),
            _ => serde_json::Map::new(),
        };
        defaults.insert("eos_token_id".into(), json!(generation.eos_token_ids));
        if let Some(bos) = generation.bos_token_id {
            defaults.insert("bos_token_id".into(), json!(bos));
        }
        w.set_generation_defaults_json(Value::Object(defaults).to_string());

        let mut reports = Vec::with_capacity(jobs.len());
        for job in &jobs {
            let info = job.info;
            progress(Progress { tensor: &job.name, source_bytes: info.nbytes });
            let mlx = |e: mlxcel_mlx::Error| CompileError::Mlx { tensor: info.name.clone(), source: e };
            // A tensor a surgery edits is computed whole, on MLX; an edit that
            // leaves it unchanged (scale by 1, add zeros) keeps its stored form.
            let edited = match job.edits {
                Some(out) if !out.edits.is_empty() => {
                    let original = float_array(source, info).map_err(mlx)?;
                    let values = surgery_plan
                        .as_ref()
                        .expect("edits come from a plan")
                        .apply(out, &original)
                        .map_err(CompileError::Surgery)?;
                    let changed = values.shape() != original.shape()
                        || values.to_bytes().map_err(mlx)? != original.to_bytes().map_err(mlx)?;
                    changed.then_some(values)
                }
                _ => None,
            };
            let mut p = job.plan.clone();
            let (bytes, error) = match edited {
                Some(values) => {
                    let shape: Vec<usize> = values.shape().iter().map(|&d| d as usize).collect();
                    p = edited_plan(&p, info, &shape);
                    let t = FloatTensor {
                        dtype: FloatDtype::F32,
                        shape: shape.clone(),
                        data: Cow::Owned(values.to_bytes().map_err(mlx)?),
                    };
                    write_floats(&mut w, &job.name, &shape, &p, std::iter::once(Ok(t)), options.report, &mlx)?
                }
                None => match &p {
                    TensorPlan::KeepAffine => match source.load(info)? {
                        TensorData::Affine(a) => {
                            let prefix = job.name.strip_suffix(".weight").unwrap_or(&job.name);
                            (write_affine_tensor(&mut w, prefix, &a)?, options.report.then_some(0.0))
                        }
                        TensorData::Float(_) => {
                            return Err(CompileError::Options(format!(
                                "tensor {} did not load as affine blocks",
                                info.name
                            )));
                        }
                    },
                    // Row block by row block: a dequantized tensor is never whole in memory.
                    _ => {
                        let chunks = source.float_chunks(info, CHUNK_BYTES)?.map(|c| c.map_err(CompileError::from));
                        write_floats(&mut w, &job.name, &info.shape, &p, chunks, options.report, &mlx)?
                    }
                },
            };
            reports.push(TensorReport {
                name: job.name.clone(),
                plan: p,
                source: source_description(info),
                bytes,
                rel_rms_error: error,
            });
        }

        let mut source_files = Vec::new();
        for path in source.source_files() {
            let (size, digest) = file_digest(&path)?;
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            source_files.push(SourceFile { name, size, digest });
        }
        let mut counts = std::collections::BTreeMap::<String, usize>::new();
        for r in &reports {
            *counts.entry(r.plan.to_string()).or_default() += 1;
        }
        w.set_provenance(Provenance {
            compiler_version: format!("mlxcel-compile {}", env!("CARGO_PKG_VERSION")),
            mlx_version: mlxcel_mlx::mlx_version(),
            source_files,
            compile_options_json: options.to_json().to_string(),
            quantization_recipe_json: Some(json!({ "tensors_by_form": counts }).to_string()),
            surgery: match (surgery, &surgery_plan) {
                (Some(s), Some(p)) => Some(SurgeryRecord {
                    yaml: s.yaml.clone(),
                    blake3: *blake3::hash(s.yaml.as_bytes()).as_bytes(),
                    operations: p
                        .operations
                        .iter()
                        .map(|o| SurgeryOperation {
                            description: o.description.clone(),
                            matched_tensors: Some(o.matched.clone()),
                        })
                        .collect(),
                }),
                _ => None,
            },
            ..Provenance::default()
        });
        let tokenizer_report = match compiled_tokenizer.join() {
            Ok(Ok(section)) => {
                w.add_section_bytes(SectionSpec::new(kinds::TOKENIZER, kinds::TOKENIZER_COMPILED_KEY), &section)?;
                TokenizerReport::Compiled { bytes: section.len() }
            }
            Ok(Err(e)) => TokenizerReport::JsonOnly { reason: e.to_string() },
            Err(_) => TokenizerReport::JsonOnly { reason: "the tokenizer compiler panicked".into() },
        };
        let written = w.finish()?;
        Ok(CompileReport { written, tokenizer: tokenizer_report, tensors: reports, elapsed: start.elapsed() })
    })
}

/// Writes `name` (shaped `shape`) from row blocks of floats, as `plan` says:
/// converted to a float dtype, or quantized block by block (groups run along
/// rows, so row blocks quantize independently; the packed codes stream into
/// the bundle and the 8x smaller scales and biases follow). Returns the bytes
/// written and, with `report`, the relative RMS error of quantization.
fn write_floats<'a>(
    w: &mut BundleWriter,
    name: &str,
    shape: &[usize],
    plan: &TensorPlan,
    chunks: impl Iterator<Item = Result<FloatTensor<'a>>>,
    report: bool,
    mlx: &dyn Fn(mlxcel_mlx::Error) -> CompileError,
) -> Result<(u64, Option<f64>)> {
    let mut failure = None;
    match plan {
        TensorPlan::Float(dtype) => {
            let mut written = 0u64;
            let converted = chunks.map_while(|chunk| match chunk {
                Ok(t) => {
                    let bytes = convert_float(&t, *dtype);
                    written += bytes.len() as u64;
                    Some(bytes)
                }
                Err(e) => {
                    failure = Some(e);
                    None
                }
            });
            let result = w.add_tensor_chunks(TensorSpec::new(name, bundle_dtype(*dtype), shape_u64(shape)), converted);
            if let Some(e) = failure {
                return Err(e);
            }
            result?;
            Ok((written, None))
        }
        TensorPlan::Quantize { bits, group_size } => {
            let (mut scales, mut biases) = (Vec::new(), Vec::new());
            let (mut err_num, mut err_den) = (0f64, 0f64);
            let packed = chunks.map_while(|chunk| {
                let step = || -> Result<Vec<u8>> {
                    let t = chunk?;
                    let exact = t.to_array().map_err(mlx)?;
                    let exact =
                        if exact.dtype() == Dtype::F32 { exact } else { exact.astype(Dtype::F32).map_err(mlx)? };
                    let q = exact.quantize(*group_size as i32, *bits as i32, QuantMode::Affine).map_err(mlx)?;
                    if report {
                        let (n, d) = squared_error(&q.dequantize(None).map_err(mlx)?, &exact).map_err(mlx)?;
                        err_num += n;
                        err_den += d;
                    }
                    scales.extend(q.scales.to_bytes().map_err(mlx)?);
                    biases.extend(q.biases.as_ref().map(Array::to_bytes).transpose().map_err(mlx)?.unwrap_or_default());
                    q.weight.to_bytes().map_err(mlx)
                };
                match step() {
                    Ok(bytes) => Some(bytes),
                    Err(e) => {
                        failure = Some(e);
                        None
                    }
                }
            });
            let prefix = name.strip_suffix(".weight").unwrap_or(name);
            let result = AffineParts::write_streamed(w, prefix, shape, *bits, *group_size, packed);
            if let Some(e) = failure {
                return Err(e);
            }
            let weight_bytes = result?;
            let parts = AffineParts {
                shape,
                bits: *bits,
                group_size: *group_size,
                weight: &[],
                scales: (&scales, BundleDtype::F32),
                biases: (&biases, BundleDtype::F32),
            };
            let error = report.then(|| (err_num / err_den.max(1e-30)).sqrt());
            Ok((weight_bytes + parts.write_groups(w, prefix)?, error))
        }
        TensorPlan::KeepAffine => {
            Err(CompileError::Options(format!("tensor {name}: affine blocks cannot be rebuilt from floats")))
        }
    }
}

/// A source tensor's values as one f32 MLX array (for surgery).
fn float_array(source: &SourceModel, info: &TensorInfo) -> std::result::Result<Array, mlxcel_mlx::Error> {
    let t = source.load_float(info).map_err(|e| mlxcel_mlx::Error::Invalid { op: "load", message: e.to_string() })?;
    let a = t.to_array()?;
    if a.dtype() == Dtype::F32 { Ok(a) } else { a.astype(Dtype::F32) }
}

/// The stored form of a tensor a surgery changed: blocks kept from the source
/// are requantized at their own width and group; a quantized form whose group
/// no longer divides the columns (after removing channels) falls back to f32.
fn edited_plan(p: &TensorPlan, info: &TensorInfo, shape: &[usize]) -> TensorPlan {
    let p = match p {
        TensorPlan::KeepAffine => match info.lossless_affine() {
            Some((bits, group)) => TensorPlan::Quantize { bits, group_size: group as u32 },
            None => TensorPlan::Float(FloatDtype::F32),
        },
        other => other.clone(),
    };
    match p {
        TensorPlan::Quantize { group_size, .. } if shape.last().is_none_or(|&c| c % group_size as usize != 0) => {
            TensorPlan::Float(FloatDtype::F32)
        }
        other => other,
    }
}

fn write_affine_tensor(w: &mut BundleWriter, prefix: &str, a: &AffineTensor<'_>) -> Result<u64> {
    let parts = AffineParts {
        shape: &a.shape,
        bits: a.bits,
        group_size: a.group_size as u32,
        weight: &a.weight,
        scales: (&a.scales.data, bundle_dtype(a.scales.dtype)),
        biases: (&a.biases.data, bundle_dtype(a.biases.dtype)),
    };
    parts.write(w, prefix)
}
