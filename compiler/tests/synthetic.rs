//! Small synthetic sources: every ggml type against the pip `gguf` package,
//! the lossless transcode of every affine type through MLX, GGUF metadata of
//! every value type, the q/k un-permutation, MLX per-layer quantization
//! overrides, and every ingest error with its message.

mod common;

use std::collections::HashMap;
use std::path::Path;

use common::{GgufWriter, SMOLLM2, TempDir, Val, f32_bytes, model, run_python};
use mlxcel_arch::RopeScaling;
use mlxcel_compiler::ingest::gguf::quant::{GgmlType, dequantize, transcode_affine};
use mlxcel_compiler::ingest::gguf::reader::{GgufFile, GgufValue};
use mlxcel_compiler::ingest::{IngestError, SourceModel, Storage, TensorData};
use mlxcel_mlx::{Array, Dtype, QuantMode, Quantized, WeightLayout};
use safetensors::tensor::TensorView;
use serde_json::json;

/// A deterministic xorshift generator.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn f32(&mut self) -> f32 {
        (self.next() % 2_000_001) as f32 / 1_000_000.0 - 1.0
    }
}

/// Random blocks of `ty` whose f16 constants are finite and modest.
fn random_blocks(ty: GgmlType, n_blocks: usize, rng: &mut Rng) -> Vec<u8> {
    let (_, bytes) = ty.block();
    let mut out: Vec<u8> = (0..n_blocks * bytes as usize).map(|_| rng.next() as u8).collect();
    // Offsets of the f16 fields in each block.
    let halves: &[usize] = match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        _ => &[],
    };
    for b in out.chunks_exact_mut(bytes as usize) {
        for &h in halves {
            let v = half::f16::from_f32(rng.f32() * 0.05);
            b[h..h + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    out
}

#[test]
fn every_ggml_type_dequantizes_like_gguf_py_and_affine_ones_transcode_losslessly() {
    let tmp = TempDir::new("blocks");
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let types = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ];
    for ty in types {
        let (per_block, _) = ty.block();
        let n_blocks = (4096 / per_block) as usize;
        let data = random_blocks(ty, n_blocks, &mut rng);
        let src = tmp.path().join(format!("{ty}.bin"));
        let dst = tmp.path().join(format!("{ty}.f32"));
        std::fs::write(&src, &data).unwrap();
        run_python("dequant_blocks.py", &[Path::new(&ty.to_string()), &src, &dst]);
        let want: Vec<f32> = std::fs::read(&dst)
            .unwrap()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let got = dequantize(ty, &data).unwrap();
        assert_eq!(got.len(), want.len(), "{ty}");
        let first_bad = got.iter().zip(&want).position(|(a, b)| a.to_bits() != b.to_bits());
        assert!(
            first_bad.is_none(),
            "{ty}: element {first_bad:?} differs: {:?} vs {:?}",
            first_bad.map(|i| got[i]),
            first_bad.map(|i| want[i])
        );

        if let Some(parts) = transcode_affine(ty, &data) {
            // As a [rows, cols] matrix through MLX's own dequantize.
            let cols = 256;
            let rows = got.len() / cols;
            let q = Quantized {
                weight: Array::from_bytes(
                    &parts.weight,
                    &[rows as i32, (cols * parts.bits as usize / 32) as i32],
                    Dtype::U32,
                )
                .unwrap(),
                scales: Array::from_bytes(&parts.scales, &[rows as i32, (cols / 32) as i32], Dtype::F32).unwrap(),
                biases: Some(Array::from_bytes(&parts.biases, &[rows as i32, (cols / 32) as i32], Dtype::F32).unwrap()),
                group_size: 32,
                bits: parts.bits as i32,
                mode: QuantMode::Affine,
                layout: WeightLayout::RowMajor,
            };
            let back = q.dequantize(Some(Dtype::F32)).unwrap().to_vec::<f32>().unwrap();
            // Equal values; only the sign of an exact zero may differ
            // (`d·(q−8)` gives −0.0 for a negative d, `d·q − 8d` gives +0.0).
            let first_bad = back.iter().zip(&want).position(|(a, b)| a != b);
            assert!(first_bad.is_none(), "{ty} transcode: element {first_bad:?} differs");
        } else {
            assert!(matches!(ty, GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q6_K), "{ty} should transcode");
        }
    }
}

#[test]
fn gguf_metadata_of_every_type_nested_arrays_and_alignment() {
    let tmp = TempDir::new("meta");
    let path = tmp.path().join("m.gguf");
    let mut w = GgufWriter::new();
    w.kv("general.architecture", Val::Str("llama"))
        .kv("general.alignment", Val::U32(64))
        .kv("u8", Val::U8(200))
        .kv("i8", Val::I8(-5))
        .kv("u16", Val::U16(60000))
        .kv("i16", Val::I16(-30000))
        .kv("u32", Val::U32(4_000_000_000))
        .kv("i32", Val::I32(-2_000_000_000))
        .kv("f32", Val::F32(1.5))
        .kv("bool", Val::Bool(true))
        .kv("str", Val::Str("héllo"))
        .kv("u64", Val::U64(u64::MAX))
        .kv("i64", Val::I64(i64::MIN))
        .kv("f64", Val::F64(-2.25))
        .kv("arr", Val::Arr(5, vec![Val::I32(1), Val::I32(-2)]))
        .kv("nested", Val::Arr(9, vec![Val::Arr(8, vec![Val::Str("a"), Val::Str("b")]), Val::Arr(8, vec![])]))
        .tensor("a", &[3], 0, f32_bytes(&[1.0, 2.0, 3.0]))
        .tensor(
            "b",
            &[2],
            1,
            [half::f16::from_f32(0.5).to_le_bytes(), half::f16::from_f32(-1.0).to_le_bytes()].concat(),
        )
        .tensor(
            "c",
            &[2],
            30,
            [half::bf16::from_f32(0.25).to_le_bytes(), half::bf16::from_f32(4.0).to_le_bytes()].concat(),
        );
    w.write(&path);
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.version, 3);
    assert_eq!(f.alignment, 64);
    assert_eq!(f.get("u8"), Some(&GgufValue::U8(200)));
    assert_eq!(f.get("i8"), Some(&GgufValue::I8(-5)));
    assert_eq!(f.get("u16"), Some(&GgufValue::U16(60000)));
    assert_eq!(f.get("i16"), Some(&GgufValue::I16(-30000)));
    assert_eq!(f.get("u32").unwrap().as_u64(), Some(4_000_000_000));
    assert_eq!(f.get("i32").unwrap().as_i64(), Some(-2_000_000_000));
    assert_eq!(f.get("f32").unwrap().as_f64(), Some(1.5));
    assert_eq!(f.get("bool").unwrap().as_bool(), Some(true));
    assert_eq!(f.get("str").unwrap().as_str(), Some("héllo"));
    assert_eq!(f.get("u64"), Some(&GgufValue::U64(u64::MAX)));
    assert_eq!(f.get("i64"), Some(&GgufValue::I64(i64::MIN)));
    assert_eq!(f.get("f64"), Some(&GgufValue::F64(-2.25)));
    assert_eq!(f.get("arr").unwrap().to_json(), json!([1, -2]));
    assert_eq!(f.get("nested").unwrap().to_json(), json!([["a", "b"], []]));
    for t in &f.tensors {
        assert_eq!(t.offset % 64, 0, "{} aligned", t.name);
    }
    assert_eq!(f.data_start % 64, 0);
    let a = f.tensor("a").unwrap();
    assert_eq!(dequantize(a.ggml_type, f.data(a).unwrap()).unwrap(), vec![1.0, 2.0, 3.0]);
    let b = f.tensor("b").unwrap();
    assert_eq!(dequantize(b.ggml_type, f.data(b).unwrap()).unwrap(), vec![0.5, -1.0]);
    let c = f.tensor("c").unwrap();
    assert_eq!(dequantize(c.ggml_type, f.data(c).unwrap()).unwrap(), vec![0.25, 4.0]);
}

