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

/// Capacity of the traced caches (the prompts have 20 tokens, and up to 8
/// more are decoded).
const CAPACITY: i64 = 32;

/// A tiny reference model: its config, mlx-lm's results, the tensors as
/// the tracer sees them and as the parameter file holds them.
struct Tiny {
    _dir: tempfile::TempDir,
    config: mlxcel_arch::ModelConfig,
    prompt: Vec<i32>,
    tokens: Vec<i32>,
    prompt_logits: Vec<f32>,
    stored: StoredTensors,
    params: Vec<(String, Data, Vec<i64>)>,
}

fn tiny(arch: &str, bits: u32, tokens: usize) -> Tiny {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let (bits_arg, tokens_arg) = (bits.to_string(), tokens.to_string());
    let mut args = vec![arch, out, "--tokens", &tokens_arg];
    if bits > 0 {
        args.extend(["--bits", &bits_arg]);
    }
    mlxcel_tests::run_reference_script("tiny_reference.py", &args);
    let raw = read_json(&dir.path().join("config.json"));
    let reference = read_json(&dir.path().join("reference.json"));
    let ints = |key: &str| -> Vec<i32> {
        reference[key].as_array().unwrap().iter().map(|v| v.as_i64().unwrap() as i32).collect()
    };
    let (prompt, tokens) = (ints("prompt"), ints("tokens"));
    let prompt_logits: Vec<f32> =
        reference["prompt_logits"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();

    // The stored tensors, and the parameter file (mlx-lm's tensors as they are).
    let bytes = std::fs::read(dir.path().join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut stored = StoredTensors::new();
    let mut params = Vec::new();
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
    Tiny { _dir: dir, config: normalized(&raw), prompt, tokens, prompt_logits, stored, params }
}

impl Tiny {
    /// The shape of one layer's key or value cache.
    fn cache_shape(&self) -> [i64; 4] {
        [1, self.config.num_key_value_heads as i64, CAPACITY, self.config.head_dim as i64]
    }

    /// Adds `name(tokens [1, len], offset, keys0, values0, ...)` returning
    /// the logits at the last position `[1, 1, vocab]` and the written caches.
    fn trace(&self, module: &mut Module, name: &str, len: i64) {
        let cache_ty = TensorType::new(&self.cache_shape(), ElementType::F32);
        let mut arg_types = vec![
            ("tokens".to_string(), TensorType::new(&[1, len], ElementType::I32)),
            ("offset".to_string(), TensorType::new(&[], ElementType::I32)),
        ];
        for i in 0..self.config.num_hidden_layers {
            arg_types.push((format!("keys{i}"), cache_ty.clone()));
            arg_types.push((format!("values{i}"), cache_ty.clone()));
        }
        let arg_refs: Vec<(&str, TensorType)> = arg_types.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        let mut f = module.function(name, &arg_refs);
        let model = {
            let loader = ParameterLoader::new(&mut f, &self.stored);
            let model = mlxcel_models::build::<Hlo>(&self.config, &loader).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(loader.unused(), Vec::<String>::new(), "{name}: tensors the model did not take");
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
        let mut pass = TracePass::new(&mut f, offset.clone(), caches);
        let hidden = model.hidden_states(&mut pass, &tokens).unwrap();
        let last = {
            let f: &mut mlxcel_stablehlo::Function = pass.function();
            f.slice_axis(&hidden, 1, len - 1, len).unwrap()
        };
        let logits = model.logits(&mut pass, &last).unwrap();
        let written: Vec<_> = pass.caches().iter().flat_map(|c| [c.keys.clone(), c.values.clone()]).collect();
        drop(pass);
        let mut results = vec![&logits];
        results.extend(written.iter());
        f.finish(module, &results).unwrap();
    }

    /// Compiles `module` with this model's tensors as its parameters.
    fn compile(&self, tag: &str, module: &Module) -> Compiled {
        let params: Vec<(&str, &Data, &[i64])> =
            self.params.iter().map(|(n, d, s)| (n.as_str(), d, s.as_slice())).collect();
        Compiled::new(tag, &module.to_mlir(), &params)
    }

    /// Runs `function` on `tokens` from `offset` over `caches`: the logits
    /// and the written caches.
    fn run(
        &self,
        compiled: &Compiled,
        function: &str,
        tokens: &[i32],
        offset: i32,
        caches: &[Vec<f32>],
    ) -> Vec<Vec<f32>> {
        let tokens_data = Data::I32(tokens.to_vec());
        let token_shape = [1, tokens.len() as i64];
        let cache_shape = self.cache_shape();
        let cache_data: Vec<Data> = caches.iter().map(|c| Data::F32(c.clone())).collect();
        let mut inputs = vec![Input::Array(&tokens_data, &token_shape), Input::ScalarI32(offset)];
        inputs.extend(cache_data.iter().map(|c| Input::Array(c, &cache_shape)));
        compiled.run(function, &inputs, 1 + caches.len())
    }

    /// Empty caches, two per layer.
    fn empty_caches(&self) -> Vec<Vec<f32>> {
        let n = self.cache_shape().iter().product::<i64>() as usize;
        vec![vec![0.0; n]; 2 * self.config.num_hidden_layers]
    }
}

fn argmax(v: &[f32]) -> i32 {
    v.iter().enumerate().fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &x)| if x > bv { (i, x) } else { (bi, bv) }).0
        as i32
}

/// One prefill over the whole prompt: the last position's logits against mlx-lm's.
fn check(arch: &str, bits: u32) {
    let t = tiny(arch, bits, 1);
    let mut module = Module::new("tiny");
    t.trace(&mut module, "prefill", t.prompt.len() as i64);
    let compiled = t.compile(&format!("traced-{arch}-{bits}"), &module);
    let got = t.run(&compiled, "prefill", &t.prompt, 0, &t.empty_caches()).remove(0);
    assert_eq!(got.len(), t.prompt_logits.len(), "{arch}: logits");
    let diff = got.iter().zip(&t.prompt_logits).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    eprintln!("{arch} bits={bits}: largest logit difference from mlx-lm {diff:e}");
    assert!(diff < 1e-4, "{arch} bits={bits}: logits differ from mlx-lm's by {diff}");
}

/// A prefill function, then a decode function stepping one token at a
/// time over the caches the previous call returned: mlx-lm's greedy tokens.
fn check_greedy(arch: &str, bits: u32) {
    let t = tiny(arch, bits, 8);
    let mut module = Module::new("tiny");
    t.trace(&mut module, "prefill", t.prompt.len() as i64);
    t.trace(&mut module, "decode", 1);
    let compiled = t.compile(&format!("greedy-{arch}-{bits}"), &module);
    let mut out = t.run(&compiled, "prefill", &t.prompt, 0, &t.empty_caches());
    let mut got = Vec::new();
    let mut offset = t.prompt.len() as i32;
    while got.len() < t.tokens.len() {
        let token = argmax(&out[0]);
        got.push(token);
        out = t.run(&compiled, "decode", &[token], offset, &out[1..]);
        offset += 1;
    }
    assert_eq!(got, t.tokens, "{arch} bits={bits}: greedy tokens through the traced functions");
}

#[test]
fn llama_greedy_q4() {
    check_greedy("llama", 4);
}

#[test]
fn gemma3_greedy_past_its_window() {
    check_greedy("gemma3", 0);
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

#[test]
fn qwen3_moe_f32() {
    check("qwen3_moe", 0);
}

#[test]
fn qwen3_moe_greedy_q4() {
    check_greedy("qwen3_moe", 4);
}
