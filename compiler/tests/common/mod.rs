//! Shared helpers of the ingest tests: the real models, the Python reference
//! environment, temporary directories, and a writer of small synthetic GGUF
//! files.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use mlxcel_bundle::{Bundle, Dtype as BundleDtype, TensorView};
use mlxcel_mlx::{Array, Dtype, QuantMode, Quantized, WeightLayout};
use serde_json::json;
use sha2::{Digest, Sha256};

pub const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const GEMMA3: &str = "gemma-3-270m-q4_k_m.gguf";

/// A real model from `make setup` (fails, never skips, when missing).
pub fn model(name: &str) -> PathBuf {
    let p = mlxcel_tests::models_dir().join(name);
    assert!(p.is_file(), "{} is missing: run `make setup` to install the real models", p.display());
    p
}

/// The Python of the reference environment (fails, never skips, when missing).
pub fn python() -> PathBuf {
    let deps = std::env::var_os("MLXCEL_DEPS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| mlxcel_tests::workspace_root().join(".deps"));
    let py = deps.join("venv/bin/python");
    assert!(py.is_file(), "{} is missing: run `make setup` to install the Python reference environment", py.display());
    py
}

/// Runs a helper script of `compiler/tests/python/` with the reference Python.
pub fn run_python(script: &str, args: &[&Path]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python");
    let out = Command::new(python())
        .arg(dir.join(script))
        .args(args)
        .current_dir(&dir)
        .env("TOKENIZERS_PARALLELISM", "false")
        .output()
        .expect("could not start the reference Python");
    assert!(
        out.status.success(),
        "{script} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A fresh temporary directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "mlxcel-ingest-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// SHA-256 of f32 values as little-endian bytes.
pub fn sha256_f32(values: &[f32]) -> String {
    let mut h = Sha256::new();
    for v in values {
        h.update(v.to_le_bytes());
    }
    hex(&h.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 of bytes.
pub fn sha256(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Writes a small GGUF (version 3) from metadata and tensors.
pub struct GgufWriter {
    pub kv: Vec<u8>,
    pub n_kv: u64,
    pub tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
    pub alignment: u64,
}

pub enum Val<'a> {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(&'a str),
    U64(u64),
    I64(i64),
    F64(f64),
    Arr(u32, Vec<Val<'a>>),
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

impl Val<'_> {
    fn ty(&self) -> u32 {
        match self {
            Val::U8(_) => 0,
            Val::I8(_) => 1,
            Val::U16(_) => 2,
            Val::I16(_) => 3,
            Val::U32(_) => 4,
            Val::I32(_) => 5,
            Val::F32(_) => 6,
            Val::Bool(_) => 7,
            Val::Str(_) => 8,
            Val::Arr(..) => 9,
            Val::U64(_) => 10,
            Val::I64(_) => 11,
            Val::F64(_) => 12,
        }
    }

    fn put(&self, out: &mut Vec<u8>) {
        match self {
            Val::U8(v) => out.push(*v),
            Val::I8(v) => out.push(*v as u8),
            Val::U16(v) => out.extend(v.to_le_bytes()),
            Val::I16(v) => out.extend(v.to_le_bytes()),
            Val::U32(v) => out.extend(v.to_le_bytes()),
            Val::I32(v) => out.extend(v.to_le_bytes()),
            Val::F32(v) => out.extend(v.to_le_bytes()),
            Val::Bool(v) => out.push(u8::from(*v)),
            Val::Str(s) => put_str(out, s),
            Val::U64(v) => out.extend(v.to_le_bytes()),
            Val::I64(v) => out.extend(v.to_le_bytes()),
            Val::F64(v) => out.extend(v.to_le_bytes()),
            Val::Arr(ty, items) => {
                out.extend(ty.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                for i in items {
                    i.put(out);
                }
            }
        }
    }
}

impl GgufWriter {
    pub fn new() -> GgufWriter {
        GgufWriter { kv: Vec::new(), n_kv: 0, tensors: Vec::new(), alignment: 32 }
    }

    pub fn kv(&mut self, key: &str, v: Val<'_>) -> &mut Self {
        if key == "general.alignment"
            && let Val::U32(a) = v
        {
            self.alignment = u64::from(a);
        }
        put_str(&mut self.kv, key);
        self.kv.extend(v.ty().to_le_bytes());
        v.put(&mut self.kv);
        self.n_kv += 1;
        self
    }

    /// A tensor: ggml dims (fastest first), ggml type id, raw data.
    pub fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, data: Vec<u8>) -> &mut Self {
        self.tensors.push((name.to_string(), dims.to_vec(), ty, data));
        self
    }

    pub fn bytes(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend(self.n_kv.to_le_bytes());
        out.extend(&self.kv);
        let mut offset = 0u64;
        let mut offsets = Vec::new();
        for (_, _, _, data) in &self.tensors {
            offsets.push(offset);
            offset += (data.len() as u64).div_ceil(self.alignment) * self.alignment;
        }
        for ((name, dims, ty, _), off) in self.tensors.iter().zip(&offsets) {
            put_str(&mut out, name);
            out.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(ty.to_le_bytes());
            out.extend(off.to_le_bytes());
        }
        while !(out.len() as u64).is_multiple_of(self.alignment) {
            out.push(0);
        }
        for (_, _, _, data) in &self.tensors {
            out.extend(data);
            while !(out.len() as u64).is_multiple_of(self.alignment) {
                out.push(0);
            }
        }
        out
    }

    pub fn write(&self, path: &Path) {
        std::fs::write(path, self.bytes()).expect("write gguf");
    }
}

/// f32 values as little-endian bytes.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A bundle tensor's values as f32: floats converted, affine triples (in
/// either layout) dequantized through MLX.
pub fn float_values(b: &Bundle, name: &str) -> Vec<f32> {
    let t = b.tensor(name).unwrap_or_else(|| panic!("{name} missing"));
    let to_f32 = |v: TensorView<'_>| -> Vec<f32> {
        let data = v.row_major_data().unwrap();
        match v.dtype() {
            BundleDtype::F32 => data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            BundleDtype::F16 => data.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            BundleDtype::Bf16 => {
                data.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect()
            }
            other => panic!("{}: {other:?} is not float", v.name()),
        }
    };
    let Some(q) = t.quantization() else { return to_f32(t) };
    let shape = |v: &TensorView<'_>| v.shape().iter().map(|&d| d as i32).collect::<Vec<_>>();
    let array = |v: TensorView<'_>| Array::from_slice(&to_f32(v), &shape(&v)).unwrap();
    let (s, bi) = (b.tensor(q.scales).unwrap(), b.tensor(q.biases.unwrap()).unwrap());
    let codes = t.row_major_data().unwrap();
    let quantized = Quantized {
        weight: Array::from_bytes(&codes, &shape(&t), Dtype::U32).unwrap(),
        scales: array(s),
        biases: Some(array(bi)),
        group_size: q.group_size as i32,
        bits: q.bits as i32,
        mode: QuantMode::Affine,
        layout: WeightLayout::RowMajor,
    };
    // -0.0 and +0.0 compare equal as floats but not as bytes; compare floats.
    quantized.dequantize(Some(Dtype::F32)).unwrap().to_vec::<f32>().unwrap()
}

/// A one-layer Llama's `config.json` (hidden 64, vocabulary 8).
pub fn llama_config() -> serde_json::Value {
    json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 2,
        "num_key_value_heads": 1, "vocab_size": 8, "rms_norm_eps": 1e-5
    })
}

/// A one-layer Llama directory: `config` and every tensor (f32, small
/// values), with a tokenizer; `lm_head` when `head`.
pub fn llama_dir(dir: &Path, config: &serde_json::Value, head: bool) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut shapes: Vec<(String, Vec<usize>)> =
        vec![("model.embed_tokens.weight".into(), vec![8, 64]), ("model.norm.weight".into(), vec![64])];
    for (t, s) in [
        ("input_layernorm.weight", vec![64]),
        ("post_attention_layernorm.weight", vec![64]),
        ("self_attn.q_proj.weight", vec![64, 64]),
        ("self_attn.k_proj.weight", vec![32, 64]),
        ("self_attn.v_proj.weight", vec![32, 64]),
        ("self_attn.o_proj.weight", vec![64, 64]),
        ("mlp.gate_proj.weight", vec![128, 64]),
        ("mlp.up_proj.weight", vec![128, 64]),
        ("mlp.down_proj.weight", vec![64, 128]),
    ] {
        shapes.push((format!("model.layers.0.{t}"), s));
    }
    if head {
        shapes.push(("lm_head.weight".into(), vec![8, 64]));
    }
    let data: Vec<Vec<u8>> = shapes
        .iter()
        .map(|(_, s)| f32_bytes(&(0..s.iter().product::<usize>()).map(|i| (i % 7) as f32 * 0.01).collect::<Vec<_>>()))
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = shapes
        .iter()
        .zip(&data)
        .map(|((n, s), d)| {
            (n.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), d).unwrap())
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    let vocab: serde_json::Map<String, serde_json::Value> =
        ["a", "b", "c", "d", "e", "f", "g", "h"].iter().enumerate().map(|(i, t)| (t.to_string(), json!(i))).collect();
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
        "pre_tokenizer": null, "post_processor": null, "decoder": null,
        "model": {"type": "BPE", "vocab": vocab, "merges": []}
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
}

/// A one-layer Llama GGUF whose epsilon is `eps` (f32 metadata).
pub fn llama_gguf(path: &Path, eps: f32) {
    llama_gguf_with(path, eps, Vec::new());
}

/// [`llama_gguf`] with `extra` metadata (key, value) as well.
pub fn llama_gguf_with(path: &Path, eps: f32, extra: Vec<(&str, Val<'_>)>) {
    let tokens: Vec<Val<'_>> = ["<unk>", "<s>", "</s>", "a"].iter().map(|t| Val::Str(t)).collect();
    let mut w = GgufWriter::new();
    w.kv("general.architecture", Val::Str("llama"))
        .kv("llama.embedding_length", Val::U32(64))
        .kv("llama.feed_forward_length", Val::U32(128))
        .kv("llama.block_count", Val::U32(1))
        .kv("llama.attention.head_count", Val::U32(2))
        .kv("llama.attention.layer_norm_rms_epsilon", Val::F32(eps))
        .kv("tokenizer.ggml.model", Val::Str("llama"))
        .kv("tokenizer.ggml.tokens", Val::Arr(8, tokens))
        .kv("tokenizer.ggml.scores", Val::Arr(6, (0..4).map(|i| Val::F32(-(i as f32))).collect()))
        .kv("tokenizer.ggml.token_type", Val::Arr(5, [2, 3, 3, 1].iter().map(|&t| Val::I32(t)).collect()))
        .tensor("token_embd.weight", &[64, 4], 0, f32_bytes(&[0.5; 64 * 4]))
        .tensor("output_norm.weight", &[64], 0, f32_bytes(&[1.0; 64]));
    for (key, value) in extra {
        w.kv(key, value);
    }
    w.write(path);
}
