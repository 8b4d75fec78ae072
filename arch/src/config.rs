//! The normalized model config.
//!
//! A source config leaves much unsaid: Llama omits `head_dim`, Gemma 3 gives a
//! `sliding_window_pattern` instead of per-layer types, Mistral's window
//! applies to every layer, RoPE scaling is spelled `type` or `rope_type`, and
//! every architecture has its own defaults. [`ModelConfig::from_hf`] resolves
//! all of that once, at compile time, into a config where every value the
//! runtime needs is present and checked; the compiler writes it into the
//! bundle (`config_json`, with `mlxcel_config_version`), and the runtime and
//! surgery read it back with serde ([`ModelConfig::from_bundle_json`]).
//!
//! Keys keep their Hugging Face names where Hugging Face has one with the same
//! meaning, so the text stays familiar. A value the runtime cannot honour (an
//! unknown activation, a NaN epsilon, a zero RoPE base, a non-positive size)
//! is refused here, naming the key and the value: at compile time, not at the
//! first token.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::table::Architecture;

/// The version of the normalized config this crate writes and reads. A
/// change that alters what a config means increments it; a runtime refuses
/// newer versions.
pub const CONFIG_VERSION: u32 = 1;

/// The most decoder layers a config may declare. Per-layer lists are
/// allocated from `num_hidden_layers`, so an absurd count in an untrusted
/// config is refused before it can exhaust memory; the deepest released
/// models have under 200 layers.
pub const MAX_LAYERS: usize = 100_000;

/// A config value that cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// A key's value is missing, of the wrong type, or out of range.
    #[error("config key {key}: {message}")]
    Invalid {
        /// The key (dotted for nested keys: `rope_scaling.factor`).
        key: String,
        /// What is wrong, with the value found.
        message: String,
    },
    /// The text is not a config this version reads.
    #[error("model config: {0}")]
    Unreadable(String),
}

fn invalid(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { key: key.into(), message: message.into() }
}

/// How a layer attends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerType {
    /// Over every past position.
    FullAttention,
    /// Over the last `sliding_window` positions.
    SlidingAttention,
}

/// The activation of a gated feed-forward block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Activation {
    /// `x * sigmoid(x)` (SwiGLU).
    #[serde(rename = "silu")]
    Silu,
    /// The tanh approximation of GELU (GeGLU).
    #[serde(rename = "gelu_pytorch_tanh")]
    GeluTanh,
}

impl Activation {
    /// The activation a Hugging Face `hidden_act` value names.
    pub fn from_hf(name: &str) -> Option<Activation> {
        match name {
            "silu" | "swish" => Some(Activation::Silu),
            "gelu_pytorch_tanh" | "gelu_new" | "gelu_fast" => Some(Activation::GeluTanh),
            _ => None,
        }
    }
}

/// RoPE frequency scaling, resolved: every parameter present.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "rope_type", rename_all = "lowercase", deny_unknown_fields)]
pub enum RopeScaling {
    /// Positions divided by `factor`.
    Linear {
        /// The divisor.
        factor: f32,
    },
    /// Llama 3.1's smooth interpolation of low frequencies.
    Llama3 {
        /// Scaling of the low frequencies.
        factor: f32,
        /// Wavelength bound (in units of the original context) of the unscaled band.
        low_freq_factor: f32,
        /// Wavelength bound of the fully scaled band.
        high_freq_factor: f32,
        /// The context the model was trained with before scaling.
        original_max_position_embeddings: f32,
    },
    /// YaRN.
    Yarn {
        /// Context extension factor.
        factor: f32,
        /// The context the model was trained with before scaling.
        original_max_position_embeddings: f32,
        /// Rotations below which frequencies are interpolated.
        beta_fast: f32,
        /// Rotations above which frequencies are kept.
        beta_slow: f32,
        /// Attention temperature coefficient.
        mscale: f32,
        /// Its all-dimension counterpart.
        mscale_all_dim: f32,
    },
    /// Phi-3's LongRoPE (`su`): explicit per-frequency factors.
    Longrope {
        /// One factor per rotated pair, for long contexts.
        long_factor: Vec<f32>,
        /// The context the model was trained with before scaling.
        original_max_position_embeddings: usize,
    },
}

