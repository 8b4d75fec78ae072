//! Shared helpers of the workspace's end-to-end tests (in `tests/tests/`).

pub mod hub;
pub mod isa;
pub mod server;
pub mod steps;
pub mod tiny;

use std::path::{Path, PathBuf};
use std::process::Command;

use mlxcel_arch::{Architecture, LayerType, ModelConfig};
use mlxcel_mlx::{Array, Dtype, QuantMode, WeightLayout};
use mlxcel_runtime::weights::{QuantSpec, Weights};

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Where `make setup` puts the real models (`MLXCEL_MODELS_DIR` overrides).
pub fn models_dir() -> PathBuf {
    std::env::var_os("MLXCEL_MODELS_DIR").map(PathBuf::from).unwrap_or_else(|| workspace_root().join(".deps/models"))
}

/// The Python of the pinned reference environment (`make setup` makes it).
pub fn reference_python() -> PathBuf {
    let deps = std::env::var_os("MLXCEL_DEPS_DIR").map(PathBuf::from).unwrap_or_else(|| workspace_root().join(".deps"));
    let python = deps.join("venv/bin/python");
    assert!(python.is_file(), "{} is missing: run `make setup`", python.display());
    python
}

/// Runs a script of `tests/python/` with the reference Python; panics with
/// its output when it fails.
pub fn run_reference_script(script: &str, args: &[&str]) -> String {
    let path = workspace_root().join("tests/python").join(script);
    let out = Command::new(reference_python())
        .arg(&path)
        .args(args)
        .env("PYTHONUNBUFFERED", "1")
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", path.display()));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{script} {args:?} failed:\n{text}");
    text
}

/// A real model file from the setup's model folder.
pub fn real_model(file: &str) -> PathBuf {
    let p = models_dir().join(file);
    assert!(p.is_file(), "{} is missing: run `make setup`", p.display());
    p
}

/// Reads a JSON file.
pub fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

/// The chat template of tiny test bundles.
pub const TINY_CHAT_TEMPLATE: &str = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}";