/// The hyperparameters of the tiny test models: hidden 64, feed-forward 128,
/// one layer, `heads` heads of which `kv_heads` key/value heads.
fn tiny_hparams(w: &mut GgufWriter, arch: &str, heads: u32, kv_heads: u32) {
    let key = |k: &str| format!("{arch}.{k}");
    w.kv("general.architecture", Val::Str(arch))
        .kv(&key("embedding_length"), Val::U32(64))
        .kv(&key("feed_forward_length"), Val::U32(128))
        .kv(&key("block_count"), Val::U32(1))
        .kv(&key("attention.head_count"), Val::U32(heads))
        .kv(&key("attention.head_count_kv"), Val::U32(kv_heads))
        .kv(&key("attention.layer_norm_rms_epsilon"), Val::F32(1e-5));
}

/// A tiny Llama GGUF: hidden 64, 2 heads of 32 (1 KV head), 1 layer, vocab 8.
fn tiny_llama_gguf(path: &Path, q_rows: &[f32]) {
    let tokens: Vec<Val<'_>> = ["<unk>", "<s>", "</s>", "a", "b", "c", "ab", "▁"].iter().map(|t| Val::Str(t)).collect();
    let mut w = GgufWriter::new();
    tiny_hparams(&mut w, "llama", 2, 1);
    w.kv("llama.rope.dimension_count", Val::U32(32))
        .kv("tokenizer.ggml.model", Val::Str("llama"))
        .kv("tokenizer.ggml.tokens", Val::Arr(8, tokens))
        .kv("tokenizer.ggml.scores", Val::Arr(6, (0..8).map(|i| Val::F32(-(i as f32))).collect()))
        .kv("tokenizer.ggml.token_type", Val::Arr(5, [2, 3, 3, 1, 1, 1, 1, 1].iter().map(|&t| Val::I32(t)).collect()))
        .kv("tokenizer.ggml.bos_token_id", Val::U32(1))
        .kv("tokenizer.ggml.eos_token_id", Val::U32(2))
        .tensor("token_embd.weight", &[64, 8], 0, f32_bytes(&[0.5; 64 * 8]))
        .tensor("output_norm.weight", &[64], 0, f32_bytes(&[1.0; 64]))
        .tensor("blk.0.attn_q.weight", &[64, 64], 0, f32_bytes(q_rows))
        .tensor("blk.0.attn_k.weight", &[64, 32], 0, f32_bytes(&q_rows[..64 * 32]))
        .tensor("blk.0.attn_v.weight", &[64, 32], 0, f32_bytes(&[0.0; 64 * 32]))
        .tensor("blk.0.attn_output.weight", &[64, 64], 0, f32_bytes(&[0.0; 64 * 64]))
        .tensor("blk.0.attn_norm.weight", &[64], 0, f32_bytes(&[1.0; 64]))
        .tensor("blk.0.ffn_norm.weight", &[64], 0, f32_bytes(&[1.0; 64]))
        .tensor("blk.0.ffn_gate.weight", &[64, 128], 0, f32_bytes(&[0.0; 64 * 128]))
        .tensor("blk.0.ffn_up.weight", &[64, 128], 0, f32_bytes(&[0.0; 64 * 128]))
        .tensor("blk.0.ffn_down.weight", &[128, 64], 0, f32_bytes(&[0.0; 64 * 128]));
    w.write(path);
}

