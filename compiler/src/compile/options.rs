//! What `--quantize` and the other options ask for, and the stored form each
//! tensor takes under them ([`plan`]).

use std::fmt;
use std::str::FromStr;

use serde_json::{Value, json};

use super::{CompileError, Result};
use crate::cuda::CudaKernelOptions;
use crate::ingest::gguf::quant::GgmlType;
use crate::ingest::{FloatDtype, Storage, TensorInfo};

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

/// How quantized weights are arranged in the bundle (`--weight-layout`;
/// [`WeightLayoutChoice`] is the flag, with `auto`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightLayout {
    /// MLX's row-major layout for every tensor: what MLX's own ops (a GPU)
    /// read. The library's default ([`CompileOptions::default`]).
    #[default]
    RowMajor,
    /// The `rows16` layout wherever it applies (affine 4- and 8-bit matrices
    /// with a multiple of 16 rows): mlxcel's CPU kernels then read the 16
    /// rows' codes of one input as one vector, for one sequence or a whole
    /// decode batch (on SmolLM2 Q4_0, 2 threads: 1.6x row-major's decode of one
    /// sequence, 1.6-1.8x of 4 to 16). Runtimes that use MLX's own ops (a GPU)
    /// rearrange such weights back at load.
    Rows16,
}

/// What `--weight-layout` asks for: `auto` (the default) or a layout.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightLayoutChoice {
    /// [`WeightLayoutChoice::resolve`] picks.
    #[default]
    Auto,
    /// This layout.
    Given(WeightLayout),
}

impl WeightLayoutChoice {
    /// The layout to write. `auto` is `rows16`, whose decode is faster on
    /// every x86 build of mlxcel's kernels measured (docs/benchmarks.md,
    /// "Weight layouts"; AVX2's prefill is ~0.8x), except for a bundle
    /// compiled for a GPU or IREE (`row_major_targets`: `--target cuda-*`,
    /// `--target iree-*`): MLX's GPU ops and the IREE graphs read only
    /// row-major, and the runtime would rearrange every matrix at load.
    pub fn resolve(self, row_major_targets: bool) -> WeightLayout {
        match self {
            WeightLayoutChoice::Given(layout) => layout,
            WeightLayoutChoice::Auto if row_major_targets => WeightLayout::RowMajor,
            WeightLayoutChoice::Auto => WeightLayout::Rows16,
        }
    }
}

impl FromStr for WeightLayoutChoice {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(WeightLayoutChoice::Auto),
            "rows16" => Ok(WeightLayoutChoice::Given(WeightLayout::Rows16)),
            "row-major" => Ok(WeightLayoutChoice::Given(WeightLayout::RowMajor)),
            other => Err(format!("unknown weight layout {other:?}: use auto, rows16 or row-major")),
        }
    }
}

impl FromStr for WeightLayout {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "rows16" => Ok(WeightLayout::Rows16),
            "row-major" => Ok(WeightLayout::RowMajor),
            other => Err(format!("unknown weight layout {other:?}: use rows16 or row-major")),
        }
    }
}

impl fmt::Display for WeightLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WeightLayout::Rows16 => "rows16",
            WeightLayout::RowMajor => "row-major",
        })
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
    /// How quantized weights are arranged.
    pub weight_layout: WeightLayout,
    /// MLX's run-time-compiled CUDA kernels to compile and store
    /// (`--target cuda-smXY`; crate::cuda).
    pub cuda: Option<CudaKernelOptions>,
    /// The model traced into StableHLO and compiled by IREE (`--target iree-*`).
    pub iree: Option<super::IreeOptions>,
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
            weight_layout: WeightLayout::RowMajor,
            cuda: None,
            iree: None,
        }
    }
}

impl CompileOptions {
    /// Refuses options that cannot be honoured, naming the flag.
    pub(super) fn validate(&self) -> Result<()> {
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
        if self.cuda.as_ref().is_some_and(|c| c.targets.is_empty()) {
            return Err(CompileError::Options("CUDA kernels asked for without a --target".into()));
        }
        if let Some(iree) = &self.iree {
            if iree.targets.is_empty() {
                return Err(CompileError::Options("IREE graphs asked for without a --target iree-*".into()));
            }
            if self.weight_layout == WeightLayout::Rows16 {
                return Err(CompileError::Options(
                    "--weight-layout rows16 with --target iree-*: the IREE graphs read row-major weights \
                     (use --weight-layout auto or row-major)"
                        .into(),
                ));
            }
            if iree.context == Some(0) {
                return Err(CompileError::Options("--iree-context 0: the caches need at least one position".into()));
            }
        }
        Ok(())
    }

