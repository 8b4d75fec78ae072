//! Every architecture against mlx-lm on tiny random models that mlx-lm itself
//! builds (tests/python/tiny_reference.py), float and 4-bit: the logits of one
//! forward pass agree within 1e-4 and greedy generation is token-identical.
//!
//! Tolerance: both sides compute in float32 on the same weights. mlx-lm runs
//! MLX 0.32.4's CPU ops; mlxcel runs its own CPU kernels (`mlxcel_mlx::fast`),
//! which sum dot products in another order (a few ulp of the terms) and fuse
//! ops, and mlx-lm compiles its SwiGLU and GELU and feeds the prompt through
//! `generate_step`'s split. Together that moves logits of magnitude ~10 by
//! ~1e-5 (with `MLXCEL_KERNELS=mlx`, by 0 to 7e-6). 1e-4 is several times
//! that and still far below the gaps that decide the argmax.
//!
//! That bound holds for the float kernel builds, which every check runs first
//! (the best of avx512, avx2, scalar). Where the CPU has AVX-512 VNNI the
//! check runs again with the avx512vnni build (the default there), whose 4-
//! and 8-bit matvecs round x to int16 steps of 2^-16 of each block's largest
//! element (docs/kernels.md "Integer dot products"): ~1e-4 relative per
//! product, measured up to 1.1e-3 on these logits of magnitude ~10; its bound
//! is 5e-3, still far below the gaps that decide the argmax.

use mlxcel_arch::{Architecture, ModelConfig};
use mlxcel_mlx::{Array, Dtype};
use mlxcel_runtime::backend::{Backend, MlxBackend, MlxOptions};
use mlxcel_runtime::loader::{LoadOptions, load, weights_from_bundle};
use mlxcel_runtime::models;
use mlxcel_runtime::sampler::argmax;
use mlxcel_runtime::weights::Weights;
use mlxcel_tests::isa::{each_kernel_build, with_mlx_ops};
use mlxcel_tests::tiny::tiny_model;
use mlxcel_tests::{read_json, tiny_bundle};

fn check(arch: &str, bits: u32) {
    let dir = tempfile::tempdir().unwrap();
    let tiny = tiny_model(dir.path(), arch, bits, 24);
    let (prompt, want_tokens, want_logits) = (tiny.ids("prompt"), tiny.ids("tokens"), tiny.prompt_logits());
    each_kernel_build(|build, bound| {
        let model = models::build(&tiny.config, &tiny.weights).unwrap();
        let mut backend = MlxBackend::new(model, MlxOptions { prefill_chunk: 7, max_kv: None }).unwrap();

        // One forward pass over the whole prompt (chunked: 7 tokens at a time).
        let seq = backend.new_sequence();
        let logits = backend.prefill(seq, &prompt, true).unwrap().unwrap();
        let max_diff = logits.iter().zip(&want_logits).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        eprintln!("{arch} bits={bits} {build}: largest logit difference {max_diff:e}");
        assert!(max_diff < bound, "{arch} bits={bits} {build}: logits differ by {max_diff}");
        backend.release_sequence(seq);

        // Greedy generation the way mlx-lm's generate_step does it.
        let seq = backend.new_sequence();
        backend.prefill(seq, &prompt[..prompt.len() - 1], false).unwrap();
        let mut logits = backend.decode(&[(seq, prompt[prompt.len() - 1])]).unwrap().into_first().unwrap();
        let mut got = Vec::new();
        for _ in 0..want_tokens.len() {
            let t = argmax(&logits);
            got.push(t);
            logits = backend.decode(&[(seq, t)]).unwrap().into_first().unwrap();
        }
        assert_eq!(got, want_tokens, "{arch} bits={bits} {build}: greedy tokens");
    });
}

/// With mlxcel's kernels off, every layer takes MLX's own ops, as on a GPU:
/// the fallbacks of the fused entry points (q/k/v split into heads, the
/// gated MLP, the per-row cached attention of a batched step) must compute
/// the same model. Logits within the float bound of mlx-lm; a batched step's
/// rows within the same bound of each row alone (MLX's ops promise no batch
/// invariance; mlxcel's CPU kernels do, tests/tests/batch_invariance.rs).
#[test]
fn mlx_ops_path_matches_mlx_lm() {
    for (arch, bits) in [("llama", 4), ("gemma3", 4), ("qwen3_moe", 4), ("phi3", 0)] {
        let dir = tempfile::tempdir().unwrap();
        let tiny = tiny_model(dir.path(), arch, bits, 1);
        let (prompt, want) = (tiny.ids("prompt"), tiny.prompt_logits());
        with_mlx_ops(|| {
            let model = models::build(&tiny.config, &tiny.weights).unwrap();
            let mut backend = MlxBackend::new(model, MlxOptions::default()).unwrap();
            let seq = backend.new_sequence();
            let logits = backend.prefill(seq, &prompt, true).unwrap().unwrap();
            backend.release_sequence(seq);
            let diff = logits.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            eprintln!("{arch} bits={bits} MLX ops: largest logit difference {diff:e}");
            assert!(diff < 1e-4, "{arch} bits={bits} MLX ops: logits differ by {diff}");
            // Three sequences of different lengths in one step, against each alone.
            let heads: Vec<&[u32]> = vec![&prompt[..5], &prompt[..9], &prompt[..14]];
            let mut alone = Vec::new();
            for head in &heads {
                let seq = backend.new_sequence();
                backend.prefill(seq, head, false).unwrap();
                alone.push(backend.decode(&[(seq, 7)]).unwrap().into_first().unwrap());
                backend.release_sequence(seq);
            }
            let seqs: Vec<_> = heads
                .iter()
                .map(|head| {
                    let seq = backend.new_sequence();
                    backend.prefill(seq, head, false).unwrap();
                    (seq, 7)
                })
                .collect();
            for (i, l) in backend.decode(&seqs).unwrap().iter().enumerate() {
                let diff = l.iter().zip(&alone[i]).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                assert!(diff < 1e-4, "{arch} bits={bits} MLX ops: row {i} of a batch differs by {diff}");
            }
        });
    }
}

