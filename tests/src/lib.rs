//! Shared helpers of the workspace's end-to-end tests (in `tests/tests/`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Where `make setup` puts the real models (`MLXCEL_MODELS_DIR` overrides).
pub fn models_dir() -> PathBuf {
    std::env::var_os("MLXCEL_MODELS_DIR").map(PathBuf::from).unwrap_or_else(|| workspace_root().join(".deps/models"))
}

/// The Python of the pinned reference environment (`make setup` makes it).
pub fn reference_python() -> PathBuf {
    let deps = std::env::var_os("MLXCEL_DEPS_DIR").map(PathBuf::from).unwrap_or_else(|| workspace_root().join(".deps"));
    let python = deps.join("venv/bin/python");
    assert!(python.is_file(), "{} is missing: run `make setup`", python.display());
    python
}

/// Runs a script of `tests/python/` with the reference Python; panics with
/// its output when it fails.
pub fn run_reference_script(script: &str, args: &[&str]) -> String {
    let path = workspace_root().join("tests/python").join(script);
    let out = Command::new(reference_python())
        .arg(&path)
        .args(args)
        .env("PYTHONUNBUFFERED", "1")
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", path.display()));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{script} {args:?} failed:\n{text}");
    text
}

/// A real model file from the setup's model folder.
pub fn real_model(file: &str) -> PathBuf {
    let p = models_dir().join(file);
    assert!(p.is_file(), "{} is missing: run `make setup`", p.display());
    p
}

/// Reads a JSON file.
pub fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}