    /// The options as the bundle's provenance records them.
    pub(super) fn to_json(&self) -> Value {
        let mut options = json!({
            "quantize": self.quantize.to_string(),
            "group_size": self.group_size,
            "keep_source_quant": self.keep_source_quant,
            "embedding_bits": self.embedding_bits,
            "chat_template_given": self.chat_template.is_some(),
            "weight_layout": self.weight_layout.to_string(),
        });
        // Only when asked for: bundles without kernels keep their bytes.
        let mut targets: Vec<String> = Vec::new();
        if let Some(cuda) = &self.cuda {
            targets.extend(cuda.targets.iter().map(ToString::to_string));
        }
        if let Some(iree) = &self.iree {
            targets.extend(iree.targets.iter().map(ToString::to_string));
            options["iree_context"] = json!(iree.context);
        }
        if !targets.is_empty() {
            options["targets"] = json!(targets);
        }
        options
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

/// A mixture-of-experts router (`mlp.gate`, not a dense `mlp.gate_proj`).
fn is_router(name: &str) -> bool {
    name.ends_with(".mlp.gate.weight")
}

/// The width and group of a quantized router: mlx-lm's (its Qwen3-MoE
/// `quant_predicate`), so that `--quantize qN` of a float mixture stores
/// what `mlx_lm.convert -q` does. Routing picks experts by rank, and a
/// coarse router would change which experts a token reaches; the router is
/// tiny (experts × hidden). Falls back to `--group-size` where 64 does not
/// divide the columns.
const ROUTER_BITS: u32 = 8;
const ROUTER_GROUP: u32 = 64;

/// Whether a tensor is a weight matrix: 2-D, or a stack of experts' matrices
/// (`switch_mlp`, `[experts, out, in]`, quantized along the last axis).
fn is_matrix(info: &TensorInfo) -> bool {
    let stacked = info.shape.len() == 3 && info.name.contains(".switch_mlp.");
    (info.shape.len() == 2 || stacked) && info.name.ends_with(".weight") && !info.name.contains("norm")
}

/// The form a tensor takes under `options`.
pub fn plan(info: &TensorInfo, options: &CompileOptions) -> TensorPlan {
    let matrix = is_matrix(info);
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
        QuantizeTarget::Affine(_) if is_router(&info.name) => {
            let cols = info.shape.last().copied().unwrap_or(0);
            let group_size = if cols.is_multiple_of(ROUTER_GROUP as usize) { ROUTER_GROUP } else { options.group_size };
            TensorPlan::Quantize { bits: ROUTER_BITS, group_size }
        }
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

/// The stored form of a tensor a surgery changed: blocks kept from the source
/// are requantized at their own width and group; a quantized form whose group
/// no longer divides the columns (after removing channels) falls back to f32.
pub(super) fn edited_plan(p: &TensorPlan, info: &TensorInfo, shape: &[usize]) -> TensorPlan {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weight_layout_auto_is_rows16_unless_for_a_gpu() {
        let auto: WeightLayoutChoice = "auto".parse().unwrap();
        assert_eq!(auto, WeightLayoutChoice::default());
        assert_eq!(auto.resolve(false), WeightLayout::Rows16);
        assert_eq!(auto.resolve(true), WeightLayout::RowMajor);
        for (name, layout) in [("rows16", WeightLayout::Rows16), ("row-major", WeightLayout::RowMajor)] {
            let given: WeightLayoutChoice = name.parse().unwrap();
            assert_eq!((given.resolve(false), given.resolve(true)), (layout, layout), "{name}");
            assert_eq!(layout.to_string(), name);
        }
        let err = "rows8".parse::<WeightLayoutChoice>().unwrap_err();
        assert_eq!(err, "unknown weight layout \"rows8\": use auto, rows16 or row-major");
    }
}
