//! The raw cxx bridge to `cpp/bridge.cc`. Every fallible call returns
//! `Result`, so C++ exceptions arrive as `cxx::Exception`; the safe layer in
//! `array.rs` and `ops.rs` is the only user of this module.

use bytes::Bytes;

/// What keeps the memory behind a borrowed MLX buffer alive: a clone of the
/// [`Bytes`] the array was made from. C++ holds it (as a `rust::Box`) in the
/// MLX buffer's deleter and drops it, through cxx's `Box` drop glue, when MLX
/// releases the buffer, possibly on one of MLX's stream threads.
pub(crate) struct SharedBytes {
    _bytes: Bytes,
}

impl SharedBytes {
    pub(crate) fn new(bytes: Bytes) -> SharedBytes {
        SharedBytes { _bytes: bytes }
    }
}

// MLX may drop the owner on another thread than the one that created it.
const _: () = {
    const fn assert_send<T: Send>() {}
    assert_send::<SharedBytes>();
};

#[cxx::bridge(namespace = "mlxcel")]
pub(crate) mod bridge {
    // Every enum that crosses the bridge is declared here once. Those whose
    // C++ definition is the source of truth (the kernels' own, and the
    // operations' in cpp/nodes/ops.h) are also `extern "C++"` types below:
    // cxx then checks at compile time that both sides have the same
    // variants and values. The others cxx defines for C++ (bridge.cc).

    /// MLX's element types (`mx::Dtype::Val`).
    enum Dtype {
        Bool,
        U8,
        U16,
        U32,
        U64,
        I8,
        I16,
        I32,
        I64,
        F16,
        F32,
        F64,
        BF16,
        Complex64,
    }

    /// Elementwise operations of one array (`unary` in bridge.cc).
    enum UnaryOp {
        Negative,
        Exp,
        Log,
        Sqrt,
        Rsqrt,
        Square,
        Abs,
        Tanh,
        Sigmoid,
        Erf,
        Sin,
        Cos,
        Floor,
        Ceil,
        LogicalNot,
        Log1p,
        Reciprocal,
        IsNan,
        IsInf,
    }

    /// Elementwise operations of two arrays with broadcasting (`binary`).
    enum BinaryOp {
        Add,
        Subtract,
        Multiply,
        Divide,
        Maximum,
        Minimum,
        Power,
        Equal,
        NotEqual,
        Less,
        LessEqual,
        Greater,
        GreaterEqual,
        LogicalAnd,
        LogicalOr,
        Remainder,
        FloorDivide,
    }

    /// Reductions over axes (`reduce`).
    enum ReduceOp {
        Sum,
        Mean,
        Max,
        Min,
        Prod,
        LogSumExp,
    }

    /// Index reductions along one axis (`arg_reduce`).
    enum ArgReduceOp {
        ArgMax,
        ArgMin,
    }

    /// MLX's quantization modes (its mode strings, spelled in bridge.cc only).
    enum QuantMode {
        Affine,
        Mxfp4,
        Mxfp8,
        Nvfp4,
    }

    /// MLX's device kinds.
    enum DeviceKind {
        Cpu,
        Gpu,
    }

    /// Whose implementation an operation of cpp/nodes/ops.h uses.
    #[namespace = "mlxcel::fast"]
    enum Path {
        Auto,
        Kernel,
        Mlx,
    }

    /// The mask of `fast_sdpa` (MLX's mask-mode strings, spelled in ops.cc only).
    #[namespace = "mlxcel::fast"]
    enum MaskMode {
        None,
        Causal,
        Array,
    }

    /// The kernels' instruction sets (cpp/kernels/kernels.h).
    #[namespace = "mlxcel::kern"]
    #[repr(i32)]
    enum Isa {
        Scalar,
        Avx2,
        Avx512,
        Avx512Vnni,
        Neon,
        Avx2I16,
    }

