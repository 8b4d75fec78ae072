//! The model code traced into StableHLO computes what mlx-lm computes: each
//! tiny random model of tests/python/tiny_reference.py traced into the
//! functions a bundle exports (`mlxcel_stablehlo::graphs`: a padded prompt
//! chunk, decode batches of one and two), compiled by `iree-compile` for
//! this CPU, run by `iree-run-module` with mlx-lm's own safetensors tensors
//! as its parameters: the logits at the prompt's last position agree with
//! mlx-lm's within 1e-4, and prefill then decode steps give its greedy
//! tokens.
//!
//! Tolerance: both sides compute in f32 on the same weights (4-bit ones
//! dequantized in the graph to the same f32 values MLX multiplies by); the
//! sums run in other orders (IREE's tiling, MLX's kernels), which moves
//! logits of magnitude ~10 by ~1e-5, as in tiny_parity.rs.

#[path = "../../stablehlo/tests/iree_tools/mod.rs"]
mod iree_tools;

use iree_tools::{Compiled, Data, Input};
use mlxcel_stablehlo::graphs::{self, GraphPlan};
use mlxcel_stablehlo::model::{StoredQuantization, StoredTensor, StoredTensors};
use mlxcel_stablehlo::{ElementType, Module};
use mlxcel_tests::read_json;
use mlxcel_tests::tiny::normalized;

/// Capacity of the traced caches (the prompts have 20 tokens, and up to 8
/// more are decoded).
const CAPACITY: i64 = 32;

/// The prompt-chunk length traced: the 20-token prompts run padded.
const CHUNK: i64 = 32;

/// A tiny reference model: its config, mlx-lm's results, the tensors as
/// the tracer sees them and as the parameter file holds them.
struct Tiny {
    dir: tempfile::TempDir,
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
    Tiny { dir, config: normalized(&raw), prompt, tokens, prompt_logits, stored, params }
}

impl Tiny {
    /// The shape of one layer's key or value cache for `rows` sequences.
    fn cache_shape(&self, rows: i64) -> [i64; 4] {
        [rows, self.config.num_key_value_heads as i64, CAPACITY, self.config.head_dim as i64]
    }

    /// The bundle's functions for this model (`graphs::trace`): prompt
    /// chunks of [`CHUNK`] tokens, decode batches of one and two sequences.
    fn module(&self) -> Module {
        let plan = GraphPlan::new(CAPACITY, vec![CHUNK], vec![1, 2]).unwrap();
        graphs::trace(&self.config, &self.stored, &plan).unwrap()
    }

    /// Compiles `module` with this model's tensors as its parameters.
    fn compile(&self, tag: &str, module: &Module) -> Compiled {
        let params: Vec<(&str, &Data, &[i64])> =
            self.params.iter().map(|(n, d, s)| (n.as_str(), d, s.as_slice())).collect();
        Compiled::new(tag, &module.to_mlir(), &params)
    }

    /// `prefill_CHUNK` over `prompt` (padded) from `offset`: the logits of
    /// its last token and the written caches.
    fn prefill(&self, compiled: &Compiled, prompt: &[i32], offset: i32, caches: &[Vec<f32>]) -> Vec<Vec<f32>> {
        assert!(!prompt.is_empty() && prompt.len() <= CHUNK as usize);
        let mut padded = prompt.to_vec();
        padded.resize(CHUNK as usize, 0);
        let tokens = Data::I32(padded);
        let token_shape = [1, CHUNK];
        let mut inputs = vec![
            Input::Array(&tokens, &token_shape),
            Input::ScalarI32(offset),
            Input::ScalarI32(prompt.len() as i32 - 1),
        ];
        let cache_shape = self.cache_shape(1);
        let cache_data: Vec<Data> = caches.iter().map(|c| Data::F32(c.clone())).collect();
        inputs.extend(cache_data.iter().map(|c| Input::Array(c, &cache_shape)));
        compiled.run(&GraphPlan::prefill_name(CHUNK), &inputs, 1 + caches.len())
    }

    /// `decode_B` of one token per sequence, sequence `r` at `offsets[r]`
    /// of row `r` of `caches`: the logits `[B, vocab]` and the written caches.
    fn decode(&self, compiled: &Compiled, tokens: &[i32], offsets: &[i32], caches: &[Vec<f32>]) -> Vec<Vec<f32>> {
        let rows = tokens.len() as i64;
        let (tokens, offsets) = (Data::I32(tokens.to_vec()), Data::I32(offsets.to_vec()));
        let (token_shape, offset_shape) = ([rows, 1], [rows]);
        let mut inputs = vec![Input::Array(&tokens, &token_shape), Input::Array(&offsets, &offset_shape)];
        let cache_shape = self.cache_shape(rows);
        let cache_data: Vec<Data> = caches.iter().map(|c| Data::F32(c.clone())).collect();
        inputs.extend(cache_data.iter().map(|c| Input::Array(c, &cache_shape)));
        compiled.run(&GraphPlan::decode_name(rows), &inputs, 1 + caches.len())
    }

    /// Empty caches of one sequence, two per layer.
    fn empty_caches(&self) -> Vec<Vec<f32>> {
        let n = self.cache_shape(1).iter().product::<i64>() as usize;
        vec![vec![0.0; n]; 2 * self.config.num_hidden_layers]
    }
}

