//! Process settings shared by `mlxcel` and `mlxcel-server`: the compute
//! device, the CPU kernels' instruction set and thread count, read from the
//! environment (`MLXCEL_DEVICE`, `MLXCEL_ISA`, `MLXCEL_THREADS`: README.md)
//! with the flags taking precedence, and applied once at start.

use std::path::Path;

use anyhow::{Result, bail};
use mlxcel_mlx::Device;
use mlxcel_mlx::device::DeviceRequest;
use mlxcel_mlx::fast::Isa;
use mlxcel_mlx::settings::Settings;

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
