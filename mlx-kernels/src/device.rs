//! Which device MLX computes on, chosen once per process.

use std::fmt;

use crate::error::{Error, Result};
use crate::ffi::bridge;

/// An MLX device kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Device {
    /// The host CPU.
    Cpu,
    /// The GPU of the linked libmlx (CUDA or Metal), if it has one.
    Gpu,
}

impl Device {
    fn ffi(self) -> bridge::DeviceKind {
        match self {
            Device::Cpu => bridge::DeviceKind::Cpu,
            Device::Gpu => bridge::DeviceKind::Gpu,
        }
    }

    /// `"cpu"` or `"gpu"`.
    pub fn name(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Gpu => "gpu",
        }
    }

    /// Whether the linked libmlx can compute on this device.
    pub fn is_available(self) -> bool {
        match self {
            Device::Cpu => true,
            Device::Gpu => bridge::gpu_available(),
        }
    }

    /// What MLX reports about the device (name and architecture), or
    /// `"unavailable"`.
    pub fn description(self) -> String {
        bridge::device_name(self.ffi()).unwrap_or_else(|e| format!("unknown ({})", e.what()))
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The device a process asks for (`MLXCEL_DEVICE`, [`crate::settings`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DeviceRequest {
    /// The GPU when the linked libmlx has one, else the CPU.
    #[default]
    Auto,
    /// The given device, which must be available.
    Exactly(Device),
}

impl DeviceRequest {
    /// Parses `cpu`, `gpu` (also `cuda`, `metal`) or `auto`, in any case.
    pub fn parse(value: &str) -> Option<DeviceRequest> {
        match value.trim().to_ascii_lowercase().as_str() {
            "auto" => Some(DeviceRequest::Auto),
            "cpu" => Some(DeviceRequest::Exactly(Device::Cpu)),
            "gpu" | "cuda" | "metal" => Some(DeviceRequest::Exactly(Device::Gpu)),
            _ => None,
        }
    }

    /// The device this asks for, if the linked libmlx has it.
    pub fn resolve(self) -> Result<Device> {
        match self {
            DeviceRequest::Auto => Ok(if Device::Gpu.is_available() { Device::Gpu } else { Device::Cpu }),
            DeviceRequest::Exactly(device) if device.is_available() => Ok(device),
            DeviceRequest::Exactly(device) => Err(Error::Device(format!(
                "the {device} device was requested but the linked MLX {} has none (build against a GPU-enabled libmlx, or use the cpu)",
                crate::mlx_version()
            ))),
        }
    }
}

impl fmt::Display for DeviceRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceRequest::Auto => f.write_str("auto"),
            DeviceRequest::Exactly(d) => d.fmt(f),
        }
    }
}

/// The device MLX computes on by default in this process.
pub fn default_device() -> Device {
    if bridge::default_device() == bridge::DeviceKind::Gpu { Device::Gpu } else { Device::Cpu }
}

/// Makes `device` the default for new operations, process-wide.
pub fn set_default_device(device: Device) -> Result<()> {
    DeviceRequest::Exactly(device).resolve()?;
    bridge::set_default_device(device.ffi()).map_err(|e| Error::Device(e.what().to_string()))
}

/// The CUDA major version of the linked MLX build (`mlx-cuda-13`, the
/// `cuda` feature), or `None` for a build without CUDA: kernels compiled
/// ahead of time must come from the same major (their NVRTC).
pub const CUDA_MAJOR: Option<u32> = if cfg!(feature = "cuda") { Some(13) } else { None };

/// The architecture MLX compiles its run-time (NVRTC) kernels for on this
/// machine's GPU, as NVRTC names it (`sm_90a` on an H100/H200: MLX adds the
/// `a` from compute capability 9), or `None` without a CUDA GPU.
pub fn cuda_arch() -> Option<String> {
    let arch = bridge::cuda_arch();
    (!arch.is_empty()).then_some(arch)
}

/// Points MLX's cache of run-time compiled kernels (`MLX_PTX_CACHE_DIR`) at
/// `dir`. MLX reads the setting once, the first time it needs such a
/// kernel, so this must run before the first GPU computation; the runtime
/// calls it when it installs a bundle's precompiled kernels.
pub fn set_jit_cache_dir(dir: &std::path::Path) -> Result<()> {
    let dir = dir.to_str().ok_or_else(|| Error::Device(format!("{} is not valid UTF-8", dir.display())))?;
    bridge::set_jit_cache_dir(dir).map_err(|e| Error::Device(e.what().to_string()))
}

/// Waits until all queued work on the default stream is done.
pub fn synchronize() -> Result<()> {
    bridge::synchronize().map_err(|e| Error::mlx("synchronize", e))
}

/// The instruction-set extensions of this CPU that compiled CPU code may
/// require, by LLVM's names (x86-64; empty elsewhere): what `mlxcel-compile`
/// records for a module compiled for its own CPU (`llvm-cpu:TRIPLE:host`)
/// and what the runtime checks before running one.
pub fn cpu_features() -> Vec<&'static str> {
    #[cfg(target_arch = "x86_64")]
    {
        let mut found = Vec::new();
        macro_rules! check {
            ($($f:tt),*) => {$(
                if std::arch::is_x86_feature_detected!($f) {
                    found.push($f);
                }
            )*};
        }
        check!(
            "sse4.2",
            "avx",
            "avx2",
            "fma",
            "f16c",
            "bmi2",
            "avx512f",
            "avx512bw",
            "avx512dq",
            "avx512vl",
            "avx512vnni",
            "avx512bf16",
            "avx512fp16"
        );
        found
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Vec::new()
    }
}
