//! mlxcel's CUDA kernels (cuda/kernels.cu) against MLX's own operations on
//! the same GPU: the products against MLX's quantized matmul (every code
//! width, group size and scale type the kernels take, 1 to 32 rows, heads,
//! residuals, the gated activations and RMS norms folded in; batch
//! invariance), the prompt products (more rows) likewise against MLX's on
//! the CPU, our RMS norm against MLX's, and the cached
//! attention step against MLX's RoPE, slice updates and attention (GQA,
//! causal steps, every RoPE variant, donated and shared cache buffers).
//!
//! Runs on a CUDA GPU only (the `cuda` feature, `MLXCEL_DEVICE=gpu`; the
//! recipe is docs/cuda.md): the module is compiled here with NVRTC from
//! `MLXCEL_CUDA_SITE` (the folder holding the `nvidia/cu13` Python
//! packages: `lib/libnvrtc.so.13`, `include/cuda_fp16.h`), as
//! `mlxcel-compile --target cuda-smXY` would, and loaded.
//!
//! Tolerance of the products: both sides accumulate in f32 over K products, in different
//! orders (ours per 32-input segment, then the segments in order; MLX's per thread tile);
//! each order is within K·2⁻²⁴ of the exact sum relative to Σ|terms|, so
//! the two differ by at most ~2·K·6e-8·Σ|x w|. With K ≤ 1024 and
//! standard-normal data that is below 1e-4 of the output's scale; the test
//! allows 2e-4 of the largest |reference|. A folded or separate RMS norm
//! adds a sum of K ≤ 2304 squares in another order on each side (each
//! within K·2⁻²⁴ relative of the exact sum, so the scales differ by
//! ≤ 1.4e-4 relative): the same 2e-4 bound. The attention's: keys rotated
//! with the CPU node's angles (f32 (pos·scale)·inv, cosf/sinf), MLX's CUDA
//! RoPE computes them its own way: angles up to 2^7 rad carry a few ulp
//! (3.8e-6 each at 64) of difference, so |x| ≲ 5 allows 1e-4 absolute;
//! values copied exactly. The attention's reference is MLX's own ops on
//! the CPU (f32 throughout: on the GPU MLX's attention multiplies on TF32
//! tensor cores for several queries or wide heads, ~3e-4 relative a
//! product), and the outputs agree within 2e-4 (the CPU kernel's bound
//! against MLX, attention.rs, is 1e-4 for |v| ≲ 5; the keys' difference
//! moves a score by at most ~1e-5·√D·scale more).
#![cfg(feature = "cuda")]

mod common;

use std::path::PathBuf;
use std::sync::Once;

use common::*;
use mlxcel_mlx::fast::{self, GateActivation, Path};
use mlxcel_mlx::nvrtc::Nvrtc;
use mlxcel_mlx::{Array, Device, Dtype, QuantMode, Quantized, cuda_kernels, device};

/// Compiles and loads the products module once per process.
fn load() {
    static LOAD: Once = Once::new();
    LOAD.call_once(|| {
        init();
        let arch = device::cuda_arch().expect("these tests need a CUDA GPU (MLXCEL_DEVICE=gpu)");
        let site = PathBuf::from(std::env::var_os("MLXCEL_CUDA_SITE").expect("set MLXCEL_CUDA_SITE"));
        let cu13 = site.join("nvidia/cu13");
        let nvrtc = Nvrtc::open(cu13.join("lib/libnvrtc.so.13")).unwrap();
        let compiled = nvrtc.compile(&cuda_kernels::program(&arch, &cu13.join("include"))).unwrap();
        let names: String = compiled.lowered_names.iter().map(|(e, l)| format!("{e}\t{l}\n")).collect();
        let kernels = cuda_kernels::load(&compiled.cubin, &names).unwrap();
        assert_eq!(kernels, cuda_kernels::name_expressions().len());
        assert!(cuda_kernels::loaded());
    });
}

/// A random matrix quantized, evaluated (as a bundle's weights are: the
/// graphs under test then hold only the nodes they build).
fn quantized(rng: &mut rand::rngs::StdRng, n: usize, k: usize, group: i32, bits: i32, scales: Dtype) -> Quantized {
    let w = arr(&normal(rng, n * k), &[n as i32, k as i32]).astype(scales).unwrap();
    let q = w.quantize(group, bits, QuantMode::Affine).unwrap();
    let biases = q.biases.as_ref().expect("affine quantization has biases");
    Array::eval_all(&[&q.weight, &q.scales, biases]).unwrap();
    q
}

