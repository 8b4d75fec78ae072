//! The normalized config: every architecture's defaults made explicit, the
//! values the runtime cannot honour refused by key, and the round trip
//! through a bundle.

use mlxcel_arch::{Activation, Architecture, LayerType, ModelConfig};
use serde_json::{Value, json};

fn llama() -> Value {
    json!({
        "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 256, "rms_norm_eps": 1e-5
    })
}

#[test]
fn llama_defaults_are_explicit_and_round_trip() {
    let c = ModelConfig::from_hf(Architecture::Llama, &llama()).unwrap();
    assert_eq!(c.head_dim, 16);
    assert_eq!(c.layer_types, vec![LayerType::FullAttention; 2]);
    assert!(c.tie_word_embeddings);
    assert_eq!(c.hidden_act, Activation::Silu);
    assert_eq!(c.rope_theta, 10_000.0);
    assert_eq!(c.query_pre_attn_scalar, 16.0);
    let back = ModelConfig::from_bundle_json("llama", &c.to_json()).unwrap();
    assert_eq!(back, c);
}

#[test]
fn mistral_slides_every_layer_over_its_window() {
    let mut v = llama();
    v["sliding_window"] = json!(8);
    let c = ModelConfig::from_hf(Architecture::Mistral, &v).unwrap();
    assert_eq!(c.layer_types, vec![LayerType::SlidingAttention; 2]);
    assert_eq!(c.window(1), Some(8));
    // A Llama with a window but no layer types attends over everything.
    let c = ModelConfig::from_hf(Architecture::Llama, &v).unwrap();
    assert_eq!(c.window(0), None);
    assert_eq!(c.sliding_window, None);
}

#[test]
fn gemma3_pattern_becomes_layer_types() {
    let c = ModelConfig::from_hf(
        Architecture::Gemma3,
        &json!({"num_hidden_layers": 4, "sliding_window_pattern": 2, "sliding_window": 8}),
    )
    .unwrap();
    use LayerType::*;
    assert_eq!(c.layer_types, vec![SlidingAttention, FullAttention, SlidingAttention, FullAttention]);
    assert_eq!(c.hidden_act, Activation::GeluTanh);
    assert_eq!(c.rope_local_base_freq, Some(10_000.0));
}

#[test]
fn values_the_runtime_cannot_honour_are_refused_by_key() {
    let cases = [
        (
            "hidden_act",
            json!("relu"),
            "config key hidden_act: \"relu\" is not supported (supported: silu, gelu_pytorch_tanh)",
        ),
        ("rope_theta", json!(0.0), "config key rope_theta: must be a positive finite number, found 0"),
        ("hidden_size", json!(0), "config key hidden_size: must be positive, found 0"),
        ("rms_norm_eps", json!(0.0), "config key rms_norm_eps: must be a positive finite number, found 0"),
        (
            "num_hidden_layers",
            json!(1_000_000),
            "config key num_hidden_layers: 1000000 is not a plausible layer count (at most 100000)",
        ),
        ("num_key_value_heads", json!(3), "config key num_key_value_heads: 3 does not divide num_attention_heads 4"),
        (
            "rope_scaling",
            json!({"rope_type": "dynamic", "factor": 2.0}),
            "config key rope_scaling.rope_type: \"dynamic\" is not supported (supported: default, linear, llama3, yarn, longrope)",
        ),
    ];
    for (key, value, message) in cases {
        let mut v = llama();
        v[key] = value;
        let err = ModelConfig::from_hf(Architecture::Llama, &v).unwrap_err();
        assert_eq!(err.to_string(), message);
    }
    // NaN cannot be written in JSON; a normalized config read back is checked too.
    let mut c = ModelConfig::from_hf(Architecture::Llama, &llama()).unwrap();
    c.rms_norm_eps = f32::NAN;
    assert_eq!(
        c.validate().unwrap_err().to_string(),
        "config key rms_norm_eps: must be a positive finite number, found NaN"
    );
}

#[test]
fn newer_versions_are_refused_with_both_numbers() {
    let mut v: Value =
        serde_json::from_str(&ModelConfig::from_hf(Architecture::Llama, &llama()).unwrap().to_json()).unwrap();
    v["mlxcel_config_version"] = json!(2);
    let err = ModelConfig::from_bundle_json("llama", &v.to_string()).unwrap_err().to_string();
    assert!(err.contains("mlxcel_config_version 2") && err.contains("version 1"), "{err}");
}

#[test]
fn qwen3_moe_resolves_sparse_layers() {
    let mut v = llama();
    v["num_hidden_layers"] = json!(4);
    v["num_experts"] = json!(8);
    v["num_experts_per_tok"] = json!(2);
    v["moe_intermediate_size"] = json!(32);
    v["decoder_sparse_step"] = json!(1);
    v["mlp_only_layers"] = json!([2]);
    let c = ModelConfig::from_hf(Architecture::Qwen3Moe, &v).unwrap();
    let moe = c.moe.as_ref().unwrap();
    assert_eq!(moe.sparse_layers, vec![true, true, false, true]);
    assert!(c.is_moe_layer(0) && !c.is_moe_layer(2));
}
