//! The normalized config: a source config the runtime cannot honour is
//! refused when the model is opened (before any weight is read), naming the
//! file, the key and the value; `tie_word_embeddings` follows the tensors;
//! the bundle carries the normalized config, which reads back equal.

mod common;

use std::path::Path;

use common::{GgufWriter, TempDir, Val, f32_bytes};
use mlxcel_arch::{ModelConfig, config::CONFIG_VERSION};
use mlxcel_bundle::Bundle;
use mlxcel_compiler::compile::{CompileOptions, compile};
use mlxcel_compiler::ingest::{IngestError, SourceModel};
use safetensors::tensor::TensorView;
use serde_json::json;

fn llama_config() -> serde_json::Value {
    json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 2,
        "num_key_value_heads": 1, "vocab_size": 8, "rms_norm_eps": 1e-5
    })
}

/// A one-layer Llama directory: `config` and every tensor (f32, small
/// values), with a tokenizer; `lm_head` when `head`.
fn llama_dir(dir: &Path, config: &serde_json::Value, head: bool) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut shapes: Vec<(String, Vec<usize>)> =
        vec![("model.embed_tokens.weight".into(), vec![8, 64]), ("model.norm.weight".into(), vec![64])];
    for (t, s) in [
        ("input_layernorm.weight", vec![64]),
        ("post_attention_layernorm.weight", vec![64]),
        ("self_attn.q_proj.weight", vec![64, 64]),
        ("self_attn.k_proj.weight", vec![32, 64]),
        ("self_attn.v_proj.weight", vec![32, 64]),
        ("self_attn.o_proj.weight", vec![64, 64]),
        ("mlp.gate_proj.weight", vec![128, 64]),
        ("mlp.up_proj.weight", vec![128, 64]),
        ("mlp.down_proj.weight", vec![64, 128]),
    ] {
        shapes.push((format!("model.layers.0.{t}"), s));
    }
    if head {
        shapes.push(("lm_head.weight".into(), vec![8, 64]));
    }
    let data: Vec<Vec<u8>> = shapes
        .iter()
        .map(|(_, s)| f32_bytes(&(0..s.iter().product::<usize>()).map(|i| (i % 7) as f32 * 0.01).collect::<Vec<_>>()))
        .collect();
    let views: Vec<(String, TensorView<'_>)> = shapes
        .iter()
        .zip(&data)
        .map(|((n, s), d)| (n.clone(), TensorView::new(safetensors::Dtype::F32, s.clone(), d).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    let vocab: serde_json::Map<String, serde_json::Value> =
        ["a", "b", "c", "d", "e", "f", "g", "h"].iter().enumerate().map(|(i, t)| (t.to_string(), json!(i))).collect();
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
        "pre_tokenizer": null, "post_processor": null, "decoder": null,
        "model": {"type": "BPE", "vocab": vocab, "merges": []}
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
}

/// The error of opening `dir` with `config`, whose weights are garbage: the
/// config must be refused before they are read.
fn refused(dir: &Path, config: &serde_json::Value) -> String {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    std::fs::write(dir.join("model.safetensors"), b"not a safetensors file").unwrap();
    let e = SourceModel::open(dir).expect_err("the config should be refused");
    assert!(matches!(e, IngestError::InvalidConfig { .. }), "{e}");
    e.to_string()
}

#[test]
fn hugging_face_values_the_runtime_cannot_honour_are_refused_by_file_key_and_value() {
    let tmp = TempDir::new("bad-hf-config");
    let file = tmp.path().join("config.json").display().to_string();
    for (key, value, message) in [
        (
            "hidden_act",
            json!("relu"),
            "config key hidden_act: \"relu\" is not supported (supported: silu, gelu_pytorch_tanh)",
        ),
        ("rope_theta", json!(0.0), "config key rope_theta: must be a positive finite number, found 0"),
        ("rms_norm_eps", json!(0.0), "config key rms_norm_eps: must be a positive finite number, found 0"),
        ("hidden_size", json!(0), "config key hidden_size: must be positive, found 0"),
        ("num_hidden_layers", json!(-2), "config key num_hidden_layers: must be a non-negative integer, found -2"),
        (
            "rope_scaling",
            json!({"rope_type": "dynamic", "factor": 2.0}),
            "config key rope_scaling.rope_type: \"dynamic\" is not supported (supported: default, linear, llama3, yarn, longrope)",
        ),
    ] {
        let mut config = llama_config();
        config[key] = value;
        assert_eq!(refused(tmp.path(), &config), format!("{file}: {message}"), "{key}");
    }
}

/// A one-layer Llama GGUF whose epsilon is `eps` (f32 metadata).
fn llama_gguf(path: &Path, eps: f32) {
    let tokens: Vec<Val<'_>> = ["<unk>", "<s>", "</s>", "a"].iter().map(|t| Val::Str(t)).collect();
    let mut w = GgufWriter::new();
    w.kv("general.architecture", Val::Str("llama"))
        .kv("llama.embedding_length", Val::U32(64))
        .kv("llama.feed_forward_length", Val::U32(128))
        .kv("llama.block_count", Val::U32(1))
        .kv("llama.attention.head_count", Val::U32(2))
        .kv("llama.attention.layer_norm_rms_epsilon", Val::F32(eps))
        .kv("tokenizer.ggml.model", Val::Str("llama"))
        .kv("tokenizer.ggml.tokens", Val::Arr(8, tokens))
        .kv("tokenizer.ggml.scores", Val::Arr(6, (0..4).map(|i| Val::F32(-(i as f32))).collect()))
        .kv("tokenizer.ggml.token_type", Val::Arr(5, [2, 3, 3, 1].iter().map(|&t| Val::I32(t)).collect()))
        .tensor("token_embd.weight", &[64, 4], 0, f32_bytes(&[0.5; 64 * 4]))
        .tensor("output_norm.weight", &[64], 0, f32_bytes(&[1.0; 64]));
    w.write(path);
}

#[test]
fn gguf_values_name_the_metadata_key_too_and_nan_is_refused() {
    let tmp = TempDir::new("bad-gguf-config");
    let path = tmp.path().join("m.gguf");
    for (eps, message) in [
        (
            f32::NAN,
            "config key rms_norm_eps (GGUF llama.attention.layer_norm_rms_epsilon): must be a finite number, found NaN",
        ),
        (
            0.0,
            "config key rms_norm_eps (GGUF llama.attention.layer_norm_rms_epsilon): must be a positive finite number, found 0",
        ),
    ] {
        llama_gguf(&path, eps);
        let e = SourceModel::open(&path).expect_err("refused");
        assert_eq!(e.to_string(), format!("{}: {message}", path.display()));
    }
    llama_gguf(&path, 1e-5);
    let m = SourceModel::open(&path).unwrap();
    assert_eq!(m.config().rms_norm_eps, 1e-5);
    assert_eq!(m.config().vocab_size, 4, "the embedding's rows");
}

#[test]
fn tied_embeddings_follow_the_tensors() {
    let tmp = TempDir::new("tie");
    // Untied in the config, and no lm_head: nothing to project with.
    let dir = tmp.path().join("untied");
    let mut config = llama_config();
    config["tie_word_embeddings"] = json!(false);
    llama_dir(&dir, &config, false);
    let e = SourceModel::open(&dir).unwrap_err().to_string();
    assert_eq!(
        e,
        format!(
            "{}: config key tie_word_embeddings: is false, but the model has no lm_head.weight (no output projection of its own)",
            dir.join("config.json").display()
        )
    );
    // Tied (Llama's default) but with an lm_head: the lm_head is used.
    let dir = tmp.path().join("head");
    llama_dir(&dir, &llama_config(), true);
    let m = SourceModel::open(&dir).unwrap();
    assert!(!m.config().tie_word_embeddings);
    assert_eq!(m.source_config().get("tie_word_embeddings"), None, "the source config is as the directory has it");
}

#[test]
fn the_bundle_carries_the_normalized_config() {
    let tmp = TempDir::new("bundle-config");
    let dir = tmp.path().join("model");
    let mut config = llama_config();
    config["rope_scaling"] = json!({"type": "linear", "factor": 2.0});
    llama_dir(&dir, &config, false);
    let src = SourceModel::open(&dir).unwrap();
    let out = tmp.path().join("m.mlxb");
    compile(&src, &out, &CompileOptions::default(), None, &mut |_| {}).unwrap();
    let b = Bundle::open(&out).unwrap();
    assert_eq!(b.architecture(), "llama");
    let stored: serde_json::Value = serde_json::from_str(b.config_json()).unwrap();
    assert_eq!(stored["mlxcel_config_version"], CONFIG_VERSION);
    // Every default explicit: what the runtime would otherwise have to know.
    assert_eq!(stored["head_dim"], 32);
    assert_eq!(stored["tie_word_embeddings"], true);
    assert_eq!(stored["hidden_act"], "silu");
    assert_eq!(stored["layer_types"], json!(["full_attention"]));
    assert_eq!(stored["rope_scaling"], json!({"rope_type": "linear", "factor": 2.0}));
    assert_eq!(stored["max_position_embeddings"], 4096);
    let read = ModelConfig::from_bundle_json(b.architecture(), b.config_json()).unwrap();
    assert_eq!(&read, src.config());
}
