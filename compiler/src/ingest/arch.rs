//! The architectures mlxcel supports, and what their configs imply about
//! tensor shapes.

use std::fmt;
use std::path::Path;

use serde_json::Value;

use super::error::{IngestError, Result};

/// A supported model architecture (the runtime implements each).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Architecture {
    /// Llama and its family (SmolLM2, TinyLlama, ...): `LlamaForCausalLM`.
    Llama,
    /// Mistral (a Llama with a sliding window): `MistralForCausalLM`.
    Mistral,
    /// Qwen 2 / 2.5: `Qwen2ForCausalLM`.
    Qwen2,
    /// Qwen 3 (dense): `Qwen3ForCausalLM`.
    Qwen3,
    /// Gemma 3, text only: `Gemma3ForCausalLM` (`model_type` `gemma3_text`).
    Gemma3,
    /// Phi-3 / Phi-3.5 / Phi-4 mini: `Phi3ForCausalLM`.
    Phi3,
}

impl Architecture {
    /// Every supported architecture.
    pub const ALL: [Architecture; 6] = [
        Architecture::Llama,
        Architecture::Mistral,
        Architecture::Qwen2,
        Architecture::Qwen3,
        Architecture::Gemma3,
        Architecture::Phi3,
    ];

    /// The Hugging Face `model_type`.
    pub fn model_type(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Mistral => "mistral",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
            Architecture::Gemma3 => "gemma3_text",
            Architecture::Phi3 => "phi3",
        }
    }

    /// The Hugging Face class name (`architectures[0]`).
    pub fn hf_class(self) -> &'static str {
        match self {
            Architecture::Llama => "LlamaForCausalLM",
            Architecture::Mistral => "MistralForCausalLM",
            Architecture::Qwen2 => "Qwen2ForCausalLM",
            Architecture::Qwen3 => "Qwen3ForCausalLM",
            Architecture::Gemma3 => "Gemma3ForCausalLM",
            Architecture::Phi3 => "Phi3ForCausalLM",
        }
    }

    /// The architecture a Hugging Face class name or `model_type` names.
    pub fn from_hf_name(name: &str) -> Option<Architecture> {
        Architecture::ALL.into_iter().find(|a| a.hf_class() == name || a.model_type() == name)
    }

    /// The architecture of a GGUF `general.architecture`.
    pub fn from_gguf(name: &str) -> Option<Architecture> {
        match name {
            "llama" => Some(Architecture::Llama),
            "mistral" => Some(Architecture::Mistral),
            "qwen2" => Some(Architecture::Qwen2),
            "qwen3" => Some(Architecture::Qwen3),
            "gemma3" => Some(Architecture::Gemma3),
            "phi3" => Some(Architecture::Phi3),
            _ => None,
        }
    }

    /// The supported list, as an error message shows it.
    pub fn supported_list() -> String {
        Architecture::ALL
            .iter()
            .map(|a| format!("{} ({})", a.model_type(), a.hf_class()))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Whether GGUF stores this architecture's q/k projection rows permuted
    /// (llama.cpp's converter permutes them for its interleaved RoPE).
    pub fn gguf_permutes_qk(self) -> bool {
        matches!(self, Architecture::Llama | Architecture::Mistral)
    }

    /// Whether this architecture's RMS norms scale by `1 + w` (GGUF then stores
    /// `w + 1`).
    pub fn norm_offset(self) -> bool {
        matches!(self, Architecture::Gemma3)
    }
}

impl fmt::Display for Architecture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.model_type())
    }
}

/// Finds the architecture of a Hugging Face `config.json`, refusing an
/// unsupported one with the supported list.
pub fn detect_hf(path: &Path, config: &Value) -> Result<Architecture> {
    let classes: Vec<&str> = config
        .get("architectures")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let model_type = config.get("model_type").and_then(Value::as_str);
    if let Some(a) = classes.iter().find_map(|c| Architecture::from_hf_name(c)) {
        return Ok(a);
    }
    if let Some(a) = model_type.and_then(Architecture::from_hf_name) {
        return Ok(a);
    }
    let found = match (classes.first(), model_type) {
        (Some(c), Some(t)) => format!("{c} (model_type {t})"),
        (Some(c), None) => c.to_string(),
        (None, Some(t)) => format!("model_type {t}"),
        (None, None) => "none (config.json has neither `architectures` nor `model_type`)".to_string(),
    };
    Err(IngestError::UnsupportedArchitecture {
        path: path.to_path_buf(),
        found,
        supported: Architecture::supported_list(),
    })
}

/// A normalized Hugging Face-style model configuration.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    /// The architecture (checked before any weight is read).
    pub architecture: Architecture,
    /// The config as Hugging Face's `config.json` spells it (for GGUF, made
    /// from the metadata): `architectures`, `model_type`, `hidden_size`, ...
    pub json: Value,
}

