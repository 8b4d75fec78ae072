//! GGUF metadata → a Hugging Face `config.json` and the normalized
//! [`ModelConfig`], and GGUF tensor names → Hugging Face names.
//!
//! The metadata is first spelled as the Hugging Face config the model's
//! converter started from (so that `write_hf_directory` can write it back out
//! for transformers or mlx-lm), then normalized by
//! [`ModelConfig::from_hf`] like any Hugging Face config: defaults, per-layer
//! attention types and checks live in one place, `mlxcel-arch`.

use mlxcel_arch::{Architecture, ConfigError, ModelConfig};
use serde_json::{Map, Value, json};

use super::reader::{GgufFile, GgufValue};
use super::tokenizer::GgufTokenizerInfo;
use crate::ingest::error::{IngestError, Result};

/// The Hugging Face name of a GGUF tensor (llama.cpp's `tensor_mapping.py`,
/// read backwards), or `None` for a name this architecture does not have.
pub fn hf_name(arch: Architecture, gguf: &str) -> Option<String> {
    match gguf {
        "token_embd.weight" => return Some("model.embed_tokens.weight".into()),
        "output_norm.weight" => return Some("model.norm.weight".into()),
        "output.weight" => return Some("lm_head.weight".into()),
        _ => {}
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, leaf) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (base, suffix) = leaf.rsplit_once('.')?;
    if suffix != "weight" && suffix != "bias" {
        return None;
    }
    let gemma = arch == Architecture::Gemma3;
    let moe = arch == Architecture::Qwen3Moe;
    let hf = match base {
        "attn_norm" => "input_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_qkv" if arch == Architecture::Phi3 => "self_attn.qkv_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "ffn_norm" if gemma => "pre_feedforward_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "post_attention_norm" if gemma => "post_attention_layernorm",
        "post_ffw_norm" if gemma => "post_feedforward_layernorm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" if arch == Architecture::Phi3 => "mlp.gate_up_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        // The router and the experts, stacked [experts, out, in] as mlx-lm
        // names them (ggml's dims [in, out, experts] reversed).
        "ffn_gate_inp" if moe => "mlp.gate",
        "ffn_gate_exps" if moe => "mlp.switch_mlp.gate_proj",
        "ffn_up_exps" if moe => "mlp.switch_mlp.up_proj",
        "ffn_down_exps" if moe => "mlp.switch_mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}.{suffix}"))
}

/// The metadata keys (after `{arch}.`) that give a config key directly: read
/// into the Hugging Face config when present, and named in errors about that
/// key.
const METADATA_KEYS: [(&str, &str); 15] = [
    ("hidden_size", "embedding_length"),
    ("intermediate_size", "feed_forward_length"),
    ("num_hidden_layers", "block_count"),
    ("num_attention_heads", "attention.head_count"),
    ("num_key_value_heads", "attention.head_count_kv"),
    ("head_dim", "attention.key_length"),
    ("max_position_embeddings", "context_length"),
    ("vocab_size", "vocab_size"),
    ("sliding_window", "attention.sliding_window"),
    ("rms_norm_eps", "attention.layer_norm_rms_epsilon"),
    ("rope_theta", "rope.freq_base"),
    ("num_experts", "expert_count"),
    ("num_experts_per_tok", "expert_used_count"),
    ("moe_intermediate_size", "expert_feed_forward_length"),
    ("norm_topk_prob", "expert_weights_norm"),
];

/// The integer keys read as they are.
const INTEGER_KEYS: [&str; 11] = [
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
    "vocab_size",
    "sliding_window",
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
];

/// Reads `{arch}.*` metadata, with errors naming the config key and the
/// metadata key.
struct Meta<'a> {
    file: &'a GgufFile,
    prefix: &'a str,
}

