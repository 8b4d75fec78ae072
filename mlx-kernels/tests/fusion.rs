//! The graph fusions of mlxcel's kernel nodes (docs/kernels.md, "Fusion"):
//! a product absorbing the RMS norm before it, residual adds folded into
//! products and norms, attention reading cache buffers without slice nodes
//! and writing merged heads. Each fused graph must give the bits of the same
//! graph unfused (MLX's ops between our kernels), with 1 and 2 threads.

mod common;

use common::*;
use mlxcel_mlx::fast::{self, GateActivation};
use mlxcel_mlx::{Array, AttentionMask, Quantized};
use rand::rngs::StdRng;

/// The inputs of the fusion tests: a `[1, 6, 128]` x, a norm weight, 4-bit
/// q/k/v weights of 4 and 2 heads of 32 and 8-bit gate/up weights, all
/// computed already (so that pending_ops shows only the nodes under test).
struct FusionCase {
    x: Array,
    norm: Array,
    wq: Quantized,
    wk: Quantized,
    wv: Quantized,
    wg: Quantized,
    wu: Quantized,
}

const FUSION_SHAPE: (i32, i32, i32, i32, i32, i32) = (1, 6, 128, 4, 2, 32);

fn fusion_case(rng: &mut StdRng) -> FusionCase {
    let (b, l, dim, heads, kvh, hd) = FUSION_SHAPE;
    let wq = quantized(rng, (heads * hd) as usize, dim as usize, 32, 4);
    let wk = quantized(rng, (kvh * hd) as usize, dim as usize, 32, 4);
    let wv = quantized(rng, (kvh * hd) as usize, dim as usize, 32, 4);
    let (wg, wu) = (quantized(rng, 96, dim as usize, 64, 8), quantized(rng, 96, dim as usize, 64, 8));
    for q in [&wq, &wk, &wv, &wg, &wu] {
        Array::eval_all(&[&q.weight, &q.scales, q.biases.as_ref().unwrap()]).unwrap();
    }
    let norm = arr(&uniform(rng, dim as usize, 0.5, 1.5), &[dim]);
    let x = arr(&normal(rng, (b * l * dim) as usize), &[b, l, dim]);
    Array::eval_all(&[&norm, &x]).unwrap();
    FusionCase { x, norm, wq, wk, wv, wg, wu }
}

/// Fusion rule 1: a projection of our RMS norm's output absorbs the norm
/// (q/k/v in one node, and the gated projection): the norm node is never
/// built into the graph, and the values are the unfused graph's bit for bit.
#[test]
fn fusion_product_absorbs_norm() {
    init();
    let (mut rng, _) = rng("fusion_product_absorbs_norm");
    let c = fusion_case(&mut rng);
    let (_, _, _, heads, kvh, _) = FUSION_SHAPE;
    each_thread_count(|threads| {
        let h = kernel().rms_norm(&c.x, Some(&c.norm), 1e-5).unwrap();
        let fused = kernel().quantized_linear_heads(&h, &[(&c.wq, heads), (&c.wk, kvh), (&c.wv, kvh)]).unwrap();
        let outputs: Vec<&Array> = fused.iter().collect();
        assert_eq!(fast::pending_ops(&outputs), vec!["MlxcelQuantizedLinearMulti".to_string()]);
        let gated = kernel().quantized_gated_linear(&h, &c.wg, &c.wu, GateActivation::Silu).unwrap();
        assert_eq!(fast::pending_ops(&[&gated]), vec!["MlxcelQuantizedGatedLinear".to_string()]);
        h.eval().unwrap();
        let unfused = kernel().quantized_linear_heads(&h, &[(&c.wq, heads), (&c.wk, kvh), (&c.wv, kvh)]).unwrap();
        for (f, u) in fused.iter().zip(&unfused) {
            assert_eq!(vals(f), vals(u), "norm absorbed into q/k/v, {threads} thread(s)");
        }
        let gated_unfused = kernel().quantized_gated_linear(&h, &c.wg, &c.wu, GateActivation::Silu).unwrap();
        assert_eq!(vals(&gated), vals(&gated_unfused), "norm absorbed into gate/up, {threads} thread(s)");
    });
}

