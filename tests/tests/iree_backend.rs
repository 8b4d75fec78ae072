//! The IREE backend (feature `iree`) against the MLX backend on the real
//! SmolLM2-135M, 4-bit (the package's Q4_1, transcoded losslessly) and f32
//! (`--quantize none`), each compiled with `--target iree-llvm-cpu`: the
//! same bundle, the same weights, run by the bundle's own IREE module and by
//! MLX with mlxcel's kernels.
//!
//! Checked on three prompts (one through the chat template, two raw; the
//! long one runs as chunks of 128 and 32 tokens): at each of 64 greedy
//! steps, both fed the MLX backend's token (so that one near tie cannot end
//! the comparison), the log-probabilities differ by at most `BOUND`, and the
//! greedy tokens agree; a disagreement is allowed only where MLX's two best
//! tokens are closer than twice the bound (a tie within the numerics), and
//! is reported with its step.
//!
//! Why 1e-2: both sides compute in f32 from the same stored weights, and
//! differ in summation order and in how each dequantizes (IREE: to f32
//! inside the graph, then a float product; mlxcel's kernels: group by group
//! on the fly, and on AVX-512 VNNI hosts with the activations rounded to
//! int16 steps, which alone moves log-probabilities by up to 3.2e-3 on
//! SmolLM2: tests/tests/real_parity.rs). Measured when the bound was set
//! (AVX2 host, float-activation kernels): 1.07e-4 (4-bit) and 1.09e-4 (f32)
//! over the three prompts, greedy tokens identical. A wrong graph (a missing
//! norm, a shifted position, a bad mask) moves them by 1e-1 and more.
#![cfg(feature = "iree")]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use mlxcel_runtime::chat::Message;
use mlxcel_runtime::loader::{BackendKind, LoadOptions, load_backend};
use mlxcel_tests::{mlxcel_bin, mlxcel_compile_bin, real_model};

const GGUF: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const STEPS: usize = 64;
/// The largest difference of log-probabilities allowed (module docs).
const BOUND: f32 = 1e-2;
/// Cache capacity of the test bundles' modules: the longest prompt and its
/// 64 steps fit.
const CONTEXT: usize = 256;

fn compile(dir: &Path, quantize: &str) -> PathBuf {
    let bundle = dir.join(format!("smollm2-{quantize}.mlxb"));
    let out = Command::new(mlxcel_compile_bin())
        .arg(real_model(GGUF))
        .arg("-o")
        .arg(&bundle)
        .args(["--quantize", quantize, "--target", "iree-llvm-cpu", "--iree-context", &CONTEXT.to_string()])
        .arg("--quiet")
        .output()
        .unwrap();
    assert!(out.status.success(), "mlxcel-compile: {}", String::from_utf8_lossy(&out.stderr));
    bundle
}

/// The 4-bit bundle, compiled once for the tests that use it (iree-compile
/// takes about a minute).
fn four_bit() -> &'static Path {
    static DIR: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &DIR.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let bundle = compile(dir.path(), "auto");
        (dir, bundle)
    })
    .1
}

fn log_softmax(x: &[f32]) -> Vec<f32> {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max + x.iter().map(|&v| (v - max).exp()).sum::<f32>().ln();
    x.iter().map(|&v| v - lse).collect()
}

/// The best token and how far ahead of the second it is (log-probability).
fn best(logp: &[f32]) -> (u32, f32) {
    let (mut i1, mut v1, mut v2) = (0, f32::NEG_INFINITY, f32::NEG_INFINITY);
    for (i, &v) in logp.iter().enumerate() {
        if v > v1 {
            (v2, v1, i1) = (v1, v, i);
        } else if v > v2 {
            v2 = v;
        }
    }
    (i1 as u32, v1 - v2)
}

fn options(kind: BackendKind) -> LoadOptions {
    LoadOptions { backend_kind: kind, ..LoadOptions::default() }
}

fn check(quantize: &str, bundle: &Path) {
    let mut mlx = load_backend(bundle, &options(BackendKind::Mlx)).unwrap();
    let mut iree = load_backend(bundle, &options(BackendKind::Iree)).unwrap();
    assert_eq!(iree.backend.context_length(), CONTEXT);
    let chat = {
        let template = mlx.chat_template.as_ref().unwrap();
        let tok = &mlx.tokenizer;
        let text = template
            .render(&[Message::new("user", "What is the capital of France?")], true, tok.bos_text(), tok.eos_text())
            .unwrap();
        tok.encode(&text, false).unwrap()
    };
    let raw = mlx.tokenizer.encode("Once upon a time,", true).unwrap();
    let long = mlx.tokenizer.encode(&"The quick brown fox jumps over the lazy dog. ".repeat(15), true).unwrap();
    assert!(long.len() > 128 && long.len() + STEPS <= CONTEXT, "{} tokens", long.len());
    let mut worst = 0f32;
    for (what, prompt) in [("chat", chat), ("raw", raw), ("long", long)] {
        let (a, b) = (mlx.backend.new_sequence(), iree.backend.new_sequence());
        let mut la = mlx.backend.prefill(a, &prompt, true).unwrap().unwrap();
        let mut lb = iree.backend.prefill(b, &prompt, true).unwrap().unwrap();
        for step in 0..STEPS {
            let (pa, pb) = (log_softmax(&la), log_softmax(&lb));
            let diff = pa.iter().zip(&pb).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            worst = worst.max(diff);
            assert!(diff <= BOUND, "{quantize} {what}: step {step}: log-probabilities differ by {diff}");
            let ((ta, margin), (tb, _)) = (best(&pa), best(&pb));
            if ta != tb {
                assert!(margin < 2.0 * BOUND, "{quantize} {what}: step {step}: greedy token {tb} against MLX's {ta}");
                eprintln!("{quantize} {what}: step {step}: a near tie ({margin:e}) broke the other way");
            }
            la = mlx.backend.decode(&[(a, ta)]).unwrap().into_first().unwrap();
            lb = iree.backend.decode(&[(b, ta)]).unwrap().into_first().unwrap();
        }
        assert_eq!(iree.backend.position(b).unwrap(), prompt.len() + STEPS);
        mlx.backend.release_sequence(a);
        iree.backend.release_sequence(b);
    }
    eprintln!("SmolLM2 {quantize}: largest log-probability difference IREE vs MLX over {STEPS} steps: {worst:e}");
}

