//! The compile pipeline: walk a [`SourceModel`] tensor by tensor, decide each
//! tensor's stored form (kept, transcoded, converted or quantized), and stream
//! it into a bundle together with the tokenizer, chat template, generation
//! defaults, the normalized config and provenance.
//!
//! [`compile`] runs named phases in order (`phases.rs`): ingest, surgery,
//! plan, tokenizer, chat template, tensors, provenance, write. Options and
//! the per-tensor plan live in `options.rs`, the tensor writers in
//! `write.rs`.

mod graphs;
mod options;
mod phases;
mod write;

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mlxcel_bundle::WrittenBundle;
use mlxcel_surgery::Surgery;

pub use graphs::{DEFAULT_IREE_CONTEXT, GraphEvent, GraphReport, IreeOptions};
pub use options::{CompileOptions, QuantizeTarget, TensorPlan, WeightLayout, WeightLayoutChoice, plan};

use crate::ingest::{Architecture, SourceModel};
use phases::Compilation;

/// Errors of the compile pipeline.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// Reading the source model failed.
    #[error(transparent)]
    Ingest(#[from] crate::ingest::IngestError),
    /// Writing the bundle failed (the error names the file).
    #[error(transparent)]
    Bundle(#[from] mlxcel_bundle::BundleError),
    /// The finished bundle is one the runtime would refuse (the self-check
    /// before the rename); nothing is left under the output's name.
    #[error("{}: the compiled bundle would not load: {error}", source_path.display())]
    Check {
        /// The source model.
        source_path: PathBuf,
        /// What the runtime's loader said.
        error: mlxcel_runtime::Error,
    },
    /// An MLX operation (quantization) failed on a tensor.
    #[error("tensor {tensor}: {cause}")]
    Mlx {
        /// The tensor being processed.
        tensor: String,
        /// MLX's error (in the message, not `source()`).
        cause: mlxcel_mlx::Error,
    },
    /// The options cannot be applied to this model.
    #[error("{0}")]
    Options(String),
    /// The source's `tokenizer.json` is one no tokenizer of the runtime can
    /// use (`mlxcel_tokenizer::validate_json`); shown once, not as a source.
    #[error("{}: tokenizer: {cause}", source_path.display())]
    Tokenizer {
        /// The source model (for a GGUF, the `tokenizer.json` built from
        /// its metadata is what was checked).
        source_path: PathBuf,
        /// What the check found (in the message, not `source()`).
        cause: mlxcel_tokenizer::TokenizerError,
    },
    /// The surgery is invalid for this model, or failed.
    #[error(transparent)]
    Surgery(#[from] mlxcel_surgery::SurgeryError),
    /// Loading the CUDA tools or compiling MLX's kernels failed.
    #[error(transparent)]
    Kernels(#[from] crate::cuda::KernelError),
    /// Tracing the model into StableHLO or compiling it with `iree-compile`
    /// failed (`--target iree-*`).
    #[error("IREE graphs: {0}")]
    Graphs(mlxcel_stablehlo::Error),
    /// Reading a source file for its digest failed.
    #[error("reading {path}: {cause}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error (in the message, not `source()`).
        cause: std::io::Error,
    },
}

/// The compile pipeline's result type.
pub type Result<T> = std::result::Result<T, CompileError>;

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
    /// Whether the weight and its scales and biases are in the `rows16` layout.
    pub rows16: bool,
    /// The logical shape stored (after surgery).
    pub shape: Vec<usize>,
    /// The affine form, for a quantized tensor.
    pub affine: Option<StoredAffine>,
}

/// How a quantized tensor is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredAffine {
    /// Bits per code.
    pub bits: u32,
    /// Inputs per group.
    pub group_size: u32,
    /// The dtype of its scales and biases.
    pub scales: crate::ingest::FloatDtype,
}

