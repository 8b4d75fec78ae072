//! The real GGUF models: every tensor against the pip `gguf` package's
//! dequantization (bit-exact), the reverse transforms against transformers'
//! GGUF tensor processors, the lossless transcode through MLX's own
//! `dequantize`, and the config made from the metadata.

mod common;

use std::collections::HashMap;
use std::path::Path;

use common::{GEMMA3, SMOLLM2, TempDir, model, run_python, sha256_f32};
use mlxcel_arch::LayerType;
use mlxcel_compiler::ingest::gguf::quant::{GgmlType, dequantize};
use mlxcel_compiler::ingest::{Architecture, FloatDtype, SourceFormat, SourceModel, Storage, TensorData};
use mlxcel_mlx::Dtype;
use serde_json::Value;

/// The Python reference of one GGUF (see tests/python/gguf_reference.py).
fn reference(gguf: &Path) -> HashMap<String, Value> {
    let dir = TempDir::new("gguf-ref");
    let out = dir.path().join("ref.json");
    run_python("gguf_reference.py", &[gguf, &out]);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    v["tensors"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

fn sha(v: &Value, key: &str) -> String {
    v[key].as_str().unwrap().to_string()
}

/// Checks every tensor; returns (tensors, lossless transcodes) per ggml type.
fn check_all_tensors(path: &Path) -> HashMap<String, (usize, usize)> {
    let reference = reference(path);
    let model = SourceModel::open(path).unwrap();
    assert_eq!(model.format(), SourceFormat::Gguf);
    let gguf = model.gguf().unwrap();
    assert_eq!(model.tensors().len(), reference.len());
    let mut counts: HashMap<String, (usize, usize)> = HashMap::new();
    for info in model.tensors() {
        let r = &reference[&info.source_name];
        let shape: Vec<usize> = r["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
        assert_eq!(info.shape, shape, "{}", info.name);
        let Storage::Gguf(ty) = info.storage else { panic!("{} is not GGUF storage", info.name) };
        assert_eq!(ty.to_string(), r["type"].as_str().unwrap(), "{}", info.name);

        // 1. The raw dequantization is bit-exact with gguf.quants.dequantize.
        let g = gguf.tensor(&info.source_name).unwrap();
        let raw = dequantize(ty, gguf.data(g).unwrap()).unwrap();
        assert_eq!(
            sha256_f32(&raw),
            sha(r, "sha256"),
            "{} ({ty}): first values {:?}, reference {}",
            info.name,
            &raw[..4],
            r["head"]
        );
        drop(raw);

        // 2. With the source transforms undone, equal to transformers' processor.
        let float = model.load_float(info).unwrap().to_f32();
        assert_eq!(
            sha256_f32(&float),
            sha(r, "sha256_hf"),
            "{} ({ty}): first values {:?}, reference {}",
            info.name,
            &float[..4],
            r["head_hf"]
        );
        drop(float);

        // 3. The lossless transcode reproduces the same values through MLX.
        let entry = counts.entry(ty.to_string()).or_default();
        entry.0 += 1;
        if let TensorData::Affine(q) = model.load(info).unwrap() {
            assert_eq!(Some((q.bits, q.group_size)), info.lossless_affine(), "{}", info.name);
            // The legacy types' scales and biases are exact in f16 and stored so;
            // they are widened here because MLX's dequantize computes in the
            // scales' dtype (mlxcel's kernels widen them as they read them).
            let legacy =
                matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0);
            let expected = if legacy { FloatDtype::F16 } else { FloatDtype::F32 };
            assert_eq!((q.scales.dtype, q.biases.dtype), (expected, expected), "{} ({ty}) scales", info.name);
            let mut quantized = q.to_quantized().unwrap();
            quantized.scales = quantized.scales.astype(Dtype::F32).unwrap();
            quantized.biases = quantized.biases.map(|b| b.astype(Dtype::F32).unwrap());
            let deq = quantized.dequantize(Some(Dtype::F32)).unwrap();
            assert_eq!(deq.shape(), info.shape.iter().map(|&d| d as i32).collect::<Vec<_>>());
            let values: Vec<f32> =
                deq.to_vec::<f32>().unwrap().into_iter().map(|v| if v == 0.0 { 0.0 } else { v }).collect();
            assert_eq!(
                sha256_f32(&values),
                sha(r, "sha256_hf_canon"),
                "{} ({ty}) transcode: first values {:?}",
                info.name,
                &values[..4]
            );
            entry.1 += 1;
        } else {
            assert!(info.lossless_affine().is_none() || info.shape.len() != 2, "{} should transcode", info.name);
        }
    }
    counts
}

#[test]
fn smollm2_every_tensor_matches_the_reference_and_transcodes_losslessly() {
    let counts = check_all_tensors(&model(SMOLLM2));
    // 210 Q4_1 matrices and the Q8_0 embedding transcode; the 61 F32 norms stay float.
    assert_eq!(counts["Q4_1"], (210, 210));
    assert_eq!(counts["Q8_0"], (1, 1));
    assert_eq!(counts["F32"], (61, 0));
}

#[test]
fn gemma3_every_tensor_matches_the_reference_and_transcodes_losslessly() {
    let counts = check_all_tensors(&model(GEMMA3));
    // Q5_0, Q4_K and Q8_0 transcode without loss; Q6_K (groups of 16) is dequantized.
    assert_eq!(counts["Q5_0"], (81, 81));
    assert_eq!(counts["Q4_K"], (27, 27));
    assert_eq!(counts["Q8_0"], (10, 10));
    assert_eq!(counts["Q6_K"], (9, 0));
    assert_eq!(counts["F32"], (109, 0));
}

fn cfg_u64(c: &Value, k: &str) -> u64 {
    c[k].as_u64().unwrap_or_else(|| panic!("config key {k} missing in {c}"))
}

#[test]
fn smollm2_config_names_and_generation_defaults() {
    let model = SourceModel::open(model(SMOLLM2)).unwrap();
    let cfg = model.config();
    assert_eq!(cfg.architecture, Architecture::Llama);
    assert_eq!((cfg.head_dim, cfg.num_key_value_heads, cfg.rms_norm_eps), (64, 3, 1e-5));
    assert!(cfg.tie_word_embeddings);
    let c = model.source_config();
    assert_eq!(c["architectures"][0], "LlamaForCausalLM");
    assert_eq!(c["model_type"], "llama");
    for (k, v) in [
        ("hidden_size", 576),
        ("intermediate_size", 1536),
        ("num_hidden_layers", 30),
        ("num_attention_heads", 9),
        ("num_key_value_heads", 3),
        ("head_dim", 64),
        ("vocab_size", 49152),
        ("max_position_embeddings", 8192),
        ("bos_token_id", 1),
        ("eos_token_id", 2),
    ] {
        assert_eq!(cfg_u64(c, k), v, "{k}");
    }
    assert_eq!(c["rope_theta"].as_f64(), Some(100000.0));
    assert_eq!(c["rms_norm_eps"].as_f64(), Some(1e-5));
    assert_eq!(c["tie_word_embeddings"], true);
    assert!(model.tensor("lm_head.weight").is_none());
    for name in [
        "model.embed_tokens.weight",
        "model.norm.weight",
        "model.layers.0.input_layernorm.weight",
        "model.layers.29.post_attention_layernorm.weight",
        "model.layers.3.self_attn.q_proj.weight",
        "model.layers.3.self_attn.k_proj.weight",
        "model.layers.3.self_attn.v_proj.weight",
        "model.layers.3.self_attn.o_proj.weight",
        "model.layers.3.mlp.gate_proj.weight",
        "model.layers.3.mlp.up_proj.weight",
        "model.layers.3.mlp.down_proj.weight",
    ] {
        assert!(model.tensor(name).is_some(), "{name}");
    }
    assert_eq!(model.tensor("model.embed_tokens.weight").unwrap().shape, vec![49152, 576]);
    assert_eq!(model.tensor("model.layers.0.self_attn.k_proj.weight").unwrap().shape, vec![192, 576]);

    let gen_defaults = model.generation().unwrap();
    assert_eq!(gen_defaults.bos_token_id, Some(1));
    assert_eq!(gen_defaults.eos_token_ids, vec![2, 0], "<|im_end|> then <|endoftext|>");
    assert!(!gen_defaults.add_bos_token);
    let tok = model.tokenizer().unwrap();
    assert!(tok.chat_template.as_deref().unwrap().contains("<|im_start|>"));
    assert_eq!(tok.tokenizer_config["eos_token"], "<|im_end|>");
    assert_eq!(model.source_files(), vec![model.path().to_path_buf()]);
}

#[test]
fn gemma3_config_names_and_generation_defaults() {
    let model = SourceModel::open(model(GEMMA3)).unwrap();
    let cfg = model.config();
    assert_eq!(cfg.architecture, Architecture::Gemma3);
    let c = model.source_config();
    assert_eq!(c["architectures"][0], "Gemma3ForCausalLM");
    assert_eq!(c["model_type"], "gemma3_text");
    for (k, v) in [
        ("hidden_size", 640),
        ("intermediate_size", 2048),
        ("num_hidden_layers", 18),
        ("num_attention_heads", 4),
        ("num_key_value_heads", 1),
        ("head_dim", 256),
        ("vocab_size", 262144),
        ("max_position_embeddings", 32768),
        ("sliding_window", 512),
        ("sliding_window_pattern", 6),
        ("query_pre_attn_scalar", 256),
        ("bos_token_id", 2),
        ("eos_token_id", 1),
    ] {
        assert_eq!(cfg_u64(c, k), v, "{k}");
    }
    assert_eq!(c["rope_theta"].as_f64(), Some(1_000_000.0));
    assert_eq!(c["rope_local_base_freq"].as_f64(), Some(10_000.0));
    assert_eq!(c["rms_norm_eps"].as_f64(), Some(1e-6));
    assert_eq!(c["tie_word_embeddings"], true);
    // The normalized config spells the pattern out per layer.
    assert_eq!(cfg.layer_types.len(), 18);
    for (i, t) in cfg.layer_types.iter().enumerate() {
        let full = (i + 1) % 6 == 0;
        assert_eq!(*t, if full { LayerType::FullAttention } else { LayerType::SlidingAttention }, "layer {i}");
    }
    assert_eq!(
        (cfg.sliding_window, cfg.rope_local_base_freq, cfg.query_pre_attn_scalar),
        (Some(512), Some(1e4), 256.0)
    );
    assert_eq!(cfg.hidden_act, mlxcel_arch::Activation::GeluTanh);
    for name in [
        "model.layers.0.self_attn.q_norm.weight",
        "model.layers.0.self_attn.k_norm.weight",
        "model.layers.0.pre_feedforward_layernorm.weight",
        "model.layers.0.post_feedforward_layernorm.weight",
        "model.layers.0.post_attention_layernorm.weight",
        "model.layers.17.input_layernorm.weight",
    ] {
        assert!(model.tensor(name).is_some(), "{name}");
    }
    // The norm offset: Gemma's HF norms are centred on 0, the GGUF's on 1.
    let norm = model.tensor("model.norm.weight").unwrap();
    let stored = dequantize(
        mlxcel_compiler::ingest::gguf::quant::GgmlType::F32,
        model.gguf().unwrap().data(model.gguf().unwrap().tensor("output_norm.weight").unwrap()).unwrap(),
    )
    .unwrap();
    let hf = model.load_float(norm).unwrap().to_f32();
    for (s, h) in stored.iter().zip(&hf) {
        assert_eq!(*h, s - 1.0);
    }

    let gen_defaults = model.generation().unwrap();
    assert_eq!(gen_defaults.bos_token_id, Some(2));
    assert_eq!(gen_defaults.eos_token_ids, vec![1, 106], "<eos> then <end_of_turn>");
    assert!(gen_defaults.add_bos_token);
    // This GGUF carries no chat template.
    assert!(model.gguf().unwrap().get("tokenizer.chat_template").is_none());
}
