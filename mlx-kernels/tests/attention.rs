//! mlxcel's attention kernels (`Path::Kernel`) against MLX's attention
//! (`Path::Mlx`) and plain-Rust references: every mask kind, grouped-query
//! heads, strided cache views, decode and prefill shapes, and the cached
//! attention step (rope, cache write and attention in one node), for every
//! ISA this CPU has with one and two threads. Tolerances as in kernels.rs:
//! ε = 2⁻²⁴, sums of n terms within 8·sqrt(n)·ε of their magnitudes.

mod common;

use common::*;
use mlxcel_mlx::fast;
use mlxcel_mlx::{Array, AttentionMask, Dtype};
use rand::Rng;

/// Attention over the keys of a growing cache buffer (a strided view), every
/// mask kind, grouped-query heads, decode (1-2 queries) and prefill blocks.
#[test]
fn attention_matches_mlx_masks_gqa_and_strides() {
    init();
    let (mut rng, _) = rng("attention_matches_mlx_masks_gqa_and_strides");
    let b = 2i32;
    for (h, kvh) in [(6i32, 2i32), (4, 1), (3, 3)] {
        for dim in [64i32, 40] {
            for (lq, lk) in [(1i32, 37i32), (2, 2), (7, 20), (45, 45), (33, 70)] {
                let cap = lk + 9;
                let q = arr(&normal(&mut rng, (b * lq * h * dim) as usize), &[b, lq, h, dim])
                    .transpose(&[0, 2, 1, 3])
                    .unwrap();
                let kbuf = arr(&normal(&mut rng, (b * kvh * cap * dim) as usize), &[b, kvh, cap, dim]);
                let vbuf = arr(&normal(&mut rng, (b * kvh * cap * dim) as usize), &[b, kvh, cap, dim]);
                let k = kbuf.slice(&[0, 0, 0, 0], &[b, kvh, lk, dim], &[1, 1, 1, 1]).unwrap();
                let v = vbuf.slice(&[0, 0, 0, 0], &[b, kvh, lk, dim], &[1, 1, 1, 1]).unwrap();
                let mut bools: Vec<bool> = (0..lq * lk).map(|_| rng.random_bool(0.7)).collect();
                // One query sees nothing: MLX then averages all values.
                bools[..lk as usize].fill(false);
                let bool_mask = Array::from_bools(&bools, &[lq, lk]).unwrap();
                let add_mask = arr(&uniform(&mut rng, (h * lq * lk) as usize, -3.0, 0.0), &[1, h, lq, lk]);
                let masks = [
                    ("none", AttentionMask::None),
                    ("causal", AttentionMask::Causal),
                    ("bool", AttentionMask::Array(&bool_mask)),
                    ("additive", AttentionMask::Array(&add_mask)),
                ];
                let scale = 1.0 / (dim as f32).sqrt();
                for (mname, mask) in masks {
                    let want = vals(&mlx().scaled_dot_product_attention(&q, &k, &v, scale, mask).unwrap());
                    let vmax = vals(&v.contiguous().unwrap()).iter().fold(0f32, |a, &x| a.max(x.abs()));
                    each_config(|cfg| {
                        let got = kernel().scaled_dot_product_attention(&q, &k, &v, scale, mask).unwrap();
                        assert_eq!(got.shape(), vec![b, h, lq, dim]);
                        // Outputs are convex combinations of value rows. Scores
                        // (|s| ≲ 10 here) carry ~8·sqrt(D)·ε·|s| error, which
                        // moves the weights by as much relatively; the weighted
                        // sum adds ~sqrt(Lk)·ε. Bound: 2e-5 of the largest |v|.
                        assert_close(
                            &format!("{cfg} h={h}/{kvh} d={dim} lq={lq} lk={lk} mask={mname}"),
                            &vals(&got),
                            &want,
                            0.0,
                            2e-5 * vmax,
                        );
                    });
                }
            }
        }
    }
}