/// A mixture-of-experts feed-forward (Qwen3-MoE): a router picks
/// `num_experts_per_tok` of `num_experts` SwiGLU experts per token.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoeConfig {
    /// Experts per sparse layer.
    pub num_experts: usize,
    /// Experts each token is routed to.
    pub num_experts_per_tok: usize,
    /// Hidden width of one expert.
    pub moe_intermediate_size: usize,
    /// Whether the chosen experts' weights are renormalised to sum to one.
    pub norm_topk_prob: bool,
    /// Per layer: whether its feed-forward is the mixture (else a dense MLP
    /// of `intermediate_size`). Resolved from Hugging Face's
    /// `decoder_sparse_step` and `mlp_only_layers`.
    pub sparse_layers: Vec<bool>,
}

/// A model's hyperparameters, normalized: what the runtime builds the model
/// from. Field names are the Hugging Face keys where one exists.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// [`CONFIG_VERSION`]; absent from raw Hugging Face configs.
    pub mlxcel_config_version: u32,
    /// The architecture.
    pub architecture: Architecture,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Hidden width of the dense feed-forward blocks.
    pub intermediate_size: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (divides the query heads).
    pub num_key_value_heads: usize,
    /// Features per head.
    pub head_dim: usize,
    /// Vocabulary size (rows of the embedding table).
    pub vocab_size: usize,
    /// The longest context the model was trained for.
    pub max_position_embeddings: usize,
    /// Added to the mean square in every RMS norm (positive).
    pub rms_norm_eps: f32,
    /// Whether the output projection is the embedding table (no `lm_head`).
    pub tie_word_embeddings: bool,
    /// Llama's key: the q, k, v and o projections all have biases. (Qwen2's
    /// q/k/v biases are part of that architecture, not of its config.)
    pub attention_bias: bool,
    /// Whether the dense feed-forward projections have biases.
    pub mlp_bias: bool,
    /// The gated feed-forward's activation.
    pub hidden_act: Activation,
    /// RoPE base of the global layers (and of all layers but Gemma 3's local ones).
    pub rope_theta: f32,
    /// Whether RoPE rotates adjacent pairs instead of the two halves.
    pub rope_traditional: bool,
    /// Frequency scaling of the global layers' RoPE, if any.
    pub rope_scaling: Option<RopeScaling>,
    /// The fraction of each head's features that RoPE rotates.
    pub partial_rotary_factor: f32,
    /// Per layer: how it attends.
    pub layer_types: Vec<LayerType>,
    /// The window of sliding-attention layers (present when any layer slides).
    pub sliding_window: Option<usize>,
    /// Attention scores are scaled by `query_pre_attn_scalar^-1/2` (the head
    /// dimension, except where an architecture says otherwise).
    pub query_pre_attn_scalar: f32,
    /// RoPE base of Gemma 3's sliding-attention layers.
    pub rope_local_base_freq: Option<f32>,
    /// The mixture-of-experts feed-forward, for MoE architectures.
    pub moe: Option<MoeConfig>,
}

/// Reads keys of a Hugging Face config, with errors naming the key.
struct Source<'a> {
    map: &'a Map<String, Value>,
    prefix: &'a str,
}

