//! What `load` (and `check::check_bundle`, its validate-only twin) refuses
//! in a bundle that a hostile or older compiler wrote: token ids with no row
//! in the embedding (read out of bounds before), generation defaults that
//! no sampler accepts or ids that do not fit 32 bits (silently truncated
//! before), a broken tokenizer section (now named as the bundle's), a
//! directory.

use std::path::{Path, PathBuf};

use mlxcel_arch::{Architecture, ModelConfig};
use mlxcel_bundle::{BundleWriter, Dtype, ModelInfo, TensorSpec};
use mlxcel_runtime::check::check_bundle;
use mlxcel_runtime::loader::{LoadOptions, load};
use serde_json::json;

const VOCAB: u64 = 8;
const HIDDEN: u64 = 64;

/// A fresh directory under the system's temporary folder.
fn temp_dir(tag: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("mlxcel-load-checks-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    p
}

/// A toy BPE tokenizer whose model assigns `ids`.
fn tokenizer_json(ids: &[u64]) -> String {
    let vocab: serde_json::Map<String, serde_json::Value> =
        ids.iter().enumerate().map(|(i, &id)| (format!("t{i}"), json!(id))).collect();
    json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
        "pre_tokenizer": null, "post_processor": null, "decoder": null,
        "model": {"type": "BPE", "vocab": vocab, "merges": []}
    })
    .to_string()
}

/// Writes a one-layer Llama bundle (vocabulary of [`VOCAB`] rows) at `path`
/// with `tokenizer` as its tokenizer.json and `defaults` as its generation
/// defaults.
fn write_bundle(path: &Path, tokenizer: &str, defaults: serde_json::Value) {
    let config = ModelConfig::from_hf(
        Architecture::Llama,
        &json!({
            "hidden_size": HIDDEN, "intermediate_size": 128, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": VOCAB, "rms_norm_eps": 1e-5
        }),
    )
    .unwrap();
    let model = ModelInfo { architecture: "llama".into(), name: "tiny".into(), config_json: config.to_json() };
    let mut w = BundleWriter::create(path, model).unwrap();
    let mut tensors: Vec<(String, Vec<u64>)> =
        vec![("model.embed_tokens.weight".into(), vec![VOCAB, HIDDEN]), ("model.norm.weight".into(), vec![HIDDEN])];
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
        tensors.push((format!("model.layers.0.{t}"), s));
    }
    for (name, shape) in tensors {
        let n: u64 = shape.iter().product();
        let bytes: Vec<u8> = (0..n).flat_map(|i| ((i % 7) as f32 * 0.01).to_le_bytes()).collect();
        w.add_tensor_bytes(TensorSpec::new(name, Dtype::F32, shape), &bytes).unwrap();
    }
    w.add_tokenizer_json(tokenizer.as_bytes()).unwrap();
    w.set_generation_defaults_json(defaults.to_string());
    w.finish().unwrap();
}

/// The errors of `check_bundle` and `load` on `path`, which must agree.
fn refusal(path: &Path) -> String {
    let checked = check_bundle(path).expect_err("check_bundle should refuse").to_string();
    let loaded = load(path, &LoadOptions::default()).err().expect("load should refuse").to_string();
    assert_eq!(checked, loaded);
    checked
}

#[test]
fn a_well_formed_bundle_loads_and_checks() {
    let dir = temp_dir("ok");
    let path = dir.join("ok.mlxb");
    let ids: Vec<u64> = (0..VOCAB).collect();
    write_bundle(&path, &tokenizer_json(&ids), json!({"eos_token_id": [7], "bos_token_id": 0, "top_p": 0.9}));
    let checked = check_bundle(&path).unwrap();
    assert_eq!(checked.tokenizer_ids, VOCAB as usize);
    let model = load(&path, &LoadOptions::default()).unwrap();
    assert_eq!(model.defaults.eos_token_ids, vec![7]);
}

#[test]
fn token_ids_without_an_embedding_row_are_refused() {
    let dir = temp_dir("ids");
    let path = dir.join("b.mlxb");
    let ids: Vec<u64> = (0..VOCAB).collect();
    for (tokenizer, defaults, expected) in [
        (
            tokenizer_json(&[0, 1, 2, 3, 4, 5, 6, 7, 8]),
            json!({}),
            "the tokenizer's token id 8 is outside the model's vocabulary of 8 rows (model.embed_tokens)",
        ),
        (
            // Sparse ids: `tokenizers` counts 3 entries, the largest is 2^31.
            tokenizer_json(&[0, 1, 1 << 31]),
            json!({}),
            "the tokenizer's token id 2147483648 is outside the model's vocabulary of 8 rows (model.embed_tokens)",
        ),
        (
            tokenizer_json(&ids),
            json!({"eos_token_id": [2, 8]}),
            "eos_token_id 8 is outside the model's vocabulary of 8 rows (model.embed_tokens)",
        ),
        (
            tokenizer_json(&ids),
            json!({"bos_token_id": 100}),
            "bos_token_id 100 is outside the model's vocabulary of 8 rows (model.embed_tokens)",
        ),
    ] {
        write_bundle(&path, &tokenizer, defaults);
        assert_eq!(refusal(&path), expected);
    }
}

#[test]
fn generation_defaults_are_checked_as_the_bundle_s() {
    let dir = temp_dir("defaults");
    let path = dir.join("b.mlxb");
    let ids: Vec<u64> = (0..VOCAB).collect();
    for (defaults, expected) in [
        (
            // 2^32 + 1 used to be truncated to id 1.
            json!({"eos_token_id": 4_294_967_297u64}),
            "bundle: generation defaults: eos_token_id: 4294967297 is not a token id (a non-negative 32-bit integer)",
        ),
        (json!({"top_p": 5.0}), "bundle: generation defaults: top_p: 5 is not in (0, 1]"),
        (
            json!({"temperature": -1.0}),
            "bundle: generation defaults: temperature: -1 is not a finite non-negative number",
        ),
        (json!({"top_k": 2.5}), "bundle: generation defaults: top_k: 2.5 is not a non-negative integer"),
    ] {
        write_bundle(&path, &tokenizer_json(&ids), defaults);
        assert_eq!(refusal(&path), expected);
    }
}

#[test]
fn a_broken_tokenizer_section_is_named_as_the_bundle_s() {
    let dir = temp_dir("tokenizer");
    let path = dir.join("b.mlxb");
    for tokenizer in ["", "<html>"] {
        write_bundle(&path, tokenizer, json!({}));
        let e = refusal(&path);
        assert!(e.starts_with("the bundle's tokenizer.json section: "), "{e}");
    }
}

#[test]
fn a_directory_is_not_a_bundle() {
    let dir = temp_dir("dir");
    assert_eq!(refusal(&dir), format!("bundle: {} is a directory, not a bundle", dir.display()));
}
