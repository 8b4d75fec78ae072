//! Construction, elementwise arithmetic, reductions, layout and indexing
//! operations against plain Rust references on fresh random inputs.

mod common;

use common::*;
use mlxcel_mlx::{Array, Dtype};
use rand::Rng;
use rand::seq::SliceRandom;

#[test]
fn host_round_trip_every_dtype() {
    init();
    let (mut rng, _) = rng("host_round_trip_every_dtype");
    let n = 37;
    let f: Vec<f32> = uniform(&mut rng, n, -100.0, 100.0);
    macro_rules! check {
        ($t:ty, $conv:expr) => {{
            let data: Vec<$t> = f.iter().map($conv).collect();
            let a = Array::from_slice(&data, &[n as i32]).unwrap();
            assert_eq!(a.dtype(), <$t as mlxcel_mlx::Element>::DTYPE);
            assert_eq!(a.to_vec::<$t>().unwrap(), data, "{}", stringify!($t));
        }};
    }
    check!(u8, |&x| x.abs() as u8);
    check!(u16, |&x| (x.abs() * 100.0) as u16);
    check!(u32, |&x| (x.abs() * 1e6) as u32);
    check!(u64, |&x| (x.abs() * 1e12) as u64);
    check!(i8, |&x| x as i8);
    check!(i16, |&x| (x * 100.0) as i16);
    check!(i32, |&x| (x * 1e6) as i32);
    check!(i64, |&x| (x * 1e12) as i64);
    check!(f32, |&x| x);
    check!(f64, |&x| f64::from(x) * 1.000_000_1);
    check!(half::f16, |&x| half::f16::from_f32(x));
    check!(half::bf16, |&x| half::bf16::from_f32(x));
    let bools: Vec<bool> = f.iter().map(|&x| x > 0.0).collect();
    assert_eq!(Array::from_bools(&bools, &[n as i32]).unwrap().to_bools().unwrap(), bools);
    // Shape and size bookkeeping.
    let a = Array::zeros(&[2, 3, 4], Dtype::BF16).unwrap();
    assert_eq!((a.shape(), a.ndim(), a.size(), a.nbytes()), (vec![2, 3, 4], 3, 24, 48));
    assert_eq!((a.dim(-1), a.dim(0), a.dim(3)), (Some(4), Some(2), None));
    assert_eq!(Array::scalar(2.5f32).item::<f32>().unwrap(), 2.5);
}

#[test]
fn constants_and_ranges() {
    init();
    assert_eq!(Array::full(&[2, 2], 7.0, Dtype::I32).unwrap().to_vec::<i32>().unwrap(), vec![7; 4]);
    assert_eq!(Array::ones(&[3], Dtype::F16).unwrap().to_vec::<half::f16>().unwrap(), vec![half::f16::ONE; 3]);
    let big = Array::full(&[1], 3_000_000_000.0, Dtype::I64).unwrap();
    assert_eq!(big.to_vec::<i64>().unwrap(), vec![3_000_000_000]);
    assert_eq!(Array::arange(2.0, 11.0, 3.0, Dtype::I32).unwrap().to_vec::<i32>().unwrap(), vec![2, 5, 8]);
    assert_eq!(Array::arange(0.0, 1.0, 0.25, Dtype::F32).unwrap().to_vec::<f32>().unwrap(), vec![0.0, 0.25, 0.5, 0.75]);
}

