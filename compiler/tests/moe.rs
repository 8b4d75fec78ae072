//! Architectures added through the table: Qwen3-MoE from every source it
//! comes in, and Mistral's sliding window, on tiny random models that mlx-lm
//! builds (tests/python/tiny_reference.py), checked against mlx-lm's own
//! tensors.
//!
//! The Qwen3-MoE (hidden 64, 3 layers of which layer 1 is dense, 8 experts
//! of 32 channels, top-2) is written by `python/moe_sources.py` as a Hugging
//! Face directory with one tensor per expert (sharded, each layer's experts
//! split across the shards) and as GGUFs named and shaped as llama.cpp's
//! converter does (F32, Q8_0, Q4_0; the router F32).

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use common::{TempDir, float_values, run_python};
use mlxcel_arch::{LayerType, ModelConfig};
use mlxcel_bundle::{Bundle, Dtype as BundleDtype};
use mlxcel_compiler::compile::{CompileOptions, QuantizeTarget, TensorPlan, compile};
use mlxcel_compiler::ingest::{IngestError, SourceModel};

/// The sources of one tiny Qwen3-MoE.
struct Sources {
    tmp: TempDir,
}

impl Sources {
    fn new() -> Sources {
        let tmp = TempDir::new("moe");
        let dir = |name: &str| tmp.path().join(name).to_str().unwrap().to_string();
        mlxcel_tests::run_reference_script("tiny_reference.py", &["qwen3_moe", &dir("mlx"), "--tokens", "1"]);
        // The same seed, so the same floats before mlx-lm quantizes them.
        mlxcel_tests::run_reference_script(
            "tiny_reference.py",
            &["qwen3_moe", &dir("mlx-q4"), "--bits", "4", "--tokens", "1"],
        );
        run_python("moe_sources.py", &[&tmp.path().join("mlx"), tmp.path()]);
        Sources { tmp }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.tmp.path().join(name)
    }

    /// Compiles `source` with `options` into `name.mlxb`.
    fn compile(&self, source: &str, name: &str, options: &CompileOptions) -> (Bundle, Vec<(String, TensorPlan)>) {
        let src = SourceModel::open(self.path(source)).unwrap_or_else(|e| panic!("{source}: {e}"));
        let out = self.path(&format!("{name}.mlxb"));
        let report = compile(&src, &out, options, None, &mut |_| {}).unwrap_or_else(|e| panic!("{source}: {e}"));
        let b = Bundle::open(&out).unwrap();
        b.verify(|_| {}).unwrap();
        (b, report.tensors.into_iter().map(|t| (t.name, t.plan)).collect())
    }
}

/// Every tensor of an mlx-lm `model.safetensors`: name → (dtype, shape, bytes).
fn mlx_lm_tensors(dir: &Path) -> HashMap<String, (safetensors::Dtype, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors().into_iter().map(|(n, v)| (n, (v.dtype(), v.shape().to_vec(), v.data().to_vec()))).collect()
}

/// Checks that `b` holds exactly mlx-lm's tensors, byte for byte.
fn same_as_mlx_lm(b: &Bundle, mlx_dir: &Path, what: &str) {
    let want = mlx_lm_tensors(mlx_dir);
    assert_eq!(b.tensors().len(), want.len(), "{what}: tensor count");
    for (name, (dtype, shape, data)) in &want {
        let t = b.tensor(name).unwrap_or_else(|| panic!("{what}: {name} missing"));
        let bundle_dtype = match dtype {
            safetensors::Dtype::F32 => BundleDtype::F32,
            safetensors::Dtype::U32 => BundleDtype::U32,
            other => panic!("{name}: {other:?}"),
        };
        assert_eq!((t.dtype(), t.shape()), (bundle_dtype, shape.iter().map(|&d| d as u64).collect()), "{what}: {name}");
        assert!(t.data() == data.as_slice(), "{what}: {name} differs from mlx-lm's");
    }
}

/// The normalized config of a bundle.
fn config(b: &Bundle) -> ModelConfig {
    ModelConfig::from_bundle_json(b.architecture(), b.config_json()).unwrap()
}

