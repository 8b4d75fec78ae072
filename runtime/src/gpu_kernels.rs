//! MLX's run-time compiled CUDA kernels, installed from the bundle.
//!
//! MLX's CUDA backend compiles a few kernel modules with NVRTC the first
//! time a process needs them (the embedding gather, the quantized matmul of
//! prompts of 8 or more rows): seconds to a minute each, again for every new
//! row tile. `mlxcel-compile --target cuda-smXY` compiles them ahead of time
//! and stores them as `kernels` sections in MLX's own cache file format
//! (docs/bundle-format.md §4.2, kernel set `mlx-ptx-cache`). Before the
//! first GPU step the runtime writes the sections for this GPU into a
//! private cache directory and points MLX at it, so MLX loads them and
//! compiles nothing.
//!
//! The same sections carry mlxcel's own module
//! ([`mlxcel_mlx::cuda_kernels`]); it is loaded here too, after which the
//! quantized products and the attention of decode steps run as mlxcel's
//! kernels.
//!
//! A bundle without kernels for the GPU found is refused unless the caller
//! asks for MLX's run-time compilation or the CPU ([`MissingGpuKernels`]).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use mlxcel_bundle::{Bundle, SectionView, kinds};
use mlxcel_mlx::{cuda_kernels, device};

use crate::error::{Error, Result};

pub use mlxcel_bundle::kinds::KERNEL_SET_MLX_PTX_CACHE;

/// What to do when the GPU runs a bundle without kernels compiled for it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MissingGpuKernels {
    /// Refuse the bundle, naming the GPU's architecture and the bundle's.
    #[default]
    Refuse,
    /// Let MLX compile its kernels at run time (seconds to a minute for
    /// each new module, the first time a process needs it).
    Jit,
    /// Run on the CPU instead.
    Cpu,
}

impl MissingGpuKernels {
    /// Parses `refuse` or `jit`.
    pub fn parse(value: &str) -> Option<MissingGpuKernels> {
        match value.trim().to_ascii_lowercase().as_str() {
            "refuse" => Some(MissingGpuKernels::Refuse),
            "jit" => Some(MissingGpuKernels::Jit),
            "cpu" => Some(MissingGpuKernels::Cpu),
            _ => None,
        }
    }
}

/// Where a bundle's GPU kernels are installed, and what to do without them.
#[derive(Clone, Debug, Default)]
pub struct GpuKernelOptions {
    /// The directory under which each bundle's kernels get a folder of
    /// their own (default: `mlxcel-gpu-kernels` in the system's temporary
    /// directory; the command-line tools use the user's cache directory).
    pub cache_root: Option<PathBuf>,
    /// A bundle without kernels for this GPU.
    pub missing: MissingGpuKernels,
}

/// The GPU the kernels must match: NVRTC's architecture name, the linked
/// MLX version and CUDA major.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuTarget {
    /// `cuda:sm_90a` (the section target).
    pub target: String,
    /// `0.32.4`.
    pub mlx_version: String,
    /// `13`.
    pub cuda_major: u32,
}

impl GpuTarget {
    /// This process's GPU, or `None` when MLX has no CUDA GPU.
    pub fn detect() -> Option<GpuTarget> {
        let arch = device::cuda_arch()?;
        Some(GpuTarget {
            target: format!("cuda:{arch}"),
            mlx_version: mlxcel_mlx::mlx_version(),
            cuda_major: device::CUDA_MAJOR?,
        })
    }

    fn matches(&self, section: &SectionView<'_>) -> bool {
        section.target() == self.target
            && section.property(kinds::MLX_VERSION_KEY) == Some(self.mlx_version.as_str())
            && section.property(kinds::CUDA_MAJOR_KEY).and_then(|m| m.parse().ok()) == Some(self.cuda_major)
    }
}

/// What [`install`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Installed {
    /// The bundle's kernels for this GPU are in `dir`, MLX's cache from now on.
    Kernels {
        /// The cache directory.
        dir: PathBuf,
        /// How many modules (a cubin and its names file each).
        modules: usize,
        /// Files written now (0 when an earlier process installed them).
        written: usize,
        /// Kernels of mlxcel's own module loaded (0 for a bundle compiled
        /// before it existed: the GPU then runs MLX's operations only).
        own_kernels: usize,
        /// The interface version of the bundle's own module when it is not
        /// this runtime's ([`cuda_kernels::ABI`]; 1 for a module stored
        /// without one): that module is not loaded.
        own_stale: Option<u32>,
    },
    /// No kernels for this GPU; MLX compiles at run time, as asked.
    Jit,
    /// No kernels for this GPU; the process now computes on the CPU, as asked.
    Cpu,
}

