//! The process-wide settings of the MLX layer and mlxcel's kernels: the
//! device, the kernels' instruction set, threads and idle spinning, whether
//! the kernels are used at all, inline evaluation and AMX tiles.
//!
//! No library code reads the environment (a value cached at first use
//! silently ignores later changes, and a typo silently means the default).
//! A binary builds one [`Settings`] at start, from its flags and
//! [`Settings::from_env`], turns an error into a clear exit, and calls
//! [`Settings::apply`], which goes through the setters ([`crate::fast::set_isa`],
//! [`crate::fast::set_default_threads`], [`crate::fast::set_spin`],
//! [`crate::fast::set_default_path`], [`crate::fast::set_inline_eval`],
//! [`crate::fast::set_amx`], [`crate::fast::set_step_graphs`],
//! [`crate::device::set_default_device`]) and
//! keeps freed memory for reuse ([`crate::fast::retain_freed_memory`]).
//! Test binaries do the same in their init helper.
//!
//! ```
//! use mlxcel_mlx::settings::Settings;
//! let s = Settings::from_env(|name| (name == "MLXCEL_THREADS").then(|| "2".to_string())).unwrap();
//! assert_eq!(s.threads, Some(2));
//! let err = Settings::from_env(|name| (name == "MLXCEL_THREADS").then(|| "abc".to_string())).unwrap_err();
//! assert_eq!(err.to_string(), "MLXCEL_THREADS=abc: expected a positive integer up to 4096");
//! ```

use crate::device::{self, Device, DeviceRequest};
use crate::fast::{self, Isa, Path};

/// `MLXCEL_DEVICE`: the device (`cpu`, `gpu`, `auto`).
pub const DEVICE: &str = "MLXCEL_DEVICE";
/// `MLXCEL_ISA`: the kernels' instruction set.
pub const ISA: &str = "MLXCEL_ISA";
/// `MLXCEL_THREADS`: the kernels' threads.
pub const THREADS: &str = "MLXCEL_THREADS";
/// `MLXCEL_SPIN_US`: how long idle kernel workers spin.
pub const SPIN_US: &str = "MLXCEL_SPIN_US";
/// `MLXCEL_SPIN_YIELD`: whether spinning workers yield their core.
pub const SPIN_YIELD: &str = "MLXCEL_SPIN_YIELD";
/// `MLXCEL_KERNELS`: mlxcel's kernels or MLX's ops.
pub const KERNELS: &str = "MLXCEL_KERNELS";
/// `MLXCEL_INLINE_EVAL`: inline evaluation of kernel-only graphs.
pub const INLINE_EVAL: &str = "MLXCEL_INLINE_EVAL";
/// `MLXCEL_AMX`: whether the kernels may use AMX tiles.
pub const AMX: &str = "MLXCEL_AMX";
/// `MLXCEL_STEP_GRAPHS`: whether GPU decode steps are recorded and replayed.
pub const STEP_GRAPHS: &str = "MLXCEL_STEP_GRAPHS";

/// One environment variable [`Settings::from_env`] reads.
#[derive(Clone, Copy, Debug)]
pub struct Variable {
    /// Its name.
    pub name: &'static str,
    /// The values it takes.
    pub values: &'static str,
    /// What it is when unset (or empty).
    pub default: &'static str,
    /// What it sets.
    pub meaning: &'static str,
}

/// Every variable [`Settings::from_env`] reads (README.md documents each).
pub const VARIABLES: [Variable; 9] = [
    Variable {
        name: DEVICE,
        values: "cpu, gpu (cuda, metal), auto",
        default: "auto: the GPU when the linked libmlx has one",
        meaning: "the device MLX computes on",
    },
    Variable {
        name: ISA,
        values: "scalar, avx2, avx2i16, avx512, avx512vnni, neon",
        default: "the best this CPU supports",
        meaning: "the instruction set of mlxcel's CPU kernels",
    },
    Variable {
        name: THREADS,
        values: "1 to 4096",
        default: "the physical cores the process may run on",
        meaning: "threads of mlxcel's CPU kernels",
    },
    Variable {
        name: SPIN_US,
        values: "0 to 1000000 (µs)",
        default: "3000",
        meaning: "how long an idle kernel worker polls for work before it sleeps",
    },
    Variable {
        name: SPIN_YIELD,
        values: "1, 0 (on, off, true, false, yes, no)",
        default: "1",
        meaning: "whether a polling worker yields its core between polls",
    },
    Variable {
        name: KERNELS,
        values: "auto (on, 1), kernel, mlx (off, 0)",
        default: "auto",
        meaning: "mlxcel's kernels where they cover the inputs (auto), always (kernel: uncovered inputs are errors), or MLX's own ops (mlx)",
    },
    Variable {
        name: INLINE_EVAL,
        values: "1, 0 (on, off, true, false, yes, no)",
        default: "1",
        meaning: "whether a graph of kernels only runs on the calling thread (fast::eval)",
    },
    Variable {
        name: AMX,
        values: "1, 0 (on, off, true, false, yes, no)",
        default: "1",
        meaning: "whether the avx512vnni kernels use AMX tiles where the CPU has them (same bits either way)",
    },
    Variable {
        name: STEP_GRAPHS,
        values: "1, 0 (on, off, true, false, yes, no)",
        default: "1",
        meaning: "whether a GPU decode step of mlxcel's kernels only is recorded once as a CUDA graph and replayed for the next steps of the same sequences (same bits either way)",
    },
];

/// A setting that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// A value that does not parse.
    #[error("{var}={value}: expected {expected}")]
    Invalid {
        /// The variable (or flag) that held it.
        var: &'static str,
        /// The value as given.
        value: String,
        /// What the variable takes.
        expected: &'static str,
    },
    /// A well-formed value this machine or build cannot honour.
    #[error("{var}={value}: {reason}")]
    Unusable {
        /// The variable (or flag) that held it.
        var: &'static str,
        /// The value.
        value: String,
        /// Why it cannot be used.
        reason: String,
    },
}