/// Fusion rule 2: a residual added to a pending plain product (either side;
/// the product's input normalised too) or to a pending RMS norm (Gemma's
/// post-norms) is one node with the bits of the separate add. A norm that
/// adds a residual is not absorbed into a later product as a plain norm
/// would be, and shapes that only broadcast stay MLX's add.
#[test]
fn fusion_residual_add() {
    init();
    let (mut rng, _) = rng("fusion_residual_add");
    let c = fusion_case(&mut rng);
    let (b, l, dim, heads, _, hd) = FUSION_SHAPE;
    let r = arr(&normal(&mut rng, (b * l * heads * hd) as usize), &[b, l, heads * hd]);
    let rn = arr(&normal(&mut rng, (b * l * dim) as usize), &[b, l, dim]);
    Array::eval_all(&[&r, &rn]).unwrap();
    each_thread_count(|threads| {
        // The unfused norm, computed with the kernels (ISA) the fused nodes use.
        let h = kernel().rms_norm(&c.x, Some(&c.norm), 1e-5).unwrap();
        h.eval().unwrap();
        for residual_first in [false, true] {
            let add = |p: &Array, r: &Array| {
                if residual_first { kernel().add(r, p).unwrap() } else { kernel().add(p, r).unwrap() }
            };
            let plain_add = |p: &Array, r: &Array| if residual_first { r.add(p).unwrap() } else { p.add(r).unwrap() };
            let normed = kernel().rms_norm(&c.x, Some(&c.norm), 1e-5).unwrap();
            let sum = add(&kernel().quantized_linear(&normed, &c.wq).unwrap(), &r);
            assert_eq!(fast::pending_ops(&[&sum]), vec!["MlxcelQuantizedLinearAdd".to_string()]);
            let want = plain_add(&kernel().quantized_linear(&h, &c.wq).unwrap(), &r);
            assert_eq!(vals(&sum), vals(&want), "residual into the product, {threads} thread(s)");

            let n = kernel().rms_norm(&c.x, Some(&c.norm), 1e-5).unwrap();
            let sum = add(&n, &rn);
            assert_eq!(fast::pending_ops(&[&sum]), vec!["MlxcelRmsNormAdd".to_string()]);
            let after = kernel().quantized_linear(&sum, &c.wg).unwrap();
            let mut ops = fast::pending_ops(&[&after]);
            ops.sort();
            assert_eq!(ops, vec!["MlxcelQuantizedLinear", "MlxcelRmsNormAdd"]);
            assert_eq!(vals(&sum), vals(&plain_add(&h, &rn)), "residual into the norm, {threads} thread(s)");
        }
    });
    let row = arr(&normal(&mut rng, (heads * hd) as usize), &[heads * hd]);
    let broadcast = kernel().add(&kernel().quantized_linear(&c.x, &c.wq).unwrap(), &row).unwrap();
    assert!(fast::pending_ops(&[&broadcast]).iter().any(|o| o == "Add"));
}

/// Key and value buffers `[b, kvh, 16, hd]` of a cache and their first 9
/// positions as MLX slices (what a KV cache hands attention).
fn cache_prefix_views(rng: &mut StdRng) -> (Array, Array, Array, Array) {
    let (b, _, _, _, kvh, hd) = FUSION_SHAPE;
    let (cap, lk) = (16, 9);
    let kbuf = arr(&normal(rng, (b * kvh * cap * hd) as usize), &[b, kvh, cap, hd]);
    let vbuf = arr(&normal(rng, (b * kvh * cap * hd) as usize), &[b, kvh, cap, hd]);
    Array::eval_all(&[&kbuf, &vbuf]).unwrap();
    let k = kbuf.slice(&[0, 0, 0, 0], &[b, kvh, lk, hd], &[1, 1, 1, 1]).unwrap();
    let v = vbuf.slice(&[0, 0, 0, 0], &[b, kvh, lk, hd], &[1, 1, 1, 1]).unwrap();
    (kbuf, vbuf, k, v)
}

