//! mlxcel's CPU kernels (`mlxcel_mlx::fast`, `Path::Kernel`) against MLX's own
//! operations (`Path::Mlx`) and plain-Rust references, on fresh random inputs
//! of odd sizes, for every ISA this CPU has (scalar, AVX2, AVX-512) and with one
//! and two threads.
//!
//! Tolerances use ε = 2⁻²⁴ (half an f32 ulp). A sum of n products computed
//! in a different order than the reference differs by a random walk of
//! roundings, ~sqrt(n)·ε relative to the sum of the terms' magnitudes; the
//! bounds below allow 8·sqrt(n)·ε of that magnitude (a wrong kernel is off by
//! orders of magnitude more). Where our kernel rounds exactly like MLX's op
//! (RoPE tables, the exp of SiLU), the bound is a few ε of the result.
//!
//! The quantized products, norms, RoPE, gates and the kernel graph's
//! evaluation are here; attention is in attention.rs and the graph fusions
//! in fusion.rs.

mod common;

use common::*;
use mlxcel_mlx::fast::{self, GateActivation, Isa, Path};
use mlxcel_mlx::{Array, AttentionMask, Dtype, QuantMode, Quantized};
use rand::Rng;

/// Whether the kernels now in use take x as int16 steps in a quantized
/// matvec: the avx512vnni build, for 4- and 8-bit weights.
fn int16_activations(bits: i32) -> bool {
    fast::isa() == Isa::Avx512Vnni && matches!(bits, 4 | 8)
}

/// Checks `x @ Wᵀ` from our kernel and from MLX against an f64 reference of
/// the dequantized weights. Each output is a sum of K products, computed by
/// MLX as Σ (s q + b) x and by ours as s Σ q x + b Σ x per group; the bound is
/// 8·sqrt(K)·ε times the magnitudes of the terms of both forms. Where the
/// kernel rounds x to int16 steps (dx = max|x| / 32767 per block of 4 or 2
/// elements, each element within dx/2), s Σ q x moves by at most
/// s·Σ|q|·dx/2 = Σ|w − b|·dx/2 more.
fn check_qlinear(what: &str, q: &Quantized, x: &[f32], m: usize, k: usize, got: &[f32], mlx: &[f32]) {
    let int16_x = int16_activations(q.bits) && m <= 8;
    let n = q.weight.shape()[0] as usize;
    let gs = q.group_size as usize;
    let deq = vals(&q.dequantize(None).unwrap());
    let (scales, biases) = (vals(&q.scales), vals(q.biases.as_ref().unwrap()));
    let groups = k / gs;
    for i in 0..m {
        for j in 0..n {
            let xr = &x[i * k..(i + 1) * k];
            let wr = &deq[j * k..(j + 1) * k];
            let want: f64 = xr.iter().zip(wr).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum();
            let (mut mag, mut steps) = (0f64, 0f64);
            for g in 0..groups {
                let (s, b) = (f64::from(scales[j * groups + g]), f64::from(biases[j * groups + g]));
                let xs = &xr[g * gs..(g + 1) * gs];
                let ws = &wr[g * gs..(g + 1) * gs];
                let qx: f64 = xs.iter().zip(ws).map(|(&a, &w)| (f64::from(a) * (f64::from(w) - b) / s).abs()).sum();
                let sx: f64 = xs.iter().map(|&a| f64::from(a)).sum();
                let wx: f64 = xs.iter().zip(ws).map(|(&a, &w)| (f64::from(a) * f64::from(w)).abs()).sum();
                mag += s.abs() * qx + b.abs() * sx.abs() + wx;
                if int16_x {
                    // One step per block of 4 (4-bit) or 2 (8-bit) elements.
                    let block = if q.bits == 4 { 4 } else { 2 };
                    for (xb, wb) in xs.chunks(block).zip(ws.chunks(block)) {
                        let dx = xb.iter().fold(0f64, |a, &v| a.max(f64::from(v).abs())) / 32767.0;
                        steps += wb.iter().map(|&w| (f64::from(w) - b).abs()).sum::<f64>() * dx * 0.5;
                    }
                }
            }
            let tol = 8.0 * (k as f64).sqrt() * f64::from(EPS) * mag + steps + 1e-30;
            for (who, v) in [("kernel", got[i * n + j]), ("mlx", mlx[i * n + j])] {
                let err = (f64::from(v) - want).abs();
                let tol = if who == "mlx" { tol - steps } else { tol };
                assert!(err <= tol, "{what} {who}: out[{i}, {j}] = {v}, want {want} (error {err:e} > {tol:e})");
            }
        }
    }
}

