//! Which of MLX 0.32.4's run-time-compiled CUDA modules a bundle needs, and
//! the kernel name expressions each holds: the names MLX's host code builds
//! (`indexing.cpp` for `gather`, `quantized/qmm/qmm_naive.cu` with
//! `qmm_utils.h` for the quantized matmul), so that MLX finds the module in
//! its cache under the name it looks for and each kernel under the name
//! expression it asks for.
//!
//! Two families are compiled at run time for an LLM at f32 activations:
//! - `gather_{dtype}_uint32_1`: one index array of `uint32` (token ids) into
//!   a table of `dtype` (the embedding lookup: its codes, scales and
//!   biases when quantized), 22 kernels (index rank 0..=10, 32- and 64-bit
//!   offsets);
//! - `qmm_naive_t{n}_{aligned|residue}_{dtype}_m{tile_m}_b{bits}_g{group}_affine`:
//!   the quantized matmul of prompts of 8 or more rows, one kernel per row
//!   tile (16, 32, 64) for each (bits, group size, whether the input width
//!   is a multiple of the tile's K).

use std::collections::BTreeMap;

/// The longest module name MLX keeps as one cache file name
/// (`jit_module.cpp`'s `get_ptx_path`; longer names become folders).
const MAX_FILE_NAME: usize = 245;

/// An MLX dtype a module is instantiated for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MlxDtype {
    /// `float32`.
    Float32,
    /// `float16`.
    Float16,
    /// `bfloat16`.
    Bfloat16,
    /// `uint32` (packed quantized codes, token ids).
    Uint32,
}

impl MlxDtype {
    /// MLX's name (`dtype_to_string`), as in module names.
    pub fn name(self) -> &'static str {
        match self {
            MlxDtype::Float32 => "float32",
            MlxDtype::Float16 => "float16",
            MlxDtype::Bfloat16 => "bfloat16",
            MlxDtype::Uint32 => "uint32",
        }
    }

    /// The CUDA type MLX's `dtype_to_cuda_type` gives it.
    fn cuda_type(self) -> &'static str {
        match self {
            MlxDtype::Float32 => "float",
            MlxDtype::Float16 => "__half",
            MlxDtype::Bfloat16 => "__nv_bfloat16",
            MlxDtype::Uint32 => "uint32_t",
        }
    }

    /// The CUTLASS type of activations and scales in the quantized matmul
    /// (`qmm_utils.h`); none for integers.
    fn cutlass_type(self) -> Option<&'static str> {
        match self {
            MlxDtype::Float32 => Some("float"),
            MlxDtype::Float16 => Some("cutlass::half_t"),
            MlxDtype::Bfloat16 => Some("cutlass::bfloat16_t"),
            MlxDtype::Uint32 => None,
        }
    }

    fn itemsize(self) -> u32 {
        match self {
            MlxDtype::Float32 | MlxDtype::Uint32 => 4,
            MlxDtype::Float16 | MlxDtype::Bfloat16 => 2,
        }
    }
}

/// A quantized matrix of the bundle, as the matmul sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct QuantizedMatrix {
    /// Bits per code (2, 3, 4, 5, 6 or 8).
    pub bits: u32,
    /// Inputs per group (32, 64 or 128).
    pub group_size: u32,
    /// The logical input width K (columns).
    pub columns: u64,
}

/// Where a module's source comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModuleSource {
    /// MLX's: the `jit_source_` symbol of this name in `libmlx.so`,
    /// compiled with MLX's options and device headers.
    Mlx(&'static str),
    /// mlxcel's own kernels ([`mlxcel_mlx::cuda_kernels`]).
    Mlxcel,
}

/// One module to compile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelModule {
    /// The module name: the cache files are `NAME.ptx` and `NAME.txt`.
    pub name: String,
    /// Its source.
    pub source: ModuleSource,
    /// The kernels' name expressions, in MLX's order.
    pub name_expressions: Vec<String>,
}

/// MLX's highest array rank in kernels (`MAX_NDIM`).
const MAX_NDIM: u32 = 10;

/// `gather_{dtype}_uint32_1`: a lookup of `uint32` indices into `dtype`.
pub fn gather_module(dtype: MlxDtype) -> KernelModule {
    let index = MlxDtype::Uint32;
    let mut name_expressions = Vec::new();
    for ndim in 0..=MAX_NDIM {
        for large in ["int32_t", "int64_t"] {
            name_expressions.push(format!(
                "mlx::core::cu::gather<{}, {}, 1, {ndim}, {large}>",
                dtype.cuda_type(),
                index.cuda_type()
            ));
        }
    }
    KernelModule {
        name: format!("gather_{}_{}_1", dtype.name(), index.name()),
        source: ModuleSource::Mlx("gather"),
        name_expressions,
    }
}