impl<'a> Source<'a> {
    fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn usize(&self, key: &str) -> Result<Option<usize>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| invalid(self.key(key), format!("must be a non-negative integer, found {v}"))),
        }
    }

    fn need_usize(&self, key: &str) -> Result<usize, ConfigError> {
        self.usize(key)?.ok_or_else(|| invalid(self.key(key), "is missing"))
    }

    fn f32(&self, key: &str) -> Result<Option<f32>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                // The runtime computes in f32: 1e39 would become infinity.
                Some(x) if x.is_finite() && !(x as f32).is_finite() => Err(invalid(
                    self.key(key),
                    format!("{x:e} does not fit the 32-bit float the runtime computes with"),
                )),
                Some(x) => Ok(Some(x as f32)),
                None => Err(invalid(self.key(key), format!("must be a number, found {v}"))),
            },
        }
    }

    fn bool(&self, key: &str) -> Result<Option<bool>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => {
                v.as_bool().map(Some).ok_or_else(|| invalid(self.key(key), format!("must be true or false, found {v}")))
            }
        }
    }

    fn str(&self, key: &str) -> Result<Option<&'a str>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => {
                v.as_str().map(Some).ok_or_else(|| invalid(self.key(key), format!("must be a string, found {v}")))
            }
        }
    }

    fn strings(&self, key: &str) -> Result<Option<Vec<&'a str>>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| v.as_str())
                .collect::<Option<Vec<_>>>()
                .map(Some)
                .ok_or_else(|| invalid(self.key(key), "must be a list of strings")),
            Some(v) => Err(invalid(self.key(key), format!("must be a list of strings, found {v}"))),
        }
    }

    fn usizes(&self, key: &str) -> Result<Option<Vec<usize>>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| v.as_u64().and_then(|n| usize::try_from(n).ok()))
                .collect::<Option<Vec<_>>>()
                .map(Some)
                .ok_or_else(|| invalid(self.key(key), "must be a list of non-negative integers")),
            Some(v) => Err(invalid(self.key(key), format!("must be a list of integers, found {v}"))),
        }
    }
}

