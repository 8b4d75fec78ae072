//! The phases of [`super::compile`], one method each, in the order it runs
//! them: ingest, surgery, plan, tokenizer, chat template, tensors,
//! provenance, write. Everything that can be refused is checked by the
//! first three, before the output file exists.

use std::borrow::Cow;
use std::io::Read;
use std::path::Path;

use mlxcel_bundle::{
    BundleWriter, LAYOUT_ROWS16, ModelInfo, Provenance, RepackRecord, SectionSpec, SourceFile, SurgeryOperation,
    SurgeryRecord, WrittenBundle, kinds, rows16,
};
use mlxcel_mlx::{Array, Dtype};
use mlxcel_runtime::tokenizer::Tokenizer as RuntimeTokenizer;
use mlxcel_surgery::{ModelTensor, ModelView, OutputTensor, Plan, Surgery};
use serde_json::{Value, json};

use super::options::{CompileOptions, TensorPlan, edited_plan, plan};
use super::write::{CHUNK_BYTES, WriteOptions, stores_rows16, write_affine_tensor, write_floats};
use super::{
    CompileError, KernelReport, Progress, Result, StoredAffine, TensorReport, TokenizerReport, builtin_chat_template,
};
use crate::cuda::{KernelToolchain, MlxDtype, QuantizedMatrix};
use crate::ingest::{
    FloatDtype, FloatTensor, GenerationDefaults, SourceModel, Storage, TensorData, TensorInfo, TokenizerAssets,
};

/// One output tensor: its name, its source and stored form, and the surgery
/// edits it gets.
pub(super) struct Job<'a> {
    name: String,
    info: &'a TensorInfo,
    plan: TensorPlan,
    edits: Option<&'a OutputTensor>,
}

/// The source's tokenizer and generation defaults.
pub(super) struct SourceTokenizer {
    /// `tokenizer.json`, the chat template and `tokenizer_config`.
    pub(super) assets: TokenizerAssets,
    generation: GenerationDefaults,
}

/// One compile: the source, the options and the surgery, walked phase by
/// phase.
pub(super) struct Compilation<'a> {
    source: &'a SourceModel,
    options: &'a CompileOptions,
    surgery: Option<&'a Surgery>,
}

