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

/// The environment variable that overrides the device choice.
pub const DEVICE_ENV: &str = "MLXCEL_DEVICE";

/// The device MLX computes on by default in this process.
pub fn default_device() -> Device {
    if bridge::default_device() == bridge::DeviceKind::Gpu { Device::Gpu } else { Device::Cpu }
}

/// Makes `device` the default for new operations, process-wide.
pub fn set_default_device(device: Device) -> Result<()> {
    if !device.is_available() {
        return Err(Error::Device(format!(
            "the {device} device was requested but the linked MLX {} has none (build against a GPU-enabled libmlx, or use MLXCEL_DEVICE=cpu)",
            crate::mlx_version()
        )));
    }
    bridge::set_default_device(device.ffi()).map_err(|e| Error::Device(e.what().to_string()))
}

/// The device a process should use: `MLXCEL_DEVICE` (`cpu`, `gpu` or `auto`)
/// when set, else the GPU when the linked libmlx has one, else the CPU.
pub fn requested_device() -> Result<Device> {
    parse_device_request(std::env::var(DEVICE_ENV).ok().as_deref())
}

/// Parses a device request (`None` or `"auto"` picks the best available).
pub fn parse_device_request(value: Option<&str>) -> Result<Device> {
    match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
        None | Some("") | Some("auto") => Ok(if Device::Gpu.is_available() { Device::Gpu } else { Device::Cpu }),
        Some("cpu") => Ok(Device::Cpu),
        Some("gpu") | Some("cuda") | Some("metal") => {
            if Device::Gpu.is_available() {
                Ok(Device::Gpu)
            } else {
                Err(Error::Device(format!(
                    "{DEVICE_ENV} asks for the GPU but the linked MLX {} has no GPU backend (this is a CPU build; use MLXCEL_DEVICE=cpu or link a CUDA/Metal libmlx)",
                    crate::mlx_version()
                )))
            }
        }
        Some(other) => Err(Error::Device(format!("{DEVICE_ENV}={other:?} is not a device: use cpu, gpu or auto"))),
    }
}

/// Picks the device from the environment (see [`requested_device`]) and makes
/// it the default. Call once at start-up, before building any array.
pub fn init_from_env() -> Result<Device> {
    let device = requested_device()?;
    set_default_device(device)?;
    Ok(device)
}

/// Waits until all queued work on the default stream is done.
pub fn synchronize() -> Result<()> {
    bridge::synchronize().map_err(|e| Error::mlx("synchronize", e))
}
