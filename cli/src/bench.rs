//! `mlxcel bench`: prompt-processing and generation speed of a bundle, in the
//! shape of llama.cpp's `llama-bench` (pp512 / tg128, mean ± standard
//! deviation over repetitions).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use mlxcel_runtime::backend::{MlxOptions, SeqId};
use mlxcel_runtime::loader::{LoadOptions, load_backend};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::flags;
use crate::output::Stdout;

/// The most sequences `-b` decodes together: each holds a KV cache, so the
/// bound keeps a typo from allocating without end.
const MAX_BATCH: usize = 1024;

/// Options of `mlxcel bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// The bundle to measure.
    pub bundle: PathBuf,
    /// Prompt tokens of the prompt-processing test (pp); 0 skips it.
    #[arg(value_name = "N", short = 'p', long = "n-prompt", default_value_t = 512, allow_negative_numbers = true,
          value_parser = flags::count(0, usize::MAX))]
    pub n_prompt: usize,
    /// Tokens of the generation test (tg), one decode step each; 0 skips it.
    #[arg(value_name = "N", short = 'n', long = "n-gen", default_value_t = 128, allow_negative_numbers = true,
          value_parser = flags::count(0, usize::MAX))]
    pub n_gen: usize,
    /// Repetitions of each test (after one warm-up run).
    #[arg(value_name = "R", short = 'r', long, default_value_t = 3, allow_negative_numbers = true,
          value_parser = flags::count(1, usize::MAX))]
    pub repetitions: usize,
    /// Sequences decoded together in the tg test (one forward pass per step
    /// for all of them); t/s counts every sequence's tokens.
    #[arg(value_name = "B", short = 'b', long, default_value_t = 1, allow_negative_numbers = true,
          value_parser = flags::count(1, MAX_BATCH))]
    pub batch: usize,
    /// Prompt tokens per forward pass in the pp test.
    #[arg(value_name = "N", long, default_value_t = 512, allow_negative_numbers = true, value_parser = flags::count(1, usize::MAX))]
    pub prefill_chunk: usize,
    /// Activations' dtype: f32 (the default on every device: greedy output
    /// matches the reference), or bf16/f16, faster on a GPU at the cost of
    /// a little precision (a near tie between two tokens may break the
    /// other way). Weights keep the bundle's dtype either way.
    #[arg(value_name = "DTYPE", long, default_value = "f32", value_parser = flags::activation_dtype)]
    pub dtype: mlxcel_mlx::Dtype,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub gpu: mlxcel_cli::process::GpuKernelFlags,
    #[command(flatten)]
    pub engine: mlxcel_cli::process::BackendFlags,
}

/// Tokens per second of each repetition of one test.
struct Sample {
    test: String,
    tokens: usize,
    rates: Vec<f64>,
}

impl Sample {
    fn mean(&self) -> f64 {
        self.rates.iter().sum::<f64>() / self.rates.len().max(1) as f64
    }

    fn stddev(&self) -> f64 {
        let m = self.mean();
        let n = self.rates.len();
        if n < 2 {
            return 0.0;
        }
        (self.rates.iter().map(|r| (r - m).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
    }
}

/// Runs `mlxcel bench`.
pub fn bench(out: &Stdout, args: BenchArgs) -> Result<()> {
    crate::check_bundle_path(&args.bundle)?;
    let options = LoadOptions {
        compute_dtype: Some(args.dtype),
        backend: MlxOptions { prefill_chunk: args.prefill_chunk, max_kv: None },
        gpu_kernels: args.gpu.options(),
        backend_kind: args.engine.backend,
        iree: args.engine.iree_options(),
    };
    let mut model =
        load_backend(&args.bundle, &options).with_context(|| format!("loading {}", args.bundle.display()))?;
    let backend = &mut model.backend;
    let context = backend.context_length();
    if args.n_prompt >= context || args.n_gen >= context {
        bail!("the tests need {} and {} positions but the model's context holds {context}", args.n_prompt, args.n_gen);
    }
    let vocab = u32::try_from(backend.vocab_size()).unwrap_or(u32::MAX);
    if vocab == 0 {
        bail!("{}: the model has no vocabulary", args.bundle.display());
    }
    let mut rng = StdRng::seed_from_u64(0);
    let mut samples = Vec::new();
    if args.n_prompt > 0 {
        let prompt: Vec<u32> = (0..args.n_prompt).map(|_| rng.random_range(0..vocab)).collect();
        let mut rates = Vec::new();
        for rep in 0..=args.repetitions {
            let seq = backend.new_sequence();
            let start = Instant::now();
            backend.prefill(seq, &prompt, true)?;
            let secs = start.elapsed().as_secs_f64();
            backend.release_sequence(seq);
            if rep > 0 {
                rates.push(args.n_prompt as f64 / secs);
            }
        }
        samples.push(Sample { test: format!("pp{}", args.n_prompt), tokens: args.n_prompt, rates });
    }
    if args.n_gen > 0 {
        let mut rates = Vec::new();
        for rep in 0..=args.repetitions {
            let mut batch: Vec<(SeqId, u32)> =
                (0..args.batch).map(|_| (backend.new_sequence(), rng.random_range(0..vocab))).collect();
            let start = Instant::now();
            for _ in 0..args.n_gen {
                let logits = backend.decode(&batch)?;
                for (row, l) in batch.iter_mut().zip(&logits) {
                    row.1 = mlxcel_runtime::sampler::argmax(l);
                }
            }
            let secs = start.elapsed().as_secs_f64();
            for (seq, _) in batch {
                backend.release_sequence(seq);
            }
            if rep > 0 {
                rates.push((args.n_gen * args.batch) as f64 / secs);
            }
        }
        let test =
            if args.batch == 1 { format!("tg{}", args.n_gen) } else { format!("tg{} x{}", args.n_gen, args.batch) };
        samples.push(Sample { test, tokens: args.n_gen * args.batch, rates });
    }

    let name = if model.name.is_empty() { model.architecture.clone() } else { model.name.clone() };
    let size_mib = model.weight_bytes as f64 / (1 << 20) as f64;
    let device = args.engine.device_label();
    let threads = args.engine.threads();
    if args.json {
        let rows: Vec<_> = samples
            .iter()
            .map(|s| {
                json!({
                    "model": name, "size_mib": size_mib, "device": device, "threads": threads,
                    "test": s.test, "tokens": s.tokens, "repetitions": s.rates.len(),
                    "tokens_per_second": s.mean(), "stddev": s.stddev(), "samples": s.rates,
                })
            })
            .collect();
        return out.line(&serde_json::to_string_pretty(&rows)?);
    }
    let mut table = String::from("| model | size | device | threads | test | t/s |\n|---|--:|---|--:|--:|--:|\n");
    for s in &samples {
        table.push_str(&format!(
            "| {name} | {size_mib:.1} MiB | {device} | {threads} | {} | {:.2} ± {:.2} |\n",
            s.test,
            s.mean(),
            s.stddev()
        ));
    }
    out.write(&table)
}