    /// The activation of a gated MLP (cpp/kernels/kernels.h).
    #[namespace = "mlxcel::kern"]
    #[repr(i32)]
    enum Activation {
        Silu,
        GeluTanh,
    }

    /// How a quantized weight's codes, scales and biases are arranged
    /// (cpp/kernels/kernels.h).
    #[namespace = "mlxcel::kern"]
    #[repr(i32)]
    enum WeightLayout {
        RowMajor,
        Rows16,
    }

    /// A rotary embedding's parameters (the wavelengths, if any, travel as an array).
    struct RopeParams {
        dims: i32,
        traditional: bool,
        base: f32,
        scale: f32,
    }

    /// One sequence of a cached attention step, its buffers aside.
    struct CacheStep {
        offset: i32,
        slot: i32,
        visible: i32,
        causal: bool,
    }

    extern "Rust" {
        type SharedBytes;
    }

    unsafe extern "C++" {
        include!("mlxcel-mlx/cpp/bridge.h");

        #[namespace = "mlxcel::fast"]
        type Path;
        #[namespace = "mlxcel::fast"]
        type MaskMode;
        #[namespace = "mlxcel::kern"]
        type Isa;
        #[namespace = "mlxcel::kern"]
        type Activation;
        #[namespace = "mlxcel::kern"]
        type WeightLayout;

        type Array;
        type ArrayList;

        fn array_from_bytes(data: &[u8], shape: &[i32], dtype: Dtype) -> Result<UniquePtr<Array>>;
        /// An array whose data is `region` minus its first `size_of::<usize>()`
        /// bytes (MLX's CPU allocator reads that word as the buffer's size
        /// header), without a copy. Refuses (throws) unless
        /// `borrowing_supported()` and the data is non-empty and aligned.
        ///
        /// # Safety
        /// MLX keeps reading `region` after the call: it must stay valid and
        /// unchanged for as long as `owner` lives (C++ drops `owner` when MLX
        /// releases the buffer).
        unsafe fn array_from_shared(
            region: &[u8],
            owner: Box<SharedBytes>,
            shape: &[i32],
            dtype: Dtype,
        ) -> Result<UniquePtr<Array>>;
        fn borrowing_supported() -> bool;
        fn is_borrowed(a: &Array) -> bool;
        fn data_address(a: &Array) -> Result<usize>;
        fn full(shape: &[i32], value: f64, dtype: Dtype) -> Result<UniquePtr<Array>>;
        fn arange(start: f64, stop: f64, step: f64, dtype: Dtype) -> Result<UniquePtr<Array>>;
        fn clone_array(a: &Array) -> UniquePtr<Array>;
        fn shape(a: &Array) -> Vec<i32>;
        fn dtype(a: &Array) -> Dtype;
        fn nbytes(a: &Array) -> usize;
        fn eval(a: &Array) -> Result<()>;
        fn eval_list(list: &ArrayList) -> Result<()>;
        fn copy_data(a: &Array, out: &mut [u8]) -> Result<()>;

        fn new_list() -> UniquePtr<ArrayList>;
        fn list_push(list: Pin<&mut ArrayList>, a: &Array);
        fn list_len(list: &ArrayList) -> usize;
        fn list_get(list: &ArrayList, index: usize) -> Result<UniquePtr<Array>>;

        fn unary(op: UnaryOp, a: &Array) -> Result<UniquePtr<Array>>;
        fn binary(op: BinaryOp, a: &Array, b: &Array) -> Result<UniquePtr<Array>>;
        fn where_(cond: &Array, a: &Array, b: &Array) -> Result<UniquePtr<Array>>;
        fn reduce(op: ReduceOp, a: &Array, axes: &[i32], keepdims: bool) -> Result<UniquePtr<Array>>;
        fn arg_reduce(op: ArgReduceOp, a: &Array, axis: i32, keepdims: bool) -> Result<UniquePtr<Array>>;
        fn softmax(a: &Array, axes: &[i32], precise: bool) -> Result<UniquePtr<Array>>;
        fn cumsum(a: &Array, axis: i32, reverse: bool, inclusive: bool) -> Result<UniquePtr<Array>>;

        fn matmul(a: &Array, b: &Array) -> Result<UniquePtr<Array>>;
        fn gather_mm(
            a: &Array,
            b: &Array,
            lhs_indices: UniquePtr<Array>,
            rhs_indices: UniquePtr<Array>,
            sorted_indices: bool,
        ) -> Result<UniquePtr<Array>>;
        fn addmm(c: &Array, a: &Array, b: &Array, alpha: f32, beta: f32) -> Result<UniquePtr<Array>>;

        fn reshape(a: &Array, shape: &[i32]) -> Result<UniquePtr<Array>>;
        fn transpose(a: &Array, axes: &[i32]) -> Result<UniquePtr<Array>>;
        fn swapaxes(a: &Array, axis1: i32, axis2: i32) -> Result<UniquePtr<Array>>;
        fn expand_dims(a: &Array, axes: &[i32]) -> Result<UniquePtr<Array>>;
        fn squeeze(a: &Array, axes: &[i32]) -> Result<UniquePtr<Array>>;
        fn broadcast_to(a: &Array, shape: &[i32]) -> Result<UniquePtr<Array>>;
        fn astype(a: &Array, dtype: Dtype) -> Result<UniquePtr<Array>>;
        fn contiguous(a: &Array) -> Result<UniquePtr<Array>>;
        fn slice(a: &Array, start: &[i32], stop: &[i32], strides: &[i32]) -> Result<UniquePtr<Array>>;
        fn slice_dynamic(a: &Array, start: &Array, axes: &[i32], size: &[i32]) -> Result<UniquePtr<Array>>;
        fn slice_update(
            src: &Array,
            update: &Array,
            start: &[i32],
            stop: &[i32],
            strides: &[i32],
        ) -> Result<UniquePtr<Array>>;
        fn slice_update_dynamic(src: &Array, update: &Array, start: &Array, axes: &[i32]) -> Result<UniquePtr<Array>>;
        fn concatenate(list: &ArrayList, axis: i32) -> Result<UniquePtr<Array>>;
        fn stack(list: &ArrayList, axis: i32) -> Result<UniquePtr<Array>>;
        fn split_sections(a: &Array, sections: i32, axis: i32) -> Result<UniquePtr<ArrayList>>;
        fn split_at(a: &Array, indices: &[i32], axis: i32) -> Result<UniquePtr<ArrayList>>;
        fn tril(a: &Array, k: i32) -> Result<UniquePtr<Array>>;
        fn triu(a: &Array, k: i32) -> Result<UniquePtr<Array>>;

        fn take(a: &Array, indices: &Array, axis: i32) -> Result<UniquePtr<Array>>;
        fn take_along_axis(a: &Array, indices: &Array, axis: i32) -> Result<UniquePtr<Array>>;
        fn put_along_axis(a: &Array, indices: &Array, values: &Array, axis: i32) -> Result<UniquePtr<Array>>;
        fn argsort(a: &Array, axis: i32) -> Result<UniquePtr<Array>>;
        fn sort(a: &Array, axis: i32) -> Result<UniquePtr<Array>>;
        fn argpartition(a: &Array, kth: i32, axis: i32) -> Result<UniquePtr<Array>>;
        fn topk(a: &Array, k: i32, axis: i32) -> Result<UniquePtr<Array>>;

        fn rms_norm(x: &Array, weight: UniquePtr<Array>, eps: f32) -> Result<UniquePtr<Array>>;
        fn layer_norm(
            x: &Array,
            weight: UniquePtr<Array>,
            bias: UniquePtr<Array>,
            eps: f32,
        ) -> Result<UniquePtr<Array>>;
        fn rope(
            x: &Array,
            dims: i32,
            traditional: bool,
            base: f32,
            scale: f32,
            offset: i32,
            freqs: UniquePtr<Array>,
        ) -> Result<UniquePtr<Array>>;
        fn rope_dynamic(
            x: &Array,
            dims: i32,
            traditional: bool,
            base: f32,
            scale: f32,
            offset: &Array,
            freqs: UniquePtr<Array>,
        ) -> Result<UniquePtr<Array>>;
        fn scaled_dot_product_attention(
            q: &Array,
            k: &Array,
            v: &Array,
            scale: f32,
            mask_mode: MaskMode,
            mask: UniquePtr<Array>,
            sinks: UniquePtr<Array>,
        ) -> Result<UniquePtr<Array>>;

        fn quantize(w: &Array, group_size: i32, bits: i32, mode: QuantMode) -> Result<UniquePtr<ArrayList>>;
        #[allow(clippy::too_many_arguments)]
        fn dequantize(
            w: &Array,
            scales: &Array,
            biases: UniquePtr<Array>,
            group_size: i32,
            bits: i32,
            mode: QuantMode,
            // The output dtype; with `scales_dtype`, the scales' (dtype ignored).
            dtype: Dtype,
            scales_dtype: bool,
        ) -> Result<UniquePtr<Array>>;
        #[allow(clippy::too_many_arguments)]
        fn quantized_matmul(
            x: &Array,
            w: &Array,
            scales: &Array,
            biases: UniquePtr<Array>,
            transpose: bool,
            group_size: i32,
            bits: i32,
            mode: QuantMode,
        ) -> Result<UniquePtr<Array>>;

        #[allow(clippy::too_many_arguments)]
        fn gather_qmm(
            x: &Array,
            w: &Array,
            scales: &Array,
            biases: UniquePtr<Array>,
            lhs_indices: UniquePtr<Array>,
            rhs_indices: UniquePtr<Array>,
            transpose: bool,
            group_size: i32,
            bits: i32,
            mode: QuantMode,
            sorted_indices: bool,
        ) -> Result<UniquePtr<Array>>;

        // mlxcel's kernels (cpp/nodes/ops.h).
        #[allow(clippy::too_many_arguments)]
        fn fast_quantized_linear(
            x: &Array,
            w: &Array,
            scales: &Array,
            biases: UniquePtr<Array>,
            group_size: i32,
            bits: i32,
            layout: WeightLayout,
            path: Path,
        ) -> Result<UniquePtr<Array>>;
        #[allow(clippy::too_many_arguments)]
        fn fast_quantized_gather(
            ids: &Array,
            w: &Array,
            scales: &Array,
            biases: UniquePtr<Array>,
            group_size: i32,
            bits: i32,
            layout: WeightLayout,
            scale: f32,
            path: Path,
        ) -> Result<UniquePtr<Array>>;
        fn fast_quantized_linear_multi(
            x: &Array,
            weights: &ArrayList,
            heads: &[i32],
            group_size: i32,
            bits: i32,
            layout: WeightLayout,
            path: Path,
        ) -> Result<UniquePtr<ArrayList>>;
        fn fast_quantized_gated_linear(
            act: Activation,
            x: &Array,
            weights: &ArrayList,
            group_size: i32,
            bits: i32,
            layout: WeightLayout,
            path: Path,
        ) -> Result<UniquePtr<Array>>;
        fn fast_linear_multi(x: &Array, weights: &ArrayList, heads: &[i32], path: Path)
        -> Result<UniquePtr<ArrayList>>;
        fn fast_gated_linear(act: Activation, x: &Array, weights: &ArrayList, path: Path) -> Result<UniquePtr<Array>>;
        fn fast_gather_rows(ids: &Array, table: &Array, scale: f32, path: Path) -> Result<UniquePtr<Array>>;
        fn fast_rms_norm(x: &Array, weight: UniquePtr<Array>, eps: f32, path: Path) -> Result<UniquePtr<Array>>;
        fn fast_add(a: &Array, b: &Array, path: Path) -> Result<UniquePtr<Array>>;
        fn fast_rope(
            x: &Array,
            rope: &RopeParams,
            freqs: UniquePtr<Array>,
            offset: i32,
            path: Path,
        ) -> Result<UniquePtr<Array>>;
        fn fast_sdpa(
            q: &Array,
            k: &Array,
            v: &Array,
            scale: f32,
            mask_mode: MaskMode,
            mask: UniquePtr<Array>,
            path: Path,
        ) -> Result<UniquePtr<Array>>;
        /// `arrays`: q, k, v, then each row's key and value buffers.
        fn fast_cached_attention(
            arrays: &ArrayList,
            rope: &RopeParams,
            freqs: UniquePtr<Array>,
            rows: &[CacheStep],
            scale: f32,
            path: Path,
        ) -> Result<UniquePtr<ArrayList>>;
        fn fast_merge_heads(x: &Array, path: Path) -> Result<UniquePtr<Array>>;
        fn fast_gated_activation(act: Activation, a: &Array, b: &Array, path: Path) -> Result<UniquePtr<Array>>;
        fn kernels_threads() -> i32;
        fn kernels_default_threads() -> i32;
        fn kernels_set_threads(n: i32);
        fn kernels_set_default_threads(n: i32);
        fn kernels_set_spin(spin_us: i32, spin_yield: bool);
        fn retain_freed_memory() -> bool;
        fn kernels_isa() -> Isa;
        fn kernels_isa_supported(isa: Isa) -> bool;
        fn kernels_amx_supported() -> bool;
        fn kernels_set_amx(on: bool);
        fn kernels_amx_active() -> bool;
        fn kernels_set_isa(isa: Isa) -> bool;
        fn kernels_read_bandwidth(bytes: usize, reps: i32) -> f64;
        fn pending_ops(list: &ArrayList) -> Vec<String>;
        fn eval_inline(list: &ArrayList) -> Result<bool>;
        fn kernels_bench_qmm(x: &Array, weights: &ArrayList, group_size: i32, bits: i32, reps: i32) -> Result<f64>;

        fn random_key(seed: u64) -> Result<UniquePtr<Array>>;
        fn random_split(key: &Array, num: i32) -> Result<UniquePtr<Array>>;
        fn random_uniform(low: f32, high: f32, shape: &[i32], dtype: Dtype, key: &Array) -> Result<UniquePtr<Array>>;
        fn random_normal(shape: &[i32], dtype: Dtype, loc: f32, scale: f32, key: &Array) -> Result<UniquePtr<Array>>;
        fn random_categorical(logits: &Array, axis: i32, key: &Array) -> Result<UniquePtr<Array>>;

        fn mlx_version() -> String;
        fn gpu_available() -> bool;
        fn default_device() -> DeviceKind;
        fn set_default_device(device: DeviceKind) -> Result<()>;
        fn device_name(device: DeviceKind) -> Result<String>;
        fn cuda_arch() -> String;
        fn set_jit_cache_dir(dir: &str) -> Result<()>;
        fn load_gpu_kernels(cubin: &[u8], names: &str) -> Result<usize>;
        fn gpu_kernels_loaded() -> bool;

        type StepGraph;
        fn record_step(
            outputs: &ArrayList,
            tokens: &Array,
            logits: &Array,
            refusal: &mut String,
        ) -> Result<UniquePtr<StepGraph>>;
        fn replay_step(
            graph: Pin<&mut StepGraph>,
            tokens: &[u32],
            caches: &ArrayList,
            rows: &[CacheStep],
            logits: &mut [f32],
        ) -> Result<bool>;
        fn synchronize() -> Result<()>;
        fn active_memory() -> usize;
        fn peak_memory() -> usize;
        fn reset_peak_memory();
        fn cache_memory() -> usize;
        fn clear_cache();
    }
}
