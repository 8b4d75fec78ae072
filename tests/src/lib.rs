//! Shared helpers of the workspace's end-to-end tests (in `tests/tests/`).

use std::path::{Path, PathBuf};
use std::process::Command;

use mlxcel_mlx::{Array, Dtype, QuantMode};
use mlxcel_runtime::weights::{QuantSpec, Weights};

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

/// Loads a model directory in mlx-lm's layout (`model.safetensors` and the
/// `quantization` entry of `config.json`) into runtime weights (f32 compute).
pub fn load_mlx_lm_weights(dir: &Path, config: &serde_json::Value) -> Weights {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut w = Weights::new(Dtype::F32);
    let mut prefixes = Vec::new();
    for (name, view) in st.tensors() {
        let dtype = match view.dtype() {
            safetensors::Dtype::F32 => Dtype::F32,
            safetensors::Dtype::F16 => Dtype::F16,
            safetensors::Dtype::BF16 => Dtype::BF16,
            safetensors::Dtype::U32 => Dtype::U32,
            other => panic!("{name}: unexpected dtype {other:?}"),
        };
        let shape: Vec<i32> = view.shape().iter().map(|&d| d as i32).collect();
        w.insert(name.clone(), Array::from_bytes(view.data(), &shape, dtype).unwrap());
        if let Some(prefix) = name.strip_suffix(".scales") {
            prefixes.push(prefix.to_string());
        }
    }
    let q = &config["quantization"];
    for prefix in prefixes {
        let spec = q.get(&prefix).filter(|v| v.is_object()).unwrap_or(q);
        w.mark_quantized(
            prefix,
            QuantSpec {
                group_size: spec["group_size"].as_i64().unwrap() as i32,
                bits: spec["bits"].as_i64().unwrap() as i32,
                mode: QuantMode::Affine,
            },
        );
    }
    w
}
