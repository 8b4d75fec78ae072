//! The normalized config: a source config the runtime cannot honour is
//! refused when the model is opened (before any weight is read), naming the
//! file, the key and the value; `tie_word_embeddings` follows the tensors;
//! the bundle carries the normalized config, which reads back equal.

mod common;

use std::path::Path;

use common::{TempDir, Val, llama_config, llama_dir, llama_gguf, llama_gguf_with};
use mlxcel_arch::{ModelConfig, config::CONFIG_VERSION};
use mlxcel_bundle::Bundle;
use mlxcel_compiler::compile::{CompileOptions, compile};
use mlxcel_compiler::ingest::{IngestError, SourceModel};
use serde_json::json;

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
        (
            "rope_theta",
            json!(1e300),
            "config key rope_theta: 1e300 does not fit the 32-bit float the runtime computes with",
        ),
        ("rms_norm_eps", json!(-1e-5), "config key rms_norm_eps: must be a positive finite number, found -0.00001"),
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
    // Finite as f64 but infinite as the f32 the runtime uses: it used to
    // become JSON null on the way into the config, then the default base.
    for (key, value, message) in [
        (
            "llama.rope.freq_base",
            Val::F64(1e39),
            "config key rope_theta (GGUF llama.rope.freq_base): 1e39 does not fit the 32-bit float the runtime computes with",
        ),
        (
            "llama.rope.freq_base",
            Val::F32(0.0),
            "config key rope_theta (GGUF llama.rope.freq_base): must be a positive finite number, found 0",
        ),
        (
            "llama.rope.freq_base",
            Val::F32(f32::INFINITY),
            "config key rope_theta (GGUF llama.rope.freq_base): must be a finite number, found inf",
        ),
    ] {
        llama_gguf_with(&path, 1e-5, vec![(key, value)]);
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
