//! Where a decode step's wall time goes on the host: building the lazy
//! graph (the model's forward pass and the output projection), evaluating
//! it (MLX issuing every node and waiting for the device), and reading the
//! logits back. Mirrors `backend::forward` with a clock between the phases;
//! then times the same steps through the backend itself, which on the GPU
//! records the first as a step graph and replays it (`MLXCEL_STEP_GRAPHS`).
//!
//! ```text
//! cargo run --release -p mlxcel-tests --example step_phases -- BUNDLE [--steps 128] [--context 64]
//! MLXCEL_DEVICE=gpu ...    # the settings, as the binaries read them
//! ```
//!
//! Decodes `--steps` greedy tokens after a prompt of `--context` copies of
//! token 1 (both at least 1) (after two warm-up steps), and prints each phase's mean and
//! median per step in microseconds, and the number of graph nodes of a step
//! (what the GPU path issues one by one); then the backend's step.

use std::error::Error;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use mlxcel_mlx::settings::Settings;
use mlxcel_mlx::{Array, fast};
use mlxcel_runtime::backend::Backend;
use mlxcel_runtime::gpu_kernels::{GpuKernelOptions, MissingGpuKernels};
use mlxcel_runtime::kv_cache::{BatchCaches, KvCache};
use mlxcel_runtime::loader::{LoadOptions, load};
use mlxcel_runtime::models::LanguageModel;
use mlxcel_runtime::sampler::argmax;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

const USAGE: &str = "usage: step_phases BUNDLE [--steps N] [--context N]";

/// The value of `--name N` (a positive count), or `default`.
fn count(args: &[String], name: &str, default: usize) -> Result<usize> {
    let Some(i) = args.iter().position(|a| a == name) else { return Ok(default) };
    let value = args.get(i + 1).ok_or_else(|| format!("{name} needs a value ({USAGE})"))?;
    match value.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{name} {value}: expected a positive count").into()),
    }
}

/// One forward pass of `tokens`, timed: (build, eval, read) in µs, the
/// step's graph nodes and the greedy token of the last row.
fn step(model: &dyn LanguageModel, tokens: &Array, caches: &mut Vec<KvCache>) -> Result<([f64; 3], usize, u32)> {
    let t0 = Instant::now();
    let mut rows = [caches];
    let logits = {
        let hidden = model.hidden_states(tokens, &mut BatchCaches::new(&mut rows))?;
        let s = hidden.shape();
        let last = if s[1] == 1 { hidden } else { hidden.slice(&[0, s[1] - 1, 0], &[s[0], s[1], s[2]], &[1, 1, 1])? };
        model.logits(&last)?
    };
    let mut outputs: Vec<&Array> = rows[0].iter().flat_map(KvCache::arrays).collect();
    outputs.push(&logits);
    let t1 = Instant::now();
    // Counted off the clock: listing the graph costs about as much as building it.
    let nodes = fast::pending_ops(&[&logits]).len();
    let listed = Instant::now();
    fast::eval(&outputs)?;
    let t2 = Instant::now();
    let values = logits.to_vec::<f32>()?;
    let t3 = Instant::now();
    let us = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e6;
    Ok(([us(t0, t1), us(listed, t2), us(t2, t3)], nodes, argmax(&values)))
}

fn run(args: &[String]) -> Result<()> {
    let bundle = args.get(1).filter(|a| !a.starts_with("--")).ok_or(USAGE)?;
    let steps = count(args, "--steps", 128)?;
    let context = count(args, "--context", 64)?;
    Settings::from_env(|k| std::env::var(k).ok())?.apply()?;
    let options = LoadOptions {
        compute_dtype: None,
        backend: Default::default(),
        gpu_kernels: GpuKernelOptions { cache_root: None, missing: MissingGpuKernels::Refuse },
        ..LoadOptions::default()
    };
    let mut loaded = load(&PathBuf::from(bundle), &options).map_err(|e| format!("{bundle}: {e}"))?;
    let model = loaded.backend.model();
    let mut caches = model.new_caches(None);
    let prompt = Array::from_slice(&vec![1u32; context], &[1, i32::try_from(context)?])?;
    let (_, _, mut token) = step(model, &prompt, &mut caches)?;
    let mut phases: [Vec<f64>; 3] = Default::default();
    let mut nodes = 0;
    for i in 0..steps + 2 {
        let (t, n, next) = step(model, &Array::from_slice(&[token], &[1, 1])?, &mut caches)?;
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
    drop(caches);

    // The same steps through the backend (recorded and replayed on the GPU).
    let backend = &mut loaded.backend;
    let seq = backend.new_sequence();
    let logits = backend.prefill(seq, &vec![1u32; context], true)?.ok_or("the prompt gave no logits")?;
    let mut token = argmax(&logits);
    let mut times = Vec::with_capacity(steps);
    for i in 0..steps + 2 {
        let t = Instant::now();
        let rows = backend.decode(&[(seq, token)])?;
        token = argmax(rows.iter().next().ok_or("a decode step gave no logits")?);
        if i >= 2 {
            times.push((Instant::now() - t).as_secs_f64() * 1e6);
        }
    }
    times.sort_by(f64::total_cmp);
    let mean = times.iter().sum::<f64>() / times.len() as f64;
    let graphs = if !fast::step_graphs() {
        "step graphs off".to_string()
    } else {
        match backend.unrecordable_steps().next() {
            Some((_, why)) => format!("not recorded: {why}"),
            None => "step graphs on".to_string(),
        }
    };
    println!(
        "{:>24}: mean {mean:8.1} us, median {:8.1} us ({:.0} tok/s; {graphs})",
        "backend decode step",
        times[times.len() / 2],
        1e6 / mean
    );
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("step_phases: {e}");
            ExitCode::FAILURE
        }
    }
}
