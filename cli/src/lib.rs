//! `mlxcel-cli`'s shared parts: what both binaries (`mlxcel` and
//! `mlxcel-server`) parse and apply alike.
//!
//! - [`flags`]: value parsers of numeric flags, with the runtime's ranges;
//! - [`process`]: the process settings (device, kernel ISA, threads) from
//!   the environment and the flags, and the bundle path check;
//! - [`integrity`]: hashing every byte of a bundle with a progress bar;
//! - [`prebuilt`]: the catalog of prebuilt bundles, their index, and
//!   pulling one from the Hugging Face Hub.

pub mod flags;
pub mod integrity;
pub mod prebuilt;
pub mod process;