macro_rules! parity {
    ($($name:ident: $arch:literal, $bits:literal;)*) => {$(
        #[test]
        fn $name() {
            check($arch, $bits);
        }
    )*};
}

parity! {
    llama_f32: "llama", 0;
    llama_q4: "llama", 4;
    llama_untied_llama3_rope: "llama_untied_scaled", 0;
    qwen2_f32: "qwen2", 0;
    qwen3_q8: "qwen3", 8;
    gemma3_f32: "gemma3", 0;
    gemma3_q4: "gemma3", 4;
    phi3_f32: "phi3", 0;
    mistral_f32: "mistral", 0;
    mistral_q4: "mistral", 4;
    qwen3_moe_f32: "qwen3_moe", 0;
    qwen3_moe_q4: "qwen3_moe", 4;
}

/// Weights loaded from a bundle borrow its map (where MLX allows it), hold
/// exactly the file's bytes after the `Bundle` is gone, and the model loaded
/// from the bundle computes mlx-lm's logits.
#[test]
fn bundle_weights_borrow_the_map_and_match_mlx_lm() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_bundle(dir.path(), "llama", 4);
    let borrows = mlxcel_mlx::memory::can_borrow();

    let bundle = mlxcel_bundle::Bundle::open(&path).unwrap();
    let (weights, bytes) = weights_from_bundle(&bundle, Dtype::F32).unwrap();
    let expected: Vec<(String, Vec<u8>)> =
        bundle.tensors().map(|t| (t.name().to_string(), t.data().to_vec())).collect();
    assert_eq!(bytes, expected.iter().map(|(_, b)| b.len() as u64).sum::<u64>());
    drop(bundle);
    for (name, data) in &expected {
        let a = weights.raw(name).unwrap();
        assert_eq!(a.is_borrowed(), borrows, "{name}");
        assert_eq!(&a.to_bytes().unwrap(), data, "{name}");
    }

    let reference = read_json(&dir.path().join("source/reference.json"));
    let prompt: Vec<u32> = reference["prompt"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let want: Vec<f32> =
        reference["prompt_logits"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
    let mut model = load(&path, &LoadOptions::default()).unwrap();
    each_kernel_build(|build, bound| {
        let seq = model.backend.new_sequence();
        let logits = model.backend.prefill(seq, &prompt, true).unwrap().unwrap();
        model.backend.release_sequence(seq);
        let max_diff = logits.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(max_diff < bound, "{build}: logits from the bundle differ by {max_diff}");
    });
}

#[test]
fn unknown_architecture_is_refused_with_the_supported_list() {
    let err = ModelConfig::from_bundle_json("mamba", "{}").err().unwrap().to_string();
    assert_eq!(
        err,
        "model config: architecture \"mamba\" is not supported; supported: llama, mistral, qwen2, qwen3, qwen3_moe, gemma3, phi3"
    );
}

#[test]
fn unused_and_missing_weights_are_named() {
    let config = serde_json::json!({
        "hidden_size": 8, "num_hidden_layers": 1, "intermediate_size": 16, "num_attention_heads": 2,
        "vocab_size": 10, "rms_norm_eps": 1e-5
    });
    let config = ModelConfig::from_hf(Architecture::Llama, &config).unwrap();
    let w = Weights::new(Dtype::F32);
    let err = models::build(&config, &w).err().unwrap().to_string();
    assert_eq!(err, "weight model.layers.0.self_attn.q_proj.weight: missing from the bundle");
}

#[test]
fn tensors_the_architecture_does_not_use_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut tiny = tiny_model(dir.path(), "llama", 0, 1);
    tiny.weights.insert("model.layers.0.self_attn.rotary_emb.inv_freq", Array::zeros(&[4], Dtype::F32).unwrap());
    let err = models::build(&tiny.config, &tiny.weights).err().unwrap().to_string();
    assert_eq!(
        err,
        "weight model.layers.0.self_attn.rotary_emb.inv_freq: 1 tensor(s) in the bundle are not used by the llama architecture"
    );
}
