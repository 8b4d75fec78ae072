//! How prefill pieces change bits, and what the engine relies on instead.
//!
//! Splitting a prefill at an arbitrary point does NOT give the bits of the
//! whole prefill on the CPU kernels. Measured (avx512 build, 2026-12-02) on a
//! 40-token prompt, prefilling `p[..k]`, then `p[k..39]`, then decoding
//! `p[39]`, against prefilling `p[..39]` and decoding `p[39]`: the logits
//! differed for Llama 4-bit at k = 1..=8 and 31..=38 (whenever one piece has
//! 8 rows or fewer: most likely the quantized product, which takes its
//! matvec up to 8 rows and a GEMM past that), for Llama float at k = 2, 37
//! and 38 (MLX's float matmul and attention change accumulation with the
//! shape), and for Gemma 3 4-bit at every k (a sliding-window prefill chunk
//! attends over the cached window plus itself: a differently shaped masked
//! attention).
//!
//! So the engine always prefills in chunks that start at multiples of the
//! chunk size, and its prefix cache reuses only whole chunks: a cached
//! sequence cut back to a multiple of the chunk and continued in chunks gives
//! exactly the bits of a fresh sequence prefilled in the same chunks. That
//! is checked here, with a sliding-window model whose ring has not wrapped
//! (it can be cut back) and one whose ring has (it cannot).

use mlxcel_runtime::backend::{Backend, MlxBackend, MlxOptions, SeqId};
use mlxcel_runtime::models;
use mlxcel_tests::isa::each_kernel_build;
use mlxcel_tests::tiny::tiny_model;

fn bits(logits: &[f32]) -> Vec<u32> {
    logits.iter().map(|x| x.to_bits()).collect()
}

/// Prefills `tokens` (positions `from..`) in chunks that start at multiples of `chunk`.
fn prefill_aligned(backend: &mut MlxBackend, seq: SeqId, tokens: &[u32], from: usize, chunk: usize) {
    let mut at = from;
    while at < tokens.len() {
        let end = ((at / chunk + 1) * chunk).min(tokens.len());
        backend.prefill(seq, &tokens[at..end], false).unwrap();
        at = end;
    }
}

/// The logits of decoding `prompt`'s last token after prefilling the rest in
/// aligned chunks, then `steps` greedy tokens: bits per step.
fn run(backend: &mut MlxBackend, seq: SeqId, prompt: &[u32], from: usize, chunk: usize, steps: usize) -> Vec<Vec<u32>> {
    let n = prompt.len();
    prefill_aligned(backend, seq, &prompt[..n - 1], from, chunk);
    let mut input = prompt[n - 1];
    let mut out = Vec::new();
    for _ in 0..steps {
        let l = backend.decode(&[(seq, input)]).unwrap().into_first().unwrap();
        input = mlxcel_runtime::sampler::argmax(&l);
        out.push(bits(&l));
    }
    out
}

/// A cached sequence (`first` prompt, `decoded` steps) cut back to `len` and
/// continued with `second` equals `second` from scratch; `None` when the
/// cache cannot be cut back that far.
fn reuse_equals_fresh(
    arch: &str,
    q: u32,
    first: &[u32],
    decoded: usize,
    second: &[u32],
    len: usize,
    chunk: usize,
) -> bool {
    let dir = tempfile::tempdir().unwrap();
    let tiny = tiny_model(dir.path(), arch, q, 1);
    let mut cut = false;
    each_kernel_build(|build, _| {
        let model = models::build(&tiny.config, &tiny.weights).unwrap();
        let mut backend = MlxBackend::new(model, MlxOptions::default()).unwrap();
        let fresh_seq = backend.new_sequence();
        let fresh = run(&mut backend, fresh_seq, second, 0, chunk, 4);
        let cached = backend.new_sequence();
        run(&mut backend, cached, first, 0, chunk, decoded);
        cut = backend.can_truncate(cached, len).unwrap();
        if !cut {
            assert!(backend.truncate(cached, len).is_err());
            return;
        }
        backend.truncate(cached, len).unwrap();
        assert_eq!(backend.position(cached).unwrap(), len);
        let reused = run(&mut backend, cached, second, len, chunk, 4);
        assert!(reused == fresh, "{arch} q{q} {build}: reusing {len} positions changes the logits");
    });
    cut
}

fn tokens(n: usize, salt: usize) -> Vec<u32> {
    (0..n).map(|j| ((j * 37 + 11 + salt * (j / 24) * 13) % 250) as u32).collect()
}

#[test]
fn llama_q4_reused_whole_chunks_equal_fresh() {
    // The two prompts share 24 tokens; chunks of 8: three are reused.
    assert!(reuse_equals_fresh("llama", 4, &tokens(40, 1), 5, &tokens(37, 2), 24, 8));
}

#[test]
fn llama_f32_reused_whole_chunks_equal_fresh() {
    assert!(reuse_equals_fresh("llama", 0, &tokens(40, 1), 5, &tokens(37, 2), 16, 8));
}

#[test]
fn gemma3_ring_reused_before_it_wraps() {
    // Window 8: a first sequence of 6 prompt tokens and 1 decoded holds 6
    // positions, unwrapped; 4 are reused.
    assert!(reuse_equals_fresh("gemma3", 4, &tokens(6, 0), 1, &tokens(11, 0), 4, 4));
    // 20 positions: the ring has wrapped and cannot be cut back.
    assert!(!reuse_equals_fresh("gemma3", 4, &tokens(16, 0), 5, &tokens(20, 0), 8, 4));
}
