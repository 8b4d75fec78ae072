//! The tiny Llama every family starts from: a config, deterministic random
//! weights and a byte-level BPE tokenizer, small enough that a compile and a
//! `run -n 4` take well under a second, and written from the formats' specs
//! (no Python, no reference tool), so the corpus needs nothing but Rust.

use serde_json::{Value, json};

/// Width of the residual stream.
pub const HIDDEN: usize = 32;
/// Decoder blocks.
pub const LAYERS: usize = 2;
/// Query heads.
pub const HEADS: usize = 4;
/// Key/value heads.
pub const KV_HEADS: usize = 2;
/// Per-head width.
pub const HEAD_DIM: usize = HIDDEN / HEADS;
/// Feed-forward width.
pub const INTERMEDIATE: usize = 64;
/// Vocabulary: 256 byte tokens, the merges, the special tokens.
pub const VOCAB: usize = 272;
/// Context length.
pub const CONTEXT: usize = 256;
/// Id of `<|im_end|>`, the end token of the chat template.
pub const EOS: u32 = 270;
/// The chat template (ChatML) every family stores.
pub const CHAT_TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// The normalized config's size keys (docs/bundle-format.md §6.2.1), all
/// positive integers; Hugging Face's `config.json` has them too (`head_dim`
/// optional).
pub const SIZE_KEYS: [&str; 8] = [
    "hidden_size",
    "num_hidden_layers",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
];

/// Merged pairs after the 256 byte tokens (GPT-2 byte stand-ins: `Ġ` is a space).
const MERGES: [(&str, &str); 12] = [
    ("h", "e"),
    ("l", "l"),
    ("he", "ll"),
    ("Ġ", "t"),
    ("Ġt", "he"),
    ("i", "n"),
    ("o", "r"),
    ("e", "r"),
    ("a", "n"),
    ("Ġ", "a"),
    ("o", "n"),
    ("r", "e"),
];
/// Special tokens after the merges, up to [`VOCAB`].
const SPECIALS: [&str; 4] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|reserved_0|>"];

/// One tensor of the model, Hugging Face name, row-major f32.
pub struct Tensor {
    /// Canonical Hugging Face name.
    pub name: String,
    /// Shape, outermost first.
    pub shape: Vec<usize>,
    /// Values.
    pub values: Vec<f32>,
}

impl Tensor {
    /// Little-endian bytes of the values.
    pub fn bytes(&self) -> Vec<u8> {
        self.values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }
}

/// GPT-2's byte-to-unicode table: the printable stand-in of each byte.
pub fn byte_chars() -> Vec<char> {
    let mut printable: Vec<u32> = (33..=126).chain(161..=172).chain(174..=255).collect();
    let mut chars = vec!['\0'; 256];
    let mut extra = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            printable.push(b);
            chars[b as usize] = char::from_u32(256 + extra).expect("valid char");
            extra += 1;
        } else {
            chars[b as usize] = char::from_u32(b).expect("valid char");
        }
    }
    chars
}

/// Every token's text, by id.
pub fn tokens() -> Vec<String> {
    let mut t: Vec<String> = byte_chars().into_iter().map(String::from).collect();
    t.extend(MERGES.iter().map(|(a, b)| format!("{a}{b}")));
    t.extend(SPECIALS.iter().map(|s| s.to_string()));
    assert_eq!(t.len(), VOCAB);
    t
}

/// The merges as `"a b"` lines.
pub fn merges() -> Vec<String> {
    MERGES.iter().map(|(a, b)| format!("{a} {b}")).collect()
}

/// The Hugging Face `tokenizer.json` (a `tokenizers` byte-level BPE).
pub fn tokenizer_json() -> Value {
    let vocab: serde_json::Map<String, Value> =
        tokens().into_iter().enumerate().take(256 + MERGES.len()).map(|(i, t)| (t, json!(i))).collect();
    let added: Vec<Value> = SPECIALS
        .iter()
        .enumerate()
        .map(|(i, s)| {
            json!({"id": 256 + MERGES.len() + i, "content": s, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added, "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": merges()}
    })
}

/// The Hugging Face `config.json` of the tiny Llama.
pub fn hf_config() -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS, "intermediate_size": INTERMEDIATE, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "vocab_size": VOCAB, "max_position_embeddings": CONTEXT,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": true,
        "bos_token_id": 268, "eos_token_id": EOS, "torch_dtype": "float32"
    })
}

/// The normalized config (docs/bundle-format.md §6.2.1) of the tiny Llama,
/// written from the spec's table.
pub fn normalized_config() -> Value {
    json!({
        "mlxcel_config_version": 1, "architecture": "llama", "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS, "intermediate_size": INTERMEDIATE, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "vocab_size": VOCAB,
        "max_position_embeddings": CONTEXT, "rms_norm_eps": 1e-5, "tie_word_embeddings": true,
        "attention_bias": false, "mlp_bias": false, "hidden_act": "silu", "rope_theta": 10000.0,
        "rope_traditional": false, "rope_scaling": null, "partial_rotary_factor": 1.0,
        "layer_types": vec!["full_attention"; LAYERS], "sliding_window": null,
        "query_pre_attn_scalar": HEAD_DIM, "rope_local_base_freq": null, "moe": null
    })
}

/// Deterministic values in about [-0.1, 0.1) (a linear congruential
/// generator seeded by the name, so every file of every run is the same).
fn random(name: &str, n: usize) -> Vec<f32> {
    let mut s: u64 = name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.2
        })
        .collect()
}

/// Every tensor of the tiny Llama (tied embeddings: no `lm_head.weight`),
/// sorted by name.
pub fn tensors() -> Vec<Tensor> {
    let kv = KV_HEADS * HEAD_DIM;
    let mut specs: Vec<(String, Vec<usize>)> =
        vec![("model.embed_tokens.weight".into(), vec![VOCAB, HIDDEN]), ("model.norm.weight".into(), vec![HIDDEN])];
    for l in 0..LAYERS {
        let p = format!("model.layers.{l}");
        specs.extend([
            (format!("{p}.input_layernorm.weight"), vec![HIDDEN]),
            (format!("{p}.post_attention_layernorm.weight"), vec![HIDDEN]),
            (format!("{p}.self_attn.q_proj.weight"), vec![HIDDEN, HIDDEN]),
            (format!("{p}.self_attn.k_proj.weight"), vec![kv, HIDDEN]),
            (format!("{p}.self_attn.v_proj.weight"), vec![kv, HIDDEN]),
            (format!("{p}.self_attn.o_proj.weight"), vec![HIDDEN, HIDDEN]),
            (format!("{p}.mlp.gate_proj.weight"), vec![INTERMEDIATE, HIDDEN]),
            (format!("{p}.mlp.up_proj.weight"), vec![INTERMEDIATE, HIDDEN]),
            (format!("{p}.mlp.down_proj.weight"), vec![HIDDEN, INTERMEDIATE]),
        ]);
    }
    specs.sort();
    specs
        .into_iter()
        .map(|(name, shape)| {
            let n = shape.iter().product();
            let values = if name.ends_with("norm.weight") { vec![1.0; n] } else { random(&name, n) };
            Tensor { name, shape, values }
        })
        .collect()
}
