//! The transformer building blocks (softmax, norms, RoPE, attention) against
//! plain Rust references, for every float dtype the runtime uses.

mod common;

use common::*;
use mlxcel_mlx::{Array, AttentionMask, Dtype, scaled_dot_product_attention};

const FLOATS: [Dtype; 3] = [Dtype::F32, Dtype::BF16, Dtype::F16];

#[test]
fn softmax_rows() {
    init();
    let (mut rng, _) = rng("softmax_rows");
    let (rows, n) = (6usize, 37usize);
    let x: Vec<f32> = normal(&mut rng, rows * n).iter().map(|v| v * 4.0).collect();
    for dtype in FLOATS {
        let xr = round_to(&x, dtype);
        let a = arr(&x, &[rows as i32, n as i32]).astype(dtype).unwrap();
        for precise in [false, true] {
            let got = a.softmax(&[-1], precise).unwrap();
            assert_eq!(got.dtype(), dtype);
            // Without `precise`, MLX exponentiates and sums in the input dtype:
            // for bf16 that is a rounding per term plus a bf16 running sum over
            // the row (~3% measured at n=37). The runtime uses `precise` for
            // low-precision logits; its bound is one output rounding.
            let rtol =
                if precise || dtype == Dtype::F32 { elementwise_tol(dtype) } else { elementwise_tol(dtype) * 4.0 };
            assert_close(&format!("softmax {dtype} precise={precise}"), &vals(&got), &ref_softmax(&xr, n), rtol, 1e-6);
        }
    }
}

fn ref_rms_norm(x: &[f32], w: Option<&[f32]>, n: usize, eps: f32) -> Vec<f32> {
    x.chunks(n)
        .flat_map(|row| {
            let ms = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / n as f64;
            let inv = 1.0 / (ms + f64::from(eps)).sqrt();
            row.iter().enumerate().map(move |(i, &v)| (f64::from(v) * inv) as f32 * w.map_or(1.0, |w| w[i]))
        })
        .collect()
}

fn ref_layer_norm(x: &[f32], w: Option<&[f32]>, b: Option<&[f32]>, n: usize, eps: f32) -> Vec<f32> {
    x.chunks(n)
        .flat_map(|row| {
            let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64;
            let var = row.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / n as f64;
            let inv = 1.0 / (var + f64::from(eps)).sqrt();
            row.iter().enumerate().map(move |(i, &v)| {
                ((f64::from(v) - mean) * inv) as f32 * w.map_or(1.0, |w| w[i]) + b.map_or(0.0, |b| b[i])
            })
        })
        .collect()
}

#[test]
fn rms_norm_and_layer_norm() {
    init();
    let (mut rng, _) = rng("rms_norm_and_layer_norm");
    let (rows, n) = (5usize, 96usize);
    let x: Vec<f32> = normal(&mut rng, rows * n).iter().map(|v| v * 3.0 + 0.5).collect();
    let w = uniform(&mut rng, n, 0.5, 1.5);
    let b = uniform(&mut rng, n, -0.5, 0.5);
    let eps = 1e-5;
    for dtype in FLOATS {
        let (xr, wr, br) = (round_to(&x, dtype), round_to(&w, dtype), round_to(&b, dtype));
        let xa = arr(&x, &[rows as i32, n as i32]).astype(dtype).unwrap();
        let wa = arr(&w, &[n as i32]).astype(dtype).unwrap();
        let ba = arr(&b, &[n as i32]).astype(dtype).unwrap();
        // Normalised values are O(1): allow two roundings relative to the value
        // and one rounding of an O(1) intermediate in absolute terms (the bias
        // add of layer_norm cancels near zero).
        let tol = elementwise_tol(dtype) * 2.0;
        let atol = elementwise_tol(dtype);
        let got = xa.rms_norm(Some(&wa), eps).unwrap();
        assert_eq!(got.dtype(), dtype);
        assert_close(&format!("rms_norm {dtype}"), &vals(&got), &ref_rms_norm(&xr, Some(&wr), n, eps), tol, atol);
        let got = xa.rms_norm(None, eps).unwrap();
        assert_close(&format!("rms_norm {dtype} no weight"), &vals(&got), &ref_rms_norm(&xr, None, n, eps), tol, atol);
        let got = xa.layer_norm(Some(&wa), Some(&ba), eps).unwrap();
        let want = ref_layer_norm(&xr, Some(&wr), Some(&br), n, eps);
        assert_close(&format!("layer_norm {dtype}"), &vals(&got), &want, tol, atol);
        let got = xa.layer_norm(None, None, eps).unwrap();
        let want = ref_layer_norm(&xr, None, None, n, eps);
        assert_close(&format!("layer_norm {dtype} plain"), &vals(&got), &want, tol, atol);
    }
}

