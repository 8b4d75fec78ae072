//! Writes seed inputs for the fuzz targets (`make fuzz` runs it): the
//! adversarial corpus's tiny valid GGUF, safetensors file and index,
//! tokenizer (as `tokenizer.json`, as a compiled section and as its tokens'
//! bytes), chat templates
//! and surgery YAML, each under `OUT/<target>/`, in the input framing its
//! target reads (fuzz/fuzz_targets/).

#[path = "../adversarial/mod.rs"]
#[allow(dead_code)]
mod corpus;

use std::path::Path;

use corpus::{gguf::Gguf, hf, model};
use mlxcel_runtime::tokenizer::Tokenizer;

fn write(out: &Path, target: &str, name: &str, bytes: &[u8]) {
    let dir = out.join(target);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    std::fs::write(dir.join(name), bytes).unwrap_or_else(|e| panic!("writing {name}: {e}"));
}

fn main() {
    let out = std::env::args().nth(1).expect("usage: adversarial_seeds OUT_DIR");
    let out = Path::new(&out);
    write(out, "gguf", "tiny.gguf", &Gguf::tiny().bytes());
    // Safetensors: mode byte 0 (the file), 1 (an index naming shards).
    let files = hf::files();
    let st = &files.iter().find(|(p, _)| p.ends_with("model.safetensors")).expect("safetensors").1;
    write(out, "safetensors", "file", &[&[0u8][..], st].concat());
    let map: serde_json::Map<String, serde_json::Value> =
        model::tensors().into_iter().map(|t| (t.name, "model.safetensors".into())).collect();
    let index = serde_json::json!({"metadata": {}, "weight_map": map}).to_string();
    write(out, "safetensors", "index", &[&[1u8][..], index.as_bytes()].concat());
    // Tokenizer: mode byte 0 (a compiled section), 1 (tokenizer.json), 2
    // (a token-bytes section, every token's output bytes).
    let tj = model::tokenizer_json().to_string();
    let compiled = mlxcel_tokenizer::compile(tj.as_bytes()).expect("the tiny tokenizer compiles");
    write(out, "tokenizer", "compiled", &[&[0u8][..], &compiled].concat());
    write(out, "tokenizer", "json", &[&[1u8][..], tj.as_bytes()].concat());
    let tokenizer = Tokenizer::from_json(tj.as_bytes(), Vec::new(), None).expect("the tiny tokenizer loads");
    let vocab = tokenizer.max_token_id().map_or(0, |id| id as usize + 1);
    let table = tokenizer.compute_vocabulary_bytes(vocab).expect("the tiny tokenizer decodes every token");
    write(out, "tokenizer", "token_bytes", &[&[2u8][..], &table.to_section()].concat());
    write(out, "chat_template", "chatml", model::CHAT_TEMPLATE.as_bytes());
    write(out, "chat_template", "tiny", mlxcel_tests::TINY_CHAT_TEMPLATE.as_bytes());
    let examples = mlxcel_tests::workspace_root().join("examples/surgery");
    for e in std::fs::read_dir(&examples).expect("examples/surgery").flatten() {
        if e.path().extension().is_some_and(|x| x == "yaml") {
            let bytes = std::fs::read(e.path()).expect("example");
            write(out, "surgery_yaml", &e.file_name().to_string_lossy(), &bytes);
        }
    }
}