impl<'a> Compilation<'a> {
    /// Ingest: the source is open (its config normalized and checked, its
    /// tensors listed and shape-checked by [`SourceModel::open`]); the
    /// options are checked against what they can express.
    pub(super) fn ingest(
        source: &'a SourceModel,
        options: &'a CompileOptions,
        surgery: Option<&'a Surgery>,
    ) -> Result<Compilation<'a>> {
        options.validate()?;
        Ok(Compilation { source, options, surgery })
    }

    /// Surgery: the operations validated against the model, before any
    /// weight is read.
    pub(super) fn surgery(&self) -> Result<Option<Plan>> {
        let Some(s) = self.surgery else { return Ok(None) };
        let tensors: Vec<ModelTensor> = self
            .source
            .tensors()
            .iter()
            .map(|t| ModelTensor { name: t.name.clone(), shape: t.shape.clone() })
            .collect();
        Ok(Some(s.plan(ModelView { config: self.source.config(), tensors: &tensors })?))
    }

    /// Plan: every output tensor's stored form, checked before the first
    /// byte is written.
    pub(super) fn plan<'p>(&self, surgery: Option<&'p Plan>) -> Result<Vec<Job<'p>>>
    where
        'a: 'p,
    {
        let (source, options) = (self.source, self.options);
        let jobs: Vec<Job<'p>> = match surgery {
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
        Ok(jobs)
    }

    /// Tokenizer, first half: the source's tokenizer and generation defaults
    /// (for GGUF this builds `tokenizer.json`), read before the output exists.
    /// Token ids were checked against the vocabulary when read.
    pub(super) fn read_tokenizer(&self) -> Result<SourceTokenizer> {
        let assets = self.source.tokenizer()?;
        Ok(SourceTokenizer { assets, generation: self.source.generation()? })
    }

    /// Refuses a `tokenizer.json` no tokenizer of the runtime could use
    /// (`mlxcel_tokenizer::validate_json_fields`: ids, merges, regexes that
    /// give up), then compiles it, checked token for token against
    /// `tokenizers`. Runs on a thread of its own while the tensors stream
    /// (about a second and a half for a 262k vocabulary). The inner error
    /// is the compiled tokenizer's alone, which the bundle can do without;
    /// a file `tokenizers` refuses too is refused by the check before the
    /// rename (the runtime loads it then).
    pub(super) fn compile_tokenizer(
        &self,
        tokenizer: &SourceTokenizer,
    ) -> Result<std::result::Result<Vec<u8>, mlxcel_tokenizer::TokenizerError>> {
        let json = tokenizer.assets.tokenizer_json.as_bytes();
        mlxcel_tokenizer::validate_json_fields(json)
            .map_err(|cause| CompileError::Tokenizer { source_path: self.source.path().to_path_buf(), cause })?;
        Ok(mlxcel_tokenizer::verify::compile_checked(json))
    }

    /// The vocabulary's bytes for constrained decoding (the `token-bytes`
    /// section, docs/bundle-format.md §4.2.1): every token of the model's
    /// `vocab_size` decoded by the tokenizer the runtime will load (the
    /// compiled one when `compiled` holds it), so that a server does not
    /// decode them at its first grammar. Runs on the tokenizer's thread.
    pub(super) fn token_bytes(
        &self,
        tokenizer: &SourceTokenizer,
        compiled: Option<&[u8]>,
        surgery: Option<&Plan>,
    ) -> Result<Vec<u8>> {
        let vocab_size = surgery.map_or(self.source.config(), |p| &p.config).vocab_size;
        let check = |error| CompileError::Check { source_path: self.source.path().to_path_buf(), error };
        let runtime = match compiled.map(|section| RuntimeTokenizer::from_compiled(section.to_vec(), Vec::new(), None))
        {
            Some(Ok(t)) => t,
            _ => RuntimeTokenizer::from_json(tokenizer.assets.tokenizer_json.as_bytes(), Vec::new(), None)
                .map_err(check)?,
        };
        Ok(runtime.compute_vocabulary_bytes(vocab_size).map_err(check)?.to_section())
    }

    /// The normalized config after surgery: what the bundle records and the
    /// runtime builds the model from.
    pub(super) fn config<'p>(&'p self, surgery: Option<&'p Plan>) -> &'p mlxcel_arch::ModelConfig {
        surgery.map_or(self.source.config(), |p| &p.config)
    }

    /// Creates the bundle with the model's name, architecture and normalized
    /// config after surgery (what the runtime builds the model from).
    pub(super) fn create(&self, output: &Path, surgery: Option<&Plan>) -> Result<BundleWriter> {
        let config = self.config(surgery);
        let model = ModelInfo {
            architecture: config.architecture.name().to_string(),
            name: self.options.name.clone().unwrap_or_else(|| default_name(self.source.path())),
            config_json: config.to_json(),
        };
        Ok(BundleWriter::create(output, model)?)
    }

    /// Tokenizer, second half: the `tokenizer.json` section and the
    /// generation defaults (with the end and start token ids).
    pub(super) fn tokenizer(&self, w: &mut BundleWriter, tokenizer: &SourceTokenizer) -> Result<()> {
        w.add_tokenizer_json(tokenizer.assets.tokenizer_json.as_bytes())?;
        let generation = &tokenizer.generation;
        let mut defaults = match &generation.generation_config {
            Value::Object(m) => m.clone(),
            _ => serde_json::Map::new(),
        };
        defaults.insert("eos_token_id".into(), json!(generation.eos_token_ids));
        if let Some(bos) = generation.bos_token_id {
            defaults.insert("bos_token_id".into(), json!(bos));
        }
        w.set_generation_defaults_json(Value::Object(defaults).to_string());
        Ok(())
    }

    /// Chat template: the one given, else the source's, else the family's
    /// built-in one; where it came from is recorded.
    pub(super) fn chat_template(&self, w: &mut BundleWriter, tokenizer: &SourceTokenizer) {
        let (template, origin) = match (&self.options.chat_template, &tokenizer.assets.chat_template) {
            (Some(t), _) => (Some(t.clone()), "given"),
            (None, Some(t)) => (Some(t.clone()), "source"),
            (None, None) => match builtin_chat_template(self.source.config().architecture) {
                Some(t) => (Some(t.to_string()), "built-in"),
                None => (None, "none"),
            },
        };
        if let Some(t) = template {
            w.set_chat_template(t);
        }
        w.add_metadata("chat_template.origin", origin);
    }

    /// Tensors: each job streamed into the bundle as its plan says.
    pub(super) fn tensors(
        &self,
        w: &mut BundleWriter,
        jobs: &[Job<'_>],
        surgery: Option<&Plan>,
        progress: &mut dyn FnMut(Progress<'_>),
    ) -> Result<Vec<TensorReport>> {
        let mut reports = Vec::with_capacity(jobs.len());
        for job in jobs {
            progress(Progress::Tensor { tensor: &job.name, source_bytes: job.info.nbytes });
            reports.push(self.tensor(w, job, surgery)?);
        }
        Ok(reports)
    }

    /// One job of [`Compilation::tensors`].
    fn tensor(&self, w: &mut BundleWriter, job: &Job<'_>, surgery: Option<&Plan>) -> Result<TensorReport> {
        let (source, report) = (self.source, self.options.report);
        let options = WriteOptions { report, layout: self.options.weight_layout };
        let info = job.info;
        let mlx = |e: mlxcel_mlx::Error| CompileError::Mlx { tensor: info.name.clone(), cause: e };
        // A tensor a surgery edits is computed whole, on MLX; an edit that
        // leaves it unchanged (scale by 1, add zeros) keeps its stored form.
        let edited = match (job.edits, surgery) {
            (Some(out), Some(plan)) if !out.edits.is_empty() => {
                let original = float_array(source, info).map_err(mlx)?;
                let values = plan.apply(out, &original).map_err(CompileError::Surgery)?;
                let changed = values.shape() != original.shape()
                    || values.to_bytes().map_err(mlx)? != original.to_bytes().map_err(mlx)?;
                changed.then_some(values)
            }
            _ => None,
        };
        let mut p = job.plan.clone();
        // Whether a quantized matrix of `shape` went into the rows16 layout.
        let in_rows16 = |plan: &TensorPlan, shape: &[usize]| match plan {
            TensorPlan::Quantize { bits, .. } => stores_rows16(options.layout, shape, *bits),
            _ => false,
        };
        let (bytes, error, rows16, shape, affine) = match edited {
            Some(values) => {
                let shape: Vec<usize> = values.shape().iter().map(|&d| d as usize).collect();
                p = edited_plan(&p, info, &shape);
                let t = FloatTensor {
                    dtype: FloatDtype::F32,
                    shape: shape.clone(),
                    data: Cow::Owned(values.to_bytes().map_err(mlx)?),
                };
                let (bytes, error) = write_floats(w, &job.name, &shape, &p, std::iter::once(Ok(t)), options, &mlx)?;
                (bytes, error, in_rows16(&p, &shape), shape, quantized_affine(&p))
            }
            None => match &p {
                TensorPlan::KeepAffine => match source.load(info)? {
                    TensorData::Affine(a) => {
                        let prefix = job.name.strip_suffix(".weight").unwrap_or(&job.name);
                        let bytes = write_affine_tensor(w, prefix, &a, options.layout)?;
                        let affine =
                            StoredAffine { bits: a.bits, group_size: a.group_size as u32, scales: a.scales.dtype };
                        let rows16 = stores_rows16(options.layout, &a.shape, a.bits);
                        (bytes, report.then_some(0.0), rows16, a.shape.clone(), Some(affine))
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
                    let (bytes, error) = write_floats(w, &job.name, &info.shape, &p, chunks, options, &mlx)?;
                    (bytes, error, in_rows16(&p, &info.shape), info.shape.clone(), quantized_affine(&p))
                }
            },
        };
        Ok(TensorReport {
            name: job.name.clone(),
            plan: p,
            source: source_description(info),
            bytes,
            rel_rms_error: error,
            rows16,
            shape,
            affine,
        })
    }

    /// Kernels: with `--target cuda-*`, MLX's run-time-compiled CUDA
    /// modules that the written tensors need ([`crate::cuda::plan`]),
    /// compiled by `toolchain` and stored as two `kernels` sections each
    /// (docs/bundle-format.md §4.2.2).
    pub(super) fn kernels(
        &self,
        w: &mut BundleWriter,
        toolchain: &KernelToolchain,
        tensors: &[TensorReport],
        progress: &mut dyn FnMut(Progress<'_>),
    ) -> Result<Vec<KernelReport>> {
        let Some(cuda) = &self.options.cuda else { return Ok(Vec::new()) };
        let modules = crate::cuda::plan::plan(&quantized_matrices(tensors), &embedding_dtypes(tensors));
        let built = toolchain.build(&modules, &cuda.targets, &mut |e| progress(Progress::Kernels(e)))?;
        let cuda_major = toolchain.cuda_major().to_string();
        let mut reports = Vec::with_capacity(built.len());
        for m in built {
            let target = m.target.section_target();
            for (key, bytes) in
                [(format!("{}.ptx", m.name), &m.cubin[..]), (format!("{}.txt", m.name), m.names_txt.as_bytes())]
            {
                let mut spec = SectionSpec::new(kinds::KERNELS, key)
                    .with_target(target.clone())
                    .with_property(kinds::KERNEL_SET_KEY, kinds::KERNEL_SET_MLX_PTX_CACHE)
                    .with_property(kinds::MLX_VERSION_KEY, crate::cuda::MLX_VERSION)
                    .with_property(kinds::CUDA_MAJOR_KEY, cuda_major.clone());
                if m.name == mlxcel_mlx::cuda_kernels::MODULE {
                    spec = spec.with_property(kinds::MLXCEL_KERNELS_ABI_KEY, mlxcel_mlx::cuda_kernels::ABI.to_string());
                }
                w.add_section_bytes(spec, bytes)?;
            }
            reports.push(KernelReport { module: m.name, target: m.target, bytes: m.cubin.len(), seconds: m.seconds });
        }
        Ok(reports)
    }

    /// Provenance: the compiler and MLX versions, every source file's digest,
    /// the options, the recipe (tensors per stored form) and the surgery.
    pub(super) fn provenance(
        &self,
        w: &mut BundleWriter,
        reports: &[TensorReport],
        surgery: Option<&Plan>,
    ) -> Result<()> {
        let mut source_files = Vec::new();
        for path in self.source.source_files() {
            let (size, digest) = file_digest(&path)?;
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            source_files.push(SourceFile { name, size, digest });
        }
        let mut counts = std::collections::BTreeMap::<String, usize>::new();
        for r in reports {
            *counts.entry(r.plan.to_string()).or_default() += 1;
        }
        let rows16_tensors: Vec<String> = reports
            .iter()
            .filter(|r| r.rows16)
            .flat_map(|r| {
                let prefix = r.name.strip_suffix(".weight").unwrap_or(&r.name);
                [r.name.clone(), format!("{prefix}.scales"), format!("{prefix}.biases")]
            })
            .collect();
        let repacks = if rows16_tensors.is_empty() {
            Vec::new()
        } else {
            vec![RepackRecord {
                transform: "rows16".into(),
                layout: LAYOUT_ROWS16.into(),
                tensors: rows16_tensors,
                params_json: json!({ "block_rows": rows16::BLOCK_ROWS }).to_string(),
            }]
        };
        w.set_provenance(Provenance {
            compiler_version: format!("mlxcel-compile {}", env!("CARGO_PKG_VERSION")),
            mlx_version: mlxcel_mlx::mlx_version(),
            source_files,
            compile_options_json: self.options.to_json().to_string(),
            quantization_recipe_json: Some(json!({ "tensors_by_form": counts }).to_string()),
            surgery: match (self.surgery, surgery) {
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
            repacks,
        });
        Ok(())
    }

    /// Write: the compiled tokenizer's section (when the second thread made
    /// one that is token-exact) and the vocabulary's bytes, then the
    /// manifest and header.
    pub(super) fn write(
        &self,
        mut w: BundleWriter,
        compiled_tokenizer: std::thread::Result<std::result::Result<Vec<u8>, impl std::fmt::Display>>,
        token_bytes: &[u8],
    ) -> Result<(WrittenBundle, TokenizerReport)> {
        w.add_section_bytes(SectionSpec::new(kinds::TOKENIZER, kinds::TOKENIZER_TOKEN_BYTES_KEY), token_bytes)?;
        let report = match compiled_tokenizer {
            Ok(Ok(section)) => {
                w.add_section_bytes(SectionSpec::new(kinds::TOKENIZER, kinds::TOKENIZER_COMPILED_KEY), &section)?;
                TokenizerReport::Compiled { bytes: section.len() }
            }
            Ok(Err(e)) => TokenizerReport::JsonOnly { reason: e.to_string() },
            Err(_) => TokenizerReport::JsonOnly { reason: "the tokenizer compiler panicked".into() },
        };
        // The runtime's view of the finished file, before it gets its name:
        // compile accepts only what `run` can load.
        let sealed = w.seal()?;
        let check = |error| CompileError::Check { source_path: self.source.path().to_path_buf(), error };
        mlxcel_runtime::check::check_bundle(sealed.temporary_path()).map_err(check)?;
        // Structure alone does not say the weights are numbers: scan the
        // floats.
        mlxcel_runtime::check::check_numerics(sealed.temporary_path()).map_err(check)?;
        Ok((sealed.persist()?, report))
    }
}

/// The affine form of a tensor quantized by the compiler (f32 scales).
fn quantized_affine(p: &TensorPlan) -> Option<StoredAffine> {
    match *p {
        TensorPlan::Quantize { bits, group_size } => Some(StoredAffine { bits, group_size, scales: FloatDtype::F32 }),
        _ => None,
    }
}

/// The quantized matrices the matmul kernels see: each affine tensor's
/// bits, group and logical input width.
fn quantized_matrices(tensors: &[TensorReport]) -> Vec<QuantizedMatrix> {
    tensors
        .iter()
        .filter_map(|t| {
            let a = t.affine.as_ref()?;
            let columns = *t.shape.last()? as u64;
            Some(QuantizedMatrix { bits: a.bits, group_size: a.group_size, columns })
        })
        .collect()
}

/// The dtypes the embedding lookup gathers besides `float32` and `uint32`:
/// the table's own when it is float. A quantized table gathers its codes
/// (`uint32`) and its scales and biases in the compute dtype (`float32`): the
/// runtime converts 16-bit scales at load wherever MLX's ops run them
/// (runtime/src/weights.rs), so their stored dtype needs no gather of its own.
fn embedding_dtypes(tensors: &[TensorReport]) -> Vec<MlxDtype> {
    let mlx = |d: FloatDtype| match d {
        FloatDtype::F32 => MlxDtype::Float32,
        FloatDtype::F16 => MlxDtype::Float16,
        FloatDtype::BF16 => MlxDtype::Bfloat16,
    };
    tensors
        .iter()
        .filter(|t| t.name == EMBEDDING)
        .filter_map(|t| match (&t.affine, &t.plan) {
            (None, TensorPlan::Float(d)) => Some(mlx(*d)),
            _ => None,
        })
        .collect()
}

/// The embedding table's canonical name.
const EMBEDDING: &str = "model.embed_tokens.weight";

/// The default model name: the source file's stem or directory name.
fn default_name(path: &Path) -> String {
    let p = if path.is_dir() { path.file_name() } else { path.file_stem() };
    p.map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
}

/// blake3 of a file, streamed.
fn file_digest(path: &Path) -> Result<(u64, String)> {
    let io = |cause| CompileError::Io { path: path.to_path_buf(), cause };
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

/// How a tensor is stored in its source, for the report.
fn source_description(info: &TensorInfo) -> String {
    match &info.storage {
        Storage::Float(d) => d.name().to_string(),
        Storage::Gguf(t) => t.to_string(),
        Storage::MlxAffine { bits, group_size, .. } => format!("affine q{bits} g{group_size}"),
    }
}

/// A source tensor's values as one f32 MLX array (for surgery).
fn float_array(source: &SourceModel, info: &TensorInfo) -> std::result::Result<Array, mlxcel_mlx::Error> {
    let t = source.load_float(info).map_err(|e| mlxcel_mlx::Error::Invalid { op: "load", message: e.to_string() })?;
    let a = t.to_array()?;
    if a.dtype() == Dtype::F32 { Ok(a) } else { a.astype(Dtype::F32) }
}
