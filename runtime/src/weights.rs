//! A model's tensors by canonical (Hugging Face) name, as MLX arrays, and the
//! builders that turn them into layers.
//!
//! The model code (`mlxcel_models`) takes what it needs through scoped views
//! over this set (its [`Loader`]), so that names fall out of the model's
//! structure (`model` → `layers` → `3` → `self_attn` → `q_proj`) instead of
//! being formatted by hand. Every take is recorded, so that
//! [`Weights::check_all_used`] can refuse a bundle whose tensors the
//! architecture does not account for (a sign of a name-mapping bug).

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};

use mlxcel_mlx::{Array, Dtype, Linear, QuantMode, Quantized, Weight, WeightLayout};
use mlxcel_models::Loader;
use mlxcel_models::rope::RopeSpec;

use crate::error::{Error, Result};
use crate::models::Mlx;
use crate::nn::{Embedding, RmsNorm, Rope};

/// How a quantized weight is stored (its scales and biases sit beside it as
/// `<prefix>.scales` and `<prefix>.biases`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuantSpec {
    /// Inputs per group.
    pub group_size: i32,
    /// Bits per code.
    pub bits: i32,
    /// The MLX quantization mode.
    pub mode: QuantMode,
    /// How the codes, scales and biases are arranged.
    pub layout: WeightLayout,
}

/// The tensors of one model.
pub struct Weights {
    tensors: HashMap<String, Array>,
    quantized: HashMap<String, QuantSpec>,
    compute_dtype: Dtype,
    used: RefCell<BTreeSet<String>>,
    /// Arrays computed from stored tensors (dtype conversions, folded gains),
    /// evaluated together by [`Weights::materialize`].
    derived: RefCell<Vec<Array>>,
    /// Set by [`Weights::set_validate_only`]: derived arrays are never
    /// evaluated.
    validate_only: bool,
}

impl Weights {
    /// An empty set; float tensors are converted to `compute_dtype` when taken.
    pub fn new(compute_dtype: Dtype) -> Weights {
        Weights {
            tensors: HashMap::new(),
            quantized: HashMap::new(),
            compute_dtype,
            used: RefCell::new(BTreeSet::new()),
            derived: RefCell::new(Vec::new()),
            validate_only: false,
        }
    }

    /// Makes this set describe the model without computing anything: the
    /// names, dtypes and shapes are checked as for a real load, but arrays
    /// derived from the weights (dtype conversions, folded gains) stay lazy
    /// and [`Weights::materialize`] evaluates nothing. For a check of a
    /// whole bundle (a bf16 model on the CPU would otherwise be converted to
    /// f32, doubling its memory).
    pub fn set_validate_only(&mut self) {
        self.validate_only = true;
    }

    /// The dtype activations are computed in.
    pub fn compute_dtype(&self) -> Dtype {
        self.compute_dtype
    }

    /// Adds a tensor under its canonical name.
    pub fn insert(&mut self, name: impl Into<String>, array: Array) {
        self.tensors.insert(name.into(), array);
    }

    /// Marks `<prefix>.weight` as quantized with `spec`.
    pub fn mark_quantized(&mut self, prefix: impl Into<String>, spec: QuantSpec) {
        self.quantized.insert(prefix.into(), spec);
    }

    /// Whether a tensor exists.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Names of all tensors.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// The tensor `name` as stored.
    pub fn raw(&self, name: &str) -> Result<Array> {
        let a = self
            .tensors
            .get(name)
            .ok_or_else(|| Error::Weight { name: name.to_string(), message: "missing from the bundle".into() })?;
        self.used.borrow_mut().insert(name.to_string());
        Ok(a.clone())
    }

    /// The float tensor `name` in the compute dtype, checked against `shape`.
    pub fn float(&self, name: &str, shape: &[i32]) -> Result<Array> {
        let a = self.raw(name)?;
        if !a.dtype().is_float() {
            return Err(Error::Weight {
                name: name.into(),
                message: format!("is {}, expected a float tensor", a.dtype()),
            });
        }
        if a.shape() != shape {
            return Err(Error::Weight {
                name: name.into(),
                message: format!("has shape {:?}, the config implies {:?}", a.shape(), shape),
            });
        }
        self.to_compute(a)
    }

    fn to_compute(&self, a: Array) -> Result<Array> {
        Ok(if a.dtype() == self.compute_dtype { a } else { self.derive(a.astype(self.compute_dtype)?) })
    }

