//! Model architectures, one file each, and what they share: the config reader,
//! RoPE construction from a config, and attention.

mod attention;
pub mod gemma3;
pub mod llama;
pub mod phi3;
pub mod qwen2;
pub mod qwen3;

use mlxcel_mlx::Array;
use serde_json::Value;

pub use attention::{Attention, QkvProjection};

use crate::error::{Error, Result};
use crate::kv_cache::KvCache;
use crate::nn::Rope;
use crate::weights::Weights;

/// A decoder-only language model on MLX.
pub trait LanguageModel {
    /// The hidden states `[batch, seq, hidden]` after the last layer for
    /// `tokens: [batch, seq]` (u32), appending the step's keys and values to
    /// `caches` (one per layer).
    fn hidden_states(&self, tokens: &Array, caches: &mut [KvCache]) -> Result<Array>;
    /// Logits `[.., vocab]` of hidden states: the final norm and the output
    /// projection, position by position (so a caller that needs only the last
    /// position's logits projects only that one).
    fn logits(&self, hidden: &Array) -> Result<Array>;
    /// Logits `[batch, seq, vocab]` for every position of `tokens`.
    fn forward(&self, tokens: &Array, caches: &mut [KvCache]) -> Result<Array> {
        let hidden = self.hidden_states(tokens, caches)?;
        self.logits(&hidden)
    }
    /// Fresh caches, one per layer; `max_kv` caps global layers to a window.
    fn new_caches(&self, max_kv: Option<usize>) -> Vec<KvCache>;
    /// Vocabulary size (the logits' last axis).
    fn vocab_size(&self) -> usize;
    /// The longest context the model was trained for.
    fn context_length(&self) -> usize;
}

/// The architectures this runtime implements (the bundle's `architecture`).
pub const SUPPORTED: [&str; 5] = ["llama", "qwen2", "qwen3", "gemma3", "phi3"];

/// Builds the model of `architecture` from its config and weights.
pub fn build(architecture: &str, config: &Value, weights: &Weights) -> Result<Box<dyn LanguageModel>> {
    let config = Config(config);
    let model: Box<dyn LanguageModel> = match architecture {
        "llama" | "mistral" => Box::new(llama::build(&config, weights)?),
        "qwen2" => Box::new(qwen2::build(&config, weights)?),
        "qwen3" => Box::new(qwen3::build(&config, weights)?),
        "gemma3" | "gemma3_text" => Box::new(gemma3::Gemma3::new(&config, weights)?),
        "phi3" => Box::new(phi3::build(&config, weights)?),
        other => {
            return Err(Error::UnsupportedArchitecture { found: other.to_string(), supported: SUPPORTED.to_vec() });
        }
    };
    weights.check_all_used(architecture)?;
    weights.materialize()?;
    Ok(model)
}

/// Typed access to a Hugging Face-style config, with errors naming the field.
pub struct Config<'a>(pub &'a Value);

impl Config<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }

    /// A required positive integer.
    pub fn int(&self, key: &str) -> Result<i32> {
        self.opt_int(key)?.ok_or_else(|| Error::Config(format!("missing {key}")))
    }

    /// An optional positive integer.
    pub fn opt_int(&self, key: &str) -> Result<Option<i32>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| i32::try_from(n).ok())
                .filter(|&n| n > 0)
                .map(Some)
                .ok_or_else(|| Error::Config(format!("{key} must be a positive integer, found {v}"))),
        }
    }

    /// An optional number.
    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite())
                .map(|x| Some(x as f32))
                .ok_or_else(|| Error::Config(format!("{key} must be a finite number, found {v}"))),
        }
    }

    /// An optional boolean.
    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => {
                v.as_bool().map(Some).ok_or_else(|| Error::Config(format!("{key} must be true or false, found {v}")))
            }
        }
    }

    /// An optional sub-object or other raw value.
    pub fn value(&self, key: &str) -> Option<&Value> {
        self.get(key)
    }

    /// A list of strings (`layer_types`), if present.
    pub fn opt_strings(&self, key: &str) -> Result<Option<Vec<String>>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .map(Some)
                .ok_or_else(|| Error::Config(format!("{key} must be a list of strings"))),
            Some(v) => Err(Error::Config(format!("{key} must be a list of strings, found {v}"))),
        }
    }
}