/// Largest |a - b| and largest |b|.
fn compare(what: &str, got: &Array, want: &Array) {
    assert_eq!(got.shape(), want.shape(), "{what}");
    let (g, w) = (vals(got), vals(want));
    let scale = w.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let worst = g.iter().zip(&w).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(worst <= 2e-4 * scale.max(1.0), "{what}: largest difference {worst} (reference scale {scale})");
}

/// Runs `f` with the CPU as the default device (MLX's arrays live in
/// unified memory, so the same inputs serve both), then the GPU again.
fn on_cpu<T>(f: impl FnOnce() -> T) -> T {
    device::set_default_device(Device::Cpu).unwrap();
    let out = f();
    device::set_default_device(Device::Gpu).unwrap();
    out
}

fn ops_of(x: &Array) -> Vec<String> {
    fast::pending_ops(&[x])
}

#[test]
fn products_match_mlx_every_width_group_and_scale_type() {
    load();
    let (mut rng, _) = rng("products_match_mlx_every_width_group_and_scale_type");
    for bits in [2, 3, 4, 5, 6, 8] {
        for group in [32, 64, 128] {
            for scales in [Dtype::F32, Dtype::F16, Dtype::BF16] {
                // Eight rows and more take MLX's tiled matmul, which MLX
                // compiles at run time for each form: a few forms only.
                let many = (bits, group) == (4, 32) || (bits, group, scales) == (8, 64, Dtype::F32);
                let rows: &[usize] = if many { &[1, 3, 7, 8, 9, 32] } else { &[1, 3, 7] };
                for &rows in rows {
                    let (n, k) = (96usize, 384usize);
                    let q = quantized(&mut rng, n, k, group, bits, scales);
                    let x = arr(&normal(&mut rng, rows * k), &[rows as i32, 1, k as i32]);
                    let what = format!("bits {bits} group {group} scales {scales:?} rows {rows}");
                    let ours = fast::on(Path::Kernel).quantized_linear(&x, &q).unwrap();
                    assert!(ops_of(&ours).iter().any(|o| o.contains("Mlxcel")), "{what}: {:?}", ops_of(&ours));
                    let mlx = fast::on(Path::Mlx).quantized_linear(&x, &q).unwrap();
                    compare(&what, &ours, &mlx);
                }
            }
        }
    }
}

#[test]
fn heads_residual_and_gates() {
    load();
    let (mut rng, _) = rng("heads_residual_and_gates");
    let (k, batch) = (576usize, 4usize);
    let q = quantized(&mut rng, 576, k, 64, 4, Dtype::BF16);
    let kv = quantized(&mut rng, 192, k, 64, 4, Dtype::BF16);
    let x = arr(&normal(&mut rng, batch * k), &[batch as i32, 1, k as i32]);
    // q, k, v in one node, split into heads.
    let ours = fast::on(Path::Kernel).quantized_linear_heads(&x, &[(&q, 9), (&kv, 3), (&kv, 3)]).unwrap();
    let mlx = fast::on(Path::Mlx).quantized_linear_heads(&x, &[(&q, 9), (&kv, 3), (&kv, 3)]).unwrap();
    for (i, (a, b)) in ours.iter().zip(&mlx).enumerate() {
        compare(&format!("heads output {i}"), a, b);
    }
    // A residual added to a pending product joins it.
    let h = arr(&normal(&mut rng, batch * 576), &[batch as i32, 1, 576]);
    let y = fast::on(Path::Kernel).quantized_linear(&x, &q).unwrap();
    let fused = fast::on(Path::Kernel).add(&h, &y).unwrap();
    assert!(!ops_of(&fused).iter().any(|o| o == "Add"), "{:?}", ops_of(&fused));
    let plain = fast::on(Path::Mlx).quantized_linear(&x, &q).unwrap().add(&h).unwrap();
    compare("residual", &fused, &plain);
    // Gate and up with each activation.
    let gate = quantized(&mut rng, 1536, k, 32, 8, Dtype::F16);
    let up = quantized(&mut rng, 1536, k, 32, 8, Dtype::F16);
    for act in [GateActivation::Silu, GateActivation::GeluApprox] {
        let ours = fast::on(Path::Kernel).quantized_gated_linear(&x, &gate, &up, act).unwrap();
        let mlx = fast::on(Path::Mlx).quantized_gated_linear(&x, &gate, &up, act).unwrap();
        compare(&format!("gated {act:?}"), &ours, &mlx);
    }
}

