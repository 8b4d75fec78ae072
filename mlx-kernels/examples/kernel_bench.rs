//! Micro-benchmarks of mlxcel's CPU kernels against MLX's own operations, at
//! the shapes of SmolLM2-135M and Gemma-3-270M, plus this machine's memory
//! read bandwidth (the decode roofline).
//!
//! ```text
//! cargo run --release -p mlxcel-mlx --example kernel_bench -- [--threads 1,2] [--quick] [--no-mlx]
//! cargo run --release -p mlxcel-mlx --example kernel_bench -- --bandwidth --threads 2
//! cargo run --release -p mlxcel-mlx --example kernel_bench -- --float [--no-mlx]
//! ```
//!
//! `--float` prints only the products of float weights (bf16 and f32, the
//! SmolLM2-135M shapes, one graph node each against MLX's matmul).
//!
//! `--bandwidth` prints only the DRAM read bandwidth (GB/s, best of 8 sums
//! over 256 MiB) of the first thread count and exits (bench/cpu.sh's roofline).
//!
//! Per shape and row count M (1: decode, 512: prefill) it prints: the kernel
//! alone (best of many calls, no MLX graph) and its GFLOP/s; for M = 1 the
//! weight bytes per second with the matrix in cache ("hot": the same matrix
//! again and again) and streamed from memory ("cold": distinct copies, 256 MiB
//! in all, with f32 and with f16 scales and biases); the same kernel as a graph
//! node (MLX dispatch included, averaged over 16 nodes in one evaluation); and
//! MLX's own `quantized_matmul` (best of a few). Then the read bandwidth of
//! this machine and the other kernels against MLX. Timings on a shared machine
//! are noisy: everything is best-of-N.

use std::time::Instant;

use mlxcel_mlx::fast::{self, GateActivation, Path};
use mlxcel_mlx::{Array, AttentionMask, Dtype, Linear, QuantMode, Quantized, Weight, random};

struct Shape {
    model: &'static str,
    name: &'static str,
    n: i32,
    k: i32,
}

const SHAPES: [Shape; 12] = [
    Shape { model: "SmolLM2-135M", name: "q/o_proj", n: 576, k: 576 },
    Shape { model: "SmolLM2-135M", name: "k/v_proj", n: 192, k: 576 },
    Shape { model: "SmolLM2-135M", name: "gate/up", n: 1536, k: 576 },
    Shape { model: "SmolLM2-135M", name: "down", n: 576, k: 1536 },
    Shape { model: "SmolLM2-135M", name: "lm_head", n: 49152, k: 576 },
    Shape { model: "Gemma-3-270M", name: "q_proj", n: 1024, k: 640 },
    Shape { model: "Gemma-3-270M", name: "k/v_proj", n: 256, k: 640 },
    Shape { model: "Gemma-3-270M", name: "o_proj", n: 640, k: 1024 },
    Shape { model: "Gemma-3-270M", name: "gate/up", n: 2048, k: 640 },
    Shape { model: "Gemma-3-270M", name: "down", n: 640, k: 2048 },
    Shape { model: "Gemma-3-270M", name: "lm_head", n: 262144, k: 640 },
    Shape { model: "square", name: "4096²", n: 4096, k: 4096 },
];

fn time_best(reps: usize, mut f: impl FnMut()) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
    }
    best
}

