//! Quantized weights in the `rows16` layout (`WeightLayout::Rows16`: every
//! block of 16 rows transposed, the bundle's layout for 4- and 8-bit
//! matrices) through the graph nodes: products, fused q/k/v, gated
//! projections and the embedding gather.
//!
//! Reference: the same weights in MLX's row-major layout through MLX's own
//! ops. Each output is a sum of K products in another order: within
//! `8·sqrt(K)·ε·Σ|terms|` (as in kernels.rs), checked here as a relative RMS
//! of 1e-5 over whole outputs (sums of K ≤ 640 terms of f32 products; a
//! misplaced code or scale is off by orders of magnitude). The kernel's own
//! bits (one fused multiply-add per k, the same on every float ISA, for any
//! batch size) are checked exactly by `cpp/tests/isa_check.cc`; here a decode
//! batch is checked row by row against each row alone, bit for bit.
//!
//! The avx512vnni and avx2i16 builds round x to int16 steps, one per group
//! of each row (`rows16_i16_impl.h`, `rows16_i16_avx2_impl.h`): each element moves by up to dx/2, dx = max|x| /
//! 32767 over the group, an RMS of dx/√12 ≈ 2.2e-5·σ for normal x in groups
//! of 32 (max ≈ 2.5σ). The step enters through s·q, whose RMS (q uniform in
//! 0..15) is about twice that of w = s·q + b, so outputs move by ~5e-5
//! relative RMS; the bound there is 2e-4 (a misplaced code is still orders
//! of magnitude off).

mod common;

use common::*;
use mlxcel_mlx::fast::{self, GateActivation, Path};
use mlxcel_mlx::{Array, Dtype, QuantMode, Quantized, WeightLayout};
use rand::rngs::StdRng;

/// An f32 `[rows, cols]` matrix quantized by MLX, scales and biases as `dtype`.
fn quantized(rng: &mut StdRng, rows: usize, cols: usize, group: i32, bits: i32, dtype: Dtype) -> Quantized {
    let w = normal(rng, rows * cols);
    let q = arr(&w, &[rows as i32, cols as i32]).quantize(group, bits, QuantMode::Affine).unwrap();
    let narrow = |a: &Array| a.astype(dtype).unwrap();
    Quantized { scales: narrow(&q.scales), biases: q.biases.as_ref().map(narrow), ..q }
}

/// `a` (rows of `cols` elements of `elem` bytes) in the rows16 layout.
fn blocks(a: &Array, cols: usize, elem: usize) -> Array {
    let bytes = mlxcel_bundle::rows16::from_row_major(&a.to_bytes().unwrap(), cols, elem).unwrap();
    Array::from_bytes(&bytes, &a.shape(), a.dtype()).unwrap()
}

/// The same matrix in the rows16 layout (codes rearranged as bytes, scales
/// and biases as elements).
fn rows16(q: &Quantized) -> Quantized {
    let row_bytes = q.weight.shape()[1] as usize * 4;
    let groups = q.scales.shape()[1] as usize;
    Quantized {
        weight: blocks(&q.weight, row_bytes, 1),
        scales: blocks(&q.scales, groups, q.scales.dtype().size()),
        biases: q.biases.as_ref().map(|b| blocks(b, groups, b.dtype().size())),
        layout: WeightLayout::Rows16,
        ..q.clone()
    }
}

/// The relative RMS bound of a 4- or 8-bit rows16 product under the ISA now
/// in use: 1e-5 in f32, 2e-4 where x is rounded to int16 steps (above).
fn product_tol() -> f32 {
    if fast::isa().rounds_rows16_activations() { 2e-4 } else { 1e-5 }
}

