//! mlxcel's own CUDA kernels: their source, how to compile them, and
//! loading the compiled module into the process.
//!
//! The quantized products of a decode step (q/k/v, the output projection
//! with its residual, the gated MLP's gate and up, the down projection, each
//! with the RMS norm before it folded in) and its attention over the KV
//! cache (RoPE, the cache writes and the attention) run as one or two
//! kernels each on the GPU instead of MLX's several operations (`cuda/kernels.cu`; `cpp/nodes/gpu.h` says which
//! inputs they take). `mlxcel-compile --target cuda-smXY` compiles
//! [`program`] with NVRTC, on a machine without a GPU, into the bundle's
//! module [`MODULE`]; the runtime hands it to [`load`] before the first GPU
//! step. Until a module is loaded, the GPU runs MLX's operations only.

use std::path::Path;

use crate::error::{Error, Result};
use crate::ffi::bridge;
use crate::nvrtc::{Header, Program};

/// The module's name: its files in a kernel cache folder are
/// `mlxcel_kernels.ptx` (the cubin) and `mlxcel_kernels.txt` (each
/// kernel's name expression, a tab and its lowered name), as MLX's own.
pub const MODULE: &str = "mlxcel_kernels";

/// The version of the module's interface: `gpu_args.h`'s layout, each
/// kernel's launch shape and what it computes. Stored with the module in a
/// bundle; a runtime loads only a module of its own version, since one
/// launched with another version's shapes would compute garbage. Bump it
/// with any such change. 2 (2026-12-06): products take a thread per 32-input
/// segment; the attention writes the cache itself (no `rope_write`).
/// 3 (2026-12-06): plain products may take four rows of W a thread, and a
/// block two rows of x (or eight, gated) (`ProductArgs::wide`, `chunk`).
/// 4 (2026-12-06): those shapes are kernels of their own (the `WIDE` of
/// `product`, the `CHUNK` of `gated`), each with the registers it needs.
/// 5 (2026-12-07): products of more rows than a decode step (prompts) are
/// tiled kernels of their own (`prompt_product`, `prompt_gated`).
pub const ABI: u32 = 5;

/// The module's CUDA source, and the headers it includes (handed to NVRTC
/// in memory): the argument layout the host code shares, the decode and
/// prompt products, the attention, the norm and the row gather.
pub const SOURCE: &str = include_str!("../cuda/kernels.cu");
const HEADERS: [(&str, &str); 6] = [
    ("gpu_args.h", include_str!("../cuda/gpu_args.h")),
    ("products.cuh", include_str!("../cuda/products.cuh")),
    ("prompt.cuh", include_str!("../cuda/prompt.cuh")),
    ("attention.cuh", include_str!("../cuda/attention.cuh")),
    ("norm.cuh", include_str!("../cuda/norm.cuh")),
    ("gather.cuh", include_str!("../cuda/gather.cuh")),
];

/// Code widths with kernels: every width MLX quantizes to (3, 5 and 6 bits
/// straddle words: each row is one little-endian bit stream).
pub const BITS: [u32; 6] = [2, 3, 4, 5, 6, 8];

/// The CUDA types of scales and biases with kernels (f32, f16, bf16).
pub const SCALE_TYPES: [&str; 3] = ["float", "__half", "__nv_bfloat16"];

/// The gated kernels' activations (SiLU, GELU-tanh), as `gpu_args.h` numbers them.
pub const ACTIVATIONS: [u32; 2] = [1, 2];

/// The attention kernels (RoPE, cache writes and attention in one; the copy
/// of a cache buffer that cannot be written in place).
pub const ATTENTION_KERNELS: [&str; 2] = ["mlxcel::cached_attention", "mlxcel::copy_floats"];

/// Rows of W a thread of a plain product takes: one, or `kWide` (a
/// vocabulary projection, a batch), as `gpu_args.h` defines them.
pub const PRODUCT_WIDTHS: [u32; 2] = [1, 4];

/// Rows of x a block of a gated product takes: `kRowChunk` (a decode step),
/// `kGatedChunk` (a batch), as `gpu_args.h` defines them.
pub const GATED_CHUNKS: [u32; 2] = [2, 8];

/// Rows of x a tile of a prompt product takes: `kTileRowsSmall`,
/// `kTileRows`, as `gpu_args.h` defines them.
pub const PROMPT_TILES: [u32; 2] = [32, 64];

/// The RMS norm kernel (norms no product absorbs; with or without a residual).
pub const NORM_KERNEL: &str = "mlxcel::rms_norm";

/// Every kernel's name expression, as `cpp/nodes/gpu.cc` looks them up:
/// `mlxcel::product<BITS, SCALE, WIDE>`, `mlxcel::gated<BITS, SCALE, ACT,
/// CHUNK>`, `mlxcel::prompt_product<BITS, SCALE, TILE>`,
/// `mlxcel::prompt_gated<BITS, SCALE, ACT, TILE>`, then
/// [`ATTENTION_KERNELS`] and [`NORM_KERNEL`], then the token embeddings'
/// row gathers `mlxcel::gather<BITS, SCALE>`.
pub fn name_expressions() -> Vec<String> {
    let mut names = Vec::new();
    for bits in BITS {
        for scale in SCALE_TYPES {
            for wide in PRODUCT_WIDTHS {
                names.push(format!("mlxcel::product<{bits}, {scale}, {wide}>"));
            }
            for act in ACTIVATIONS {
                for chunk in GATED_CHUNKS {
                    names.push(format!("mlxcel::gated<{bits}, {scale}, {act}, {chunk}>"));
                }
            }
            for tile in PROMPT_TILES {
                names.push(format!("mlxcel::prompt_product<{bits}, {scale}, {tile}>"));
                for act in ACTIVATIONS {
                    names.push(format!("mlxcel::prompt_gated<{bits}, {scale}, {act}, {tile}>"));
                }
            }
        }
    }
    names.extend(ATTENTION_KERNELS.iter().map(|k| k.to_string()));
    names.push(NORM_KERNEL.to_string());
    for bits in BITS {
        for scale in SCALE_TYPES {
            names.push(format!("mlxcel::gather<{bits}, {scale}>"));
        }
    }
    names
}

