//! The weights of the layers model code is built from: a linear map's
//! matrix, float or quantized, and its bias.
//!
//! Model code holds these and calls [`crate::fast::linear`],
//! [`crate::fast::linear_heads`], [`crate::fast::gated_linear`] and
//! [`crate::fast::embedding`]; whether a call becomes one of mlxcel's fused
//! kernels or MLX's own ops is decided there, never in model code.

use crate::array::Array;
use crate::ops::Quantized;

/// The matrix of a linear map `[out, in]`, or of an embedding table `[vocab, dim]`.
#[derive(Clone, Debug)]
pub enum Weight {
    /// Floats.
    Dense(Array),
    /// Quantized along its rows (MLX's layout: packed codes, scales, biases).
    Quantized(Quantized),
}

impl Weight {
    /// Rows of the logical matrix (a linear map's outputs, a table's entries).
    pub fn rows(&self) -> i32 {
        match self {
            Weight::Dense(w) => w.shape()[0],
            Weight::Quantized(q) => q.weight.shape()[0],
        }
    }

    /// Columns of the logical matrix (a linear map's inputs).
    pub fn cols(&self) -> i32 {
        match self {
            Weight::Dense(w) => w.shape()[1],
            Weight::Quantized(q) => q.weight.shape()[1] * 32 / q.bits,
        }
    }

    /// The quantized form, if it is one.
    pub fn as_quantized(&self) -> Option<&Quantized> {
        match self {
            Weight::Quantized(q) => Some(q),
            Weight::Dense(_) => None,
        }
    }
}

/// `y = x Wᵀ (+ b)` with `W: [out, in]`.
#[derive(Clone, Debug)]
pub struct Linear {
    /// The matrix.
    pub weight: Weight,
    /// `[out]`, if the map has a bias.
    pub bias: Option<Array>,
}

impl Linear {
    /// The number of outputs.
    pub fn out_features(&self) -> i32 {
        self.weight.rows()
    }

    /// The number of inputs.
    pub fn in_features(&self) -> i32 {
        self.weight.cols()
    }

    /// The float matrix when the map is float and has no bias (what the
    /// fused float product kernels take).
    pub(crate) fn bare_dense(&self) -> Option<&Array> {
        match (&self.weight, &self.bias) {
            (Weight::Dense(w), None) => Some(w),
            _ => None,
        }
    }

    /// The quantized matrix when the map is quantized and has no bias (what
    /// the fused product kernels take).
    pub(crate) fn bare_quantized(&self) -> Option<&Quantized> {
        match (&self.weight, &self.bias) {
            (Weight::Quantized(q), None) => Some(q),
            _ => None,
        }
    }
}