/// One attention step over cache buffers (rope, cache write, attention in
/// one node) against MLX's rope, slice_update and attention: decode into a
/// growing buffer and into a full ring, causal prefill chunks, grouped-query
/// heads, partial and traditional rotations, explicit wavelengths; two
/// sequences per batch, each with its own buffers (of different capacities)
/// and positions.
#[test]
fn cached_attention_matches_mlx() {
    init();
    let (mut rng, _) = rng("cached_attention_matches_mlx");
    let (b, cap) = (2i32, 33i32);
    let freqs = arr(&uniform(&mut rng, 16, 1.0, 5000.0), &[16]);
    // (queries, slot, visible, causal)
    let steps = [(1i32, 20usize, 21usize, false), (1, 5, 33, false), (7, 13, 20, true), (5, 0, 5, true)];
    for (h, kvh) in [(6i32, 2i32), (3, 3)] {
        for dim in [64i32, 40] {
            for (l, slot, visible, causal) in steps {
                for (dims, traditional, use_freqs) in [(dim, false, false), (32, true, false), (32, false, true)] {
                    let q = arr(&normal(&mut rng, (b * l * h * dim) as usize), &[b, l, h, dim])
                        .transpose(&[0, 2, 1, 3])
                        .unwrap();
                    let k = arr(&normal(&mut rng, (b * kvh * l * dim) as usize), &[b, kvh, l, dim]);
                    let v = arr(&normal(&mut rng, (b * kvh * l * dim) as usize), &[b, kvh, l, dim]);
                    let bufs = cache_buffers(&mut rng, b, kvh, cap, dim);
                    let before: Vec<(Vec<f32>, Vec<f32>)> = bufs.iter().map(|(kb, vb)| (vals(kb), vals(vb))).collect();
                    let rope = rope_spec(dims, traditional, use_freqs.then_some(&freqs));
                    let rows = cache_rows(&bufs, slot, visible, causal);
                    let scale = 1.0 / (dim as f32).sqrt();
                    let want = mlx().cached_attention(&q, &k, &v, &rope, &rows, scale).unwrap();
                    let want_out = vals(&want.out);
                    let want_kv: Vec<(Vec<f32>, Vec<f32>)> =
                        want.caches.iter().map(|(kb, vb)| (vals(kb), vals(vb))).collect();
                    let what = format!("h={h}/{kvh} d={dim} l={l} slot={slot} visible={visible} dims={dims}");
                    each_config(|cfg| {
                        let got = kernel().cached_attention(&q, &k, &v, &rope, &rows, scale).unwrap();
                        assert_eq!(fast::pending_ops(&[&got.out]), vec!["MlxcelCachedAttention".to_string()]);
                        assert_eq!(got.out.shape(), vec![b, l, h * dim]);
                        for (row, ((kb, vb), (want_k, want_v))) in got.caches.iter().zip(&want_kv).enumerate() {
                            // Keys: RoPE as in rope_matches_mlx_every_variant;
                            // values and the untouched positions are copies.
                            let what = format!("{cfg} {what} row {row}");
                            assert_close(&format!("{what} keys"), &vals(kb), want_k, 4.0 * EPS, 1e-6);
                            assert_eq!(&vals(vb), want_v, "{what} values");
                        }
                        // As attention_matches_mlx_masks_gqa_and_strides (|v| ≲ 5).
                        assert_close(&format!("{cfg} {what} out"), &vals(&got.out), &want_out, 0.0, 1e-4);
                    });
                    // The test still holds the buffers: they were copied, not written.
                    for ((kb, vb), (k0, v0)) in bufs.iter().zip(&before) {
                        assert_eq!(&vals(kb), k0, "{what}: a shared key buffer was written");
                        assert_eq!(&vals(vb), v0, "{what}: a shared value buffer was written");
                    }
                }
            }
        }
    }
}