/// `f` of each row `rows` of x alone (x `[1, 1, k]`) gives the bits the row
/// gets in the batch of x's first `batch` rows (`[batch, 1, k]`).
fn same_bits_alone_and_in_a_batch(
    what: &str,
    x: &[f32],
    k: usize,
    batch: usize,
    rows: &[usize],
    f: impl Fn(&Array) -> Vec<f32>,
) {
    let together = f(&arr(&x[..batch * k], &[batch as i32, 1, k as i32]));
    let n = together.len() / batch;
    for &r in rows {
        let alone = f(&arr(&x[r * k..(r + 1) * k], &[1, 1, k as i32]));
        assert_eq!(alone, together[r * n..(r + 1) * n], "{what} row {r}");
    }
}

#[test]
fn a_row_gets_the_same_bits_alone_and_in_a_batch() {
    load();
    let (mut rng, _) = rng("a_row_gets_the_same_bits_alone_and_in_a_batch");
    let k = 576usize;
    let q = quantized(&mut rng, 1536, k, 32, 4, Dtype::BF16);
    let data = normal(&mut rng, 16 * k);
    let kernel = || fast::on(Path::Kernel);
    // Alone, a thread takes one row of W; in the batch of 16, four.
    same_bits_alone_and_in_a_batch("plain", &data, k, 16, &[0, 7, 8, 15], |x| {
        vals(&kernel().quantized_linear(x, &q).unwrap())
    });
    // The same with an RMS norm folded into the product.
    let norm = arr(&uniform(&mut rng, k, 0.5, 1.5), &[k as i32]);
    same_bits_alone_and_in_a_batch("normed", &data, k, 16, &[0, 7, 8, 15], |x| {
        vals(&kernel().quantized_linear(&kernel().rms_norm(x, Some(&norm), 1e-5).unwrap(), &q).unwrap())
    });
    // The gated MLP: a batch of 16 takes eight rows of x a block, one row two.
    let up = quantized(&mut rng, 1536, k, 32, 4, Dtype::BF16);
    same_bits_alone_and_in_a_batch("gated", &data, k, 16, &[0, 7, 8, 15], |x| {
        vals(&kernel().quantized_gated_linear(x, &q, &up, GateActivation::Silu).unwrap())
    });
    // A vocabulary-sized product takes four rows of W a thread even for one
    // row of x; row 2 of a batch of three is in its second block of x rows.
    let vocab = quantized(&mut rng, 8192, k, 64, 8, Dtype::F16);
    same_bits_alone_and_in_a_batch("vocabulary", &data, k, 3, &[0, 2], |x| {
        vals(&kernel().quantized_linear(x, &vocab).unwrap())
    });
}