#[test]
fn llama_q_and_k_rows_are_unpermuted() {
    let tmp = TempDir::new("perm");
    let path = tmp.path().join("tiny.gguf");
    // Row r of the stored q holds the value r everywhere.
    let q: Vec<f32> = (0..64).flat_map(|r| std::iter::repeat_n(r as f32, 64)).collect();
    tiny_llama_gguf(&path, &q);
    let m = SourceModel::open(&path).unwrap();
    let rows = |name: &str| -> Vec<f32> {
        let info = m.tensor(name).unwrap();
        let v = m.load_float(info).unwrap().to_f32();
        v.chunks(64).map(|r| r[0]).collect()
    };
    // llama.cpp stored HF row (head h, half i, j) at h*32 + 2j + i.
    let q_rows = rows("model.layers.0.self_attn.q_proj.weight");
    for (r, &v) in q_rows.iter().enumerate() {
        let (h, i, j) = (r / 32, (r / 16) % 2, r % 16);
        assert_eq!(v as usize, h * 32 + 2 * j + i, "q row {r}");
    }
    // k uses the KV head count (1 head of 32 rows).
    let k_rows = rows("model.layers.0.self_attn.k_proj.weight");
    for (r, &v) in k_rows.iter().enumerate() {
        let (i, j) = (r / 16, r % 16);
        assert_eq!(v as usize, 2 * j + i, "k row {r}");
    }
    // Others untouched.
    assert_eq!(m.config().head_dim, 32);
    assert!(m.config().tie_word_embeddings);
    // The SentencePiece tokenizer builds and loads.
    let t: tokenizers::Tokenizer = m.tokenizer().unwrap().tokenizer_json.parse().unwrap();
    assert_eq!(t.encode("ab", true).unwrap().get_ids(), &[1, 7, 6]);
}