#[test]
fn quantized_linear_every_bits_group_and_shape() {
    init();
    let (mut rng, _) = rng("quantized_linear_every_bits_group_and_shape");
    // Odd output counts (not multiples of any tile width), decode rows (1..8:
    // the matrix-vector path) and prefill rows (9, 29: the GEMM path, with a
    // partial row tile), K spanning one and several 256-wide panels.
    let mut cases = Vec::new();
    for bits in [2, 3, 4, 5, 6, 8] {
        for group in [32, 64, 128] {
            let k = (group * 3) as usize;
            let n = 37 + rng.random_range(0..30usize);
            let q = quantized(&mut rng, n, k, group, bits);
            for m in [1usize, 2, 5, 8, 9, 29] {
                let x = normal(&mut rng, m * k);
                cases.push((q.clone(), x, m, k));
            }
        }
    }
    // A K over several GEMM panels (257..512 are the second panel).
    let q = quantized(&mut rng, 45, 640, 64, 4);
    let x = normal(&mut rng, 13 * 640);
    cases.push((q, x, 13, 640));
    let mlx_out: Vec<Vec<f32>> = cases
        .iter()
        .map(|(q, x, m, k)| vals(&mlx().quantized_linear(&arr(x, &[*m as i32, *k as i32]), q).unwrap()))
        .collect();
    let runs = each_config(|cfg| {
        for ((q, x, m, k), want) in cases.iter().zip(&mlx_out) {
            let what = format!("{cfg} bits={} group={} m={m} n={} k={k}", q.bits, q.group_size, q.weight.shape()[0]);
            let y = kernel().quantized_linear(&arr(x, &[*m as i32, *k as i32]), q).unwrap();
            assert_eq!(y.shape(), vec![*m as i32, q.weight.shape()[0]], "{what}");
            check_qlinear(&what, q, x, *m, *k, &vals(&y), want);
        }
    });
    assert!(runs >= 2);
}

/// f16 and bf16 scales and biases (a GGUF Q4_0/Q4_1/Q8_0 transcode stores f16
/// ones) are read as they are: the result is that of their f32 values.
#[test]
fn quantized_linear_16_bit_scales() {
    init();
    let (mut rng, _) = rng("quantized_linear_16_bit_scales");
    for dtype in [Dtype::F16, Dtype::BF16] {
        for (bits, group) in [(4, 32), (8, 32), (4, 128)] {
            let (n, k) = (41usize, 384usize);
            let q = quantized(&mut rng, n, k, group, bits);
            let narrow = |a: &Array| a.astype(dtype).unwrap();
            let q16 = Quantized { scales: narrow(&q.scales), biases: q.biases.as_ref().map(narrow), ..q.clone() };
            // The same values in f32: the reference.
            let widen = |a: &Array| a.astype(Dtype::F32).unwrap();
            let q32 = Quantized { scales: widen(&q16.scales), biases: q16.biases.as_ref().map(widen), ..q.clone() };
            for m in [1usize, 4, 21] {
                let x = normal(&mut rng, m * k);
                let xa = arr(&x, &[m as i32, k as i32]);
                let want = vals(&mlx().quantized_linear(&xa, &q32).unwrap());
                each_config(|cfg| {
                    let got = vals(&kernel().quantized_linear(&xa, &q16).unwrap());
                    check_qlinear(
                        &format!("{cfg} {dtype} bits={bits} group={group} m={m}"),
                        &q32,
                        &x,
                        m,
                        k,
                        &got,
                        &want,
                    );
                });
            }
            let ids = Array::from_slice(&[3u32, 0, 40, 3], &[4]).unwrap();
            let want = vals(&mlx().quantized_embedding(&ids, &q32).unwrap());
            each_config(|cfg| {
                assert_eq!(vals(&kernel().quantized_embedding(&ids, &q16).unwrap()), want, "{cfg} {dtype} gather");
            });
        }
    }
}

#[test]
fn quantized_linear_batched_and_strided_inputs() {
    init();
    // The ISA is process-wide: hold it still while checking against it.
    let _guard = config_lock();
    let (mut rng, _) = rng("quantized_linear_batched_and_strided_inputs");
    let (n, k) = (50usize, 192usize);
    let q = quantized(&mut rng, n, k, 64, 4);
    let x = normal(&mut rng, 2 * 3 * k);
    let x3 = arr(&x, &[2, 3, k as i32]);
    // [2, 3, K] and a transposed view [3, 2, K] (rows not evenly strided).
    for (what, xa) in [("batched", x3.clone()), ("transposed", x3.transpose(&[1, 0, 2]).unwrap())] {
        let got = kernel().quantized_linear(&xa, &q).unwrap();
        let want = mlx().quantized_linear(&xa, &q).unwrap();
        assert_eq!(got.shape(), want.shape(), "{what}");
        let xr = vals(&xa.contiguous().unwrap());
        check_qlinear(what, &q, &xr, 6, k, &vals(&got), &vals(&want));
    }
    // Rows of a wider matrix: a strided view with one row stride.
    let wide = arr(&normal(&mut rng, 4 * 2 * k), &[4, 2 * k as i32]);
    let view = wide.slice(&[0, k as i32], &[4, 2 * k as i32], &[1, 1]).unwrap();
    let got = kernel().quantized_linear(&view, &q).unwrap();
    let want = mlx().quantized_linear(&view, &q).unwrap();
    check_qlinear("row-strided", &q, &vals(&view.contiguous().unwrap()), 4, k, &vals(&got), &vals(&want));
}