#[test]
fn norms_fold_into_products_and_run_alone() {
    load();
    let (mut rng, _) = rng("norms_fold_into_products_and_run_alone");
    let (k, batch) = (576usize, 4usize);
    let kernel = || fast::on(Path::Kernel);
    let mlx = || fast::on(Path::Mlx);
    let x = arr(&normal(&mut rng, batch * k), &[batch as i32, 1, k as i32]);
    let norm = arr(&uniform(&mut rng, k, 0.5, 1.5), &[k as i32]);
    let q = quantized(&mut rng, 576, k, 64, 4, Dtype::BF16);
    let kv = quantized(&mut rng, 192, k, 64, 4, Dtype::BF16);
    for weight in [Some(&norm), None] {
        // The norm before q, k, v joins their node: no norm node is left.
        let ours = kernel().quantized_linear_heads(&kernel().rms_norm(&x, weight, 1e-5).unwrap(), &[(&q, 9), (&kv, 3)]);
        let ours = ours.unwrap();
        assert!(!ops_of(&ours[0]).iter().any(|o| o.contains("RmsNorm")), "{:?}", ops_of(&ours[0]));
        let normed = mlx().rms_norm(&x, weight, 1e-5).unwrap();
        let want = mlx().quantized_linear_heads(&normed, &[(&q, 9), (&kv, 3)]).unwrap();
        for (i, (a, b)) in ours.iter().zip(&want).enumerate() {
            compare(&format!("normed heads output {i} (weight {})", weight.is_some()), a, b);
        }
    }
    // The norm before the gated MLP, and a residual on top of a normed product.
    let gate = quantized(&mut rng, 1536, k, 32, 8, Dtype::F16);
    let up = quantized(&mut rng, 1536, k, 32, 8, Dtype::F16);
    let normed = kernel().rms_norm(&x, Some(&norm), 1e-6).unwrap();
    let ours = kernel().quantized_gated_linear(&normed, &gate, &up, GateActivation::Silu).unwrap();
    assert!(!ops_of(&ours).iter().any(|o| o.contains("RmsNorm")), "{:?}", ops_of(&ours));
    let normed_mlx = mlx().rms_norm(&x, Some(&norm), 1e-6).unwrap();
    compare(
        "normed gated",
        &ours,
        &mlx().quantized_gated_linear(&normed_mlx, &gate, &up, GateActivation::Silu).unwrap(),
    );
    let h = arr(&normal(&mut rng, batch * 576), &[batch as i32, 1, 576]);
    let ours = kernel().add(&h, &kernel().quantized_linear(&normed, &q).unwrap()).unwrap();
    assert!(!ops_of(&ours).iter().any(|o| o == "Add" || o.contains("RmsNorm")), "{:?}", ops_of(&ours));
    compare("normed residual", &ours, &mlx().quantized_linear(&normed_mlx, &q).unwrap().add(&h).unwrap());
    // Norms no product takes run our norm kernel: one row, a batch, a
    // prompt, widths that are and are not multiples of the block, with and
    // without a weight and a residual (Gemma's post-norms).
    for (rows, width) in [(1usize, 576usize), (7, 640), (40, 1000), (3, 2304)] {
        let x = arr(&normal(&mut rng, rows * width), &[1, rows as i32, width as i32]);
        let w = arr(&uniform(&mut rng, width, -1.0, 2.0), &[width as i32]);
        let r = arr(&normal(&mut rng, rows * width), &[1, rows as i32, width as i32]);
        for weight in [Some(&w), None] {
            let what = format!("norm rows {rows} width {width} weight {}", weight.is_some());
            let ours = kernel().rms_norm(&x, weight, 1e-6).unwrap();
            assert!(ops_of(&ours).iter().any(|o| o == "MlxcelRmsNorm"), "{what}: {:?}", ops_of(&ours));
            let want = mlx().rms_norm(&x, weight, 1e-6).unwrap();
            compare(&what, &ours, &want);
            // A residual joins a norm not yet computed.
            let ours = kernel().add(&r, &kernel().rms_norm(&x, weight, 1e-6).unwrap()).unwrap();
            assert!(ops_of(&ours).iter().any(|o| o == "MlxcelRmsNormAdd"), "{what}: {:?}", ops_of(&ours));
            compare(&format!("{what} + residual"), &ours, &want.add(&r).unwrap());
        }
    }
    // A strided view (a prompt's heads split from MLX's matmul output, as
    // Gemma's q/k norms get them) is normed as MLX norms it.
    let heads = arr(&normal(&mut rng, 7 * 4 * 64), &[1, 7, 4, 64]).transpose(&[0, 2, 1, 3]).unwrap();
    let w = arr(&uniform(&mut rng, 64, 0.5, 1.5), &[64]);
    let ours = kernel().rms_norm(&heads, Some(&w), 1e-6).unwrap();
    assert!(ops_of(&ours).iter().any(|o| o == "MlxcelRmsNorm"), "{:?}", ops_of(&ours));
    compare("norm of transposed heads", &ours, &mlx().rms_norm(&heads, Some(&w), 1e-6).unwrap());
}