impl ModelConfig {
    /// Normalizes a Hugging Face-style config (`config.json`, or one the
    /// compiler made from GGUF metadata) of `architecture`: applies the
    /// architecture's defaults, resolves per-layer attention types, the head
    /// size, the activation and RoPE scaling, then [`ModelConfig::validate`]s.
    pub fn from_hf(architecture: Architecture, config: &Value) -> Result<ModelConfig, ConfigError> {
        let map =
            config.as_object().ok_or_else(|| ConfigError::Unreadable("the config is not a JSON object".into()))?;
        let c = Source { map, prefix: "" };
        let gemma = architecture == Architecture::Gemma3;
        // Gemma 3's config class has a default for every key (mlx-lm's too);
        // the others need their sizes spelled out.
        let size = |key: &str, gemma_default: usize| -> Result<usize, ConfigError> {
            match c.usize(key)? {
                Some(v) => Ok(v),
                None if gemma => Ok(gemma_default),
                None => Err(invalid(key, "is missing")),
            }
        };
        let hidden_size = size("hidden_size", 1152)?;
        let num_hidden_layers = size("num_hidden_layers", 26)?;
        if num_hidden_layers > MAX_LAYERS {
            return Err(invalid(
                "num_hidden_layers",
                format!("{num_hidden_layers} is not a plausible layer count (at most {MAX_LAYERS})"),
            ));
        }
        let num_attention_heads = size("num_attention_heads", 4)?;
        let vocab_size = size("vocab_size", 262_144)?;
        let moe = match architecture {
            Architecture::Qwen3Moe => {
                let step = c.usize("decoder_sparse_step")?.unwrap_or(1);
                if step == 0 {
                    return Err(invalid("decoder_sparse_step", "must be at least 1, found 0"));
                }
                let dense_only = c.usizes("mlp_only_layers")?.unwrap_or_default();
                let num_experts = c.need_usize("num_experts")?;
                Some(MoeConfig {
                    num_experts,
                    num_experts_per_tok: c.need_usize("num_experts_per_tok")?,
                    moe_intermediate_size: c.need_usize("moe_intermediate_size")?,
                    norm_topk_prob: c.bool("norm_topk_prob")?.unwrap_or(false),
                    sparse_layers: (0..num_hidden_layers)
                        .map(|i| !dense_only.contains(&i) && num_experts > 0 && (i + 1) % step == 0)
                        .collect(),
                })
            }
            _ => None,
        };
        // A mixture with no dense layer may leave the dense width out.
        let intermediate_size = match (c.usize("intermediate_size")?, &moe) {
            (Some(v), _) => v,
            (None, Some(m)) if m.sparse_layers.iter().all(|&s| s) => m.moe_intermediate_size,
            (None, _) => size("intermediate_size", 6912)?,
        };
        let num_key_value_heads =
            c.usize("num_key_value_heads")?.unwrap_or(if gemma { 1 } else { num_attention_heads });
        let derived_head_dim = || {
            hidden_size
                .checked_div(num_attention_heads)
                .ok_or_else(|| invalid("num_attention_heads", "must be positive, found 0"))
        };
        let head_dim = match architecture {
            // Phi-3 derives its head size from the hidden size.
            Architecture::Phi3 => derived_head_dim()?,
            Architecture::Gemma3 => c.usize("head_dim")?.unwrap_or(256),
            _ => match c.usize("head_dim")? {
                Some(d) => d,
                None => derived_head_dim()?,
            },
        };
        let max_position_embeddings = c.usize("max_position_embeddings")?.unwrap_or(if gemma { 32_768 } else { 4096 });
        let act_key = if gemma && c.get("hidden_activation").is_some() { "hidden_activation" } else { "hidden_act" };
        let hidden_act = match c.str(act_key)? {
            Some(name) => Activation::from_hf(name).ok_or_else(|| {
                invalid(act_key, format!("{name:?} is not supported (supported: silu, gelu_pytorch_tanh)"))
            })?,
            None if gemma => Activation::GeluTanh,
            None => Activation::Silu,
        };
        let rope_theta = c.f32("rope_theta")?.unwrap_or(if gemma { 1_000_000.0 } else { 10_000.0 });
        let partial_rotary_factor = match architecture {
            Architecture::Phi3 => c.f32("partial_rotary_factor")?.unwrap_or(1.0),
            _ => 1.0,
        };
        // Per-layer attention types.
        let given_types = c.strings("layer_types")?;
        let sliding_window = c.usize("sliding_window")?;
        let parse_types = |types: Vec<&str>| -> Result<Vec<LayerType>, ConfigError> {
            types
                .into_iter()
                .enumerate()
                .map(|(i, t)| match t {
                    "full_attention" => Ok(LayerType::FullAttention),
                    "sliding_attention" => Ok(LayerType::SlidingAttention),
                    other => Err(invalid(
                        format!("layer_types[{i}]"),
                        format!("{other:?} is not supported (full_attention, sliding_attention)"),
                    )),
                })
                .collect()
        };
        let all = |t: LayerType| vec![t; num_hidden_layers];
        let layer_types = match architecture {
            Architecture::Llama | Architecture::Qwen3 => match given_types {
                Some(t) => parse_types(t)?,
                None => all(LayerType::FullAttention),
            },
            // Mistral slides every layer over `sliding_window` when it has one
            // (Hugging Face's MistralAttention), unless layer types say otherwise.
            Architecture::Mistral => match (given_types, sliding_window) {
                (Some(t), _) => parse_types(t)?,
                (None, Some(_)) => all(LayerType::SlidingAttention),
                (None, None) => all(LayerType::FullAttention),
            },
            // Released Qwen2 and Phi-3 checkpoints leave their windows off
            // (Qwen2's `use_sliding_window`; mlx-lm ignores both).
            Architecture::Qwen2 | Architecture::Phi3 | Architecture::Qwen3Moe => all(LayerType::FullAttention),
            // Every `sliding_window_pattern`-th layer is global.
            Architecture::Gemma3 => match given_types {
                Some(t) => parse_types(t)?,
                None => {
                    let pattern = c.usize("sliding_window_pattern")?.unwrap_or(6);
                    if pattern == 0 {
                        return Err(invalid("sliding_window_pattern", "must be at least 1, found 0"));
                    }
                    (0..num_hidden_layers)
                        .map(|i| {
                            if (i + 1) % pattern == 0 { LayerType::FullAttention } else { LayerType::SlidingAttention }
                        })
                        .collect()
                }
            },
        };
        let slides = layer_types.contains(&LayerType::SlidingAttention);
        let sliding_window = match (slides, sliding_window) {
            (false, _) => None,
            (true, Some(w)) => Some(w),
            (true, None) if gemma => Some(512),
            (true, None) => return Err(invalid("sliding_window", "is missing, and layer_types has sliding layers")),
        };
        if gemma {
            for key in ["final_logit_softcapping", "attn_logit_softcapping"] {
                if let Some(v) = c.get(key) {
                    return Err(invalid(key, format!("{v} is not supported (only null)")));
                }
            }
        }
        let tie_default = !matches!(architecture, Architecture::Phi3);
        let config = ModelConfig {
            mlxcel_config_version: CONFIG_VERSION,
            architecture,
            hidden_size,
            num_hidden_layers,
            intermediate_size,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            vocab_size,
            max_position_embeddings,
            rms_norm_eps: c.f32("rms_norm_eps")?.unwrap_or(1e-6),
            tie_word_embeddings: c.bool("tie_word_embeddings")?.unwrap_or(tie_default),
            attention_bias: c.bool("attention_bias")?.unwrap_or(false),
            mlp_bias: c.bool("mlp_bias")?.unwrap_or(false),
            hidden_act,
            rope_theta,
            rope_traditional: c.bool("rope_traditional")?.unwrap_or(false),
            rope_scaling: rope_scaling(&c)?,
            partial_rotary_factor,
            layer_types,
            sliding_window,
            query_pre_attn_scalar: if gemma {
                c.f32("query_pre_attn_scalar")?.unwrap_or(256.0)
            } else {
                head_dim as f32
            },
            rope_local_base_freq: if gemma { Some(c.f32("rope_local_base_freq")?.unwrap_or(10_000.0)) } else { None },
            moe,
        };
        config.validate()?;
        Ok(config)
    }