/// q, k and v in one node, split into heads (attention's layout), for decode
/// (one position: the memory is the plain layout) and prefill shapes.
#[test]
fn fused_projections_into_heads() {
    init();
    let (mut rng, _) = rng("fused_projections_into_heads");
    for (bits, group) in [(4, 32), (8, 64), (4, 128), (5, 32), (6, 64)] {
        let k = 256usize;
        let (heads, kv_heads, d) = (6i32, 2i32, 16i32);
        let wq = quantized(&mut rng, (heads * d) as usize, k, group, bits);
        let wk = quantized(&mut rng, (kv_heads * d) as usize, k, group, bits);
        let wv = quantized(&mut rng, (kv_heads * d) as usize, k, group, bits);
        for (b, l) in [(1i32, 1i32), (2, 1), (1, 5), (2, 13)] {
            let x = normal(&mut rng, (b * l) as usize * k);
            let xa = arr(&x, &[b, l, k as i32]);
            let ws = [(&wq, heads), (&wk, kv_heads), (&wv, 0)];
            let want = mlx().quantized_linear_heads(&xa, &ws).unwrap();
            each_config(|cfg| {
                let got = kernel().quantized_linear_heads(&xa, &ws).unwrap();
                for (i, ((g, w), (q, h))) in got.iter().zip(&want).zip(ws).enumerate() {
                    assert_eq!(g.shape(), w.shape(), "{cfg} output {i}");
                    // Back to [b * l, N] rows to check against the f64 reference.
                    let plain = |t: &Array| {
                        let n = q.weight.shape()[0];
                        let t = if h > 0 { t.transpose(&[0, 2, 1, 3]).unwrap() } else { t.clone() };
                        vals(&t.reshape(&[b * l, n]).unwrap())
                    };
                    let what = format!("{cfg} bits={bits} group={group} b={b} l={l} output {i}");
                    check_qlinear(&what, q, &x, (b * l) as usize, k, &plain(g), &plain(w));
                }
            });
        }
    }
    // Mixed layouts (a Q4_K_M model's 4-bit q and k, 6-bit v): one node per
    // bit width and group size, outputs in the order asked, still split into
    // heads by the kernels (no reshape or transpose of MLX's).
    let k = 256usize;
    let wq = quantized(&mut rng, 96, k, 32, 4);
    let wk = quantized(&mut rng, 32, k, 32, 4);
    let wv = quantized(&mut rng, 32, k, 64, 6);
    for q in [&wq, &wk, &wv] {
        Array::eval_all(&[&q.weight, &q.scales, q.biases.as_ref().unwrap()]).unwrap();
    }
    let x = normal(&mut rng, 3 * k);
    let xa = arr(&x, &[1, 3, k as i32]);
    let ws = [(&wq, 6), (&wv, 2), (&wk, 2)];
    let want = mlx().quantized_linear_heads(&xa, &ws).unwrap();
    each_config(|cfg| {
        let got = kernel().quantized_linear_heads(&xa, &ws).unwrap();
        let outputs: Vec<&Array> = got.iter().collect();
        assert_eq!(fast::pending_ops(&outputs), vec!["MlxcelQuantizedLinearMulti".to_string(); 2], "{cfg}");
        for (i, ((g, w), (q, _))) in got.iter().zip(&want).zip(ws).enumerate() {
            assert_eq!(g.shape(), w.shape(), "{cfg} mixed output {i}");
            let rows =
                |t: &Array| vals(&t.transpose(&[0, 2, 1, 3]).unwrap().reshape(&[3, q.weight.shape()[0]]).unwrap());
            check_qlinear(&format!("{cfg} mixed output {i}"), q, &x, 3, k, &rows(g), &rows(w));
        }
    });
}

