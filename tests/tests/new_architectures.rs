//! The architectures added on the redesigned vocabulary, end to end: tiny
//! random Mistral and Qwen3-MoE models that mlx-lm builds, compiled by
//! `mlxcel-compile` from each source they come in and generated from by the
//! engine, give mlx-lm's greedy tokens.
//!
//! - Mistral: mlx-lm's directory (Hugging Face names, `model_type`
//!   `mistral`, `sliding_window` 8 < the 20-token prompt and no
//!   `layer_types`): the compiler must make every layer slide.
//! - Qwen3-MoE: mlx-lm's directory (experts stacked), a Hugging Face
//!   directory with one tensor per expert, and an F32 GGUF shaped as
//!   llama.cpp's converter writes it (`compiler/tests/python/moe_sources.py`).
//!
//! Logits are compared in tests/tests/tiny_parity.rs; here the whole path
//! (ingest, the normalized config, the bundle, loading, the engine) must
//! reproduce mlx-lm's tokens.

use std::path::Path;
use std::process::Command;

use mlxcel_runtime::engine::{Engine, EngineOptions, Request};
use mlxcel_runtime::generate::GenerationOptions;
use mlxcel_tests::{mlxcel_compile_bin, read_json, reference_python, run_reference_script, workspace_root};

/// Compiles `source` into `bundle` with the real compiler binary.
fn compile(source: &Path, bundle: &Path) {
    let out = Command::new(mlxcel_compile_bin()).arg(source).arg("-o").arg(bundle).arg("--quiet").output().unwrap();
    assert!(
        out.status.success(),
        "compiling {}: {}{}",
        source.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// mlx-lm's greedy tokens for the reference prompt, from the engine on `bundle`.
fn greedy(bundle: &Path, prompt: &[u32], n: usize) -> Vec<u32> {
    let engine = Engine::load(bundle, EngineOptions::default()).unwrap();
    let options = GenerationOptions { max_tokens: n, ignore_eos: true, ..GenerationOptions::default() };
    engine.generate(Request { prompt: prompt.to_vec(), options }).unwrap().tokens
}

/// The reference of a tiny model directory: prompt ids and greedy tokens.
fn reference(dir: &Path) -> (Vec<u32>, Vec<u32>) {
    let r = read_json(&dir.join("reference.json"));
    let ids = |key: &str| r[key].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    (ids("prompt"), ids("tokens"))
}

#[test]
fn mistral_slides_every_layer_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("mlx");
    run_reference_script("tiny_reference.py", &["mistral", src.to_str().unwrap()]);
    let bundle = dir.path().join("mistral.mlxb");
    compile(&src, &bundle);
    let config = mlxcel_bundle::Bundle::open(&bundle).unwrap().config_json().to_string();
    assert!(
        config.contains(r#""layer_types":["sliding_attention","sliding_attention","sliding_attention"]"#),
        "{config}"
    );
    let (prompt, want) = reference(&src);
    assert_eq!(greedy(&bundle, &prompt, want.len()), want);
}

#[test]
fn qwen3_moe_from_every_source_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let mlx = dir.path().join("mlx");
    run_reference_script("tiny_reference.py", &["qwen3_moe", mlx.to_str().unwrap()]);
    // The same model as a Hugging Face directory and as GGUFs.
    let script = workspace_root().join("compiler/tests/python/moe_sources.py");
    let out = Command::new(reference_python()).arg(&script).arg(&mlx).arg(dir.path()).output().unwrap();
    assert!(out.status.success(), "moe_sources.py: {}", String::from_utf8_lossy(&out.stderr));
    let (prompt, want) = reference(&mlx);
    for source in ["mlx", "hf", "f32.gguf"] {
        let bundle = dir.path().join(format!("{source}.mlxb"));
        compile(&dir.path().join(source), &bundle);
        assert_eq!(greedy(&bundle, &prompt, want.len()), want, "{source}");
    }
}
