//! Shared helpers of the workspace's end-to-end tests (in `tests/tests/`).

use std::path::PathBuf;

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Where `make setup` puts the real models (`MLXCEL_MODELS_DIR` overrides).
pub fn models_dir() -> PathBuf {
    std::env::var_os("MLXCEL_MODELS_DIR").map(PathBuf::from).unwrap_or_else(|| workspace_root().join(".deps/models"))
}