/// RoPE over `x: [heads, seq, dim]`, rotating the first `dims` features of
/// each position `offset + s` with inverse frequencies `1 / wavelength_i`.
#[allow(clippy::too_many_arguments)]
fn ref_rope(
    x: &[f32],
    heads: usize,
    seq: usize,
    dim: usize,
    dims: usize,
    traditional: bool,
    scale: f32,
    offset: usize,
    wavelengths: &[f64],
) -> Vec<f32> {
    let half = dims / 2;
    let mut out = x.to_vec();
    for h in 0..heads {
        for s in 0..seq {
            let base_idx = (h * seq + s) * dim;
            let pos = (offset + s) as f64 * f64::from(scale);
            for (i, wavelength) in wavelengths.iter().enumerate().take(half) {
                let theta = pos / wavelength;
                let (sin, cos) = theta.sin_cos();
                let (a, b) = if traditional { (2 * i, 2 * i + 1) } else { (i, i + half) };
                let (x1, x2) = (f64::from(x[base_idx + a]), f64::from(x[base_idx + b]));
                out[base_idx + a] = (x1 * cos - x2 * sin) as f32;
                out[base_idx + b] = (x1 * sin + x2 * cos) as f32;
            }
        }
    }
    out
}

#[test]
fn rope_variants() {
    init();
    let (mut rng, _) = rng("rope_variants");
    let (heads, seq, dim) = (3usize, 9usize, 64usize);
    let x = normal(&mut rng, heads * seq * dim);
    let base = 10_000f32;
    for dtype in FLOATS {
        let xr = round_to(&x, dtype);
        let xa = arr(&x, &[1, heads as i32, seq as i32, dim as i32]).astype(dtype).unwrap();
        // Full and partial rotation, both layouts, scaled positions, an offset.
        for (dims, traditional, scale, offset) in [(64, false, 1.0, 0), (64, true, 1.0, 5), (32, false, 0.5, 17)] {
            let wl: Vec<f64> = (0..dims / 2).map(|i| f64::from(base).powf(2.0 * i as f64 / dims as f64)).collect();
            let want = ref_rope(&xr, heads, seq, dim, dims, traditional, scale, offset, &wl);
            let got = xa.rope(dims as i32, traditional, base, scale, offset as i32, None).unwrap();
            assert_eq!(got.dtype(), dtype);
            let what = format!("rope {dtype} dims={dims} traditional={traditional} offset={offset}");
            // Angles grow with the position: allow a little more than one rounding.
            assert_close(&what, &vals(&got), &want, elementwise_tol(dtype) * 2.0, elementwise_tol(dtype));
            // The same with the offset held in an array.
            let off = Array::from_slice(&[offset as i32], &[]).unwrap();
            let got = xa.rope_dynamic(dims as i32, traditional, base, scale, &off, None).unwrap();
            assert_close(
                &format!("{what} dynamic"),
                &vals(&got),
                &want,
                elementwise_tol(dtype) * 2.0,
                elementwise_tol(dtype),
            );
        }
        // Explicit per-frequency wavelengths (how llama3/yarn scaling is applied).
        let wl: Vec<f64> =
            (0..dim / 2).map(|i| f64::from(base).powf(2.0 * i as f64 / dim as f64) * (1.0 + i as f64 * 0.1)).collect();
        let freqs: Vec<f32> = wl.iter().map(|&v| v as f32).collect();
        let got = xa.rope(dim as i32, false, base, 1.0, 3, Some(&arr(&freqs, &[(dim / 2) as i32]))).unwrap();
        let want = ref_rope(&xr, heads, seq, dim, dim, false, 1.0, 3, &wl);
        assert_close(
            &format!("rope {dtype} freqs"),
            &vals(&got),
            &want,
            elementwise_tol(dtype) * 2.0,
            elementwise_tol(dtype),
        );
    }
}

