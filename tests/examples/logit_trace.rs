//! Greedy decoding of the reference prompts with each step's most likely
//! tokens and their log-probabilities: how two devices or activation
//! dtypes are compared (scripts/gpu/parity.sh runs it on the CPU, then on
//! the GPU following the CPU's tokens).
//!
//! ```text
//! cargo run --release -p mlxcel-tests --example logit_trace -- BUNDLE OUT.json [--steps 32] [--dtype f32|bf16|f16]
//!     [--prefill-chunk 512] [--gpu-kernels refuse|jit|cpu] [--follow REF.json [--tol 0.02] [--margin 0.05]]
//! MLXCEL_DEVICE=gpu ...    # the device, as the binaries read it
//! ```
//!
//! Each prompt (three through the chat template, three raw: the prompts of
//! tests/tests/real_parity.rs; then a raw one of about 100 tokens) is decoded
//! for `--steps` tokens, end tokens included, and every step's 64 most likely
//! tokens are written with their log-probabilities. With `--follow`, the steps
//! feed REF's tokens instead of this run's own choices (so both runs see the
//! same inputs even after a near tie), and the run compares itself with REF:
//! the largest log-probability difference over REF's 64 tokens per step, and
//! every step where this run's top token differs from REF's. It fails (exit 1)
//! when a difference passes `--tol`, or when the top tokens differ at a step
//! where REF's first two tokens are more than `--margin` apart (a near tie may
//! break either way within the tolerance). `--prefill-chunk` bounds the prompt
//! rows per forward pass: on the GPU with `--gpu-kernels jit` each new bucket
//! of rows makes MLX compile another quantized-matmul kernel
//! (scripts/gpu/jit.sh).

use std::path::PathBuf;
use std::process::ExitCode;

use mlxcel_mlx::Dtype;
use mlxcel_runtime::backend::{Backend, MlxOptions};
use mlxcel_runtime::chat::Message;
use mlxcel_runtime::gpu_kernels::{GpuKernelOptions, MissingGpuKernels};
use mlxcel_runtime::loader::{LoadOptions, load};
use serde_json::{Value, json};

const CHAT_PROMPTS: [&str; 3] =
    ["What is the capital of France?", "Write a short poem about the sea.", "Explain recursion to a child."];
const RAW_PROMPTS: [&str; 4] = ["The capital of France is", "Once upon a time,", "def fibonacci(n):", LONG_PROMPT];
/// A raw prompt of about 100 tokens (96 with SmolLM2's tokenizer): on the
/// GPU a pass of more than 32 rows leaves mlxcel's decode kernels for MLX's
/// operations (its quantized matmul and attention), which the short raw
/// prompts never reach.
const LONG_PROMPT: &str = "The history of computing is often told as a story of machines, but it is just as much a \
story of people and of the problems they wanted to solve. Astronomers needed tables of planetary positions, \
navigators needed tables of logarithms, and census offices needed a way to count millions of cards before the \
next census began. Each of these needs produced a new kind of device, and each device changed the questions \
that people thought were worth asking. In the end, the most important";
/// Tokens kept per step.
const TOP: usize = 64;

fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).map(String::as_str)
}

fn log_softmax(x: &[f32]) -> Vec<f32> {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = x.iter().map(|&v| ((v - max) as f64).exp()).sum();
    let log_sum = max + sum.ln() as f32;
    x.iter().map(|&v| v - log_sum).collect()
}

/// The `TOP` most likely tokens, most likely first (lower id first on ties).
fn top(logprobs: &[f32]) -> Vec<(u32, f32)> {
    let mut ids: Vec<u32> = (0..logprobs.len() as u32).collect();
    ids.sort_by(|&a, &b| logprobs[b as usize].total_cmp(&logprobs[a as usize]).then(a.cmp(&b)));
    ids.truncate(TOP);
    ids.into_iter().map(|i| (i, logprobs[i as usize])).collect()
}

