//! Weight surgery on the real SmolLM2: identity edits change no tensor, each
//! operation computes what it says (checked against references computed
//! here), interpolation endpoints reproduce their sources, every example in
//! examples/surgery compiles, and a failed surgery writes nothing.

mod common;

use std::path::Path;

use common::{SMOLLM2, TempDir, float_values, model};
use mlxcel_bundle::Bundle;
use mlxcel_compiler::compile::{CompileOptions, compile};
use mlxcel_compiler::ingest::SourceModel;
use mlxcel_surgery::Surgery;

fn surgery(dir: &Path, yaml: &str) -> Surgery {
    Surgery::parse(yaml, dir).unwrap()
}

fn compile_with(src: &SourceModel, out: &Path, s: Option<&Surgery>) -> Bundle {
    compile(src, out, &CompileOptions::default(), s, &mut |_| {}).unwrap();
    Bundle::open(out).unwrap()
}

/// Writes f32 tensors to a safetensors file.
fn write_f32(path: &Path, tensors: &[(String, Vec<usize>, Vec<f32>)]) {
    let bytes: Vec<Vec<u8>> =
        tensors.iter().map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect()).collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .zip(&bytes)
        .map(|((n, s, _), b)| {
            (n.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b).unwrap())
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// A deterministic pseudo-random vector.
fn noise(n: usize, seed: u32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2_654_435_761).max(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x as f32 / u32::MAX as f32) - 0.5
        })
        .collect()
}

fn same_tensors(a: &Bundle, b: &Bundle) {
    assert_eq!(a.tensor_count(), b.tensor_count());
    for t in a.tensors() {
        assert!(t.data() == b.tensor(t.name()).unwrap().data(), "{} differs", t.name());
    }
}

#[test]
fn identity_edits_change_no_tensor() {
    let src = SourceModel::open(model(SMOLLM2)).unwrap();
    let tmp = TempDir::new("surgery-identity");
    let plain = compile_with(&src, &tmp.path().join("plain.mlxb"), None);
    let down = src.tensor("model.layers.0.mlp.down_proj.weight").unwrap().shape.clone();
    write_f32(
        &tmp.path().join("zeros.safetensors"),
        &[
            ("model.layers.0.mlp.down_proj.weight".into(), down.clone(), vec![0.0; down.iter().product()]),
            ("model.norm.weight".into(), vec![576], vec![0.0; 576]),
        ],
    );
    let s = surgery(
        tmp.path(),
        "version: 1\noperations:\n  - op: scale\n    targets: \"model.layers.*.mlp.down_proj.weight\"\n    factor: 1.0\n  - op: add\n    targets: [\"model.layers.0.mlp.down_proj.weight\", \"model.norm.weight\"]\n    source: zeros.safetensors\n    alpha: 3\n",
    );
    let edited = compile_with(&src, &tmp.path().join("edited.mlxb"), Some(&s));
    same_tensors(&plain, &edited);
    // Only the provenance tells them apart.
    let record = edited.provenance().surgery.as_ref().expect("surgery recorded");
    assert_eq!(record.yaml.as_str(), s.yaml);
    assert_eq!(record.operations.len(), 2);
    assert_eq!(record.operations[0].matched_tensors.as_ref().unwrap().len(), 30);
    assert!(plain.provenance().surgery.is_none());
}

