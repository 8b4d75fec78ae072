//! Operations on [`Array`]s. All of them are lazy (they add a node to MLX's
//! graph) and fallible: MLX checks shapes and dtypes when the node is built and
//! a mismatch comes back as an [`Error`](crate::Error).

use cxx::UniquePtr;

use crate::array::{Array, from_list, to_list, wrap};
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::ffi::bridge;

/// An optional array as the bridge takes it (null for none).
fn opt(a: Option<&Array>) -> UniquePtr<bridge::Array> {
    match a {
        Some(a) => bridge::clone_array(&a.inner),
        None => UniquePtr::null(),
    }
}

/// The quantization modes of MLX's `quantize`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantMode {
    /// `w ≈ scale * q + bias` per group of `group_size` values along the last
    /// axis, `bits` in 2, 3, 4, 5, 6, 8; scales and biases have the input's dtype.
    Affine,
    /// OCP microscaling FP4 (group 32, shared E8M0 scale, no biases).
    Mxfp4,
    /// OCP microscaling FP8 (group 32, shared E8M0 scale, no biases).
    Mxfp8,
    /// NVIDIA FP4 (group 16, E4M3 scale, no biases).
    Nvfp4,
}

impl QuantMode {
    /// The bridge's name for it.
    pub(crate) fn ffi(self) -> bridge::QuantMode {
        match self {
            QuantMode::Affine => bridge::QuantMode::Affine,
            QuantMode::Mxfp4 => bridge::QuantMode::Mxfp4,
            QuantMode::Mxfp8 => bridge::QuantMode::Mxfp8,
            QuantMode::Nvfp4 => bridge::QuantMode::Nvfp4,
        }
    }

    /// The name MLX uses for the mode.
    pub fn name(self) -> &'static str {
        match self {
            QuantMode::Affine => "affine",
            QuantMode::Mxfp4 => "mxfp4",
            QuantMode::Mxfp8 => "mxfp8",
            QuantMode::Nvfp4 => "nvfp4",
        }
    }
}

/// How a quantized matrix's codes, scales and biases are arranged in memory.
/// Either way the arrays have MLX's shapes; only the order of their bytes differs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum WeightLayout {
    /// MLX's layout: row n's codes, then row n + 1's; scales `[out, in / group_size]`.
    #[default]
    RowMajor,
    /// Every block of 16 rows transposed, so the 16 rows' codes for one
    /// input (8-bit) or pair of inputs (4-bit) are 16 consecutive bytes, as
    /// are their scales and biases for one group: what mlxcel's CPU kernels
    /// read fastest for any batch size. 4- and 8-bit affine codes, a multiple
    /// of 16 rows; only mlxcel's kernels read it (MLX's own ops refuse it).
    /// The bundle's `rows16` layout (docs/bundle-format.md).
    Rows16,
}

impl WeightLayout {
    pub(crate) fn ffi(self) -> bridge::WeightLayout {
        match self {
            WeightLayout::RowMajor => bridge::WeightLayout::RowMajor,
            WeightLayout::Rows16 => bridge::WeightLayout::Rows16,
        }
    }
}

/// A weight matrix in MLX's quantized layout: `weight` packs `bits`-bit codes
/// into u32 words along the last axis; `scales` (and for affine, `biases`)
/// hold one value per group of `group_size` inputs; `layout` says how those
/// bytes are ordered.
#[derive(Clone, Debug)]
pub struct Quantized {
    /// Packed codes, shape `[.., out, in * bits / 32]`, dtype u32.
    pub weight: Array,
    /// One scale per group, shape `[.., out, in / group_size]`.
    pub scales: Array,
    /// One bias per group (affine mode only).
    pub biases: Option<Array>,
    /// Inputs per group.
    pub group_size: i32,
    /// Bits per code.
    pub bits: i32,
    /// The quantization mode.
    pub mode: QuantMode,
    /// The order of the bytes of `weight`, `scales` and `biases`.
    pub layout: WeightLayout,
}

