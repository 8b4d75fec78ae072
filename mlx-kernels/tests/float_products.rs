//! mlxcel's float product kernels (`Fast::linear`, `linear_heads` and
//! `gated_linear` with f32, f16 or bf16 weights on `Path::Kernel`) against
//! MLX's matmul (`Path::Mlx`: `x @ Wᵀ`, the weights promoted to f32) and an
//! f64 reference, for every ISA this CPU has, with one and two threads, on
//! odd shapes: K and N not multiples of any vector width, M from 1 (a decode
//! step) to 33 (the GEMM).
//!
//! Tolerance (ε = 2⁻²⁴): 16-bit weights widen to f32 exactly and x stays f32,
//! so both our kernel and MLX's matmul compute the same K f32 products and
//! differ from the exact sum only by the rounding of a sum in some order: a
//! random walk of roundings, ~sqrt(K)·ε of the sum of the terms' magnitudes.
//! The bound allows 8·sqrt(K)·ε·Σ|terms| (as for the quantized products in
//! kernels.rs); a wrong kernel (a dropped tail, a mis-widened half) is off by
//! orders of magnitude more.

mod common;

use common::*;
use mlxcel_mlx::fast::{self, GateActivation, Path};
use mlxcel_mlx::{Array, Dtype, Linear, Weight};
use rand::rngs::StdRng;

const EPS: f64 = 1.0 / (1u32 << 24) as f64;

const DTYPES: [Dtype; 3] = [Dtype::F32, Dtype::F16, Dtype::BF16];

/// A `[rows, cols]` matrix of `dtype` (values ~0.1), evaluated.
fn matrix(rng: &mut StdRng, rows: usize, cols: usize, dtype: Dtype) -> Array {
    let w: Vec<f32> = normal(rng, rows * cols).iter().map(|v| v * 0.1).collect();
    let w = arr(&w, &[rows as i32, cols as i32]).astype(dtype).unwrap();
    w.eval().unwrap();
    w
}

fn dense(w: &Array) -> Linear {
    Linear { weight: Weight::Dense(w.clone()), bias: None }
}

/// `got [m, n]` against the f64 `x [m, k] · wᵀ` of the f32 values of w,
/// within 8·sqrt(K)·ε·Σ|terms| (module comment).
fn check_product(what: &str, w: &Array, x: &[f32], m: usize, got: &[f32]) {
    let wv = vals(w);
    let (n, k) = (w.shape()[0] as usize, w.shape()[1] as usize);
    assert_eq!(got.len(), m * n, "{what}: output size");
    for i in 0..m {
        for j in 0..n {
            let terms =
                x[i * k..(i + 1) * k].iter().zip(&wv[j * k..(j + 1) * k]).map(|(&a, &b)| f64::from(a) * f64::from(b));
            let (want, mag) = terms.fold((0f64, 0f64), |(s, g), t| (s + t, g + t.abs()));
            let tol = 8.0 * (k as f64).sqrt() * EPS * mag + 1e-30;
            let err = (f64::from(got[i * n + j]) - want).abs();
            assert!(err <= tol, "{what}: out[{i}, {j}] = {}, want {want} (error {err:e} > {tol:e})", got[i * n + j]);
        }
    }
}

#[test]
fn float_linear_matches_mlx_every_dtype_and_shape() {
    init();
    let (mut rng, _) = rng("float_linear_matches_mlx_every_dtype_and_shape");
    for dtype in DTYPES {
        for (n, k) in [(37usize, 67usize), (19, 300), (64, 129), (5, 3)] {
            let w = matrix(&mut rng, n, k, dtype);
            let linear = dense(&w);
            for m in [1usize, 3, 8, 9, 33] {
                let xv = normal(&mut rng, m * k);
                // 3-D for odd M (a prefill [1, M, K]), 2-D otherwise.
                let shape: Vec<i32> = if m % 2 == 1 { vec![1, m as i32, k as i32] } else { vec![m as i32, k as i32] };
                let x = arr(&xv, &shape);
                x.eval().unwrap();
                let want = mlx().linear(&x, &linear).unwrap();
                check_product(&format!("mlx {dtype:?} n={n} k={k} m={m}"), &w, &xv, m, &vals(&want));
                each_config(|cfg| {
                    let y = kernel().linear(&x, &linear).unwrap();
                    assert_eq!(fast::pending_ops(&[&y]), ["MlxcelLinear"], "{cfg}: one node");
                    fast::eval(&[&y]).unwrap();
                    assert_eq!(y.shape()[..y.ndim() - 1], shape[..shape.len() - 1], "{cfg}: leading axes");
                    check_product(&format!("{cfg} {dtype:?} n={n} k={k} m={m}"), &w, &xv, m, &vals(&y));
                });
            }
        }
    }
}