impl Meta<'_> {
    /// The metadata key a config key comes from.
    fn metadata_key(&self, config_key: &str) -> Option<String> {
        let bare = config_key.strip_prefix("moe.").unwrap_or(config_key);
        METADATA_KEYS.iter().find(|(k, _)| *k == bare).map(|(_, m)| format!("{}.{m}", self.prefix))
    }

    /// `error` with the metadata key added to its config key, and the file.
    fn error(&self, error: ConfigError) -> IngestError {
        let error = match error {
            ConfigError::Invalid { key, message } => match self.metadata_key(&key) {
                Some(m) => ConfigError::Invalid { key: format!("{key} (GGUF {m})"), message },
                None => ConfigError::Invalid { key, message },
            },
            other => other,
        };
        IngestError::invalid_config(self.file.path(), error)
    }

    fn invalid(&self, key: &str, message: String) -> IngestError {
        self.error(ConfigError::Invalid { key: key.to_string(), message })
    }

    fn get(&self, config_key: &str) -> Option<&GgufValue> {
        self.file.get(&self.metadata_key(config_key)?)
    }

    fn u64(&self, key: &str) -> Result<Option<u64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| self.invalid(key, format!("must be a non-negative integer, found {v:?}"))),
        }
    }

    /// A finite number: JSON cannot hold NaN or infinity, so they are
    /// refused here rather than lost on the way into the config.
    fn f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() && (x as f32).is_finite() => Ok(Some(x)),
                Some(x) if x.is_finite() => {
                    Err(self.invalid(key, format!("{x:e} does not fit the 32-bit float the runtime computes with")))
                }
                Some(x) => Err(self.invalid(key, format!("must be a finite number, found {x}"))),
                None => Err(self.invalid(key, format!("must be a number, found {v:?}"))),
            },
        }
    }

    fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| self.invalid(key, format!("must be a bool, found {v:?}"))),
        }
    }

    /// A key llama.cpp requires.
    fn require(&self, c: &Map<String, Value>, key: &str) -> Result<()> {
        if c.contains_key(key) { Ok(()) } else { Err(self.invalid(key, "is missing from the metadata".into())) }
    }
}

/// llama.cpp rounds f32 metadata; give configs the short decimal (1e-5, not
/// 9.999999747378752e-06).
fn f32_value(v: f64) -> Value {
    let short: f64 = format!("{}", v as f32).parse().unwrap_or(v);
    json!(short)
}