/// The CUTLASS type of `bits`-wide codes.
fn code_type(bits: u32) -> Option<&'static str> {
    Some(match bits {
        2 => "cutlass::uint2b_t",
        3 => "cutlass::uint3b_t",
        4 => "cutlass::uint4b_t",
        5 => "cutlass::uint5b_t",
        6 => "cutlass::uint6b_t",
        8 => "uint8_t",
        _ => return None,
    })
}

/// The row tiles MLX's naive quantized matmul uses (`tile_m` is the next
/// power of two of the rows, clamped to 16..=64).
pub const QMM_TILES_M: [u32; 3] = [16, 32, 64];

/// The quantized matmul module of `x` (activations of `activation`) times a
/// transposed affine matrix `m`, for row tile `tile_m`. Every supported
/// target has compute capability 8.0 or more (MLX's `sm80` flag). None for
/// a width without a CUTLASS code type or an integer activation.
pub fn qmm_module(activation: MlxDtype, m: QuantizedMatrix, tile_m: u32) -> Option<KernelModule> {
    let ctype_x = activation.cutlass_type()?;
    let ctype_q = code_type(m.bits)?;
    let sm80 = true;
    let enough_smem = activation.itemsize() <= 2 && m.group_size <= 64;
    let tile_n = if sm80 && enough_smem { 128 } else { 64 };
    let tile_k = m.group_size.max(64);
    let has_k_residue = !m.columns.is_multiple_of(u64::from(tile_k));
    let transpose = true;
    let name = format!(
        "qmm_naive_t{}_{}_{}_m{tile_m}_b{}_g{}_affine",
        if transpose { "n" } else { "t" },
        if has_k_residue { "residue" } else { "aligned" },
        activation.name(),
        m.bits,
        m.group_size,
    );
    let expression = format!(
        "mlx::core::cu::qmm_naive_kernel<{}, {transpose}, {has_k_residue}, {sm80}, {ctype_x}, {ctype_q}, {ctype_x}, \
         cute::Shape<cute::Int<{tile_m}>, cute::Int<{tile_n}>, cute::Int<{tile_k}>>>",
        m.group_size,
    );
    Some(KernelModule { name, source: ModuleSource::Mlx("qmm_naive"), name_expressions: vec![expression] })
}

/// mlxcel's own kernels (the quantized products and attention of decode steps).
pub fn own_module() -> KernelModule {
    KernelModule {
        name: mlxcel_mlx::cuda_kernels::MODULE.to_string(),
        source: ModuleSource::Mlxcel,
        name_expressions: mlxcel_mlx::cuda_kernels::name_expressions(),
    }
}