#[test]
fn operations_compute_what_they_say() {
    let src = SourceModel::open(model(SMOLLM2)).unwrap();
    let tmp = TempDir::new("surgery-numerics");
    let plain = compile_with(&src, &tmp.path().join("plain.mlxb"), None);
    let norm = |b: &Bundle, n: &str| float_values(b, n);
    let delta = noise(576, 1);
    let donor = noise(576, 2);
    let other = noise(576, 3).iter().map(|v| v + 1.0).collect::<Vec<_>>();
    write_f32(
        &tmp.path().join("files.safetensors"),
        &[
            ("delta".into(), vec![576], delta.clone()),
            ("donor.0".into(), vec![576], donor.clone()),
            ("model.layers.2.post_attention_layernorm.weight".into(), vec![576], other.clone()),
            ("model.layers.3.post_attention_layernorm.weight".into(), vec![576], other.clone()),
        ],
    );
    let s = surgery(
        tmp.path(),
        r#"version: 1
operations:
  - op: scale
    targets: "model.layers.1.input_layernorm.weight"
    factor: 0.5
  - op: add
    targets: "model.norm.weight"
    source: files.safetensors
    key: delta
    alpha: 0.3
  - op: replace
    targets: "model.layers.*.input_layernorm.weight"
    source: files.safetensors
    key: "donor.*"
  - op: interpolate
    targets: "model.layers.2.post_attention_layernorm.weight"
    sources: [model, files.safetensors]
    ratio: 0.25
  - op: interpolate
    targets: "model.layers.3.post_attention_layernorm.weight"
    sources: [model, files.safetensors]
    ratio: 0.7
    method: slerp
  - op: prune
    granularity: attention_head
    ids: [1]
    layers: [4]
    mode: zero
"#,
    );
    // `replace` with key donor.* only finds donor.0: the other layers' norms are missing.
    let err = s.plan(common_view(&src).view()).unwrap_err().to_string();
    assert!(err.starts_with("surgery operation #3 (replace, line 11): source "), "{err}");
    assert!(err.contains("has no tensor donor.1 (for model.layers.1.input_layernorm.weight)"), "{err}");
    let s = surgery(
        tmp.path(),
        &s.yaml
            .replace("model.layers.*.input_layernorm.weight", "model.layers.0.input_layernorm.weight")
            .replace("donor.*", "donor.0"),
    );
    let b = compile_with(&src, &tmp.path().join("edited.mlxb"), Some(&s));

    let scaled: Vec<f32> = norm(&plain, "model.layers.1.input_layernorm.weight").iter().map(|v| v * 0.5).collect();
    assert_eq!(norm(&b, "model.layers.1.input_layernorm.weight"), scaled);
    let added: Vec<f32> = norm(&plain, "model.norm.weight").iter().zip(&delta).map(|(w, d)| w + d * 0.3).collect();
    let got = norm(&b, "model.norm.weight");
    assert!(got.iter().zip(&added).all(|(g, w)| (g - w).abs() <= 1e-6 * w.abs().max(1.0)), "add");
    assert_eq!(norm(&b, "model.layers.0.input_layernorm.weight"), donor);
    let a2 = norm(&plain, "model.layers.2.post_attention_layernorm.weight");
    let lerp: Vec<f32> = a2.iter().zip(&other).map(|(x, y)| 0.75 * x + 0.25 * y).collect();
    let got = norm(&b, "model.layers.2.post_attention_layernorm.weight");
    assert!(got.iter().zip(&lerp).all(|(g, w)| (g - w).abs() <= 1e-6 * w.abs().max(1.0)), "lerp");
    // Slerp of the flattened vectors, in f64.
    let a3: Vec<f64> =
        norm(&plain, "model.layers.3.post_attention_layernorm.weight").iter().map(|&v| f64::from(v)).collect();
    let b3: Vec<f64> = other.iter().map(|&v| f64::from(v)).collect();
    let dot = |x: &[f64], y: &[f64]| x.iter().zip(y).map(|(p, q)| p * q).sum::<f64>();
    let omega = (dot(&a3, &b3) / (dot(&a3, &a3).sqrt() * dot(&b3, &b3).sqrt())).clamp(-1.0, 1.0).acos();
    let (wa, wb) = ((0.3 * omega).sin() / omega.sin(), (0.7 * omega).sin() / omega.sin());
    let got = norm(&b, "model.layers.3.post_attention_layernorm.weight");
    for ((g, x), y) in got.iter().zip(&a3).zip(&b3) {
        let want = wa * x + wb * y;
        assert!((f64::from(*g) - want).abs() <= 1e-5 * want.abs().max(1.0), "slerp: {g} vs {want}");
    }
    // Head 1 of layer 4 zeroed: its 64 query rows and 64 output columns are
    // exactly zero; the rest is requantized at the source's 4 bits, group 32,
    // by MLX, whose grid may land up to one step ((max - min) / 15 of the
    // group) from the source values.
    let (q0, q1) =
        (norm(&plain, "model.layers.4.self_attn.q_proj.weight"), norm(&b, "model.layers.4.self_attn.q_proj.weight"));
    for (g, (before, after)) in q0.chunks(32).zip(q1.chunks(32)).enumerate() {
        let row = g * 32 / 576;
        if (64..128).contains(&row) {
            assert!(after.iter().all(|&v| v == 0.0), "q row {row}");
            continue;
        }
        let (lo, hi) = before.iter().fold((f32::MAX, f32::MIN), |(l, h), &v| (l.min(v), h.max(v)));
        let step = (hi - lo) / 15.0;
        for (x, y) in before.iter().zip(after) {
            assert!((x - y).abs() <= step * 1.001 + 1e-6, "q group {g}: {x} -> {y} (step {step})");
        }
    }
    let o1 = norm(&b, "model.layers.4.self_attn.o_proj.weight");
    assert!(o1.iter().enumerate().filter(|(i, _)| (64..128).contains(&(i % 576))).all(|(_, v)| *v == 0.0));
    // Untouched tensors are stored exactly as without surgery.
    assert_eq!(
        b.tensor("model.layers.5.self_attn.q_proj.weight").unwrap().data(),
        plain.tensor("model.layers.5.self_attn.q_proj.weight").unwrap().data()
    );
}

/// The model view of a source, for planning in tests.
struct Views {
    config: mlxcel_compiler::ingest::ModelConfig,
    tensors: Vec<mlxcel_surgery::ModelTensor>,
}