impl std::fmt::Display for Installed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Installed::Kernels { dir, modules, written, own_kernels, own_stale } => {
                write!(
                    f,
                    "{modules} modules from the bundle in {} ({written} files written); mlxcel's own: {own_kernels} kernels",
                    dir.display()
                )?;
                if let Some(abi) = own_stale {
                    write!(
                        f,
                        " (the bundle's were built for version {abi} of their interface, this runtime's is {}: \
                         MLX's operations run instead; recompile the bundle with --target cuda-smXY for them)",
                        cuda_kernels::ABI
                    )?;
                }
                Ok(())
            }
            Installed::Jit => f.write_str("none in the bundle for this GPU: MLX compiles them at run time"),
            Installed::Cpu => f.write_str("none in the bundle for this GPU: running on the CPU"),
        }
    }
}

/// The bundle's MLX cache sections (any target).
fn kernel_sections(bundle: &Bundle) -> impl Iterator<Item = SectionView<'_>> {
    bundle
        .sections_of_kind(kinds::KERNELS)
        .filter(|s| s.property(kinds::KERNEL_SET_KEY) == Some(KERNEL_SET_MLX_PTX_CACHE))
}

/// The targets the bundle has MLX kernels for, as `target (MLX v, CUDA n)`.
pub fn bundle_targets(bundle: &Bundle) -> Vec<String> {
    let mut targets: Vec<String> = kernel_sections(bundle)
        .map(|s| {
            format!(
                "{} (MLX {}, CUDA {})",
                s.target(),
                s.property(kinds::MLX_VERSION_KEY).unwrap_or("?"),
                s.property(kinds::CUDA_MAJOR_KEY).unwrap_or("?")
            )
        })
        .collect();
    targets.sort();
    targets.dedup();
    targets
}

/// A section key is a file name in MLX's cache: `NAME.ptx` or `NAME.txt`,
/// with no path separators (the bundle is data, not a place to write).
fn valid_key(key: &str) -> bool {
    let stem = key.strip_suffix(".ptx").or_else(|| key.strip_suffix(".txt"));
    stem.is_some_and(|s| {
        !s.is_empty() && s.len() <= 200 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    })
}

/// Installs `bundle`'s kernels for `gpu` under `options.cache_root` and
/// points MLX's cache at them; with none for this GPU, refuses or leaves
/// MLX to compile, as `options.missing` says. Call before the first GPU
/// computation.
pub fn install(bundle: &Bundle, gpu: &GpuTarget, options: &GpuKernelOptions) -> Result<Installed> {
    let sections: Vec<SectionView<'_>> = kernel_sections(bundle).filter(|s| gpu.matches(s)).collect();
    if sections.is_empty() {
        return match options.missing {
            MissingGpuKernels::Jit => Ok(Installed::Jit),
            MissingGpuKernels::Cpu => {
                device::set_default_device(device::Device::Cpu)?;
                Ok(Installed::Cpu)
            }
            MissingGpuKernels::Refuse => Err(Error::GpuKernels(missing_message(bundle, gpu))),
        };
    }
    if let Some(bad) = sections.iter().find(|s| !valid_key(s.key())) {
        return Err(Error::GpuKernels(format!(
            "the bundle's kernels section {:?} (target {}) is not an MLX cache file name",
            bad.key(),
            bad.target()
        )));
    }
    let root = options.cache_root.clone().unwrap_or_else(|| std::env::temp_dir().join("mlxcel-gpu-kernels"));
    // One folder per bundle content and target: a rebuilt bundle never
    // sees an older one's files, and MLX may add its own beside them.
    let hash = bundle.root_hash();
    let folder: String = hash[..12].iter().map(|b| format!("{b:02x}")).collect();
    let dir = root.join(format!("{folder}-{}", gpu.target.trim_start_matches("cuda:")));
    let io = |what: &str, path: &Path, e: std::io::Error| {
        Error::GpuKernels(format!(
            "cannot {what} {}: {e} (set the cache folder with --gpu-kernel-cache)",
            path.display()
        ))
    };
    fs::create_dir_all(&dir).map_err(|e| io("create", &dir, e))?;
    let mut written = 0;
    for section in &sections {
        let path = dir.join(section.key());
        let data = section.data();
        if fs::read(&path).is_ok_and(|existing| existing == data) {
            continue;
        }
        // Temp file + rename: a process reading the folder (another server
        // on the same bundle) never sees half a cubin.
        let tmp = dir.join(format!(".{}.{}.tmp", section.key(), std::process::id()));
        let result = fs::File::create(&tmp)
            .and_then(|mut f| f.write_all(data).and_then(|()| f.sync_all()))
            .and_then(|()| fs::rename(&tmp, &path));
        if let Err(e) = result {
            let _ = fs::remove_file(&tmp);
            return Err(io("write", &path, e));
        }
        written += 1;
    }
    device::set_jit_cache_dir(&dir)?;
    let modules = sections.iter().filter(|s| s.key().ends_with(".ptx")).count();
    let (own_kernels, own_stale) = load_own_kernels(&sections)?;
    Ok(Installed::Kernels { dir, modules, written, own_kernels, own_stale })
}

