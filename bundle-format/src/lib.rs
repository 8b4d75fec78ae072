//! `mlxcel-bundle`: the `.mlxb` bundle format.
//!
//! A bundle is one little-endian file: a fixed 128-byte [`Header`] at offset
//! 0, then tensor data and sections, each starting at a multiple of
//! [`ALIGNMENT`] (16 KiB), then the rkyv-archived [`Manifest`] at the end.
//! The normative description is `docs/bundle-format.md`.
//!
//! - [`BundleWriter`] streams tensors and sections into a temporary file and
//!   renames it into place on [`BundleWriter::finish`].
//! - [`Bundle::open`] maps a file read-only and validates everything except
//!   the data bytes; [`Bundle::tensor`] then hands out zero-copy views.
//! - [`Bundle::verify`] hashes every byte.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod dtype;
mod error;
mod header;
pub mod manifest;
pub mod raw;
mod reader;
pub mod rows16;
mod temp;
mod verify;
mod writer;

pub use dtype::{Dtype, UnknownDtype};
pub use error::{BundleError, RegionName, Result, VerifyFailure, hex};
pub use header::{Header, KNOWN_REQUIRED_FLAGS, REQUIRED_FLAGS_MASK, offsets as header_offsets};
pub use manifest::{
    Extension, KeyValue, Manifest, ModelInfo, Provenance, Quantization, RepackRecord, SectionEntry, SourceFile,
    SurgeryOperation, SurgeryRecord, TensorEntry, TokenizerInfo,
};
pub use reader::{Bundle, QuantizationView, SectionView, TensorView};
pub use temp::remove_temporary_files;
pub use verify::{VerifyProgress, VerifyReport};
pub use writer::{BundleWriter, SealedBundle, SectionSpec, TensorSpec, WrittenBundle, encode_manifest};

/// The 8 magic bytes at offset 0: `\x89MLXB\r\n\x1a` (PNG-style: a high
/// byte catches 7-bit transfers, CR LF catches newline conversion).
pub const MAGIC: [u8; 8] = *b"\x89MLXB\r\n\x1a";
/// The format major version this crate reads and writes.
pub const FORMAT_MAJOR: u16 = 1;
/// The format minor version this crate writes (1.1 adds the `rows16` layout
/// tag, 1.2 the `token-bytes` tokenizer section).
pub const FORMAT_MINOR: u16 = 2;
/// Length of the fixed header.
pub const HEADER_LEN: usize = 128;
/// Every tensor, section and the manifest start at a multiple of this (16 KiB:
/// Apple's page size, a multiple of 4 KiB pages, direct-I/O and SIMD alignment).
pub const ALIGNMENT: u64 = 16384;
/// The most dimensions a tensor may have.
pub const MAX_DIMS: usize = 32;
/// The default layout tag: C-contiguous (row-major) elements.
pub const LAYOUT_ROW_MAJOR: &str = "row-major";
pub use rows16::LAYOUT_ROWS16;
/// Required extensions this reader understands (none in version 1.0).
pub const KNOWN_EXTENSIONS: &[&str] = &[];