#[test]
fn unary_ops_match_std() {
    init();
    let (mut rng, _) = rng("unary_ops_match_std");
    let shape = [5, 13];
    let x = uniform(&mut rng, 65, -3.0, 3.0);
    let pos = uniform(&mut rng, 65, 0.05, 4.0);
    let a = arr(&x, &shape);
    let p = arr(&pos, &shape);
    type Case = (&'static str, fn(&Array) -> mlxcel_mlx::Result<Array>, fn(f32) -> f32, bool);
    let cases: &[Case] = &[
        ("negative", Array::negative, |v| -v, false),
        ("exp", Array::exp, f32::exp, false),
        ("log", Array::log, f32::ln, true),
        ("sqrt", Array::sqrt, f32::sqrt, true),
        ("rsqrt", Array::rsqrt, |v| 1.0 / v.sqrt(), true),
        ("square", Array::square, |v| v * v, false),
        ("abs", Array::abs, f32::abs, false),
        ("tanh", Array::tanh, f32::tanh, false),
        ("sigmoid", Array::sigmoid, |v| 1.0 / (1.0 + (-v).exp()), false),
        ("erf", Array::erf, libm::erff, false),
        ("sin", Array::sin, f32::sin, false),
        ("cos", Array::cos, f32::cos, false),
        ("floor", Array::floor, f32::floor, false),
        ("ceil", Array::ceil, f32::ceil, false),
        ("log1p", Array::log1p, f32::ln_1p, true),
        ("reciprocal", Array::reciprocal, |v| 1.0 / v, true),
        ("silu", Array::silu, |v| v / (1.0 + (-v).exp()), false),
        ("gelu", Array::gelu, |v| 0.5 * v * (1.0 + libm::erff(v / std::f32::consts::SQRT_2)), false),
        (
            "gelu_approx",
            Array::gelu_approx,
            |v| 0.5 * v * (1.0 + ((2.0 / std::f32::consts::PI).sqrt() * (v + 0.044715 * v * v * v)).tanh()),
            false,
        ),
    ];
    for &(name, op, reference, positive_only) in cases {
        let (input, data) = if positive_only { (&p, &pos) } else { (&a, &x) };
        let want: Vec<f32> = data.iter().map(|&v| reference(v)).collect();
        // f32 transcendental functions in MLX are vectorised approximations: a
        // few ulp, so 1e-5 relative with a small absolute floor near zero.
        assert_close(name, &vals(&op(input).unwrap()), &want, 1e-5, 1e-6);
    }
    // Predicates.
    let special = arr(&[1.0, f32::NAN, f32::INFINITY, -f32::INFINITY], &[4]);
    assert_eq!(special.isnan().unwrap().to_bools().unwrap(), vec![false, true, false, false]);
    assert_eq!(special.isinf().unwrap().to_bools().unwrap(), vec![false, false, true, true]);
    let b = Array::from_bools(&[true, false], &[2]).unwrap();
    assert_eq!(b.logical_not().unwrap().to_bools().unwrap(), vec![false, true]);
}

#[test]
fn binary_ops_broadcast() {
    init();
    let (mut rng, _) = rng("binary_ops_broadcast");
    // [3, 1, 7] op [4, 7] -> [3, 4, 7]
    let x = uniform(&mut rng, 21, -4.0, 4.0);
    let y = uniform(&mut rng, 28, 0.5, 3.0);
    let a = arr(&x, &[3, 1, 7]);
    let b = arr(&y, &[4, 7]);
    let at = |i: usize, _j: usize, k: usize| x[i * 7 + k];
    let bt = |_i: usize, j: usize, k: usize| y[j * 7 + k];
    type Case = (&'static str, fn(&Array, &Array) -> mlxcel_mlx::Result<Array>, fn(f32, f32) -> f32);
    let cases: &[Case] = &[
        ("add", Array::add, |p, q| p + q),
        ("subtract", Array::subtract, |p, q| p - q),
        ("multiply", Array::multiply, |p, q| p * q),
        ("divide", Array::divide, |p, q| p / q),
        ("maximum", Array::maximum, f32::max),
        ("minimum", Array::minimum, f32::min),
        ("power", Array::power, |p, q| p.abs().powf(q)),
        ("remainder", Array::remainder, |p, q| p - q * (p / q).floor()),
        ("floor_divide", Array::floor_divide, |p, q| (p / q).floor()),
    ];
    let abs_a = a.abs().unwrap();
    for &(name, op, reference) in cases {
        let lhs = if name == "power" { &abs_a } else { &a };
        let got = op(lhs, &b).unwrap();
        assert_eq!(got.shape(), vec![3, 4, 7], "{name}");
        let mut want = Vec::new();
        for i in 0..3 {
            for j in 0..4 {
                for k in 0..7 {
                    want.push(reference(at(i, j, k), bt(i, j, k)));
                }
            }
        }
        assert_close(name, &vals(&got), &want, 1e-5, 1e-5);
    }
    type Cmp = (&'static str, fn(&Array, &Array) -> mlxcel_mlx::Result<Array>, fn(f32, f32) -> bool);
    let cmps: &[Cmp] = &[
        ("equal", Array::equal, |p, q| p == q),
        ("not_equal", Array::not_equal, |p, q| p != q),
        ("less", Array::less, |p, q| p < q),
        ("less_equal", Array::less_equal, |p, q| p <= q),
        ("greater", Array::greater, |p, q| p > q),
        ("greater_equal", Array::greater_equal, |p, q| p >= q),
    ];
    // Compare against a rounded copy so that equality actually happens.
    let rounded: Vec<f32> = y.iter().map(|v| v.round()).collect();
    let xr: Vec<f32> = x.iter().map(|v| v.round()).collect();
    let (ar, br) = (arr(&xr, &[3, 1, 7]), arr(&rounded, &[4, 7]));
    for &(name, op, reference) in cmps {
        let got = op(&ar, &br).unwrap().to_bools().unwrap();
        let mut want = Vec::new();
        for i in 0..3 {
            for j in 0..4 {
                for k in 0..7 {
                    want.push(reference(xr[i * 7 + k], rounded[j * 7 + k]));
                }
            }
        }
        assert_eq!(got, want, "{name}");
    }
    let p = Array::from_bools(&[true, true, false, false], &[4]).unwrap();
    let q = Array::from_bools(&[true, false, true, false], &[4]).unwrap();
    assert_eq!(p.logical_and(&q).unwrap().to_bools().unwrap(), vec![true, false, false, false]);
    assert_eq!(p.logical_or(&q).unwrap().to_bools().unwrap(), vec![true, true, true, false]);
    let w = Array::where_(&p, &arr(&[1.0, 2.0, 3.0, 4.0], &[4]), &arr(&[-1.0], &[1])).unwrap();
    assert_eq!(vals(&w), vec![1.0, 2.0, -1.0, -1.0]);
    // Scalars in the array's own dtype.
    let h = Array::from_slice(&[half::bf16::from_f32(1.5)], &[1]).unwrap();
    let s = h.add_scalar(2.0).unwrap().multiply_scalar(2.0).unwrap();
    assert_eq!((s.dtype(), vals(&s)), (Dtype::BF16, vec![7.0]));
}

#[test]
fn reductions_and_scans() {
    init();
    let (mut rng, _) = rng("reductions_and_scans");
    let (d0, d1, d2) = (4usize, 6usize, 9usize);
    let x = uniform(&mut rng, d0 * d1 * d2, -2.0, 2.0);
    let a = arr(&x, &[d0 as i32, d1 as i32, d2 as i32]);
    let idx = |i: usize, j: usize, k: usize| x[(i * d1 + j) * d2 + k];
    // Reduce over axes [0, 2] -> [d1].
    let over = |f: &dyn Fn(&[f32]) -> f32| -> Vec<f32> {
        (0..d1)
            .map(|j| {
                let v: Vec<f32> =
                    (0..d0).flat_map(|i| (0..d2).map(move |k| (i, k))).map(|(i, k)| idx(i, j, k)).collect();
                f(&v)
            })
            .collect()
    };
    let sum = |v: &[f32]| v.iter().map(|&x| f64::from(x)).sum::<f64>() as f32;
    assert_close("sum", &vals(&a.sum(&[0, 2], false).unwrap()), &over(&sum), 1e-5, 1e-5);
    assert_close("mean", &vals(&a.mean(&[0, 2], false).unwrap()), &over(&|v| sum(v) / v.len() as f32), 1e-5, 1e-6);
    assert_eq!(vals(&a.max(&[0, 2], false).unwrap()), over(&|v| v.iter().cloned().fold(f32::MIN, f32::max)));
    assert_eq!(vals(&a.min(&[0, 2], false).unwrap()), over(&|v| v.iter().cloned().fold(f32::MAX, f32::min)));
    let lse = |v: &[f32]| v.iter().map(|&x| f64::from(x).exp()).sum::<f64>().ln() as f32;
    assert_close("logsumexp", &vals(&a.logsumexp(&[0, 2], false).unwrap()), &over(&lse), 1e-5, 1e-6);
    let small = arr(&x[..8].iter().map(|v| v.abs() + 0.5).collect::<Vec<_>>(), &[8]);
    let prod: f32 = x[..8].iter().map(|v| v.abs() + 0.5).product();
    assert_close("prod", &vals(&small.prod(&[0], false).unwrap()), &[prod], 1e-5, 0.0);
    assert_eq!(a.sum(&[1], true).unwrap().shape(), vec![d0 as i32, 1, d2 as i32]);
    // argmax / argmin along the last axis.
    let rows: Vec<&[f32]> = x.chunks(d2).collect();
    let argmax: Vec<u32> =
        rows.iter().map(|r| r.iter().enumerate().fold(0, |b, (i, &v)| if v > r[b] { i } else { b }) as u32).collect();
    let argmin: Vec<u32> =
        rows.iter().map(|r| r.iter().enumerate().fold(0, |b, (i, &v)| if v < r[b] { i } else { b }) as u32).collect();
    assert_eq!(a.argmax(-1, false).unwrap().to_vec::<u32>().unwrap(), argmax);
    assert_eq!(a.argmin(-1, false).unwrap().to_vec::<u32>().unwrap(), argmin);
    // Cumulative sums, inclusive/exclusive and reversed, along the last axis.
    for (reverse, inclusive) in [(false, true), (false, false), (true, true), (true, false)] {
        let mut want = Vec::new();
        for r in &rows {
            let mut out = vec![0f32; d2];
            let mut acc = 0f32;
            let order: Vec<usize> = if reverse { (0..d2).rev().collect() } else { (0..d2).collect() };
            for &i in &order {
                if inclusive {
                    acc += r[i];
                    out[i] = acc;
                } else {
                    out[i] = acc;
                    acc += r[i];
                }
            }
            want.extend(out);
        }
        let got = vals(&a.cumsum(-1, reverse, inclusive).unwrap());
        assert_close(&format!("cumsum rev={reverse} incl={inclusive}"), &got, &want, 1e-5, 1e-5);
    }
}

#[test]
fn matmul_every_float_dtype() {
    init();
    let (mut rng, _) = rng("matmul_every_float_dtype");
    // Odd sizes so no kernel gets a friendly multiple.
    let (b, m, k, n) = (3usize, 7usize, 45usize, 13usize);
    let x = normal(&mut rng, b * m * k);
    let w = normal(&mut rng, k * n);
    for dtype in [Dtype::F32, Dtype::BF16, Dtype::F16] {
        let (xr, wr) = (round_to(&x, dtype), round_to(&w, dtype));
        let xa = arr(&x, &[b as i32, m as i32, k as i32]).astype(dtype).unwrap();
        let wa = arr(&w, &[k as i32, n as i32]).astype(dtype).unwrap();
        let got = xa.matmul(&wa).unwrap();
        assert_eq!((got.shape(), got.dtype()), (vec![b as i32, m as i32, n as i32], dtype));
        let want: Vec<f32> = (0..b).flat_map(|i| ref_matmul(&xr[i * m * k..(i + 1) * m * k], &wr, m, k, n)).collect();
        assert_rms(&format!("matmul {dtype}"), &vals(&got), &want, matmul_tol(dtype));
    }
    // addmm: beta * c + alpha * a @ b.
    let c = normal(&mut rng, m * n);
    let a2 = arr(&x[..m * k], &[m as i32, k as i32]);
    let got = Array::addmm(&arr(&c, &[m as i32, n as i32]), &a2, &arr(&w, &[k as i32, n as i32]), 0.5, 2.0).unwrap();
    let ab = ref_matmul(&x[..m * k], &w, m, k, n);
    let want: Vec<f32> = ab.iter().zip(&c).map(|(p, q)| 0.5 * p + 2.0 * q).collect();
    assert_rms("addmm", &vals(&got), &want, matmul_tol(Dtype::F32));
}

#[test]
fn layout_ops() {
    init();
    let (mut rng, _) = rng("layout_ops");
    let x = uniform(&mut rng, 2 * 3 * 4, -1.0, 1.0);
    let a = arr(&x, &[2, 3, 4]);
    let t = a.transpose(&[2, 0, 1]).unwrap();
    assert_eq!(t.shape(), vec![4, 2, 3]);
    let mut want = Vec::new();
    for k in 0..4 {
        for i in 0..2 {
            for j in 0..3 {
                want.push(x[(i * 3 + j) * 4 + k]);
            }
        }
    }
    assert_eq!(vals(&t), want);
    assert_eq!(vals(&t.contiguous().unwrap()), want);
    assert_eq!(vals(&a.transpose(&[]).unwrap().transpose(&[]).unwrap()), x);
    let s = a.swapaxes(0, 2).unwrap();
    assert_eq!(s.shape(), vec![4, 3, 2]);
    assert_eq!(vals(&s.swapaxes(2, 0).unwrap()), x);
    assert_eq!(vals(&a.reshape(&[6, -1]).unwrap()), x);
    assert_eq!(a.reshape(&[6, -1]).unwrap().shape(), vec![6, 4]);
    let e = a.expand_dims(&[0, 3]).unwrap();
    assert_eq!(e.shape(), vec![1, 2, 3, 1, 4]);
    assert_eq!(e.squeeze(&[0, 3]).unwrap().shape(), vec![2, 3, 4]);
    let row = arr(&x[..4], &[4]);
    let bc = row.broadcast_to(&[3, 4]).unwrap();
    assert_eq!(vals(&bc), [&x[..4], &x[..4], &x[..4]].concat());
    // astype rounds like the half crate (round to nearest even).
    for dtype in [Dtype::BF16, Dtype::F16] {
        assert_eq!(vals(&a.astype(dtype).unwrap()), round_to(&x, dtype), "astype {dtype}");
    }
    assert_eq!(arr(&[1.7, -2.7], &[2]).astype(Dtype::I32).unwrap().to_vec::<i32>().unwrap(), vec![1, -2]);
    // tril / triu.
    let sq = arr(&(0..16).map(|v| v as f32 + 1.0).collect::<Vec<_>>(), &[4, 4]);
    let lower = vals(&sq.tril(0).unwrap());
    let upper = vals(&sq.triu(1).unwrap());
    for r in 0..4 {
        for c in 0..4 {
            let v = (r * 4 + c) as f32 + 1.0;
            assert_eq!(lower[r * 4 + c], if c <= r { v } else { 0.0 });
            assert_eq!(upper[r * 4 + c], if c > r { v } else { 0.0 });
        }
    }
}

#[test]
fn slicing_and_joining() {
    init();
    let (mut rng, _) = rng("slicing_and_joining");
    let (r, c) = (9usize, 11usize);
    let x = uniform(&mut rng, r * c, -1.0, 1.0);
    let a = arr(&x, &[r as i32, c as i32]);
    // a[1:8:3, 2:11:2]
    let s = a.slice(&[1, 2], &[8, 11], &[3, 2]).unwrap();
    let mut want = Vec::new();
    for i in (1..8).step_by(3) {
        for j in (2..11).step_by(2) {
            want.push(x[i * c + j]);
        }
    }
    assert_eq!(s.shape(), vec![3, 5]);
    assert_eq!(vals(&s), want);
    // Dynamic start: rows 4..6, all columns.
    let start = Array::from_slice(&[4i32], &[1]).unwrap();
    let d = a.slice_dynamic(&start, &[0], &[2, c as i32]).unwrap();
    assert_eq!(vals(&d), x[4 * c..6 * c].to_vec());
    // slice_update writes a block; the source is unchanged.
    let upd = uniform(&mut rng, 2 * 3, 5.0, 6.0);
    let u = a.slice_update(&arr(&upd, &[2, 3]), &[3, 4], &[5, 7], &[1, 1]).unwrap();
    let mut want = x.clone();
    for i in 0..2 {
        for j in 0..3 {
            want[(3 + i) * c + 4 + j] = upd[i * 3 + j];
        }
    }
    assert_eq!(vals(&u), want);
    assert_eq!(vals(&a), x);
    // Dynamic slice update (the KV-cache write).
    let row = uniform(&mut rng, c, 7.0, 8.0);
    let pos = Array::from_slice(&[6i32], &[1]).unwrap();
    let du = a.slice_update_dynamic(&arr(&row, &[1, c as i32]), &pos, &[0]).unwrap();
    let mut want = x.clone();
    want[6 * c..7 * c].copy_from_slice(&row);
    assert_eq!(vals(&du), want);
    // concatenate / stack / split.
    let top = a.slice(&[0, 0], &[4, c as i32], &[1, 1]).unwrap();
    let bottom = a.slice(&[4, 0], &[r as i32, c as i32], &[1, 1]).unwrap();
    assert_eq!(vals(&Array::concatenate(&[&top, &bottom], 0).unwrap()), x);
    let st = Array::stack(&[&top, &top], 1).unwrap();
    assert_eq!(st.shape(), vec![4, 2, c as i32]);
    let parts = a.split_at(&[2, 5], 0).unwrap();
    assert_eq!(parts.iter().map(|p| p.shape()[0]).collect::<Vec<_>>(), vec![2, 3, 4]);
    assert_eq!(vals(&parts[1]), x[2 * c..5 * c].to_vec());
    let thirds = a.split(3, 0).unwrap();
    assert_eq!(thirds.len(), 3);
    assert_eq!(vals(&thirds[2]), x[6 * c..].to_vec());
}

#[test]
fn indexing_sorting_selection() {
    init();
    let (mut rng, _) = rng("indexing_sorting_selection");
    let (vocab, dim) = (50usize, 8usize);
    let table = uniform(&mut rng, vocab * dim, -1.0, 1.0);
    let emb = arr(&table, &[vocab as i32, dim as i32]);
    let ids: Vec<u32> = (0..13).map(|_| rng.random_range(0..vocab as u32)).collect();
    let idx = Array::from_slice(&ids, &[1, 13]).unwrap();
    let got = emb.take(&idx, 0).unwrap();
    assert_eq!(got.shape(), vec![1, 13, dim as i32]);
    let want: Vec<f32> = ids.iter().flat_map(|&i| table[i as usize * dim..(i as usize + 1) * dim].to_vec()).collect();
    assert_eq!(vals(&got), want);
    // take_along_axis / put_along_axis on rows.
    let (rows, cols) = (4usize, 10usize);
    let x = uniform(&mut rng, rows * cols, -5.0, 5.0);
    let a = arr(&x, &[rows as i32, cols as i32]);
    let pick: Vec<i32> = (0..rows * 2).map(|_| rng.random_range(0..cols as i32)).collect();
    let pa = Array::from_slice(&pick, &[rows as i32, 2]).unwrap();
    let gathered = vals(&a.take_along_axis(&pa, 1).unwrap());
    for r in 0..rows {
        for j in 0..2 {
            assert_eq!(gathered[r * 2 + j], x[r * cols + pick[r * 2 + j] as usize]);
        }
    }
    let one: Vec<i32> = (0..rows).map(|_| rng.random_range(0..cols as i32)).collect();
    let put =
        a.put_along_axis(&Array::from_slice(&one, &[rows as i32, 1]).unwrap(), &arr(&[99.0], &[1, 1]), 1).unwrap();
    let mut want = x.clone();
    for r in 0..rows {
        want[r * cols + one[r] as usize] = 99.0;
    }
    assert_eq!(vals(&put), want);
    // sort / argsort.
    let sorted = vals(&a.sort(-1).unwrap());
    let order = a.argsort(-1).unwrap().to_vec::<u32>().unwrap();
    for r in 0..rows {
        let mut s = x[r * cols..(r + 1) * cols].to_vec();
        s.sort_by(f32::total_cmp);
        assert_eq!(&sorted[r * cols..(r + 1) * cols], s.as_slice());
        let via_order: Vec<f32> = order[r * cols..(r + 1) * cols].iter().map(|&i| x[r * cols + i as usize]).collect();
        assert_eq!(via_order, s);
    }
    // argpartition: position kth holds the kth smallest, smaller before, larger after.
    let kth = 3usize;
    let part = a.argpartition(kth as i32, -1).unwrap().to_vec::<u32>().unwrap();
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let mut s = row.to_vec();
        s.sort_by(f32::total_cmp);
        let p: Vec<f32> = part[r * cols..(r + 1) * cols].iter().map(|&i| row[i as usize]).collect();
        assert_eq!(p[kth], s[kth]);
        assert!(p[..kth].iter().all(|&v| v <= s[kth]) && p[kth + 1..].iter().all(|&v| v >= s[kth]));
    }
    // topk: the k largest values, any order.
    let k = 4usize;
    let top = vals(&a.topk(k as i32, -1).unwrap());
    for r in 0..rows {
        let mut s = x[r * cols..(r + 1) * cols].to_vec();
        s.sort_by(|p, q| q.total_cmp(p));
        let mut t = top[r * k..(r + 1) * k].to_vec();
        t.sort_by(|p, q| q.total_cmp(p));
        assert_eq!(t, s[..k].to_vec());
    }
    // Shuffled permutation round trip through take.
    let mut perm: Vec<u32> = (0..cols as u32).collect();
    perm.shuffle(&mut rng);
    let p = Array::from_slice(&perm, &[cols as i32]).unwrap();
    let inv = p.argsort(0).unwrap();
    assert_eq!(vals(&a.take(&p, 1).unwrap().take(&inv, 1).unwrap()), x);
}

#[test]
fn bad_shapes_and_dtypes_are_errors() {
    init();
    let a = arr(&[1.0; 6], &[2, 3]);
    let b = arr(&[1.0; 8], &[2, 4]);
    let err = a.matmul(&b).unwrap_err().to_string();
    assert!(err.starts_with("MLX matmul:"), "{err}");
    assert!(a.add(&b).is_err(), "broadcast mismatch");
    assert!(a.reshape(&[4, 2]).is_err(), "reshape to a different size");
    assert!(a.transpose(&[0, 0]).is_err(), "repeated transpose axis");
    assert!(a.sum(&[5], false).is_err(), "reduce over a missing axis");
    assert!(a.slice(&[0], &[1], &[1]).is_err(), "slice with too few dimensions");
    assert!(Array::concatenate(&[&a, &b], 0).is_err(), "concatenate mismatched shapes");
    assert!(a.split(4, 1).is_err(), "uneven split");
    assert!(a.take(&arr(&[0.0], &[1]), 0).is_err(), "float indices");
    assert!(a.squeeze(&[0]).is_err(), "squeeze a non-unit axis");
    assert!(a.softmax(&[3], false).is_err(), "softmax over a missing axis");
    let err = Array::from_slice(&[1.0f32; 5], &[2, 3]).unwrap_err().to_string();
    assert!(err.contains("20 bytes") && err.contains("24"), "{err}");
    assert!(Array::from_slice(&[1.0f32], &[-1]).is_err(), "negative dimension");
    let err = a.to_vec::<i32>().unwrap_err().to_string();
    assert_eq!(err, "to_vec: array has dtype float32, asked for int32");
    assert!(a.item::<f32>().is_err(), "item of a 6-element array");
    assert!(a.to_bools().is_err(), "to_bools of floats");
    // The process is still healthy after all of that.
    assert_eq!(vals(&a.add(&a).unwrap()), vec![2.0; 6]);
}

/// MLX's `gather_mm` (a mixture of experts' products) against gathering the
/// matrices and multiplying them: a plain f64 reference and MLX's own take
/// and matmul, with explicit, broadcast, sorted and absent indices.
#[test]
fn gather_mm_matches_gather_then_matmul() {
    init();
    let (mut rng, _) = rng("gather_mm_matches_gather_then_matmul");
    let (m, k, n) = (3usize, 16usize, 5usize);
    let (a, b) = (normal(&mut rng, 4 * m * k), normal(&mut rng, 6 * k * n));
    let (aa, ba) = (arr(&a, &[4, m as i32, k as i32]), arr(&b, &[6, k as i32, n as i32]));
    let reference = |pairs: &[(usize, usize)]| -> Vec<f32> {
        pairs
            .iter()
            .flat_map(|&(l, r)| ref_matmul(&a[l * m * k..(l + 1) * m * k], &b[r * k * n..(r + 1) * k * n], m, k, n))
            .collect()
    };
    let lhs = [0u32, 3, 1, 3, 2];
    let rhs = [5u32, 0, 2, 2, 1];
    let (li, ri) = (Array::from_slice(&lhs, &[5]).unwrap(), Array::from_slice(&rhs, &[5]).unwrap());
    let got = aa.gather_mm(&ba, Some(&li), Some(&ri), false).unwrap();
    assert_eq!(got.shape(), vec![5, m as i32, n as i32]);
    let pairs: Vec<(usize, usize)> = lhs.iter().zip(&rhs).map(|(&l, &r)| (l as usize, r as usize)).collect();
    assert_rms("gather_mm", &vals(&got), &reference(&pairs), matmul_tol(Dtype::F32));
    let via_take = aa.take(&li, 0).unwrap().matmul(&ba.take(&ri, 0).unwrap()).unwrap();
    assert_rms("gather_mm against take + matmul", &vals(&got), &vals(&via_take), matmul_tol(Dtype::F32));

    // Indices broadcast against each other: [2, 1] with [1, 3] gives [2, 3] products.
    let l2 = Array::from_slice(&[1u32, 2], &[2, 1]).unwrap();
    let r2 = Array::from_slice(&[4u32, 0, 3], &[1, 3]).unwrap();
    let got = aa.gather_mm(&ba, Some(&l2), Some(&r2), false).unwrap();
    assert_eq!(got.shape(), vec![2, 3, m as i32, n as i32]);
    let pairs: Vec<(usize, usize)> = [1, 2].iter().flat_map(|&l| [4, 0, 3].map(|r| (l, r))).collect();
    assert_rms("gather_mm broadcast", &vals(&got), &reference(&pairs), matmul_tol(Dtype::F32));

    // Ascending right-hand indices, promised sorted.
    let sorted = [0u32, 0, 2, 5, 5];
    let rs = Array::from_slice(&sorted, &[5]).unwrap();
    let got = aa.gather_mm(&ba, Some(&li), Some(&rs), true).unwrap();
    let pairs: Vec<(usize, usize)> = lhs.iter().zip(&sorted).map(|(&l, &r)| (l as usize, r as usize)).collect();
    assert_rms("gather_mm sorted", &vals(&got), &reference(&pairs), matmul_tol(Dtype::F32));

    // No indices: a batched matmul.
    let b4 = ba.slice(&[0, 0, 0], &[4, k as i32, n as i32], &[1, 1, 1]).unwrap();
    let got = aa.gather_mm(&b4, None, None, false).unwrap();
    let pairs: Vec<(usize, usize)> = (0..4).map(|i| (i, i)).collect();
    assert_rms("gather_mm without indices", &vals(&got), &reference(&pairs), matmul_tol(Dtype::F32));

    let wrong = arr(&normal(&mut rng, 7 * n), &[1, 7, n as i32]);
    assert!(aa.gather_mm(&wrong, None, None, false).is_err(), "inner dimensions differ");
}
