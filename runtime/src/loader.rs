//! Opening a bundle: map it, validate it, wrap its tensors in MLX arrays
//! (borrowing the map, not copying it), build the architecture, and load the
//! tokenizer, chat template and generation defaults.

use std::path::Path;
use std::time::{Duration, Instant};

use mlxcel_arch::{Architecture, ModelConfig};
use mlxcel_bundle::{Bundle, Dtype as BundleDtype, LAYOUT_ROW_MAJOR, LAYOUT_ROWS16, TensorView, kinds};
use mlxcel_mlx::{Array, Dtype, QuantMode, WeightLayout};
use serde_json::Value;

use crate::backend::{Backend, MlxBackend, MlxOptions};
use crate::chat::ChatTemplate;
use crate::error::{Error, Result};
use crate::gpu_kernels::{self, GpuKernelOptions, GpuTarget};
use crate::iree_backend::IreeOptions;
use crate::models;
use crate::tokenizer::Tokenizer;
use crate::weights::{QuantSpec, Weights};

/// How to load a bundle.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// The dtype activations are computed in (default:
    /// [`default_compute_dtype`], f32).
    pub compute_dtype: Option<Dtype>,
    /// Backend settings (prefill chunk, KV cap).
    pub backend: MlxOptions,
    /// Where the bundle's precompiled GPU kernels go, and what to do
    /// without them (only on a CUDA GPU).
    pub gpu_kernels: GpuKernelOptions,
    /// Which backend runs the model ([`load_backend`]; [`load`] is MLX's).
    pub backend_kind: BackendKind,
    /// IREE backend settings.
    pub iree: IreeOptions,
}

/// Which backend runs a model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BackendKind {
    /// MLX (CPU, CUDA): the reference backend.
    #[default]
    Mlx,
    /// The bundle's IREE module on IREE's runtime (a build with the `iree`
    /// feature; a bundle compiled with `--target iree-llvm-cpu`).
    Iree,
}

impl BackendKind {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Mlx => "mlx",
            BackendKind::Iree => "iree",
        }
    }
}

/// Sampling and stopping defaults the model ships with (Hugging Face
/// `generation_config.json` keys).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerationDefaults {
    /// Tokens that end generation.
    pub eos_token_ids: Vec<u32>,
    /// The beginning-of-sequence token.
    pub bos_token_id: Option<u32>,
    /// Suggested temperature.
    pub temperature: Option<f32>,
    /// Suggested top-p.
    pub top_p: Option<f32>,
    /// Suggested top-k.
    pub top_k: Option<usize>,
}

impl GenerationDefaults {
    /// Parses the bundle's generation defaults JSON. A token id that does
    /// not fit 32 bits, or a sampling value no sampler accepts, is an error
    /// naming the key: the values come from the bundle, not from the user.
    pub fn from_json(text: &str) -> Result<GenerationDefaults> {
        let bad = |key: &str, message: String| Error::Bundle(format!("generation defaults: {key}: {message}"));
        let v: Value = serde_json::from_str(text).map_err(|e| Error::Bundle(format!("generation defaults: {e}")))?;
        if !v.is_object() {
            return Err(Error::Bundle(format!("generation defaults: {} is not a JSON object", json_kind(&v))));
        }
        let id = |key: &str, x: &Value| -> Result<u32> {
            x.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| bad(key, format!("{x} is not a token id (a non-negative 32-bit integer)")))
        };
        let ids = |key: &str| -> Result<Vec<u32>> {
            match v.get(key) {
                None | Some(Value::Null) => Ok(Vec::new()),
                Some(Value::Array(a)) => a.iter().map(|x| id(key, x)).collect(),
                Some(x) => Ok(vec![id(key, x)?]),
            }
        };
        let num = |key: &str| -> Result<Option<f64>> {
            match v.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(x) => x.as_f64().map(Some).ok_or_else(|| bad(key, format!("{x} is not a number"))),
            }
        };
        let temperature = num("temperature")?;
        if let Some(t) = temperature.filter(|t| !(t.is_finite() && *t >= 0.0 && *t <= f32::MAX as f64)) {
            return Err(bad("temperature", format!("{t} is not a finite non-negative number")));
        }
        let top_p = num("top_p")?;
        if let Some(p) = top_p.filter(|p| !(*p > 0.0 && *p <= 1.0)) {
            return Err(bad("top_p", format!("{p} is not in (0, 1]")));
        }
        let top_k = num("top_k")?;
        if let Some(k) = top_k.filter(|k| !(k.fract() == 0.0 && *k >= 0.0 && *k <= u32::MAX as f64)) {
            return Err(bad("top_k", format!("{k} is not a non-negative integer")));
        }
        Ok(GenerationDefaults {
            eos_token_ids: ids("eos_token_id")?,
            bos_token_id: ids("bos_token_id")?.first().copied(),
            temperature: temperature.map(|x| x as f32),
            top_p: top_p.map(|x| x as f32),
            top_k: top_k.map(|x| x as usize),
        })
    }
}

