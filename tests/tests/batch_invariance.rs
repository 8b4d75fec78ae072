//! Batch invariance: a sequence's logits do not depend on which other
//! sequences share its decode steps. Eight sequences with prompts of
//! different lengths decode together, joining the batch at different steps
//! (as a server's continuous batching admits them), and each one's logits at
//! every step must have exactly the bits of the same sequence decoded alone.
//! Exact equality is the requirement, not a tolerance: it is what makes
//! concurrent greedy output equal to serial output.
//!
//! Checked on every kernel build the CPU has, for quantized weights (mlxcel's
//! product kernels: decode rows take the row-independent matvec whatever the
//! batch size), float weights (MLX's matmul), sliding-window rings that wrap
//! while decoding (Gemma 3, window 8), and the engine, whose concurrent
//! greedy answers must equal serial ones.

use mlxcel_runtime::backend::{Backend, MlxBackend, MlxOptions, SeqId};
use mlxcel_runtime::engine::{Engine, EngineOptions, Request};
use mlxcel_runtime::generate::GenerationOptions;
use mlxcel_runtime::loader::LoadOptions;
use mlxcel_runtime::models;
use mlxcel_runtime::sampler::argmax;
use mlxcel_tests::isa::each_kernel_build;
use mlxcel_tests::tiny::{TinyModel, tiny_model};
use mlxcel_tests::tiny_bundle;

/// Sequences decoded together.
const SEQUENCES: usize = 8;
/// Decode steps per sequence.
const STEPS: usize = 6;

/// Prompt `i`: 3 + 2i tokens (3 to 17: some past Gemma's window of 8).
fn prompt(i: usize) -> Vec<u32> {
    (0..3 + 2 * i).map(|j| ((i * 31 + j * 7 + 1) % 250) as u32).collect()
}

/// A new sequence holding all of `prompt` but its last token (which the
/// first decode step feeds, as generation does).
fn start(backend: &mut MlxBackend, prompt: &[u32]) -> SeqId {
    let seq = backend.new_sequence();
    backend.prefill(seq, &prompt[..prompt.len() - 1], false).unwrap();
    seq
}

/// The bits of logits.
fn bits(logits: &[f32]) -> Vec<u32> {
    logits.iter().map(|x| x.to_bits()).collect()
}

/// The bits of each decode step's logits of `prompt` decoded alone, and the
/// tokens fed (the prompt's last, then greedy ones).
fn alone(backend: &mut MlxBackend, prompt: &[u32]) -> (Vec<Vec<u32>>, Vec<u32>) {
    let seq = start(backend, prompt);
    let mut input = prompt[prompt.len() - 1];
    let (mut steps, mut inputs) = (Vec::new(), Vec::new());
    for _ in 0..STEPS {
        inputs.push(input);
        let logits = backend.decode(&[(seq, input)]).unwrap().into_first().unwrap();
        input = argmax(&logits);
        steps.push(bits(&logits));
    }
    backend.release_sequence(seq);
    (steps, inputs)
}

fn check(tiny: &TinyModel, what: &str) {
    each_kernel_build(|build, _| {
        let model = models::build(&tiny.config, &tiny.weights).unwrap();
        let mut backend = MlxBackend::new(model, MlxOptions::default()).unwrap();
        let prompts: Vec<Vec<u32>> = (0..SEQUENCES).map(prompt).collect();
        let expected: Vec<(Vec<Vec<u32>>, Vec<u32>)> = prompts.iter().map(|p| alone(&mut backend, p)).collect();

        // Sequence i joins at step i / 2, so batches grow, mix offsets and shrink.
        let join = |i: usize| i / 2;
        let seqs: Vec<SeqId> = prompts.iter().map(|p| start(&mut backend, p)).collect();
        let mut largest = 0;
        for step in 0..join(SEQUENCES - 1) + STEPS {
            let rows: Vec<usize> = (0..SEQUENCES).filter(|&i| step >= join(i) && step < join(i) + STEPS).collect();
            largest = largest.max(rows.len());
            let batch: Vec<(SeqId, u32)> = rows.iter().map(|&i| (seqs[i], expected[i].1[step - join(i)])).collect();
            let logits = backend.decode(&batch).unwrap();
            for (&i, l) in rows.iter().zip(&logits) {
                assert!(
                    bits(l) == expected[i].0[step - join(i)],
                    "{what} {build}: sequence {i} at its step {} in a batch of {} differs from alone",
                    step - join(i),
                    rows.len()
                );
            }
        }
        assert_eq!(largest, SEQUENCES, "every sequence decoded together at least once");
        eprintln!("{what} {build}: {SEQUENCES} sequences, batches up to {largest}: identical to alone");
    });
}