/// Prompts (more rows of x than a decode step's 32) take the tiled prompt
/// kernels. Their reference is MLX's quantized matmul on the CPU (MLX's
/// CUDA one is compiled at run time for each form, a minute each): every
/// code width, each scale type and group size, rows that fill no tile,
/// both tile shapes (32 rows of x, and 64 once there are enough tiles);
/// heads and a residual, the gated MLP and a vocabulary-sized product with
/// the norm folded in. The same 2e-4 bound as the decode kernels: each
/// output is one f32 sum of K ≤ 576 products in order.
#[test]
fn prompt_products_match_mlx() {
    load();
    let (mut rng, _) = rng("prompt_products_match_mlx");
    let kernel = || fast::on(Path::Kernel);
    let mlx_cpu = |f: &dyn Fn() -> Array| on_cpu(|| vals(&f()));
    let ours_ran = |what: &str, got: &Array| {
        assert!(ops_of(got).iter().any(|o| o.contains("Mlxcel")), "{what}: {:?}", ops_of(got));
    };
    let check = |what: &str, got: &Array, want: Vec<f32>| {
        ours_ran(what, got);
        compare(what, got, &arr(&want, &got.shape()));
    };
    for bits in [2, 3, 4, 5, 6, 8] {
        for (group, scales) in [(32, Dtype::F16), (64, Dtype::BF16), (128, Dtype::F32)] {
            let (n, k) = (200usize, 384usize);
            let q = quantized(&mut rng, n, k, group, bits, scales);
            for rows in [33usize, 100] {
                let x = arr(&normal(&mut rng, rows * k), &[1, rows as i32, k as i32]);
                let what = format!("prompt bits {bits} group {group} scales {scales:?} rows {rows}");
                let ours = kernel().quantized_linear(&x, &q).unwrap();
                check(&what, &ours, mlx_cpu(&|| fast::on(Path::Mlx).quantized_linear(&x, &q).unwrap()));
            }
        }
    }
    let k = 576usize;
    let norm = arr(&uniform(&mut rng, k, 0.5, 1.5), &[k as i32]);
    // q, k, v in one node split into heads, the norm folded in; o with its residual.
    let rows = 100usize;
    let x = arr(&normal(&mut rng, rows * k), &[1, rows as i32, k as i32]);
    let qw = quantized(&mut rng, 576, k, 64, 4, Dtype::BF16);
    let kv = quantized(&mut rng, 192, k, 64, 4, Dtype::BF16);
    let ours =
        kernel().quantized_linear_heads(&kernel().rms_norm(&x, Some(&norm), 1e-5).unwrap(), &[(&qw, 9), (&kv, 3)]);
    let ours = ours.unwrap();
    assert!(!ops_of(&ours[0]).iter().any(|o| o.contains("RmsNorm")), "{:?}", ops_of(&ours[0]));
    // The three outputs are one node: evaluating the first evaluates them
    // all, so whose kernel made them is asked before any is compared.
    for (i, got) in ours.iter().enumerate() {
        ours_ran(&format!("prompt heads output {i}"), got);
    }
    for (i, got) in ours.iter().enumerate() {
        let want = mlx_cpu(&|| {
            let normed = fast::on(Path::Mlx).rms_norm(&x, Some(&norm), 1e-5).unwrap();
            fast::on(Path::Mlx).quantized_linear_heads(&normed, &[(&qw, 9), (&kv, 3)]).unwrap().swap_remove(i)
        });
        compare(&format!("prompt heads output {i}, norm folded"), got, &arr(&want, &got.shape()));
    }
    let h = arr(&normal(&mut rng, rows * k), &[1, rows as i32, k as i32]);
    let ours = kernel().add(&h, &kernel().quantized_linear(&x, &qw).unwrap()).unwrap();
    assert!(!ops_of(&ours).iter().any(|o| o == "Add"), "{:?}", ops_of(&ours));
    check(
        "prompt o + residual",
        &ours,
        mlx_cpu(&|| fast::on(Path::Mlx).quantized_linear(&x, &qw).unwrap().add(&h).unwrap()),
    );
    // The gated MLP of 700 rows (24 x 11 tiles: 64 rows of x a tile), norm folded.
    let rows = 700usize;
    let x = arr(&normal(&mut rng, rows * k), &[1, rows as i32, k as i32]);
    let gate = quantized(&mut rng, 1536, k, 32, 5, Dtype::F16);
    let up = quantized(&mut rng, 1536, k, 32, 5, Dtype::F16);
    for act in [GateActivation::Silu, GateActivation::GeluApprox] {
        let normed = kernel().rms_norm(&x, Some(&norm), 1e-6).unwrap();
        let ours = kernel().quantized_gated_linear(&normed, &gate, &up, act).unwrap();
        let want = mlx_cpu(&|| {
            let normed = fast::on(Path::Mlx).rms_norm(&x, Some(&norm), 1e-6).unwrap();
            fast::on(Path::Mlx).quantized_gated_linear(&normed, &gate, &up, act).unwrap()
        });
        check(&format!("prompt gated {act:?}, norm folded"), &ours, want);
    }
    // A vocabulary-sized product of 200 rows (128 x 4 tiles of 64 rows), norm folded.
    let rows = 200usize;
    let x = arr(&normal(&mut rng, rows * k), &[1, rows as i32, k as i32]);
    let vocab = quantized(&mut rng, 8192, k, 64, 8, Dtype::F16);
    let ours = kernel().quantized_linear(&kernel().rms_norm(&x, Some(&norm), 1e-5).unwrap(), &vocab).unwrap();
    let want = mlx_cpu(&|| {
        let normed = fast::on(Path::Mlx).rms_norm(&x, Some(&norm), 1e-5).unwrap();
        fast::on(Path::Mlx).quantized_linear(&normed, &vocab).unwrap()
    });
    check("prompt vocabulary, norm folded", &ours, want);
}