/// `mlxcel-compile --target iree-llvm-cpu` on the tiny model's directory
/// stores the traced module and its IREE build; run with the bundle's own
/// tensors as its parameters, the stored module gives mlx-lm's logits.
fn check_bundle(arch: &str, bits: u32) {
    use mlxcel_bundle::{Bundle, Dtype, kinds};
    let t = tiny(arch, bits, 1);
    let bundle = t.dir.path().join("model.mlxb");
    let out = std::process::Command::new(mlxcel_tests::mlxcel_compile_bin())
        .arg(t.dir.path())
        .arg("-o")
        .arg(&bundle)
        .args(["--target", "iree-llvm-cpu", "--iree-context", &CAPACITY.to_string(), "--quiet"])
        .env("MLXCEL_DEPS_DIR", iree_tools::deps())
        .output()
        .unwrap();
    assert!(out.status.success(), "mlxcel-compile: {}", String::from_utf8_lossy(&out.stderr));
    let inspect = std::process::Command::new(mlxcel_tests::mlxcel_bin()).arg("inspect").arg(&bundle).output().unwrap();
    let listing = String::from_utf8_lossy(&inspect.stdout);
    assert!(
        listing.contains("IREE module model for llvm-cpu:")
            && listing.contains("prefill chunks 32, decode batches 1,4, caches of 32 positions"),
        "{listing}"
    );
    let b = Bundle::open(&bundle).unwrap();
    let section = |kind: &str| {
        b.sections().find(|s| s.kind() == kind && s.key() == kinds::MODEL_GRAPH_KEY).unwrap_or_else(|| panic!("{kind}"))
    };
    let (hlo, vmfb) = (section(kinds::STABLEHLO), section(kinds::IREE_VMFB));
    assert!(vmfb.target().starts_with("llvm-cpu:"), "{}", vmfb.target());
    assert_eq!(vmfb.property(kinds::CACHE_CAPACITY_KEY), Some("32"));
    assert_eq!(hlo.property(kinds::PREFILL_KEY), Some("32"));
    assert_eq!(vmfb.property(kinds::DECODE_KEY), Some("1,4"));
    assert!(std::str::from_utf8(hlo.data()).unwrap().contains("func.func @decode_4("));
    let params: Vec<(String, Data, Vec<i64>)> = b
        .tensors()
        .map(|t| {
            let dtype = match t.dtype() {
                Dtype::F32 => "F32",
                Dtype::F16 => "F16",
                Dtype::Bf16 => "BF16",
                Dtype::U32 => "I32",
                other => panic!("{}: {other:?}", t.name()),
            };
            let shape = t.shape().iter().map(|&d| d as i64).collect();
            (t.name().to_string(), Data::Raw(t.data().to_vec(), dtype), shape)
        })
        .collect();
    let refs: Vec<(&str, &Data, &[i64])> = params.iter().map(|(n, d, s)| (n.as_str(), d, s.as_slice())).collect();
    let compiled = Compiled::from_vmfb(&format!("bundle-{arch}-{bits}"), vmfb.data(), &refs);
    let got = t.prefill(&compiled, &t.prompt, 0, &t.empty_caches()).remove(0);
    let diff = got.iter().zip(&t.prompt_logits).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(diff < 1e-4, "{arch} bits={bits}: the bundle's IREE module's logits differ from mlx-lm's by {diff}");
}

fn argmax(v: &[f32]) -> i32 {
    v.iter().enumerate().fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &x)| if x > bv { (i, x) } else { (bi, bv) }).0
        as i32
}

/// One prefill over the whole prompt: the last position's logits against mlx-lm's.
fn check(arch: &str, bits: u32) {
    let t = tiny(arch, bits, 1);
    let compiled = t.compile(&format!("traced-{arch}-{bits}"), &t.module());
    let got = t.prefill(&compiled, &t.prompt, 0, &t.empty_caches()).remove(0);
    assert_eq!(got.len(), t.prompt_logits.len(), "{arch}: logits");
    let diff = got.iter().zip(&t.prompt_logits).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    eprintln!("{arch} bits={bits}: largest logit difference from mlx-lm {diff:e}");
    assert!(diff < 1e-4, "{arch} bits={bits}: logits differ from mlx-lm's by {diff}");
}

/// A prefill function, then a decode function stepping one token at a
/// time over the caches the previous call returned: mlx-lm's greedy tokens.
/// Then two of those steps at different positions as one batch of two
/// sequences: each row's logits are its own step's.
fn check_greedy(arch: &str, bits: u32) {
    let t = tiny(arch, bits, 8);
    let compiled = t.compile(&format!("greedy-{arch}-{bits}"), &t.module());
    let mut out = t.prefill(&compiled, &t.prompt, 0, &t.empty_caches());
    let mut got = Vec::new();
    let mut steps = Vec::new();
    let mut offset = t.prompt.len() as i32;
    while got.len() < t.tokens.len() {
        let token = argmax(&out[0]);
        got.push(token);
        let caches = out.split_off(1);
        out = t.decode(&compiled, &[token], &[offset], &caches);
        steps.push((token, offset, caches, out[0].clone()));
        offset += 1;
    }
    assert_eq!(got, t.tokens, "{arch} bits={bits}: greedy tokens through the traced functions");

    let (a, b) = (&steps[2], &steps[5]);
    let joined: Vec<Vec<f32>> = a.2.iter().zip(&b.2).map(|(x, y)| [x.as_slice(), y.as_slice()].concat()).collect();
    let batch = t.decode(&compiled, &[a.0, b.0], &[a.1, b.1], &joined);
    let vocab = a.3.len();
    for (row, single) in [&a.3, &b.3].into_iter().enumerate() {
        let diff = batch[0][row * vocab..(row + 1) * vocab]
            .iter()
            .zip(single)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(diff < 1e-4, "{arch} bits={bits}: row {row} of a decode batch differs from its own step by {diff}");
    }
}

#[test]
fn bundle_module_llama_q4() {
    check_bundle("llama", 4);
}

#[test]
fn bundle_module_gemma3_f32() {
    check_bundle("gemma3", 0);
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
