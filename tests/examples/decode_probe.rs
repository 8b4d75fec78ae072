//! Decode and prefill speed of a bundle or of a model directory in mlx-lm's
//! layout (config.json and model.safetensors), and the MLX operations one
//! decode step runs.
//!
//! ```text
//! cargo run --release -p mlxcel-tests --example decode_probe -- DIR|BUNDLE [--tokens 64] [--prompt 512] [--reps 3]
//! MLXCEL_KERNELS=mlx ...   # MLX's own ops instead of mlxcel's kernels
//! MLXCEL_THREADS=1 ...     # kernel threads
//! ```
//!
//! Prints load time, ops per decode step (and the most frequent ones),
//! decode ms/token (best of `--reps` runs of `--tokens` tokens after a
//! 16-token prompt) and prefill tok/s of a `--prompt`-token prompt (best of
//! `--reps`; logits of the last position only, as generation needs).

use std::collections::BTreeMap;
use std::time::Instant;

use mlxcel_arch::{Architecture, ModelConfig};
use mlxcel_mlx::{Array, fast};
use mlxcel_runtime::backend::{Backend, MlxBackend, MlxOptions};
use mlxcel_runtime::kv_cache::{BatchCaches, KvCache};
use mlxcel_runtime::models;
use mlxcel_runtime::sampler::argmax;
use mlxcel_tests::steps::last_step_ops;
use mlxcel_tests::{load_mlx_lm_weights, read_json};

fn arg(args: &[String], name: &str, default: usize) -> usize {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() {
    // MLXCEL_KERNELS, MLXCEL_THREADS and the other settings, as the binaries read them.
    mlxcel_mlx::settings::Settings::from_env(|k| std::env::var(k).ok())
        .and_then(|s| s.apply())
        .unwrap_or_else(|e| panic!("{e}"));
    let args: Vec<String> = std::env::args().collect();
    let path = std::path::PathBuf::from(args.get(1).expect("usage: decode_probe DIR|BUNDLE"));
    let (tokens, prompt_len, reps) = (arg(&args, "--tokens", 64), arg(&args, "--prompt", 512), arg(&args, "--reps", 3));
    let t0 = Instant::now();
    let model = if path.is_dir() {
        let config = read_json(&path.join("config.json"));
        let model_type = config["model_type"].as_str().unwrap_or("llama");
        let arch = Architecture::from_hf(model_type).unwrap_or_else(|| panic!("unknown model_type {model_type}"));
        let w = load_mlx_lm_weights(&path, &config);
        models::build(&ModelConfig::from_hf(arch, &config).unwrap(), &w).unwrap()
    } else {
        let bundle = mlxcel_bundle::Bundle::open(&path).unwrap();
        let config = ModelConfig::from_bundle_json(bundle.architecture(), bundle.config_json()).unwrap();
        let (w, _) = mlxcel_runtime::loader::weights_from_bundle(&bundle, mlxcel_mlx::Dtype::F32).unwrap();
        models::build(&config, &w).unwrap()
    };
    eprintln!(
        "load {:?}; kernels: {:?}, ISA {}, {} thread(s)",
        t0.elapsed(),
        fast::default_path(),
        fast::isa(),
        fast::threads()
    );

    // The operations of one steady decode step (after a 16-token prompt and
    // a first step, which may grow a sliding-window ring).
    let prompt: Vec<u32> = (0..16).collect();
    let ops = last_step_ops(model.as_ref(), &[&prompt, &[5], &[7]]);
    let mut hist: BTreeMap<&str, usize> = BTreeMap::new();
    for op in &ops {
        *hist.entry(op.as_str()).or_default() += 1;
    }
    let mut hist: Vec<(&str, usize)> = hist.into_iter().collect();
    hist.sort_by_key(|&(_, c)| std::cmp::Reverse(c));
    let top: Vec<String> = hist.iter().take(12).map(|(n, c)| format!("{n} {c}")).collect();
    eprintln!("ops/decode step: {} ({})", ops.len(), top.join(", "));
    // Graph building vs evaluation, per decode step.
    let mut caches: Vec<KvCache> = model.new_caches(None);
    let (mut build, mut eval) = (0f64, 0f64);
    let steps = 16;
    for i in 0..steps {
        let t = Instant::now();
        let input = Array::from_slice(&[i as u32 + 3], &[1, 1]).unwrap();
        let h = model.hidden_states(&input, &mut BatchCaches::new(&mut [&mut caches])).unwrap();
        let logits = model.logits(&h).unwrap();
        let mut outs: Vec<&Array> = caches.iter().flat_map(KvCache::arrays).collect();
        outs.push(&logits);
        let t1 = Instant::now();
        Array::eval_all(&outs).unwrap();
        logits.to_vec::<f32>().unwrap();
        build += (t1 - t).as_secs_f64();
        eval += t1.elapsed().as_secs_f64();
    }
    eprintln!(
        "per decode step: building the graph {:.2} ms, evaluating it {:.2} ms",
        build * 1e3 / steps as f64,
        eval * 1e3 / steps as f64
    );
    drop(caches);

    let mut b = MlxBackend::new(model, MlxOptions::default()).unwrap();
    let mut best_decode = f64::INFINITY;
    for _ in 0..reps {
        let seq = b.new_sequence();
        let mut logits = b.prefill(seq, &prompt, true).unwrap().unwrap();
        let t = Instant::now();
        for _ in 0..tokens {
            let tok = argmax(&logits);
            logits = b.decode(&[(seq, tok)]).unwrap().into_first().unwrap();
        }
        best_decode = best_decode.min(t.elapsed().as_secs_f64() * 1e3 / tokens as f64);
        b.release_sequence(seq);
    }
    eprintln!("decode {best_decode:.2} ms/token ({:.1} tok/s), best of {reps}", 1e3 / best_decode);
    let prompt: Vec<u32> = (0..prompt_len as u32).map(|i| (i * 7919) % 1000).collect();
    let mut best_prefill = 0f64;
    for _ in 0..reps {
        let seq = b.new_sequence();
        let t = Instant::now();
        b.prefill(seq, &prompt, true).unwrap();
        best_prefill = best_prefill.max(prompt_len as f64 / t.elapsed().as_secs_f64());
        b.release_sequence(seq);
    }
    eprintln!("prefill{prompt_len} {best_prefill:.1} tok/s, best of {reps}");
}