    /// Records an array computed from weights, so that it is evaluated at load
    /// rather than at the first token.
    fn derive(&self, a: Array) -> Array {
        if !self.validate_only {
            self.derived.borrow_mut().push(a.clone());
        }
        a
    }

    /// Evaluates every derived array in one pass.
    pub fn materialize(&self) -> Result<()> {
        let derived = std::mem::take(&mut *self.derived.borrow_mut());
        Array::eval_all(&derived.iter().collect::<Vec<_>>())?;
        Ok(())
    }

    /// The quantized matrix `<prefix>` of logical shape `[..lead, rows, cols]`.
    fn quantized_weight(&self, prefix: &str, spec: QuantSpec, lead: &[i32], rows: i32, cols: i32) -> Result<Quantized> {
        let name = format!("{prefix}.weight");
        let weight = self.raw(&name)?;
        let packed_cols = cols * spec.bits / 32;
        let packed: Vec<i32> = lead.iter().copied().chain([rows, packed_cols]).collect();
        if weight.dtype() != Dtype::U32 || weight.shape() != packed {
            return Err(Error::Weight {
                name,
                message: format!(
                    "is {} {:?}, expected u32 {packed:?} for {}-bit codes of a {:?} matrix",
                    weight.dtype(),
                    weight.shape(),
                    spec.bits,
                    lead.iter().copied().chain([rows, cols]).collect::<Vec<_>>()
                ),
            });
        }
        let groups: Vec<i32> = lead.iter().copied().chain([rows, cols / spec.group_size]).collect();
        let keep_16_bit = lead.is_empty() && self.kernels_read_16_bit();
        let mut scales = self.float_or_16_bit(&format!("{prefix}.scales"), &groups, keep_16_bit)?;
        let mut biases = match spec.mode {
            QuantMode::Affine => Some(self.float_or_16_bit(&format!("{prefix}.biases"), &groups, keep_16_bit)?),
            _ => None,
        };
        let (mut weight, mut layout) = (weight, spec.layout);
        if layout == WeightLayout::Rows16 && !self.kernels_read_quantized() {
            // MLX's own ops read only row-major: undo the compiler's blocks
            // once, here (a copy of the matrix; the CPU kernels never need it).
            // Codes are rearranged as bytes, scales and biases as elements.
            let group_count = (cols / spec.group_size) as usize;
            weight = rows16_to_row_major(&name, &weight, packed_cols as usize * 4, 1)?;
            scales = rows16_to_row_major(prefix, &scales, group_count, scales.dtype().size())?;
            biases = biases.map(|b| rows16_to_row_major(prefix, &b, group_count, b.dtype().size())).transpose()?;
            layout = WeightLayout::RowMajor;
        }
        Ok(Quantized { weight, scales, biases, group_size: spec.group_size, bits: spec.bits, mode: spec.mode, layout })
    }

    /// The float tensor `name`: f16 or bf16 as stored with `keep_16_bit`
    /// (mlxcel's kernels widen 16-bit weights, scales and biases exactly as
    /// they read them, so the products are unchanged and the bytes halved: a
    /// GGUF Q4_0/Q8_0 transcode stores f16 scales), otherwise in the compute
    /// dtype (MLX's own ops want the activations' dtype).
    fn float_or_16_bit(&self, name: &str, shape: &[i32], keep_16_bit: bool) -> Result<Array> {
        if keep_16_bit {
            let a = self.raw(name)?;
            if matches!(a.dtype(), Dtype::F16 | Dtype::BF16) && a.shape() == shape {
                return Ok(a);
            }
        }
        self.float(name, shape)
    }

    /// The matrix `<prefix>.weight` of logical shape `[..lead, rows, cols]`,
    /// float or quantized as the bundle stores it. A 2-D f16 or bf16 matrix
    /// stays as stored (borrowed from the bundle, half the bytes of f32) when
    /// mlxcel's float kernels will read it: f32 compute on the CPU with the
    /// kernels on. They widen it to f32 exactly as they read it, so the
    /// products are those of the f32 conversion (docs/kernels.md "Float
    /// weights"); otherwise it is converted to the compute dtype at load.
    fn matrix(&self, prefix: &str, lead: &[i32], rows: i32, cols: i32) -> Result<Weight> {
        match self.quantized.get(prefix) {
            Some(&spec) => Ok(Weight::Quantized(self.quantized_weight(prefix, spec, lead, rows, cols)?)),
            None => {
                let name = format!("{prefix}.weight");
                let shape: Vec<i32> = lead.iter().copied().chain([rows, cols]).collect();
                let keep_16_bit = lead.is_empty() && self.kernels_read_16_bit();
                Ok(Weight::Dense(self.float_or_16_bit(&name, &shape, keep_16_bit)?))
            }
        }
    }