/// A tiny random model made by mlx-lm (tests/python/tiny_reference.py) in
/// `dir`, written as a bundle `dir/model.mlxb` with a byte-level tokenizer,
/// [`TINY_CHAT_TEMPLATE`] and end token 255, and the normalized config as the
/// compiler writes it (`tie_word_embeddings` as the tensors have it). Returns
/// the bundle's path.
pub fn tiny_bundle(dir: &Path, arch: &str, bits: u32) -> PathBuf {
    use mlxcel_bundle::{BundleWriter, Dtype, ModelInfo, Quantization, TensorSpec};
    let src = dir.join("source");
    let src_arg = src.to_str().expect("utf-8 temp path");
    let bits_arg = bits.to_string();
    let mut args = vec![arch, src_arg, "--tokens", "1"];
    if bits > 0 {
        args.extend(["--bits", &bits_arg]);
    }
    run_reference_script("tiny_reference.py", &args);
    let config = read_json(&src.join("config.json"));
    let model_type = config["model_type"].as_str().expect("model_type");
    let architecture = Architecture::from_hf(model_type).unwrap_or_else(|| panic!("unknown model_type {model_type}"));
    let mut normalized = ModelConfig::from_hf(architecture, &config).expect("normalize config.json");
    let bytes = std::fs::read(src.join("model.safetensors")).expect("weights");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    normalized.tie_word_embeddings = st.tensor("lm_head.weight").is_err();
    let path = dir.join("model.mlxb");
    let model = ModelInfo {
        architecture: architecture.name().to_string(),
        name: format!("tiny-{arch}"),
        config_json: normalized.to_json(),
    };
    let mut w = BundleWriter::create(&path, model).expect("create bundle");
    w.add_tokenizer_json(std::fs::File::open(src.join("tokenizer.json")).expect("tokenizer.json")).expect("tokenizer");
    w.set_chat_template(TINY_CHAT_TEMPLATE);
    w.set_generation_defaults_json(r#"{"eos_token_id": 255, "bos_token_id": 1}"#);
    let mut names: Vec<String> = st.names().into_iter().map(str::to_string).collect();
    names.sort();
    for name in names {
        let view = st.tensor(&name).expect("listed tensor");
        let dtype = match view.dtype() {
            safetensors::Dtype::F32 => Dtype::F32,
            safetensors::Dtype::U32 => Dtype::U32,
            other => panic!("{name}: unexpected dtype {other:?}"),
        };
        let shape: Vec<u64> = view.shape().iter().map(|&d| d as u64).collect();
        let mut spec = TensorSpec::new(name.clone(), dtype, shape);
        if let Some(prefix) = name.strip_suffix(".weight").filter(|p| st.tensor(&format!("{p}.scales")).is_ok()) {
            // A layer quantized otherwise (mlx-lm's Qwen3-MoE router: 8 bits,
            // group 64) has its own entry.
            let q = &config["quantization"];
            let q = q.get(prefix).filter(|v| v.is_object()).unwrap_or(q);
            spec = spec.quantized(Quantization {
                mode: "affine".into(),
                bits: q["bits"].as_u64().expect("bits") as u32,
                group_size: q["group_size"].as_u64().expect("group_size") as u32,
                scales: format!("{prefix}.scales"),
                biases: Some(format!("{prefix}.biases")),
            });
        }
        w.add_tensor_bytes(spec, view.data()).expect("tensor");
    }
    w.finish().expect("finish bundle");
    path
}

/// The `mlxcel` binary built for this test run.
pub fn mlxcel_bin() -> PathBuf {
    // Test executables live in <target>/<profile>/deps; binaries one level up.
    let exe = std::env::current_exe().expect("test executable path");
    let p = exe.parent().and_then(Path::parent).expect("target profile folder").join("mlxcel");
    assert!(p.is_file(), "{} is missing: build the workspace first (cargo build)", p.display());
    p
}

/// The config mlx-lm reads for a normalized config: `model_type`, and what
/// mlx-lm's model classes take instead of the normalized per-layer lists
/// (Gemma 3's `sliding_window_pattern`, Qwen3-MoE's top-level expert keys
/// with `decoder_sparse_step` and `mlp_only_layers`, `hidden_activation`).
/// Panics where mlx-lm cannot express the config (Gemma 3 layer types that
/// follow no pattern, e.g. after removing a layer; a Llama or Mistral whose
/// layers all slide, which mlx-lm's llama.py cannot build).
pub fn mlx_lm_config(normalized: &ModelConfig) -> serde_json::Value {
    let mut config = serde_json::to_value(normalized).expect("a config serializes");
    let c = config.as_object_mut().expect("an object");
    for key in ["mlxcel_config_version", "architecture", "moe"] {
        c.remove(key);
    }
    let arch = normalized.architecture;
    c.insert("model_type".into(), arch.hf_model_type().into());
    let types = &normalized.layer_types;
    match arch {
        Architecture::Gemma3 => {
            let pattern = types.iter().position(|t| *t == LayerType::FullAttention).map_or(types.len() + 1, |i| i + 1);
            let follows =
                types.iter().enumerate().all(|(i, t)| (*t == LayerType::FullAttention) == ((i + 1) % pattern == 0));
            assert!(follows, "mlx-lm's gemma3_text cannot express layer_types {types:?}");
            c.insert("sliding_window_pattern".into(), pattern.into());
            c.insert("hidden_activation".into(), c["hidden_act"].clone());
            // transformers' Gemma3TextConfig (which mlx-lm's loader builds)
            // checks that this one is an integer.
            let scalar = normalized.query_pre_attn_scalar;
            if scalar.fract() == 0.0 {
                c.insert("query_pre_attn_scalar".into(), (scalar as u64).into());
            }
        }
        Architecture::Llama | Architecture::Mistral => {
            assert!(
                types.contains(&LayerType::FullAttention),
                "mlx-lm's llama.py needs at least one full-attention layer"
            );
        }
        Architecture::Qwen3Moe => {
            let moe = normalized.moe.as_ref().expect("a Qwen3-MoE config has moe");
            c.insert("num_experts".into(), moe.num_experts.into());
            c.insert("num_experts_per_tok".into(), moe.num_experts_per_tok.into());
            c.insert("moe_intermediate_size".into(), moe.moe_intermediate_size.into());
            c.insert("norm_topk_prob".into(), moe.norm_topk_prob.into());
            c.insert("decoder_sparse_step".into(), 1.into());
            let dense: Vec<usize> = (0..types.len()).filter(|&l| !moe.sparse_layers[l]).collect();
            c.insert("mlp_only_layers".into(), dense.into());
        }
        Architecture::Qwen2 | Architecture::Qwen3 | Architecture::Phi3 => {}
    }
    config
}

/// Writes the weights of `bundle` as an mlx-lm model directory in `out`
/// (config.json with `quantization` — the bundle's normalized config as
/// [`mlx_lm_config`] turns it back —, model.safetensors with every float
/// tensor in float32 — the precision the CPU runtime computes in —,
/// tokenizer.json and tokenizer_config.json with the chat template), so that
/// mlx-lm runs exactly the weights the runtime runs.
pub fn export_mlx_lm_dir(bundle: &Path, out: &Path) {
    use mlxcel_bundle::{Bundle, Dtype};
    let b = Bundle::open(bundle).expect("open bundle");
    std::fs::create_dir_all(out).expect("create export dir");
    let normalized = ModelConfig::from_bundle_json(b.architecture(), b.config_json()).expect("the bundle's config");
    let mut config = mlx_lm_config(&normalized);
    let defaults: serde_json::Value =
        b.generation_defaults_json().map(|t| serde_json::from_str(t).expect("defaults json")).unwrap_or_default();
    let mut quant: Option<serde_json::Value> = None;
    let mut per_layer = serde_json::Map::new();
    let mut tensors: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for t in b.tensors() {
        let shape: Vec<usize> = t.shape().iter().map(|&d| d as usize).collect();
        // mlx-lm reads MLX's row-major layout (rows16 weights rearranged back).
        let bytes = t.row_major_data().unwrap_or_else(|| panic!("{}: layout {}", t.name(), t.layout()));
        let (dtype, data) = match t.dtype() {
            Dtype::F32 => (safetensors::Dtype::F32, bytes.to_vec()),
            Dtype::F16 => (
                safetensors::Dtype::F32,
                bytes
                    .chunks_exact(2)
                    .flat_map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32().to_le_bytes())
                    .collect(),
            ),
            Dtype::Bf16 => (
                safetensors::Dtype::F32,
                bytes
                    .chunks_exact(2)
                    .flat_map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32().to_le_bytes())
                    .collect(),
            ),
            Dtype::U32 => (safetensors::Dtype::U32, bytes.to_vec()),
            other => panic!("{}: unexpected dtype {other:?}", t.name()),
        };
        if let Some(q) = t.quantization() {
            let spec = serde_json::json!({"group_size": q.group_size, "bits": q.bits, "mode": q.mode});
            let prefix = t.name().strip_suffix(".weight").expect("quantized names end in .weight").to_string();
            per_layer.insert(prefix, spec.clone());
            quant.get_or_insert(spec);
        }
        tensors.push((t.name().to_string(), dtype, shape, data));
    }
    if let Some(mut q) = quant {
        // The first spec is the default; layers that differ are listed by path.
        let default = q.clone();
        for (prefix, spec) in per_layer {
            if spec != default {
                q[prefix] = spec;
            }
        }
        config["quantization"] = q;
    }
    if let Some(eos) = defaults.get("eos_token_id") {
        config["eos_token_id"] = eos.clone();
    }
    std::fs::write(out.join("config.json"), config.to_string()).expect("write config.json");
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, data)| (n.clone(), safetensors::tensor::TensorView::new(*d, s.clone(), data).expect("view")))
        .collect();
    safetensors::serialize_to_file(views, None, &out.join("model.safetensors")).expect("write safetensors");
    std::fs::write(out.join("tokenizer.json"), b.tokenizer_json().expect("tokenizer section")).expect("tokenizer.json");
    let tok: serde_json::Value =
        serde_json::from_slice(b.tokenizer_json().expect("tokenizer")).expect("tokenizer json");
    let token_text = |key: &str| -> Option<String> {
        let id = defaults.get(key).and_then(|v| v.as_u64().or_else(|| v.get(0).and_then(|x| x.as_u64())))?;
        let added = tok["added_tokens"].as_array()?;
        let by_added = added.iter().find(|t| t["id"].as_u64() == Some(id)).and_then(|t| t["content"].as_str());
        let by_vocab = tok["model"]["vocab"]
            .as_object()
            .and_then(|v| v.iter().find(|(_, i)| i.as_u64() == Some(id)).map(|(k, _)| k.as_str()));
        by_added.or(by_vocab).map(str::to_string)
    };
    let mut tc = serde_json::json!({ "tokenizer_class": "PreTrainedTokenizerFast" });
    if let Some(t) = b.chat_template() {
        tc["chat_template"] = t.into();
    }
    if let Some(t) = token_text("bos_token_id") {
        tc["bos_token"] = t.into();
    }
    if let Some(t) = token_text("eos_token_id") {
        tc["eos_token"] = t.into();
    }
    std::fs::write(out.join("tokenizer_config.json"), tc.to_string()).expect("tokenizer_config.json");
}

