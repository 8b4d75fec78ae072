//! SmolLM2 as a Hugging Face directory (made from the GGUF in Python, with the
//! pip `gguf` package and transformers' reverse transforms) and as an MLX
//! 4-bit directory (made from that with mlx-lm's `convert`): both ingest, and
//! their tensors agree with the GGUF route; compiled into bundles, the GGUF
//! route (lossless transcode) and the HF route (floats) hold the same values
//! exactly, and the MLX route stores the directory's own bytes.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use common::{SMOLLM2, TempDir, float_values, model, python, run_python};
use mlxcel_bundle::Bundle;
use mlxcel_compiler::compile::{CompileOptions, QuantizeTarget, compile};
use mlxcel_compiler::ingest::{FloatDtype, SourceFormat, SourceModel, Storage, TensorData};
use mlxcel_mlx::Dtype;

fn names(m: &SourceModel) -> BTreeSet<String> {
    m.tensors().iter().map(|t| t.name.clone()).collect()
}

fn rel_rms(a: &[f32], b: &[f32]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        num += f64::from(x - y).powi(2);
        den += f64::from(*y).powi(2);
    }
    (num / den.max(1e-30)).sqrt()
}

#[test]
fn smollm2_hf_and_mlx_directories_agree_with_the_gguf() {
    let gguf_path = model(SMOLLM2);
    let gguf = SourceModel::open(&gguf_path).unwrap();
    let tmp = TempDir::new("smollm2-dirs");
    let hf_dir = tmp.path().join("hf");
    run_python("make_hf_dir.py", &[&gguf_path, &hf_dir, Path::new("f32")]);

    // --- The Hugging Face directory: every tensor equals the GGUF route's floats.
    let hf = SourceModel::open(&hf_dir).unwrap();
    assert_eq!(hf.format(), SourceFormat::HuggingFace);
    assert_eq!(hf.config().architecture, gguf.config().architecture);
    assert_eq!(names(&hf), names(&gguf));
    // The directory's config.json has rope and token keys the GGUF's metadata
    // lacks; the sizes agree.
    let (c, g) = (hf.config(), gguf.config());
    assert_eq!(
        (c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads),
        (g.hidden_size, g.intermediate_size, g.num_hidden_layers, g.num_attention_heads)
    );
    assert_eq!((c.num_key_value_heads, c.head_dim, c.vocab_size), (g.num_key_value_heads, g.head_dim, g.vocab_size));
    for info in hf.tensors() {
        assert_eq!(info.storage, Storage::Float(FloatDtype::F32), "{}", info.name);
        let from_hf = hf.load_float(info).unwrap();
        assert!(matches!(from_hf.data, std::borrow::Cow::Borrowed(_)), "float safetensors load without a copy");
        let g = gguf.tensor(&info.name).unwrap();
        assert_eq!(g.shape, info.shape, "{}", info.name);
        let from_gguf = gguf.load_float(g).unwrap().to_f32();
        assert!(from_hf.to_f32() == from_gguf, "{}: the HF directory and the GGUF differ", info.name);
    }
    let tok = hf.tokenizer().unwrap();
    assert!(tok.chat_template.unwrap().contains("<|im_start|>"));
    let t: tokenizers::Tokenizer = tok.tokenizer_json.parse().unwrap();
    assert_eq!(t.encode("Hello world", false).unwrap().get_ids(), &[19556, 905]);
    let defaults = hf.generation().unwrap();
    assert_eq!(defaults.eos_token_ids, vec![2]);
    assert_eq!(defaults.bos_token_id, Some(1));
    assert!(hf.source_files().iter().any(|p| p.ends_with("model.safetensors")));

    // --- The MLX 4-bit directory, as mlx-lm's convert writes it.
    let mlx_dir = tmp.path().join("mlx");
    let out = std::process::Command::new(python())
        .args(["-m", "mlx_lm.convert", "--hf-path"])
        .arg(&hf_dir)
        .arg("--mlx-path")
        .arg(&mlx_dir)
        .args(["-q", "--q-bits", "4", "--q-group-size", "32"])
        .output()
        .unwrap();
    assert!(out.status.success(), "mlx_lm.convert failed: {}", String::from_utf8_lossy(&out.stderr));
    let mlx = SourceModel::open(&mlx_dir).unwrap();
    assert_eq!(mlx.format(), SourceFormat::MlxQuantized);
    assert_eq!(names(&mlx), names(&gguf));
    let mut quantized = 0;
    for info in mlx.tensors() {
        let g = gguf.tensor(&info.name).unwrap();
        assert_eq!(g.shape, info.shape, "{}", info.name);
        let reference = gguf.load_float(g).unwrap().to_f32();
        match mlx.load(info).unwrap() {
            TensorData::Affine(q) => {
                quantized += 1;
                assert_eq!((q.bits, q.group_size), (4, 32), "{}", info.name);
                assert!(matches!(info.storage, Storage::MlxAffine { bits: 4, group_size: 32, .. }));
                // Requantized from the Q4_1/Q8_0 values: close, not equal.
                let floats = mlx.load_float(info).unwrap();
                let values = floats.to_f32();
                let err = rel_rms(&values, &reference);
                assert!(err < 0.12, "{}: relative RMS error {err}", info.name);
                // The triple as loaded is what MLX dequantizes.
                let deq = q.to_quantized().unwrap().dequantize(Some(Dtype::F32)).unwrap().to_vec::<f32>().unwrap();
                assert!(deq == values, "{}", info.name);
            }
            TensorData::Float(f) => {
                // Norms stay float, equal to the GGUF route.
                assert!(info.name.ends_with("norm.weight"), "{} should be quantized", info.name);
                assert!(f.to_f32() == reference, "{}", info.name);
            }
        }
    }
    assert_eq!(quantized, 1 + 30 * 7);

    // --- The three routes compiled into bundles agree where the route is lossless.
    let bundle_of = |src: &SourceModel, file: &str, quantize: QuantizeTarget| {
        let path = tmp.path().join(file);
        let options = CompileOptions { quantize, ..CompileOptions::default() };
        compile(src, &path, &options, None, &mut |_| {}).unwrap();
        Bundle::open(&path).unwrap()
    };
    let from_gguf = bundle_of(&gguf, "gguf.mlxb", QuantizeTarget::Auto);
    let from_hf = bundle_of(&hf, "hf.mlxb", QuantizeTarget::None);
    let from_mlx = bundle_of(&mlx, "mlx.mlxb", QuantizeTarget::Auto);
    // GGUF (kept Q4_1/Q8_0 blocks) vs HF floats: the same values, exactly.
    let mut compared = 0;
    for t in from_hf.tensors() {
        let ours = float_values(&from_gguf, t.name());
        let floats: Vec<f32> = t.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        assert!(ours == floats, "{}: the GGUF and HF bundles differ", t.name());
        compared += 1;
    }
    assert_eq!(compared, gguf.tensors().len());
    // The MLX directory is taken as it is: every stored byte comes from it.
    for info in mlx.tensors() {
        match mlx.load(info).unwrap() {
            TensorData::Affine(q) => {
                let prefix = info.name.strip_suffix(".weight").unwrap();
                assert_eq!(from_mlx.tensor(&info.name).unwrap().data(), &q.weight[..], "{}", info.name);
                let scales = from_mlx.tensor(&format!("{prefix}.scales")).unwrap();
                assert_eq!(scales.data(), &q.scales.data[..], "{prefix}.scales");
                let biases = from_mlx.tensor(&format!("{prefix}.biases")).unwrap();
                assert_eq!(biases.data(), &q.biases.data[..], "{prefix}.biases");
            }
            TensorData::Float(f) => {
                let stored = float_values(&from_mlx, &info.name);
                assert!(stored == f.to_f32(), "{}", info.name);
            }
        }
    }
}