/// Batch invariance of the products: for x `[B, 1, K]` (one position per
/// sequence, a decode step), every row of a plain, a residual-adding, a
/// head-split, a gated product (with an absorbed RMS norm) and an embedding
/// gather has exactly the bits of that row alone, for B from 2 (the matvec
/// with several rows) to 17 (beyond the matvec's 8 rows, where a prefill
/// would take the GEMM), on every ISA with 1 and 2 threads, for 4-, 8- and
/// 5-bit weights (the avx512vnni int16 path and the float paths).
#[test]
fn products_are_batch_invariant() {
    init();
    let (mut rng, _) = rng("products_are_batch_invariant");
    let k = 256usize;
    for (bits, group) in [(4, 64), (8, 32), (5, 128)] {
        let (heads, d) = (3i32, 16i32);
        let wq = quantized(&mut rng, (heads * d) as usize, k, group, bits);
        let (wg, wu) = (quantized(&mut rng, 40, k, group, bits), quantized(&mut rng, 40, k, group, bits));
        let table = quantized(&mut rng, 50, k, group, bits);
        let norm = arr(&uniform(&mut rng, k, 0.5, 1.5), &[k as i32]);
        for q in [&wq, &wg, &wu, &table] {
            Array::eval_all(&[&q.weight, &q.scales, q.biases.as_ref().unwrap()]).unwrap();
        }
        for b in [2i32, 3, 8, 9, 17] {
            let x = arr(&normal(&mut rng, b as usize * k), &[b, 1, k as i32]);
            let r = arr(&normal(&mut rng, (b * heads * d) as usize), &[b, 1, heads * d]);
            let ids: Vec<u32> = (0..b).map(|_| rng.random_range(0..50)).collect();
            let ids = Array::from_slice(&ids, &[b, 1]).unwrap();
            Array::eval_all(&[&x, &r, &norm, &ids]).unwrap();
            // Each product of one x, in one evaluation.
            let products = |x: &Array, r: &Array, ids: &Array| -> Vec<Vec<f32>> {
                let f = kernel();
                let plain = f.quantized_linear(x, &wq).unwrap();
                let residual = f.add(&f.quantized_linear(x, &wq).unwrap(), r).unwrap();
                let split = f.quantized_linear_heads(x, &[(&wq, heads)]).unwrap().remove(0);
                let normed = f.rms_norm(x, Some(&norm), 1e-5).unwrap();
                let gated = f.quantized_gated_linear(&normed, &wg, &wu, GateActivation::Silu).unwrap();
                let rows = f.quantized_embedding(ids, &table).unwrap();
                let all = [&plain, &residual, &split, &gated, &rows];
                assert_eq!(
                    fast::pending_ops(&all).len(),
                    5,
                    "one node each (residual and norm fused): {:?}",
                    fast::pending_ops(&all)
                );
                fast::eval(&all).unwrap();
                all.iter().map(|a| vals(a)).collect()
            };
            each_config(|cfg| {
                let batch = products(&x, &r, &ids);
                for row in 0..b {
                    let alone = products(&batch_row(&x, row), &batch_row(&r, row), &batch_row(&ids, row));
                    for (i, (all, one)) in batch.iter().zip(&alone).enumerate() {
                        let n = one.len();
                        let got = &all[row as usize * n..(row as usize + 1) * n];
                        assert_eq!(got, &one[..], "{cfg} bits={bits} group={group} b={b}: product {i}, row {row}");
                    }
                }
            });
        }
    }
}

/// act(x Gᵀ) * (x Uᵀ) in one node against the same from MLX's ops. Both
/// products carry the error of check_qlinear (≲ 8·sqrt(K)·ε of their terms);
/// silu and gelu have slopes ≤ 1.13, so the relative RMS of the result stays
/// within 1e-5 for K = 320. With int16 activations (avx512vnni, 4/8-bit) each
/// product also carries its int16 steps: ~Σ|w − b|·dx/2 against |Σ w x|,
/// at most ~5e-5 relative RMS for normal x and K = 320; the bound is 3e-4.
#[test]
fn fused_gated_projection() {
    init();
    let (mut rng, _) = rng("fused_gated_projection");
    for (bits, group) in [(4, 32), (8, 64), (4, 64), (3, 32), (5, 64)] {
        let (n, k) = (75usize, 320usize);
        let (wg, wu) = (quantized(&mut rng, n, k, group, bits), quantized(&mut rng, n, k, group, bits));
        for m in [1i32, 3, 17] {
            let x = arr(&normal(&mut rng, m as usize * k), &[1, m, k as i32]);
            for act in [GateActivation::Silu, GateActivation::GeluApprox] {
                let want = vals(&mlx().quantized_gated_linear(&x, &wg, &wu, act).unwrap());
                each_config(|cfg| {
                    let got = kernel().quantized_gated_linear(&x, &wg, &wu, act).unwrap();
                    assert_eq!(got.shape(), vec![1, m, n as i32]);
                    let tol = if int16_activations(bits) { 3e-4 } else { 1e-5 };
                    assert_rms(&format!("{cfg} bits={bits} group={group} m={m} {act:?}"), &vals(&got), &want, tol);
                });
            }
        }
    }
    // Different bit widths cannot fuse: the kernel path says so, Auto falls back.
    let (a, b) = (quantized(&mut rng, 16, 64, 32, 4), quantized(&mut rng, 16, 64, 32, 8));
    let x = arr(&normal(&mut rng, 64), &[1, 64]);
    assert!(kernel().quantized_gated_linear(&x, &a, &b, GateActivation::Silu).is_err());
    assert!(fast::on(Path::Auto).quantized_gated_linear(&x, &a, &b, GateActivation::Silu).is_ok());
}