fn write_safetensors(path: &Path, tensors: &[(&str, safetensors::Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(String, TensorView<'_>)> =
        tensors.iter().map(|(n, d, s, b)| (n.to_string(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

fn tiny_config() -> serde_json::Value {
    json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 2,
        "num_key_value_heads": 1, "vocab_size": 8, "rms_norm_eps": 1e-5, "tie_word_embeddings": true,
        "eos_token_id": [2, 3], "bos_token_id": 1
    })
}

fn f32_tensor<'a>(name: &'a str, shape: &[usize]) -> (&'a str, safetensors::Dtype, Vec<usize>, Vec<u8>) {
    let n: usize = shape.iter().product();
    let mut rng = Rng(n as u64 + 7);
    (name, safetensors::Dtype::F32, shape.to_vec(), f32_bytes(&(0..n).map(|_| rng.f32()).collect::<Vec<_>>()))
}

/// A tiny Llama HF directory (config and weights, no tokenizer).
fn tiny_hf_dir(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), tiny_config().to_string()).unwrap();
    let bf16: Vec<u8> = (0..64).flat_map(|i| half::bf16::from_f32(i as f32).to_le_bytes()).collect();
    write_safetensors(
        &dir.join("model.safetensors"),
        &[
            f32_tensor("model.embed_tokens.weight", &[8, 64]),
            ("model.norm.weight", safetensors::Dtype::BF16, vec![64], bf16),
            f32_tensor("model.layers.0.self_attn.q_proj.weight", &[64, 64]),
            f32_tensor("model.layers.0.mlp.down_proj.weight", &[64, 128]),
        ],
    );
}

#[test]
fn hf_directory_with_bf16_and_generation_defaults_from_config() {
    let tmp = TempDir::new("tiny-hf");
    tiny_hf_dir(tmp.path());
    let m = SourceModel::open(tmp.path()).unwrap();
    let norm = m.tensor("model.norm.weight").unwrap();
    assert_eq!(norm.storage, Storage::Float(mlxcel_compiler::ingest::FloatDtype::BF16));
    assert_eq!(m.load_float(norm).unwrap().to_f32(), (0..64).map(|i| i as f32).collect::<Vec<_>>());
    let g = m.generation().unwrap();
    assert_eq!(g.eos_token_ids, vec![2, 3]);
    assert_eq!(g.bos_token_id, Some(1));
    // No tokenizer.json: the tokenizer is missing, by name.
    let err = m.tokenizer().unwrap_err();
    assert!(matches!(err, IngestError::Missing { .. }), "{err}");
    assert!(err.to_string().contains("tokenizer.json"), "{err}");
}

#[test]
fn sharded_hf_directory_with_an_index() {
    let tmp = TempDir::new("shards");
    let dir = tmp.path();
    std::fs::write(dir.join("config.json"), tiny_config().to_string()).unwrap();
    let a = f32_tensor("model.embed_tokens.weight", &[8, 64]);
    let b = f32_tensor("model.layers.0.self_attn.q_proj.weight", &[64, 64]);
    let c = f32_tensor("model.norm.weight", &[64]);
    write_safetensors(&dir.join("model-00001-of-00002.safetensors"), &[a.clone(), c.clone()]);
    write_safetensors(&dir.join("model-00002-of-00002.safetensors"), std::slice::from_ref(&b));
    let index = json!({"metadata": {"total_size": 0}, "weight_map": {
        a.0: "model-00001-of-00002.safetensors",
        c.0: "model-00001-of-00002.safetensors",
        b.0: "model-00002-of-00002.safetensors",
    }});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let m = SourceModel::open(dir).unwrap();
    assert_eq!(m.tensors().len(), 3);
    for (name, _, shape, bytes) in [&a, &b, &c] {
        let info = m.tensor(name).unwrap();
        assert_eq!(&info.shape, shape);
        assert_eq!(m.load_float(info).unwrap().data.as_ref(), bytes.as_slice(), "{name}");
    }
    assert!(
        m.tensor("model.layers.0.self_attn.q_proj.weight").unwrap().file.ends_with("model-00002-of-00002.safetensors")
    );
    let files = m.source_files();
    assert!(files.iter().any(|f| f.ends_with("model.safetensors.index.json")));
    assert_eq!(files.iter().filter(|f| f.extension().is_some_and(|e| e == "safetensors")).count(), 2);

    // A tensor in two shards is an error naming it.
    write_safetensors(&dir.join("model-00002-of-00002.safetensors"), &[b.clone(), c.clone()]);
    let e = SourceModel::open(dir).unwrap_err().to_string();
    assert!(e.contains("model.norm.weight") && e.contains("more than one shard"), "{e}");
}

#[test]
fn qwen2_gguf_config_and_biases() {
    let tmp = TempDir::new("qwen2");
    let path = tmp.path().join("q.gguf");
    let tokens: Vec<Val<'_>> = ["a", "b", "ab", "<|endoftext|>"].iter().map(|t| Val::Str(t)).collect();
    let mut w = GgufWriter::new();
    tiny_hparams(&mut w, "qwen2", 4, 2);
    w.kv("qwen2.context_length", Val::U32(32768))
        .kv("qwen2.rope.freq_base", Val::F32(1_000_000.0))
        .kv("qwen2.rope.scaling.type", Val::Str("yarn"))
        .kv("qwen2.rope.scaling.factor", Val::F32(4.0))
        .kv("qwen2.rope.scaling.original_context_length", Val::U32(32768))
        .kv("tokenizer.ggml.model", Val::Str("gpt2"))
        .kv("tokenizer.ggml.pre", Val::Str("qwen2"))
        .kv("tokenizer.ggml.tokens", Val::Arr(8, tokens))
        .kv("tokenizer.ggml.token_type", Val::Arr(5, [1, 1, 1, 3].iter().map(|&t| Val::I32(t)).collect()))
        .kv("tokenizer.ggml.merges", Val::Arr(8, vec![Val::Str("a b")]))
        .kv("tokenizer.ggml.eos_token_id", Val::U32(3))
        .tensor("token_embd.weight", &[64, 4], 0, f32_bytes(&[0.0; 64 * 4]))
        .tensor("output.weight", &[64, 4], 0, f32_bytes(&[0.0; 64 * 4]))
        .tensor("blk.0.attn_q.weight", &[64, 64], 0, f32_bytes(&[0.0; 64 * 64]))
        .tensor("blk.0.attn_q.bias", &[64], 0, f32_bytes(&(0..64).map(|i| i as f32).collect::<Vec<_>>()))
        .tensor("blk.0.attn_k.bias", &[32], 0, f32_bytes(&[0.0; 32]));
    w.write(&path);
    let m = SourceModel::open(&path).unwrap();
    let c = m.source_config();
    assert_eq!(c["model_type"], "qwen2");
    assert_eq!(c["architectures"][0], "Qwen2ForCausalLM");
    assert_eq!(c["head_dim"], 16);
    assert_eq!(c["tie_word_embeddings"], false);
    assert_eq!(
        c["rope_scaling"],
        json!({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})
    );
    assert_eq!(c["rope_theta"].as_f64(), Some(1e6));
    // Normalized: YaRN's other parameters at mlx-lm's defaults.
    assert_eq!(
        m.config().rope_scaling,
        Some(RopeScaling::Yarn {
            factor: 4.0,
            original_max_position_embeddings: 32768.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            mscale: 1.0,
            mscale_all_dim: 0.0
        })
    );
    assert!(!m.config().tie_word_embeddings);
    assert!(m.tensor("lm_head.weight").is_some());
    // Qwen's q rows are not permuted in GGUF: the bias comes back as stored.
    let bias = m.tensor("model.layers.0.self_attn.q_proj.bias").unwrap();
    assert_eq!(m.load_float(bias).unwrap().to_f32(), (0..64).map(|i| i as f32).collect::<Vec<_>>());
    assert_eq!(m.generation().unwrap().eos_token_ids, vec![3]);
    let t: tokenizers::Tokenizer = m.tokenizer().unwrap().tokenizer_json.parse().unwrap();
    assert_eq!(t.encode("ab<|endoftext|>", false).unwrap().get_ids(), &[2, 3]);
}

#[test]
fn mlx_directory_with_per_layer_quantization_overrides() {
    let tmp = TempDir::new("tiny-mlx");
    let dir = tmp.path();
    let mut cfg = tiny_config();
    cfg["quantization"] =
        json!({"group_size": 64, "bits": 4, "model.layers.0.mlp.down_proj": {"group_size": 32, "bits": 8}});
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let mut tensors = Vec::new();
    let mut arrays = HashMap::new();
    for (name, shape, gs, bits) in
        [("model.layers.0.self_attn.q_proj", [64, 64], 64, 4), ("model.layers.0.mlp.down_proj", [64, 128], 32, 8)]
    {
        let (_, _, _, bytes) = f32_tensor(name, &shape);
        let w = Array::from_bytes(&bytes, &[shape[0] as i32, shape[1] as i32], Dtype::F32).unwrap();
        let q = w.quantize(gs, bits, QuantMode::Affine).unwrap();
        arrays.insert(name, q.dequantize(None).unwrap().to_vec::<f32>().unwrap());
        let shape_of = |a: &Array| a.shape().iter().map(|&d| d as usize).collect::<Vec<_>>();
        let b = q.biases.as_ref().unwrap();
        tensors.push((
            format!("{name}.weight"),
            safetensors::Dtype::U32,
            shape_of(&q.weight),
            q.weight.to_bytes().unwrap(),
        ));
        tensors.push((
            format!("{name}.scales"),
            safetensors::Dtype::F32,
            shape_of(&q.scales),
            q.scales.to_bytes().unwrap(),
        ));
        tensors.push((format!("{name}.biases"), safetensors::Dtype::F32, shape_of(b), b.to_bytes().unwrap()));
    }
    let norm = f32_tensor("model.norm.weight", &[64]);
    tensors.push((norm.0.to_string(), norm.1, norm.2, norm.3));
    let borrowed: Vec<_> = tensors.iter().map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.clone())).collect();
    write_safetensors(&dir.join("model.safetensors"), &borrowed);

    let m = SourceModel::open(dir).unwrap();
    assert_eq!(m.format(), mlxcel_compiler::ingest::SourceFormat::MlxQuantized);
    assert_eq!(m.tensors().len(), 3);
    for (name, bits, gs) in [("model.layers.0.self_attn.q_proj", 4, 64), ("model.layers.0.mlp.down_proj", 8, 32)] {
        let info = m.tensor(&format!("{name}.weight")).unwrap();
        assert!(
            matches!(info.storage, Storage::MlxAffine { bits: b, group_size: g, .. } if b == bits && g == gs),
            "{name}"
        );
        let TensorData::Affine(q) = m.load(info).unwrap() else { panic!("{name} should load quantized") };
        assert_eq!((q.bits, q.group_size), (bits, gs));
        assert_eq!(m.load_float(info).unwrap().to_f32(), arrays[name], "{name}");
    }

    // An override that contradicts the packed shapes is an error naming the tensor.
    cfg["quantization"]["model.layers.0.mlp.down_proj"] = json!({"group_size": 32, "bits": 4});
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let err = SourceModel::open(dir).unwrap_err().to_string();
    assert!(err.contains("model.layers.0.mlp.down_proj.weight") && err.contains("do not agree"), "{err}");
}