/// The process-wide settings; [`Settings::default`] is what a process has
/// when nothing is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// The device MLX computes on.
    pub device: DeviceRequest,
    /// The kernels' instruction set (`None`: the best this CPU supports).
    pub isa: Option<Isa>,
    /// The kernels' thread count (`None`: the physical cores).
    pub threads: Option<usize>,
    /// How long an idle kernel worker spins, µs.
    pub spin_us: u32,
    /// Whether a spinning worker yields its core between polls.
    pub spin_yield: bool,
    /// The path of `fast`'s free functions.
    pub kernels: Path,
    /// Whether `fast::eval` runs kernel-only graphs inline.
    pub inline_eval: bool,
    /// Whether the kernels may use AMX tiles ([`crate::fast::set_amx`]).
    pub amx: bool,
    /// Whether GPU decode steps are replayed as recorded CUDA graphs
    /// ([`crate::fast::set_step_graphs`]).
    pub step_graphs: bool,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            device: DeviceRequest::Auto,
            isa: None,
            threads: None,
            spin_us: 3000,
            spin_yield: true,
            kernels: Path::Auto,
            inline_eval: true,
            amx: true,
            step_graphs: true,
        }
    }
}

/// The largest thread count (and the pool's limit).
const MAX_THREADS: usize = 4096;
/// The longest spin, µs (a second; longer only burns a core).
const MAX_SPIN_US: u32 = 1_000_000;

fn invalid(var: &'static str, value: &str, expected: &'static str) -> SettingsError {
    SettingsError::Invalid { var, value: value.to_string(), expected }
}

fn parse_bool(var: &'static str, value: &str) -> Result<bool, SettingsError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "on" | "true" | "yes" => Ok(true),
        "0" | "off" | "false" | "no" => Ok(false),
        _ => Err(invalid(var, value, "1 or 0 (on/off, true/false, yes/no)")),
    }
}

impl Settings {
    /// The settings of [`VARIABLES`], each from `lookup(name)` when it gives
    /// a non-empty value, else its default. Pure: the caller passes the
    /// lookup (`|k| std::env::var(k).ok()` for the process environment). A
    /// value that does not parse is an error naming the variable and value.
    pub fn from_env(lookup: impl Fn(&str) -> Option<String>) -> Result<Settings, SettingsError> {
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let mut s = Settings::default();
        if let Some(v) = get(DEVICE) {
            s.device = DeviceRequest::parse(&v).ok_or_else(|| invalid(DEVICE, &v, "cpu, gpu or auto"))?;
        }
        if let Some(v) = get(ISA) {
            let isa = v.trim().to_ascii_lowercase().parse::<Isa>();
            s.isa = Some(isa.map_err(|_| invalid(ISA, &v, "scalar, avx2, avx2i16, avx512, avx512vnni or neon"))?);
        }
        if let Some(v) = get(THREADS) {
            let n = v.trim().parse::<usize>().ok().filter(|n| (1..=MAX_THREADS).contains(n));
            s.threads = Some(n.ok_or_else(|| invalid(THREADS, &v, "a positive integer up to 4096"))?);
        }
        if let Some(v) = get(SPIN_US) {
            let n = v.trim().parse::<u32>().ok().filter(|&n| n <= MAX_SPIN_US);
            s.spin_us = n.ok_or_else(|| invalid(SPIN_US, &v, "microseconds, 0 to 1000000"))?;
        }
        if let Some(v) = get(SPIN_YIELD) {
            s.spin_yield = parse_bool(SPIN_YIELD, &v)?;
        }
        if let Some(v) = get(KERNELS) {
            s.kernels = match v.trim().to_ascii_lowercase().as_str() {
                "auto" | "on" | "1" => Path::Auto,
                "kernel" => Path::Kernel,
                "mlx" | "off" | "0" => Path::Mlx,
                _ => return Err(invalid(KERNELS, &v, "auto, kernel or mlx")),
            };
        }
        if let Some(v) = get(INLINE_EVAL) {
            s.inline_eval = parse_bool(INLINE_EVAL, &v)?;
        }
        if let Some(v) = get(AMX) {
            s.amx = parse_bool(AMX, &v)?;
        }
        if let Some(v) = get(STEP_GRAPHS) {
            s.step_graphs = parse_bool(STEP_GRAPHS, &v)?;
        }
        Ok(s)
    }

    /// Makes these the process's settings, every one of them (a field at its
    /// default restores the default), and returns the device chosen. Call
    /// before building any array. An ISA this CPU cannot run, or a device
    /// the linked libmlx does not have, is an error naming the variable;
    /// nothing after it is applied then.
    pub fn apply(&self) -> Result<Device, SettingsError> {
        let device = self.device.resolve().and_then(|d| device::set_default_device(d).map(|()| d)).map_err(|e| {
            SettingsError::Unusable { var: DEVICE, value: self.device.to_string(), reason: e.to_string() }
        })?;
        let isa = self.isa.unwrap_or_else(Isa::best);
        fast::set_isa(isa).map_err(|e| SettingsError::Unusable {
            var: ISA,
            value: isa.to_string(),
            reason: e.to_string(),
        })?;
        fast::set_default_threads(self.threads.unwrap_or(0));
        fast::set_spin(self.spin_us, self.spin_yield);
        fast::set_default_path(self.kernels);
        fast::set_inline_eval(self.inline_eval);
        fast::set_amx(self.amx);
        fast::set_step_graphs(self.step_graphs);
        fast::retain_freed_memory();
        Ok(device)
    }
}
