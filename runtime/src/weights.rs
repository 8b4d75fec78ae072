//! A model's tensors by canonical (Hugging Face) name, as MLX arrays, and the
//! builders that turn them into layers.
//!
//! Architectures take what they need by name; every take is recorded, so that
//! [`Weights::check_all_used`] can refuse a bundle whose tensors the
//! architecture does not account for (a sign of a name-mapping bug).

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};

use mlxcel_mlx::{Array, Dtype, QuantMode, Quantized};

use crate::error::{Error, Result};
use crate::nn::{Embedding, Linear, RmsNorm};

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
        }
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
        self.derived.borrow_mut().push(a.clone());
        a
    }

    /// Evaluates every derived array in one pass.
    pub fn materialize(&self) -> Result<()> {
        let derived = std::mem::take(&mut *self.derived.borrow_mut());
        Array::eval_all(&derived.iter().collect::<Vec<_>>())?;
        Ok(())
    }

    fn quantized_weight(&self, prefix: &str, spec: QuantSpec, rows: i32, cols: i32) -> Result<Quantized> {
        let name = format!("{prefix}.weight");
        let weight = self.raw(&name)?;
        let packed_cols = cols * spec.bits / 32;
        if weight.dtype() != Dtype::U32 || weight.shape() != [rows, packed_cols] {
            return Err(Error::Weight {
                name,
                message: format!(
                    "is {} {:?}, expected u32 [{rows}, {packed_cols}] for {}-bit codes of a [{rows}, {cols}] matrix",
                    weight.dtype(),
                    weight.shape(),
                    spec.bits
                ),
            });
        }
        let groups = cols / spec.group_size;
        let scales = self.float(&format!("{prefix}.scales"), &[rows, groups])?;
        let biases = match spec.mode {
            QuantMode::Affine => Some(self.float(&format!("{prefix}.biases"), &[rows, groups])?),
            _ => None,
        };
        Ok(Quantized { weight, scales, biases, group_size: spec.group_size, bits: spec.bits, mode: spec.mode })
    }

    /// The linear layer `<prefix>` mapping `inputs` to `outputs` features.
    pub fn linear(&self, prefix: &str, inputs: i32, outputs: i32, bias: bool) -> Result<Linear> {
        let bias = if bias { Some(self.float(&format!("{prefix}.bias"), &[outputs])?) } else { None };
        match self.quantized.get(prefix) {
            Some(&spec) => {
                Ok(Linear::Quantized { weight: self.quantized_weight(prefix, spec, outputs, inputs)?, bias })
            }
            None => Ok(Linear::Dense { weight: self.float(&format!("{prefix}.weight"), &[outputs, inputs])?, bias }),
        }
    }

    /// The embedding table `<prefix>` of `vocab` rows of `dim`.
    pub fn embedding(&self, prefix: &str, vocab: i32, dim: i32) -> Result<Embedding> {
        match self.quantized.get(prefix) {
            Some(&spec) => Ok(Embedding::Quantized(self.quantized_weight(prefix, spec, vocab, dim)?)),
            None => Ok(Embedding::Dense(self.float(&format!("{prefix}.weight"), &[vocab, dim])?)),
        }
    }

    /// The RMS norm `<prefix>` over `dim` features.
    pub fn rms_norm(&self, prefix: &str, dim: i32, eps: f32) -> Result<RmsNorm> {
        Ok(RmsNorm { weight: self.float(&format!("{prefix}.weight"), &[dim])?, eps })
    }

    /// An RMS norm stored as an offset from one (Gemma: the gain is `1 + w`).
    pub fn rms_norm_offset(&self, prefix: &str, dim: i32, eps: f32) -> Result<RmsNorm> {
        let w = self.float(&format!("{prefix}.weight"), &[dim])?;
        Ok(RmsNorm { weight: self.derive(w.add_scalar(1.0)?), eps })
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