#[test]
fn quantized_embedding_matches_mlx_dequantize() {
    init();
    let (mut rng, _) = rng("quantized_embedding_matches_mlx_dequantize");
    for bits in [2, 3, 4, 5, 6, 8] {
        for group in [32, 64, 128] {
            let (vocab, dim) = (53usize, (group * 5) as usize);
            let q = quantized(&mut rng, vocab, dim, group, bits);
            let ids: Vec<u32> = (0..11).map(|_| rng.random_range(0..vocab as u32)).collect();
            let ids = Array::from_slice(&ids, &[1, 11]).unwrap();
            let want = vals(&mlx().quantized_embedding(&ids, &q).unwrap());
            each_config(|cfg| {
                let got = kernel().quantized_embedding(&ids, &q).unwrap();
                assert_eq!(got.shape(), vec![1, 11, dim as i32]);
                // Both compute scale * q + bias with the same two roundings.
                assert_eq!(vals(&got), want, "{cfg} bits={bits} group={group}");
                // Scaled (Gemma's sqrt(hidden)): the same bits as multiplying
                // the rows afterwards, in one node.
                let scaled = kernel().quantized_embedding_scaled(&ids, &q, 25.25).unwrap();
                assert_eq!(fast::pending_ops(&[&scaled]), vec!["MlxcelQuantizedGather".to_string()]);
                let want_scaled = vals(&arr(&want, &[1, 11, dim as i32]).multiply_scalar(25.25).unwrap());
                assert_eq!(vals(&scaled), want_scaled, "{cfg} bits={bits} group={group} scaled");
            });
        }
    }
}

#[test]
fn rms_norm_matches_mlx() {
    init();
    let (mut rng, _) = rng("rms_norm_matches_mlx");
    for dim in [1usize, 7, 64, 577] {
        let rows = 13usize;
        let x = arr(&normal(&mut rng, rows * dim), &[1, rows as i32, dim as i32]);
        let w = arr(&uniform(&mut rng, dim, 0.5, 1.5), &[dim as i32]);
        let strided = arr(&normal(&mut rng, rows * dim), &[rows as i32, 1, dim as i32]).transpose(&[1, 0, 2]).unwrap();
        for (what, xa) in [("contiguous", &x), ("transposed", &strided)] {
            for weight in [Some(&w), None] {
                let want = vals(&mlx().rms_norm(xa, weight, 1e-5).unwrap());
                each_config(|cfg| {
                    let got = vals(&kernel().rms_norm(xa, weight, 1e-5).unwrap());
                    // The mean square is summed in another order: its relative
                    // error is ~sqrt(D)·ε, halved by the square root.
                    let rtol = (8.0 * (dim as f32).sqrt() + 4.0) * EPS;
                    assert_close(&format!("{cfg} {what} dim={dim}"), &got, &want, rtol, 0.0);
                });
            }
        }
    }
}

#[test]
fn rope_matches_mlx_every_variant() {
    init();
    let (mut rng, _) = rng("rope_matches_mlx_every_variant");
    let (b, h, l, d) = (2i32, 3i32, 11i32, 70i32);
    // [B, L, H, D] viewed as [B, H, L, D]: what attention passes in.
    let x = arr(&normal(&mut rng, (b * h * l * d) as usize), &[b, l, h, d]).transpose(&[0, 2, 1, 3]).unwrap();
    let x3 = arr(&normal(&mut rng, (h * l * d) as usize), &[h, l, d]);
    let freqs = arr(&uniform(&mut rng, 16, 1.0, 5000.0), &[16]);
    for dims in [d, 32] {
        for traditional in [false, true] {
            for (offset, scale) in [(0, 1.0f32), (13, 1.0), (4091, 0.25)] {
                for use_freqs in [false, true] {
                    if use_freqs && dims != 32 {
                        continue;
                    }
                    let fr = use_freqs.then_some(&freqs);
                    for (what, xa) in [("4d-strided", &x), ("3d", &x3)] {
                        let want = vals(&mlx().rope(xa, dims, traditional, 10000.0, scale, offset, fr).unwrap());
                        each_config(|cfg| {
                            let got = vals(&kernel().rope(xa, dims, traditional, 10000.0, scale, offset, fr).unwrap());
                            // Same cos/sin (MLX's own formulas) and the same
                            // rounding of each product: at most an ulp or two apart.
                            assert_close(
                                &format!("{cfg} {what} dims={dims} trad={traditional} off={offset} freqs={use_freqs}"),
                                &got,
                                &want,
                                4.0 * EPS,
                                1e-6,
                            );
                        });
                    }
                }
            }
        }
    }
}