/// Loads mlxcel's own module from the sections, if the bundle has one of
/// this runtime's interface version; returns its kernel count (0 without
/// it) and the version of a module left unloaded for being another's.
fn load_own_kernels(sections: &[SectionView<'_>]) -> Result<(usize, Option<u32>)> {
    let find = |ext: &str| {
        let key = format!("{}.{ext}", cuda_kernels::MODULE);
        sections.iter().find(|s| s.key() == key)
    };
    let (Some(cubin), Some(names)) = (find("ptx"), find("txt")) else { return Ok((0, None)) };
    // Modules stored before the property existed are version 1; one that
    // does not parse is no version this runtime knows either.
    let abi = cubin.property(kinds::MLXCEL_KERNELS_ABI_KEY).map_or(Some(1), |v| v.parse::<u32>().ok());
    if abi != Some(cuda_kernels::ABI) {
        return Ok((0, Some(abi.unwrap_or(0))));
    }
    let names = std::str::from_utf8(names.data())
        .map_err(|_| Error::GpuKernels(format!("the bundle's {} is not UTF-8", names.key())))?;
    let count = cuda_kernels::load(cubin.data(), names).map_err(|e| Error::GpuKernels(e.to_string()))?;
    Ok((count, None))
}

/// Why a bundle without kernels for `gpu` is refused, and what to do.
fn missing_message(bundle: &Bundle, gpu: &GpuTarget) -> String {
    let has = bundle_targets(bundle);
    let has = if has.is_empty() { "none".to_string() } else { has.join(", ") };
    let arch = gpu.target.trim_start_matches("cuda:sm_").trim_end_matches('a');
    format!(
        "the bundle has no GPU kernels for this GPU, {} (MLX {}, CUDA {}); it has: {has}. \
         Compile them into the bundle with `mlxcel-compile MODEL --target cuda-sm{arch}`, \
         run on the CPU (--device cpu, or --gpu-kernels cpu to do so only for such bundles), \
         or let MLX compile them at run time (a minute per new prompt length) with --gpu-kernels jit",
        gpu.target, gpu.mlx_version, gpu.cuda_major
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_plain_cache_file_names() {
        assert!(valid_key("qmm_naive_tn_aligned_float32_m16_b4_g32_affine.ptx"));
        assert!(valid_key("gather_float32_uint32_1.txt"));
        for bad in ["../x.ptx", "a/b.ptx", ".ptx", "x.cu", "x.ptx/", "x", "/etc/passwd.txt", "a b.ptx"] {
            assert!(!valid_key(bad), "{bad}");
        }
    }

    #[test]
    fn parses_the_missing_kernels_policy() {
        assert_eq!(MissingGpuKernels::parse("JIT"), Some(MissingGpuKernels::Jit));
        assert_eq!(MissingGpuKernels::parse("refuse"), Some(MissingGpuKernels::Refuse));
        assert_eq!(MissingGpuKernels::parse("cpu"), Some(MissingGpuKernels::Cpu));
        assert_eq!(MissingGpuKernels::parse("gpu"), None);
    }
}
