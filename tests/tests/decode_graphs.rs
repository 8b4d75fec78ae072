//! The graph of one steady decode step, per architecture: which nodes it
//! holds and how many. Each expectation below spells out the fusions the
//! step relies on (docs/kernels.md "Graph fusions"), so a change that loses
//! one (a norm no longer absorbed by the product after it, a residual no
//! longer folded into a projection, attention no longer one node per layer)
//! fails here with the histogram it produced. A fusion gained fails too:
//! update the expectation and the docs with it.
//!
//! The tiny models (tests/python/tiny_reference.py) have 3 layers; 4-bit
//! weights, so the quantized product kernels apply. The step counted is the
//! third (after a 12-token prompt and one decode step, which may grow a
//! sliding-window ring): its logits and its cache writes.

use std::collections::BTreeMap;

use mlxcel_runtime::models;
use mlxcel_tests::steps::last_step_ops;
use mlxcel_tests::tiny::tiny_model;

/// Layers of the tiny models.
const L: usize = 3;

fn check(arch: &str, bits: u32, expected: &[(&str, usize)]) {
    let dir = tempfile::tempdir().unwrap();
    let tiny = tiny_model(dir.path(), arch, bits, 1);
    assert_eq!(tiny.config.num_hidden_layers, L);
    let model = models::build(&tiny.config, &tiny.weights).unwrap();
    let prompt: Vec<u32> = (1..=12).collect();
    let ops = last_step_ops(model.as_ref(), &[&prompt, &[6], &[7]]);
    let mut got: BTreeMap<&str, usize> = BTreeMap::new();
    for op in &ops {
        *got.entry(op.as_str()).or_default() += 1;
    }
    let want: BTreeMap<&str, usize> = expected.iter().copied().filter(|&(_, n)| n > 0).collect();
    assert_eq!(got, want, "{arch} q{bits}: the nodes of a steady decode step changed");
}

/// Llama and Mistral: per layer, q/k/v as one product that normalises its
/// input itself (the input norm is absorbed), one cached-attention node
/// (RoPE, cache writes, attention, merged heads), o_proj adding the residual
/// as it writes, gate/up/SiLU as one product absorbing the post-attention
/// norm, down_proj adding the residual; then the embedding gather and the
/// tied head absorbing the final norm. Nothing of MLX's: the step runs inline.
const LLAMA: [(&str, usize); 6] = [
    ("MlxcelQuantizedGather", 1),
    ("MlxcelQuantizedLinearMulti", L),
    ("MlxcelCachedAttention", L),
    ("MlxcelQuantizedLinearAdd", 2 * L),
    ("MlxcelQuantizedGatedLinear", L),
    ("MlxcelQuantizedLinear", 1),
];

#[test]
fn llama() {
    check("llama", 4, &LLAMA);
}

#[test]
fn mistral() {
    // Sliding-window layers: the ring's slot is written in place, the same nodes.
    check("mistral", 4, &LLAMA);
}

#[test]
fn qwen3() {
    // Llama's step plus the per-head q and k RMS norms (two nodes per layer).
    let mut expected = LLAMA.to_vec();
    expected.push(("MlxcelRmsNorm", 2 * L));
    check("qwen3", 4, &expected);
}

#[test]
fn gemma3() {
    // Sandwich norms: o_proj and down_proj are plain products whose output
    // the post-norm normalises while adding the residual (RmsNormAdd); the
    // input and pre-feed-forward norms are absorbed by the products after
    // them; q/k norms per head; the tied head absorbs the final norm; the
    // embedding gather multiplies by sqrt(hidden) itself.
    check(
        "gemma3",
        4,
        &[
            ("MlxcelQuantizedGather", 1),
            ("MlxcelQuantizedLinearMulti", L),
            ("MlxcelRmsNorm", 2 * L),
            ("MlxcelCachedAttention", L),
            ("MlxcelQuantizedLinear", 2 * L + 1),
            ("MlxcelRmsNormAdd", 2 * L),
            ("MlxcelQuantizedGatedLinear", L),
        ],
    );
}

#[test]
fn qwen2() {
    // q/k/v have biases, which the fused product does not take: three plain
    // products, MLX's bias add (with its broadcast), and the head split
    // (reshape, transpose) per projection.
    check(
        "qwen2",
        4,
        &[
            ("MlxcelQuantizedGather", 1),
            ("MlxcelQuantizedLinear", 3 * L + 1),
            ("Add", 3 * L),
            ("Broadcast", 3 * L),
            ("Reshape", 3 * L),
            ("Transpose", 3 * L),
            ("MlxcelCachedAttention", L),
            ("MlxcelQuantizedLinearAdd", 2 * L),
            ("MlxcelQuantizedGatedLinear", L),
        ],
    );
}

#[test]
fn phi3() {
    // One qkv_proj (absorbing the input norm) split into q, k, v by MLX
    // (split, and reshape/transpose per part); one gate_up_proj (absorbing
    // the post-attention norm) split in two, then the SiLU product node.
    check(
        "phi3",
        4,
        &[
            ("MlxcelQuantizedGather", 1),
            ("MlxcelQuantizedLinear", 2 * L + 1),
            ("Split", 2 * L),
            ("Reshape", 3 * L),
            ("Transpose", 3 * L),
            ("MlxcelCachedAttention", L),
            ("MlxcelQuantizedLinearAdd", 2 * L),
            ("MlxcelSiluMul", L),
        ],
    );
}

#[test]
fn qwen3_moe() {
    // Qwen3's attention on every layer; layer 1 is a dense MLP (gate/up
    // product, down adding the residual). The two sparse layers route with
    // MLX's ops: the router product (absorbing the norm), softmax,
    // argpartition, the chosen weights (slice, gather, renormalising sum and
    // divide), gather_qmm for up, gate and down over the chosen experts
    // (with their index broadcasts), the SiLU product, and the weighted sum
    // (multiply, sum, add of the residual).
    let sparse = 2;
    check(
        "qwen3_moe",
        4,
        &[
            ("MlxcelQuantizedGather", 1),
            ("MlxcelQuantizedLinearMulti", L),
            ("MlxcelRmsNorm", 2 * L + sparse),
            ("MlxcelCachedAttention", L),
            ("MlxcelQuantizedLinearAdd", L + (L - sparse)),
            ("MlxcelQuantizedGatedLinear", L - sparse),
            ("MlxcelQuantizedLinear", sparse + 1),
            ("Softmax", sparse),
            ("ArgPartition", sparse),
            ("Slice", sparse),
            ("GatherAxis", sparse),
            ("Sum", 2 * sparse),
            ("Divide", sparse),
            ("ExpandDims", 2 * sparse),
            ("Arange", 3 * sparse),
            ("Broadcast", 4 * sparse),
            ("Reshape", 3 * sparse),
            ("GatherQMM", 3 * sparse),
            ("MlxcelSiluMul", sparse),
            ("Squeeze", 2 * sparse),
            ("Multiply", sparse),
            ("Add", sparse),
        ],
    );
}
