//! `mlxcel-cli`'s shared parts: what both binaries (`mlxcel` and
//! `mlxcel-server`) parse and apply alike.
//!
//! - [`flags`]: value parsers of numeric flags, with the runtime's ranges;
//! - [`process`]: the process settings (device, kernel ISA, threads) from
//!   the environment and the flags, and the bundle path check.

pub mod flags;
pub mod process;
