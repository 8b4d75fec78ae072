//! Where a decode step's wall time goes on the host: building the lazy
//! graph (the model's forward pass and the output projection), evaluating
//! it (MLX issuing every node and waiting for the device), and reading the
//! logits back. Mirrors `backend::forward` with a clock between the phases.
//!
//! ```text
//! cargo run --release -p mlxcel-tests --example step_phases -- BUNDLE [--steps 128] [--context 64]
//! MLXCEL_DEVICE=gpu ...    # the device, as the binaries read it
//! ```
//!
//! Decodes `--steps` greedy tokens after a prompt of `--context` copies of
//! token 1 (after two warm-up steps), and prints each phase's mean and
//! median per step in microseconds, and the number of graph nodes of a step
//! (what the GPU path issues one by one).

use std::path::PathBuf;
use std::time::Instant;

use mlxcel_mlx::{Array, fast};
use mlxcel_runtime::gpu_kernels::{GpuKernelOptions, MissingGpuKernels};
use mlxcel_runtime::kv_cache::{BatchCaches, KvCache};
use mlxcel_runtime::loader::{LoadOptions, load};
use mlxcel_runtime::models::LanguageModel;
use mlxcel_runtime::sampler::argmax;

fn flag(args: &[String], name: &str, default: usize) -> usize {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |s| s.parse().unwrap_or_else(|_| panic!("{name}: a count")))
}

/// One forward pass of `tokens`, timed: (build, eval, read) in µs and the
/// greedy token of the last row.
fn step(model: &dyn LanguageModel, tokens: &Array, caches: &mut Vec<KvCache>) -> ([f64; 3], usize, u32) {
    let t0 = Instant::now();
    let mut rows = [caches];
    let logits = {
        let hidden = model.hidden_states(tokens, &mut BatchCaches::new(&mut rows)).expect("forward pass");
        let s = hidden.shape();
        let last =
            if s[1] == 1 { hidden } else { hidden.slice(&[0, s[1] - 1, 0], &[s[0], s[1], s[2]], &[1, 1, 1]).unwrap() };
        model.logits(&last).expect("logits")
    };
    let mut outputs: Vec<&Array> = rows[0].iter().flat_map(KvCache::arrays).collect();
    outputs.push(&logits);
    let t1 = Instant::now();
    // Counted off the clock: listing the graph costs about as much as building it.
    let nodes = fast::pending_ops(&[&logits]).len();
    let listed = Instant::now();
    fast::eval(&outputs).expect("eval");
    let t2 = Instant::now();
    let values = logits.to_vec::<f32>().expect("logits");
    let t3 = Instant::now();
    let us = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e6;
    ([us(t0, t1), us(listed, t2), us(t2, t3)], nodes, argmax(&values))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bundle = args.get(1).filter(|a| !a.starts_with("--")).expect("usage: step_phases BUNDLE [--steps N]");
    let steps = flag(&args, "--steps", 128);
    let context = flag(&args, "--context", 64);
    let options = LoadOptions {
        compute_dtype: None,
        backend: Default::default(),
        gpu_kernels: GpuKernelOptions { cache_root: None, missing: MissingGpuKernels::Refuse },
    };
    let loaded = load(&PathBuf::from(bundle), &options).unwrap_or_else(|e| panic!("{bundle}: {e}"));
    let model = loaded.backend.model();
    let mut caches = model.new_caches(None);
    let prompt = Array::from_slice(&vec![1u32; context.max(1)], &[1, context.max(1) as i32]).unwrap();
    let (_, _, mut token) = step(model, &prompt, &mut caches);
    let mut phases: [Vec<f64>; 3] = Default::default();
    let mut nodes = 0;
    for i in 0..steps + 2 {
        let input = Array::from_slice(&[token], &[1, 1]).unwrap();
        let (t, n, next) = step(model, &input, &mut caches);
        token = next;
        nodes = n;
        if i >= 2 {
            for (p, v) in phases.iter_mut().zip(t) {
                p.push(v);
            }
        }
    }
    println!(
        "{bundle}: {:?}, {steps} decode steps after {context} positions, {nodes} graph nodes a step",
        mlxcel_mlx::device::default_device()
    );
    let mut total = 0.0;
    for (name, p) in ["build the graph", "evaluate (issue + wait)", "read the logits"].iter().zip(phases.iter_mut()) {
        p.sort_by(f64::total_cmp);
        let mean = p.iter().sum::<f64>() / p.len() as f64;
        total += mean;
        println!("{name:>24}: mean {mean:8.1} us, median {:8.1} us", p[p.len() / 2]);
    }
    println!("{:>24}: mean {total:8.1} us ({:.0} tok/s)", "step", 1e6 / total);
}