/// Several float projections of one x split into heads (one node), a gated
/// pair (one node) and a biased linear (the node, then MLX's add), against
/// MLX's ops. Heads are the plain products rearranged (same bound); the gated
/// product passes two such products through silu (slope ≤ 1.1), so its
/// relative RMS stays within 1e-5 for K = 200; a bias adds one rounding.
#[test]
fn float_heads_gated_and_bias_match_mlx() {
    init();
    let (mut rng, _) = rng("float_heads_gated_and_bias_match_mlx");
    let k = 200usize;
    let (wq, wk, wv) = (
        matrix(&mut rng, 48, k, Dtype::BF16),
        matrix(&mut rng, 16, k, Dtype::BF16),
        matrix(&mut rng, 16, k, Dtype::F16),
    );
    let (wg, wu) = (matrix(&mut rng, 72, k, Dtype::BF16), matrix(&mut rng, 72, k, Dtype::BF16));
    let bias = arr(&normal(&mut rng, 48), &[48]);
    let biased = Linear { weight: Weight::Dense(wq.clone()), bias: Some(bias.clone()) };
    for l in [1usize, 7, 12] {
        let xv = normal(&mut rng, l * k);
        let x = arr(&xv, &[1, l as i32, k as i32]);
        x.eval().unwrap();
        let projections = [(&dense(&wq), 3), (&dense(&wk), 1), (&dense(&wv), 2)];
        let want_heads: Vec<Vec<f32>> = mlx().linear_heads(&x, &projections).unwrap().iter().map(vals).collect();
        let want_gated = vals(&mlx().gated_linear(&x, &dense(&wg), &dense(&wu), GateActivation::Silu).unwrap());
        let want_bias = vals(&mlx().linear(&x, &biased).unwrap());
        each_config(|cfg| {
            let f = kernel();
            let heads = f.linear_heads(&x, &projections).unwrap();
            let gated = f.gated_linear(&x, &dense(&wg), &dense(&wu), GateActivation::Silu).unwrap();
            let all: Vec<&Array> = heads.iter().chain([&gated]).collect();
            assert_eq!(sorted(fast::pending_ops(&all)), ["MlxcelGatedLinear", "MlxcelLinearMulti"], "{cfg}: two nodes");
            fast::eval(&all).unwrap();
            for (i, (h, want)) in heads.iter().zip(&want_heads).enumerate() {
                assert_eq!(
                    h.shape(),
                    mlx().linear_heads(&x, &projections[i..=i]).unwrap()[0].shape(),
                    "{cfg}: heads {i}"
                );
                let w = [&wq, &wk, &wv][i];
                let n = w.shape()[0] as usize;
                let heads_n = projections[i].1 as usize;
                // Back to [L, N] rows for the bound: head h of position t is columns h·D.. of row t.
                let (got, want) = (vals(h), want);
                let d = n / heads_n;
                let plain = |v: &[f32]| -> Vec<f32> {
                    (0..l)
                        .flat_map(|t| (0..heads_n).flat_map(move |hh| (0..d).map(move |c| (t, hh, c))))
                        .map(|(t, hh, c)| v[(hh * l + t) * d + c])
                        .collect()
                };
                check_product(&format!("{cfg} heads {i} l={l}"), w, &xv, l, &plain(&got));
                check_product(&format!("mlx heads {i} l={l}"), w, &xv, l, &plain(want));
            }
            assert_rms(&format!("{cfg} gated l={l}"), &vals(&gated), &want_gated, 1e-5);
            let y = f.linear(&x, &biased).unwrap();
            let got = vals(&y);
            let plain = vals(&kernel().linear(&x, &dense(&wq)).unwrap());
            let b = vals(&bias);
            for (i, (&g, &p)) in got.iter().zip(&plain).enumerate() {
                assert_eq!(g, p + b[i % 48], "{cfg}: the bias is one f32 addition after the product");
            }
            assert_close(&format!("{cfg} biased l={l}"), &got, &want_bias, 1e-5, 1e-5);
        });
    }
}