/// The Hugging Face config of a GGUF model of architecture `arch` and its
/// normalized form. Errors name the GGUF, the config key, the metadata key
/// and the value.
pub fn build_config(file: &GgufFile, arch: Architecture, tok: &GgufTokenizerInfo) -> Result<(Value, ModelConfig)> {
    let path = file.path();
    let prefix = file.get("general.architecture").and_then(GgufValue::as_str).unwrap_or_default();
    let m = Meta { file, prefix };
    let mut c = Map::new();
    c.insert("architectures".into(), json!([arch.hf_class()]));
    c.insert("model_type".into(), json!(arch.hf_model_type()));
    for key in INTEGER_KEYS {
        if let Some(v) = m.u64(key)? {
            c.insert(key.into(), json!(v));
        }
    }
    let mut required = vec!["hidden_size", "num_hidden_layers", "num_attention_heads"];
    // A mixture of experts may have no dense feed-forward at all.
    if arch != Architecture::Qwen3Moe {
        required.push("intermediate_size");
    }
    for key in required {
        m.require(&c, key)?;
    }
    let int = |c: &Map<String, Value>, key: &str| c.get(key).and_then(Value::as_u64).unwrap_or(0);
    let (hidden, heads, layers) =
        (int(&c, "hidden_size"), int(&c, "num_attention_heads"), int(&c, "num_hidden_layers"));
    let head_dim =
        match (m.u64("head_dim")?, file.get(&format!("{prefix}.rope.dimension_count")).and_then(GgufValue::as_u64)) {
            (Some(k), _) => Some(k),
            (None, Some(r)) if arch.quirks().gguf_permutes_qk => Some(r),
            _ => hidden.checked_div(heads),
        };
    if let Some(d) = head_dim {
        c.insert("head_dim".into(), json!(d));
    }
    if !c.contains_key("vocab_size") {
        let embed = file.tensor("token_embd.weight");
        let vocab = embed.and_then(|t| t.dims.get(1).copied()).unwrap_or(tok.tokens.len() as u64);
        c.insert("vocab_size".into(), json!(vocab));
    }
    c.insert("tie_word_embeddings".into(), json!(file.tensor("output.weight").is_none()));
    let eps = m.f64("rms_norm_eps")?.ok_or_else(|| m.invalid("rms_norm_eps", "is missing from the metadata".into()))?;
    c.insert("rms_norm_eps".into(), f32_value(eps));
    if let Some(theta) = m.f64("rope_theta")? {
        c.insert("rope_theta".into(), f32_value(theta));
    }
    rope_scaling(file, &m, &mut c)?;
    c.insert("hidden_act".into(), json!("silu"));
    match arch {
        Architecture::Llama | Architecture::Mistral => {
            c.insert("attention_bias".into(), json!(file.tensor("blk.0.attn_q.bias").is_some()));
            c.insert("mlp_bias".into(), json!(false));
        }
        Architecture::Qwen2 | Architecture::Qwen3 | Architecture::Phi3 => {}
        Architecture::Qwen3Moe => {
            // llama.cpp's Qwen3-MoE graph always renormalises the chosen
            // experts' weights (build_moe_ffn with norm_w = true); a file that
            // says otherwise in expert_weights_norm is taken at its word.
            c.insert("norm_topk_prob".into(), json!(m.bool("norm_topk_prob")?.unwrap_or(true)));
            // llama.cpp gives every layer experts; a file whose layer has a
            // dense feed-forward instead (no router) is Hugging Face's
            // `mlp_only_layers`.
            // (Bounded: from_hf refuses a larger count right after.)
            let dense: Vec<u64> = (0..layers.min(mlxcel_arch::config::MAX_LAYERS as u64))
                .filter(|l| file.tensor(&format!("blk.{l}.ffn_gate_inp.weight")).is_none())
                .collect();
            c.insert("decoder_sparse_step".into(), json!(1));
            c.insert("mlp_only_layers".into(), json!(dense));
        }
        Architecture::Gemma3 => {
            // What llama.cpp hard-codes for Gemma 3: every 6th layer is global
            // (the per-layer types follow from the pattern in mlxcel-arch),
            // local layers use RoPE base 10000, queries scale by
            // 1/sqrt(head_dim) except on the 27B (62 layers), which uses
            // hidden_size / heads.
            let pattern = file
                .get(&format!("{prefix}.attention.sliding_window_pattern"))
                .and_then(GgufValue::as_u64)
                .unwrap_or(6);
            let scalar = if layers == 62 { hidden.checked_div(heads) } else { head_dim };
            c.remove("hidden_act");
            c.insert("hidden_activation".into(), json!("gelu_pytorch_tanh"));
            if let Some(s) = scalar {
                c.insert("query_pre_attn_scalar".into(), json!(s));
            }
            c.insert("sliding_window_pattern".into(), json!(pattern));
            c.insert("rope_local_base_freq".into(), json!(10_000.0));
            c.insert("final_logit_softcapping".into(), Value::Null);
            c.insert("attn_logit_softcapping".into(), Value::Null);
            c.entry("sliding_window").or_insert(json!(4096));
        }
    }
    for (key, id) in [("bos_token_id", tok.bos), ("eos_token_id", tok.eos), ("pad_token_id", tok.pad)] {
        if let Some(id) = id {
            c.insert(key.into(), json!(id));
        }
    }
    let hf = Value::Object(c);
    let normalized = ModelConfig::from_hf(arch, &hf).map_err(|e| m.error(e))?;
    if file.tensor("rope_freqs.weight").is_some() {
        return Err(IngestError::config(
            path,
            "the file has rope_freqs.weight (Llama 3.1-style RoPE scaling); reconstructing its rope_scaling is not supported yet",
        ));
    }
    Ok((hf, normalized))
}

/// RoPE scaling (llama.cpp's `rope.scaling.*`) as Hugging Face's `rope_scaling`.
fn rope_scaling(file: &GgufFile, m: &Meta<'_>, c: &mut Map<String, Value>) -> Result<()> {
    let key = |k: &str| format!("{}.rope.scaling.{k}", m.prefix);
    let kind = file.get(&key("type")).and_then(GgufValue::as_str);
    let factor = match file.get(&key("factor")) {
        None => None,
        Some(v) => match v.as_f64() {
            Some(f) if f.is_finite() && (f as f32).is_finite() => Some(f),
            _ => {
                return Err(m.invalid(
                    "rope_scaling.factor",
                    format!("{} must be a finite 32-bit number, found {v:?}", key("factor")),
                ));
            }
        },
    };
    match (kind, factor) {
        (None | Some("none"), _) => {}
        (Some(kind @ ("linear" | "yarn")), Some(f)) => {
            let mut rs = Map::new();
            rs.insert("rope_type".into(), json!(kind));
            rs.insert("factor".into(), f32_value(f));
            if let Some(orig) = file.get(&key("original_context_length")).and_then(GgufValue::as_u64) {
                rs.insert("original_max_position_embeddings".into(), json!(orig));
            }
            c.insert("rope_scaling".into(), Value::Object(rs));
        }
        (Some(kind), _) => {
            return Err(m.invalid(
                "rope_scaling.rope_type",
                format!("{} {kind:?} (with factor {factor:?}) is not supported (linear and yarn are)", key("type")),
            ));
        }
    }
    Ok(())
}
