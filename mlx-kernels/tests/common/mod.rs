//! Shared test support: seeded random inputs, tolerances and plain-Rust
//! reference implementations the MLX results are checked against.
#![allow(dead_code)]

use std::sync::Once;

use mlxcel_mlx::settings::Settings;
use mlxcel_mlx::{Array, Dtype, device, fast};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Applies the settings of the environment, as the binaries do: the device
/// from MLXCEL_DEVICE (the GPU runs use `MLXCEL_DEVICE=gpu`), MLXCEL_ISA,
/// MLXCEL_THREADS and the rest (README.md).
pub fn init() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        let settings = Settings::from_env(|k| std::env::var(k).ok()).unwrap_or_else(|e| panic!("{e}"));
        let d = settings.apply().unwrap_or_else(|e| panic!("{e}"));
        eprintln!("testing on {d} ({})", d.description());
    });
}

/// A fresh seed per run (reproduce a failure with MLXCEL_TEST_SEED=<seed>).
pub fn rng(test: &str) -> (StdRng, u64) {
    let seed = std::env::var("MLXCEL_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random::<u64>());
    eprintln!("{test}: MLXCEL_TEST_SEED={seed}");
    (StdRng::seed_from_u64(seed), seed)
}

/// `n` values uniform in [lo, hi).
pub fn uniform(rng: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(lo..hi)).collect()
}

/// `n` values of a standard normal (Box–Muller).
pub fn normal(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let u1: f32 = rng.random_range(f32::EPSILON..1.0);
            let u2: f32 = rng.random();
            (-2.0 * u1.ln()).sqrt() * (2.0 * std::f32::consts::PI * u2).cos()
        })
        .collect()
}

/// An f32 host array of `shape`.
pub fn arr(data: &[f32], shape: &[i32]) -> Array {
    Array::from_slice(data, shape).expect("test data matches its shape")
}

/// The array's values as f32 (converting low-precision dtypes in MLX).
pub fn vals(a: &Array) -> Vec<f32> {
    let a = if a.dtype() == Dtype::F32 { a.clone() } else { a.astype(Dtype::F32).expect("astype f32") };
    a.to_vec::<f32>().expect("evaluates")
}

/// Values rounded to `dtype` and back, as MLX sees inputs of that dtype.
pub fn round_to(data: &[f32], dtype: Dtype) -> Vec<f32> {
    match dtype {
        Dtype::BF16 => data.iter().map(|&x| half::bf16::from_f32(x).to_f32()).collect(),
        Dtype::F16 => data.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect(),
        _ => data.to_vec(),
    }
}

/// Elementwise relative tolerance for results computed in `dtype`: a few ulps of
/// the format (bf16 has 8 significant bits, f16 11, f32 24).
pub fn elementwise_tol(dtype: Dtype) -> f32 {
    match dtype {
        Dtype::BF16 => 1.6e-2,
        Dtype::F16 => 2e-3,
        _ => 2e-5,
    }
}

/// Relative RMS tolerance for reductions of length `k` in `dtype` (matmul,
/// attention): rounding of the output dominates for bf16/f16; f32 accumulates
/// error roughly with sqrt(k).
pub fn rms_tol(dtype: Dtype) -> f32 {
    match dtype {
        Dtype::BF16 => 1e-2,
        Dtype::F16 => 2e-3,
        _ => 1e-5,
    }
}

/// [`rms_tol`] for a dense float matmul. MLX's CUDA backend runs f32 GEMMs on
/// TF32 tensor cores (10-bit mantissa, ~5e-4 relative per product; measured
/// 3e-4 RMS on the H200), unless MLX_ENABLE_TF32=0.
pub fn matmul_tol(dtype: Dtype) -> f32 {
    let tf32 = device::default_device() == mlxcel_mlx::Device::Gpu
        && std::env::var("MLX_ENABLE_TF32").map_or(true, |v| v != "0");
    if dtype == Dtype::F32 && tf32 { 1e-3 } else { rms_tol(dtype) }
}

/// Asserts every `got[i]` is within `atol + rtol * |want[i]|`.
#[track_caller]
pub fn assert_close(what: &str, got: &[f32], want: &[f32], rtol: f32, atol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = (g - w).abs() <= atol + rtol * w.abs() || (g.is_nan() && w.is_nan()) || g == w;
        assert!(ok, "{what}: element {i}: got {g}, want {w} (rtol {rtol}, atol {atol})");
    }
}

/// Relative RMS error ||got - want|| / ||want||.
pub fn rel_rms(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "length");
    let num: f64 = got.iter().zip(want).map(|(&g, &w)| f64::from(g - w).powi(2)).sum();
    let den: f64 = want.iter().map(|&w| f64::from(w).powi(2)).sum();
    (num / den.max(1e-30)).sqrt() as f32
}

/// Asserts the relative RMS error is at most `tol`.
#[track_caller]
pub fn assert_rms(what: &str, got: &[f32], want: &[f32], tol: f32) {
    let e = rel_rms(got, want);
    assert!(e <= tol, "{what}: relative RMS error {e:e} > {tol:e}");
}

