//! Tiny random models that mlx-lm builds (tests/python/tiny_reference.py),
//! loaded the way the runtime loads a bundle's.

use std::path::Path;

use mlxcel_arch::{Architecture, ModelConfig};
use mlxcel_runtime::weights::Weights;
use serde_json::Value;

use crate::{load_mlx_lm_weights, read_json, run_reference_script};

/// A tiny model and what mlx-lm computed with it.
pub struct TinyModel {
    /// The normalized config (as the compiler writes it).
    pub config: ModelConfig,
    /// Its weights, f32 compute.
    pub weights: Weights,
    /// `reference.json`: `prompt`, mlx-lm's greedy `tokens`, `prompt_logits`.
    pub reference: Value,
}

impl TinyModel {
    /// A list of token ids of the reference.
    pub fn ids(&self, key: &str) -> Vec<u32> {
        self.reference[key].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect()
    }

    /// The reference's `prompt_logits`.
    pub fn prompt_logits(&self) -> Vec<f32> {
        self.reference["prompt_logits"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect()
    }
}

/// The normalized config of an mlx-lm `config.json`.
pub fn normalized(config: &Value) -> ModelConfig {
    let model_type = config["model_type"].as_str().unwrap();
    let arch = Architecture::from_hf(model_type).unwrap_or_else(|| panic!("unknown model_type {model_type}"));
    ModelConfig::from_hf(arch, config).unwrap()
}

/// Builds the tiny `arch` model (`bits` 0: float) in `dir` with mlx-lm,
/// recording `tokens` greedy tokens, and loads it.
pub fn tiny_model(dir: &Path, arch: &str, bits: u32, tokens: usize) -> TinyModel {
    let out = dir.to_str().expect("utf-8 temp path");
    let (bits_arg, tokens_arg) = (bits.to_string(), tokens.to_string());
    let mut args = vec![arch, out, "--tokens", &tokens_arg];
    if bits > 0 {
        args.extend(["--bits", &bits_arg]);
    }
    run_reference_script("tiny_reference.py", &args);
    let raw = read_json(&dir.join("config.json"));
    TinyModel {
        config: normalized(&raw),
        weights: load_mlx_lm_weights(dir, &raw),
        reference: read_json(&dir.join("reference.json")),
    }
}
