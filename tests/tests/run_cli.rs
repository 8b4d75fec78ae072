//! `mlxcel run` end to end on tiny bundles: one-shot and interactive
//! generation, flags, and the errors a user can provoke.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use mlxcel_tests::{mlxcel_bin, tiny_bundle};

fn mlxcel(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(mlxcel_bin())
        .args(args)
        .env("MLXCEL_DEVICE", "cpu")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start mlxcel");
    child.stdin.take().expect("stdin").write_all(stdin.as_bytes()).expect("write stdin");
    child.wait_with_output().expect("mlxcel runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn one_shot_generation_is_deterministic_and_reports_speed() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = tiny_bundle(dir.path(), "llama", 4);
    let b = bundle.to_str().unwrap();
    let greedy = ["run", b, "-p", "Hello there", "-n", "12", "--verbose"];
    let first = mlxcel(&greedy, "");
    assert!(first.status.success(), "{}", text(&first.stderr));
    let err = text(&first.stderr);
    assert!(err.contains("ready in") && err.contains("tiny-llama (llama)"), "{err}");
    assert!(err.contains("prompt:") && err.contains("generation:") && err.contains("peak memory"), "{err}");
    // Greedy is reproducible, and so is seeded sampling.
    let second = mlxcel(&greedy, "");
    assert_eq!(text(&first.stdout), text(&second.stdout));
    let sampled = ["run", b, "-p", "Hello there", "-n", "12", "--temp", "0.8", "--top-p", "0.9", "--seed", "3"];
    let (a, c) = (mlxcel(&sampled, ""), mlxcel(&sampled, ""));
    assert!(a.status.success(), "{}", text(&a.stderr));
    assert_eq!(text(&a.stdout), text(&c.stdout));
    // Raw completion without the template also runs.
    let raw = mlxcel(&["run", b, "-p", "abc", "-n", "4", "--no-chat-template"], "");
    assert!(raw.status.success(), "{}", text(&raw.stderr));
}

#[test]
fn interactive_chat_keeps_history_and_resets() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = tiny_bundle(dir.path(), "qwen3", 0);
    let out =
        mlxcel(&["run", bundle.to_str().unwrap(), "-n", "6", "--system", "Be brief."], "hi\n/reset\n\nagain\n/exit\n");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(err.contains("/reset clears the conversation"), "{err}");
    assert!(err.contains("[conversation cleared]"), "{err}");
    // Two answers, each ended by a newline.
    assert_eq!(text(&out.stdout).matches('\n').count(), 2, "{}", text(&out.stdout));
    // End of input (Ctrl-D) quits cleanly too.
    let out = mlxcel(&["run", bundle.to_str().unwrap(), "-n", "2"], "hello\n");
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn user_errors_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = tiny_bundle(dir.path(), "llama", 0);
    let b = bundle.to_str().unwrap();
    // The tiny model's context is 512 tokens; the byte tokenizer makes one per byte.
    let long = "x".repeat(600);
    let out = mlxcel(&["run", b, "-p", &long, "--no-chat-template"], "");
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("the prompt has 600 tokens but the context holds 512"), "{}", text(&out.stderr));
    let out = mlxcel(&["run", b, "-p", "x", "--top-p", "1.5"], "");
    // A flag out of range is a usage error naming the flag (exit 2).
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("invalid value '1.5' for '--top-p <P>': must be in (0, 1]"),
        "{}",
        text(&out.stderr)
    );
    let out = mlxcel(&["run", b, "-p", "x", "--no-chat-template", "--system", "s"], "");
    assert!(text(&out.stderr).contains("--system needs a chat template"), "{}", text(&out.stderr));
    // A bundle of a newer format major version.
    let mut bytes = std::fs::read(&bundle).unwrap();
    bytes[8..10].copy_from_slice(&2u16.to_le_bytes());
    let newer = dir.path().join("newer.mlxb");
    std::fs::write(&newer, &bytes).unwrap();
    let out = mlxcel(&["run", newer.to_str().unwrap(), "-p", "x"], "");
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("upgrade mlxcel") && err.contains("newer.mlxb"), "{err}");
    // A missing file.
    let out = mlxcel(&["run", "/nonexistent/model.mlxb", "-p", "x"], "");
    assert!(text(&out.stderr).contains("/nonexistent/model.mlxb"), "{}", text(&out.stderr));
}

#[test]
fn an_architecture_the_runtime_lacks_is_named() {
    use mlxcel_bundle::{BundleWriter, ModelInfo};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mamba.mlxb");
    let model = ModelInfo { architecture: "mamba".into(), name: "m".into(), config_json: "{}".into() };
    let mut w = BundleWriter::create(&path, model).unwrap();
    w.add_tokenizer_json(&b"{}"[..]).unwrap();
    w.finish().unwrap();
    let out = mlxcel(&["run", path.to_str().unwrap(), "-p", "x"], "");
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains(
            "architecture \"mamba\" is not supported by this runtime; supported: llama, mistral, qwen2, qwen3, qwen3_moe, gemma3, phi3"
        ),
        "{err}"
    );
}

#[test]
fn bench_reports_pp_and_tg() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = tiny_bundle(dir.path(), "llama", 4);
    let b = bundle.to_str().unwrap();
    let out = mlxcel(&["bench", b, "-p", "32", "-n", "8", "-r", "2", "--json"], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for (row, test) in rows.iter().zip(["pp32", "tg8"]) {
        assert_eq!(row["test"], test);
        assert_eq!(row["samples"].as_array().unwrap().len(), 2);
        assert!(row["tokens_per_second"].as_f64().unwrap() > 0.0);
    }
    let table = mlxcel(&["bench", b, "-p", "16", "-n", "0", "-r", "1"], "");
    let table = text(&table.stdout);
    assert!(table.contains("| pp16 |") && !table.contains("tg"), "{table}");
    let err = mlxcel(&["bench", b, "-p", "600"], "");
    assert!(text(&err.stderr).contains("the model's context holds 512"), "{}", text(&err.stderr));
}