/// A prompt row's outputs do not depend on the other rows: the first 40
/// rows of x get the same bits alone (tiles of 32 rows of x) as among 700
/// (tiles of 64), plain and gated, the norm folded in.
#[test]
fn a_prompt_row_gets_the_same_bits_whatever_the_rows_beside_it() {
    load();
    let (mut rng, _) = rng("a_prompt_row_gets_the_same_bits_whatever_the_rows_beside_it");
    let k = 576usize;
    let kernel = || fast::on(Path::Kernel);
    let norm = arr(&uniform(&mut rng, k, 0.5, 1.5), &[k as i32]);
    let gate = quantized(&mut rng, 1536, k, 32, 4, Dtype::BF16);
    let up = quantized(&mut rng, 1536, k, 32, 4, Dtype::BF16);
    let data = normal(&mut rng, 700 * k);
    let run = |rows: usize| {
        let x = arr(&data[..rows * k], &[1, rows as i32, k as i32]);
        let normed = kernel().rms_norm(&x, Some(&norm), 1e-5).unwrap();
        let plain = vals(&kernel().quantized_linear(&normed, &gate).unwrap());
        let gated = vals(&kernel().quantized_gated_linear(&normed, &gate, &up, GateActivation::Silu).unwrap());
        (plain, gated)
    };
    let (few, many) = (run(40), run(700));
    assert_eq!(few.0[..], many.0[..few.0.len()], "plain");
    assert_eq!(few.1[..], many.1[..few.1.len()], "gated");
}