fn main() -> ExitCode {
    mlxcel_mlx::settings::Settings::from_env(|k| std::env::var(k).ok())
        .and_then(|s| s.apply())
        .unwrap_or_else(|e| panic!("{e}"));
    let args: Vec<String> = std::env::args().collect();
    let (Some(bundle), Some(out)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: logit_trace BUNDLE OUT.json [--steps N] [--dtype f32|bf16|f16] [--follow REF.json]");
        return ExitCode::from(2);
    };
    let steps: usize = flag(&args, "--steps").map_or(32, |s| s.parse().expect("--steps: a count"));
    let dtype = match flag(&args, "--dtype").unwrap_or("f32") {
        "f32" => Dtype::F32,
        "bf16" => Dtype::BF16,
        "f16" => Dtype::F16,
        other => panic!("--dtype {other}: use f32, bf16 or f16"),
    };
    let tol: f32 = flag(&args, "--tol").map_or(0.02, |s| s.parse().expect("--tol: a number"));
    let margin: f32 = flag(&args, "--margin").map_or(0.05, |s| s.parse().expect("--margin: a number"));
    let reference: Option<Value> = flag(&args, "--follow").map(|p| {
        serde_json::from_slice(&std::fs::read(p).unwrap_or_else(|e| panic!("{p}: {e}"))).expect("--follow: JSON")
    });

    let prefill_chunk: usize =
        flag(&args, "--prefill-chunk").map_or(512, |s| s.parse().expect("--prefill-chunk: a count"));
    // The bundle's GPU kernels (mlxcel-compile --target), or MLX's run-time
    // compilation with `--gpu-kernels jit`.
    let missing = flag(&args, "--gpu-kernels").map_or(MissingGpuKernels::Refuse, |s| {
        MissingGpuKernels::parse(s).unwrap_or_else(|| panic!("--gpu-kernels {s}: use refuse, jit or cpu"))
    });
    let options = LoadOptions {
        compute_dtype: Some(dtype),
        backend: MlxOptions { prefill_chunk, max_kv: None },
        gpu_kernels: GpuKernelOptions { cache_root: None, missing },
        ..LoadOptions::default()
    };
    let mut model = load(&PathBuf::from(bundle), &options).unwrap_or_else(|e| panic!("{bundle}: {e}"));
    let device = format!("{:?}", mlxcel_mlx::device::default_device());
    eprintln!("{bundle}: {device}, {dtype:?} activations, {steps} steps per prompt");

    let mut traces = Vec::new();
    let mut failed = false;
    let prompts = CHAT_PROMPTS.iter().map(|p| (true, *p)).chain(RAW_PROMPTS.iter().map(|p| (false, *p)));
    for (k, (chat, prompt)) in prompts.enumerate() {
        let tok = &model.tokenizer;
        let ids = if chat {
            let template = model.chat_template.as_ref().expect("the bundle has a chat template");
            let text = template.render(&[Message::new("user", prompt)], true, tok.bos_text(), tok.eos_text()).unwrap();
            tok.encode(&text, false).unwrap()
        } else {
            tok.encode(prompt, true).unwrap()
        };
        let want = reference.as_ref().map(|r| &r[k]);
        if let Some(w) = want {
            let want_ids: Vec<u32> = serde_json::from_value(w["prompt_ids"].clone()).unwrap();
            assert_eq!(ids, want_ids, "{prompt:?}: the reference tokenized the prompt differently");
        }
        // As generation runs: the prompt but its last token, then steps.
        let b = &mut model.backend;
        let seq = b.new_sequence();
        b.prefill(seq, &ids[..ids.len() - 1], false).unwrap();
        let mut input = ids[ids.len() - 1];
        let (mut tokens, mut tops) = (Vec::new(), Vec::new());
        let (mut worst, mut flips) = (0f32, Vec::new());
        for step in 0..steps {
            let logits = b.decode(&[(seq, input)]).unwrap().into_first().unwrap();
            let lp = log_softmax(&logits);
            let mine = top(&lp);
            let own = mine[0].0;
            input = own;
            if let Some(w) = want {
                let theirs: Vec<(u32, f32)> = serde_json::from_value(w["top"][step].clone()).unwrap();
                for &(id, p) in &theirs {
                    worst = worst.max((lp[id as usize] - p).abs());
                }
                let their_margin = theirs[0].1 - theirs[1].1;
                if theirs[0].0 != own {
                    flips.push(json!({"step": step, "theirs": theirs[0].0, "ours": own, "their_margin": their_margin}));
                    if their_margin > margin {
                        failed = true;
                    }
                }
                input = theirs[0].0;
            }
            tokens.push(input);
            tops.push(mine);
        }
        b.release_sequence(seq);
        let text = model.tokenizer.decode(&tokens, false).unwrap_or_default();
        if want.is_some() {
            failed |= worst > tol;
            println!(
                "{} {prompt:?}: largest |Δ log p| {worst:.2e}; top token differs at {} step(s){}",
                if chat { "chat" } else { "raw " },
                flips.len(),
                if flips.is_empty() { String::new() } else { format!(" {}", Value::Array(flips.clone())) }
            );
        } else {
            println!("{} {prompt:?}: {text:?}", if chat { "chat" } else { "raw " });
        }
        traces.push(json!({
            "prompt": prompt, "chat": chat, "prompt_ids": ids, "tokens": tokens, "text": text,
            "top": tops, "largest_difference": worst, "flips": flips,
        }));
    }
    let doc = json!(traces);
    std::fs::write(out, serde_json::to_vec(&doc).unwrap()).unwrap_or_else(|e| panic!("{out}: {e}"));
    if reference.is_some() {
        println!("tolerance {tol:e}, margin {margin}: {}", if failed { "FAILED" } else { "passed" });
    }
    if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}
