//! The model code traced into StableHLO (`mlxcel_stablehlo::model`) computes
//! what mlx-lm computes: each tiny random model of tests/python/tiny_reference.py
//! traced as one prefill function over its prompt, compiled by `iree-compile`
//! for this CPU, run by `iree-run-module` with mlx-lm's own safetensors
//! tensors as its parameters; the logits at the prompt's last position agree
//! with mlx-lm's within 1e-4.
//!
//! Tolerance: both sides compute in f32 on the same weights (4-bit ones
//! dequantized in the graph to the same f32 values MLX multiplies by); the
//! sums run in other orders (IREE's tiling, MLX's kernels), which moves
//! logits of magnitude ~10 by ~1e-5, as in tiny_parity.rs.

#[path = "../../stablehlo/tests/iree_tools/mod.rs"]
mod iree_tools;

use iree_tools::{Compiled, Data, Input};
use mlxcel_stablehlo::model::{
    Hlo, LayerCache, ParameterLoader, StoredQuantization, StoredTensor, StoredTensors, TracePass,
};
use mlxcel_stablehlo::{ElementType, Module, TensorType};
use mlxcel_tests::read_json;
use mlxcel_tests::tiny::normalized;

/// Capacity of the traced caches (the prompts have 20 tokens).
const CAPACITY: i64 = 32;

fn check(arch: &str, bits: u32) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let mut args = vec![arch, out, "--tokens", "1"];
    let bits_arg = bits.to_string();
    if bits > 0 {
        args.extend(["--bits", &bits_arg]);
    }
    mlxcel_tests::run_reference_script("tiny_reference.py", &args);
    let raw = read_json(&dir.path().join("config.json"));
    let config = normalized(&raw);
    let reference = read_json(&dir.path().join("reference.json"));
    let prompt: Vec<i32> = reference["prompt"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap() as i32).collect();
    let want: Vec<f32> =
        reference["prompt_logits"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();

    // The stored tensors, and the parameter file (mlx-lm's tensors as they are).
    let bytes = std::fs::read(dir.path().join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut stored = StoredTensors::new();
    let mut params: Vec<(String, Data, Vec<i64>)> = Vec::new();
    for (name, view) in st.tensors() {
        let shape: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
        let words = |b: &[u8]| b.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]).collect::<Vec<_>>();
        let (element, data) = match view.dtype() {
            safetensors::Dtype::F32 => {
                (ElementType::F32, Data::F32(words(view.data()).into_iter().map(f32::from_le_bytes).collect()))
            }
            safetensors::Dtype::U32 => {
                (ElementType::I32, Data::U32(words(view.data()).into_iter().map(u32::from_le_bytes).collect()))
            }
            other => panic!("{name}: unexpected dtype {other:?}"),
        };
        if let Some(prefix) = name.strip_suffix(".scales") {
            let q = &raw["quantization"];
            let spec = q.get(prefix).filter(|v| v.is_object()).unwrap_or(q);
            stored.mark_quantized(
                prefix,
                StoredQuantization {
                    bits: spec["bits"].as_u64().unwrap() as u32,
                    group: spec["group_size"].as_i64().unwrap(),
                },
            );
        }
        stored.insert(name.clone(), StoredTensor { shape: shape.clone(), element });
        params.push((name, data, shape));
    }

    // prefill(tokens [1, L], offset, caches...) -> logits [1, 1, vocab]
    let (l, kv, d) = (prompt.len() as i64, config.num_key_value_heads as i64, config.head_dim as i64);
    let cache_ty = TensorType::new(&[1, kv, CAPACITY, d], ElementType::F32);
    let mut arg_types = vec![
        ("tokens".to_string(), TensorType::new(&[1, l], ElementType::I32)),
        ("offset".to_string(), TensorType::new(&[], ElementType::I32)),
    ];
    for i in 0..config.num_hidden_layers {
        arg_types.push((format!("keys{i}"), cache_ty.clone()));
        arg_types.push((format!("values{i}"), cache_ty.clone()));
    }
    let arg_refs: Vec<(&str, TensorType)> = arg_types.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let mut module = Module::new("tiny");
    let mut f = module.function("prefill", &arg_refs);
    let model = {
        let loader = ParameterLoader::new(&mut f, &stored);
        let model = mlxcel_models::build::<Hlo>(&config, &loader).unwrap_or_else(|e| panic!("{arch}: {e}"));
        assert_eq!(loader.unused(), Vec::<String>::new(), "{arch}: tensors the model did not take");
        model
    };
    let caches = model
        .layers()
        .iter()
        .enumerate()
        .map(|(i, layer)| LayerCache {
            keys: f.arg(2 + 2 * i),
            values: f.arg(3 + 2 * i),
            window: layer.window().map(|w| w.get() as i64),
        })
        .collect();
    let (tokens, offset) = (f.arg(0), f.arg(1));
    let mut pass = TracePass::new(&mut f, offset, caches);
    let hidden = model.hidden_states(&mut pass, &tokens).unwrap();
    drop(pass);
    let last = f.slice_axis(&hidden, 1, l - 1, l).unwrap();
    let offset = f.arg(1);
    let mut pass = TracePass::new(&mut f, offset, Vec::new());
    let logits = model.logits(&mut pass, &last).unwrap();
    drop(pass);
    f.finish(&mut module, &[&logits]).unwrap();

    let param_refs: Vec<(&str, &Data, &[i64])> = params.iter().map(|(n, d, s)| (n.as_str(), d, s.as_slice())).collect();
    let compiled = Compiled::new(&format!("traced-{arch}-{bits}"), &module.to_mlir(), &param_refs);
    let zeros = Data::F32(vec![0.0; (kv * CAPACITY * d) as usize]);
    let tokens_data = Data::I32(prompt.clone());
    let token_shape = [1, l];
    let cache_shape = [1, kv, CAPACITY, d];
    let mut inputs = vec![Input::Array(&tokens_data, &token_shape), Input::ScalarI32(0)];
    for _ in 0..2 * config.num_hidden_layers {
        inputs.push(Input::Array(&zeros, &cache_shape));
    }
    let got = compiled.run("prefill", &inputs, 1).remove(0);
    assert_eq!(got.len(), want.len(), "{arch}: logits");
    let diff = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    eprintln!("{arch} bits={bits}: largest logit difference from mlx-lm {diff:e}");
    assert!(diff < 1e-4, "{arch} bits={bits}: logits differ from mlx-lm's by {diff}");
}

#[test]
fn llama_f32() {
    check("llama", 0);
}

#[test]
fn llama_q4() {
    check("llama", 4);
}

#[test]
fn llama_untied_llama3_rope() {
    check("llama_untied_scaled", 0);
}

#[test]
fn qwen2_f32() {
    check("qwen2", 0);
}

#[test]
fn qwen3_f32() {
    check("qwen3", 0);
}

#[test]
fn gemma3_f32() {
    check("gemma3", 0);
}

#[test]
fn phi3_f32() {
    check("phi3", 0);
}

#[test]
fn mistral_q4() {
    check("mistral", 4);
}