#[test]
fn cached_attention_matches_mlx() {
    load();
    let (mut rng, _) = rng("cached_attention_matches_mlx");
    let freqs = arr(&uniform(&mut rng, 16, 1.0, 5000.0), &[16]);
    let kernel = || fast::on(Path::Kernel);
    let mlx = || fast::on(Path::Mlx);
    // (batch, queries, slot, visible, causal)
    let steps =
        [(1i32, 1i32, 20usize, 21usize, false), (3, 1, 5, 33, false), (2, 7, 13, 20, true), (4, 1, 40, 41, true)];
    for (h, kvh) in [(9i32, 3i32), (4, 1)] {
        for dim in [64i32, 256] {
            for (b, l, slot, visible, causal) in steps {
                for (dims, traditional, use_freqs) in [(dim, false, false), (32, true, false), (32, false, true)] {
                    let q = arr(&normal(&mut rng, (b * h * l * dim) as usize), &[b, h, l, dim]);
                    let k = arr(&normal(&mut rng, (b * kvh * l * dim) as usize), &[b, kvh, l, dim]);
                    let v = arr(&normal(&mut rng, (b * kvh * l * dim) as usize), &[b, kvh, l, dim]);
                    let bufs = cache_buffers(&mut rng, b, kvh, 48, dim);
                    let rope = rope_spec(dims, traditional, use_freqs.then_some(&freqs));
                    let rows = cache_rows(&bufs, slot, visible, causal);
                    let scale = 1.0 / (dim as f32).sqrt();
                    let what = format!("b={b} h={h}/{kvh} d={dim} l={l} slot={slot} visible={visible} dims={dims}");
                    let want = on_cpu(|| {
                        let w = mlx().cached_attention(&q, &k, &v, &rope, &rows, scale).unwrap();
                        let all: Vec<&Array> =
                            std::iter::once(&w.out).chain(w.caches.iter().flat_map(|(k, v)| [k, v])).collect();
                        fast::eval(&all).unwrap();
                        w
                    });
                    let got = kernel().cached_attention(&q, &k, &v, &rope, &rows, scale).unwrap();
                    assert!(ops_of(&got.out).iter().any(|o| o == "MlxcelCachedAttention"), "{what}");
                    assert_eq!(got.out.shape(), vec![b, l, h * dim], "{what}");
                    for (row, ((kb, vb), (wk, wv))) in got.caches.iter().zip(&want.caches).enumerate() {
                        assert_close(&format!("{what} row {row} keys"), &vals(kb), &vals(wk), 0.0, 1e-4);
                        assert_eq!(vals(vb), vals(wv), "{what} row {row} values");
                    }
                    assert_close(&format!("{what} out"), &vals(&got.out), &vals(&want.out), 0.0, 2e-4);
                }
            }
        }
    }
}

#[test]
fn attention_rows_get_the_same_bits_alone_and_in_a_batch() {
    load();
    let (mut rng, _) = rng("attention_rows_get_the_same_bits_alone_and_in_a_batch");
    let (h, kvh, d) = (9i32, 3i32, 64i32);
    let rope = fast::RopeSpec { dims: d, traditional: false, base: 10000.0, scale: 1.0, freqs: None };
    let b = 5i32;
    let q = normal(&mut rng, (b * h * d) as usize);
    let k = normal(&mut rng, (b * kvh * d) as usize);
    let v = normal(&mut rng, (b * kvh * d) as usize);
    let caps: Vec<i32> = (0..b).map(|r| 30 + 11 * r).collect();
    let bufs: Vec<(Vec<f32>, Vec<f32>)> = caps
        .iter()
        .map(|&c| (normal(&mut rng, (kvh * c * d) as usize), normal(&mut rng, (kvh * c * d) as usize)))
        .collect();
    let run = |rows: std::ops::Range<i32>| {
        let n = rows.len() as i32;
        let take = |x: &[f32], heads: i32| {
            arr(&x[(rows.start * heads * d) as usize..(rows.end * heads * d) as usize], &[n, heads, 1, d])
        };
        let (q, k, v) = (take(&q, h), take(&k, kvh), take(&v, kvh));
        let arrays: Vec<(Array, Array)> = rows
            .clone()
            .map(|r| {
                let c = caps[r as usize];
                (arr(&bufs[r as usize].0, &[1, kvh, c, d]), arr(&bufs[r as usize].1, &[1, kvh, c, d]))
            })
            .collect();
        let steps: Vec<fast::CacheRow> = arrays
            .iter()
            .zip(rows.clone())
            .map(|((keys, values), r)| {
                let slot = 3 + 4 * r as usize;
                fast::CacheRow {
                    offset: 100 * r as usize + slot,
                    cache: fast::CacheSlot { keys, values, slot, visible: slot + 1, causal: true },
                }
            })
            .collect();
        let got = fast::on(Path::Kernel).cached_attention(&q, &k, &v, &rope, &steps, 0.125).unwrap();
        let out = vals(&got.out);
        let caches: Vec<(Vec<f32>, Vec<f32>)> = got.caches.iter().map(|(kb, vb)| (vals(kb), vals(vb))).collect();
        (out, caches)
    };
    let (all, all_caches) = run(0..b);
    let width = (h * d) as usize;
    for r in 0..b {
        let (alone, caches) = run(r..r + 1);
        assert_eq!(alone, all[r as usize * width..(r as usize + 1) * width], "row {r} output");
        assert_eq!(caches[0], all_caches[r as usize], "row {r} buffers");
    }
}