/// What kind of JSON value `v` is, for an error.
fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A model ready to generate: its backend ([`MlxBackend`] from [`load`],
/// any from [`load_backend`]) and what generation needs beside it.
pub struct LoadedModel<B = MlxBackend> {
    /// The backend holding the model.
    pub backend: B,
    /// The tokenizer.
    pub tokenizer: Tokenizer,
    /// The chat template, if the bundle has one.
    pub chat_template: Option<ChatTemplate>,
    /// Generation defaults.
    pub defaults: GenerationDefaults,
    /// The model's normalized config.
    pub config: ModelConfig,
    /// The bundle's architecture name.
    pub architecture: String,
    /// The bundle's model name.
    pub name: String,
    /// Bytes of tensor data loaded.
    pub weight_bytes: u64,
    /// The bundle's GPU kernels, when the model runs on a CUDA GPU.
    pub gpu_kernels: Option<gpu_kernels::Installed>,
    /// Time from opening the file to the model being ready.
    pub load_time: Duration,
}

fn mlx_dtype(d: BundleDtype) -> Option<Dtype> {
    Some(match d {
        BundleDtype::Bool => Dtype::Bool,
        BundleDtype::U8 => Dtype::U8,
        BundleDtype::U16 => Dtype::U16,
        BundleDtype::U32 => Dtype::U32,
        BundleDtype::U64 => Dtype::U64,
        BundleDtype::I8 => Dtype::I8,
        BundleDtype::I16 => Dtype::I16,
        BundleDtype::I32 => Dtype::I32,
        BundleDtype::I64 => Dtype::I64,
        BundleDtype::F16 => Dtype::F16,
        BundleDtype::Bf16 => Dtype::BF16,
        BundleDtype::F32 => Dtype::F32,
        BundleDtype::F64 => Dtype::F64,
        BundleDtype::C64 => Dtype::Complex64,
    })
}

fn quant_mode(mode: &str) -> Option<QuantMode> {
    Some(match mode {
        "affine" => QuantMode::Affine,
        "mxfp4" => QuantMode::Mxfp4,
        "mxfp8" => QuantMode::Mxfp8,
        "nvfp4" => QuantMode::Nvfp4,
        _ => return None,
    })
}

/// The tensors of `bundle` as MLX arrays, with quantized weights marked.
///
/// The arrays borrow the bundle's read-only map instead of copying it where
/// MLX allows (the CPU build: [`Array::from_shared_bytes`]); each keeps the
/// map alive, so the weights stay valid after `bundle` is dropped. Pages are
/// read from the file on first use (the first forward pass), not here.
pub fn weights_from_bundle(bundle: &Bundle, compute_dtype: Dtype) -> Result<(Weights, u64)> {
    let mut weights = Weights::new(compute_dtype);
    let mut bytes = 0u64;
    let file = bundle.shared_bytes();
    let rows16_groups = rows16_groups(bundle)?;
    for t in bundle.tensors() {
        let name = t.name();
        let bad = |message: String| Error::Weight { name: name.to_string(), message };
        match t.layout() {
            LAYOUT_ROW_MAJOR => {}
            LAYOUT_ROWS16 if t.quantization().is_some() || rows16_groups.contains(name) => {}
            LAYOUT_ROWS16 => {
                return Err(bad("has layout rows16 but is neither a quantized weight nor its scales or biases".into()));
            }
            other => return Err(bad(format!("has layout {other:?}, which this runtime cannot read"))),
        }
        let dtype = mlx_dtype(t.dtype()).ok_or_else(|| bad(format!("has dtype {:?}", t.dtype())))?;
        let shape = t
            .shape()
            .iter()
            .map(|&d| i32::try_from(d).map_err(|_| bad(format!("dimension {d} is too large"))))
            .collect::<Result<Vec<i32>>>()?;
        let offset = usize::try_from(t.offset()).map_err(|_| bad(format!("offset {} is too large", t.offset())))?;
        weights.insert(name, Array::from_shared_bytes(&file, offset, &shape, dtype)?);
        bytes += t.byte_len();
        if let Some(q) = t.quantization() {
            let prefix = name
                .strip_suffix(".weight")
                .ok_or_else(|| bad("is quantized but its name does not end in .weight".into()))?;
            let expected_scales = format!("{prefix}.scales");
            let expected_biases = format!("{prefix}.biases");
            if q.scales != expected_scales || q.biases.is_some_and(|b| b != expected_biases) {
                return Err(bad(format!(
                    "names its scales/biases {:?}/{:?}; the runtime expects {expected_scales}/{expected_biases}",
                    q.scales, q.biases
                )));
            }
            let mode = quant_mode(q.mode).ok_or_else(|| bad(format!("has unknown quantization mode {:?}", q.mode)))?;
            let layout = if t.layout() == LAYOUT_ROWS16 { WeightLayout::Rows16 } else { WeightLayout::RowMajor };
            weights.mark_quantized(
                prefix,
                QuantSpec { group_size: q.group_size as i32, bits: q.bits as i32, mode, layout },
            );
        }
    }
    Ok((weights, bytes))
}

/// The scales and biases of the bundle's `rows16` weights, after checking
/// that each such weight is one the CPU kernels read in that layout (affine,
/// 4- or 8-bit, 2-D with a multiple of 16 rows) and that its scales and
/// biases are in the same layout.
fn rows16_groups(bundle: &Bundle) -> Result<std::collections::HashSet<String>> {
    let mut names = std::collections::HashSet::new();
    for t in bundle.tensors().filter(|t| t.layout() == LAYOUT_ROWS16) {
        let Some(q) = t.quantization() else { continue };
        let bad = |message: String| Error::Weight { name: t.name().to_string(), message };
        let shape = t.shape();
        if q.mode != "affine" || !matches!(q.bits, 4 | 8) || shape.len() != 2 || shape[0] % 16 != 0 {
            return Err(bad(format!(
                "has layout rows16, which needs affine 4- or 8-bit codes of a 2-D matrix with a multiple of 16 \
                 rows, not {} {}-bit codes of shape {shape:?}",
                q.mode, q.bits
            )));
        }
        for part in std::iter::once(q.scales).chain(q.biases) {
            let layout = bundle.tensor(part).map(|p: TensorView<'_>| p.layout());
            if layout != Some(LAYOUT_ROWS16) {
                return Err(bad(format!("has layout rows16 but its {part} has layout {layout:?}")));
            }
            names.insert(part.to_string());
        }
    }
    Ok(names)
}

/// Opens the bundle at `path` and builds everything generation needs, on
/// the backend `options.backend_kind` names.
pub fn load_backend(path: &Path, options: &LoadOptions) -> Result<LoadedModel<Box<dyn Backend>>> {
    match options.backend_kind {
        BackendKind::Mlx => Ok(load(path, options)?.map_backend(|b| Box::new(b) as Box<dyn Backend>)),
        BackendKind::Iree => load_iree(path, options),
    }
}

#[cfg(feature = "iree")]
fn load_iree(path: &Path, options: &LoadOptions) -> Result<LoadedModel<Box<dyn Backend>>> {
    let start = Instant::now();
    let bundle = Bundle::open(path).map_err(|e| Error::Bundle(e.to_string()))?;
    // The MLX model is only described (its weights checked, none computed):
    // what runs is the bundle's module.
    let parts = build_parts(&bundle, Dtype::F32, true)?;
    let backend = crate::iree_backend::IreeBackend::new(&bundle, &parts.config, &options.iree)?;
    // The MLX model was only described: dropped.
    parts.into_loaded(&bundle, None, start, |_| Ok(Box::new(backend) as Box<dyn Backend>))
}

#[cfg(not(feature = "iree"))]
fn load_iree(_: &Path, _: &LoadOptions) -> Result<LoadedModel<Box<dyn Backend>>> {
    Err(Error::Config(
        "this build has no IREE backend: build with `--features iree` (through scripts/iree-env.sh; \
         docs/stablehlo.md)"
            .into(),
    ))
}

impl<B> LoadedModel<B> {
    /// The same model with its backend passed through `f`.
    pub fn map_backend<C>(self, f: impl FnOnce(B) -> C) -> LoadedModel<C> {
        LoadedModel {
            backend: f(self.backend),
            tokenizer: self.tokenizer,
            chat_template: self.chat_template,
            defaults: self.defaults,
            name: self.name,
            config: self.config,
            architecture: self.architecture,
            weight_bytes: self.weight_bytes,
            gpu_kernels: self.gpu_kernels,
            load_time: self.load_time,
        }
    }
}

/// Opens the bundle at `path` and builds everything generation needs, on
/// MLX (`options.backend_kind` must be [`BackendKind::Mlx`]).
pub fn load(path: &Path, options: &LoadOptions) -> Result<LoadedModel> {
    if options.backend_kind != BackendKind::Mlx {
        return Err(Error::Config(format!(
            "load builds the MLX backend, not {}: use load_backend",
            options.backend_kind.name()
        )));
    }
    let start = Instant::now();
    let bundle = Bundle::open(path).map_err(|e| Error::Bundle(e.to_string()))?;
    // Before anything runs on the GPU: MLX reads its kernel cache setting once.
    // The device is checked first so that a CPU run never queries the GPU.
    let on_gpu = mlxcel_mlx::device::default_device() == mlxcel_mlx::Device::Gpu;
    let gpu_kernels = on_gpu
        .then(GpuTarget::detect)
        .flatten()
        .map(|gpu| gpu_kernels::install(&bundle, &gpu, &options.gpu_kernels))
        .transpose()?;
    let compute = options.compute_dtype.unwrap_or_else(default_compute_dtype);
    let parts = build_parts(&bundle, compute, false)?;
    parts.into_loaded(&bundle, gpu_kernels, start, |model| MlxBackend::new(model, options.backend.clone()))
}

/// Everything [`load`] builds from a bundle but the backend: what
/// [`crate::check::check_bundle`] builds too, so that a bundle the check
/// accepts is one `load` accepts.
pub(crate) struct Parts {
    pub(crate) model: Box<dyn models::LanguageModel>,
    pub(crate) tokenizer: Tokenizer,
    pub(crate) chat_template: Option<ChatTemplate>,
    pub(crate) defaults: GenerationDefaults,
    pub(crate) config: ModelConfig,
    pub(crate) architecture: String,
    pub(crate) weight_bytes: u64,
}

impl Parts {
    /// The loaded model, its backend made from the MLX model by `backend`.
    fn into_loaded<B>(
        self,
        bundle: &Bundle,
        gpu_kernels: Option<gpu_kernels::Installed>,
        start: Instant,
        backend: impl FnOnce(Box<dyn models::LanguageModel>) -> Result<B>,
    ) -> Result<LoadedModel<B>> {
        Ok(LoadedModel {
            backend: backend(self.model)?,
            tokenizer: self.tokenizer,
            chat_template: self.chat_template,
            defaults: self.defaults,
            name: bundle.model_name().to_string(),
            config: self.config,
            architecture: self.architecture,
            weight_bytes: self.weight_bytes,
            gpu_kernels,
            load_time: start.elapsed(),
        })
    }
}

/// Builds the model, tokenizer, chat template and defaults of `bundle`, and
/// checks every token id they can produce against the embedding's rows.
/// With `validate_only`, weights derived in another dtype are described but
/// never computed (see [`Weights::validate_only`]).
pub(crate) fn build_parts(bundle: &Bundle, compute: Dtype, validate_only: bool) -> Result<Parts> {
    let architecture = bundle.architecture().to_string();
    // Refuse an unknown architecture before loading any weight.
    if Architecture::from_name(&architecture).is_none() {
        return Err(Error::UnsupportedArchitecture { found: architecture, supported: Architecture::names() });
    }
    let config = ModelConfig::from_bundle_json(&architecture, bundle.config_json())?;
    let defaults = match bundle.generation_defaults_json() {
        Some(text) => GenerationDefaults::from_json(text)?,
        None => GenerationDefaults::default(),
    };
    let tokenizer_json =
        bundle.tokenizer_json().ok_or_else(|| Error::Bundle("the bundle has no tokenizer.json section".into()))?;
    // Borrowed from the map, like the weights: Gemma 3's section is 28 MB.
    let compiled_tokenizer = bundle.shared_section(kinds::TOKENIZER, kinds::TOKENIZER_COMPILED_KEY, "");
    // The tokenizer loads while the weights are wrapped.
    let (tokenizer, model_parts) = std::thread::scope(|s| {
        let eos = defaults.eos_token_ids.clone();
        let bos = defaults.bos_token_id;
        let tok = s.spawn(move || load_tokenizer(compiled_tokenizer, tokenizer_json, eos, bos));
        let built = weights_from_bundle(bundle, compute).and_then(|(mut w, bytes)| {
            if validate_only {
                w.set_validate_only();
            }
            let model = models::build(&config, &w)?;
            Ok((model, bytes))
        });
        let tok = tok.join().unwrap_or_else(|_| Err(Error::Tokenizer("the tokenizer thread panicked".into())));
        (tok, built)
    });
    let (mut tokenizer, max_id) = tokenizer?;
    if let Some(section) = bundle.shared_section(kinds::TOKENIZER, kinds::TOKENIZER_TOKEN_BYTES_KEY, "") {
        tokenizer.set_token_bytes_section(section);
    }
    let (model, weight_bytes) = model_parts?;
    crate::check::token_ids_fit(max_id, &defaults, config.vocab_size)?;
    let chat_template = bundle.chat_template().map(ChatTemplate::new).transpose()?;
    Ok(Parts { model, tokenizer, chat_template, defaults, config, architecture, weight_bytes })
}

/// The bundle's compiled tokenizer when it has one this build reads, else
/// `tokenizer.json` through `tokenizers` (a hundred milliseconds to a
/// second); with the largest token id it can produce. Errors say they come
/// from the bundle's section.
fn load_tokenizer(
    compiled: Option<impl AsRef<[u8]> + Send + Sync + 'static>,
    json: &[u8],
    eos: Vec<u32>,
    bos: Option<u32>,
) -> Result<(Tokenizer, Option<u32>)> {
    if let Some(section) = compiled {
        match Tokenizer::from_compiled(section, eos.clone(), bos) {
            Ok(t) => {
                let max = t.max_token_id();
                return Ok((t, max));
            }
            // A newer compiler's layout: tokenizer.json still says the same.
            Err(mlxcel_tokenizer::TokenizerError::UnsupportedVersion { .. }) => {}
            Err(e) => {
                return Err(Error::BundleTokenizer { section: kinds::TOKENIZER_COMPILED_KEY, message: e.to_string() });
            }
        }
    }
    // Its errors already say they come from the bundle's tokenizer.json.
    let tokenizer = Tokenizer::from_json(json, eos, bos)?;
    let max = tokenizer.max_token_id();
    Ok((tokenizer, max))
}

/// The dtype activations use unless told otherwise: f32 on every device.
/// On the GPU bf16 would be faster, but SmolLM2's top two logits after
/// "What is the capital of France?" are 0.08 apart and bf16 activations
/// pick the other one; a faster dtype is the caller's choice
/// ([`LoadOptions::compute_dtype`]).
pub fn default_compute_dtype() -> Dtype {
    Dtype::F32
}