/// Well-known section kinds. Readers ignore sections of kinds they do not know.
pub mod kinds {
    /// Tokenizer files; key `tokenizer.json` is the Hugging Face tokenizer.
    pub const TOKENIZER: &str = "tokenizer";
    /// The key of the Hugging Face `tokenizer.json` in a [`TOKENIZER`] section.
    pub const TOKENIZER_JSON_KEY: &str = "tokenizer.json";
    /// The key of the compiled tokenizer (crate `mlxcel-tokenizer`'s layout)
    /// in a [`TOKENIZER`] section: the same tokenizer as `tokenizer.json`,
    /// checked against it by the compiler, that loads in milliseconds.
    pub const TOKENIZER_COMPILED_KEY: &str = "mlxcel-tokenizer";
    /// The key of the vocabulary's bytes (crate `mlxcel-tokenizer`'s
    /// `token_bytes` layout) in a [`TOKENIZER`] section: every token's output
    /// bytes and special flag, what constrained decoding matches grammars
    /// against (since format 1.2).
    pub const TOKENIZER_TOKEN_BYTES_KEY: &str = "token-bytes";
    /// StableHLO (MLIR text) of one graph; key = graph name.
    pub const STABLEHLO: &str = "stablehlo";
    /// An IREE VM flatbuffer module; key = graph name, target = IREE target (triple, CPU features or GPU arch).
    pub const IREE_VMFB: &str = "iree-vmfb";
    /// The key of the module holding every traced function (`prefill_T`,
    /// `decode_B`) in [`STABLEHLO`] and [`IREE_VMFB`] sections
    /// (docs/bundle-format.md §4.2.3).
    pub const MODEL_GRAPH_KEY: &str = "model";
    /// The property of a [`STABLEHLO`] or [`IREE_VMFB`] section giving the
    /// KV caches' capacity in positions.
    pub const CACHE_CAPACITY_KEY: &str = "cache_capacity";
    /// The property listing the prompt-chunk lengths traced (`32,128,512`).
    pub const PREFILL_KEY: &str = "prefill";
    /// The property listing the decode batch sizes traced (`1,4`).
    pub const DECODE_KEY: &str = "decode";
    /// The property of an [`IREE_VMFB`] section naming the `iree-compile`
    /// version that made it (a runtime loads modules of its own version).
    pub const IREE_VERSION_KEY: &str = "iree_version";
    /// The property of an [`IREE_VMFB`] section compiled for the compiling
    /// machine's CPU (`llvm-cpu:TRIPLE:host`): the x86-64 extensions it had
    /// (`avx2,fma,...`), which the running CPU must have too.
    pub const CPU_FEATURES_KEY: &str = "cpu_features";
    /// The LLVM target triple of the machine this runs on, as an
    /// [`IREE_VMFB`] section's `llvm-cpu:TRIPLE:CPU` target names it: what
    /// the compiler records for `--target iree-llvm-cpu` and what a runtime
    /// looks for.
    pub fn host_llvm_triple() -> String {
        match (std::env::consts::ARCH, std::env::consts::OS) {
            (arch, "linux") => format!("{arch}-unknown-linux-gnu"),
            (arch, "macos") => format!("{arch}-apple-darwin"),
            (arch, os) => format!("{arch}-unknown-{os}"),
        }
    }
    /// Precompiled GPU kernels; target = device arch, property
    /// [`KERNEL_SET_KEY`] names the kernel set, which defines the key.
    pub const KERNELS: &str = "kernels";
    /// The property of a [`KERNELS`] section naming its kernel set.
    pub const KERNEL_SET_KEY: &str = "kernel_set";
    /// The kernel set of MLX's own run-time-compiled CUDA kernels: files of
    /// MLX's `MLX_PTX_CACHE_DIR`, key = the file name (`NAME.ptx` holding
    /// the cubin, `NAME.txt` the kernels' names), target `cuda:sm_XY[a]`,
    /// properties `mlx_version` and `cuda_major` (docs/bundle-format.md
    /// §4.2.2).
    pub const KERNEL_SET_MLX_PTX_CACHE: &str = "mlx-ptx-cache";
    /// The property of a [`KERNEL_SET_MLX_PTX_CACHE`] section naming the MLX
    /// version whose kernels it holds (MLX's cache files are valid for that
    /// version only).
    pub const MLX_VERSION_KEY: &str = "mlx_version";
    /// The property of a [`KERNEL_SET_MLX_PTX_CACHE`] section naming the CUDA
    /// major version the kernels were compiled for.
    pub const CUDA_MAJOR_KEY: &str = "cuda_major";
    /// The property of the sections of mlxcel's own CUDA module
    /// (`mlxcel_kernels`) naming the version of its kernels' interface
    /// (argument layout, launch shapes, what each computes) it was built
    /// with; a runtime loads only a module of its own version.
    pub const MLXCEL_KERNELS_ABI_KEY: &str = "mlxcel_abi";
    /// An exported MLX function (`.mlxfn`); key = graph name.
    pub const MLX_FUNCTION: &str = "mlxfn";
    /// Any other blob; key names it.
    pub const BLOB: &str = "blob";
}
