//! Compile accepts only what `run` can load: the finished bundle is checked
//! by the runtime's own loader (`mlxcel_runtime::check`) before it gets its
//! name. Each source here used to compile into a bundle `run` refused (or,
//! for token ids past the embedding, read out of bounds); now compile
//! refuses it with one line naming the file and what is wrong, and leaves
//! no file behind.

mod common;

use std::path::Path;

use common::{GgufWriter, TempDir, Val, f32_bytes, llama_config, llama_dir, llama_gguf};
use mlxcel_compiler::compile::{CompileOptions, compile};
use mlxcel_compiler::ingest::SourceModel;
use serde_json::json;

/// Compiles `source` into `dir/out.mlxb`; on failure checks that nothing is
/// left in `dir` but the source, and returns the whole error chain.
fn compile_error(source: &Path, dir: &Path) -> String {
    let out = dir.join("out.mlxb");
    let e = match SourceModel::open(source) {
        Err(e) => anyhow::Error::from(e),
        Ok(m) => match compile(&m, &out, &CompileOptions::default(), None, &mut |_| {}) {
            Ok(_) => panic!("{} compiled, but should have been refused", source.display()),
            Err(e) => anyhow::Error::from(e),
        },
    };
    let left: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("out.mlxb"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    format!("{e:#}")
}

fn assert_mentions(error: &str, parts: &[&str]) {
    assert!(!error.contains('\n'), "one line: {error}");
    for p in parts {
        assert!(error.contains(p), "{error:?} should mention {p:?}");
    }
}

#[test]
fn the_tiny_llama_compiles_and_checks() {
    let tmp = TempDir::new("check-ok");
    let dir = tmp.path().join("model");
    llama_dir(&dir, &llama_config(), false);
    let m = SourceModel::open(&dir).unwrap();
    let out = tmp.path().join("ok.mlxb");
    compile(&m, &out, &CompileOptions::default(), None, &mut |_| {}).unwrap();
    let checked = mlxcel_runtime::check::check_bundle(&out).unwrap();
    assert_eq!(checked.config.vocab_size, 8);
    assert_eq!(checked.tokenizer_ids, 8);
}

#[test]
fn gguf_sources_run_would_refuse_are_refused_by_compile() {
    let tmp = TempDir::new("check-gguf");
    let path = tmp.path().join("m.gguf");
    // The embedding and final norm only: the layer's tensors are missing.
    llama_gguf(&path, 1e-5);
    let e = compile_error(&path, tmp.path());
    assert_mentions(&e, &["m.gguf", "model.layers.0", "missing"]);

    // No tensors at all.
    let mut w = GgufWriter::new();
    w.kv("general.architecture", Val::Str("llama"))
        .kv("llama.embedding_length", Val::U32(64))
        .kv("llama.feed_forward_length", Val::U32(128))
        .kv("llama.block_count", Val::U32(1))
        .kv("llama.attention.head_count", Val::U32(2))
        .kv("llama.attention.layer_norm_rms_epsilon", Val::F32(1e-5))
        .kv("tokenizer.ggml.model", Val::Str("llama"))
        .kv("tokenizer.ggml.tokens", Val::Arr(8, vec![Val::Str("a"), Val::Str("b")]))
        .kv("tokenizer.ggml.scores", Val::Arr(6, vec![Val::F32(0.0), Val::F32(-1.0)]))
        .kv("tokenizer.ggml.token_type", Val::Arr(5, vec![Val::I32(1), Val::I32(1)]));
    w.write(&path);
    let e = compile_error(&path, tmp.path());
    assert_mentions(&e, &["m.gguf"]);
}

/// A change to a model directory.
type Edit = Box<dyn FnOnce(&Path)>;

/// GGUF metadata: keys and values.
type Metadata<'a> = Vec<(&'a str, Val<'a>)>;

/// A directory like [`llama_dir`]'s with `edit` applied to it.
fn edited_dir(tmp: &TempDir, name: &str, edit: impl FnOnce(&Path)) -> std::path::PathBuf {
    let dir = tmp.path().join(name);
    llama_dir(&dir, &llama_config(), false);
    edit(&dir);
    dir
}

#[test]
fn hugging_face_sources_run_would_refuse_are_refused_by_compile() {
    let tmp = TempDir::new("check-hf");
    let cases: Vec<(&str, Edit, Vec<&str>)> = vec![
        ("empty-tokenizer", Box::new(|d| std::fs::write(d.join("tokenizer.json"), b"").unwrap()), vec!["tokenizer"]),
        (
            "not-json-tokenizer",
            Box::new(|d| std::fs::write(d.join("tokenizer.json"), b"<html>").unwrap()),
            vec!["tokenizer"],
        ),
        (
            // A ninth token (id 8) for an embedding of 8 rows.
            "id-past-embedding",
            Box::new(|d| {
                let p = d.join("tokenizer.json");
                let mut t: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
                t["model"]["vocab"]["zz"] = json!(8);
                std::fs::write(&p, t.to_string()).unwrap();
            }),
            vec!["8", "vocabulary of 8 rows"],
        ),
        (
            "sparse-id",
            Box::new(|d| {
                let p = d.join("tokenizer.json");
                let mut t: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
                t["model"]["vocab"]["h"] = json!(1_000_000);
                std::fs::write(&p, t.to_string()).unwrap();
            }),
            vec!["1000000", "vocabulary of 8 rows"],
        ),
        (
            "eos-past-embedding",
            Box::new(|d| std::fs::write(d.join("generation_config.json"), r#"{"eos_token_id": [2, 9]}"#).unwrap()),
            vec!["eos_token_id 9", "vocabulary of 8 rows"],
        ),
        (
            // Refused before it is read into memory.
            "huge-chat-template",
            Box::new(|d| std::fs::write(d.join("chat_template.jinja"), vec![b' '; (1 << 20) + 1]).unwrap()),
            vec!["chat_template.jinja", "larger than the limit"],
        ),
        (
            // Parses, but `run` would spin on it until its fuel runs out.
            "looping-chat-template",
            Box::new(|d| {
                let t = "{% for a in range(100000) %}{% for b in range(100000) %}{{ a }}{% endfor %}{% endfor %}";
                std::fs::write(d.join("chat_template.jinja"), t).unwrap()
            }),
            vec!["chat template", "fuel"],
        ),
    ];
    for (name, edit, parts) in cases {
        let dir = edited_dir(&tmp, name, edit);
        let out = tmp.path().join(format!("{name}-out"));
        std::fs::create_dir_all(&out).unwrap();
        let e = compile_error(&dir, &out);
        assert_mentions(&e, &parts);
    }
    for (key, value) in [
        ("vocab_size", json!("8")),
        ("hidden_size", json!(-64)),
        ("intermediate_size", json!(128.5)),
        ("num_attention_heads", serde_json::Value::Null),
    ] {
        let dir = tmp.path().join(format!("config-{key}"));
        let mut config = llama_config();
        config[key] = value;
        llama_dir(&dir, &config, false);
        let out = tmp.path().join(format!("config-{key}-out"));
        std::fs::create_dir_all(&out).unwrap();
        let e = compile_error(&dir, &out);
        assert_mentions(&e, &["config.json", key]);
    }
}

/// A complete one-layer Llama GGUF (f32, vocabulary of 4) with `meta`
/// metadata replacing or joining the defaults, and `tokens` as its vocabulary.
fn full_llama_gguf(path: &Path, meta: Vec<(&str, Val<'_>)>, tokens: &[&str]) {
    let mut keys: Vec<(&str, Val<'_>)> = vec![
        ("general.architecture", Val::Str("llama")),
        ("llama.embedding_length", Val::U32(64)),
        ("llama.feed_forward_length", Val::U32(128)),
        ("llama.block_count", Val::U32(1)),
        ("llama.context_length", Val::U32(256)),
        ("llama.attention.head_count", Val::U32(2)),
        ("llama.attention.head_count_kv", Val::U32(1)),
        ("llama.attention.layer_norm_rms_epsilon", Val::F32(1e-5)),
        ("tokenizer.ggml.model", Val::Str("llama")),
    ];
    for (k, v) in meta {
        keys.retain(|(old, _)| *old != k);
        keys.push((k, v));
    }
    let mut w = GgufWriter::new();
    for (k, v) in keys {
        w.kv(k, v);
    }
    let n = tokens.len();
    w.kv("tokenizer.ggml.tokens", Val::Arr(8, tokens.iter().map(|t| Val::Str(t)).collect()))
        .kv("tokenizer.ggml.scores", Val::Arr(6, (0..n).map(|i| Val::F32(-(i as f32))).collect()))
        .kv("tokenizer.ggml.token_type", Val::Arr(5, (0..n).map(|i| Val::I32(if i < 3 { 3 } else { 1 })).collect()));
    let values = |count: usize| f32_bytes(&(0..count).map(|i| (i % 5) as f32 * 0.01).collect::<Vec<_>>());
    // GGUF dimensions are innermost first.
    let mut tensors: Vec<(String, Vec<u64>)> =
        vec![("token_embd.weight".into(), vec![64, n as u64]), ("output_norm.weight".into(), vec![64])];
    for (t, dims) in [
        ("attn_norm.weight", vec![64]),
        ("ffn_norm.weight", vec![64]),
        ("attn_q.weight", vec![64, 64]),
        ("attn_k.weight", vec![64, 32]),
        ("attn_v.weight", vec![64, 32]),
        ("attn_output.weight", vec![64, 64]),
        ("ffn_gate.weight", vec![64, 128]),
        ("ffn_up.weight", vec![64, 128]),
        ("ffn_down.weight", vec![128, 64]),
    ] {
        tensors.push((format!("blk.0.{t}"), dims));
    }
    for (name, dims) in tensors {
        let count = dims.iter().product::<u64>() as usize;
        w.tensor(&name, &dims, 0, values(count));
    }
    w.write(path);
}

const TOKENS: [&str; 4] = ["<unk>", "<s>", "</s>", "a"];

#[test]
fn gguf_metadata_run_would_refuse_is_refused_by_compile() {
    let tmp = TempDir::new("check-gguf-meta");
    let path = tmp.path().join("m.gguf");
    full_llama_gguf(&path, Vec::new(), &TOKENS);
    let m = SourceModel::open(&path).unwrap();
    let ok = tmp.path().join("ok.mlxb");
    compile(&m, &ok, &CompileOptions::default(), None, &mut |_| {}).unwrap();
    std::fs::remove_file(&ok).unwrap();

    let cases: Vec<(Metadata<'_>, Vec<&str>, Vec<&str>)> = vec![
        (vec![("llama.context_length", Val::U32(0))], TOKENS.to_vec(), vec!["m.gguf", "max_position_embeddings"]),
        (vec![("llama.block_count", Val::U32(2))], TOKENS.to_vec(), vec!["m.gguf", "model.layers.1"]),
        // Every token the same: the vocabulary keeps one entry, and the
        // unknown token the tokenizer falls back to is not in it.
        (Vec::new(), vec!["a", "a", "a", "a"], vec!["m.gguf", "tokenizer"]),
        (
            vec![
                ("tokenizer.ggml.model", Val::Str("gpt2")),
                ("tokenizer.ggml.merges", Val::Arr(8, vec![Val::Str("x y")])),
            ],
            TOKENS.to_vec(),
            vec!["m.gguf", "tokenizer"],
        ),
    ];
    for (meta, tokens, parts) in cases {
        full_llama_gguf(&path, meta, &tokens);
        let e = compile_error(&path, tmp.path());
        assert_mentions(&e, &parts);
    }
}