impl Views {
    fn view(&self) -> mlxcel_surgery::ModelView<'_> {
        mlxcel_surgery::ModelView { config: &self.config, tensors: &self.tensors }
    }
}

fn common_view(src: &SourceModel) -> Views {
    Views {
        config: src.config().clone(),
        tensors: src
            .tensors()
            .iter()
            .map(|t| mlxcel_surgery::ModelTensor { name: t.name.clone(), shape: t.shape.clone() })
            .collect(),
    }
}

#[test]
fn interpolation_endpoints_reproduce_each_source() {
    let src = SourceModel::open(model(SMOLLM2)).unwrap();
    let tmp = TempDir::new("surgery-endpoints");
    let plain = compile_with(&src, &tmp.path().join("plain.mlxb"), None);
    let names: Vec<String> = (0..30).map(|l| format!("model.layers.{l}.input_layernorm.weight")).collect();
    let other: Vec<(String, Vec<usize>, Vec<f32>)> =
        names.iter().enumerate().map(|(i, n)| (n.clone(), vec![576], noise(576, 10 + i as u32))).collect();
    write_f32(&tmp.path().join("other.safetensors"), &other);
    for method in ["lerp", "slerp"] {
        let yaml = |ratio: &str| {
            format!(
                "version: 1\noperations:\n  - op: interpolate\n    targets: \"model.layers.*.input_layernorm.weight\"\n    sources: [model, other.safetensors]\n    ratio: {ratio}\n    method: {method}\n"
            )
        };
        let at0 = compile_with(&src, &tmp.path().join("at0.mlxb"), Some(&surgery(tmp.path(), &yaml("0"))));
        same_tensors(&plain, &at0);
        let at1 = compile_with(&src, &tmp.path().join("at1.mlxb"), Some(&surgery(tmp.path(), &yaml("1"))));
        for (n, _, values) in &other {
            assert_eq!(&float_values(&at1, n), values, "{method} at 1: {n}");
        }
    }
}

#[test]
fn every_example_compiles() {
    let src = SourceModel::open(model(SMOLLM2)).unwrap();
    let tmp = TempDir::new("surgery-examples");
    let examples = mlxcel_tests::workspace_root().join("examples/surgery");
    // The files the examples read, with the model's names and shapes.
    let o_proj: Vec<(String, Vec<usize>, Vec<f32>)> = (0..30)
        .map(|l| (format!("model.layers.{l}.self_attn.o_proj.weight"), vec![576, 576], noise(576 * 576, l)))
        .map(|(n, s, v)| (n, s, v.iter().map(|x| x * 0.01).collect()))
        .collect();
    write_f32(&tmp.path().join("task_vector.safetensors"), &o_proj);
    let mut donor: Vec<(String, Vec<usize>, Vec<f32>)> = vec![("final_norm.weight".into(), vec![576], vec![1.0; 576])];
    donor.extend((0..30).map(|l| (format!("blocks.{l}.attn_norm.weight"), vec![576], vec![1.0; 576])));
    write_f32(&tmp.path().join("donor.safetensors"), &donor);
    let other: Vec<(String, Vec<usize>, Vec<f32>)> = (0..30)
        .flat_map(|l| {
            ["input_layernorm", "post_attention_layernorm"].map(|n| {
                (
                    format!("model.layers.{l}.{n}.weight"),
                    vec![576],
                    noise(576, l + 100).iter().map(|v| v + 1.0).collect(),
                )
            })
        })
        .collect();
    write_f32(&tmp.path().join("other_checkpoint.safetensors"), &other);
    let mut compiled = 0;
    for entry in std::fs::read_dir(&examples).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let copy = tmp.path().join(path.file_name().unwrap());
        std::fs::copy(&path, &copy).unwrap();
        let s = Surgery::from_file(&copy).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let out = tmp.path().join("example.mlxb");
        compile(&src, &out, &CompileOptions::default(), Some(&s), &mut |_| {})
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Bundle::open(&out).unwrap().verify(|_| {}).unwrap();
        compiled += 1;
    }
    assert_eq!(compiled, 7, "every example YAML compiles");
}

#[test]
fn a_failed_surgery_writes_nothing() {
    let src = SourceModel::open(model(SMOLLM2)).unwrap();
    let tmp = TempDir::new("surgery-failure");
    let out_dir = tmp.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let s = surgery(
        tmp.path(),
        "version: 1\noperations:\n  - op: add\n    targets: \"model.norm.weight\"\n    source: missing.safetensors\n",
    );
    let err = compile(&src, &out_dir.join("x.mlxb"), &CompileOptions::default(), Some(&s), &mut |_| {}).unwrap_err();
    assert!(err.to_string().starts_with("surgery operation #1 (add, line 3): source cannot open"), "{err}");
    assert_eq!(std::fs::read_dir(&out_dir).unwrap().count(), 0);
}