macro_rules! unary_ops {
    ($($(#[$doc:meta])* $name:ident => $op:ident),* $(,)?) => {$(
        $(#[$doc])*
        pub fn $name(&self) -> Result<Array> {
            wrap(stringify!($name), bridge::unary(bridge::UnaryOp::$op, &self.inner))
        }
    )*};
}

macro_rules! binary_ops {
    ($($(#[$doc:meta])* $name:ident => $op:ident),* $(,)?) => {$(
        $(#[$doc])*
        pub fn $name(&self, other: &Array) -> Result<Array> {
            wrap(stringify!($name), bridge::binary(bridge::BinaryOp::$op, &self.inner, &other.inner))
        }
    )*};
}

macro_rules! reduce_ops {
    ($($(#[$doc:meta])* $name:ident => $op:ident),* $(,)?) => {$(
        $(#[$doc])*
        pub fn $name(&self, axes: &[i32], keepdims: bool) -> Result<Array> {
            wrap(stringify!($name), bridge::reduce(bridge::ReduceOp::$op, &self.inner, axes, keepdims))
        }
    )*};
}

/// Elementwise arithmetic, comparisons and activations.
impl Array {
    unary_ops!(
        /// `-x`.
        negative => Negative,
        /// `e^x`.
        exp => Exp,
        /// Natural logarithm.
        log => Log,
        /// Square root.
        sqrt => Sqrt,
        /// `1 / sqrt(x)`.
        rsqrt => Rsqrt,
        /// `x * x`.
        square => Square,
        /// Absolute value.
        abs => Abs,
        /// Hyperbolic tangent.
        tanh => Tanh,
        /// `1 / (1 + e^-x)`.
        sigmoid => Sigmoid,
        /// The error function.
        erf => Erf,
        /// Sine.
        sin => Sin,
        /// Cosine.
        cos => Cos,
        /// Round down.
        floor => Floor,
        /// Round up.
        ceil => Ceil,
        /// Boolean negation.
        logical_not => LogicalNot,
        /// `ln(1 + x)`.
        log1p => Log1p,
        /// `1 / x`.
        reciprocal => Reciprocal,
        /// Whether each element is NaN.
        isnan => IsNan,
        /// Whether each element is ±infinity.
        isinf => IsInf,
    );

    binary_ops!(
        /// `a + b` with broadcasting.
        add => Add,
        /// `a - b` with broadcasting.
        subtract => Subtract,
        /// `a * b` with broadcasting.
        multiply => Multiply,
        /// `a / b` with broadcasting.
        divide => Divide,
        /// Elementwise maximum.
        maximum => Maximum,
        /// Elementwise minimum.
        minimum => Minimum,
        /// `a ^ b`.
        power => Power,
        /// `a == b`.
        equal => Equal,
        /// `a != b`.
        not_equal => NotEqual,
        /// `a < b`.
        less => Less,
        /// `a <= b`.
        less_equal => LessEqual,
        /// `a > b`.
        greater => Greater,
        /// `a >= b`.
        greater_equal => GreaterEqual,
        /// Boolean and.
        logical_and => LogicalAnd,
        /// Boolean or.
        logical_or => LogicalOr,
        /// Remainder with the sign of the divisor (Python's `%`).
        remainder => Remainder,
        /// Division rounded down.
        floor_divide => FloorDivide,
    );

    /// `self + value` for a float scalar in `self`'s dtype.
    pub fn add_scalar(&self, value: f32) -> Result<Array> {
        self.add(&self.scalar_like(value)?)
    }

    /// `self * value` for a float scalar in `self`'s dtype.
    pub fn multiply_scalar(&self, value: f32) -> Result<Array> {
        self.multiply(&self.scalar_like(value)?)
    }

    /// A zero-dimensional array of `value` in `self`'s dtype.
    pub fn scalar_like(&self, value: f32) -> Result<Array> {
        Array::full(&[], f64::from(value), self.dtype())
    }

    /// `cond ? a : b`, elementwise with broadcasting.
    pub fn where_(cond: &Array, a: &Array, b: &Array) -> Result<Array> {
        wrap("where", bridge::where_(&cond.inner, &a.inner, &b.inner))
    }

    /// SiLU (swish): `x * sigmoid(x)`.
    pub fn silu(&self) -> Result<Array> {
        self.multiply(&self.sigmoid()?)
    }

    /// GELU, exact: `x/2 * (1 + erf(x / sqrt 2))`.
    pub fn gelu(&self) -> Result<Array> {
        let half_x = self.multiply_scalar(0.5)?;
        let erf = self.multiply_scalar(std::f32::consts::FRAC_1_SQRT_2)?.erf()?;
        half_x.multiply(&erf.add_scalar(1.0)?)
    }

    /// GELU, tanh approximation (PyTorch's `gelu_pytorch_tanh`, used by Gemma):
    /// `x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))`.
    pub fn gelu_approx(&self) -> Result<Array> {
        let sqrt_2_over_pi = (2.0f32 / std::f32::consts::PI).sqrt();
        let cube = self.square()?.multiply(self)?;
        let inner = self.add(&cube.multiply_scalar(0.044_715)?)?.multiply_scalar(sqrt_2_over_pi)?;
        self.multiply_scalar(0.5)?.multiply(&inner.tanh()?.add_scalar(1.0)?)
    }
}

/// Reductions, softmax and scans.
impl Array {
    reduce_ops!(
        /// Sum over `axes`.
        sum => Sum,
        /// Mean over `axes`.
        mean => Mean,
        /// Maximum over `axes`.
        max => Max,
        /// Minimum over `axes`.
        min => Min,
        /// Product over `axes`.
        prod => Prod,
        /// `log(sum(exp(x)))` over `axes`, computed stably.
        logsumexp => LogSumExp,
    );

    /// Index of the largest element along `axis`.
    pub fn argmax(&self, axis: i32, keepdims: bool) -> Result<Array> {
        wrap("argmax", bridge::arg_reduce(bridge::ArgReduceOp::ArgMax, &self.inner, axis, keepdims))
    }

    /// Index of the smallest element along `axis`.
    pub fn argmin(&self, axis: i32, keepdims: bool) -> Result<Array> {
        wrap("argmin", bridge::arg_reduce(bridge::ArgReduceOp::ArgMin, &self.inner, axis, keepdims))
    }

    /// Softmax over `axes`; `precise` accumulates low-precision inputs in f32.
    pub fn softmax(&self, axes: &[i32], precise: bool) -> Result<Array> {
        wrap("softmax", bridge::softmax(&self.inner, axes, precise))
    }

    /// Cumulative sum along `axis`.
    pub fn cumsum(&self, axis: i32, reverse: bool, inclusive: bool) -> Result<Array> {
        wrap("cumsum", bridge::cumsum(&self.inner, axis, reverse, inclusive))
    }
}

/// Linear algebra.
impl Array {
    /// Matrix product with broadcasting over leading dimensions.
    pub fn matmul(&self, other: &Array) -> Result<Array> {
        wrap("matmul", bridge::matmul(&self.inner, &other.inner))
    }

    /// Matrix products of gathered matrices (MLX's `gather_mm`, a
    /// mixture-of-experts layer's expert products): `self [.., M, K]` and
    /// `b [.., K, N]` are stacks of matrices; product i multiplies
    /// `self`'s matrix `lhs_indices[i]` by `b`'s matrix `rhs_indices[i]`
    /// (integer indices into the flattened leading dimensions; `None` takes
    /// them in order, as a batched matmul). The result is
    /// `[..broadcast(lhs, rhs shapes), M, N]`. `sorted_indices` promises
    /// `rhs_indices` ascending (MLX may then group the products per matrix).
    pub fn gather_mm(
        &self,
        b: &Array,
        lhs_indices: Option<&Array>,
        rhs_indices: Option<&Array>,
        sorted_indices: bool,
    ) -> Result<Array> {
        wrap("gather_mm", bridge::gather_mm(&self.inner, &b.inner, opt(lhs_indices), opt(rhs_indices), sorted_indices))
    }

    /// `beta * c + alpha * (a @ b)`.
    pub fn addmm(c: &Array, a: &Array, b: &Array, alpha: f32, beta: f32) -> Result<Array> {
        wrap("addmm", bridge::addmm(&c.inner, &a.inner, &b.inner, alpha, beta))
    }
}

/// Shapes, layouts and slicing.
impl Array {
    /// The same elements in a new shape (one entry may be -1).
    pub fn reshape(&self, shape: &[i32]) -> Result<Array> {
        wrap("reshape", bridge::reshape(&self.inner, shape))
    }

    /// Permutes the axes (`axes` empty reverses them).
    pub fn transpose(&self, axes: &[i32]) -> Result<Array> {
        wrap("transpose", bridge::transpose(&self.inner, axes))
    }

    /// Swaps two axes.
    pub fn swapaxes(&self, axis1: i32, axis2: i32) -> Result<Array> {
        wrap("swapaxes", bridge::swapaxes(&self.inner, axis1, axis2))
    }

    /// Inserts size-one axes.
    pub fn expand_dims(&self, axes: &[i32]) -> Result<Array> {
        wrap("expand_dims", bridge::expand_dims(&self.inner, axes))
    }

    /// Removes size-one axes.
    pub fn squeeze(&self, axes: &[i32]) -> Result<Array> {
        wrap("squeeze", bridge::squeeze(&self.inner, axes))
    }

    /// Broadcasts to `shape`.
    pub fn broadcast_to(&self, shape: &[i32]) -> Result<Array> {
        wrap("broadcast_to", bridge::broadcast_to(&self.inner, shape))
    }

    /// Converts the elements to `dtype`.
    pub fn astype(&self, dtype: Dtype) -> Result<Array> {
        wrap("astype", bridge::astype(&self.inner, dtype.ffi()))
    }

    /// A row-contiguous copy (a no-op when already contiguous).
    pub fn contiguous(&self) -> Result<Array> {
        wrap("contiguous", bridge::contiguous(&self.inner))
    }

    /// `self[start:stop:strides]`, one entry per dimension.
    pub fn slice(&self, start: &[i32], stop: &[i32], strides: &[i32]) -> Result<Array> {
        wrap("slice", bridge::slice(&self.inner, start, stop, strides))
    }

    /// A slice of `size` along `axes` starting at the positions held in the
    /// array `start` (so the offset can change without rebuilding a graph).
    pub fn slice_dynamic(&self, start: &Array, axes: &[i32], size: &[i32]) -> Result<Array> {
        wrap("slice_dynamic", bridge::slice_dynamic(&self.inner, &start.inner, axes, size))
    }

    /// A copy of `self` with `self[start:stop:strides] = update`.
    pub fn slice_update(&self, update: &Array, start: &[i32], stop: &[i32], strides: &[i32]) -> Result<Array> {
        wrap("slice_update", bridge::slice_update(&self.inner, &update.inner, start, stop, strides))
    }

    /// A copy of `self` with `update` written at the positions held in `start` along `axes`.
    pub fn slice_update_dynamic(&self, update: &Array, start: &Array, axes: &[i32]) -> Result<Array> {
        wrap("slice_update_dynamic", bridge::slice_update_dynamic(&self.inner, &update.inner, &start.inner, axes))
    }

    /// Joins arrays along an existing axis.
    pub fn concatenate(arrays: &[&Array], axis: i32) -> Result<Array> {
        wrap("concatenate", bridge::concatenate(&to_list(arrays), axis))
    }

    /// Joins arrays along a new axis.
    pub fn stack(arrays: &[&Array], axis: i32) -> Result<Array> {
        wrap("stack", bridge::stack(&to_list(arrays), axis))
    }

    /// Splits into `sections` equal parts along `axis`.
    pub fn split(&self, sections: i32, axis: i32) -> Result<Vec<Array>> {
        from_list("split", bridge::split_sections(&self.inner, sections, axis))
    }

    /// Splits before each of `indices` along `axis`.
    pub fn split_at(&self, indices: &[i32], axis: i32) -> Result<Vec<Array>> {
        from_list("split", bridge::split_at(&self.inner, indices, axis))
    }

    /// Keeps the lower triangle (diagonal `k` and below), zeroing the rest.
    pub fn tril(&self, k: i32) -> Result<Array> {
        wrap("tril", bridge::tril(&self.inner, k))
    }

    /// Keeps the upper triangle (diagonal `k` and above), zeroing the rest.
    pub fn triu(&self, k: i32) -> Result<Array> {
        wrap("triu", bridge::triu(&self.inner, k))
    }
}

/// Indexing, sorting and selection.
impl Array {
    /// Gathers the entries at `indices` along `axis` (embedding lookup with axis 0).
    pub fn take(&self, indices: &Array, axis: i32) -> Result<Array> {
        wrap("take", bridge::take(&self.inner, &indices.inner, axis))
    }

    /// Gathers along `axis` with `indices` shaped like `self` except on `axis`.
    pub fn take_along_axis(&self, indices: &Array, axis: i32) -> Result<Array> {
        wrap("take_along_axis", bridge::take_along_axis(&self.inner, &indices.inner, axis))
    }

    /// A copy of `self` with `values` written at `indices` along `axis`.
    pub fn put_along_axis(&self, indices: &Array, values: &Array, axis: i32) -> Result<Array> {
        wrap("put_along_axis", bridge::put_along_axis(&self.inner, &indices.inner, &values.inner, axis))
    }

    /// Indices that sort `self` along `axis`, ascending.
    pub fn argsort(&self, axis: i32) -> Result<Array> {
        wrap("argsort", bridge::argsort(&self.inner, axis))
    }

    /// `self` sorted along `axis`, ascending.
    pub fn sort(&self, axis: i32) -> Result<Array> {
        wrap("sort", bridge::sort(&self.inner, axis))
    }

    /// Indices that partition `self` along `axis` so that position `kth` holds
    /// the element a full sort would put there, smaller ones before, larger after.
    pub fn argpartition(&self, kth: i32, axis: i32) -> Result<Array> {
        wrap("argpartition", bridge::argpartition(&self.inner, kth, axis))
    }

    /// The `k` largest values along `axis` (in no particular order).
    pub fn topk(&self, k: i32, axis: i32) -> Result<Array> {
        wrap("topk", bridge::topk(&self.inner, k, axis))
    }
}

/// The fused transformer building blocks of `mlx::core::fast`.
impl Array {
    /// RMS normalisation over the last axis: `x / sqrt(mean(x²) + eps) * weight`.
    pub fn rms_norm(&self, weight: Option<&Array>, eps: f32) -> Result<Array> {
        wrap("rms_norm", bridge::rms_norm(&self.inner, opt(weight), eps))
    }

    /// Layer normalisation over the last axis, with optional affine weight and bias.
    pub fn layer_norm(&self, weight: Option<&Array>, bias: Option<&Array>, eps: f32) -> Result<Array> {
        wrap("layer_norm", bridge::layer_norm(&self.inner, opt(weight), opt(bias), eps))
    }

    /// Rotary position embedding of the first `dims` features of the last axis,
    /// for positions `offset, offset + 1, ...` along the second-to-last axis.
    /// With `freqs`, those inverse frequencies replace `base`'s.
    pub fn rope(
        &self,
        dims: i32,
        traditional: bool,
        base: f32,
        scale: f32,
        offset: i32,
        freqs: Option<&Array>,
    ) -> Result<Array> {
        wrap("rope", bridge::rope(&self.inner, dims, traditional, base, scale, offset, opt(freqs)))
    }

    /// [`Array::rope`] with the offset held in a scalar (or per-batch) array.
    pub fn rope_dynamic(
        &self,
        dims: i32,
        traditional: bool,
        base: f32,
        scale: f32,
        offset: &Array,
        freqs: Option<&Array>,
    ) -> Result<Array> {
        wrap("rope", bridge::rope_dynamic(&self.inner, dims, traditional, base, scale, &offset.inner, opt(freqs)))
    }
}

/// Which positions attention may look at.
#[derive(Clone, Copy, Debug)]
pub enum AttentionMask<'a> {
    /// Every query sees every key.
    None,
    /// Query `i` sees keys up to `i + (keys - queries)` (aligned to the end).
    Causal,
    /// A boolean mask (true = attend) or an additive float mask, broadcastable
    /// to `[batch, heads, queries, keys]`.
    Array(&'a Array),
}

impl AttentionMask<'_> {
    /// The mask mode and the mask array, as the bridge takes them.
    pub(crate) fn mode_and_array(&self) -> (bridge::MaskMode, Option<&Array>) {
        match *self {
            AttentionMask::None => (bridge::MaskMode::None, None),
            AttentionMask::Causal => (bridge::MaskMode::Causal, None),
            AttentionMask::Array(a) => (bridge::MaskMode::Array, Some(a)),
        }
    }
}

/// Scaled dot-product attention `softmax(q kᵀ * scale + mask) v` with
/// `q: [batch, heads, queries, dim]` and `k, v: [batch, kv_heads, keys, dim]`;
/// `heads` must be a multiple of `kv_heads` (grouped-query attention).
pub fn scaled_dot_product_attention(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    mask: AttentionMask<'_>,
) -> Result<Array> {
    let (mode, arr) = mask.mode_and_array();
    wrap(
        "scaled_dot_product_attention",
        bridge::scaled_dot_product_attention(&q.inner, &k.inner, &v.inner, scale, mode, opt(arr), UniquePtr::null()),
    )
}

/// Quantization.
impl Array {
    /// Quantizes a matrix along its last axis.
    pub fn quantize(&self, group_size: i32, bits: i32, mode: QuantMode) -> Result<Quantized> {
        let mut parts = from_list("quantize", bridge::quantize(&self.inner, group_size, bits, mode.ffi()))?;
        let biases = if parts.len() == 3 { parts.pop() } else { None };
        match (parts.pop(), parts.pop()) {
            (Some(scales), Some(weight)) => {
                Ok(Quantized { weight, scales, biases, group_size, bits, mode, layout: WeightLayout::RowMajor })
            }
            _ => Err(Error::invalid("quantize", "MLX returned too few arrays")),
        }
    }
}

impl Quantized {
    /// MLX's own quantized ops read only [`WeightLayout::RowMajor`].
    fn check_row_major(&self, op: &'static str) -> Result<()> {
        match self.layout {
            WeightLayout::RowMajor => Ok(()),
            WeightLayout::Rows16 => Err(Error::invalid(
                op,
                "a weight in the rows16 layout runs only on mlxcel's CPU kernels, not MLX's ops",
            )),
        }
    }

    /// The float matrix the codes stand for, in `dtype` (or the scales' dtype).
    pub fn dequantize(&self, dtype: Option<Dtype>) -> Result<Array> {
        self.check_row_major("dequantize")?;
        wrap(
            "dequantize",
            bridge::dequantize(
                &self.weight.inner,
                &self.scales.inner,
                opt(self.biases.as_ref()),
                self.group_size,
                self.bits,
                self.mode.ffi(),
                dtype.unwrap_or(Dtype::F32).ffi(),
                dtype.is_none(),
            ),
        )
    }

    /// [`Array::gather_mm`] against quantized matrices (MLX's `gather_qmm`):
    /// `self` is a stack of quantized matrices `[.., N, K]` (experts), and
    /// product i is x's matrix `lhs_indices[i]` times `self`'s matrix
    /// `rhs_indices[i]`, transposed with `transpose` (`x @ W_eᵀ`, the usual
    /// layout) or not (`x @ W_e`).
    pub fn gather_matmul(
        &self,
        x: &Array,
        lhs_indices: Option<&Array>,
        rhs_indices: Option<&Array>,
        transpose: bool,
        sorted_indices: bool,
    ) -> Result<Array> {
        self.check_row_major("gather_qmm")?;
        wrap(
            "gather_qmm",
            bridge::gather_qmm(
                &x.inner,
                &self.weight.inner,
                &self.scales.inner,
                opt(self.biases.as_ref()),
                opt(lhs_indices),
                opt(rhs_indices),
                transpose,
                self.group_size,
                self.bits,
                self.mode.ffi(),
                sorted_indices,
            ),
        )
    }

    /// `x @ Wᵀ` (with `transpose`) or `x @ W` against the quantized matrix.
    pub fn matmul(&self, x: &Array, transpose: bool) -> Result<Array> {
        self.check_row_major("quantized_matmul")?;
        wrap(
            "quantized_matmul",
            bridge::quantized_matmul(
                &x.inner,
                &self.weight.inner,
                &self.scales.inner,
                opt(self.biases.as_ref()),
                transpose,
                self.group_size,
                self.bits,
                self.mode.ffi(),
            ),
        )
    }
}