macro_rules! invariance {
    ($($name:ident: $arch:literal, $bits:literal;)*) => {$(
        #[test]
        fn $name() {
            let dir = tempfile::tempdir().unwrap();
            check(&tiny_model(dir.path(), $arch, $bits, 1), concat!($arch, " bits=", $bits));
        }
    )*};
}

invariance! {
    llama_q4: "llama", 4;
    llama_f32: "llama", 0;
    gemma3_q4: "gemma3", 4;
    qwen3_q8: "qwen3", 8;
    phi3_f32: "phi3", 0;
    mistral_q4: "mistral", 4;
    qwen3_moe_q4: "qwen3_moe", 4;
}

/// Nine or more sequences: more rows than the product kernels' matvec
/// takes at once, which must still not switch a decode step to the GEMM.
#[test]
fn more_rows_than_one_matvec_pass() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = tiny_model(dir.path(), "llama", 4, 1);
    // The kernel build is process-wide: hold it for the whole comparison.
    each_kernel_build(|build, _| {
        let model = models::build(&tiny.config, &tiny.weights).unwrap();
        let mut backend = MlxBackend::new(model, MlxOptions::default()).unwrap();
        let n = 17;
        let prompts: Vec<Vec<u32>> = (0..n).map(|i| prompt(i % SEQUENCES)).collect();
        let alone: Vec<Vec<u32>> = prompts.iter().map(|p| alone(&mut backend, p).0.remove(0)).collect();
        let seqs: Vec<SeqId> = prompts.iter().map(|p| start(&mut backend, p)).collect();
        let batch: Vec<(SeqId, u32)> = seqs.iter().zip(&prompts).map(|(&s, p)| (s, p[p.len() - 1])).collect();
        for (i, l) in backend.decode(&batch).unwrap().iter().enumerate() {
            assert!(bits(l) == alone[i], "{build}: sequence {i} of {n} differs from alone");
        }
    });
}

/// A sequence appearing twice in one step is refused, naming it; the
/// backend keeps working.
#[test]
fn a_sequence_twice_in_one_step_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = tiny_model(dir.path(), "llama", 4, 1);
    let model = models::build(&tiny.config, &tiny.weights).unwrap();
    let mut backend = MlxBackend::new(model, MlxOptions::default()).unwrap();
    let seq = backend.new_sequence();
    let err = backend.decode(&[(seq, 1), (seq, 2)]).unwrap_err().to_string();
    assert_eq!(err, format!("invalid parameter batch: sequence {seq} appears twice in one step"));
    let err = backend.decode(&[(seq, 1), (seq + 100, 2)]).unwrap_err().to_string();
    assert_eq!(err, format!("unknown sequence {}", seq + 100));
    assert_eq!(backend.decode(&[(seq, 1)]).unwrap().len(), 1);
    assert_eq!(backend.position(seq).unwrap(), 1);
}

