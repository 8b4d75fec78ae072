//! Pruned SmolLM2 bundles from the command line: `mlxcel-compile --surgery`
//! with the layer and head removal examples gives bundles that `mlxcel run`
//! runs and that `mlxcel inspect` reports smaller; `--surgery-dry-run` lists
//! the matched tensors and writes nothing.

use std::path::Path;
use std::process::{Command, Output};

use mlxcel_tests::{mlxcel_bin, mlxcel_compile_bin, real_model, workspace_root};

fn run(bin: &Path, args: &[&str]) -> Output {
    let out = Command::new(bin).args(args).env("MLXCEL_DEVICE", "cpu").output().unwrap();
    assert!(out.status.success(), "{} {args:?}: {}", bin.display(), String::from_utf8_lossy(&out.stderr));
    out
}

fn parameters(bundle: &Path) -> u64 {
    let out = run(&mlxcel_bin(), &["inspect", bundle.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["tensor_summary"]["parameters"].as_u64().unwrap()
}

#[test]
fn pruned_bundles_run_and_are_smaller() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = real_model("SmolLM2-135M-Instruct.Q4_1.gguf");
    let gguf = gguf.to_str().unwrap();
    let plain = dir.path().join("plain.mlxb");
    run(&mlxcel_compile_bin(), &[gguf, "-o", plain.to_str().unwrap(), "--quiet"]);
    let full = parameters(&plain);
    assert!((134_000_000..136_000_000).contains(&full), "{full}");
    for (example, fewer) in [
        // One layer of 30: its attention, MLP and two norms.
        ("remove_last_layer.yaml", 576 * (576 + 2 * 192 + 576) + 3 * 576 * 1536 + 2 * 576),
        // Three of nine heads of 64 in 30 layers: q rows and o columns.
        ("remove_heads.yaml", 30 * 2 * 3 * 64 * 576),
    ] {
        let yaml = workspace_root().join("examples/surgery").join(example);
        let yaml = yaml.to_str().unwrap();
        let dry =
            run(&mlxcel_compile_bin(), &[gguf, "--surgery", yaml, "--surgery-dry-run", "-o", "/nonexistent/x.mlxb"]);
        let listing = String::from_utf8_lossy(&dry.stdout);
        assert!(listing.starts_with("#1 prune (remove)") && listing.contains("nothing written (dry run)"), "{listing}");
        let out = dir.path().join(example.replace(".yaml", ".mlxb"));
        run(&mlxcel_compile_bin(), &[gguf, "--surgery", yaml, "-o", out.to_str().unwrap(), "--quiet"]);
        assert_eq!(parameters(&out), full - fewer as u64, "{example}");
        let answer =
            run(&mlxcel_bin(), &["run", out.to_str().unwrap(), "-p", "What is the capital of France?", "-n", "12"]);
        assert!(!String::from_utf8_lossy(&answer.stdout).trim().is_empty(), "{example}: no text");
        let text =
            String::from_utf8_lossy(&run(&mlxcel_bin(), &["inspect", out.to_str().unwrap()]).stdout).into_owned();
        assert!(text.contains("surgery") && text.contains("prune (remove)"), "{text}");
    }
}