/// Batch invariance of a cached attention step: each row of a batch of
/// sequences at different positions, with buffers of different capacities,
/// gives exactly the bits (output and buffers) of that row alone, on every
/// ISA with 1 and 2 threads; the batch is one node and runs inline.
#[test]
fn cached_attention_rows_match_alone() {
    init();
    let (mut rng, _) = rng("cached_attention_rows_match_alone");
    let (h, kvh, d) = (4i32, 2i32, 32i32);
    let rope = fast::RopeSpec { dims: d, traditional: false, base: 10000.0, scale: 1.0, freqs: None };
    for (b, l) in [(2i32, 1i32), (3, 1), (9, 1), (3, 4)] {
        let q = arr(&normal(&mut rng, (b * h * l * d) as usize), &[b, h, l, d]);
        let k = arr(&normal(&mut rng, (b * kvh * l * d) as usize), &[b, kvh, l, d]);
        let v = arr(&normal(&mut rng, (b * kvh * l * d) as usize), &[b, kvh, l, d]);
        let bufs: Vec<(Array, Array)> = (0..b)
            .map(|row| {
                let c = 16 + 5 * row;
                let mut buf = || arr(&normal(&mut rng, (kvh * c * d) as usize), &[1, kvh, c, d]);
                (buf(), buf())
            })
            .collect();
        for (kb, vb) in &bufs {
            Array::eval_all(&[kb, vb]).unwrap();
        }
        // Row r writes at 3 + r and sees everything up to its queries (causal).
        let rows: Vec<fast::CacheRow> = bufs
            .iter()
            .enumerate()
            .map(|(r, (keys, values))| {
                let slot = 3 + r;
                fast::CacheRow {
                    offset: 100 * r + slot,
                    cache: fast::CacheSlot { keys, values, slot, visible: slot + l as usize, causal: true },
                }
            })
            .collect();
        let row_of = |a: &Array, r: i32| {
            let s = a.shape();
            a.slice(&[r, 0, 0, 0], &[r + 1, s[1], s[2], s[3]], &[1, 1, 1, 1]).unwrap().contiguous().unwrap()
        };
        each_config(|cfg| {
            let batch = kernel().cached_attention(&q, &k, &v, &rope, &rows, 0.2).unwrap();
            let mut outputs = vec![&batch.out];
            outputs.extend(batch.caches.iter().flat_map(|(kb, vb)| [kb, vb]));
            assert_eq!(fast::pending_ops(&outputs), vec!["MlxcelCachedAttention".to_string()], "{cfg}");
            assert!(fast::eval_inline(&outputs).unwrap(), "{cfg}: a batched step runs inline");
            let out = vals(&batch.out);
            let per_row = (l * h * d) as usize;
            for (r, row) in rows.iter().enumerate() {
                let one = [fast::CacheRow { offset: row.offset, cache: fast::CacheSlot { ..row.cache } }];
                let (qr, kr, vr) = (row_of(&q, r as i32), row_of(&k, r as i32), row_of(&v, r as i32));
                let alone = kernel().cached_attention(&qr, &kr, &vr, &rope, &one, 0.2).unwrap();
                let what = format!("{cfg} b={b} l={l} row {r}");
                assert_eq!(&out[r * per_row..(r + 1) * per_row], &vals(&alone.out)[..], "{what}: output");
                assert_eq!(vals(&batch.caches[r].0), vals(&alone.caches[0].0), "{what}: keys");
                assert_eq!(vals(&batch.caches[r].1), vals(&alone.caches[0].1), "{what}: values");
            }
        });
    }
}

