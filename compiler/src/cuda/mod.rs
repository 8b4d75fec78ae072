//! MLX's run-time-compiled CUDA kernels, made ahead of time
//! (`mlxcel-compile --target cuda-smXY`, issue \[9\]).
//!
//! MLX 0.32.4 compiles a few kernel modules with NVRTC the first time a
//! process needs them (seconds to minutes on a fresh GPU host) and caches
//! them in `MLX_PTX_CACHE_DIR`. The set a model needs is known from its
//! quantized matrices ([`plan`]); this module compiles it here, without a
//! GPU, from the module sources built into MLX's CUDA `libmlx.so`
//! ([`wheel`]) with NVRTC loaded at run time ([`mlxcel_mlx::nvrtc`]), and
//! the compile pipeline stores each module as two `kernels` sections that
//! a runtime writes into a private cache directory
//! (docs/bundle-format.md §4.2.2).

mod build;
pub mod plan;
pub mod wheel;

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

pub use build::{BuiltModule, KernelEvent, KernelToolchain};
pub use plan::{KernelModule, MlxDtype, ModuleSource, QuantizedMatrix};
pub use wheel::{MLX_VERSION, MlxCuda};

/// Errors of making the kernels.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// No MLX CUDA wheel where one was expected.
    #[error(
        "{}: no MLX CUDA wheel here (expected include/mlx/version.h and lib/libmlx.so); install it with `make setup-cuda` (into .deps/mlx-cuda-13/mlx)",
        dir.display()
    )]
    NoMlxCuda {
        /// The folder given.
        dir: PathBuf,
    },
    /// No NVRTC where one was expected.
    #[error(
        "{}: no NVRTC here (expected nvidia/cu13/lib/libnvrtc.so.13 and nvidia/cu13/include); install it with `make setup-cuda` (into .deps/nvrtc-13)",
        dir.display()
    )]
    NoNvrtc {
        /// The folder given.
        dir: PathBuf,
    },
    /// The wheel's MLX is not the version the kernel names are written for.
    #[error("{}: MLX {found}, but the kernel names are written for MLX {expected} only", path.display())]
    MlxVersion {
        /// `version.h`.
        path: PathBuf,
        /// Its version.
        found: String,
        /// [`MLX_VERSION`].
        expected: &'static str,
    },
    /// A file of the wheel could not be read as expected.
    #[error("{}: {message}", path.display())]
    Library {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// Reading a file failed.
    #[error("reading {}: {cause}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error (in the message, not `source()`).
        cause: std::io::Error,
    },
    /// NVRTC failed.
    #[error(transparent)]
    Nvrtc(#[from] mlxcel_mlx::nvrtc::NvrtcError),
}

/// A GPU architecture to compile for (`--target cuda-sm90`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CudaTarget {
    /// Compute capability, major.
    pub major: u32,
    /// Compute capability, minor.
    pub minor: u32,
}

impl CudaTarget {
    /// The targets `--target` accepts (every one has compute capability 8.0
    /// or more, which MLX's kernel names assume).
    pub const SUPPORTED: [CudaTarget; 6] = [
        CudaTarget { major: 8, minor: 0 },
        CudaTarget { major: 8, minor: 6 },
        CudaTarget { major: 8, minor: 9 },
        CudaTarget { major: 9, minor: 0 },
        CudaTarget { major: 10, minor: 0 },
        CudaTarget { major: 12, minor: 0 },
    ];

    /// NVRTC's architecture as MLX asks for it: `sm_XY`, with MLX's `a`
    /// suffix (architecture-specific features) from compute capability 9.
    pub fn nvrtc_arch(self) -> String {
        let suffix = if self.major >= 9 { "a" } else { "" };
        format!("sm_{}{}{suffix}", self.major, self.minor)
    }

    /// The bundle section's target: `cuda:` and the NVRTC architecture.
    pub fn section_target(self) -> String {
        format!("cuda:{}", self.nvrtc_arch())
    }
}

impl fmt::Display for CudaTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cuda-sm{}{}", self.major, self.minor)
    }
}

impl FromStr for CudaTarget {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        CudaTarget::SUPPORTED.into_iter().find(|t| t.to_string() == s).ok_or_else(|| {
            let names: Vec<String> = CudaTarget::SUPPORTED.iter().map(ToString::to_string).collect();
            format!("unknown target {s:?}: use {}", names.join(", "))
        })
    }
}

/// What `--target cuda-*` asks for: the architectures and where the tools are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaKernelOptions {
    /// The architectures (each module is compiled once per target).
    pub targets: Vec<CudaTarget>,
    /// MLX's CUDA wheel, its `mlx/` folder (`.deps/mlx-cuda-13/mlx`).
    pub mlx_cuda: PathBuf,
    /// The unpacked NVRTC and CUDA runtime wheels' site folder, holding
    /// `nvidia/cu13/{lib,include}` (`.deps/nvrtc-13`).
    pub nvrtc: PathBuf,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        let t: CudaTarget = "cuda-sm90".parse().unwrap();
        assert_eq!((t.nvrtc_arch(), t.section_target()), ("sm_90a".into(), "cuda:sm_90a".into()));
        assert_eq!("cuda-sm86".parse::<CudaTarget>().unwrap().nvrtc_arch(), "sm_86");
        assert_eq!("cuda-sm120".parse::<CudaTarget>().unwrap().nvrtc_arch(), "sm_120a");
        assert_eq!("cuda-sm100".parse::<CudaTarget>().unwrap().nvrtc_arch(), "sm_100a");
        let err = "cuda-sm75".parse::<CudaTarget>().unwrap_err();
        assert!(err.contains("cuda-sm80, cuda-sm86, cuda-sm89, cuda-sm90, cuda-sm100, cuda-sm120"), "{err}");
    }
}