    /// Whether quantized matrices go to mlxcel's kernels (which read the
    /// `rows16` layout as stored): the CPU and the kernels not turned off.
    fn kernels_read_quantized(&self) -> bool {
        mlxcel_mlx::device::default_device() == mlxcel_mlx::Device::Cpu
            && mlxcel_mlx::fast::default_path() != mlxcel_mlx::fast::Path::Mlx
    }

    /// Whether 2-D 16-bit float matrices go to mlxcel's float kernels as
    /// stored: f32 compute, the CPU, and the kernels not turned off
    /// (`MLXCEL_KERNELS=mlx` keeps the reference path's f32 weights).
    fn kernels_read_16_bit(&self) -> bool {
        self.compute_dtype == Dtype::F32
            && mlxcel_mlx::device::default_device() == mlxcel_mlx::Device::Cpu
            && mlxcel_mlx::fast::default_path() != mlxcel_mlx::fast::Path::Mlx
    }

    /// Fails when a tensor was never taken by the architecture.
    pub fn check_all_used(&self, architecture: &str) -> Result<()> {
        let used = self.used.borrow();
        let unused: Vec<&str> = self.tensors.keys().map(String::as_str).filter(|n| !used.contains(*n)).collect();
        if unused.is_empty() {
            return Ok(());
        }
        let mut unused = unused;
        unused.sort_unstable();
        let shown: Vec<&str> = unused.iter().take(8).copied().collect();
        Err(Error::Weight {
            name: shown.join(", "),
            message: format!(
                "{} tensor(s) in the bundle are not used by the {architecture} architecture{}",
                unused.len(),
                if unused.len() > shown.len() { " (first 8 shown)" } else { "" }
            ),
        })
    }
}

/// MLX's weights for the model code (`mlxcel_models`), which names them
/// through its scopes: `model.layers.3.self_attn.q_proj` and so on.
impl Loader<Mlx> for Weights {
    fn has_weight(&self, name: &str) -> bool {
        self.contains(&format!("{name}.weight"))
    }

    fn linear(&self, name: &str, inputs: usize, outputs: usize, bias: bool) -> Result<Linear> {
        let (inputs, outputs) = (dim(name, inputs)?, dim(name, outputs)?);
        let bias = if bias { Some(self.float(&format!("{name}.bias"), &[outputs])?) } else { None };
        Ok(Linear { weight: self.matrix(name, &[], outputs, inputs)?, bias })
    }

    fn experts(&self, name: &str, count: usize, inputs: usize, outputs: usize) -> Result<Weight> {
        self.matrix(name, &[dim(name, count)?], dim(name, outputs)?, dim(name, inputs)?)
    }

    fn embedding(&self, name: &str, vocab: usize, width: usize, scale: f32) -> Result<Embedding> {
        Ok(Embedding::new(self.matrix(name, &[], dim(name, vocab)?, dim(name, width)?)?, scale))
    }

    fn rms_norm(&self, name: &str, features: usize, eps: f32, offset: bool) -> Result<RmsNorm> {
        let w = self.float(&format!("{name}.weight"), &[dim(name, features)?])?;
        let weight = if offset { self.derive(w.add_scalar(1.0)?) } else { w };
        Ok(RmsNorm { weight, eps })
    }

    fn rope(&self, spec: &RopeSpec) -> Result<Rope> {
        Rope::new(spec)
    }
}

/// A size of the config as MLX's `i32` (a config that overflows it names
/// the tensor it was for).
fn dim(name: &str, n: usize) -> Result<i32> {
    i32::try_from(n)
        .map_err(|_| Error::Weight { name: name.to_string(), message: format!("size {n} is beyond 32-bit shapes") })
}

/// `a` (rows of `cols` elements of `elem` bytes in blocks of 16, the `rows16`
/// layout) in row-major order, as a new array.
fn rows16_to_row_major(name: &str, a: &Array, cols: usize, elem: usize) -> Result<Array> {
    let bytes = a.to_bytes()?;
    let rows = mlxcel_bundle::rows16::to_row_major(&bytes, cols, elem)
        .map_err(|e| Error::Weight { name: name.to_string(), message: e.to_string() })?;
    Ok(Array::from_bytes(&rows, &a.shape(), a.dtype())?)
}