/// The engine's concurrent greedy answers equal its serial ones, token for
/// token, and each request gets its own stream of events.
#[test]
fn engine_concurrent_greedy_equals_serial() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = tiny_bundle(dir.path(), "llama", 4);
    let options = |max_batch| EngineOptions { load: LoadOptions::default(), max_batch, ..EngineOptions::default() };
    let request = |i: usize| Request {
        prompt: prompt(i),
        options: GenerationOptions { max_tokens: 12 + i, ignore_eos: true, ..GenerationOptions::default() },
    };
    // The kernel build is process-wide: hold it for both runs.
    each_kernel_build(|build, _| {
        let serial: Vec<Vec<u32>> = {
            let engine = Engine::load(&bundle, options(1)).unwrap();
            (0..SEQUENCES).map(|i| engine.generate(request(i)).unwrap().tokens).collect()
        };
        let engine = std::sync::Arc::new(Engine::load(&bundle, options(SEQUENCES)).unwrap());
        let handles: Vec<_> = (0..SEQUENCES)
            .map(|i| {
                let engine = engine.clone();
                std::thread::spawn(move || engine.generate(request(i)).unwrap())
            })
            .collect();
        for (i, h) in handles.into_iter().enumerate() {
            let g = h.join().unwrap();
            assert_eq!(g.tokens, serial[i], "{build}: request {i}: concurrent tokens differ from serial");
            assert_eq!(g.tokens.len(), 12 + i);
        }
    });
}

/// The same with the prefix cache on and prompts sharing a long prefix (as
/// chat requests share a system prompt), read in small chunks: concurrent
/// answers equal serial ones without the cache, and the cache is used.
#[test]
fn engine_concurrent_greedy_with_prefix_cache_equals_serial() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = tiny_bundle(dir.path(), "llama", 4);
    let options = |max_batch, prefix_cache| EngineOptions {
        load: LoadOptions::default(),
        max_batch,
        prefill_chunk: 8,
        prefix_cache,
        ..EngineOptions::default()
    };
    // A 40-token shared prefix, then each request's own tokens.
    let shared: Vec<u32> = (0..40).map(|j| ((j * 13 + 5) % 250) as u32).collect();
    let request = |i: usize| Request {
        prompt: shared.iter().copied().chain(prompt(i)).collect(),
        options: GenerationOptions { max_tokens: 12 + i, ignore_eos: true, ..GenerationOptions::default() },
    };
    each_kernel_build(|build, _| {
        // Tokens and the bits of their log-probabilities.
        let serial: Vec<(Vec<u32>, Vec<u32>)> = {
            let engine = Engine::load(&bundle, options(1, 0)).unwrap();
            (0..SEQUENCES)
                .map(|i| engine.generate(request(i)).unwrap())
                .map(|g| (g.tokens, bits(&g.logprobs)))
                .collect()
        };
        // Serial with the cache: every request after the first reuses the prefix.
        let engine = Engine::load(&bundle, options(1, 1 << 30)).unwrap();
        for (i, expected) in serial.iter().enumerate() {
            let g = engine.generate(request(i)).unwrap();
            assert_eq!(
                (&g.tokens, &bits(&g.logprobs)),
                (&expected.0, &expected.1),
                "{build}: request {i}: serial with the prefix cache differs"
            );
            assert_eq!(g.stats.cached_tokens, if i == 0 { 0 } else { 40 }, "{build}: request {i}");
        }
        // Concurrent, with the cache warm from the serial run.
        let engine = std::sync::Arc::new(engine);
        let handles: Vec<_> = (0..SEQUENCES)
            .map(|i| {
                let engine = engine.clone();
                let request = request(i);
                std::thread::spawn(move || engine.generate(request).unwrap())
            })
            .collect();
        for (i, h) in handles.into_iter().enumerate() {
            let g = h.join().unwrap();
            assert_eq!(
                (g.tokens, bits(&g.logprobs)),
                serial[i],
                "{build}: request {i}: concurrent tokens with the prefix cache differ"
            );
            assert!(g.stats.cached_tokens >= 40, "{build}: request {i}: {}", g.stats.cached_tokens);
        }
        assert!(engine.stats().prefix_cache_hits >= 2 * SEQUENCES as u64 - 1);
    });
}