// ---------------------------------------------------------------- errors

fn err_of(path: &Path) -> IngestError {
    SourceModel::open(path).expect_err("opening should fail")
}

#[test]
fn missing_files_are_named() {
    let tmp = TempDir::new("missing");
    let e = err_of(tmp.path());
    assert!(matches!(e, IngestError::Missing { .. }), "{e}");
    assert!(e.to_string().contains("config.json") && e.to_string().contains(&tmp.path().display().to_string()), "{e}");

    std::fs::write(tmp.path().join("config.json"), tiny_config().to_string()).unwrap();
    let e = err_of(tmp.path()).to_string();
    assert!(e.contains("model.safetensors") && e.contains("missing"), "{e}");

    std::fs::write(
        tmp.path().join("model.safetensors.index.json"),
        json!({"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}}).to_string(),
    )
    .unwrap();
    let e = err_of(tmp.path()).to_string();
    assert!(e.contains("model-00001-of-00002.safetensors") && e.contains("missing"), "{e}");

    let e = err_of(&tmp.path().join("nope.gguf")).to_string();
    assert!(e.contains("nope.gguf"), "{e}");
}

#[test]
fn unsupported_architectures_are_refused_before_any_weight() {
    let tmp = TempDir::new("arch");
    let mut cfg = tiny_config();
    cfg["architectures"] = json!(["GPTNeoXForCausalLM"]);
    cfg["model_type"] = json!("gpt_neox");
    std::fs::write(tmp.path().join("config.json"), cfg.to_string()).unwrap();
    // A corrupt weight file that must not be looked at.
    std::fs::write(tmp.path().join("model.safetensors"), b"garbage").unwrap();
    let e = err_of(tmp.path());
    assert!(matches!(e, IngestError::UnsupportedArchitecture { .. }), "{e}");
    let msg = e.to_string();
    for want in [
        "GPTNeoXForCausalLM",
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "qwen3_moe",
        "gemma3",
        "Gemma3ForCausalLM",
        "phi3",
        "config.json",
    ] {
        assert!(msg.contains(want), "{msg} lacks {want}");
    }

    // GGUF: the metadata names gpt2, and the tensor infos after it are garbage.
    let path = tmp.path().join("gpt2.gguf");
    let mut w = GgufWriter::new();
    w.kv("general.architecture", Val::Str("gpt2"));
    let mut bytes = w.bytes();
    bytes[8..16].copy_from_slice(&3u64.to_le_bytes()); // three tensors that are not there
    bytes.extend([0xFFu8; 100]);
    std::fs::write(&path, bytes).unwrap();
    let e = err_of(&path);
    assert!(matches!(e, IngestError::UnsupportedArchitecture { .. }), "{e}");
    assert!(e.to_string().contains("gpt2") && e.to_string().contains("Gemma3ForCausalLM"), "{e}");
}

#[test]
fn a_shape_that_contradicts_the_config_is_named() {
    let tmp = TempDir::new("shape");
    tiny_hf_dir(tmp.path());
    let mut cfg = tiny_config();
    cfg["intermediate_size"] = json!(96);
    std::fs::write(tmp.path().join("config.json"), cfg.to_string()).unwrap();
    let e = err_of(tmp.path());
    assert!(matches!(e, IngestError::ShapeMismatch { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("model.layers.0.mlp.down_proj.weight"), "{msg}");
    assert!(msg.contains("[64, 128]") && msg.contains("[64, 96]") && msg.contains("intermediate_size"), "{msg}");
    assert!(msg.contains("model.safetensors"), "{msg}");

    // A layer past num_hidden_layers.
    let mut cfg = tiny_config();
    cfg["num_hidden_layers"] = json!(1);
    std::fs::write(tmp.path().join("config.json"), cfg.to_string()).unwrap();
    write_safetensors(
        &tmp.path().join("model.safetensors"),
        &[f32_tensor("model.norm.weight", &[64]), f32_tensor("model.layers.1.input_layernorm.weight", &[64])],
    );
    let msg = err_of(tmp.path()).to_string();
    assert!(msg.contains("model.layers.1.input_layernorm.weight") && msg.contains("num_hidden_layers is 1"), "{msg}");
}

/// A safetensors file with a hand-written header.
fn raw_safetensors(path: &Path, header: &str, data: &[u8]) {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(header.as_bytes());
    bytes.extend(data);
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn unknown_dtypes_and_corrupt_safetensors_headers_are_named() {
    let tmp = TempDir::new("st");
    std::fs::write(tmp.path().join("config.json"), tiny_config().to_string()).unwrap();
    let st = tmp.path().join("model.safetensors");

    raw_safetensors(&st, r#"{"model.norm.weight":{"dtype":"Q9","shape":[2],"data_offsets":[0,8]}}"#, &[0; 8]);
    let e = err_of(tmp.path());
    assert!(matches!(e, IngestError::UnknownDtype { .. }), "{e}");
    assert!(e.to_string().contains("model.norm.weight") && e.to_string().contains("Q9"), "{e}");

    raw_safetensors(&st, r#"{"model.norm.weight":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}}"#, &[0; 8]);
    let e = err_of(tmp.path());
    assert!(matches!(e, IngestError::UnknownDtype { .. }), "{e}");
    assert!(e.to_string().contains("model.norm.weight") && e.to_string().contains("I64"), "{e}");

    raw_safetensors(&st, r#"{"model.norm.weight":{"dtype":"F32","shape":[2],"data_offsets":[0,8]"#, &[0; 8]);
    let e = err_of(tmp.path()).to_string();
    assert!(e.contains("model.safetensors") && e.contains("not valid JSON") && e.contains("at byte"), "{e}");

    raw_safetensors(&st, r#"{"model.norm.weight":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#, &[0; 8]);
    let e = err_of(tmp.path()).to_string();
    assert!(e.contains("model.norm.weight") && e.contains("needs Some(12) bytes"), "{e}");

    let mut bytes = 1_000_000u64.to_le_bytes().to_vec();
    bytes.extend(b"{}");
    std::fs::write(&st, bytes).unwrap();
    let e = err_of(tmp.path()).to_string();
    assert!(e.contains("header length 1000000 runs past the end"), "{e}");

    std::fs::write(&st, b"abc").unwrap();
    let e = err_of(tmp.path()).to_string();
    assert!(e.contains("truncated safetensors file"), "{e}");
}

#[test]
fn truncated_and_corrupt_ggufs_name_the_file_tensor_and_offset() {
    let tmp = TempDir::new("trunc");
    let real = std::fs::read(model(SMOLLM2)).unwrap();
    let path = tmp.path().join("cut.gguf");

    // Cut inside the tensor data: the first tensor that runs past the end is named.
    std::fs::write(&path, &real[..real.len() / 2]).unwrap();
    let e = err_of(&path);
    let msg = e.to_string();
    assert!(matches!(e, IngestError::Tensor { .. }), "{msg}");
    assert!(msg.contains("cut.gguf") && msg.contains("truncated file") && msg.contains("blk."), "{msg}");
    assert!(msg.contains(&format!("the file has {} bytes", real.len() / 2)), "{msg}");

    // Cut inside the metadata (the vocabulary): a corrupt-file error with the offset.
    std::fs::write(&path, &real[..200_000]).unwrap();
    let e = err_of(&path);
    assert!(matches!(e, IngestError::Corrupt { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("truncated file") && msg.contains("at byte") && msg.contains("tokenizer.ggml"), "{msg}");

    // Every prefix of the header region fails cleanly (no panic, no out-of-bounds read).
    for cut in (0..4096).step_by(97).chain([0, 1, 3, 4, 7, 8, 23, 24]) {
        std::fs::write(&path, &real[..cut]).unwrap();
        assert!(SourceModel::open(&path).is_err(), "cut at {cut}");
    }

    let mut bad = real[..4096].to_vec();
    bad[0] = b'X';
    std::fs::write(&path, &bad).unwrap();
    assert!(err_of(&path).to_string().contains("not a GGUF file"));

    let mut bad = real[..4096].to_vec();
    bad[4..8].copy_from_slice(&7u32.to_le_bytes());
    std::fs::write(&path, &bad).unwrap();
    assert!(err_of(&path).to_string().contains("GGUF version 7"));

    // No vocabulary: the weights open (the vocabulary size is the
    // embedding's), the tokenizer is the error.
    let mut w = GgufWriter::new();
    tiny_hparams(&mut w, "llama", 2, 1);
    w.tensor("output_norm.weight", &[64], 0, f32_bytes(&[1.0; 64])).tensor(
        "token_embd.weight",
        &[64, 8],
        0,
        f32_bytes(&[0.0; 64 * 8]),
    );
    w.write(&path);
    let m = SourceModel::open(&path).unwrap();
    let e = m.tokenizer().unwrap_err().to_string();
    assert!(e.contains("cut.gguf") && e.contains("no tokenizer.ggml.tokens"), "{e}");

    // An unknown ggml type is named with its tensor.
    let mut w = GgufWriter::new();
    w.kv("general.architecture", Val::Str("llama")).tensor("token_embd.weight", &[4], 99, vec![0; 16]);
    w.write(&path);
    let e = err_of(&path);
    assert!(matches!(e, IngestError::UnknownDtype { .. }), "{e}");
    assert!(e.to_string().contains("token_embd.weight") && e.to_string().contains("ggml type 99"), "{e}");

    // A huge array count is refused before allocating.
    let mut w = GgufWriter::new();
    w.kv("general.architecture", Val::Str("llama")).kv("x", Val::Arr(4, vec![Val::U32(1)]));
    let mut bytes = w.bytes();
    // The array count sits before the last element (a u32) of the metadata.
    let count_pos = 24 + w.kv.len() - 4 - 8;
    bytes[count_pos..count_pos + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    std::fs::write(&path, bytes).unwrap();
    let msg = err_of(&path).to_string();
    assert!(msg.contains("declares") && msg.contains("elements"), "{msg}");
}

#[test]
fn corrupted_ggufs_never_panic() {
    let tmp = TempDir::new("fuzz");
    let good = tmp.path().join("good.gguf");
    let q: Vec<f32> = (0..64 * 64).map(|i| i as f32).collect();
    tiny_llama_gguf(&good, &q);
    let bytes = std::fs::read(&good).unwrap();
    let header_end = GgufFile::open(&good).unwrap().data_start as usize;
    let path = tmp.path().join("bad.gguf");
    let mut rng = Rng(42);
    let mut opened = 0;
    for round in 0..600 {
        let mut b = bytes.clone();
        // Flip one to three bytes of the header region (magic to tensor infos).
        for _ in 0..1 + round % 3 {
            let at = (rng.next() as usize) % header_end;
            b[at] = match rng.next() % 4 {
                0 => 0xFF,
                1 => 0,
                2 => b[at].wrapping_add(1),
                _ => rng.next() as u8,
            };
        }
        std::fs::write(&path, &b).unwrap();
        // Whatever the damage: an error or a model, never a panic.
        if let Ok(m) = SourceModel::open(&path) {
            opened += 1;
            for t in m.tensors() {
                let _ = m.load(t);
                let _ = m.load_float(t);
            }
            let _ = m.tokenizer();
            let _ = m.generation();
        }
    }
    assert!(opened > 0, "some damage (in string contents) leaves the file readable");
}