/// The RoPE a config asks for (`rope_scaling` types default, linear, llama3,
/// yarn and longrope/su), mirroring mlx-lm's `initialize_rope`.
pub fn rope_from_config(
    dims: i32,
    base: f32,
    traditional: bool,
    scaling: Option<&Value>,
    max_position_embeddings: Option<i32>,
) -> Result<Rope> {
    let Some(scaling) = scaling.filter(|v| !v.is_null()) else {
        return Ok(Rope::new(dims, traditional, base, 1.0));
    };
    let cfg = Config(scaling);
    let kind = scaling
        .get("type")
        .or_else(|| scaling.get("rope_type"))
        .and_then(Value::as_str)
        .unwrap_or("default")
        .to_string();
    let factor = || cfg.opt_f32("factor")?.ok_or_else(|| Error::Config(format!("rope_scaling {kind} needs a factor")));
    let exponents = |d: i32| (0..d / 2).map(move |i| (2 * i) as f64 / d as f64);
    match kind.as_str() {
        "default" => Ok(Rope::new(dims, traditional, base, 1.0)),
        "linear" => Ok(Rope::new(dims, traditional, base, 1.0 / factor()?)),
        "llama3" => {
            let factor = f64::from(factor()?);
            let low = f64::from(cfg.opt_f32("low_freq_factor")?.unwrap_or(1.0));
            let high = f64::from(cfg.opt_f32("high_freq_factor")?.unwrap_or(4.0));
            let old = f64::from(cfg.opt_f32("original_max_position_embeddings")?.unwrap_or(8192.0));
            let (low_wavelen, high_wavelen) = (old / low, old / high);
            let freqs: Vec<f32> = exponents(dims)
                .map(|e| {
                    let f = (f64::from(base) as f32).powf(e as f32);
                    let wavelen = 2.0 * std::f32::consts::PI * f;
                    let f = if f64::from(wavelen) > low_wavelen { f * factor as f32 } else { f };
                    let medium = f64::from(wavelen) > high_wavelen && f64::from(wavelen) < low_wavelen;
                    if medium {
                        let smooth = ((old / f64::from(wavelen)) - low) / (high - low);
                        (f64::from(f) / ((1.0 - smooth) / factor + smooth)) as f32
                    } else {
                        f
                    }
                })
                .collect();
            Rope::with_wavelengths(dims, traditional, &freqs, None)
        }
        "yarn" => {
            let factor = f64::from(factor()?);
            let original = f64::from(cfg.opt_f32("original_max_position_embeddings")?.unwrap_or(4096.0));
            let beta_fast = f64::from(cfg.opt_f32("beta_fast")?.unwrap_or(32.0));
            let beta_slow = f64::from(cfg.opt_f32("beta_slow")?.unwrap_or(1.0));
            let mscale = f64::from(cfg.opt_f32("mscale")?.unwrap_or(1.0));
            let mscale_all_dim = f64::from(cfg.opt_f32("mscale_all_dim")?.unwrap_or(0.0));
            let b = f64::from(base);
            let d = f64::from(dims);
            let correction = |rot: f64| d * (original / (rot * 2.0 * std::f64::consts::PI)).ln() / (2.0 * b.ln());
            let low = correction(beta_fast).floor().max(0.0);
            let high = correction(beta_slow).ceil().min(d - 1.0);
            let high = if low == high { high + 0.001 } else { high };
            let get_mscale = |m: f64| if factor <= 1.0 { 1.0 } else { 0.1 * m * factor.ln() + 1.0 };
            let input_scale = get_mscale(mscale) / get_mscale(mscale_all_dim);
            let freqs: Vec<f32> = exponents(dims)
                .enumerate()
                .map(|(i, e)| {
                    let extra = (b as f32).powf(e as f32);
                    let inter = factor as f32 * extra;
                    let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0) as f32;
                    let mask = 1.0 - ramp;
                    (inter * extra) / (inter * mask + extra * (1.0 - mask))
                })
                .collect();
            let s = (input_scale != 1.0).then_some(input_scale as f32);
            Rope::with_wavelengths(dims, traditional, &freqs, s)
        }
        "longrope" | "su" => {
            let long = match scaling.get("long_factor") {
                Some(Value::Array(v)) => v.iter().map(|x| x.as_f64().map(|f| f as f32)).collect::<Option<Vec<f32>>>(),
                _ => None,
            }
            .ok_or_else(|| Error::Config("rope_scaling longrope needs a long_factor list".into()))?;
            let original = cfg
                .opt_int("original_max_position_embeddings")?
                .ok_or_else(|| Error::Config("rope_scaling longrope needs original_max_position_embeddings".into()))?;
            let max = max_position_embeddings.unwrap_or(131_072);
            let freqs: Vec<f32> = exponents(dims).zip(&long).map(|(e, l)| l * (base.powf(e as f32))).collect();
            let factor = max as f64 / f64::from(original);
            let scale = if factor <= 1.0 { 1.0 } else { (1.0 + factor.ln() / f64::from(original).ln()).sqrt() };
            let s = (scale != 1.0).then_some(scale as f32);
            Rope::with_wavelengths(dims, traditional, &freqs, s)
        }
        other => Err(Error::Config(format!(
            "rope_scaling type {other:?} is not supported (supported: default, linear, llama3, yarn, longrope)"
        ))),
    }
}