/// The NVRTC program of the module for `arch` (`sm_90a`), with the CUDA
/// runtime's headers (`cuda_fp16.h`, `cuda_bf16.h`) from `cuda_include`.
pub fn program(arch: &str, cuda_include: &Path) -> Program {
    Program {
        name: format!("{MODULE}.cu"),
        source: SOURCE.to_string(),
        headers: HEADERS
            .iter()
            .map(|(name, source)| Header { include_name: name.to_string(), source: source.to_string() })
            .collect(),
        name_expressions: name_expressions(),
        options: vec![
            format!("--gpu-architecture={arch}"),
            format!("--include-path={}", cuda_include.display()),
            "-std=c++17".into(),
        ],
    }
}

/// Loads a compiled module (its cubin and its `NAME.txt`) into MLX's CUDA
/// context; from then on the GPU's quantized products and cached attention
/// steps of up to 32 rows take mlxcel's kernels. Returns the number of
/// kernels. Fails in a build without the `cuda` feature, without a GPU, or
/// when the cubin is not for this GPU.
pub fn load(cubin: &[u8], names: &str) -> Result<usize> {
    bridge::load_gpu_kernels(cubin, names).map_err(|e| Error::Device(e.what().to_string()))
}

/// Whether [`load`] has succeeded in this process.
pub fn loaded() -> bool {
    bridge::gpu_kernels_loaded()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nvrtc::Nvrtc;
    use std::path::PathBuf;

    fn cu13() -> PathBuf {
        let deps = std::env::var_os("MLXCEL_DEPS_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.deps"));
        let dir = deps.join("nvrtc-13/nvidia/cu13");
        assert!(dir.join("lib/libnvrtc.so.13").is_file(), "{} is missing: run `make setup-cuda`", dir.display());
        dir
    }

    #[test]
    fn every_kernel_compiles_for_hopper() {
        let dir = cu13();
        let nvrtc = Nvrtc::open(dir.join("lib/libnvrtc.so.13")).unwrap();
        let out = nvrtc.compile(&program("sm_90a", &dir.join("include"))).unwrap();
        assert_eq!(&out.cubin[..4], b"\x7fELF");
        // 6 widths × 3 scale types × (2 products, 2 × 2 gated, and 2
        // prompt tiles × (1 product and 2 gated)), the attention and the
        // copy, the norm, 6 × 3 gathers.
        assert_eq!(out.lowered_names.len(), 237);
        assert_eq!(out.lowered_names[216].0, "mlxcel::cached_attention");
        assert_eq!(out.lowered_names[217].0, "mlxcel::copy_floats");
        assert_eq!(out.lowered_names[218].0, "mlxcel::rms_norm");
        assert_eq!(out.lowered_names[227].0, "mlxcel::gather<4, __nv_bfloat16>");
        assert_eq!(out.lowered_names[1].0, "mlxcel::product<2, float, 4>");
        assert_eq!(out.lowered_names[6].0, "mlxcel::prompt_product<2, float, 32>");
        assert_eq!(out.lowered_names[11].0, "mlxcel::prompt_gated<2, float, 2, 64>");
        let (expression, lowered) = &out.lowered_names[3];
        assert_eq!(expression, "mlxcel::gated<2, float, 1, 8>");
        assert!(lowered.starts_with("_ZN6mlxcel5gatedILi2EfLi1ELi8EEEvNS_11ProductArgsE"), "{lowered}");
    }

    /// The shapes named here are the ones `gpu_args.h` launches: a launch
    /// of a shape the module lacks would fail at its first step.
    #[test]
    fn kernel_shapes_are_the_launchers() {
        let args = include_str!("../cuda/gpu_args.h");
        let constant = |name: &str| -> u32 {
            let line = args
                .lines()
                .find(|l| l.starts_with(&format!("constexpr int {name} = ")))
                .unwrap_or_else(|| panic!("gpu_args.h defines no {name}"));
            line.trim_end_matches(';').rsplit(' ').next().unwrap().parse().unwrap()
        };
        assert_eq!(PRODUCT_WIDTHS, [1, constant("kWide")]);
        assert_eq!(GATED_CHUNKS, [constant("kRowChunk"), constant("kGatedChunk")]);
        assert_eq!(PROMPT_TILES, [constant("kTileRowsSmall"), constant("kTileRows")]);
    }

    #[test]
    fn loading_needs_a_cubin() {
        // Fails the same way with and without the `cuda` feature: never loaded.
        assert!(load(b"not a cubin", "").is_err());
        assert!(!loaded());
    }
}
