//! The manifest: everything a bundle says about itself, archived with rkyv.
//!
//! These are the owned types the writer fills in; rkyv derives their archived
//! twins (`ArchivedManifest`, `ArchivedTensorEntry`, ...) which the reader
//! validates with bytecheck and then reads in place, without copying.
//! The archived byte layout of every type is normative: it is spelled out,
//! offset by offset, in `docs/bundle-format.md`, and the `layout` tests
//! assert that these definitions still produce it. Changing a field here is
//! a format change.

use rkyv::{Archive, Deserialize, Serialize};

/// The top-level manifest record. Its archived form is the root object of
/// the manifest region (the last bytes of the file).
#[derive(
    Archive, Serialize, Deserialize, serde::Serialize, serde::Deserialize, Clone, Debug, Default, PartialEq, Eq,
)]
#[rkyv(derive(Debug))]
pub struct Manifest {
    /// What the model is and its hyperparameters.
    pub model: ModelInfo,
    /// Chat template and generation defaults (the tokenizer itself is a section).
    pub tokenizer: TokenizerInfo,
    /// Every tensor, in file order.
    pub tensors: Vec<TensorEntry>,
    /// Every non-tensor section (tokenizer.json, StableHLO, IREE vmfb, kernels, ...), in file order.
    pub sections: Vec<SectionEntry>,
    /// How the bundle was made.
    pub provenance: Provenance,
    /// Free-form key/value metadata; readers ignore keys they do not know.
    pub metadata: Vec<KeyValue>,
    /// Typed extension records added by later minor versions (see [`Extension`]).
    pub extensions: Vec<Extension>,
}

/// The model's identity and hyperparameters.
#[derive(
    Archive, Serialize, Deserialize, serde::Serialize, serde::Deserialize, Clone, Debug, Default, PartialEq, Eq,
)]
#[rkyv(derive(Debug))]
pub struct ModelInfo {
    /// Architecture name as the runtime dispatches on it, e.g. `llama`, `gemma3`, `qwen2`, `qwen3`, `phi3`.
    pub architecture: String,
    /// Human-readable model name, e.g. `SmolLM2-135M-Instruct`.
    pub name: String,
    /// Hyperparameters as normalized Hugging Face `config.json` text (a JSON object).
    pub config_json: String,
}

/// Text-side settings that are small enough to live in the manifest.
#[derive(
    Archive, Serialize, Deserialize, serde::Serialize, serde::Deserialize, Clone, Debug, Default, PartialEq, Eq,
)]
#[rkyv(derive(Debug))]
pub struct TokenizerInfo {
    /// The chat template (Jinja source), if the model has one.
    pub chat_template: Option<String>,
    /// Generation defaults as a JSON object (eos/bos ids, temperature, top_p, top_k, max tokens, ...).
    pub generation_defaults_json: Option<String>,
}

/// One tensor of the tensor table.
#[derive(
    Archive, Serialize, Deserialize, serde::Serialize, serde::Deserialize, Clone, Debug, Default, PartialEq, Eq,
)]
#[rkyv(derive(Debug))]
pub struct TensorEntry {
    /// Canonical (Hugging Face) name, e.g. `model.layers.0.self_attn.q_proj.weight`; unique in the bundle.
    pub name: String,
    /// Element type name of the stored bytes ([`crate::Dtype::as_str`]).
    pub dtype: String,
    /// Shape of the stored bytes (for a quantized weight: the packed u32 shape).
    pub shape: Vec<u64>,
    /// Absolute file offset of the data; a multiple of [`crate::ALIGNMENT`].
    pub offset: u64,
    /// Length of the data in bytes; always dtype size × product(shape).
    pub length: u64,
    /// blake3 of the data bytes.
    pub blake3: [u8; 32],
    /// How elements are arranged: [`crate::LAYOUT_ROW_MAJOR`] or a named repacked layout.
    pub layout: String,
    /// Present when this is a quantized weight.
    pub quantization: Option<Quantization>,
    /// Free-form per-tensor properties (e.g. the logical shape of a repacked layout).
    pub properties: Vec<KeyValue>,
}

/// How a quantized weight is to be dequantized. A quantized weight is three
/// tensor entries: the packed weight (this descriptor), its scales and its
/// optional biases, named here.
#[derive(
    Archive, Serialize, Deserialize, serde::Serialize, serde::Deserialize, Clone, Debug, Default, PartialEq, Eq,
)]
#[rkyv(derive(Debug))]
pub struct Quantization {
    /// Quantization mode as MLX names it, e.g. `affine`, `mxfp4`.
    pub mode: String,
    /// Bits per quantized element.
    pub bits: u32,
    /// Elements sharing one scale (and bias).
    pub group_size: u32,
    /// Name of the scales tensor.
    pub scales: String,
    /// Name of the biases tensor, if the mode has one.
    pub biases: Option<String>,
}

