//! End to end: the built `mlxcel` binary inspects and verifies bundles made
//! with the writer API, and fails with the right message on damaged ones.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use mlxcel_bundle::{
    BundleWriter, Dtype, ModelInfo, Provenance, Quantization, SectionSpec, SourceFile, TensorSpec, kinds,
};

fn mlxcel(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mlxcel")).args(args).output().expect("run mlxcel")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn write_fixture(dir: &Path) -> PathBuf {
    let model = ModelInfo {
        architecture: "qwen3".into(),
        name: "Qwen3-test".into(),
        config_json: r#"{"hidden_size":64,"num_hidden_layers":2,"vocab_size":100,"rope_theta":1000000.0}"#.into(),
    };
    let mut w = BundleWriter::create(dir.join("fixture.mlxb"), model).unwrap();
    w.set_chat_template("{{ messages }}");
    w.set_generation_defaults_json(r#"{"eos_token_id":[1,2],"temperature":0.6}"#);
    w.set_provenance(Provenance {
        compiler_version: "mlxcel-compile 0.1.0".into(),
        mlx_version: "0.32.4".into(),
        source_files: vec![SourceFile { name: "model.safetensors".into(), size: 4096, digest: "sha256:abcd".into() }],
        compile_options_json: r#"{"quantize":"q4"}"#.into(),
        ..Provenance::default()
    });
    w.add_tokenizer_json(&b"{\"version\":\"1.0\"}"[..]).unwrap();
    let q = Quantization {
        mode: "affine".into(),
        bits: 4,
        group_size: 64,
        scales: "w.scales".into(),
        biases: Some("w.biases".into()),
    };
    w.add_tensor_bytes(TensorSpec::new("w.weight", Dtype::U32, [4, 8]).quantized(q), &[7; 128]).unwrap();
    w.add_tensor_bytes(TensorSpec::new("w.scales", Dtype::Bf16, [4, 1]), &[1; 8]).unwrap();
    w.add_tensor_bytes(TensorSpec::new("w.biases", Dtype::Bf16, [4, 1]), &[2; 8]).unwrap();
    w.add_tensor_bytes(TensorSpec::new("model.norm.weight", Dtype::F32, [64]), &[3; 256]).unwrap();
    w.add_section_bytes(SectionSpec::new(kinds::IREE_VMFB, "decode").with_target("llvm-cpu:x86_64:+avx2"), &[9; 300])
        .unwrap();
    w.finish().unwrap().path
}

#[test]
fn inspect_prints_a_readable_report() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_fixture(dir.path());
    let out = mlxcel(&["inspect", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report = text(&out.stdout);
    let format_line = format!("format     1.{}", mlxcel_bundle::FORMAT_MINOR);
    for expected in [
        format_line.as_str(),
        "root hash",
        "Qwen3-test (architecture qwen3)",
        "hidden_size=64",
        "rope_theta=1000000.0",
        "tokenizer.json 17 B",
        "chat template: 14 chars",
        "mlxcel-compile 0.1.0",
        "model.safetensors",
        "tensors    4",
        "quantized affine 4-bit g64",
        "iree-vmfb",
        "llvm-cpu:x86_64:+avx2",
    ] {
        assert!(report.contains(expected), "missing {expected:?} in:\n{report}");
    }
    assert!(!report.contains("tensor table"));
    let out = mlxcel(&["inspect", "--tensors", path.to_str().unwrap()]);
    let report = text(&out.stdout);
    assert!(
        report.contains("tensor table") && report.contains("model.norm.weight") && report.contains("[4, 8]"),
        "{report}"
    );
}

#[test]
fn inspect_json_is_machine_readable() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_fixture(dir.path());
    let out = mlxcel(&["inspect", "--json", "--tensors", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(v["format"]["major"], 1);
    assert_eq!(v["model"]["architecture"], "qwen3");
    assert_eq!(v["model"]["config"]["num_hidden_layers"], 2);
    assert_eq!(v["tokenizer"]["tokenizer_json_bytes"], 17);
    assert_eq!(v["tokenizer"]["generation_defaults"]["temperature"], 0.6);
    assert_eq!(v["tensor_summary"]["count"], 4);
    assert_eq!(v["tensor_summary"]["by_dtype"]["bf16"]["bytes"], 16);
    assert_eq!(v["tensor_summary"]["by_quantization"]["affine 4-bit g64"]["count"], 1);
    assert_eq!(v["sections"].as_array().unwrap().len(), 2);
    assert_eq!(v["tensors"][0]["quantization"]["scales"], "w.scales");
    assert_eq!(v["root_hash"].as_str().unwrap().len(), 64);
}

#[test]
fn verify_checks_the_hashes_then_what_run_would_load() {
    // The fixture's bytes match their hashes, but it is no model `run` can
    // load (one stray tensor, a tokenizer.json without a model): verify
    // says both.
    let dir = tempfile::tempdir().unwrap();
    let path = write_fixture(dir.path());
    let out = mlxcel(&["verify", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("every byte matches its hash, but `run` would refuse the bundle"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[test]
fn verify_names_the_damaged_tensor_and_section() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_fixture(dir.path());
    let bundle = mlxcel_bundle::Bundle::open(&path).unwrap();
    let norm = bundle.tensor("model.norm.weight").unwrap().offset() as usize;
    let vmfb = bundle.sections_of_kind(kinds::IREE_VMFB).next().unwrap().offset() as usize;
    drop(bundle);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[norm + 5] ^= 1;
    bytes[vmfb] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let out = mlxcel(&["verify", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("MISMATCH tensor `model.norm.weight`"), "{stderr}");
    assert!(stderr.contains("MISMATCH section iree-vmfb/decode (target llvm-cpu:x86_64:+avx2)"), "{stderr}");
    assert!(stderr.contains("verification failed: 2 problem(s)"), "{stderr}");
}

#[test]
fn damaged_headers_fail_inspect_and_verify_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_fixture(dir.path());
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[8] = 9; // format major 9
    std::fs::write(&path, &bytes).unwrap();
    for command in ["inspect", "verify"] {
        let out = mlxcel(&[command, path.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(1));
        let stderr = text(&out.stderr);
        let want =
            format!("version 9.{} is not supported: this reader supports version 1.x", mlxcel_bundle::FORMAT_MINOR);
        assert!(stderr.contains(&want), "{stderr}");
    }
    let out = mlxcel(&["verify", dir.path().join("absent.mlxb").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("absent.mlxb"));
}