#[test]
fn products_match_mlx_on_the_row_major_weights() {
    init();
    let (mut rng, _) = rng("rows16_products");
    for (bits, group, dtype) in [(4, 32, Dtype::F16), (4, 64, Dtype::F32), (8, 32, Dtype::BF16), (8, 128, Dtype::F16)] {
        let (n, k) = (48usize, 384usize);
        let q = quantized(&mut rng, n, k, group, bits, dtype);
        let r = rows16(&q);
        for m in [1usize, 3, 16, 70] {
            let x = normal(&mut rng, m * k);
            let xa = arr(&x, &[m as i32, k as i32]);
            let want = vals(&mlx().quantized_linear(&xa, &q).unwrap());
            each_config(|cfg| {
                let got = vals(&kernel().quantized_linear(&xa, &r).unwrap());
                assert_rms(&format!("{cfg} bits={bits} g={group} {dtype:?} M={m}"), &got, &want, product_tol());
            });
        }
    }
}

#[test]
fn fused_and_gated_products_and_the_gather_match_mlx() {
    init();
    let (mut rng, _) = rng("rows16_fused");
    let (k, heads) = (256usize, 4);
    let wq = quantized(&mut rng, 128, k, 64, 4, Dtype::F16);
    let wk = quantized(&mut rng, 64, k, 64, 4, Dtype::F16);
    let gate = quantized(&mut rng, 96, k, 64, 8, Dtype::F16);
    let up = quantized(&mut rng, 96, k, 64, 8, Dtype::F16);
    let (rq, rk, rg, ru) = (rows16(&wq), rows16(&wk), rows16(&gate), rows16(&up));
    let x = normal(&mut rng, 2 * 5 * k);
    let xa = arr(&x, &[2, 5, k as i32]);
    let want_heads = mlx().quantized_linear_heads(&xa, &[(&wq, heads), (&wk, 0)]).unwrap();
    let want_gated = mlx().quantized_gated_linear(&xa, &gate, &up, GateActivation::Silu).unwrap();
    let ids = Array::from_slice(&[0i32, 127, 5, 5], &[4]).unwrap();
    // MLX dequantizes in the scales' dtype; ours in f32: the reference widens them.
    let widen = |a: &Array| a.astype(Dtype::F32).unwrap();
    let wq32 = Quantized { scales: widen(&wq.scales), biases: wq.biases.as_ref().map(widen), ..wq.clone() };
    let want_rows = mlx().quantized_embedding_scaled(&ids, &wq32, 2.0).unwrap();
    each_config(|cfg| {
        let got = kernel().quantized_linear_heads(&xa, &[(&rq, heads), (&rk, 0)]).unwrap();
        for (i, (g, w)) in got.iter().zip(&want_heads).enumerate() {
            assert_eq!(g.shape(), w.shape(), "{cfg}: output {i} shape");
            assert_rms(&format!("{cfg}: heads output {i}"), &vals(g), &vals(w), product_tol());
        }
        let got = kernel().quantized_gated_linear(&xa, &rg, &ru, GateActivation::Silu).unwrap();
        assert_rms(&format!("{cfg}: gated"), &vals(&got), &vals(&want_gated), product_tol());
        // Dequantization is one fused multiply-add where MLX rounds twice.
        let got = kernel().quantized_embedding_scaled(&ids, &rq, 2.0).unwrap();
        assert_rms(&format!("{cfg}: gather"), &vals(&got), &vals(&want_rows), 1e-6);
    });
    // A rows16 and a row-major weight against one x: one node per layout
    // (under the lock: other tests switch the ISA).
    let _guard = config_lock();
    let got = kernel().quantized_linear_heads(&xa, &[(&rq, 0), (&wk, 0)]).unwrap();
    let want = mlx().quantized_linear_many(&xa, &[&wq, &wk]).unwrap();
    for (g, w) in got.iter().zip(&want) {
        assert_rms("mixed layouts", &vals(g), &vals(w), product_tol());
    }
}