/// One non-tensor section: a blob keyed by kind, key and target.
#[derive(
    Archive, Serialize, Deserialize, serde::Serialize, serde::Deserialize, Clone, Debug, Default, PartialEq, Eq,
)]
#[rkyv(derive(Debug))]
pub struct SectionEntry {
    /// What the bytes are (see [`crate::kinds`]); unknown kinds are ignored by readers.
    pub kind: String,
    /// Which one of that kind, e.g. a graph name (`prefill`, `decode`) or a file name.
    pub key: String,
    /// What it runs on, e.g. `llvm-cpu:x86_64-unknown-linux-gnu:+avx2,+fma`, `cuda:sm_90`; empty if target-independent.
    pub target: String,
    /// Absolute file offset of the data; a multiple of [`crate::ALIGNMENT`].
    pub offset: u64,
    /// Length of the data in bytes.
    pub length: u64,
    /// blake3 of the data bytes.
    pub blake3: [u8; 32],
    /// Further matching keys (e.g. `mlx_version`, `cpu_features`).
    pub properties: Vec<KeyValue>,
}

/// How and from what the bundle was compiled.
#[derive(
    Archive, Serialize, Deserialize, serde::Serialize, serde::Deserialize, Clone, Debug, Default, PartialEq, Eq,
)]
#[rkyv(derive(Debug))]
pub struct Provenance {
    /// e.g. `mlxcel-compile 0.1.0`.
    pub compiler_version: String,
    /// The MLX version the bundle was compiled against, e.g. `0.32.4`.
    pub mlx_version: String,
    /// The input files.
    pub source_files: Vec<SourceFile>,
    /// The compile options as a JSON object.
    pub compile_options_json: String,
    /// The quantization recipe as a JSON object, if the compiler quantized.
    pub quantization_recipe_json: Option<String>,
    /// The weight surgery applied, if any.
    pub surgery: Option<SurgeryRecord>,
    /// Repacking transforms applied to tensors, in order.
    pub repacks: Vec<RepackRecord>,
}

/// One input file of the compile.
#[derive(
    Archive, Serialize, Deserialize, serde::Serialize, serde::Deserialize, Clone, Debug, Default, PartialEq, Eq,
)]
#[rkyv(derive(Debug))]
pub struct SourceFile {
    /// File name relative to the model source (e.g. `model-00001-of-00002.safetensors`).
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Digest as `ALGORITHM:HEX`, e.g. `blake3:af13...` or `sha256:...`.
    pub digest: String,
}

/// The weight surgery of a compile.
#[derive(
    Archive, Serialize, Deserialize, serde::Serialize, serde::Deserialize, Clone, Debug, Default, PartialEq, Eq,
)]
#[rkyv(derive(Debug))]
pub struct SurgeryRecord {
    /// The surgery YAML, verbatim.
    pub yaml: String,
    /// blake3 of the YAML's UTF-8 bytes (checked by verify).
    pub blake3: [u8; 32],
    /// Each operation in order, with the tensors it matched when recorded.
    pub operations: Vec<SurgeryOperation>,
}

/// One surgery operation.
#[derive(
    Archive, Serialize, Deserialize, serde::Serialize, serde::Deserialize, Clone, Debug, Default, PartialEq, Eq,
)]
#[rkyv(derive(Debug))]
pub struct SurgeryOperation {
    /// A short description, e.g. `scale model.layers.*.mlp.down_proj.weight by 0.5`.
    pub description: String,
    /// The tensors it matched, if the compiler recorded them.
    pub matched_tensors: Option<Vec<String>>,
}

/// One repacking transform applied at compile time.
#[derive(
    Archive, Serialize, Deserialize, serde::Serialize, serde::Deserialize, Clone, Debug, Default, PartialEq, Eq,
)]
#[rkyv(derive(Debug))]
pub struct RepackRecord {
    /// Transform name, e.g. `q4-interleave-8x`.
    pub transform: String,
    /// The layout tag the transformed tensors carry.
    pub layout: String,
    /// The tensors transformed.
    pub tensors: Vec<String>,
    /// Transform parameters as a JSON object.
    pub params_json: String,
}

/// A key/value pair of UTF-8 text.
#[derive(
    Archive, Serialize, Deserialize, serde::Serialize, serde::Deserialize, Clone, Debug, Default, PartialEq, Eq,
)]
#[rkyv(derive(Debug))]
pub struct KeyValue {
    /// The key; namespaced keys (`mlxcel.*`) are reserved for this project.
    pub key: String,
    /// The value.
    pub value: String,
}

/// A typed extension record. Later minor versions define extension names and
/// their payload encodings; a reader ignores an unknown extension unless
/// `required` is set, in which case it refuses the bundle (like PNG's
/// critical chunks).
#[derive(
    Archive, Serialize, Deserialize, serde::Serialize, serde::Deserialize, Clone, Debug, Default, PartialEq, Eq,
)]
#[rkyv(derive(Debug))]
pub struct Extension {
    /// Extension name, e.g. `mlxcel.cpu-repack`.
    pub name: String,
    /// Whether a reader that does not know `name` must refuse the bundle.
    pub required: bool,
    /// The extension's payload, in the encoding its definition gives.
    pub payload: Vec<u8>,
}

impl KeyValue {
    /// A key/value pair.
    pub fn new(key: impl Into<String>, value: impl Into<String>) -> Self {
        KeyValue { key: key.into(), value: value.into() }
    }
}