/// The `mlxcel-server` binary built for this test run.
pub fn mlxcel_server_bin() -> PathBuf {
    let p = mlxcel_bin().with_file_name("mlxcel-server");
    assert!(p.is_file(), "{} is missing: build the workspace first (cargo build)", p.display());
    p
}

/// The `mlxcel-compile` binary built for this test run.
pub fn mlxcel_compile_bin() -> PathBuf {
    mlxcel_bin().with_file_name("mlxcel-compile")
}

/// Loads a model directory in mlx-lm's layout (`model.safetensors` and the
/// `quantization` entry of `config.json`) into runtime weights (f32 compute).
pub fn load_mlx_lm_weights(dir: &Path, config: &serde_json::Value) -> Weights {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut w = Weights::new(Dtype::F32);
    let mut prefixes = Vec::new();
    for (name, view) in st.tensors() {
        let dtype = match view.dtype() {
            safetensors::Dtype::F32 => Dtype::F32,
            safetensors::Dtype::F16 => Dtype::F16,
            safetensors::Dtype::BF16 => Dtype::BF16,
            safetensors::Dtype::U32 => Dtype::U32,
            other => panic!("{name}: unexpected dtype {other:?}"),
        };
        let shape: Vec<i32> = view.shape().iter().map(|&d| d as i32).collect();
        w.insert(name.clone(), Array::from_bytes(view.data(), &shape, dtype).unwrap());
        if let Some(prefix) = name.strip_suffix(".scales") {
            prefixes.push(prefix.to_string());
        }
    }
    let q = &config["quantization"];
    for prefix in prefixes {
        let spec = q.get(&prefix).filter(|v| v.is_object()).unwrap_or(q);
        w.mark_quantized(
            prefix,
            QuantSpec {
                group_size: spec["group_size"].as_i64().unwrap() as i32,
                bits: spec["bits"].as_i64().unwrap() as i32,
                mode: QuantMode::Affine,
                layout: WeightLayout::RowMajor,
            },
        );
    }
    w
}

/// Compiles the real model `gguf` (a file [`real_model`] finds) to the
/// bundle `out` with the workspace's `mlxcel-compile`; returns `out`.
pub fn compile_gguf(gguf: &str, out: &Path) -> PathBuf {
    let output = Command::new(mlxcel_compile_bin())
        .args([real_model(gguf).to_str().unwrap(), "-o", out.to_str().unwrap(), "--quiet"])
        .output()
        .expect("running mlxcel-compile");
    assert!(output.status.success(), "compiling {gguf} failed: {}", String::from_utf8_lossy(&output.stderr));
    out.to_path_buf()
}

/// The real SmolLM2 bundle (compiled from its GGUF into a temporary folder
/// that lives as long as the test binary), made once per test binary.
pub fn smollm2_bundle() -> &'static Path {
    static BUNDLE: std::sync::OnceLock<(tempfile::TempDir, PathBuf)> = std::sync::OnceLock::new();
    let (_, path) = BUNDLE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let path = compile_gguf("SmolLM2-135M-Instruct.Q4_1.gguf", &dir.path().join("smollm2.mlxb"));
        (dir, path)
    });
    path
}