#[test]
fn a_decode_batch_gives_each_row_its_bits_alone() {
    init();
    let (mut rng, _) = rng("rows16_batch_invariance");
    let k = 192usize;
    let r = rows16(&quantized(&mut rng, 64, k, 32, 4, Dtype::F16));
    for b in [2usize, 5, 16, 17] {
        let x = normal(&mut rng, b * k);
        let xa = arr(&x, &[b as i32, 1, k as i32]);
        each_config(|cfg| {
            let batch = vals(&kernel().quantized_linear(&xa, &r).unwrap());
            for row in 0..b {
                let alone = vals(&kernel().quantized_linear(&batch_row(&xa, row as i32), &r).unwrap());
                assert_eq!(
                    &batch[row * 64..(row + 1) * 64],
                    &alone[..],
                    "{cfg}: row {row} of a batch of {b} differs from the row alone"
                );
            }
        });
    }
}

/// Where the CPU has AMX tiles, the avx512vnni build takes products of 16
/// rows of x and more on them (rows16_amx_impl.h), which must give the int16
/// kernel's bits exactly: the same int32 sums, the same epilogue. Outliers
/// in every third row make their groups take the residual pass. Elsewhere
/// there is nothing to compare (the test says so and passes); the
/// batch-invariance test above compares the two paths too, through
/// each_config's `+amx` configurations.
#[test]
fn amx_tiles_give_the_int16_kernels_bits() {
    init();
    if !fast::amx_supported() {
        eprintln!(
            "amx_tiles_give_the_int16_kernels_bits: no AMX tiles on this CPU (or not granted): nothing to compare"
        );
        return;
    }
    let (mut rng, _) = rng("rows16_amx");
    let _guard = config_lock();
    fast::set_isa(fast::Isa::Avx512Vnni).unwrap();
    for (bits, group, dtype) in [(4, 32, Dtype::F16), (4, 64, Dtype::F32), (8, 32, Dtype::BF16), (8, 128, Dtype::F16)] {
        let (n, k) = (48usize, 384usize);
        let r = rows16(&quantized(&mut rng, n, k, group, bits, dtype));
        for m in [16usize, 17, 64, 70, 130] {
            let mut x = normal(&mut rng, m * k);
            for row in (1..m).step_by(3) {
                x[row * k + 37] *= 100.0;
            }
            let xa = arr(&x, &[m as i32, k as i32]);
            for threads in [1, 2] {
                fast::set_threads(threads);
                fast::set_amx(false);
                let want = vals(&kernel().quantized_linear(&xa, &r).unwrap());
                fast::set_amx(true);
                let got = vals(&kernel().quantized_linear(&xa, &r).unwrap());
                let bits_of = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits_of(&got), bits_of(&want), "bits={bits} g={group} {dtype:?} M={m} x{threads}");
            }
        }
    }
    fast::set_amx(true);
    fast::set_threads(0);
    fast::set_isa(fast::Isa::best()).unwrap();
}

#[test]
fn mlx_ops_refuse_rows16_weights() {
    init();
    let (mut rng, _) = rng("rows16_refused");
    let r = rows16(&quantized(&mut rng, 32, 64, 32, 4, Dtype::F32));
    let x = arr(&normal(&mut rng, 64), &[1, 64]);
    let message = |e: mlxcel_mlx::Error| e.to_string();
    for err in [
        mlx().quantized_linear(&x, &r).map(drop).map_err(message),
        r.dequantize(None).map(drop).map_err(message),
        r.matmul(&x, true).map(drop).map_err(message),
    ] {
        let err = err.expect_err("MLX's ops cannot read rows16");
        assert!(err.contains("rows16"), "the error names the layout: {err}");
    }
    // A rows16 matrix the kernels cannot take (rows not a multiple of 16) is
    // an error on every path, never MLX's op on misread bytes.
    let odd = Quantized { layout: WeightLayout::Rows16, ..quantized(&mut rng, 24, 64, 32, 4, Dtype::F32) };
    for path in [Path::Auto, Path::Kernel] {
        let err = fast::on(path).quantized_linear(&x, &odd).map(drop).expect_err("24 rows are not whole blocks");
        assert!(err.to_string().contains("multiple of 16"), "{err}");
    }
}