#[test]
fn gated_activations_match_mlx() {
    init();
    let (mut rng, _) = rng("gated_activations_match_mlx");
    let (rows, cols) = (5i32, 333i32);
    let a = arr(&uniform(&mut rng, (rows * 2 * cols) as usize, -12.0, 12.0), &[rows, 2 * cols]);
    let b = arr(&normal(&mut rng, (rows * cols) as usize), &[1, rows, cols]);
    // The two halves of a fused gate/up projection: row-strided views.
    let halves = a.split(2, -1).unwrap();
    let (gate, up) = (halves[0].expand_dims(&[0]).unwrap(), halves[1].expand_dims(&[0]).unwrap());
    for act in [GateActivation::Silu, GateActivation::GeluApprox] {
        for (what, x, y) in
            [("contiguous", gate.contiguous().unwrap(), b.clone()), ("strided", gate.clone(), up.clone())]
        {
            let want = vals(&mlx().gated_activation(act, &x, &y).unwrap());
            let (xv, yv) = (vals(&x.contiguous().unwrap()), vals(&y.contiguous().unwrap()));
            each_config(|cfg| {
                let got = vals(&kernel().gated_activation(act, &x, &y).unwrap());
                for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    // SiLU: the same exp and sigmoid as MLX, a few roundings.
                    // GELU: our tanh (from exp) and MLX's (libm) differ by a
                    // few ε absolute, scaled by |x|/2 and |b|.
                    let tol = match act {
                        GateActivation::Silu => 8.0 * EPS * w.abs() + 1e-30,
                        GateActivation::GeluApprox => 8.0 * EPS * (w.abs() + (xv[i].abs() + 1.0) * yv[i].abs()),
                    };
                    assert!((g - w).abs() <= tol, "{cfg} {act:?} {what}: element {i}: got {g}, want {w}");
                }
            });
        }
    }
}

/// Kernels reading other kernels' outputs within one evaluation (each runs as
/// a task after its inputs' tasks).
#[test]
fn chained_kernels_in_one_graph() {
    init();
    let (mut rng, _) = rng("chained_kernels_in_one_graph");
    let (dim, hidden, heads, hd, l) = (128i32, 256i32, 4i32, 32i32, 9i32);
    let wq = quantized(&mut rng, (heads * hd) as usize, dim as usize, 32, 4);
    let wg = quantized(&mut rng, hidden as usize, dim as usize, 64, 8);
    let wu = quantized(&mut rng, hidden as usize, dim as usize, 64, 8);
    let wd = quantized(&mut rng, dim as usize, hidden as usize, 128, 4);
    let norm = arr(&uniform(&mut rng, dim as usize, 0.5, 1.5), &[dim]);
    let x = arr(&normal(&mut rng, (l * dim) as usize), &[1, l, dim]);
    let run = |f: fast::Fast| -> Vec<f32> {
        let h = f.rms_norm(&x, Some(&norm), 1e-6).unwrap();
        let q =
            f.quantized_linear(&h, &wq).unwrap().reshape(&[1, l, heads, hd]).unwrap().transpose(&[0, 2, 1, 3]).unwrap();
        let q = f.rope(&q, hd, false, 10000.0, 1.0, 3, None).unwrap();
        let a = f.scaled_dot_product_attention(&q, &q, &q, 0.2, AttentionMask::Causal).unwrap();
        let a = a.transpose(&[0, 2, 1, 3]).unwrap().reshape(&[1, l, dim]).unwrap();
        let g = f
            .gated_activation(
                GateActivation::Silu,
                &f.quantized_linear(&a, &wg).unwrap(),
                &f.quantized_linear(&a, &wu).unwrap(),
            )
            .unwrap();
        vals(&f.quantized_linear(&g, &wd).unwrap().add(&x).unwrap())
    };
    let want = run(mlx());
    each_config(|cfg| {
        // Six dependent reductions in a row: relative RMS well within 1e-5.
        assert_rms(cfg, &run(kernel()), &want, 1e-5);
    });
}