fn check_moe_config(b: &Bundle) {
    assert_eq!(b.architecture(), "qwen3_moe");
    let c = config(b);
    let moe = c.moe.as_ref().unwrap();
    assert_eq!((moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size), (8, 2, 32));
    assert!(moe.norm_topk_prob);
    assert_eq!(moe.sparse_layers, vec![true, false, true]);
    assert_eq!((c.intermediate_size, c.head_dim, c.tie_word_embeddings), (128, 16, false));
}

#[test]
fn qwen3_moe_from_hugging_face_mlx_lm_and_gguf() {
    let s = Sources::new();

    // A Hugging Face directory, one tensor per expert: stacked as mlx-lm
    // stacks them, streamed expert by expert, byte-identical to mlx-lm's.
    let hf = SourceModel::open(s.path("hf")).unwrap();
    let stack = hf.tensor("model.layers.0.mlp.switch_mlp.down_proj.weight").unwrap();
    assert_eq!(stack.shape, vec![8, 64, 32]);
    assert_eq!(stack.source_name, "model.layers.0.mlp.experts.*.down_proj.weight");
    assert!(!hf.tensors().iter().any(|t| t.name.contains(".experts.")));
    assert_eq!(hf.float_chunks(stack, 1 << 20).unwrap().count(), 8, "one chunk per expert");
    let (from_hf, _) = s.compile("hf", "hf", &CompileOptions::default());
    same_as_mlx_lm(&from_hf, &s.path("mlx"), "hf");
    check_moe_config(&from_hf);

    // mlx-lm's own float directory (experts already stacked): the same bundle tensors.
    let (from_mlx, _) = s.compile("mlx", "mlx", &CompileOptions::default());
    same_as_mlx_lm(&from_mlx, &s.path("mlx"), "mlx-lm float");

    // `--quantize q4 --group-size 32` of the float experts is what mlx-lm's
    // quantize_model makes of the same floats (the router at 8 bits, group 64).
    let q4 = CompileOptions { quantize: QuantizeTarget::Affine(4), group_size: 32, ..CompileOptions::default() };
    let (quantized, plans) = s.compile("hf", "hf-q4", &q4);
    same_as_mlx_lm(&quantized, &s.path("mlx-q4"), "hf --quantize q4");
    let plan_of = |name: &str| plans.iter().find(|(n, _)| n == name).map(|(_, p)| p.clone()).unwrap();
    assert_eq!(plan_of("model.layers.0.mlp.gate.weight"), TensorPlan::Quantize { bits: 8, group_size: 64 });
    assert_eq!(
        plan_of("model.layers.2.mlp.switch_mlp.up_proj.weight"),
        TensorPlan::Quantize { bits: 4, group_size: 32 }
    );
    let q = quantized.tensor("model.layers.0.mlp.switch_mlp.gate_proj.weight").unwrap();
    assert_eq!((q.shape(), q.quantization().unwrap().bits), (vec![8, 32, 64 * 4 / 32], 4));

    // mlx-lm's quantized directory (3-D packed experts, per-layer router
    // entries in `quantization`): kept as it is.
    let (kept, plans) = s.compile("mlx-q4", "mlx-q4", &CompileOptions::default());
    same_as_mlx_lm(&kept, &s.path("mlx-q4"), "mlx-lm q4");
    assert!(plans.iter().filter(|(n, _)| n.contains("switch_mlp")).all(|(_, p)| *p == TensorPlan::KeepAffine));

    // The GGUF of the same model, as llama.cpp lays it out: F32 gives the
    // same tensors exactly.
    let (from_gguf, _) = s.compile("f32.gguf", "gguf-f32", &CompileOptions::default());
    same_as_mlx_lm(&from_gguf, &s.path("mlx"), "f32.gguf");
    check_moe_config(&from_gguf);

    // Q8_0 and Q4_0: every matrix but the router (F32) is kept as its
    // blocks, transcoded without loss (3-D experts as one tall matrix), and
    // each value is within the format's step of the float it quantized, per
    // block of 32 along a row: Q8_0 rounds to steps of d = amax/127 (error
    // ≤ d/2), Q4_0 to d = amax/8 with the extreme of the other sign clamped a
    // full step away (error ≤ d); d is stored as f16, and its rounding (at
    // most 2^-11 of d) moves the largest code's value by up to 127 (Q8_0) or
    // 8 (Q4_0) times that.
    let float = mlx_lm_tensors(&s.path("mlx"));
    let f16_step = 2f32.powi(-11);
    for (file, bound) in [("q8_0.gguf", (0.5 + 127.0 * f16_step) / 127.0), ("q4_0.gguf", (1.0 + 8.0 * f16_step) / 8.0)]
    {
        let (b, plans) = s.compile(file, file, &CompileOptions::default());
        check_moe_config(&b);
        let source = SourceModel::open(s.path(file)).unwrap();
        for (name, plan) in &plans {
            let router_or_vector = name.contains("norm") || name.ends_with("mlp.gate.weight");
            assert_eq!(*plan == TensorPlan::KeepAffine, !router_or_vector, "{file}: {name} {plan}");
            let stored = float_values(&b, name);
            // Lossless: the bundle holds exactly the GGUF's dequantized values.
            let dequantized = source.load_float(source.tensor(name).unwrap()).unwrap().to_f32();
            assert!(stored == dequantized, "{file}: {name} is not the GGUF's values");
            let (_, _, bytes) = &float[name];
            let exact: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            for (block, (s_block, e_block)) in stored.chunks(32).zip(exact.chunks(32)).enumerate() {
                let amax = e_block.iter().fold(0f32, |m, v| m.max(v.abs()));
                let worst = s_block.iter().zip(e_block).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                assert!(
                    worst <= amax * bound * 1.0001 + 1e-7,
                    "{file}: {name} block {block}: {worst} > {amax} x {bound}"
                );
            }
        }
    }
}