    /// Reads the config a bundle carries: a normalized config (written by
    /// this compiler), or, from a bundle of an older compiler, the Hugging
    /// Face config it stored, normalized now for `architecture` (the name the
    /// bundle records).
    pub fn from_bundle_json(architecture: &str, text: &str) -> Result<ModelConfig, ConfigError> {
        let value: Value = serde_json::from_str(text).map_err(|e| ConfigError::Unreadable(format!("not JSON: {e}")))?;
        let version = value.get("mlxcel_config_version");
        let config = match version {
            None => {
                let arch = Architecture::from_name(architecture).ok_or_else(|| {
                    ConfigError::Unreadable(format!(
                        "architecture {architecture:?} is not supported; supported: {}",
                        Architecture::names().join(", ")
                    ))
                })?;
                return ModelConfig::from_hf(arch, &value);
            }
            Some(v) if v.as_u64() == Some(u64::from(CONFIG_VERSION)) => {
                serde_json::from_value::<ModelConfig>(value).map_err(|e| ConfigError::Unreadable(e.to_string()))?
            }
            Some(v) => {
                return Err(ConfigError::Unreadable(format!(
                    "mlxcel_config_version {v} is not supported by this runtime (it reads version {CONFIG_VERSION}); \
                     use a newer mlxcel or recompile the bundle"
                )));
            }
        };
        if Architecture::from_name(architecture) != Some(config.architecture) {
            return Err(invalid(
                "architecture",
                format!("{} disagrees with the bundle's architecture {architecture:?}", config.architecture),
            ));
        }
        config.validate()?;
        Ok(config)
    }