/// A cache buffer nothing else holds is written in place: no copy per step.
#[test]
fn cached_attention_updates_unshared_buffers_in_place() {
    init();
    let (mut rng, _) = rng("cached_attention_updates_unshared_buffers_in_place");
    let (h, d, cap) = (4i32, 16i32, 64i32);
    let rope = fast::RopeSpec { dims: d, traditional: false, base: 10000.0, scale: 1.0, freqs: None };
    // One sequence, then a batch of two (each with its own buffers).
    for b in [1usize, 2] {
        let mut bufs: Vec<(Array, Array)> = (0..b)
            .map(|_| {
                (Array::zeros(&[1, h, cap, d], Dtype::F32).unwrap(), Array::zeros(&[1, h, cap, d], Dtype::F32).unwrap())
            })
            .collect();
        for (kb, vb) in &bufs {
            Array::eval_all(&[kb, vb]).unwrap();
        }
        let addrs: Vec<(usize, usize)> =
            bufs.iter().map(|(kb, vb)| (kb.data_address().unwrap(), vb.data_address().unwrap())).collect();
        let mut values = Vec::new();
        for pos in 0..5usize {
            let n = b * (h * d) as usize;
            let q = arr(&normal(&mut rng, n), &[b as i32, h, 1, d]);
            let k = arr(&normal(&mut rng, n), &[b as i32, h, 1, d]);
            let v = arr(&normal(&mut rng, n), &[b as i32, h, 1, d]);
            values.push(vals(&v));
            let rows: Vec<fast::CacheRow> = bufs
                .iter()
                .map(|(keys, values)| fast::CacheRow {
                    offset: pos,
                    cache: fast::CacheSlot { keys, values, slot: pos, visible: pos + 1, causal: false },
                })
                .collect();
            let step = kernel().cached_attention(&q, &k, &v, &rope, &rows, 0.25).unwrap();
            drop(rows);
            bufs = step.caches;
            let mut outputs = vec![&step.out];
            outputs.extend(bufs.iter().flat_map(|(kb, vb)| [kb, vb]));
            Array::eval_all(&outputs).unwrap();
            for (row, ((kb, vb), (k_addr, v_addr))) in bufs.iter().zip(&addrs).enumerate() {
                assert_eq!(kb.data_address().unwrap(), *k_addr, "b={b} step {pos}: row {row}'s key buffer moved");
                assert_eq!(vb.data_address().unwrap(), *v_addr, "b={b} step {pos}: row {row}'s value buffer moved");
            }
        }
        // Every step's values are in their slots, [1, h, cap, d] per row.
        let per_row = (h * d) as usize;
        for (row, (_, vb)) in bufs.iter().enumerate() {
            let all = vals(vb);
            for (pos, v) in values.iter().enumerate() {
                let v = &v[row * per_row..(row + 1) * per_row];
                for head in 0..h as usize {
                    let at = (head * cap as usize + pos) * d as usize;
                    let want = &v[head * d as usize..(head + 1) * d as usize];
                    assert_eq!(&all[at..at + d as usize], want, "b={b} row {row} slot {pos}");
                }
            }
        }
    }
}

/// Shapes that cannot be a cache step are errors on every path.
#[test]
fn cached_attention_rejects_inconsistent_steps() {
    init();
    let buf = Array::zeros(&[1, 2, 8, 16], Dtype::F32).unwrap();
    let q = Array::zeros(&[1, 4, 2, 16], Dtype::F32).unwrap();
    let kv = Array::zeros(&[1, 2, 2, 16], Dtype::F32).unwrap();
    let rope = fast::RopeSpec { dims: 16, traditional: false, base: 10000.0, scale: 1.0, freqs: None };
    let cases =
        [(7usize, 8usize, false, "do not fit"), (0, 9, false, "visible positions"), (2, 6, true, "causal step")];
    for path in [kernel(), mlx()] {
        for (slot, visible, causal, message) in cases {
            let cache = fast::CacheSlot { keys: &buf, values: &buf, slot, visible, causal };
            let err = path
                .cached_attention(&q, &kv, &kv, &rope, &[fast::CacheRow { offset: 0, cache }], 1.0)
                .err()
                .expect("an error");
            assert!(err.to_string().contains(message), "{err}");
        }
        let wrong = Array::zeros(&[1, 3, 8, 16], Dtype::F32).unwrap();
        let cache = fast::CacheSlot { keys: &wrong, values: &buf, slot: 0, visible: 2, causal: true };
        let err = path
            .cached_attention(&q, &kv, &kv, &rope, &[fast::CacheRow { offset: 0, cache }], 1.0)
            .err()
            .expect("an error");
        assert!(err.to_string().contains("cache buffers"), "{err}");
    }
}