/// One kernel module compiled into the bundle (`--target cuda-*`).
#[derive(Clone, Debug)]
pub struct KernelReport {
    /// MLX's module name.
    pub module: String,
    /// The architecture.
    pub target: crate::cuda::CudaTarget,
    /// Bytes of its cubin.
    pub bytes: usize,
    /// Seconds NVRTC took.
    pub seconds: f64,
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
    /// The kernel modules stored, in name order (empty without `--target cuda-*`).
    pub kernels: Vec<KernelReport>,
    /// The IREE modules stored, one per target (empty without `--target iree-*`).
    pub graphs: Vec<graphs::GraphReport>,
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

/// Progress of a compile: one call per tensor, then the kernels' events.
pub enum Progress<'a> {
    /// A tensor is about to be processed.
    Tensor {
        /// Its name.
        tensor: &'a str,
        /// Its source bytes.
        source_bytes: u64,
    },
    /// MLX's CUDA kernels are being compiled (`--target cuda-*`).
    Kernels(crate::cuda::KernelEvent<'a>),
    /// The model is being traced and compiled by IREE (`--target iree-*`).
    Graphs(graphs::GraphEvent<'a>),
}

/// The chat template a model family uses, for sources that ship none (the
/// Gemma 3 GGUFs carry no `tokenizer.chat_template`): Google's template for
/// Gemma 3, as published with the Hugging Face checkpoints.
pub fn builtin_chat_template(a: Architecture) -> Option<&'static str> {
    match a {
        Architecture::Gemma3 => Some(include_str!("../../templates/gemma3.jinja")),
        _ => None,
    }
}

/// Compiles `source` into a bundle at `output`, applying `surgery` when given,
/// calling `progress` before each tensor and as the kernels compile.
///
/// Every check (options, surgery, per-tensor plans) runs before the output
/// file is created; the tokenizer is validated and compiles (checked
/// against `tokenizers`, about two seconds for a 262k vocabulary), and
/// every token's bytes are decoded for the `token-bytes` section, on a
/// second thread while the tensors stream. With `options.cuda`, NVRTC
/// and MLX's CUDA wheel are loaded before the output is created, and the
/// kernel modules the written tensors need are compiled after them.
pub fn compile(
    source: &SourceModel,
    output: &Path,
    options: &CompileOptions,
    surgery: Option<&Surgery>,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<CompileReport> {
    let start = Instant::now();
    let c = Compilation::ingest(source, options, surgery)?;
    let surgery_plan = c.surgery()?;
    let jobs = c.plan(surgery_plan.as_ref())?;
    let tokenizer = c.read_tokenizer()?;
    // NVRTC and MLX's CUDA wheel are loaded and checked before the output exists.
    let toolchain = options.cuda.as_ref().map(crate::cuda::KernelToolchain::open).transpose()?;
    std::thread::scope(|scope| {
        // The compiled tokenizer, then every token's bytes through it.
        // A panic in the tokenizer compiler costs only its section.
        let tokenizer_sections = scope.spawn(|| {
            let compiled = match std::panic::catch_unwind(AssertUnwindSafe(|| c.compile_tokenizer(&tokenizer))) {
                Ok(checked) => Ok(checked?),
                Err(panic) => Err(panic),
            };
            let section = compiled.as_ref().ok().and_then(|c| c.as_deref().ok());
            let token_bytes = c.token_bytes(&tokenizer, section, surgery_plan.as_ref())?;
            Ok::<_, CompileError>((compiled, token_bytes))
        });
        let mut w = c.create(output, surgery_plan.as_ref())?;
        c.tokenizer(&mut w, &tokenizer)?;
        c.chat_template(&mut w, &tokenizer);
        let tensors = c.tensors(&mut w, &jobs, surgery_plan.as_ref(), progress)?;
        let kernels = match &toolchain {
            Some(t) => c.kernels(&mut w, t, &tensors, progress)?,
            None => Vec::new(),
        };
        let graphs = match &options.iree {
            Some(iree) => graphs::graphs(&mut w, c.config(surgery_plan.as_ref()), iree, &tensors, progress)?,
            None => Vec::new(),
        };
        c.provenance(&mut w, &tensors, surgery_plan.as_ref())?;
        // A tokenizer.json the runtime could not use fails the compile; the
        // temporary file goes with the writer.
        let Ok(sections) = tokenizer_sections.join() else {
            return Err(CompileError::Options("decoding the vocabulary's tokens panicked".into()));
        };
        let (compiled_tokenizer, token_bytes) = sections?;
        let (written, tokenizer) = c.write(w, compiled_tokenizer, &token_bytes)?;
        Ok(CompileReport { written, tokenizer, tensors, kernels, graphs, elapsed: start.elapsed() })
    })
}
