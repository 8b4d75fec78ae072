//! The compiled tokenizers of the real SmolLM2-135M (byte-level BPE, 49k
//! tokens) and Gemma 3 270M (SentencePiece BPE with byte fallback, 262k
//! tokens) against Hugging Face `tokenizers` on the same `tokenizer.json`:
//! the verification corpus, then every document and source file of this
//! repository, whole and line by line — encode with and without special
//! tokens, decode with and without skipping them. The runtime must pick the
//! compiled tokenizer for these bundles.

use std::path::{Path, PathBuf};
use std::process::Command;

use mlxcel_bundle::Bundle;
use mlxcel_tests::{mlxcel_compile_bin, real_model, workspace_root};

fn compile(gguf: &str, dir: &Path) -> PathBuf {
    let bundle = dir.join("model.mlxb");
    let out = Command::new(mlxcel_compile_bin())
        .args([real_model(gguf).to_str().unwrap(), "-o", bundle.to_str().unwrap(), "--quiet"])
        .output()
        .unwrap();
    assert!(out.status.success(), "compile failed: {}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("tokenizer: compiled"), "{stderr}");
    bundle
}

/// Texts of the repository: Markdown and Rust sources (prose, code, tables,
/// Unicode), capped so the test stays quick.
fn repository_texts() -> Vec<String> {
    let root = workspace_root();
    let mut files = vec![root.join("README.md"), root.join("CHANGELOG.md")];
    for dir in ["docs", "runtime/src", "tokenizer/src", "compiler/src/ingest/gguf"] {
        let mut entries: Vec<PathBuf> =
            std::fs::read_dir(root.join(dir)).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_file()).collect();
        entries.sort();
        files.extend(entries);
    }
    let mut texts = Vec::new();
    let mut total = 0;
    for f in files {
        let Ok(text) = std::fs::read_to_string(&f) else { continue };
        total += text.len();
        texts.extend(text.lines().map(str::to_string));
        texts.push(text);
        if total > 400_000 {
            break;
        }
    }
    texts
}

fn check(gguf: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = compile(gguf, dir.path());
    let bundle = Bundle::open(&path).unwrap();
    let section = bundle.compiled_tokenizer().expect("the bundle carries a compiled tokenizer").to_vec();
    let json = bundle.tokenizer_json().unwrap();
    let compiled = mlxcel_tokenizer::Tokenizer::load(section).unwrap();
    let reference = tokenizers::Tokenizer::from_bytes(json).unwrap();
    mlxcel_tokenizer::verify::against_reference(&compiled, &reference).unwrap();

    let texts = repository_texts();
    assert!(texts.len() > 1000, "{} texts", texts.len());
    for text in &texts {
        for special in [false, true] {
            let theirs = reference.encode(text.as_str(), special).unwrap().get_ids().to_vec();
            let ours = compiled.encode(text, special).unwrap();
            assert!(ours == theirs, "{gguf}: encoding {:?} differs", &text[..text.len().min(200)]);
            for skip in [false, true] {
                assert_eq!(compiled.decode(&ours, skip).unwrap(), reference.decode(&theirs, skip).unwrap());
            }
        }
    }

    mlxcel_mlx::device::set_default_device(mlxcel_mlx::Device::Cpu).unwrap();
    let model = mlxcel_runtime::loader::load(&path, &Default::default()).unwrap();
    assert!(model.tokenizer.is_compiled(), "the runtime loads the compiled tokenizer");
}

#[test]
fn smollm2_compiled_tokenizer_matches_tokenizers() {
    check("SmolLM2-135M-Instruct.Q4_1.gguf");
}

#[test]
fn gemma3_compiled_tokenizer_matches_tokenizers() {
    check("gemma-3-270m-q4_k_m.gguf");
}