impl ModelConfig {
    /// An unsigned integer key.
    pub fn usize(&self, key: &str) -> Option<usize> {
        self.json.get(key).and_then(Value::as_u64).and_then(|v| usize::try_from(v).ok())
    }

    /// A float key.
    pub fn f64(&self, key: &str) -> Option<f64> {
        self.json.get(key).and_then(Value::as_f64)
    }

    /// `hidden_size`.
    pub fn hidden_size(&self) -> Option<usize> {
        self.usize("hidden_size")
    }

    /// `num_hidden_layers`.
    pub fn num_hidden_layers(&self) -> Option<usize> {
        self.usize("num_hidden_layers")
    }

    /// `num_attention_heads`.
    pub fn num_attention_heads(&self) -> Option<usize> {
        self.usize("num_attention_heads")
    }

    /// `num_key_value_heads`, defaulting to the attention heads.
    pub fn num_key_value_heads(&self) -> Option<usize> {
        self.usize("num_key_value_heads").or_else(|| self.num_attention_heads())
    }

    /// `head_dim`, defaulting to `hidden_size / num_attention_heads`.
    pub fn head_dim(&self) -> Option<usize> {
        self.usize("head_dim").or_else(|| Some(self.hidden_size()? / self.num_attention_heads().filter(|&h| h > 0)?))
    }

    /// `intermediate_size`.
    pub fn intermediate_size(&self) -> Option<usize> {
        self.usize("intermediate_size")
    }

    /// `vocab_size`.
    pub fn vocab_size(&self) -> Option<usize> {
        self.usize("vocab_size")
    }

    /// `tie_word_embeddings` (Hugging Face's default is true).
    pub fn tie_word_embeddings(&self) -> bool {
        self.json.get("tie_word_embeddings").and_then(Value::as_bool).unwrap_or(true)
    }

    /// The shape `config.json` implies for a canonical tensor name, with the
    /// keys it comes from; `None` for names the config says nothing about.
    pub fn expected_shape(&self, name: &str) -> Option<(Vec<usize>, &'static str)> {
        let h = self.hidden_size()?;
        let vocab = self.vocab_size();
        if name == "model.embed_tokens.weight" || name == "lm_head.weight" {
            return Some((vec![vocab?, h], "[vocab_size, hidden_size]"));
        }
        if name == "model.norm.weight" {
            return Some((vec![h], "[hidden_size]"));
        }
        let rest = name.strip_prefix("model.layers.")?;
        let (_, leaf) = rest.split_once('.')?;
        let heads = self.num_attention_heads()?;
        let kv = self.num_key_value_heads()?;
        let hd = self.head_dim()?;
        let inter = self.intermediate_size();
        // Saturating: config values are untrusted input and must not overflow.
        let mul = |a: usize, b: usize| a.saturating_mul(b);
        Some(match leaf {
            "input_layernorm.weight"
            | "post_attention_layernorm.weight"
            | "pre_feedforward_layernorm.weight"
            | "post_feedforward_layernorm.weight" => (vec![h], "[hidden_size]"),
            "self_attn.q_norm.weight" | "self_attn.k_norm.weight" => (vec![hd], "[head_dim]"),
            "self_attn.q_proj.weight" => (vec![mul(heads, hd), h], "[num_attention_heads * head_dim, hidden_size]"),
            "self_attn.k_proj.weight" | "self_attn.v_proj.weight" => {
                (vec![mul(kv, hd), h], "[num_key_value_heads * head_dim, hidden_size]")
            }
            "self_attn.q_proj.bias" => (vec![mul(heads, hd)], "[num_attention_heads * head_dim]"),
            "self_attn.k_proj.bias" | "self_attn.v_proj.bias" => {
                (vec![mul(kv, hd)], "[num_key_value_heads * head_dim]")
            }
            "self_attn.o_proj.weight" => (vec![h, mul(heads, hd)], "[hidden_size, num_attention_heads * head_dim]"),
            "self_attn.qkv_proj.weight" => (
                vec![(heads + 2 * kv) * hd, h],
                "[(num_attention_heads + 2 * num_key_value_heads) * head_dim, hidden_size]",
            ),
            "mlp.gate_proj.weight" | "mlp.up_proj.weight" => (vec![inter?, h], "[intermediate_size, hidden_size]"),
            "mlp.gate_up_proj.weight" => (vec![mul(2, inter?), h], "[2 * intermediate_size, hidden_size]"),
            "mlp.down_proj.weight" => (vec![h, inter?], "[hidden_size, intermediate_size]"),
            _ => return None,
        })
    }

    /// The layer index of a canonical `model.layers.N.` name.
    pub fn layer_of(name: &str) -> Option<usize> {
        name.strip_prefix("model.layers.")?.split('.').next()?.parse().ok()
    }
}