#[test]
fn smollm2_4bit_iree_matches_mlx() {
    check("4-bit", four_bit());
}

#[test]
fn smollm2_f32_iree_matches_mlx() {
    let dir = tempfile::tempdir().unwrap();
    check("f32", &compile(dir.path(), "none"));
}

/// `mlxcel run --backend iree` answers as `--backend mlx` does (greedy), and
/// a bundle without an IREE module is refused with what it has and needs.
#[test]
fn run_backend_iree_and_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = four_bit();
    let run = |backend: &str, bundle: &Path| {
        Command::new(mlxcel_bin())
            .arg("run")
            .arg(bundle)
            .args(["-p", "What is the capital of France?", "-n", "12", "--backend", backend])
            .output()
            .unwrap()
    };
    let (a, b) = (run("mlx", bundle), run("iree", bundle));
    assert!(
        a.status.success() && b.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&a.stderr),
        String::from_utf8_lossy(&b.stderr)
    );
    let text = String::from_utf8_lossy(&b.stdout);
    assert_eq!(text, String::from_utf8_lossy(&a.stdout));
    assert!(text.contains("Paris"), "{text}");

    let plain = dir.path().join("plain.mlxb");
    let out =
        Command::new(mlxcel_compile_bin()).arg(real_model(GGUF)).arg("-o").arg(&plain).arg("--quiet").output().unwrap();
    assert!(out.status.success());
    let refused = run("iree", &plain);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && err.contains("no IREE module") && err.contains("the bundle has: none"),
        "{err}"
    );
    assert!(err.contains("--target iree-llvm-cpu"), "{err}");
}

/// `mlxcel-server --backend iree` serves what `--backend mlx` serves: the
/// same greedy answers, requests in parallel as one at a time, a second
/// turn from the prompt cache; and the KV budget counts an IREE sequence at
/// its whole capacity (the module's caches have a fixed shape), so a budget
/// below one sequence refuses every request and one a little above it runs
/// requests one after another.
#[test]
fn server_backend_iree() {
    use mlxcel_tests::server::Server;
    use serde_json::{Value, json};

    let bundle = four_bit();
    // Keys and values of SmolLM2's 30 layers, 3 heads of 64, f32, at the
    // module's capacity: 11.25 MiB a sequence.
    let sequence_mib = 2.0 * 30.0 * 3.0 * CONTEXT as f64 * 64.0 * 4.0 / (1 << 20) as f64;
    assert!(sequence_mib > 11.0 && sequence_mib < 12.0, "{sequence_mib}");

    let prompts = ["What is the capital of France?", "Name a colour.", "Count to five."];
    let ask = |server: &Server, prompt: &str| -> Value {
        let body = json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": 12, "temperature": 0});
        let (status, reply) = server.post("/v1/chat/completions", &body);
        assert_eq!(status, 200, "{reply}\n{}", server.log());
        reply["choices"][0]["message"]["content"].clone()
    };
    let expected: Vec<Value> = {
        let mlx = Server::start(bundle, &["--backend", "mlx"]);
        prompts.iter().map(|p| ask(&mlx, p)).collect()
    };
    assert!(expected[0].as_str().unwrap().contains("Paris"), "{}", expected[0]);

    let server = Server::start(bundle, &["--backend", "iree", "--parallel", "3", "--kv-budget", "12", "--metrics"]);
    let concurrent: Vec<Value> = std::thread::scope(|s| {
        let handles: Vec<_> = prompts.iter().map(|p| s.spawn(|| ask(&server, p))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(concurrent, expected);

    let mut messages = vec![json!({"role": "user", "content": "What is the capital of France?"})];
    let (status, one) =
        server.post("/v1/chat/completions", &json!({"messages": messages, "max_tokens": 12, "temperature": 0}));
    assert_eq!(status, 200, "{one}");
    messages.push(one["choices"][0]["message"].clone());
    messages.push(json!({"role": "user", "content": "And of Italy?"}));
    let (status, two) =
        server.post("/v1/chat/completions", &json!({"messages": messages, "max_tokens": 12, "temperature": 0}));
    assert_eq!(status, 200, "{two}");
    let cached = two["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(cached >= one["usage"]["prompt_tokens"].as_u64().unwrap(), "{}", two["usage"]);
    assert_eq!(server.metric("mlxcel_kv_cache_bytes"), 0.0);
    drop(server);

    let small = Server::start(bundle, &["--backend", "iree", "--kv-budget", "10"]);
    let body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0});
    let (status, refused) = small.post("/v1/chat/completions", &body);
    assert_eq!(status, 400, "{refused}");
    assert_eq!(refused["error"]["code"], "kv_budget_exceeded", "{refused}");
}
