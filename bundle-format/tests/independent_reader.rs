//! The spec is complete enough for an independent reader: a Python script
//! written from docs/bundle-format.md alone (standard library only, its own
//! BLAKE3) parses our bundles, performs the open and verify checks, and
//! agrees with this crate on every field; it also rejects damaged bundles.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use mlxcel_bundle::{Bundle, hex};
use serde_json::Value;

fn python() -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.deps/venv/bin/python");
    if venv.exists() { venv } else { PathBuf::from("python3") }
}

fn run_reader(bundle: &Path, verify: bool) -> Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/independent_reader.py");
    let mut command = Command::new(python());
    command.arg(script);
    if verify {
        command.arg("--verify");
    }
    command.arg(bundle).output().expect("the independent reader needs python3 (scripts/setup.sh installs one)")
}

#[test]
fn python_reader_agrees_with_the_rust_reader() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::write_sample(&dir.path().join("sample.mlxb"));
    let out = run_reader(&path, true);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let bundle = Bundle::open(&path).unwrap();
    let h = bundle.header();
    assert_eq!(v["verified"], true);
    assert_eq!(v["header"]["root_hash"], hex(&h.root_hash));
    assert_eq!(v["header"]["manifest_blake3"], hex(&h.manifest_blake3));
    assert_eq!(v["header"]["manifest_offset"], h.manifest_offset);
    let m = &v["manifest"];
    assert_eq!(m["model"]["architecture"], bundle.architecture());
    assert_eq!(m["model"]["config_json"], bundle.config_json());
    assert_eq!(m["tokenizer"]["chat_template"], bundle.chat_template().unwrap());
    let tensors = m["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), bundle.tensor_count());
    for (py, rs) in tensors.iter().zip(bundle.tensors()) {
        assert_eq!(py["name"], rs.name());
        assert_eq!(py["dtype"], rs.dtype().as_str());
        assert_eq!(py["shape"], serde_json::json!(rs.shape()));
        assert_eq!(py["offset"], rs.offset());
        assert_eq!(py["length"], rs.byte_len());
        assert_eq!(py["blake3"], hex(&rs.blake3()));
        assert_eq!(py["layout"], rs.layout());
        assert_eq!(py["quantization"].is_null(), rs.quantization().is_none());
    }
    assert_eq!(tensors[0]["quantization"]["biases"], "model.layers.0.mlp.down_proj.biases");
    assert_eq!(tensors[4]["properties"][0]["value"], "ones");
    let sections = m["sections"].as_array().unwrap();
    for (py, rs) in sections.iter().zip(bundle.sections()) {
        assert_eq!(
            (py["kind"].as_str(), py["key"].as_str(), py["target"].as_str()),
            (Some(rs.kind()), Some(rs.key()), Some(rs.target()))
        );
        assert_eq!(py["blake3"], hex(&rs.blake3()));
    }
    assert_eq!(sections[3]["properties"][0]["key"], "iree_version");
    // The provenance parses field for field into the same owned record.
    let p = &m["provenance"];
    let expected = common::provenance();
    assert_eq!(p["compiler_version"], expected.compiler_version);
    assert_eq!(p["source_files"][0]["digest"], expected.source_files[0].digest);
    assert_eq!(p["quantization_recipe_json"], expected.quantization_recipe_json.unwrap());
    assert_eq!(p["surgery"]["yaml"], common::SURGERY_YAML);
    assert_eq!(p["surgery"]["operations"][0]["matched_tensors"][0], "model.layers.0.mlp.down_proj.weight");
    assert_eq!(p["repacks"][0]["transform"], "identity");
    assert_eq!(m["metadata"][0]["key"], "mlxcel.test");
}

/// A quantized triple in the rows16 layout (§4.1): the Python reader,
/// following the spec, gets back the row-major bytes that went in, as does
/// `TensorView::row_major_data`.
#[test]
fn python_reader_undoes_the_rows16_layout() {
    use mlxcel_bundle::{BundleWriter, Dtype, LAYOUT_ROWS16, ModelInfo, Quantization, TensorSpec, rows16};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rows16.mlxb");
    let model = ModelInfo { architecture: "llama".into(), name: "rows16".into(), config_json: "{}".into() };
    let mut w = BundleWriter::create(&path, model).unwrap();
    // 32 rows of 64 4-bit codes (8 u32 words) and 2 groups of f16 scales.
    let codes: Vec<u8> = (0..32 * 32).map(|i| (i * 7 % 251) as u8).collect();
    let scales: Vec<u8> = (0..32 * 2 * 2).map(|i| (i * 13 % 253) as u8).collect();
    let quant = Quantization {
        mode: "affine".into(),
        bits: 4,
        group_size: 32,
        scales: "m.scales".into(),
        biases: Some("m.biases".into()),
    };
    let spec = TensorSpec::new("m.weight", Dtype::U32, vec![32, 8]).quantized(quant).with_layout(LAYOUT_ROWS16);
    w.add_tensor_bytes(spec, &rows16::from_row_major(&codes, 32, 1).unwrap()).unwrap();
    for name in ["m.scales", "m.biases"] {
        let spec = TensorSpec::new(name, Dtype::F16, vec![32, 2]).with_layout(LAYOUT_ROWS16);
        w.add_tensor_bytes(spec, &rows16::from_row_major(&scales, 2, 2).unwrap()).unwrap();
    }
    w.finish().unwrap();
    let out = run_reader(&path, true);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let bundle = Bundle::open(&path).unwrap();
    for (name, want) in [("m.weight", &codes), ("m.scales", &scales), ("m.biases", &scales)] {
        assert_eq!(v["row_major"][name], hex(want), "{name}: the Python reader's row-major bytes");
        let t = bundle.tensor(name).unwrap();
        assert_eq!(t.layout(), LAYOUT_ROWS16);
        assert_ne!(t.data(), &want[..], "{name}: stored rearranged");
        assert_eq!(&*t.row_major_data().unwrap(), &want[..], "{name}: row_major_data");
    }
}

#[test]
fn python_reader_rejects_damage() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::write_sample(&dir.path().join("sample.mlxb"));
    let good = std::fs::read(&path).unwrap();
    let bundle = Bundle::from_bytes(&good).unwrap();
    let embed = bundle.tensor("model.embed_tokens.weight").unwrap().offset() as usize;
    let manifest = bundle.header().manifest_offset as usize;
    let cases: [(usize, bool, &str); 4] = [
        (0, false, "bad magic"),
        (40, false, "root hash"),
        (manifest + 3, false, "manifest hash"),
        (embed + 1, true, "tensor model.embed_tokens.weight at offset"),
    ];
    for (at, verify, expected) in cases {
        let mut bad = good.clone();
        bad[at] ^= 0x10;
        let damaged = dir.path().join("damaged.mlxb");
        std::fs::write(&damaged, &bad).unwrap();
        let out = run_reader(&damaged, verify);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{at}: {stderr}");
        assert!(stderr.contains(expected), "{at}: {stderr}");
    }
}