/// Token embeddings: our GPU row gather gives exactly the CPU kernel's
/// rows (both round s · q, then + b, then · scale), for every code width and
/// scale type, 32-bit ids signed and unsigned (a negative id counts from the
/// end, as MLX's take), with and without an embedding scale.
#[test]
fn row_gather_matches_the_cpu_kernel_exactly() {
    load();
    let (mut rng, _) = rng("row_gather_matches_the_cpu_kernel_exactly");
    let (n, k) = (300usize, 576usize);
    for bits in [2, 3, 4, 5, 6, 8] {
        for scales in [Dtype::F32, Dtype::F16, Dtype::BF16] {
            let q = quantized(&mut rng, n, k, 64, bits, scales);
            for scale in [1.0f32, 3.7] {
                let unsigned = Array::from_slice(&[5u32, 0, 299, 17], &[1, 4]).unwrap();
                let signed = Array::from_slice(&[5i32, -1, 299, 17], &[4, 1]).unwrap();
                for ids in [&unsigned, &signed] {
                    let what = format!("bits {bits} scales {scales:?} scale {scale} ids {:?}", ids.dtype());
                    let ours = fast::on(Path::Kernel).quantized_embedding_scaled(ids, &q, scale).unwrap();
                    assert_eq!(ops_of(&ours), ["MlxcelQuantizedGather"], "{what}");
                    let cpu =
                        on_cpu(|| vals(&fast::on(Path::Kernel).quantized_embedding_scaled(ids, &q, scale).unwrap()));
                    assert_eq!(vals(&ours), cpu, "{what}");
                }
            }
        }
    }
}

/// A step of our nodes only (embedding gather, a product with a folded
/// norm) recorded as a step graph replays to exactly what evaluating the
/// same step node by node gives for new token ids; a step with one of MLX's
/// nodes is refused, naming it.
#[test]
fn recorded_steps_replay_bit_for_bit() {
    load();
    let (mut rng, _) = rng("recorded_steps_replay_bit_for_bit");
    let (vocab, k) = (512usize, 576usize);
    let table = quantized(&mut rng, vocab, k, 32, 8, Dtype::F16);
    let head = quantized(&mut rng, vocab, k, 64, 4, Dtype::BF16);
    let norm = arr(&uniform(&mut rng, k, 0.5, 1.5), &[k as i32]);
    let step = |ids: &Array| {
        let kernel = fast::on(Path::Kernel);
        let h = kernel.quantized_embedding_scaled(ids, &table, 1.0).unwrap();
        kernel.quantized_linear(&kernel.rms_norm(&h, Some(&norm), 1e-5).unwrap(), &head).unwrap()
    };
    let first = Array::from_slice(&[3u32, 400], &[2, 1]).unwrap();
    let logits = step(&first);
    let mut graph = match fast::StepGraph::record(&[&logits], &first, &logits).unwrap() {
        fast::Recorded::Graph(g) => g,
        fast::Recorded::Refused(why) => panic!("refused: {why}"),
        fast::Recorded::NotThisStep => panic!("not recorded"),
    };
    for tokens in [[7u32, 8], [511, 0], [3, 400]] {
        let mut replayed = vec![0.0f32; 2 * vocab];
        assert!(graph.replay(&tokens, &[], &mut replayed).unwrap());
        let want = vals(&step(&Array::from_slice(&tokens, &[2, 1]).unwrap()));
        assert_eq!(replayed, want, "tokens {tokens:?}");
    }
    assert!(graph.replay(&[1], &[], &mut vec![0.0; 2 * vocab]).is_err(), "one token for a step of two");

    let ids = Array::from_slice(&[1u32], &[1, 1]).unwrap();
    let with_mlx = fast::on(Path::Mlx).add(&step(&ids), &step(&ids)).unwrap();
    match fast::StepGraph::record(&[&with_mlx], &ids, &with_mlx).unwrap() {
        fast::Recorded::Refused(why) => assert!(why.contains("Add"), "{why}"),
        _ => panic!("a step with MLX's add was recorded"),
    }
    assert_eq!(vals(&with_mlx).len(), vocab, "a refused step is still evaluated");
}