/// Row-major `[m, k] @ [k, n]` in f64.
pub fn ref_matmul(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut out = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0f64;
            for p in 0..k {
                acc += f64::from(a[i * k + p]) * f64::from(b[p * n + j]);
            }
            out[i * n + j] = acc as f32;
        }
    }
    out
}

/// Softmax of each row of length `n`.
pub fn ref_softmax(x: &[f32], n: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(n) {
        let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let exps: Vec<f64> = row.iter().map(|&v| f64::from(v - max).exp()).collect();
        let sum: f64 = exps.iter().sum();
        out.extend(exps.iter().map(|&e| (e / sum) as f32));
    }
    out
}

/// Transposes a row-major `[rows, cols]` matrix.
pub fn ref_transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = x[r * cols + c];
        }
    }
    out
}

/// Row `r` of x along its first axis (one sequence of a batch), contiguous and evaluated.
pub fn batch_row(x: &Array, r: i32) -> Array {
    let mut stop = x.shape();
    let mut start = vec![0; stop.len()];
    start[0] = r;
    stop[0] = r + 1;
    let row = x.slice(&start, &stop, &vec![1; stop.len()]).unwrap().contiguous().unwrap();
    row.eval().unwrap();
    row
}

/// Half an f32 ulp (2⁻²⁴): the unit of the kernels' tolerances.
pub const EPS: f32 = 1.0 / (1u32 << 24) as f32;

/// The ISA and thread count are process-wide: tests that set them run one
/// at a time, holding this lock.
static KERNEL_CONFIG: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Holds the ISA and thread settings for the caller until dropped.
pub fn config_lock() -> std::sync::MutexGuard<'static, ()> {
    KERNEL_CONFIG.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `body` for every ISA this CPU supports, with 1 and 2 threads (and,
/// where the CPU has AMX tiles, the avx512vnni build with and without them),
/// then restores the defaults; returns the number of configurations run.
pub fn each_config(mut body: impl FnMut(&str)) -> usize {
    let _guard = config_lock();
    let mut n = 0;
    for isa in fast::Isa::ALL.into_iter().filter(|i| i.is_supported()) {
        fast::set_isa(isa).unwrap();
        let amx: &[bool] =
            if isa == fast::Isa::Avx512Vnni && fast::amx_supported() { &[false, true] } else { &[false] };
        for &tiles in amx {
            fast::set_amx(tiles);
            for threads in [1, 2] {
                fast::set_threads(threads);
                assert_eq!(fast::threads(), threads);
                body(&format!("{isa}{} x{threads}", if tiles { "+amx" } else { "" }));
                n += 1;
            }
        }
    }
    fast::set_amx(true);
    fast::set_threads(0);
    fast::set_isa(fast::Isa::best()).unwrap();
    n
}

/// Runs `body` with 1 and 2 kernel threads (the ISA left as it is), then
/// restores the default thread count.
pub fn each_thread_count(mut body: impl FnMut(usize)) {
    let _guard = config_lock();
    for threads in [1, 2] {
        fast::set_threads(threads);
        body(threads);
    }
    fast::set_threads(0);
}

/// An f32 `[rows, cols]` matrix of standard normal values quantized by MLX
/// (affine, f32 scales and biases).
pub fn quantized(rng: &mut StdRng, rows: usize, cols: usize, group: i32, bits: i32) -> mlxcel_mlx::Quantized {
    let w = normal(rng, rows * cols);
    arr(&w, &[rows as i32, cols as i32]).quantize(group, bits, mlxcel_mlx::QuantMode::Affine).unwrap()
}

/// mlxcel's kernels, uncovered inputs an error.
pub fn kernel() -> fast::Fast {
    fast::on(fast::Path::Kernel)
}

/// MLX's own ops.
pub fn mlx() -> fast::Fast {
    fast::on(fast::Path::Mlx)
}

/// `b` pairs of random key and value cache buffers `[1, kvh, C, dim]`, the
/// capacity C of row r being `capacity + 7 r` (rows of different sizes).
pub fn cache_buffers(rng: &mut StdRng, b: i32, kvh: i32, capacity: i32, dim: i32) -> Vec<(Array, Array)> {
    (0..b)
        .map(|row| {
            let c = capacity + 7 * row;
            let mut buf = || arr(&normal(rng, (kvh * c * dim) as usize), &[1, kvh, c, dim]);
            (buf(), buf())
        })
        .collect()
}

/// One cache row per buffer pair, all at `slot` with `visible` positions,
/// row r's queries starting at position `40 + slot + 3 r`.
pub fn cache_rows(bufs: &[(Array, Array)], slot: usize, visible: usize, causal: bool) -> Vec<fast::CacheRow<'_>> {
    bufs.iter()
        .enumerate()
        .map(|(row, (keys, values))| fast::CacheRow {
            offset: 40 + slot + 3 * row,
            cache: fast::CacheSlot { keys, values, slot, visible, causal },
        })
        .collect()
}

/// RoPE over `dims` features with base 10000, or the wavelengths `freqs`.
pub fn rope_spec(dims: i32, traditional: bool, freqs: Option<&Array>) -> fast::RopeSpec<'_> {
    fast::RopeSpec { dims, traditional, base: 10000.0, scale: 1.0, freqs }
}