/// Queries `[1, 4, 6, 32]`, computed.
fn fusion_queries(rng: &mut StdRng) -> Array {
    let (b, l, _, heads, _, hd) = FUSION_SHAPE;
    let q = arr(&normal(rng, (b * heads * l * hd) as usize), &[b, heads, l, hd]);
    q.eval().unwrap();
    q
}

/// Fusion rule 3: attention over slices of the first positions of cache
/// buffers reads the buffers (no slice node), with the bits of attention
/// over contiguous copies of those positions.
#[test]
fn fusion_attention_reads_cache_prefix() {
    init();
    let (mut rng, _) = rng("fusion_attention_reads_cache_prefix");
    let (_kbuf, _vbuf, k, v) = cache_prefix_views(&mut rng);
    let q = fusion_queries(&mut rng);
    let (kc, vc) = (k.contiguous().unwrap(), v.contiguous().unwrap());
    Array::eval_all(&[&kc, &vc]).unwrap();
    each_thread_count(|threads| {
        for mask in [AttentionMask::Causal, AttentionMask::None] {
            let att = kernel().scaled_dot_product_attention(&q, &k, &v, 0.25, mask).unwrap();
            assert_eq!(fast::pending_ops(&[&att]), vec!["MlxcelAttention".to_string()], "slices absorbed");
            let want = kernel().scaled_dot_product_attention(&q, &kc, &vc, 0.25, mask).unwrap();
            assert_eq!(vals(&att), vals(&want), "attention over buffer prefixes, {threads} thread(s)");
        }
    });
    // A slice that is not a prefix of axis 2 stays a slice node.
    let (b, _, _, _, kvh, hd) = FUSION_SHAPE;
    let (kbuf, vbuf, _, _) = cache_prefix_views(&mut rng);
    let k = kbuf.slice(&[0, 0, 1, 0], &[b, kvh, 9, hd], &[1, 1, 1, 1]).unwrap();
    let v = vbuf.slice(&[0, 0, 1, 0], &[b, kvh, 9, hd], &[1, 1, 1, 1]).unwrap();
    let att = kernel().scaled_dot_product_attention(&q, &k, &v, 0.25, AttentionMask::None).unwrap();
    assert_eq!(fast::pending_ops(&[&att]).iter().filter(|o| *o == "Slice").count(), 2);
}

/// Fusion rule 4: merge_heads of a pending attention node makes it write
/// `[B, L, H·D]`, with the bits of MLX's transpose and reshape of its output.
#[test]
fn fusion_merge_heads_into_attention() {
    init();
    let (mut rng, _) = rng("fusion_merge_heads_into_attention");
    let (b, l, _, heads, _, hd) = FUSION_SHAPE;
    let (_kbuf, _vbuf, k, v) = cache_prefix_views(&mut rng);
    let q = fusion_queries(&mut rng);
    each_thread_count(|threads| {
        for mask in [AttentionMask::Causal, AttentionMask::None] {
            let att = kernel().scaled_dot_product_attention(&q, &k, &v, 0.25, mask).unwrap();
            let merged = kernel().merge_heads(&att).unwrap();
            assert_eq!(merged.shape(), vec![b, l, heads * hd]);
            assert_eq!(fast::pending_ops(&[&merged]), vec!["MlxcelAttention".to_string()]);
            let plain = kernel().scaled_dot_product_attention(&q, &k, &v, 0.25, mask).unwrap();
            plain.eval().unwrap();
            let want = plain.transpose(&[0, 2, 1, 3]).unwrap().reshape(&[b, l, heads * hd]).unwrap();
            assert_eq!(vals(&merged), vals(&want), "merged heads, {threads} thread(s)");
            assert_eq!(vals(&mlx().merge_heads(&plain).unwrap()), vals(&want));
            // Computed already: nothing to rewrite, so the kernel path refuses.
            assert!(kernel().merge_heads(&plain).is_err());
        }
    });
}