/// Attention over `q: [H, Lq, D]`, `k, v: [KVH, Lk, D]` with an optional mask
/// `allowed(i, j)`.
#[allow(clippy::too_many_arguments)]
fn ref_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    heads: usize,
    kv_heads: usize,
    lq: usize,
    lk: usize,
    d: usize,
    scale: f32,
    allowed: &dyn Fn(usize, usize) -> bool,
) -> Vec<f32> {
    let mut out = vec![0f32; heads * lq * d];
    for h in 0..heads {
        let kh = h / (heads / kv_heads);
        for i in 0..lq {
            let qi = &q[(h * lq + i) * d..(h * lq + i + 1) * d];
            let mut scores: Vec<f64> = (0..lk)
                .map(|j| {
                    if !allowed(i, j) {
                        return f64::NEG_INFINITY;
                    }
                    let kj = &k[(kh * lk + j) * d..(kh * lk + j + 1) * d];
                    qi.iter().zip(kj).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum::<f64>() * f64::from(scale)
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let mut sum = 0.0;
            for s in &mut scores {
                *s = (*s - max).exp();
                sum += *s;
            }
            for (j, s) in scores.iter().enumerate() {
                for t in 0..d {
                    out[(h * lq + i) * d + t] += (s / sum * f64::from(v[(kh * lk + j) * d + t])) as f32;
                }
            }
        }
    }
    out
}

#[test]
fn scaled_dot_product_attention_masks_and_gqa() {
    init();
    let (mut rng, _) = rng("scaled_dot_product_attention_masks_and_gqa");
    let (heads, kv_heads, d) = (6usize, 2usize, 64usize);
    let scale = 1.0 / (d as f32).sqrt();
    // Prefill (queries = keys) and a decode-like step (few queries, longer cache).
    for (lq, lk) in [(11usize, 11usize), (3, 19), (1, 23)] {
        let q = normal(&mut rng, heads * lq * d);
        let k = normal(&mut rng, kv_heads * lk * d);
        let v = normal(&mut rng, kv_heads * lk * d);
        let bool_mask: Vec<bool> = (0..lq * lk).map(|i| i % 3 != 1 || i % lk == 0).collect();
        for dtype in FLOATS {
            let (qr, kr, vr) = (round_to(&q, dtype), round_to(&k, dtype), round_to(&v, dtype));
            let qa = arr(&q, &[1, heads as i32, lq as i32, d as i32]).astype(dtype).unwrap();
            let ka = arr(&k, &[1, kv_heads as i32, lk as i32, d as i32]).astype(dtype).unwrap();
            let va = arr(&v, &[1, kv_heads as i32, lk as i32, d as i32]).astype(dtype).unwrap();
            let tol = rms_tol(dtype) * 2.0;
            let what = |m: &str| format!("sdpa {dtype} lq={lq} lk={lk} {m}");
            let attn = |mask| vals(&scaled_dot_product_attention(&qa, &ka, &va, scale, mask).unwrap());
            let reference = |allowed: &dyn Fn(usize, usize) -> bool| {
                ref_attention(&qr, &kr, &vr, heads, kv_heads, lq, lk, d, scale, allowed)
            };
            assert_rms(&what("none"), &attn(AttentionMask::None), &reference(&|_, _| true), tol);
            let causal = |i: usize, j: usize| j <= i + (lk - lq);
            assert_rms(&what("causal"), &attn(AttentionMask::Causal), &reference(&causal), tol);
            let m = Array::from_bools(&bool_mask, &[lq as i32, lk as i32]).unwrap();
            let allowed = |i: usize, j: usize| bool_mask[i * lk + j];
            assert_rms(&what("bool mask"), &attn(AttentionMask::Array(&m)), &reference(&allowed), tol);
            // The same mask as an additive float mask.
            let additive: Vec<f32> = bool_mask.iter().map(|&b| if b { 0.0 } else { -1e9 }).collect();
            let m = arr(&additive, &[lq as i32, lk as i32]).astype(dtype).unwrap();
            assert_rms(&what("additive mask"), &attn(AttentionMask::Array(&m)), &reference(&allowed), tol);
        }
    }
    // Heads that are not a multiple of the KV heads are an error.
    let q = Array::zeros(&[1, 5, 2, 8], Dtype::F32).unwrap();
    let k = Array::zeros(&[1, 2, 2, 8], Dtype::F32).unwrap();
    assert!(scaled_dot_product_attention(&q, &k, &k, 1.0, AttentionMask::None).is_err());
}
