//! What a source tensor is and what loading one gives.

use std::borrow::Cow;
use std::path::PathBuf;

use mlxcel_mlx::{Array, Dtype, QuantMode, Quantized, WeightLayout};

use super::gguf::quant::GgmlType;

/// A floating-point element type of loaded tensor data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FloatDtype {
    /// IEEE single precision.
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
}

impl FloatDtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            FloatDtype::F32 => 4,
            FloatDtype::F16 | FloatDtype::BF16 => 2,
        }
    }

    /// The MLX dtype.
    pub fn mlx(self) -> Dtype {
        match self {
            FloatDtype::F32 => Dtype::F32,
            FloatDtype::F16 => Dtype::F16,
            FloatDtype::BF16 => Dtype::BF16,
        }
    }

    /// The safetensors spelling (`F32`, `F16`, `BF16`).
    pub fn name(self) -> &'static str {
        match self {
            FloatDtype::F32 => "F32",
            FloatDtype::F16 => "F16",
            FloatDtype::BF16 => "BF16",
        }
    }
}

/// How a tensor is stored in its source file.
#[derive(Clone, Debug, PartialEq)]
pub enum Storage {
    /// Plain floats.
    Float(FloatDtype),
    /// A ggml type in a GGUF file (floats or quantized blocks).
    Gguf(GgmlType),
    /// MLX affine quantization, as mlx-lm writes it (`weight` packed u32,
    /// `scales`, `biases`).
    MlxAffine {
        /// Bits per code.
        bits: u32,
        /// Elements per group.
        group_size: usize,
        /// The dtype of the scales and biases.
        scales: FloatDtype,
    },
}

/// A source tensor: its canonical name, logical shape and storage.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    /// The canonical Hugging Face name (`model.layers.0.self_attn.q_proj.weight`).
    pub name: String,
    /// The name in the source file (`blk.0.attn_q.weight` in a GGUF).
    pub source_name: String,
    /// The file that holds the data.
    pub file: PathBuf,
    /// The logical (dequantized) shape, row-major, Hugging Face order.
    pub shape: Vec<usize>,
    /// How the data is stored.
    pub storage: Storage,
    /// The byte offset of the data in the file.
    pub offset: u64,
    /// The byte length of the data (for MLX-quantized tensors: the packed weight's).
    pub nbytes: u64,
}

impl TensorInfo {
    /// The number of elements.
    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// The `(bits, group_size)` of the affine form this tensor loads as
    /// without loss ([`TensorData::Affine`]), if it has one.
    pub fn lossless_affine(&self) -> Option<(u32, usize)> {
        match &self.storage {
            Storage::Gguf(t) => t.affine_bits().map(|b| (b, super::gguf::quant::AFFINE_GROUP)),
            Storage::MlxAffine { bits, group_size, .. } => Some((*bits, *group_size)),
            Storage::Float(_) => None,
        }
    }
}

/// Float tensor data, borrowed from the source's memory map where possible.
#[derive(Clone, Debug, PartialEq)]
pub struct FloatTensor<'a> {
    /// The element type.
    pub dtype: FloatDtype,
    /// The shape, row-major.
    pub shape: Vec<usize>,
    /// The elements, little-endian.
    pub data: Cow<'a, [u8]>,
}

impl FloatTensor<'_> {
    /// An owned f32 tensor.
    pub fn from_f32(shape: Vec<usize>, values: &[f32]) -> FloatTensor<'static> {
        FloatTensor {
            dtype: FloatDtype::F32,
            shape,
            data: Cow::Owned(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
        }
    }

    /// The elements converted to f32 (exact for every float type).
    pub fn to_f32(&self) -> Vec<f32> {
        let d = &self.data;
        match self.dtype {
            FloatDtype::F32 => d.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            FloatDtype::F16 => d.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            FloatDtype::BF16 => d.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        }
    }

    /// An MLX array holding a copy of the data.
    pub fn to_array(&self) -> mlxcel_mlx::Result<Array> {
        let shape: Vec<i32> = self.shape.iter().map(|&d| d as i32).collect();
        Array::from_bytes(&self.data, &shape, self.dtype.mlx())
    }

    /// Takes ownership of borrowed data.
    pub fn into_owned(self) -> FloatTensor<'static> {
        FloatTensor { dtype: self.dtype, shape: self.shape, data: Cow::Owned(self.data.into_owned()) }
    }
}

/// An MLX affine-quantized tensor: `w = scale · code + bias` per group of
/// `group_size` elements along the last axis.
#[derive(Clone, Debug, PartialEq)]
pub struct AffineTensor<'a> {
    /// The logical (dequantized) shape.
    pub shape: Vec<usize>,
    /// Bits per code.
    pub bits: u32,
    /// Elements per group.
    pub group_size: usize,
    /// The packed codes as little-endian u32 words, shape
    /// `[.., rows, cols · bits / 32]`.
    pub weight: Cow<'a, [u8]>,
    /// One scale per group, shape `[.., rows, cols / group_size]`.
    pub scales: FloatTensor<'a>,
    /// One bias per group, same shape as the scales.
    pub biases: FloatTensor<'a>,
}

impl AffineTensor<'_> {
    /// The packed weight's shape.
    pub fn weight_shape(&self) -> Vec<usize> {
        let mut s = self.shape.clone();
        if let Some(last) = s.last_mut() {
            *last = *last * self.bits as usize / 32;
        }
        s
    }

    /// The packed words.
    pub fn words(&self) -> Vec<u32> {
        self.weight.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    }

    /// The MLX triple (copies of the data).
    pub fn to_quantized(&self) -> mlxcel_mlx::Result<Quantized> {
        let ws: Vec<i32> = self.weight_shape().iter().map(|&d| d as i32).collect();
        Ok(Quantized {
            weight: Array::from_bytes(&self.weight, &ws, Dtype::U32)?,
            scales: self.scales.to_array()?,
            biases: Some(self.biases.to_array()?),
            group_size: self.group_size as i32,
            bits: self.bits as i32,
            mode: QuantMode::Affine,
            layout: WeightLayout::RowMajor,
        })
    }
}

/// One loaded tensor.
#[derive(Clone, Debug, PartialEq)]
pub enum TensorData<'a> {
    /// Float values.
    Float(FloatTensor<'a>),
    /// An MLX affine triple, taken or transcoded without loss.
    Affine(AffineTensor<'a>),
}