fn main() -> Result<(), mlxcel_mlx::Error> {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let no_mlx = args.iter().any(|a| a == "--no-mlx");
    let threads: Vec<usize> = args
        .iter()
        .position(|a| a == "--threads")
        .and_then(|i| args.get(i + 1))
        .map(|s| s.split(',').filter_map(|t| t.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, fast::default_threads()]);
    if args.iter().any(|a| a == "--bandwidth") {
        fast::set_threads(threads[0]);
        println!("{:.2}", fast::read_bandwidth_gbs(256 << 20, 8));
        return Ok(());
    }
    let key = random::Key::new(7)?;
    println!("mlxcel kernels: ISA {}, default threads {}", fast::isa(), fast::default_threads());
    if args.iter().any(|a| a == "--float") {
        return float_products(&key, no_mlx);
    }
    for &t in &threads {
        fast::set_threads(t);
        println!("\n## {t} thread(s)\n");
        for (what, bytes) in [("256 MiB (DRAM)", 256usize << 20), ("16 MiB", 16 << 20), ("1 MiB (L2)", 1 << 20)] {
            let reps = if bytes > (64 << 20) { 8 } else { 50 };
            println!("read bandwidth, {what}: {:.1} GB/s", fast::read_bandwidth_gbs(bytes, reps));
        }
        println!();
        println!(
            "| model | matrix | N×K | bits/group | M | kernel µs (hot) | GB/s hot | GB/s cold | GB/s cold, f16 scales | GFLOP/s | as graph node µs | MLX µs | vs MLX |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
        for s in &SHAPES {
            if quick && (s.n > 60000 || s.n == 4096) {
                continue;
            }
            for (bits, group) in [(4, 32), (8, 32)] {
                if quick && bits == 8 {
                    continue;
                }
                let w = random::normal(&[s.n, s.k], Dtype::F32, 0.0, 1.0, &key)?;
                let q: Quantized = w.quantize(group, bits, QuantMode::Affine)?;
                let biases = q.biases.clone().expect("affine");
                Array::eval_all(&[&q.weight, &q.scales, &biases])?;
                drop(w);
                let wbytes = q.weight.nbytes() + q.scales.nbytes() + biases.nbytes();
                for m in [1i32, 512] {
                    if m == 512 && s.n > 60000 {
                        continue;
                    }
                    let x = random::normal(&[m, s.k], Dtype::F32, 0.0, 1.0, &key)?;
                    x.eval()?;
                    let kt = fast::bench_quantized_linear(&x, &[&q], if m == 1 { 200 } else { 5 })?;
                    let flops = 2.0 * f64::from(m) * f64::from(s.n) * f64::from(s.k);
                    // Streamed from memory: distinct copies of the weights,
                    // 256 MiB in all (more than the caches), one pass each rep.
                    let (cold, cold16) = if m == 1 {
                        let copies = (256usize << 20).div_ceil(wbytes).clamp(2, 4096);
                        let zero = Array::zeros(&[], Dtype::U32)?;
                        let fzero = Array::zeros(&[], Dtype::F32)?;
                        let mut qs = Vec::with_capacity(copies);
                        for _ in 0..copies {
                            let c = Quantized {
                                weight: q.weight.add(&zero)?,
                                scales: q.scales.add(&fzero)?,
                                biases: Some(biases.add(&fzero)?),
                                ..q.clone()
                            };
                            Array::eval_all(&[&c.weight, &c.scales, c.biases.as_ref().unwrap()])?;
                            qs.push(c);
                        }
                        let refs: Vec<&Quantized> = qs.iter().collect();
                        let t = fast::bench_quantized_linear(&x, &refs, 5)? / copies as f64;
                        let qs16: Vec<Quantized> = qs
                            .iter()
                            .map(|c| Quantized {
                                scales: c.scales.astype(Dtype::F16).unwrap(),
                                biases: c.biases.as_ref().map(|b| b.astype(Dtype::F16).unwrap()),
                                ..c.clone()
                            })
                            .collect();
                        drop(qs);
                        let refs: Vec<&Quantized> = qs16.iter().collect();
                        let bytes16 = q.weight.nbytes() + (q.scales.nbytes() + biases.nbytes()) / 2;
                        let t16 = fast::bench_quantized_linear(&x, &refs, 5)? / copies as f64;
                        (wbytes as f64 / t / 1e9, bytes16 as f64 / t16 / 1e9)
                    } else {
                        (f64::NAN, f64::NAN)
                    };
                    // As graph nodes: independent products in one evaluation.
                    let nodes = if m == 1 { 16 } else { 2 };
                    let graph = time_best(if m == 1 { 20 } else { 3 }, || {
                        let outs: Vec<Array> =
                            (0..nodes).map(|_| fast::on(Path::Kernel).quantized_linear(&x, &q).unwrap()).collect();
                        Array::eval_all(&outs.iter().collect::<Vec<_>>()).unwrap();
                    }) / nodes as f64;
                    let mlx = if no_mlx || (m == 512 && s.n * s.k > 4_000_000) {
                        f64::NAN
                    } else {
                        time_best(if m == 1 { 5 } else { 1 }, || {
                            fast::on(Path::Mlx).quantized_linear(&x, &q).unwrap().eval().unwrap();
                        })
                    };
                    let opt = |v: f64, f: &dyn Fn(f64) -> String| if v.is_nan() { "–".to_string() } else { f(v) };
                    println!(
                        "| {} | {} | {}×{} | {bits}/{group} | {m} | {:.1} | {} | {} | {} | {:.1} | {:.1} | {} | {} |",
                        s.model,
                        s.name,
                        s.n,
                        s.k,
                        kt * 1e6,
                        opt(if m == 1 { wbytes as f64 / kt / 1e9 } else { f64::NAN }, &|v| format!("{v:.1}")),
                        opt(cold, &|v| format!("{v:.1}")),
                        opt(cold16, &|v| format!("{v:.1}")),
                        flops / kt / 1e9,
                        graph * 1e6,
                        opt(mlx, &|v| format!("{:.0}", v * 1e6)),
                        opt(mlx, &|v| format!("{:.0}×", v / graph)),
                    );
                }
            }
        }
    }
    other_kernels(&key, no_mlx)?;
    Ok(())
}

/// A table row: one graph node built by `f` on our path and on MLX's, best of 20 and 5.
fn node_row(no_mlx: bool, name: &str, shape: &str, f: &dyn Fn(fast::Fast) -> Array) {
    let ours = time_best(20, || f(fast::on(Path::Kernel)).eval().unwrap());
    let mlx = if no_mlx { f64::NAN } else { time_best(5, || f(fast::on(Path::Mlx)).eval().unwrap()) };
    let m = if mlx.is_nan() { "–".to_string() } else { format!("{:.0}", mlx * 1e6) };
    let r = if mlx.is_nan() { "–".to_string() } else { format!("{:.0}×", mlx / ours) };
    println!("| {name} | {shape} | {:.1} | {m} | {r} |", ours * 1e6);
}

/// `x Wᵀ` for float W (bf16 as a bf16 bundle keeps it, f32) at SmolLM2-135M's
/// shapes, one graph node against MLX's matmul (the weights promoted to f32),
/// for a decode step (M = 1) and a 512-token prefill (without lm_head there:
/// MLX's f32 GEMM takes ~30 s for it).
fn float_products(key: &random::Key, no_mlx: bool) -> Result<(), mlxcel_mlx::Error> {
    fast::set_threads(0);
    println!("\n## Float weights, {} thread(s), one graph node each (best of 20)\n", fast::threads());
    println!("| operation | shape | mlxcel µs | MLX µs | vs MLX |");
    println!("|---|---|---|---|---|");
    for s in SHAPES.iter().filter(|s| s.model == "SmolLM2-135M") {
        for dtype in [Dtype::BF16, Dtype::F32] {
            let w = random::normal(&[s.n, s.k], Dtype::F32, 0.0, 0.1, key)?.astype(dtype)?;
            w.eval()?;
            let linear = Linear { weight: Weight::Dense(w), bias: None };
            for m in [1, 512] {
                if m == 512 && s.n > 40000 {
                    continue;
                }
                let x = random::normal(&[1, m, s.k], Dtype::F32, 0.0, 1.0, key)?;
                x.eval()?;
                let name = format!("linear {} {dtype:?}", s.name);
                node_row(no_mlx, &name, &format!("{}×{}, M = {m}", s.n, s.k), &|f| f.linear(&x, &linear).unwrap());
            }
        }
    }
    Ok(())
}

/// One graph node of each of the other kernels against MLX's op, at
/// SmolLM2-135M shapes (9 heads, 3 KV heads, head dim 64, hidden 576, MLP 1536).
fn other_kernels(key: &random::Key, no_mlx: bool) -> Result<(), mlxcel_mlx::Error> {
    fast::set_threads(0);
    println!("\n## Other kernels, {} thread(s), one graph node each (best of 20)\n", fast::threads());
    println!("| operation | shape | mlxcel µs | MLX µs | vs MLX |");
    println!("|---|---|---|---|---|");
    let rand = |shape: &[i32]| -> Result<Array, mlxcel_mlx::Error> {
        let a = random::normal(shape, Dtype::F32, 0.0, 1.0, key)?;
        a.eval()?;
        Ok(a)
    };
    let row = |name: &str, shape: &str, f: &dyn Fn(fast::Fast) -> Array| node_row(no_mlx, name, shape, f);
    let w = rand(&[576])?;
    for l in [1, 512] {
        let x = rand(&[1, l, 576])?;
        row("rms_norm", &format!("[1, {l}, 576]"), &|f| f.rms_norm(&x, Some(&w), 1e-5).unwrap());
        let q = rand(&[1, 9, l, 64])?;
        row("rope", &format!("[1, 9, {l}, 64], offset 100"), &|f| f.rope(&q, 64, false, 1e5, 1.0, 100, None).unwrap());
        let (g, u) = (rand(&[1, l, 1536])?, rand(&[1, l, 1536])?);
        row("silu(a)·b", &format!("[1, {l}, 1536]"), &|f| f.gated_activation(GateActivation::Silu, &g, &u).unwrap());
        row("gelu_tanh(a)·b", &format!("[1, {l}, 1536]"), &|f| {
            f.gated_activation(GateActivation::GeluApprox, &g, &u).unwrap()
        });
    }
    for (lq, lk) in [(1, 128), (1, 512), (1, 2048), (512, 512)] {
        let q = rand(&[1, 9, lq, 64])?;
        let (k, v) = (rand(&[1, 3, lk, 64])?, rand(&[1, 3, lk, 64])?);
        let mask = if lq > 1 { AttentionMask::Causal } else { AttentionMask::None };
        row(
            "attention",
            &format!("q [1, 9, {lq}, 64], kv [1, 3, {lk}, 64]{}", if lq > 1 { ", causal" } else { "" }),
            &|f| f.scaled_dot_product_attention(&q, &k, &v, 0.125, mask).unwrap(),
        );
    }
    Ok(())
}
