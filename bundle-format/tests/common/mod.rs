//! Shared fixtures of the integration tests: a small bundle using every feature.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use mlxcel_bundle::{
    BundleWriter, Dtype, KeyValue, ModelInfo, Provenance, Quantization, RepackRecord, SectionSpec, SourceFile,
    SurgeryOperation, SurgeryRecord, TensorSpec, kinds,
};

/// Deterministic pseudo-random bytes (xorshift), so fixtures need no RNG crate.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

pub const SURGERY_YAML: &str = "operations:\n  - scale: {match: \"*.down_proj.weight\", by: 0.5}\n";

pub fn model() -> ModelInfo {
    ModelInfo {
        architecture: "llama".into(),
        name: "tiny-llama-test".into(),
        config_json: r#"{"hidden_size":8,"num_hidden_layers":1,"vocab_size":16,"rms_norm_eps":1e-5}"#.into(),
    }
}

pub fn provenance() -> Provenance {
    Provenance {
        compiler_version: "mlxcel-compile 0.1.0".into(),
        mlx_version: "0.32.4".into(),
        source_files: vec![SourceFile { name: "model.safetensors".into(), size: 1234, digest: "sha256:00ff".into() }],
        compile_options_json: r#"{"quantize":"q4"}"#.into(),
        quantization_recipe_json: Some(r#"{"bits":4,"group_size":32}"#.into()),
        surgery: Some(SurgeryRecord {
            yaml: SURGERY_YAML.into(),
            blake3: *blake3::hash(SURGERY_YAML.as_bytes()).as_bytes(),
            operations: vec![SurgeryOperation {
                description: "scale *.down_proj.weight by 0.5".into(),
                matched_tensors: Some(vec!["model.layers.0.mlp.down_proj.weight".into()]),
            }],
        }),
        repacks: vec![RepackRecord {
            transform: "identity".into(),
            layout: "row-major".into(),
            tensors: vec!["model.norm.weight".into()],
            params_json: "{}".into(),
        }],
    }
}

/// Writes the standard fixture: a tokenizer section, a quantized weight
/// (packed u32 + scales + biases), a bf16 weight, an f32 norm, a zero-sized
/// tensor, a StableHLO graph and two IREE modules for different targets.
pub fn write_sample(path: &Path) -> PathBuf {
    let mut w = BundleWriter::create(path, model()).expect("create");
    w.set_chat_template("{% for m in messages %}{{ m.content }}{% endfor %}");
    w.set_generation_defaults_json(r#"{"eos_token_id":2,"temperature":0.7,"top_p":0.9}"#);
    w.set_provenance(provenance());
    w.add_metadata("mlxcel.test", "yes");
    w.add_tokenizer_json(&br#"{"model":{"type":"BPE"}}"#[..]).expect("tokenizer");
    let q = Quantization {
        mode: "affine".into(),
        bits: 4,
        group_size: 32,
        scales: "model.layers.0.mlp.down_proj.scales".into(),
        biases: Some("model.layers.0.mlp.down_proj.biases".into()),
    };
    w.add_tensor_bytes(
        TensorSpec::new("model.layers.0.mlp.down_proj.weight", Dtype::U32, [8, 4]).quantized(q),
        &pattern(1, 128),
    )
    .expect("weight");
    w.add_tensor_bytes(TensorSpec::new("model.layers.0.mlp.down_proj.scales", Dtype::F32, [8, 1]), &pattern(2, 32))
        .expect("scales");
    w.add_tensor_bytes(TensorSpec::new("model.layers.0.mlp.down_proj.biases", Dtype::F32, [8, 1]), &pattern(3, 32))
        .expect("biases");
    w.add_tensor(TensorSpec::new("model.embed_tokens.weight", Dtype::Bf16, [16, 8]), &pattern(4, 256)[..])
        .expect("embed");
    w.add_tensor_bytes(
        TensorSpec::new("model.norm.weight", Dtype::F32, [8]).with_property("note", "ones"),
        &pattern(5, 32),
    )
    .expect("norm");
    w.add_tensor_bytes(TensorSpec::new("empty", Dtype::F16, [0, 8]), &[]).expect("empty");
    w.add_section_bytes(SectionSpec::new(kinds::STABLEHLO, "decode"), b"module @decode {}").expect("stablehlo");
    w.add_section_bytes(
        SectionSpec::new(kinds::IREE_VMFB, "decode").with_target("llvm-cpu:x86_64-unknown-linux-gnu:+avx2"),
        &pattern(6, 20000),
    )
    .expect("vmfb avx2");
    w.add_section_bytes(
        SectionSpec::new(kinds::IREE_VMFB, "decode").with_target("cuda:sm_90").with_property("iree_version", "3.13.0"),
        &pattern(7, 100),
    )
    .expect("vmfb cuda");
    let _ = KeyValue::new("unused", "fixture");
    w.finish().expect("finish").path
}

/// The fixture's bytes, written in a fresh temporary directory.
pub fn sample_bytes() -> Vec<u8> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_sample(&dir.path().join("sample.mlxb"));
    std::fs::read(path).expect("read")
}