/// Every module a bundle needs at `activation` (only `float32` is
/// supported: bf16 and f16 activations take MLX's CUTLASS `qmm_sm80`
/// modules, not planned yet): a gather per dtype of `gather_dtypes` (plus
/// `float32` and `uint32`), the three row tiles of the quantized matmul
/// for each distinct quantized form, and mlxcel's own module; sorted by
/// name, without duplicates.
pub fn plan(matrices: &[QuantizedMatrix], gather_dtypes: &[MlxDtype]) -> Vec<KernelModule> {
    let activation = MlxDtype::Float32;
    let mut modules = BTreeMap::new();
    let mut gathers = vec![MlxDtype::Float32, MlxDtype::Uint32];
    gathers.extend_from_slice(gather_dtypes);
    for dtype in gathers {
        let m = gather_module(dtype);
        modules.insert(m.name.clone(), m);
    }
    for &matrix in matrices {
        for tile_m in QMM_TILES_M {
            if let Some(m) = qmm_module(activation, matrix, tile_m) {
                modules.insert(m.name.clone(), m);
            }
        }
    }
    let own = own_module();
    modules.insert(own.name.clone(), own);
    let modules: Vec<KernelModule> = modules.into_values().collect();
    debug_assert!(modules.iter().all(|m| m.name.len() <= MAX_FILE_NAME));
    modules
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The name expressions of a `NAME.txt` MLX 0.32.4 wrote on an H200.
    fn expressions(txt: &str) -> Vec<String> {
        txt.lines().map(|l| l.split('\t').next().unwrap().to_string()).collect()
    }

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/mlx-ptx-cache");

    fn fixture(name: &str) -> Vec<String> {
        expressions(&std::fs::read_to_string(format!("{FIXTURES}/{name}.txt")).unwrap())
    }

    #[test]
    fn gathers_match_the_h200_cache() {
        for (dtype, name) in [
            (MlxDtype::Float32, "gather_float32_uint32_1"),
            (MlxDtype::Uint32, "gather_uint32_uint32_1"),
            (MlxDtype::Bfloat16, "gather_bfloat16_uint32_1"),
        ] {
            let m = gather_module(dtype);
            assert_eq!(m.name, name);
            assert_eq!(m.name_expressions, fixture(name), "{name}");
            assert_eq!(m.name_expressions.len(), 22);
        }
    }

    #[test]
    fn qmm_matches_the_h200_cache() {
        let q = |bits| QuantizedMatrix { bits, group_size: 32, columns: 576 };
        for (activation, bits, tile_m) in [
            (MlxDtype::Float32, 4, 16),
            (MlxDtype::Float32, 4, 64),
            (MlxDtype::Float32, 8, 16),
            (MlxDtype::Float32, 5, 64),
            (MlxDtype::Bfloat16, 4, 16),
        ] {
            let m = qmm_module(activation, q(bits), tile_m).unwrap();
            assert_eq!(m.name, format!("qmm_naive_tn_aligned_{}_m{tile_m}_b{bits}_g32_affine", activation.name()));
            assert_eq!(m.name_expressions, fixture(&m.name), "{}", m.name);
        }
    }

    #[test]
    fn residue_and_wide_groups() {
        // K = 96 is no multiple of tile K = 64: the residue kernel.
        let m = qmm_module(MlxDtype::Float32, QuantizedMatrix { bits: 3, group_size: 32, columns: 96 }, 32).unwrap();
        assert_eq!(m.name, "qmm_naive_tn_residue_float32_m32_b3_g32_affine");
        assert_eq!(
            m.name_expressions[0],
            "mlx::core::cu::qmm_naive_kernel<32, true, true, true, float, cutlass::uint3b_t, float, \
             cute::Shape<cute::Int<32>, cute::Int<64>, cute::Int<64>>>"
        );
        // Group 128: tile K 128; f16 at group 128 has not the shared memory for N = 128.
        let m = qmm_module(MlxDtype::Float16, QuantizedMatrix { bits: 2, group_size: 128, columns: 256 }, 64).unwrap();
        assert_eq!(m.name, "qmm_naive_tn_aligned_float16_m64_b2_g128_affine");
        assert!(m.name_expressions[0].ends_with(
            "cutlass::half_t, cutlass::uint2b_t, cutlass::half_t, cute::Shape<cute::Int<64>, cute::Int<64>, cute::Int<128>>>"
        ));
        assert!(qmm_module(MlxDtype::Float32, QuantizedMatrix { bits: 7, group_size: 32, columns: 64 }, 16).is_none());
    }

    #[test]
    fn the_plan_is_deduplicated_and_sorted() {
        let q4 = QuantizedMatrix { bits: 4, group_size: 32, columns: 576 };
        let q4_wide = QuantizedMatrix { columns: 1536, ..q4 };
        let q6 = QuantizedMatrix { bits: 6, ..q4 };
        let names: Vec<String> =
            plan(&[q6, q4, q4_wide, q4], &[MlxDtype::Float32]).into_iter().map(|m| m.name).collect();
        assert_eq!(
            names,
            [
                "gather_float32_uint32_1",
                "gather_uint32_uint32_1",
                "mlxcel_kernels",
                "qmm_naive_tn_aligned_float32_m16_b4_g32_affine",
                "qmm_naive_tn_aligned_float32_m16_b6_g32_affine",
                "qmm_naive_tn_aligned_float32_m32_b4_g32_affine",
                "qmm_naive_tn_aligned_float32_m32_b6_g32_affine",
                "qmm_naive_tn_aligned_float32_m64_b4_g32_affine",
                "qmm_naive_tn_aligned_float32_m64_b6_g32_affine",
            ]
        );
        // Float weights only: no quantized matmul (the own module's
        // attention serves every model).
        let names: Vec<String> = plan(&[], &[MlxDtype::Float32]).into_iter().map(|m| m.name).collect();
        assert_eq!(names, ["gather_float32_uint32_1", "gather_uint32_uint32_1", "mlxcel_kernels"]);
    }
}
