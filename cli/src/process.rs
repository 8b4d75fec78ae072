//! Process settings shared by `mlxcel` and `mlxcel-server`: the compute
//! device, the CPU kernels' instruction set and thread count, read from the
//! environment (`MLXCEL_DEVICE`, `MLXCEL_ISA`, `MLXCEL_THREADS`: README.md)
//! with the flags taking precedence, and applied once at start.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use mlxcel_mlx::Device;
use mlxcel_mlx::device::DeviceRequest;
use mlxcel_mlx::fast::Isa;
use mlxcel_mlx::settings::Settings;
use mlxcel_runtime::gpu_kernels::{GpuKernelOptions, MissingGpuKernels};
use mlxcel_runtime::iree_backend::IreeOptions;
use mlxcel_runtime::loader::BackendKind;

/// Parses `--device`: cpu, gpu or auto.
pub fn parse_device(value: &str) -> std::result::Result<DeviceRequest, String> {
    DeviceRequest::parse(value).ok_or_else(|| format!("{value:?} is not a device: use cpu, gpu or auto"))
}

/// Reads the process settings from the environment, overrides them with the
/// flags given, and applies them; returns the device chosen. A bad value
/// stops here, naming the variable or flag.
pub fn apply_settings(device: Option<DeviceRequest>, isa: Option<Isa>, threads: Option<usize>) -> Result<Device> {
    let mut settings = Settings::from_env(|name| std::env::var(name).ok())?;
    if let Some(device) = device {
        settings.device = device;
    }
    if let Some(isa) = isa {
        settings.isa = Some(isa);
    }
    if let Some(threads) = threads {
        settings.threads = Some(threads);
    }
    Ok(settings.apply()?)
}

/// Refuses a bundle path that is a directory before the bundle reader
/// tries to map it (which fails with the confusing "No such device").
pub fn check_bundle_path(path: &Path) -> Result<()> {
    if path.is_dir() {
        bail!("{} is a directory, not a bundle file", path.display());
    }
    Ok(())
}

/// The flags for MLX's CUDA kernels that a bundle carries
/// (`mlxcel-compile --target cuda-smXY`), shared by `mlxcel run`,
/// `mlxcel bench` and `mlxcel-server`. Only a CUDA GPU reads them.
#[derive(clap::Args, Clone, Debug)]
pub struct GpuKernelFlags {
    /// On a CUDA GPU, what to do with a bundle that has no kernels compiled
    /// for it (`mlxcel-compile --target cuda-smXY`): refuse it, naming the
    /// GPU's architecture and the bundle's; jit, let MLX compile them while
    /// running (seconds to a minute for each, the first time a process
    /// meets a new prompt-length tile); or cpu, run such a bundle on the CPU.
    #[arg(long, value_name = "refuse|jit|cpu", env = "MLXCEL_GPU_KERNELS", default_value = "refuse",
          value_parser = parse_missing_gpu_kernels)]
    pub gpu_kernels: MissingGpuKernels,
    /// Where a bundle's GPU kernels are unpacked for MLX to load (a folder
    /// per bundle and GPU inside) [default: $XDG_CACHE_HOME/mlxcel/gpu-kernels,
    /// else ~/.cache/mlxcel/gpu-kernels].
    #[arg(long, value_name = "DIR", env = "MLXCEL_GPU_KERNEL_CACHE")]
    pub gpu_kernel_cache: Option<PathBuf>,
}

impl GpuKernelFlags {
    /// The runtime's options for these flags.
    pub fn options(&self) -> GpuKernelOptions {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        let cache_root = self.gpu_kernel_cache.clone().or_else(|| {
            var("XDG_CACHE_HOME")
                .or_else(|| var("HOME").map(|home| home.join(".cache")))
                .map(|cache| cache.join("mlxcel").join("gpu-kernels"))
        });
        GpuKernelOptions { cache_root, missing: self.gpu_kernels }
    }
}

/// The backend flags of `mlxcel run`, `mlxcel bench` and `mlxcel-server`.
#[derive(clap::Args, Clone, Debug)]
pub struct BackendFlags {
    /// What runs the model: mlx, MLX with mlxcel's kernels (CPU, or the GPU
    /// of a CUDA build); or iree, the bundle's own IREE module (compiled in by
    /// `mlxcel-compile --target iree-llvm-cpu`) on IREE's runtime, on the CPU
    /// (a build with the `iree` feature). With iree the context is the
    /// module's cache capacity (`mlxcel inspect` shows it).
    #[arg(long, value_name = "mlx|iree", env = "MLXCEL_BACKEND", default_value = "mlx", value_parser = parse_backend)]
    pub backend: BackendKind,
    /// IREE's device with --backend iree: local-task, its thread pool (as
    /// many workers as --threads), or local-sync, the engine thread alone.
    #[arg(long, value_name = "local-task|local-sync", env = "MLXCEL_IREE_DRIVER", default_value = "local-task",
          value_parser = parse_iree_driver)]
    pub iree_driver: String,
}

impl BackendFlags {
    /// The runtime's options for these flags; IREE's pool gets the thread
    /// count of mlxcel's kernels (`--threads`, `MLXCEL_THREADS`, else the
    /// physical cores), so call it after [`apply_settings`].
    pub fn iree_options(&self) -> IreeOptions {
        IreeOptions { driver: self.iree_driver.clone(), threads: mlxcel_mlx::fast::default_threads() }
    }

    /// What runs the model, for logs and tables: `iree local-task`, or
    /// MLX's device (`cpu`, `gpu`). Call after [`apply_settings`].
    pub fn device_label(&self) -> String {
        match self.backend {
            BackendKind::Iree => format!("iree {}", self.iree_driver),
            BackendKind::Mlx => mlxcel_mlx::device::default_device().to_string(),
        }
    }

    /// Threads the model runs on (IREE's local-sync: the engine thread
    /// alone). Call after [`apply_settings`].
    pub fn threads(&self) -> usize {
        match (self.backend, self.iree_driver.as_str()) {
            (BackendKind::Iree, "local-sync") => 1,
            (BackendKind::Iree, _) => mlxcel_mlx::fast::default_threads(),
            (BackendKind::Mlx, _) => mlxcel_mlx::fast::threads(),
        }
    }
}

fn parse_backend(value: &str) -> std::result::Result<BackendKind, String> {
    match value {
        "mlx" => Ok(BackendKind::Mlx),
        "iree" => Ok(BackendKind::Iree),
        _ => Err(format!("{value:?} is not a backend: use mlx or iree")),
    }
}

fn parse_iree_driver(value: &str) -> std::result::Result<String, String> {
    match value {
        "local-task" | "local-sync" => Ok(value.to_string()),
        _ => Err(format!("{value:?} is not an IREE CPU driver: use local-task or local-sync")),
    }
}

/// Parses `--gpu-kernels`: refuse, jit or cpu.
fn parse_missing_gpu_kernels(value: &str) -> std::result::Result<MissingGpuKernels, String> {
    MissingGpuKernels::parse(value).ok_or_else(|| format!("{value:?} is not a choice: use refuse, jit or cpu"))
}