#[test]
fn unsupported_inputs_are_errors_or_fall_back() {
    init();
    let mut rng = rng("unsupported_inputs_are_errors_or_fall_back").0;
    let q = quantized(&mut rng, 16, 64, 32, 4);
    let x = arr(&normal(&mut rng, 64), &[1, 64]);
    let x16 = x.astype(Dtype::F16).unwrap();
    let err = kernel().quantized_linear(&x16, &q).unwrap_err().to_string();
    assert!(err.contains("activations must be float32"), "{err}");
    // Auto takes MLX's op for what the kernel does not cover.
    let y = fast::on(Path::Auto).quantized_linear(&x16, &q).unwrap();
    assert!(!fast::pending_ops(&[&y]).iter().any(|op| op.starts_with("Mlxcel")));
    let fp4 = arr(&normal(&mut rng, 16 * 64), &[16, 64]).quantize(32, 4, QuantMode::Mxfp4).unwrap();
    let err = kernel().quantized_linear(&x, &fp4).unwrap_err().to_string();
    assert!(err.contains("covers affine quantization"), "{err}");
    assert!(fast::on(Path::Auto).quantized_linear(&x, &fp4).is_ok());
    // Shape mismatches are errors on every path.
    let bad = arr(&normal(&mut rng, 96), &[1, 96]);
    for path in [Path::Auto, Path::Kernel, Path::Mlx] {
        assert!(fast::on(path).quantized_linear(&bad, &q).is_err(), "{path:?}: inner dimension mismatch");
        let w = arr(&[1.0; 5], &[5]);
        assert!(fast::on(path).rms_norm(&bad, Some(&w), 1e-5).is_err(), "{path:?}: weight size");
        let x4 = arr(&normal(&mut rng, 2 * 8 * 16), &[1, 2, 8, 16]);
        let k4 = arr(&normal(&mut rng, 3 * 8 * 16), &[1, 3, 8, 16]);
        assert!(
            fast::on(path).scaled_dot_product_attention(&x4, &k4, &k4, 1.0, AttentionMask::None).is_err(),
            "{path:?}: heads not a multiple of kv heads"
        );
        assert!(fast::on(path).rope(&x4, 15, false, 1e4, 1.0, 0, None).is_err(), "{path:?}: odd dims");
        let other = arr(&normal(&mut rng, 8), &[1, 8]);
        let e = fast::on(path).gated_activation(GateActivation::Silu, &bad, &other);
        if path == Path::Kernel {
            assert!(e.is_err(), "kernel: shapes differ");
        }
    }
    let err = kernel().rope(&x.reshape(&[1, 1, 64]).unwrap(), 64, false, 1e4, 1.0, -1, None).unwrap_err();
    assert!(err.to_string().contains("positions"), "{err}");
}

#[test]
fn one_graph_node_per_kernel() {
    init();
    let mut rng = rng("one_graph_node_per_kernel").0;
    let q = quantized(&mut rng, 16, 64, 32, 4);
    Array::eval_all(&[&q.weight, &q.scales, q.biases.as_ref().unwrap()]).unwrap();
    let x = arr(&normal(&mut rng, 64), &[1, 64]);
    let y = kernel().quantized_linear(&x, &q).unwrap();
    assert_eq!(fast::pending_ops(&[&y]), vec!["MlxcelQuantizedLinear".to_string()]);
    let n = kernel().rms_norm(&x, None, 1e-5).unwrap();
    assert_eq!(fast::pending_ops(&[&n]), vec!["MlxcelRmsNorm".to_string()]);
    // MLX's own RMS norm on the CPU is a chain of small ops.
    assert!(fast::pending_ops(&[&mlx().rms_norm(&x, None, 1e-5).unwrap()]).len() > 3);
    y.eval().unwrap();
    assert!(fast::pending_ops(&[&y]).is_empty());
}