/// Batch invariance: for x `[B, 1, K]` (one position per sequence, a decode
/// step) every row of a plain, a residual-adding, a head-split and a gated
/// float product (with an absorbed RMS norm) has exactly the bits of that
/// row alone, for B from 2 to 17 (beyond the matvec's 8 rows, where a
/// prefill takes the GEMM), every ISA, 1 and 2 threads; the step is all
/// kernels (fast::eval runs it inline).
#[test]
fn float_products_are_batch_invariant() {
    init();
    let (mut rng, _) = rng("float_products_are_batch_invariant");
    let k = 131usize;
    for dtype in DTYPES {
        let (heads, d) = (3i32, 16i32);
        let wq = matrix(&mut rng, (heads * d) as usize, k, dtype);
        let (wg, wu) = (matrix(&mut rng, 40, k, dtype), matrix(&mut rng, 40, k, dtype));
        let norm = arr(&uniform(&mut rng, k, 0.5, 1.5), &[k as i32]);
        for b in [2i32, 3, 8, 9, 17] {
            let x = arr(&normal(&mut rng, b as usize * k), &[b, 1, k as i32]);
            let r = arr(&normal(&mut rng, (b * heads * d) as usize), &[b, 1, heads * d]);
            Array::eval_all(&[&x, &r, &norm]).unwrap();
            let products = |x: &Array, r: &Array| -> Vec<Vec<f32>> {
                let f = kernel();
                let plain = f.linear(x, &dense(&wq)).unwrap();
                let residual = f.add(&f.linear(x, &dense(&wq)).unwrap(), r).unwrap();
                let split = f.linear_heads(x, &[(&dense(&wq), heads)]).unwrap().remove(0);
                let normed = f.rms_norm(x, Some(&norm), 1e-5).unwrap();
                let gated = f.gated_linear(&normed, &dense(&wg), &dense(&wu), GateActivation::Silu).unwrap();
                let all = [&plain, &residual, &split, &gated];
                assert_eq!(
                    sorted(fast::pending_ops(&all)),
                    ["MlxcelGatedLinear", "MlxcelLinear", "MlxcelLinearAdd", "MlxcelLinearMulti"],
                    "one node each (residual and norm fused)"
                );
                assert!(fast::eval_inline(&all).unwrap(), "all kernels: evaluated inline");
                all.iter().map(|a| vals(a)).collect()
            };
            each_config(|cfg| {
                let batch = products(&x, &r);
                for row in 0..b {
                    let alone = products(&batch_row(&x, row), &batch_row(&r, row));
                    for (i, (all, one)) in batch.iter().zip(&alone).enumerate() {
                        let n = one.len();
                        let got = &all[row as usize * n..(row as usize + 1) * n];
                        assert_eq!(got, &one[..], "{cfg} {dtype:?} b={b}: product {i}, row {row}");
                    }
                }
            });
        }
    }
}

/// The names of `pending_ops`, sorted (its own order is the graph walk's).
fn sorted(mut ops: Vec<String>) -> Vec<String> {
    ops.sort();
    ops
}

/// Inputs the float kernels do not cover: an error naming why on
/// `Path::Kernel`, MLX's matmul on `Path::Auto`.
#[test]
fn float_linear_uncovered_inputs() {
    init();
    let (mut rng, _) = rng("float_linear_uncovered_inputs");
    let w = matrix(&mut rng, 8, 16, Dtype::BF16);
    let x16 = arr(&normal(&mut rng, 16), &[1, 16]).astype(Dtype::F16).unwrap();
    let err = kernel().linear(&x16, &dense(&w)).unwrap_err().to_string();
    assert!(err.contains("activations must be float32"), "{err}");
    let auto = fast::on(Path::Auto).linear(&x16, &dense(&w)).unwrap();
    assert!(fast::pending_ops(&[&auto]).iter().all(|op| !op.starts_with("Mlxcel")), "MLX's matmul");
    let x = arr(&normal(&mut rng, 15), &[1, 15]);
    let err = kernel().linear(&x, &dense(&w)).unwrap_err().to_string();
    assert!(err.contains("features"), "{err}");
}

/// Rows of a float embedding table (f32, f16, bf16) through the gather node:
/// each row widened to f32 (exact) then multiplied by the scale in f32, so
/// bit for bit the f32 table's `take` times the scale (MLX's op on the
/// f32 conversion); one node.
#[test]
fn float_embedding_rows_are_exact() {
    init();
    let (mut rng, _) = rng("float_embedding_rows_are_exact");
    for dtype in DTYPES {
        let table = matrix(&mut rng, 50, 37, dtype);
        let ids = Array::from_slice(&[3u32, 0, 49, 3, 17, 8], &[2, 3]).unwrap();
        let table32 = table.astype(Dtype::F32).unwrap();
        for scale in [1.0f32, 2.5] {
            let want = mlx().embedding(&ids, &Weight::Dense(table32.clone()), scale).unwrap();
            each_config(|cfg| {
                let rows = kernel().embedding(&ids, &Weight::Dense(table.clone()), scale).unwrap();
                assert_eq!(fast::pending_ops(&[&rows]), ["MlxcelGather"], "{cfg}: one node");
                assert_eq!(rows.shape(), [2, 3, 37]);
                assert_eq!(rows.dtype(), Dtype::F32);
                assert_eq!(vals(&rows), vals(&want), "{cfg} {dtype:?} scale={scale}");
            });
        }
    }
}
