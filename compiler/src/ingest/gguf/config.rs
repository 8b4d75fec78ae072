//! GGUF metadata → a Hugging Face `config.json`, and GGUF tensor names →
//! Hugging Face names.

use serde_json::{Map, Value, json};

use super::reader::{GgufFile, GgufValue};
use super::tokenizer::GgufTokenizerInfo;
use crate::ingest::arch::Architecture;
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
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}.{suffix}"))
}

struct Meta<'a> {
    file: &'a GgufFile,
    prefix: &'a str,
}

impl Meta<'_> {
    fn get(&self, key: &str) -> Option<&GgufValue> {
        self.file.get(&format!("{}.{key}", self.prefix))
    }

    fn u64(&self, key: &str) -> Result<Option<u64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                IngestError::config(
                    self.file.path(),
                    format!("{}.{key} = {v:?} is not a non-negative integer", self.prefix),
                )
            }),
        }
    }

    fn need(&self, key: &str) -> Result<u64> {
        self.u64(key)?
            .ok_or_else(|| IngestError::config(self.file.path(), format!("the metadata has no {}.{key}", self.prefix)))
    }

    fn f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| {
                IngestError::config(self.file.path(), format!("{}.{key} = {v:?} is not a number", self.prefix))
            }),
        }
    }
}

/// llama.cpp rounds f32 metadata; give configs the short decimal (1e-5, not
/// 9.999999747378752e-06).
fn f32_value(v: f64) -> Value {
    let short: f64 = format!("{}", v as f32).parse().unwrap_or(v);
    json!(short)
}

/// Builds the Hugging Face config of a GGUF model of architecture `arch`.
pub fn build_config(file: &GgufFile, arch: Architecture, tok: &GgufTokenizerInfo) -> Result<Value> {
    let path = file.path();
    let prefix = file.get("general.architecture").and_then(GgufValue::as_str).unwrap_or_default();
    let m = Meta { file, prefix };
    let hidden = m.need("embedding_length")?;
    let heads = m.need("attention.head_count")?;
    let kv_heads = m.u64("attention.head_count_kv")?.unwrap_or(heads);
    if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 {
        return Err(IngestError::config(path, format!("{heads} attention heads and {kv_heads} key/value heads")));
    }
    let head_dim = match (m.u64("attention.key_length")?, m.u64("rope.dimension_count")?) {
        (Some(k), _) => k,
        (None, Some(r)) if arch.gguf_permutes_qk() => r,
        _ => hidden / heads,
    };
    let layers = m.need("block_count")?;
    if layers == 0 || layers > 100_000 {
        return Err(IngestError::config(
            path,
            format!("{prefix}.block_count = {layers} is not a plausible layer count"),
        ));
    }
    let embed = file.tensor("token_embd.weight");
    let vocab = match m.u64("vocab_size")? {
        Some(v) => v,
        None => embed.and_then(|t| t.dims.get(1).copied()).unwrap_or(tok.tokens.len() as u64),
    };
    let tied = file.tensor("output.weight").is_none();

    let mut c = Map::new();
    c.insert("architectures".into(), json!([arch.hf_class()]));
    c.insert("model_type".into(), json!(arch.model_type()));
    c.insert("hidden_size".into(), json!(hidden));
    c.insert("intermediate_size".into(), json!(m.need("feed_forward_length")?));
    c.insert("num_hidden_layers".into(), json!(layers));
    c.insert("num_attention_heads".into(), json!(heads));
    c.insert("num_key_value_heads".into(), json!(kv_heads));
    c.insert("head_dim".into(), json!(head_dim));
    c.insert("vocab_size".into(), json!(vocab));
    c.insert("tie_word_embeddings".into(), json!(tied));
    if let Some(ctx) = m.u64("context_length")? {
        c.insert("max_position_embeddings".into(), json!(ctx));
    }
    let eps = m.f64("attention.layer_norm_rms_epsilon")?.ok_or_else(|| {
        IngestError::config(path, format!("the metadata has no {prefix}.attention.layer_norm_rms_epsilon"))
    })?;
    c.insert("rms_norm_eps".into(), f32_value(eps));
    let default_theta = if arch == Architecture::Gemma3 { 1_000_000.0 } else { 10_000.0 };
    c.insert("rope_theta".into(), f32_value(m.f64("rope.freq_base")?.unwrap_or(default_theta)));
    if let Some(sw) = m.u64("attention.sliding_window")? {
        c.insert("sliding_window".into(), json!(sw));
    }
    // RoPE scaling (llama.cpp's `rope.scaling.*`).
    let scaling = m.get("rope.scaling.type").and_then(GgufValue::as_str).map(str::to_owned);
    let factor = m.f64("rope.scaling.factor")?;
    match (scaling.as_deref(), factor) {
        (None | Some("none"), _) => {}
        (Some(kind @ ("linear" | "yarn")), Some(f)) => {
            let mut rs = Map::new();
            rs.insert("rope_type".into(), json!(kind));
            rs.insert("factor".into(), f32_value(f));
            if let Some(orig) = m.u64("rope.scaling.original_context_length")? {
                rs.insert("original_max_position_embeddings".into(), json!(orig));
            }
            c.insert("rope_scaling".into(), Value::Object(rs));
        }
        (Some(kind), _) => {
            return Err(IngestError::config(
                path,
                format!(
                    "{prefix}.rope.scaling.type {kind:?} (with factor {factor:?}) is not supported (linear and yarn are)"
                ),
            ));
        }
    }
    if file.tensor("rope_freqs.weight").is_some() {
        return Err(IngestError::config(
            path,
            "the file has rope_freqs.weight (Llama 3.1-style RoPE scaling); reconstructing its rope_scaling is not supported yet",
        ));
    }
    match arch {
        Architecture::Llama | Architecture::Mistral => {
            c.insert("hidden_act".into(), json!("silu"));
            c.insert("attention_bias".into(), json!(file.tensor("blk.0.attn_q.bias").is_some()));
            c.insert("mlp_bias".into(), json!(false));
        }
        Architecture::Qwen2 | Architecture::Qwen3 | Architecture::Phi3 => {
            c.insert("hidden_act".into(), json!("silu"));
        }
        Architecture::Gemma3 => {
            // llama.cpp's Gemma 3: every 6th layer is global, local layers use
            // RoPE base 10000, queries scale by 1/sqrt(head_dim) except on the
            // 27B (62 layers), which uses hidden_size / heads.
            let pattern = m.u64("attention.sliding_window_pattern")?.unwrap_or(6).max(1);
            let scalar = if layers == 62 { hidden / heads } else { head_dim };
            c.insert("hidden_activation".into(), json!("gelu_pytorch_tanh"));
            c.insert("query_pre_attn_scalar".into(), json!(scalar));
            c.insert("sliding_window_pattern".into(), json!(pattern));
            c.insert("rope_local_base_freq".into(), json!(10_000.0));
            let types: Vec<&str> = (0..layers)
                .map(|i| if (i + 1) % pattern == 0 { "full_attention" } else { "sliding_attention" })
                .collect();
            c.insert("layer_types".into(), json!(types));
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
    Ok(Value::Object(c))
}