#[test]
fn qwen3_moe_expert_errors_name_the_tensor() {
    let s = Sources::new();
    let hf = s.path("hf");
    // Drop expert 5's gate_proj of layer 2 from the second shard.
    let shard = hf.join("model-00002-of-00002.safetensors");
    let bytes = std::fs::read(&shard).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let gone = "model.layers.2.mlp.experts.5.gate_proj.weight";
    let kept: Vec<(String, safetensors::tensor::TensorView<'_>)> =
        st.tensors().into_iter().filter(|(n, _)| n != gone).collect();
    safetensors::serialize_to_file(kept, None, &hf.join("short.safetensors")).unwrap();
    std::fs::rename(hf.join("short.safetensors"), &shard).unwrap();
    let e = SourceModel::open(&hf).unwrap_err();
    assert!(matches!(e, IngestError::Tensor { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains(gone)
            && msg
                .contains("missing: model.layers.2.mlp.switch_mlp.gate_proj.weight stacks all 8 experts (num_experts)"),
        "{msg}"
    );

    // A config with fewer experts than the files hold.
    let mut config = mlxcel_tests::read_json(&hf.join("config.json"));
    config["num_experts"] = serde_json::json!(4);
    config["num_experts_per_tok"] = serde_json::json!(2);
    std::fs::write(hf.join("config.json"), config.to_string()).unwrap();
    let msg = SourceModel::open(&hf).unwrap_err().to_string();
    assert!(msg.contains("expert 4 does not exist: num_experts is 4"), "{msg}");
}

#[test]
fn mistral_slides_every_layer_over_its_window() {
    let tmp = TempDir::new("mistral");
    let dir = tmp.path().join("mistral");
    mlxcel_tests::run_reference_script("tiny_reference.py", &["mistral", dir.to_str().unwrap(), "--tokens", "1"]);
    // mlx-lm's config: `sliding_window` and no `layer_types`, as Hugging Face's Mistral.
    let source = mlxcel_tests::read_json(&dir.join("config.json"));
    assert_eq!((source["sliding_window"].as_u64(), source.get("layer_types")), (Some(8), None));
    let src = SourceModel::open(&dir).unwrap();
    let out = tmp.path().join("m.mlxb");
    compile(&src, &out, &CompileOptions::default(), None, &mut |_| {}).unwrap();
    let b = Bundle::open(&out).unwrap();
    assert_eq!(b.architecture(), "mistral");
    let c = config(&b);
    assert_eq!(c.layer_types, vec![LayerType::SlidingAttention; 3]);
    assert_eq!((c.sliding_window, c.window(2)), (Some(8), Some(8)));
    same_as_mlx_lm(&b, &dir, "mistral");
}