    /// The config as the bundle stores it (one JSON object, keys in a fixed order).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a ModelConfig always serializes")
    }

    /// Checks every value the runtime relies on, naming the first bad key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let positive = |key: &str, v: usize| -> Result<(), ConfigError> {
            if v == 0 {
                return Err(invalid(key, "must be positive, found 0"));
            }
            // Shapes cross into MLX as i32.
            if i32::try_from(v).is_err() {
                return Err(invalid(key, format!("{v} is too large")));
            }
            Ok(())
        };
        for (key, v) in [
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("intermediate_size", self.intermediate_size),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("vocab_size", self.vocab_size),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            positive(key, v)?;
        }
        if !self.num_attention_heads.is_multiple_of(self.num_key_value_heads) {
            return Err(invalid(
                "num_key_value_heads",
                format!(
                    "{} does not divide num_attention_heads {}",
                    self.num_key_value_heads, self.num_attention_heads
                ),
            ));
        }
        if i32::try_from(self.num_attention_heads.saturating_mul(self.head_dim)).is_err() {
            return Err(invalid(
                "head_dim",
                format!("{} heads of {} features is too large", self.num_attention_heads, self.head_dim),
            ));
        }
        let finite_positive = |key: &str, v: f32| -> Result<(), ConfigError> {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(invalid(key, format!("must be a positive finite number, found {v}")))
            }
        };
        // A zero epsilon turns an all-zero row into 0/0 = NaN.
        finite_positive("rms_norm_eps", self.rms_norm_eps)?;
        finite_positive("rope_theta", self.rope_theta)?;
        finite_positive("query_pre_attn_scalar", self.query_pre_attn_scalar)?;
        if let Some(base) = self.rope_local_base_freq {
            finite_positive("rope_local_base_freq", base)?;
        }
        if !(self.partial_rotary_factor > 0.0 && self.partial_rotary_factor <= 1.0) {
            return Err(invalid(
                "partial_rotary_factor",
                format!("must be in (0, 1], found {}", self.partial_rotary_factor),
            ));
        }
        let dims = self.rope_dims();
        // All of a head rotates: the head's size is what is wrong.
        if self.partial_rotary_factor == 1.0 && !dims.is_multiple_of(2) {
            return Err(invalid(
                "head_dim",
                format!("{dims} features per head; RoPE rotates pairs and needs an even number"),
            ));
        }
        if dims == 0 || !dims.is_multiple_of(2) {
            return Err(invalid(
                "partial_rotary_factor",
                format!("rotates {dims} of {} features per head; RoPE needs a positive even number", self.head_dim),
            ));
        }
        if self.layer_types.len() != self.num_hidden_layers {
            return Err(invalid(
                "layer_types",
                format!("has {} entries for {} layers", self.layer_types.len(), self.num_hidden_layers),
            ));
        }
        let slides = self.layer_types.contains(&LayerType::SlidingAttention);
        match self.sliding_window {
            Some(0) => return Err(invalid("sliding_window", "must be positive, found 0")),
            None if slides => return Err(invalid("sliding_window", "is missing, and layer_types has sliding layers")),
            _ => {}
        }
        if let Some(scaling) = &self.rope_scaling {
            scaling.validate(dims)?;
        }
        if let Some(moe) = &self.moe {
            positive("moe.num_experts", moe.num_experts)?;
            positive("moe.moe_intermediate_size", moe.moe_intermediate_size)?;
            if moe.num_experts_per_tok == 0 || moe.num_experts_per_tok > moe.num_experts {
                return Err(invalid(
                    "moe.num_experts_per_tok",
                    format!("must be between 1 and num_experts {}, found {}", moe.num_experts, moe.num_experts_per_tok),
                ));
            }
            if moe.sparse_layers.len() != self.num_hidden_layers {
                return Err(invalid(
                    "moe.sparse_layers",
                    format!("has {} entries for {} layers", moe.sparse_layers.len(), self.num_hidden_layers),
                ));
            }
        }
        Ok(())
    }

    /// Features per head that RoPE rotates.
    pub fn rope_dims(&self) -> usize {
        (self.head_dim as f32 * self.partial_rotary_factor) as usize
    }

    /// The multiplier of attention scores.
    pub fn attention_scale(&self) -> f32 {
        self.query_pre_attn_scalar.powf(-0.5)
    }

    /// The attention window of layer `i`, or `None` when it attends over everything.
    pub fn window(&self, i: usize) -> Option<usize> {
        match self.layer_types.get(i) {
            Some(LayerType::SlidingAttention) => self.sliding_window,
            _ => None,
        }
    }

    /// Whether layer `i`'s feed-forward is a mixture of experts.
    pub fn is_moe_layer(&self, i: usize) -> bool {
        self.moe.as_ref().is_some_and(|m| m.sparse_layers.get(i).copied().unwrap_or(false))
    }
}

