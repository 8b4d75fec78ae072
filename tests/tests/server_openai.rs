//! `mlxcel-server` against the official OpenAI Python client: the real
//! SmolLM2-135M bundle (compiled from its GGUF) is served on a loopback port,
//! and tests/python/openai_client_check.py (openai 3.51, pinned in the
//! reference environment) checks chat and text completions, streamed and not,
//! stop strings, seeds, logprobs shapes, `stream_options.include_usage`,
//! `cached_tokens` across two turns of a conversation, and the errors (n=2, an
//! unknown field, a wrong API key) with OpenAI's own client types. Then the
//! server gets SIGTERM and must exit 0.
//!
//! The check script runs against llama.cpp's llama-server too (bench/server.sh
//! builds it); mlxcel-server is held to the stricter flags, which llama-server
//! fails (`--strict`): an unknown field is a 400 naming it, and /v1/completions
//! has OpenAI's legacy logprobs shape (with `text_offset`) and a usage chunk
//! with empty choices.

use std::process::Command;

use mlxcel_tests::server::{server_declared, spawn_server};
use mlxcel_tests::{mlxcel_compile_bin, real_model, reference_python, workspace_root};

const API_KEY: &str = "mlxcel-test-key";

#[test]
fn openai_client_against_mlxcel_server() {
    if !server_declared() {
        eprintln!("skipped: cli/Cargo.toml declares no mlxcel-server binary yet");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("smollm2.mlxb");
    let out = Command::new(mlxcel_compile_bin())
        .args([
            real_model("SmolLM2-135M-Instruct.Q4_1.gguf").to_str().unwrap(),
            "-o",
            bundle.to_str().unwrap(),
            "--quiet",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "compile failed: {}", String::from_utf8_lossy(&out.stderr));

    let server = spawn_server(
        &bundle,
        &["--parallel", "2", "--ctx-size", "4096", "--threads", "2", "--api-key", API_KEY, "--metrics"],
        dir.path(),
    );
    let script = workspace_root().join("tests/python/openai_client_check.py");
    let base_url = format!("{}/v1", server.base_url());
    let out = Command::new(reference_python())
        .arg(&script)
        .args([base_url.as_str(), "--api-key", API_KEY, "--strict"])
        .env("PYTHONUNBUFFERED", "1")
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{report}");
    if !out.status.success() {
        let log = server.log();
        drop(server);
        panic!("openai_client_check.py failed against mlxcel-server:\n{report}\nserver log:\n{log}");
    }
    let status = server.stop();
    let log = std::fs::read_to_string(dir.path().join("server.log")).unwrap_or_default();
    assert!(status.success(), "mlxcel-server exited with {status} after SIGTERM; its log:\n{log}");
}