/// A graph of mlxcel kernels only runs inline, on the calling thread, with
/// exactly the values MLX's eval gives the same graph; a graph with any MLX
/// op is left to MLX's eval untouched; a cache step run inline still writes
/// its buffers in place.
#[test]
fn kernel_graphs_evaluate_inline_like_mlx() {
    init();
    // The ISA is process-wide: both evaluations must run the same kernels.
    let _guard = config_lock();
    let mut rng = rng("kernel_graphs_evaluate_inline_like_mlx").0;
    let (w1, w2) = (quantized(&mut rng, 128, 64, 32, 4), quantized(&mut rng, 64, 128, 64, 8));
    let norm = arr(&uniform(&mut rng, 64, 0.5, 1.5), &[64]);
    let x = arr(&normal(&mut rng, 3 * 64), &[1, 3, 64]);
    for w in [&w1, &w2] {
        Array::eval_all(&[&w.weight, &w.scales, w.biases.as_ref().unwrap()]).unwrap();
    }
    let build = || {
        let f = kernel();
        let h = f.rms_norm(&x, Some(&norm), 1e-6).unwrap();
        let g = f.quantized_linear(&h, &w1).unwrap();
        f.quantized_linear(&g, &w2).unwrap()
    };
    let (inline, reference) = (build(), build());
    let ops = fast::pending_ops(&[&inline]);
    assert!(ops.len() >= 2 && ops.iter().all(|o| o.starts_with("Mlxcel")), "{ops:?}");
    assert!(fast::eval_inline(&[&inline]).unwrap(), "a kernel-only graph runs inline");
    assert!(fast::pending_ops(&[&inline]).is_empty());
    Array::eval_all(&[&reference]).unwrap();
    assert_eq!(vals(&inline), vals(&reference));

    // An MLX op in the graph: nothing is computed inline.
    let mixed = build().add(&x).unwrap();
    assert!(!fast::eval_inline(&[&mixed]).unwrap());
    assert_eq!(fast::pending_ops(&[&mixed]).len(), ops.len() + 1);
    fast::eval(&[&mixed]).unwrap();
    assert_eq!(vals(&mixed), vals(&reference.add(&x).unwrap()));

    let (h, d, cap) = (2i32, 16i32, 8i32);
    let mut kbuf = Array::zeros(&[1, h, cap, d], Dtype::F32).unwrap();
    let mut vbuf = Array::zeros(&[1, h, cap, d], Dtype::F32).unwrap();
    Array::eval_all(&[&kbuf, &vbuf]).unwrap();
    let k_addr = kbuf.data_address().unwrap();
    let rope = fast::RopeSpec { dims: d, traditional: false, base: 10000.0, scale: 1.0, freqs: None };
    for pos in 0..3usize {
        let q = arr(&normal(&mut rng, (h * d) as usize), &[1, h, 1, d]);
        let k = arr(&normal(&mut rng, (h * d) as usize), &[1, h, 1, d]);
        let v = arr(&normal(&mut rng, (h * d) as usize), &[1, h, 1, d]);
        let cache = fast::CacheSlot { keys: &kbuf, values: &vbuf, slot: pos, visible: pos + 1, causal: false };
        let step =
            kernel().cached_attention(&q, &k, &v, &rope, &[fast::CacheRow { offset: pos, cache }], 0.25).unwrap();
        (kbuf, vbuf) = step.caches.into_iter().next().unwrap();
        assert!(fast::eval_inline(&[&step.out, &kbuf, &vbuf]).unwrap(), "step {pos} runs inline");
        assert_eq!(kbuf.data_address().unwrap(), k_addr, "step {pos}: the key buffer moved");
        let keys = vals(&kbuf);
        let want_k = vals(&fast::on(Path::Mlx).rope(&k, d, false, 10000.0, 1.0, pos as i32, None).unwrap());
        for head in 0..h as usize {
            let at = (head * cap as usize + pos) * d as usize;
            assert_rms(
                &format!("step {pos} key"),
                &keys[at..at + d as usize],
                &want_k[head * d as usize..][..d as usize],
                1e-6,
            );
        }
    }
}

/// Inline evaluation runs only graphs made of mlxcel's nodes: an MLX node
/// anywhere (under a kernel node or above it) leaves the whole graph to
/// MLX's eval, with nothing computed.
#[test]
fn eval_inline_refuses_foreign_nodes() {
    init();
    let mut rng = rng("eval_inline_refuses_foreign_nodes").0;
    let w = quantized(&mut rng, 32, 64, 32, 4);
    Array::eval_all(&[&w.weight, &w.scales, w.biases.as_ref().unwrap()]).unwrap();
    let x = arr(&normal(&mut rng, 2 * 64), &[1, 2, 64]);
    x.eval().unwrap();
    let below =
        kernel().quantized_linear(&kernel().rms_norm(&x.multiply_scalar(2.0).unwrap(), None, 1e-5).unwrap(), &w);
    let above = kernel().quantized_linear(&x, &w).unwrap().exp().unwrap();
    for (what, graph) in [("an MLX node below", below.unwrap()), ("an MLX node above", above)] {
        let before = fast::pending_ops(&[&graph]);
        assert!(before.iter().any(|o| o.starts_with("Mlxcel")) && before.iter().any(|o| !o.starts_with("Mlxcel")));
        assert!(!fast::eval_inline(&[&graph]).unwrap(), "{what}: refused");
        assert_eq!(fast::pending_ops(&[&graph]), before, "{what}: nothing computed");
        fast::eval(&[&graph]).unwrap();
        assert!(fast::pending_ops(&[&graph]).is_empty(), "{what}: MLX's eval computed it");
    }
}

#[test]
fn thread_and_isa_settings() {
    let _guard = config_lock();
    assert!(fast::default_threads() >= 1);
    fast::set_threads(3);
    assert_eq!(fast::threads(), 3);
    fast::set_threads(0);
    assert_eq!(fast::threads(), fast::default_threads());
    assert!(Isa::Scalar.is_supported());
    let best = fast::isa();
    assert!(best.is_supported());
    fast::set_isa(Isa::Scalar).unwrap();
    assert_eq!(fast::isa(), Isa::Scalar);
    fast::set_isa(best).unwrap();
    assert!(fast::read_bandwidth_gbs(1 << 20, 2) > 0.0);
}