impl RopeScaling {
    fn validate(&self, rope_dims: usize) -> Result<(), ConfigError> {
        let finite_positive = |key: &str, v: f32| -> Result<(), ConfigError> {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(invalid(format!("rope_scaling.{key}"), format!("must be a positive finite number, found {v}")))
            }
        };
        match self {
            RopeScaling::Linear { factor } => finite_positive("factor", *factor),
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
                finite_positive("factor", *factor)?;
                finite_positive("low_freq_factor", *low_freq_factor)?;
                finite_positive("high_freq_factor", *high_freq_factor)?;
                finite_positive("original_max_position_embeddings", *original_max_position_embeddings)?;
                if high_freq_factor <= low_freq_factor {
                    return Err(invalid(
                        "rope_scaling.high_freq_factor",
                        format!("{high_freq_factor} must exceed low_freq_factor {low_freq_factor}"),
                    ));
                }
                Ok(())
            }
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                mscale,
                mscale_all_dim,
            } => {
                finite_positive("factor", *factor)?;
                finite_positive("original_max_position_embeddings", *original_max_position_embeddings)?;
                finite_positive("beta_fast", *beta_fast)?;
                finite_positive("beta_slow", *beta_slow)?;
                for (key, v) in [("mscale", mscale), ("mscale_all_dim", mscale_all_dim)] {
                    if !v.is_finite() {
                        return Err(invalid(format!("rope_scaling.{key}"), format!("must be finite, found {v}")));
                    }
                }
                Ok(())
            }
            RopeScaling::Longrope { long_factor, original_max_position_embeddings } => {
                if long_factor.len() != rope_dims / 2 {
                    return Err(invalid(
                        "rope_scaling.long_factor",
                        format!(
                            "has {} factors for {rope_dims} rotated features (needs {})",
                            long_factor.len(),
                            rope_dims / 2
                        ),
                    ));
                }
                for (i, f) in long_factor.iter().enumerate() {
                    finite_positive(&format!("long_factor[{i}]"), *f)?;
                }
                if *original_max_position_embeddings == 0 {
                    return Err(invalid("rope_scaling.original_max_position_embeddings", "must be positive, found 0"));
                }
                Ok(())
            }
        }
    }
}

/// The `rope_scaling` of a Hugging Face config, resolved with the defaults
/// mlx-lm's `initialize_rope` applies.
fn rope_scaling(c: &Source<'_>) -> Result<Option<RopeScaling>, ConfigError> {
    let Some(value) = c.get("rope_scaling") else { return Ok(None) };
    let map = value.as_object().ok_or_else(|| invalid("rope_scaling", format!("must be an object, found {value}")))?;
    let s = Source { map, prefix: "rope_scaling." };
    let kind = match (s.str("rope_type")?, s.str("type")?) {
        (Some(k), _) | (None, Some(k)) => k,
        (None, None) => "default",
    };
    let factor = || {
        s.f32("factor")?.ok_or_else(|| invalid("rope_scaling.factor", format!("is missing ({kind} scaling needs it)")))
    };
    Ok(match kind {
        "default" => None,
        "linear" => Some(RopeScaling::Linear { factor: factor()? }),
        "llama3" => Some(RopeScaling::Llama3 {
            factor: factor()?,
            low_freq_factor: s.f32("low_freq_factor")?.unwrap_or(1.0),
            high_freq_factor: s.f32("high_freq_factor")?.unwrap_or(4.0),
            original_max_position_embeddings: s.f32("original_max_position_embeddings")?.unwrap_or(8192.0),
        }),
        "yarn" => Some(RopeScaling::Yarn {
            factor: factor()?,
            original_max_position_embeddings: s.f32("original_max_position_embeddings")?.unwrap_or(4096.0),
            beta_fast: s.f32("beta_fast")?.unwrap_or(32.0),
            beta_slow: s.f32("beta_slow")?.unwrap_or(1.0),
            mscale: s.f32("mscale")?.unwrap_or(1.0),
            mscale_all_dim: s.f32("mscale_all_dim")?.unwrap_or(0.0),
        }),
        "longrope" | "su" => {
            let long_factor = match s.get("long_factor") {
                Some(Value::Array(v)) => v.iter().map(|x| x.as_f64().map(|f| f as f32)).collect::<Option<Vec<f32>>>(),
                _ => None,
            }
            .ok_or_else(|| invalid("rope_scaling.long_factor", "must be a list of numbers (longrope needs it)"))?;
            // Phi-3 keeps the original context at the top level.
            let original = match s.usize("original_max_position_embeddings")? {
                Some(v) => v,
                None => c.usize("original_max_position_embeddings")?.ok_or_else(|| {
                    invalid("rope_scaling.original_max_position_embeddings", "is missing (longrope needs it)")
                })?,
            };
            Some(RopeScaling::Longrope { long_factor, original_max_position_embeddings: original })
        }
        other => {
            return Err(invalid(
                "rope_scaling.rope_type",
                format!("{other:?} is not supported (supported: default, linear, llama3, yarn, longrope)"),
            ));
        }
    })
}
